"""The instructors' answer key (`python -m helpers.quickcheck key`), and point totals printed, never typed.

The key is checked against the grader itself: every answer it gives is judged right by `judging`,
the next value at its decimals is judged wrong, and its "Why" is the explanation `check()` prints.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.quickcheck.__main__ import main
from helpers.quickcheck.bank import bank_notebooks, get_question, load_bank, params_for
from helpers.quickcheck.judging import CORRECT, WRONG, judge
from helpers.quickcheck.key import KEY_COMMAND, KEY_MARKER, answer_key, notebook_points, right_answer
from helpers.quickcheck.safe_eval import evaluate

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [q for nb in bank_notebooks() for q in load_bank(nb)]
KEY = answer_key()


def entry(qid: str, key: str = KEY) -> str:
    """One question's part of the key: from its heading to the next."""
    return re.search(rf"^### {qid} .*?(?=^##|\Z)", key, re.M | re.S).group()


def test_the_key_opens_by_saying_it_is_for_instructors_with_points_summed_from_the_bank():
    head = KEY.split("## Notebook 00")[0]
    assert head.startswith("# Quick-check answer key: for instructors only\n") and KEY_MARKER in head
    assert "Keep it out of the student versions" in head and KEY_COMMAND in head
    for nb in bank_notebooks():
        points = sum(q.points for q in load_bank(nb))
        assert f"| {nb} | {len(load_bank(nb))} | {points:g} |" in head
        assert f"## Notebook {nb} ({points:g} point" in KEY
    total = sum(q.points for q in QUESTIONS)
    assert f"| total | {len(QUESTIONS)} | {total:g} |" in head
    assert sum(notebook_points().values()) == total > len(QUESTIONS)  # q04_3 is worth 2: the sum, not a count


@pytest.mark.parametrize("q", QUESTIONS, ids=lambda q: q.id)
def test_every_question_is_in_the_key_with_its_notebook_points_and_text(q):
    part = entry(q.id)
    assert part.startswith(f"### {q.id} (notebook {q.notebook}, {q.kind}")
    assert f"{q.points:g} point" in part.splitlines()[0] and q.prompt in part
    assert "Answer: " in part and "not found" not in part


@pytest.mark.parametrize("q", [q for q in QUESTIONS if not q.personal], ids=lambda q: q.id)
def test_the_keys_answer_is_judged_right_and_its_why_is_the_checks_explanation(q):
    part = entry(q.id)
    canonical = right_answer(q)
    if q.kind == "choice":
        answer = canonical
        assert f'Answer: `"{canonical}"`' in part
        assert all((f"**{k}) " in part) == (k in canonical) for k in q.choices)  # the right options, and only they
    else:
        answer = int(canonical) / 10**q.decimals
        assert f"Answer: `{answer:.{q.decimals}f}`" in part
        assert judge(q, answer + 10**-q.decimals).status == WRONG  # one step off is wrong: the key's value is exact
    verdict = judge(q, answer)
    assert verdict.status == CORRECT and f"Why: {verdict.message}" in part


def test_a_one_answer_choice_lists_why_not_for_every_wrong_option():
    q = get_question("q00_1")
    part = entry("q00_1")
    wrong = [k for k in q.choices if k != right_answer(q)]
    for letter in wrong:
        why = judge(q, letter).why_not.removeprefix(f"You picked {letter}: ")
        assert f"{letter}) {q.choices[letter]}\n  - why not: {why}" in part


def test_per_student_questions_give_the_formula_and_with_an_id_that_students_numbers():
    q = get_question("q00_4")
    part = entry("q00_4")
    assert f"Answer: `{q.expect}`, within 2 % of it (relative)." in part and "{memory_gb}" in part
    mine = entry("q00_4", answer_key(["00"], student_id="C03"))
    values = params_for(q, "C03")
    expected = evaluate(q.expect, values)
    assert f"Student 'C03': memory_gb = {values['memory_gb']:g}, so `{expected:.6g}`" in mine
    assert judge(q, float(f"{expected:.6g}"), "C03").status == CORRECT
    assert "{memory_gb}" not in mine  # the prompt and the explanation carry this student's number
    prop = entry("q04_3", answer_key(["04"], student_id="C03"))
    assert all(f"`{r.require}`: {r.hint}" in prop for r in get_question("q04_3").rules)
    assert "Student 'C03': target = " in prop


def test_key_command_prints_or_writes_the_same_text_and_never_into_a_notebook(tmp_path, capsys):
    assert main(["key", "--notebook", "02"]) == 0
    printed = capsys.readouterr().out
    assert printed == answer_key(["02"]) and "## Notebook 03" not in printed
    assert main(["key", "--notebook", "02", "--out", str(tmp_path / "key.md")]) == 0
    assert (tmp_path / "key.md").read_text(encoding="utf-8") == printed
    assert "wrote" in capsys.readouterr().out
    assert main(["key", "--out", str(tmp_path / "handout.ipynb")]) == 2
    assert "must be a Markdown file, not a notebook" in capsys.readouterr().err
    assert not (tmp_path / "handout.ipynb").exists()
    assert main(["key", "--notebook", "42"]) == 2
    assert "--notebook 42 has no questions; use one of 00" in capsys.readouterr().err


def test_key_is_reachable_from_the_kit_command():
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "quickcheck", "key", "--notebook", "00"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Quick-check answer key: for instructors only")


# ---------------------------------------------------------------- point totals: printed from the bank, never typed

# the texts people read: the README, docs, the notebooks' sources, the package's docstrings and messages
TEXTS = ["README.md", "docs/*.md", "notebooks/src/*.py", "helpers/**/*.py"]
# "39 points", "4 point", and "points (37 for all nine)": a number stated as a count of points
TYPED_POINTS = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s+points?\b|\bpoints?\W{0,3}\((\d+(?:\.\d+)?)\b", re.I)


def typed_totals(root: Path = ROOT) -> list[str]:
    """Each place a text types a number of points, with what the bank says instead."""
    totals = notebook_points()
    each = ", ".join(f"{n}: {p:g}" for n, p in totals.items())
    bank = f"{sum(totals.values()):g} for all {len(totals)} notebooks ({each})"
    found = []
    for pattern in TEXTS:
        for path in sorted(root.glob(pattern)):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in TYPED_POINTS.finditer(line):
                    found.append(
                        f"{path.relative_to(root)}:{number} types {m.group().strip()!r}; the bank gives {bank}. "
                        f"Don't type a total: name it ('the issued notebooks' points') and point to `{KEY_COMMAND}`, "
                        "which prints each notebook's points and the total from the bank"
                    )
    return found


def test_no_text_types_a_point_total():
    found = typed_totals()
    assert not found, "\n".join(found)


def test_the_typed_total_finder_finds_the_readmes_old_sentence(tmp_path):
    (tmp_path / "README.md").write_text(
        "in Gradescope one Total Score out of the\nissued notebooks' points (37 for all nine).\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("Notebook 04 is worth 5 points; q04_3 has points: 2 in the bank.\n")
    found = typed_totals(tmp_path)
    total = sum(q.points for q in QUESTIONS)
    assert len(found) == 2
    assert found[0].startswith(f"README.md:2 types 'points (37'; the bank gives {total:g} for all 9 notebooks (00: ")
    assert found[1].startswith("docs/x.md:1 types '5 points'") and KEY_COMMAND in found[1]
