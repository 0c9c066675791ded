"""Is the quick-check bank fair to a student who reads, and useless to one who guesses by shape? (issue 14, item 6)

One test per notebook's bank (`pytest tests/test_bank_fairness.py -k 04` runs notebook 04's), then
tests over the whole bank. Each failure lists what to fix: question ids, options, the field to add.
The right answers are found the way anyone could find them, by trying each option against the
stored hash; nothing here stores an answer.

The rules, and why each is defensible:

- At least 3 questions per notebook, so each notebook's point is checked more than once.
- Every wrong option of a choice question has its own "why not" (`"why_not"` in the authoring
  format, sealed into `feedback_sealed`; see helpers/quickcheck/sealing.py): a student who picks it
  learns what was wrong with that idea, not just "not yet". Multi-answer questions: every option,
  a right one's text saying why it belongs (shown when it is left out).
- Over the whole bank's one-answer choice questions (multi-answer ones have no single position or
  length): the right option is the strictly longest in at most 40 % of them, and no letter is the
  right one in more than 40 %. With four options, chance is 25 %; 40 % leaves room for a bank of
  about 20 questions while ruling out "pick the longest" or "pick b" as a strategy that pays
  (the issue found the longest right in 11 of 12, "b" in 7 of 12).
- No number question is pure arithmetic. A computation is only worth a quick check when the
  number tests an idea the prompt does not hand over (that the effective batch multiplies by the
  devices too, that bf16 takes 2 bytes a weight, that a KV cache grows with the sequence) or is
  a figure the notebook measured, read off the student's own run. So each number question must
  declare one: `"concept"`, a sentence of at least 6 words naming the idea the number checks,
  which the prompt must not already state (else the prompt gives the idea away and what is left
  is arithmetic); or `"measured"`, the `helpers.record` key of the figure it is about, which the
  notebook's source must record. Whether a concept is a real one is the reviewer's call: the field
  puts it in one sentence where a reviewer sees it. Property questions (a dict of values that must
  satisfy rules, like a batch layout that fits a card) ask for a decision under constraints, not a
  computation, so they are not held to this rule.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from helpers.quickcheck.bank import BANK_DIR, LEFT_OUT, PICKED, Question, bank_notebooks, load_bank
from helpers.quickcheck.sealing import answer_hash, seal_file, unseal_option

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_SOURCES = ROOT / "notebooks" / "src"
MIN_QUESTIONS = 3
MAX_SHARE = 0.40  # of the bank's one-answer choice questions: right option longest, or any one letter right
MIN_CONCEPT_WORDS = 6
SEAL = "then run `python -m helpers.quickcheck seal {path}` (the format opens helpers/quickcheck/sealing.py)"


def shown_path(path: Path) -> str:
    """The path from the repository root, as a helper would type it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def right_options(q: Question) -> str:
    """The right letters of a choice question ("b", "ad"), found by trying every option against the hash."""
    sizes = range(1, len(q.choices) + 1) if q.multiple else [1]
    for n in sizes:
        for combo in itertools.combinations(q.choices, n):
            if answer_hash(q.id, "".join(combo)) == q.answer_sha256:
                return "".join(combo)
    raise AssertionError(f"{q.id}: no option matches its answer_sha256: seal it again")


def missing_why_not(q: Question) -> list[str]:
    """The options whose mistake (picking a wrong one, leaving out a right one) has no feedback."""
    right = right_options(q)
    if q.multiple:
        return [k for k in q.choices if not unseal_option(q, LEFT_OUT if k in right else PICKED, k).strip()]
    return [k for k in q.choices if k not in right and not unseal_option(q, PICKED, k).strip()]


def recorded_keys(notebook: str) -> set[str]:
    """The quoted strings of notebook NN's source: every key it passes to `helpers.record` is among them."""
    return {
        m.group(2)
        for path in NOTEBOOK_SOURCES.glob(f"{notebook}_*.py")
        for m in re.finditer(r"""(["'])([A-Za-z0-9_.\-]+)\1""", path.read_text(encoding="utf-8"))
    }


def arithmetic_problem(q: Question, recorded: set[str]) -> str:
    """Why a number question counts as pure arithmetic, or ""."""
    add = (
        'add "concept": "<one sentence: the idea the number checks, which the prompt does not state>" '
        'or "measured": "<the helpers.record key of the figure it asks about>"'
    )
    if q.measured:
        return "" if q.measured in recorded else f'"measured": {q.measured!r} is not a key the notebook records; {add}'
    concept = " ".join(q.concept.split())
    if not concept:
        return f"is a number question with no concept: {add}"
    if len(concept.split()) < MIN_CONCEPT_WORDS:
        return f'"concept" {concept!r} is under {MIN_CONCEPT_WORDS} words: say the idea the number checks'
    if concept.casefold().rstrip(".") in " ".join(q.prompt.split()).casefold():
        return '"concept" is stated in the prompt itself, so only arithmetic is left: take it out of the prompt'
    return ""


def bank_problems(notebook: str, folder: Path = BANK_DIR) -> list[str]:
    """What makes notebook NN's bank unfair, one line per fix; [] when it is fair."""
    questions = load_bank(notebook, folder)
    path = shown_path(folder / f"{notebook}.json")
    problems = []
    if len(questions) < MIN_QUESTIONS:
        problems.append(f"has {len(questions)} question(s): write at least {MIN_QUESTIONS} on the notebook's point")
    recorded = recorded_keys(notebook)
    for q in questions:
        if q.kind == "choice":
            missing = missing_why_not(q)
            if missing:
                texts = ", ".join(f'"{k}": "..."' for k in missing)
                problems.append(
                    f"{q.id}: no why-not feedback for option{'s' if len(missing) > 1 else ''} {', '.join(missing)}: "
                    f'write it with "answer", "explanation" and "why_not": {{{texts}}}, {SEAL.format(path=path)}'
                )
        elif q.kind == "number":
            problem = arithmetic_problem(q, recorded)
            if problem:
                problems.append(f"{q.id}: {problem}")
    return problems


def authored(qid, answer, why_not, **more):
    """A choice question in the authoring format (sealed by `seal_file`)."""
    return {
        "id": qid,
        "kind": "choice",
        "prompt": "Which one?",
        "choices": {"a": "the first idea", "b": "the second idea", "c": "the third idea"},
        "answer": answer,
        "hint": "Read the cell above.",
        "explanation": "Because the notebook measured it.",
        "why_not": why_not,
        **more,
    }


def test_the_rules_pass_a_fair_bank_and_name_each_fix_in_an_unfair_one(tmp_path):
    source = next(NOTEBOOK_SOURCES.glob("03_*.py")).read_text(encoding="utf-8")
    key = re.search(r"""record\(\s*["']([\w.\-]+)["']""", source).group(1)  # a figure notebook 03 records
    number = {"id": "q03_3", "kind": "number", "prompt": "How many?", "hint": "Count.", "answer": 4}
    fair = [
        authored("q03_1", "c", {"a": "not a", "b": "not b"}),
        authored("q03_2", "ab", {"a": "a belongs", "b": "b belongs", "c": "not c"}, multiple=True),
        {**number, "concept": "the effective batch multiplies by the number of devices too"},
        {**number, "id": "q03_4", "measured": key},
    ]
    (tmp_path / "03.json").write_text(json.dumps({"questions": fair}))
    seal_file(tmp_path / "03.json")
    assert bank_problems("03", tmp_path) == []
    sealed = json.loads((tmp_path / "03.json").read_text())["questions"]
    unfair = [
        {k: v for k, v in sealed[0].items() if k != "feedback_sealed"},  # sealed before why_not existed
        {**sealed[2], "concept": "devices multiply the batch"},
        {**sealed[3], "measured": "no_such_figure_gib"},
    ]
    (tmp_path / "03.json").write_text(json.dumps({"questions": unfair}))
    load_bank.cache_clear()
    assert bank_problems("03", tmp_path) == [
        'q03_1: no why-not feedback for options a, b: write it with "answer", "explanation" and "why_not": '
        f'{{"a": "...", "b": "..."}}, {SEAL.format(path=shown_path(tmp_path / "03.json"))}',
        "q03_3: \"concept\" 'devices multiply the batch' is under 6 words: say the idea the number checks",
        'q03_4: "measured": \'no_such_figure_gib\' is not a key the notebook records; add "concept": "<one '
        'sentence: the idea the number checks, which the prompt does not state>" or "measured": "<the '
        'helpers.record key of the figure it asks about>"',
    ]
    (tmp_path / "03.json").write_text(json.dumps({"questions": unfair[:1]}))
    load_bank.cache_clear()
    assert bank_problems("03", tmp_path)[0] == "has 1 question(s): write at least 3 on the notebook's point"


@pytest.mark.parametrize("notebook", bank_notebooks())
def test_each_bank_has_three_questions_a_why_not_per_wrong_option_and_no_pure_arithmetic(notebook):
    problems = bank_problems(notebook)
    path = shown_path(BANK_DIR / f"{notebook}.json")
    assert not problems, f"bank {notebook} ({path}) to fix:\n- " + "\n- ".join(problems)


def one_answer_questions() -> list[tuple[Question, str]]:
    """(question, its right letter) for every one-answer choice question of the whole bank."""
    return [
        (q, right_options(q)) for nb in bank_notebooks() for q in load_bank(nb) if q.kind == "choice" and not q.multiple
    ]


def test_the_right_option_is_the_longest_in_at_most_40_percent_of_the_bank():
    questions = one_answer_questions()
    assert questions, "the bank has no one-answer choice questions to check"
    longest = []
    for q, right in questions:
        lengths = {k: len(" ".join(v.split())) for k, v in q.choices.items()}
        runner_up = max(n for k, n in lengths.items() if k != right)
        if lengths[right] > runner_up:
            longest.append(f"{q.id} ({right}: {lengths[right]} characters, next {runner_up})")
    share = len(longest) / len(questions)
    assert share <= MAX_SHARE, (
        f"the right option is the strictly longest in {len(longest)} of {len(questions)} one-answer questions "
        f"({share:.0%}, at most {MAX_SHARE:.0%}): a student who picks the longest passes. Lengthen a wrong option "
        f"or shorten the right one in some of: {', '.join(longest)}"
    )


def test_no_letter_is_the_right_one_in_more_than_40_percent_of_the_bank():
    questions = one_answer_questions()
    assert questions, "the bank has no one-answer choice questions to check"
    letters = Counter(right for _, right in questions)
    by_letter = {k: [q.id for q, right in questions if right == k] for k in sorted(letters)}
    over = {k: ids for k, ids in by_letter.items() if len(ids) / len(questions) > MAX_SHARE}
    counts = ", ".join(f"{k} {len(ids)}" for k, ids in by_letter.items())
    assert not over, (
        f"right letters over {len(questions)} one-answer questions: {counts}; at most {MAX_SHARE:.0%} each. "
        + "; ".join(f"{k} is right in {', '.join(ids)}: move it elsewhere in some" for k, ids in over.items())
    )
