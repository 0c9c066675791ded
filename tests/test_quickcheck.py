"""helpers.quickcheck: the bank, check() in a notebook, student versions, and grading without running code.

The tests know the right answers without an answer key in the repository: they find the
choice and fixed-number answers by trying every candidate against the bank's hashes, and
compute the per-student ones from the question's own parameters.
"""

import collections
import contextlib
import copy
import csv
import functools
import io
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.quickcheck import ask, check
from helpers.quickcheck import checks as checks_module
from helpers.quickcheck import grading as grading_module
from helpers.quickcheck.bank import BANK_DIR, BankError, bank_notebooks, get_question, load_bank, params_for
from helpers.quickcheck.grading import collect, grade, grade_submission, show_graded
from helpers.quickcheck.handout import HandoutError, student_version, write_student_versions
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG, format_receipt, judge
from helpers.quickcheck.reading import Cell, find_answer, scan
from helpers.quickcheck.safe_eval import Unreadable, evaluate, read_value
from helpers.quickcheck.sealing import answer_hash, seal_file, seal_text, unseal_text
from helpers.quickcheck.submissions import NotANotebook, parse_notebook

NB00 = NOTEBOOKS_DIR / "00_where_to_get_gpus.ipynb"
ALL_QUESTIONS = [q for nb in bank_notebooks() for q in load_bank(nb)]
SID = "s-042"


# ---------------------------------------------------------------- the right answers, found, not stored


def solve(q, student_id=SID):
    """A right answer to `q` as Python source text (what a student writes after `answer_q.. =`)."""
    return _solve(q.id, student_id)


@functools.cache
def _solve(question_id, student_id):
    q = get_question(question_id)
    params = params_for(q, student_id)
    if q.kind == "choice":
        letters = list(q.choices)
        sizes = range(1, len(letters) + 1) if q.multiple else [1]
        hits = [
            c
            for n in sizes
            for c in itertools.combinations(letters, n)
            if answer_hash(q.id, "".join(c)) == q.answer_sha256
        ]
        assert len(hits) == 1, f"{q.id}: {len(hits)} choices match the stored hash"
        return repr("".join(hits[0]))
    if q.kind == "number" and not q.personal:
        hits = [u for u in range(100_000) if answer_hash(q.id, str(u)) == q.answer_sha256]
        assert len(hits) == 1, f"{q.id}: no answer in 0..100000 units matches the stored hash"
        return repr(hits[0] / 10**q.decimals if q.decimals else hits[0])
    if q.kind == "number":
        return repr(evaluate(q.expect, params))
    for values in itertools.product(range(1, 129), repeat=len(q.fields)):
        candidate = dict(zip(q.fields, values))
        if all(evaluate(r.require, {**params, **candidate}) for r in q.rules):
            return repr(candidate)
    raise AssertionError(f"{q.id}: no answer satisfies its rules for {student_id!r}")


def wrong(q, student_id=SID):
    """A wrong but well-formed answer."""
    if q.kind == "choice":
        right = eval(solve(q, student_id))
        return repr(next(k for k in q.choices if k != right))
    if q.kind == "number":
        return repr(eval(solve(q, student_id)) * 3 + 7)
    return repr({k: 10**6 for k in q.fields})


def explanation(q, student_id=SID):
    """The explanation a right answer unlocks (sealed ones decrypted with that answer)."""
    return judge(q, eval(solve(q, student_id)), student_id).message


# ---------------------------------------------------------------- the bank


def test_every_notebook_has_a_bank_with_at_least_two_questions():
    assert bank_notebooks() == [f"{i:02d}" for i in range(9)]
    for nb in bank_notebooks():
        assert len(load_bank(nb)) >= 2, f"notebook {nb} needs at least two quick checks"
    kinds = {q.kind for q in ALL_QUESTIONS}
    assert kinds == {"choice", "number", "property"}
    assert any(q.multiple for q in ALL_QUESTIONS) and any(q.personal for q in ALL_QUESTIONS)


def test_the_lesson_question_is_in_notebook_04():
    q = get_question("q04_2")
    assert q.prompt == (
        "Your GPU runs out of memory at batch size 8 but you need a larger effective batch. What keeps memory low?"
    )
    right = q.choices[eval(solve(q))]
    assert "per-device batch" in right and "accumulation" in right


@pytest.mark.parametrize("q", ALL_QUESTIONS, ids=lambda q: q.id)
def test_each_question_has_exactly_one_right_answer_and_it_unlocks_the_explanation(q):
    answer = eval(solve(q))
    verdict = judge(q, answer, SID)
    assert verdict.status == CORRECT and verdict.points == q.points > 0
    assert len(verdict.message) > 40 and "{" not in verdict.message, verdict.message
    assert judge(q, eval(wrong(q)), SID).status == WRONG
    if q.explanation_sealed:  # the stored text is unreadable without the right answer
        garbled = unseal_text(q.id, "not-the-answer", q.explanation_sealed)
        assert garbled != verdict.message and verdict.message[:20] not in garbled


def test_no_bank_file_holds_a_plain_answer():
    for path in sorted(BANK_DIR.glob("*.json")):
        for raw in json.loads(path.read_text())["questions"]:
            assert "answer" not in raw, f"{path}: {raw['id']} has a plain answer"
            if not raw.get("params"):
                assert "explanation" not in raw, f"{path}: {raw['id']}'s explanation gives the answer away"


def test_seal_replaces_a_plain_answer_and_the_loader_refuses_unsealed(tmp_path):
    bank = tmp_path / "03.json"
    bank.write_text(
        json.dumps(
            {
                "questions": [
                    {
                        "id": "q03_9",
                        "kind": "choice",
                        "prompt": "Pick one.",
                        "choices": {"a": "x", "b": "y"},
                        "answer": "B",
                        "hint": "Not x.",
                        "explanation": "y, because y.",
                        "why_not": {"a": "x is the other one."},
                    }
                ]
            }
        )
    )
    with pytest.raises(BankError, match=r"has a plain answer; run `python -m helpers.quickcheck seal"):
        load_bank("03", tmp_path)
    assert seal_file(bank) == ["q03_9"]
    (q,) = load_bank("03", tmp_path)
    assert '"answer"' not in bank.read_text() and "because" not in bank.read_text()
    assert judge(q, "b").message == "y, because y." and judge(q, "a").status == WRONG
    assert judge(q, "a").why_not == "You picked a: x is the other one."


BASE = {
    "id": "q03_9",
    "kind": "number",
    "prompt": "How many?",
    "hint": "Count.",
    "params": {"n": [1, 2]},
    "expect": "n * 2",
}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "essay"}, "kind 'essay' is not one of"),
        ({"id": "q04_9"}, "the id must look like q03_1"),
        ({"hint": ""}, "needs a non-empty 'hint'"),
        ({"expect": ""}, 'needs "expect"'),
        ({"params": {}, "expect": ""}, 'needs "answer_sha256"'),
        ({"prompt": "How many {m}?"}, "the texts use {m}, which is not one of its params"),
        ({"kind": "choice", "params": {}, "choices": {"a": "x"}}, "at least two single-letter keys"),
        ({"concept": ["bytes"]}, "'concept' must be text"),
    ],
)
def test_bank_mistakes_are_named_with_the_fix(tmp_path, change, message):
    (tmp_path / "03.json").write_text(json.dumps({"questions": [{**BASE, **change}]}))
    with pytest.raises(BankError, match=re.escape(message)):
        load_bank("03", tmp_path)


def test_duplicate_ids_in_a_bank_are_refused(tmp_path):
    (tmp_path / "03.json").write_text(json.dumps({"questions": [BASE, BASE]}))
    with pytest.raises(BankError, match=r"\['q03_9'\] appear more than once"):
        load_bank("03", tmp_path)


# ---------------------------------------------------------------- per-option feedback ("why not")

WHY_ONE = {
    "id": "q03_8",
    "kind": "choice",
    "prompt": "Which format keeps fp32's exponent range?",
    "choices": {"a": "fp16", "b": "bf16", "c": "int8", "d": "nf4"},
    "answer": "b",
    "hint": "Count the exponent bits.",
    "explanation": "bf16 has fp32's 8 exponent bits, so it overflows where fp32 does.",
    "why_not": {
        "a": "fp16 has 5 exponent bits: it overflows at 65504.",
        "c": "int8 is an integer format: no exponent at all.",
        "d": "nf4 is a 4-bit lookup of 16 values scaled per block.",
    },
}
WHY_MULTI = {
    "id": "q03_7",
    "kind": "choice",
    "multiple": True,
    "prompt": "Which are stored per trainable parameter by AdamW?",
    "choices": {"a": "the first moment", "b": "the second moment", "c": "the activations", "d": "the logits"},
    "answer": "ab",
    "hint": "What does AdamW average over steps?",
    "explanation": "AdamW keeps two running averages per trainable parameter: m and v.",
    "why_not": {
        "a": "m, the running mean of the gradient, is one of AdamW's two states.",
        "b": "v, the running mean of the squared gradient, is the other state.",
        "c": "activations belong to a micro-batch, not to a parameter.",
        "d": "the logits are the output of one forward pass.",
    },
}


def sealed_bank(tmp_path, *questions):
    """Bank 03 in tmp_path, written in the authoring format, then sealed; the loaded questions by id."""
    path = tmp_path / "03.json"
    path.write_text(json.dumps({"questions": [copy.deepcopy(q) for q in questions]}))
    seal_file(path)
    return path, {q.id: q for q in load_bank("03", tmp_path)}


def test_every_wrong_option_shows_its_own_why_not_and_the_right_one_the_explanation(tmp_path, monkeypatch, capsys):
    _, qs = sealed_bank(tmp_path, WHY_ONE)
    q = qs["q03_8"]
    for letter, text in WHY_ONE["why_not"].items():
        verdict = judge(q, letter)
        assert verdict.status == WRONG and verdict.why_not == f"You picked {letter}: {text}"
        assert verdict.message == WHY_ONE["hint"]
    right = judge(q, "b")
    assert right.status == CORRECT and right.message == WHY_ONE["explanation"] and right.why_not == ""
    monkeypatch.setattr(checks_module, "get_question", lambda qid: qs[qid])
    check("q03_8", "c")  # the plain-text path every front end shows
    out = capsys.readouterr().out
    assert "✗ Not yet. You picked c: int8 is an integer format" in out and "Hint: Count the exponent bits." in out
    assert WHY_ONE["why_not"]["a"] not in out and WHY_ONE["explanation"] not in out
    ui = asked_widget("q03_8", monkeypatch)  # the practice widget gives the same feedback
    _, picker, button, feedback = ui.children
    picker.value = "d"
    button.click()
    assert "You picked d: nf4 is a 4-bit lookup" in feedback.value


def test_multi_answer_feedback_names_the_first_wrong_pick_or_missed_option(tmp_path):
    _, qs = sealed_bank(tmp_path, WHY_MULTI)
    q = qs["q03_7"]
    why = WHY_MULTI["why_not"]
    assert judge(q, "ab").status == CORRECT and judge(q, "ab").message == WHY_MULTI["explanation"]
    assert judge(q, "a").why_not == f"You left out b: {why['b']}"
    assert judge(q, "abc").why_not == f"You picked c: {why['c']}"
    assert judge(q, "bd").why_not == f"You left out a: {why['a']}"  # a comes first; one mistake per try
    assert judge(q, "cd").why_not == f"You left out a: {why['a']}"


@pytest.mark.parametrize("question", [WHY_ONE, WHY_MULTI], ids=["one answer", "multi-answer"])
def test_the_sealed_json_does_not_show_which_option_is_right(tmp_path, question):
    path, _ = sealed_bank(tmp_path, question)
    text = path.read_text()
    (raw,) = json.loads(text)["questions"]
    assert "why_not" not in raw and "answer" not in raw and "explanation" not in raw
    for plain in [question["explanation"], *question["why_not"].values()]:
        assert plain[:12] not in text
    states = ["picked", "left_out"] if question.get("multiple") else ["picked"]
    assert sorted(raw["feedback_sealed"]) == sorted(states)
    for state in states:
        entries = raw["feedback_sealed"][state]
        assert sorted(entries) == sorted(question["choices"])  # every option has an entry, the right one too
        assert len({len(e) for e in entries.values()}) == 1, "the entries' lengths would point at the answer"
        assert len(set(entries.values())) == len(entries)  # each under its own key, none a copy of another


@pytest.mark.parametrize(
    "change, message",
    [
        ({"why_not": None}, 'needs "why_not": {"letter": "text", ...} for each option but the answer (b)'),
        ({"why_not": {"a": "x", "c": "y"}}, '"why_not" has no text for d; it needs a text for each option but'),
        ({"why_not": {**WHY_ONE["why_not"], "b": "z"}}, 'has a text for the answer b (that is the "explanation")'),
        ({"why_not": {**WHY_ONE["why_not"], "e": "z"}}, '"why_not" has e, which is not an option; it needs'),
        ({"why_not": {**WHY_ONE["why_not"], "c": "  "}}, "no text for c"),
        ({"explanation": ""}, 'needs an "explanation"'),
        ({"multiple": True, "answer": "ab"}, "for every option: for a wrong one why not to pick it, for a right"),
    ],
)
def test_incomplete_why_not_is_refused_naming_the_letters_and_nothing_is_written(tmp_path, change, message):
    path = tmp_path / "03.json"
    before = json.dumps({"questions": [{**WHY_ONE, **change}]})
    path.write_text(before)
    with pytest.raises(BankError, match=re.escape(message)):
        seal_file(path)
    assert path.read_text() == before


def test_the_seal_command_names_the_file_once_and_what_to_write(tmp_path):
    path = tmp_path / "03.json"
    path.write_text(json.dumps({"questions": [{**WHY_ONE, "why_not": {"a": "x"}}]}))
    cmd = [sys.executable, "-m", "helpers.quickcheck", "seal", str(path)]
    bad = subprocess.run(cmd, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count(str(path)) == 1
    assert '"why_not" has no text for c, d; it needs a text for each option but the answer (b)' in bad.stderr
    path.write_text(json.dumps({"questions": [WHY_ONE]}))
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0 and f"{path}: sealed q03_8" in done.stdout


def test_why_not_on_a_number_question_or_left_plain_is_refused(tmp_path):
    path = tmp_path / "03.json"
    path.write_text(json.dumps({"questions": [{**BASE, "params": {}, "answer": 4, "why_not": {"a": "x"}}]}))
    with pytest.raises(BankError, match='is a number question: only choice questions have "why_not"'):
        seal_file(path)
    sealed = {k: v for k, v in WHY_ONE.items() if k != "answer"}
    path.write_text(json.dumps({"questions": [{**sealed, "answer_sha256": "0" * 64}]}))
    with pytest.raises(BankError, match=r'has a plain "why_not": give it its "answer" and "explanation" too'):
        load_bank("03", tmp_path)


def test_a_bank_sealed_before_why_not_still_loads_and_judges(tmp_path):
    old = {k: v for k, v in WHY_ONE.items() if k not in ("answer", "explanation", "why_not")}
    old["answer_sha256"] = answer_hash("q03_8", "b")
    old["explanation_sealed"] = seal_text("q03_8", "b", WHY_ONE["explanation"])
    (tmp_path / "03.json").write_text(json.dumps({"questions": [old]}))
    (q,) = load_bank("03", tmp_path)
    assert judge(q, "b").message == WHY_ONE["explanation"]
    assert judge(q, "a").status == WRONG and judge(q, "a").why_not == ""
    damaged = {**old, "feedback_sealed": {"picked": {"a": "AAAA"}}}
    (tmp_path / "03.json").write_text(json.dumps({"questions": [damaged]}))
    load_bank.cache_clear()
    with pytest.raises(BankError, match="'picked' must have an entry for every option .* seal the question again"):
        load_bank("03", tmp_path)


def test_the_graders_feedback_file_gives_the_picked_options_why_not(tmp_path, monkeypatch):
    bank_dir = tmp_path / "bank"
    bank_dir.mkdir()
    _, qs = sealed_bank(bank_dir, WHY_ONE, WHY_MULTI)
    monkeypatch.setattr(grading_module, "load_bank", lambda nb: load_bank(nb, bank_dir))
    monkeypatch.setattr(grading_module, "bank_notebooks", lambda: ["03"])
    cells = [
        nbformat.v4.new_code_cell('student_id = "s-1"'),
        nbformat.v4.new_code_cell('# QUICK CHECK q03_8\nanswer_q03_8 = "a"\ncheck("q03_8", answer_q03_8)'),
        nbformat.v4.new_code_cell('# QUICK CHECK q03_7\nanswer_q03_7 = "abd"\ncheck("q03_7", answer_q03_7)'),
    ]
    write(tmp_path / "subs", "erin.ipynb", nbformat.v4.new_notebook(cells=cells))
    run = grade([tmp_path / "subs"], tmp_path / "grades.csv")
    feedback = (run.feedback_dir / "erin.txt").read_text()
    assert f"You picked a: {WHY_ONE['why_not']['a']}\n    Hint: {WHY_ONE['hint']}" in feedback
    assert f"You picked d: {WHY_MULTI['why_not']['d']}" in feedback
    assert WHY_ONE["explanation"] not in feedback and WHY_ONE["why_not"]["c"] not in feedback


# ---------------------------------------------------------------- check() in the notebook


def test_unanswered_prints_the_question_and_never_raises(capsys):
    check("q00_1", None)
    out = capsys.readouterr().out
    assert "Quick check q00_1" in out and "  a) " in out
    assert "Not answered yet: set answer_q00_1 to one letter in quotes" in out
    assert "receipt" not in out


def test_right_and_wrong_answers_give_explanation_or_hint_and_a_receipt(capsys):
    q = get_question("q00_1")
    right, bad = eval(solve(q)), eval(wrong(q))
    check("q00_1", bad)
    out = capsys.readouterr().out
    assert "✗ Not yet. " in out and "Hint: " + q.hint in out
    verdict = judge(q, bad)
    assert verdict.why_not in out  # the picked option's own feedback, where the bank seals one
    assert not verdict.why_not or verdict.why_not.startswith(f"You picked {bad}: ")
    assert explanation(q) not in out
    assert re.search(r"receipt q00_1 · attempt \d+ · not yet$", out, re.M)
    check("q00_1", right.upper())
    out = capsys.readouterr().out
    assert "✓ Correct. " + explanation(q) in out
    assert re.search(r"receipt q00_1 · attempt \d+ · correct", out)


def test_attempts_count_different_answers_not_reruns(monkeypatch, capsys):
    monkeypatch.setattr(checks_module, "_tried", {})
    q = get_question("q00_3")
    for answer in [3, 3, 5, eval(solve(q)), eval(solve(q))]:
        check("q00_3", answer)
    attempts = re.findall(r"attempt (\d+)", capsys.readouterr().out)
    assert attempts == ["1", "1", "2", "3", "3"]


@pytest.mark.parametrize("q", ALL_QUESTIONS, ids=lambda q: q.id)
def test_feedback_never_prints_the_expected_answer(q, capsys):
    params = params_for(q, SID)
    check(q.id, eval(wrong(q)), student_id=SID)
    check(q.id, None, student_id=SID)
    out = capsys.readouterr().out
    assert explanation(q) not in out
    if q.kind == "number":
        expected = eval(solve(q))
        in_the_question = {f"{v:g}" for v in params.values()} | set(re.findall(r"\d+(?:\.\d+)?", q.prompt + q.hint))
        shown = {f"{expected:g}", f"{expected:.1f}", f"{expected:.2f}"} - in_the_question
        assert not any(re.search(rf"(?<![\w.]){re.escape(s)}(?!\w)", out) for s in shown), out
    if q.kind == "choice":
        assert f"answer_{q.id} = {solve(q)}" not in out


@pytest.mark.parametrize("answer", [3, "zz", "", [], {}, float("nan"), object(), "16 GB", True, ["a", 1], b"a"])
def test_malformed_answers_are_explained_not_raised(answer, capsys):
    for qid in ("q00_1", "q00_2", "q00_3", "q04_3"):
        verdict = judge(get_question(qid), answer, SID)
        assert verdict.status in (INVALID, WRONG), (qid, answer, verdict)
        check(qid, answer, student_id=SID)
    out = capsys.readouterr().out
    assert "Traceback" not in out and out.count("Quick check") == 4


def test_answer_forms_students_write():
    q1, q2 = get_question("q00_1"), get_question("q00_2")
    right1, right2 = eval(solve(q1)), eval(solve(q2))
    for form in (right1.upper(), f"({right1})", f"{right1})", f" {right1} ", q1.choices[right1].upper()):
        assert judge(q1, form).status == CORRECT, form
    assert judge(q1, "ab").status == INVALID and "picks 2 letters" in judge(q1, "ab").message
    for form in (right2[::-1], ", ".join(right2), list(right2), set(right2), right2.upper()):
        assert judge(q2, form).status == CORRECT, form
    assert judge(q2, right2[:-1]).status == WRONG  # one right card missing is not right


def test_property_answer_is_checked_rule_by_rule_with_the_students_own_values():
    q = get_question("q04_3")
    p = params_for(q, SID)
    good = eval(solve(q))
    assert judge(q, good, SID).status == CORRECT
    too_big = {"per_device_batch": p["max_per_device"] * 2, "grad_accum_steps": 1}
    verdict = judge(q, too_big, SID)
    assert verdict.status == WRONG
    assert f"A micro-batch of {p['max_per_device'] * 2} runs out of memory" in verdict.message
    off = {"per_device_batch": 1, "grad_accum_steps": p["target"] // p["num_devices"] + 1}
    assert "it must come to" in judge(q, off, SID).message
    assert judge(q, {"per_device_batch": 1}, SID).status == INVALID
    assert judge(q, {**good, "lr": 1}, SID).status == INVALID
    assert judge(q, {"per_device_batch": 1.5, "grad_accum_steps": 2}, SID).status == INVALID


# What would make a check slow without showing in its count of calls: one call that does a lot
SLOW_CALLS = {"pbkdf2_hmac", "scrypt", "open", "read_text", "read_bytes", "load_bank", "sleep"}


@contextlib.contextmanager
def counted_calls():
    """Count the function calls (Python and builtin) made inside the block, by name: a measure of work."""
    calls = collections.Counter()

    def profile(frame, event, arg):
        if event == "call":
            calls[frame.f_code.co_name] += 1
        elif event == "c_call":
            calls[getattr(arg, "__name__", "?")] += 1

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_student_ids_get_their_own_numbers_and_still_check_instantly():
    q = get_question("q00_4")
    ids = [f"student{i:03d}" for i in range(40)]
    numbers = {sid: params_for(q, sid)["memory_gb"] for sid in ids}
    assert len(set(numbers.values())) >= 6, "ids should spread over the parameter values"
    assert params_for(q, " Student007 ") == params_for(q, "student007")  # case and spaces don't matter
    work = {}  # instantly, as work rather than time: each check makes the same few calls, whatever the id
    for sid in ids:
        with counted_calls() as calls:
            assert judge(q, numbers[sid] / 0.52, sid).status == CORRECT
        work[sid] = calls
    assert len({sum(calls.values()) for calls in work.values()}) == 1, "one id costs more than another"
    calls = work[ids[0]]
    assert sum(calls.values()) < 200, calls.most_common(10)  # a hash of the id per parameter, one small evaluation
    assert not set(calls) & SLOW_CALLS, "no key stretching and no file read per check"
    a, b = next((x, y) for x, y in itertools.combinations(ids, 2) if numbers[x] != numbers[y])
    assert judge(q, numbers[a] / 0.52, b).status == WRONG  # a neighbour's answer is wrong for you
    assert judge(q, 5, "").status == NEEDS_ID
    assert "pass your id" in judge(q, 5, None).message
    assert judge(q, None, "").status == UNANSWERED


def test_unknown_question_id_names_the_real_ones():
    with pytest.raises(KeyError, match=r"no quick check 'q00_9'.*q00_1, q00_2"):
        check("q00_9", "a")
    with pytest.raises(ValueError, match="look like 'q04_2'"):
        check("question1", "a")


def asked_widget(question_id, monkeypatch):
    """The widget `ask(question_id, widget=True)` displays."""
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    ask(question_id, widget=True)
    (ui,) = shown
    return ui


def test_ask_prints_text_headless_and_builds_a_working_widget(capsys, monkeypatch):
    ask("q04_2")  # no notebook front end here: plain text
    assert "Quick check q04_2" in capsys.readouterr().out
    ask("q04_2", widget=True)  # forced: displays the widget (its repr, outside a notebook)
    assert "VBox" in capsys.readouterr().out
    q = get_question("q04_2")
    ui = asked_widget("q04_2", monkeypatch)
    _, picker, button, feedback = ui.children
    picker.value = eval(wrong(q))
    button.click()
    assert "Not yet. " in feedback.value and "Hint: " in feedback.value and "Practice only" in feedback.value
    picker.value = eval(solve(q))
    button.click()
    assert "Correct" in feedback.value and "receipt q04_2" in feedback.value
    multi = asked_widget("q00_2", monkeypatch)
    boxes = multi.children[1].children
    for box, letter in zip(boxes, get_question("q00_2").choices):
        box.value = letter in eval(solve(get_question("q00_2")))
    multi.children[2].click()
    assert "Correct" in multi.children[3].value


# ---------------------------------------------------------------- reading values without running them


def test_read_value_takes_literals_and_arithmetic_only():
    assert read_value("'b'") == "b" and read_value("-3") == -3 and read_value("48 / 0.52") == 48 / 0.52
    assert read_value("dict(per_device_batch=4, grad_accum_steps=2 * 4)") == {
        "per_device_batch": 4,
        "grad_accum_steps": 8,
    }
    assert read_value("['b', 'd']") == ["b", "d"]
    for text, why in [
        ("gb", "uses the name gb"),
        ("float('3')", "calls float()"),
        ("f'{x}'", "an f-string"),
        ("9 ** 9 ** 9", "exponent"),
        ("10**20 * 10**20", "out of range"),
        ("1 / 0", "fails"),
        ("'a' * 3", "arithmetic on str"),
        ("__import__('os')", "calls __import__()"),
        ("[x for x in y]", "ListComp"),
    ]:
        with pytest.raises(Unreadable, match=re.escape(why)):
            read_value(text)


def test_evaluate_bank_rules_over_names():
    names = {"per_device_batch": 4, "grad_accum_steps": 8, "num_devices": 1, "target": 32, "max_per_device": 4}
    assert evaluate("per_device_batch * grad_accum_steps * num_devices == target", names) is True
    assert evaluate("per_device_batch <= max_per_device and grad_accum_steps > 8", names) is False
    assert evaluate("1 <= per_device_batch <= max_per_device", names) is True
    with pytest.raises(Unreadable, match="uses the name secret"):
        evaluate("secret + 1", names)
    with pytest.raises(Unreadable):
        evaluate("().__class__", names)


# ---------------------------------------------------------------- synthetic submissions


def quick_check_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "QUICK CHECK" in "".join(c["source"])]


def submission(answers=None, *, student_id=SID, receipts=True, base=None):
    """Notebook 00 as a student hands it in: answers are source text per question id, outputs included."""
    nb = copy.deepcopy(base or json.loads(NB00.read_text()))
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if 'student_id = ""' in src:
            src = src.replace('student_id = ""', f"student_id = {student_id!r}")
        for qid, text in (answers or {}).items():
            src = re.sub(rf"^answer_{qid} = None", f"answer_{qid} = {text}", src, flags=re.M)
        cell["source"] = src.splitlines(keepends=True)
        m = re.search(r"^answer_(q\d\d_\d+) = (.*?)(  #.*)?$", src, re.M)
        if receipts and m and m.group(2) != "None" and cell["cell_type"] == "code":
            q = get_question(m.group(1))
            verdict = judge(q, read_value(m.group(2)), student_id)
            cell["outputs"] = [
                {
                    "output_type": "stream",
                    "name": "stdout",
                    "text": [f"Quick check {q.id}\n", format_receipt(verdict, 2) + "\n"],
                }
            ]
    return nb


def write(folder, name, nb_or_text):
    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb_or_text, bytes):
        path.write_bytes(nb_or_text)
    else:
        path.write_text(nb_or_text if isinstance(nb_or_text, str) else json.dumps(nb_or_text, indent=1))
    return path


RIGHT = {q.id: solve(q) for q in load_bank("00")}
WRONG_ANSWERS = {q.id: wrong(q) for q in load_bank("00")}


def read_csv(path):
    with open(path, newline="") as f:
        return {Path(r["file"]).name: r for r in csv.DictReader(f)}


def test_correct_wrong_and_partial_submissions(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "alice.ipynb", submission(RIGHT, student_id="alice"))
    write(subs, "bob.ipynb", submission({**WRONG_ANSWERS}, student_id="bob"))
    write(subs, "carol.ipynb", submission({"q00_1": RIGHT["q00_1"], "q00_3": RIGHT["q00_3"]}, student_id="carol"))
    # alice's personal question is solved for alice's own numbers
    write(subs, "dave.ipynb", submission({**RIGHT, "q00_4": solve(get_question("q00_4"), "dave")}, student_id="dave"))
    run = grade([subs], tmp_path / "grades.csv")
    rows = read_csv(run.csv_path)
    header = next(csv.reader(open(run.csv_path)))
    assert header == [
        "file",
        "student_id",
        "status",
        "notebook",
        "q00_1",
        "q00_2",
        "q00_3",
        "q00_4",
        "total",
        "max_points",
        "attempts_q00_1",
        "attempts_q00_2",
        "attempts_q00_3",
        "attempts_q00_4",
        "notes",
    ]
    assert rows["dave.ipynb"]["total"] == "4" and rows["dave.ipynb"]["max_points"] == "4"
    assert rows["bob.ipynb"]["total"] == "0" and rows["bob.ipynb"]["attempts_q00_1"] == "2"
    carol = rows["carol.ipynb"]
    assert (carol["q00_1"], carol["q00_2"], carol["q00_3"], carol["q00_4"], carol["total"]) == ("1", "0", "1", "0", "2")
    assert carol["attempts_q00_2"] == ""  # never checked
    # alice used SID's number for q00_4 only if it happens to match her own: solve() for SID vs for alice
    alice_q4 = judge(get_question("q00_4"), eval(RIGHT["q00_4"]), "alice").status
    assert rows["alice.ipynb"]["q00_4"] == ("1" if alice_q4 == CORRECT else "0")
    feedback = (run.feedback_dir / "bob.txt").read_text()
    assert "Score: 0 / 4" in feedback and "Hint: " + get_question("q00_1").hint in feedback
    assert all(explanation(q, "bob") not in feedback for q in load_bank("00"))
    assert explanation(get_question("q00_1")) in (run.feedback_dir / "dave.txt").read_text()
    report = run.report_path.read_text()
    # alice, carol, dave right; bob wrong, and the instructor sees which wrong option he believed
    assert f"| q00_1 | 1 | 3 | 1 | 0 | 0 | 2.0 | {eval(WRONG_ANSWERS['q00_1'])} (1) |" in report
    assert f"| q00_3 | 1 | 3 | 1 | 0 | 0 | 2.0 | {eval(WRONG_ANSWERS['q00_3']):g} (1) |" in report
    assert re.search(r"^\| q00_4 \|.*\| - \|$", report, re.M)  # per-student numbers: wrong values say nothing
    alice = 3 + (alice_q4 == CORRECT)
    totals = sorted([0, 2, 4, alice])
    scores = report.split("## Scores")[1].split("## Questions")[0]
    mean = f"{sum(totals) / 4:.1f} of 4 points ({100 * sum(totals) / 16:.0f} %)"
    assert f"4 students graded: mean {mean}, median {(totals[1] + totals[2]) / 2:g} of 4" in scores
    assert f"; {totals.count(4)} with full marks, 1 with none." in scores
    for total in set(totals):
        assert f"| {total} / 4 | {totals.count(total)} |" in scores


def test_edited_submissions_are_read_as_written(tmp_path):
    q1 = get_question("q00_1")
    nb = submission(receipts=False)
    cells = nb["cells"]
    qc = quick_check_cells(nb)
    set_source = lambda cell, text: cell.__setitem__("source", text.splitlines(keepends=True))  # noqa: E731
    # q00_1: answered through another variable, in a cell the student added
    set_source(qc[1], f'# QUICK CHECK q00_1\nmine = {RIGHT["q00_1"]}\ncheck("q00_1", mine)')
    # q00_2: answered, then the cell duplicated and the copy left blank, below it
    set_source(qc[2], f"# QUICK CHECK q00_2\nanswer_q00_2 = {RIGHT['q00_2']}\ncheck('q00_2', answer_q00_2)")
    cells.insert(
        cells.index(qc[2]) + 1,
        {**copy.deepcopy(qc[2]), "source": ["answer_q00_2 = None\n", "check('q00_2', answer_q00_2)"]},
    )
    # q00_3: computed from a name: unreadable, with the reason
    set_source(qc[3], "%time x = 1\nbytes_pp = 16\nanswer_q00_3 = bytes_pp\ncheck('q00_3', answer_q00_3)")
    # q00_4: cell moved to the top of the notebook, answered with arithmetic
    cells.remove(qc[4])
    mem = params_for(get_question("q00_4"), SID)["memory_gb"]
    set_source(
        qc[4],
        f"answer_q00_4 = {mem} / 0.52  # GB / bytes per param\ncheck('q00_4', answer_q00_4, student_id=student_id)",
    )
    cells.insert(0, qc[4])
    s = grade_submission(write(tmp_path, "edited.ipynb", nb))
    g = s.questions
    assert g["q00_1"].status == CORRECT and g["q00_1"].points == 1
    assert g["q00_2"].status == CORRECT and any("graded the one in cell" in n for n in g["q00_2"].notes)
    assert g["q00_3"].status == "unreadable" and "uses the name bytes_pp" in g["q00_3"].message
    assert g["q00_4"].status == CORRECT
    assert s.total == 3 and q1.id in s.questions


def test_deleted_cells_and_a_cell_with_a_syntax_error(tmp_path):
    nb = submission({"q00_1": RIGHT["q00_1"], "q00_3": RIGHT["q00_3"]}, receipts=False)
    qc = quick_check_cells(nb)
    nb["cells"].remove(qc[2])  # q00_2's cell deleted
    qc[3]["source"] = [f"answer_q00_3 = {RIGHT['q00_3']}\n", "check('q00_3', answer_q00_3\n"]  # missing ")"
    s = grade_submission(write(tmp_path, "s.ipynb", nb))
    assert s.questions["q00_1"].status == CORRECT
    assert s.questions["q00_2"].status == "missing" and "deleted?" in s.questions["q00_2"].message
    assert s.questions["q00_3"].status == CORRECT  # the answer line reads fine on its own
    assert any("syntax error" in n for n in s.notes)
    assert s.total == 2


def test_answer_changed_after_its_receipt_is_noted(tmp_path):
    nb = submission(WRONG_ANSWERS)  # receipts for the wrong answers
    for cell in quick_check_cells(nb):  # then edited to the right ones without running again
        src = "".join(cell["source"])
        for qid, text in RIGHT.items():
            src = src.replace(f"answer_{qid} = {WRONG_ANSWERS[qid]}", f"answer_{qid} = {text}")
        cell["source"] = [src]
    s = grade_submission(write(tmp_path, "s.ipynb", nb))
    assert s.total == 4  # graded from the text, as written
    assert all(any("edited after its last check" in n for n in g.notes) for g in s.questions.values())


def test_colab_widget_metadata_and_string_sources(tmp_path):
    nb = submission(RIGHT)
    state = {"abc": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_x"]}}}
    nb["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": state, "version_major": 2}}
    for i, cell in enumerate(nb["cells"]):
        cell["source"] = "".join(cell["source"])  # Colab writes one string
        cell["metadata"] = {"colab": {"base_uri": "https://localhost:8080/"}, "id": f"x{i}", "outputId": "abc"}
        if cell["cell_type"] == "code":
            cell.setdefault("outputs", []).append(
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {
                        "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2},
                        "text/plain": "VBox(children=(HTML(value='<b>Quick check</b>'),))",
                    },
                }
            )
    s = grade_submission(write(tmp_path, "colab.ipynb", nb))
    assert s.status == "graded" and s.total == 4 and s.questions["q00_1"].attempts == 2


def test_truncated_invalid_and_non_notebook_files_never_stop_the_batch(tmp_path):
    subs = tmp_path / "subs"
    good = json.dumps(submission(RIGHT), indent=1)
    cut = good.index('"## In this notebook we:')  # cut inside the recap: every quick check survives
    files = {
        "good.ipynb": good,
        "truncated_late.ipynb": good[:cut],
        "truncated_early.ipynb": good[:300],
        "invalid.ipynb": good[:cut] + "<<merge conflict>>" + good[cut:],
        "empty.ipynb": "",
        "list.ipynb": "[1, 2, 3]",
        "settings.ipynb": '{"theme": "dark"}',
        "page.ipynb": "<!DOCTYPE html><html><body>notebook</body></html>",
        "script.ipynb": "# %%\nimport torch\nprint(1)\n",
        "report.ipynb": b"%PDF-1.7\n%\xe2\xe3\xcf\xd3 binary",
        "zipped.ipynb": b"PK\x03\x04\x14\x00\x00\x00",
        "noise.ipynb": bytes(range(256)) * 4,
        "deep.ipynb": "[" * 100_000,
    }
    for name, content in files.items():
        write(subs, name, content)
    write(subs, "notes.txt", "not a submission")
    write(subs, "__MACOSX/._good.ipynb", b"\x00\x05\x16\x07")
    write(subs, ".ipynb_checkpoints/good-checkpoint.ipynb", good)
    run = grade([subs, tmp_path / "missing.ipynb"], tmp_path / "out" / "grades.csv")
    rows = read_csv(run.csv_path)
    assert len(rows) == len(files) + 1 and "good-checkpoint.ipynb" not in rows
    assert rows["good.ipynb"]["total"] == "4"
    assert rows["truncated_late.ipynb"]["status"] == "damaged" and rows["truncated_late.ipynb"]["total"] == "4"
    reasons = {s.path.name: s.reason for s in run.unreadable}
    expected = {
        "truncated_early.ipynb": "cut off after",
        "empty.ipynb": "the file is empty",
        "list.ipynb": "JSON, but a list",
        "settings.ipynb": 'no "cells" list',
        "page.ipynb": "an HTML page",
        "script.ipynb": "a Python script",
        "report.ipynb": "a PDF",
        "zipped.ipynb": "a zip archive",
        "noise.ipynb": "not text",
        "deep.ipynb": "nested too deeply",
        "missing.ipynb": "cannot open it",
    }
    for name, why in expected.items():
        assert why in reasons.get(name, ""), (name, reasons.get(name))
    assert rows["invalid.ipynb"]["status"] == "damaged" and rows["invalid.ipynb"]["total"] == "4"
    assert "invalid JSON at line" in rows["invalid.ipynb"]["notes"]
    report = run.report_path.read_text()
    assert "## Could not read (11)" in report and "notes.txt`: not a .ipynb file" in report
    assert (run.feedback_dir / "report.txt").read_text().startswith("Quick checks: report.ipynb")


def test_student_ids_missing_or_shared_are_reported(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "a.ipynb", submission(RIGHT, student_id="twin"))
    write(subs, "b.ipynb", submission(RIGHT, student_id="Twin "))
    write(subs, "c.ipynb", submission(RIGHT, student_id=""))
    run = grade([subs], tmp_path / "g.csv")
    report = run.report_path.read_text()
    assert "- no student id (1): `c.ipynb`" in report and "in 2 submissions" in report
    c = read_csv(run.csv_path)["c.ipynb"]
    assert c["q00_4"] == "0" and "needs your student id" in c["notes"]


def test_a_student_id_cannot_inject_a_spreadsheet_formula(tmp_path):
    write(tmp_path / "subs", "x.ipynb", submission(RIGHT, student_id='=HYPERLINK("http://evil","id")'))
    row = read_csv(grade([tmp_path / "subs"], tmp_path / "g.csv").csv_path)["x.ipynb"]
    assert row["student_id"].startswith("'=")


def test_a_notebook_with_no_quick_checks_left_is_graded_on_the_batch_questions(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "full.ipynb", submission(RIGHT))
    stripped = submission()
    stripped["cells"] = [c for c in stripped["cells"] if c not in quick_check_cells(stripped)]
    write(subs, "stripped.ipynb", stripped)
    run = grade([subs], tmp_path / "g.csv")
    row = read_csv(run.csv_path)["stripped.ipynb"]
    assert row["total"] == "0" and row["max_points"] == "4" and "no quick-check cells found" in row["notes"]


def test_same_file_names_in_different_folders_get_separate_feedback(tmp_path):
    for who in ("ann", "ben"):
        write(tmp_path / "subs" / who, "00_where_to_get_gpus.ipynb", submission(RIGHT, student_id=who))
    run = grade([tmp_path / "subs"], tmp_path / "g.csv")
    names = sorted(p.name for p in run.feedback_dir.iterdir())
    assert names == ["subs__ann__00_where_to_get_gpus.txt", "subs__ben__00_where_to_get_gpus.txt"]


def test_grade_command_line(tmp_path):
    write(tmp_path / "subs", "a.ipynb", submission(RIGHT))
    write(tmp_path / "subs", "b.ipynb", "oops")
    cmd = [
        sys.executable,
        "-m",
        "helpers.quickcheck",
        "grade",
        str(tmp_path / "subs"),
        "--out",
        str(tmp_path / "g.csv"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "graded 2 submissions" in done.stdout and "(1 could not be read)" in done.stdout
    assert "could not read" in done.stdout and "b.ipynb" in done.stdout
    assert (
        "scores: 1 student graded: mean 4.0 of 4 points (100 %), median 4 of 4; 1 with full marks, 0 with none"
        in done.stdout
    )
    bad = subprocess.run(cmd[:-2] + ["--notebook", "42"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--notebook 42 has no questions; use one of 00, 01" in bad.stderr
    (tmp_path / "empty").mkdir()
    empty = subprocess.run(cmd[:4] + [str(tmp_path / "empty")], capture_output=True, text=True)
    assert empty.returncode == 2 and "no .ipynb files" in empty.stderr
    typo = subprocess.run(cmd[:4] + [str(tmp_path / "subz")], capture_output=True, text=True)
    assert typo.returncode == 2 and "no such file or folder" in typo.stderr


class FakeTTY(io.StringIO):
    """A fake terminal: a StringIO that says it is one."""

    def isatty(self):
        return True


def test_grading_shows_one_updating_line_on_a_terminal_and_nothing_elsewhere(tmp_path, monkeypatch):
    terminal, log = FakeTTY(), io.StringIO()
    for done in (1, 2, 3):
        show_graded(done, 3, terminal)
        show_graded(done, 3, log)
    assert terminal.getvalue() == "\rgraded 1/3\rgraded 2/3\rgraded 3/3\n" and log.getvalue() == ""
    write(tmp_path / "subs", "a.ipynb", submission(RIGHT))
    write(tmp_path / "subs", "b.ipynb", submission(RIGHT))
    monkeypatch.setattr(sys, "stderr", FakeTTY())
    grade([tmp_path / "subs"], tmp_path / "g.csv")
    assert sys.stderr.getvalue() == "\rgraded 1/2\rgraded 2/2\n"


# ---------------------------------------------------------------- student versions

INSTRUCTOR_CELLS = [
    ("code", "# QUICK CHECK q00_1\n# BEGIN SOLUTION\nanswer_q00_1 = 'b'\n# END SOLUTION\ncheck('q00_1', answer_q00_1)"),
    (
        "code",
        "def effective_batch(per_device_batch, grad_accum_steps):\n    # BEGIN SOLUTION\n"
        "    return per_device_batch * grad_accum_steps\n    # END SOLUTION\n",
    ),
    ("code", "# QUICK CHECK q00_3\nanswer_q00_3 = 16  # forgot the markers\ncheck('q00_3', answer_q00_3)"),
    ("code", "# QUICK CHECK student\nstudent_id = 'prof'"),
    ("markdown", "Why does a T4 use fp16?\n<!-- BEGIN SOLUTION -->\nBecause bf16 needs 8.0.\n<!-- END SOLUTION -->"),
]


def instructor_notebook():
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
    }
    for kind, text in INSTRUCTOR_CELLS:
        cell = nbformat.v4.new_code_cell(text) if kind == "code" else nbformat.v4.new_markdown_cell(text)
        if kind == "code":
            cell.outputs = [nbformat.v4.new_output("stream", text="✓ Correct. because bf16 needs 8.0\n")]
            cell.execution_count = 3
            cell.metadata = {"tags": ["keep"], "scrolled": True, "colab": {"id": "x"}}
        nb.cells.append(cell)
    return json.loads(nbformat.writes(nb))


def test_student_version_removes_solutions_blanks_answers_and_strips_outputs():
    out, notes = student_version(instructor_notebook(), "lesson.ipynb")
    text = json.dumps(out)
    assert "'b'" not in text and "because bf16 needs 8.0" not in text.lower() and "prof" not in text
    assert "return per_device_batch" not in text and "SOLUTION" not in text
    sources = ["".join(c["source"]) for c in out["cells"]]
    assert sources[0] == "# QUICK CHECK q00_1\nanswer_q00_1 = None  # YOUR ANSWER\ncheck('q00_1', answer_q00_1)"
    assert "    # YOUR CODE HERE\n" in sources[1]
    assert sources[2] == "# QUICK CHECK q00_3\nanswer_q00_3 = None  # forgot the markers\ncheck('q00_3', answer_q00_3)"
    assert sources[3] == '# QUICK CHECK student\nstudent_id = ""'
    assert "YOUR ANSWER HERE" in sources[4]
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert all(c["metadata"] == {"tags": ["keep"]} for c in code)
    assert "widgets" not in out["metadata"]
    assert any("answer_q00_3 held a value outside the solution markers" in n for n in notes)
    nbformat.validate(nbformat.reads(json.dumps(out), as_version=4))


def test_unbalanced_markers_stop_that_notebook_and_say_where(tmp_path):
    nb = instructor_notebook()
    nb["cells"][0]["source"] = "answer_q00_1 = None\n# BEGIN SOLUTION\nanswer_q00_1 = 'b'\n"
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lesson.ipynb").write_text(json.dumps(nb))
    with pytest.raises(HandoutError, match=r"lesson.ipynb, cell 1, line 2: BEGIN SOLUTION has no END SOLUTION"):
        write_student_versions(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out" / "lesson.ipynb").exists()
    with pytest.raises(HandoutError, match="would overwrite"):
        write_student_versions(tmp_path / "src", tmp_path / "src")


def test_committed_notebooks_are_already_student_versions():
    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        out, notes = student_version(nb, path.name)
        assert notes == [], f"{path.name}: {notes}"
        assert ["".join(c["source"]) for c in out["cells"]] == ["".join(c["source"]) for c in nb["cells"]]


@pytest.mark.parametrize("path", sorted(NOTEBOOKS_DIR.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_notebook_ends_with_its_quick_checks_then_the_recap(path):
    nb = json.loads(path.read_text())
    qids = {q.id for q in load_bank(path.stem[:2])}
    found = scan([Cell(i, "".join(c["source"])) for i, c in enumerate(nb["cells"], 1) if c["cell_type"] == "code"])
    assert set(found.calls) == qids, (
        f"{path.name} should end with quick checks for {sorted(qids)} (it checks {sorted(found.calls)}): add one "
        f"`# QUICK CHECK qNN_k` cell per question before the recap, as in notebooks/src/00_where_to_get_gpus.py"
    )
    # one block of quick checks near the end; after it only what closes a notebook (the exercises, the cell that
    # saves the figures for the tests) and the recap
    at = [i for i, c in enumerate(nb["cells"]) if c in quick_check_cells(nb)]
    assert at == list(range(at[0], at[-1] + 1)), f"{path.name}: the quick checks are consecutive cells"
    recaps = [i for i, c in enumerate(nb["cells"]) if "".join(c["source"]).startswith("## In this notebook")]
    assert recaps and recaps[-1] > at[-1], f"{path.name}: the recap (## In this notebook we:) follows the quick checks"
    for qid in qids:
        assert find_answer(found, qid).value is None, f"{path.name}: answer_{qid} must be blank (None)"


# ---------------------------------------------------------------- end to end, in a real kernel


def all_text(cells):
    """Sources and output texts of cells, decoded (what a person reading the notebook sees)."""

    def text(value):
        return "".join(value) if isinstance(value, list) else str(value)

    parts = []
    for c in cells:
        parts.append(text(c["source"]))
        for o in c.get("outputs", []):
            parts += [text(o.get("text", "")), *(text(v) for v in o.get("data", {}).values())]
    return "\n".join(parts)


def leaks(nb, student_id=""):
    """Plain answers found in a notebook's sources and outputs (the grep the issue asks for)."""
    text = all_text(nb["cells"])
    section = all_text(quick_check_cells(nb))
    found = []
    for q in load_bank("00"):
        for sid in {student_id, SID}:
            if not sid and q.personal:
                continue
            message = explanation(q, sid)
            fragment = max(re.split(r"\d+(?:\.\d+)?", message), key=len).strip()  # the longest number-free part
            if fragment in text:
                found.append(f"{q.id}: its explanation ({fragment[:30]}...)")
            if re.search(rf"answer_{q.id}\s*=\s*{re.escape(solve(q, sid))}", text):
                found.append(f"{q.id}: the right answer assigned")
        if q.kind == "number" and not q.personal and re.search(rf"(?<![\w.]){solve(q)}(?![\w.])", section):
            found.append(f"{q.id}: the right number in the quick-check cells")
    return found


@pytest.fixture(scope="module")
def student_run(tmp_path_factory):
    """Student versions of the kit's notebooks, and notebook 00's executed by the runner (papermill)."""
    from helpers.maintainer.execution import CELL_TIMEOUT_S, execute

    root = tmp_path_factory.mktemp("e2e")
    made = write_student_versions(NOTEBOOKS_DIR, root / "handout")
    outcome = execute(root / "handout" / NB00.name, root / "build", smoke=True, cell_timeout=CELL_TIMEOUT_S["smoke"])
    assert outcome.status == "ok", outcome.error
    return root, made, json.loads((root / "build" / "notebooks" / NB00.name).read_text())


@pytest.mark.slow
def test_student_version_and_its_outputs_contain_no_answer(student_run):
    root, made, executed = student_run
    assert [p.name for p, _ in made] == [p.name for p in sorted(NOTEBOOKS_DIR.glob("*.ipynb"))]
    assert leaks(json.loads((root / "handout" / NB00.name).read_text())) == []
    assert leaks(executed) == []
    outputs = "".join(
        o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
        for c in quick_check_cells(executed)
        for o in c["outputs"]
    )
    assert outputs.count("Not answered yet") == 4 and "Traceback" not in outputs


@pytest.mark.slow
def test_answered_in_a_kernel_then_graded(student_run, tmp_path):
    """Students answer in a real kernel (receipts printed by check()), the grader reads the files."""
    from nbclient import NotebookClient

    root, _, _ = student_run
    handout = json.loads((root / "handout" / NB00.name).read_text())
    start = next(i for i, c in enumerate(handout["cells"]) if "## Quick checks" in "".join(c["source"]))
    # the quick checks alone, a kernel in a second (the folded cell that records the run's figures needs the rest)
    cells = [c for c in handout["cells"][start:] if "record" not in c["metadata"].get("tags", [])]
    section = {**handout, "cells": cells}
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, answers in [("right", RIGHT), ("wrong", WRONG_ANSWERS), ("blank", {})]:
        nb = nbformat.reads(json.dumps(submission(answers, receipts=False, base=section)), as_version=4)
        NotebookClient(nb, timeout=60, kernel_name="python3").execute()
        nbformat.write(nb, subs / f"{name}.ipynb")
    right = json.loads((subs / "right.ipynb").read_text())
    assert leaks(right, SID), "the grep must catch explanations printed after right answers"
    run = grade([subs], tmp_path / "grades.csv")
    rows = read_csv(run.csv_path)
    assert rows["right.ipynb"]["total"] == "4" and rows["right.ipynb"]["student_id"] == SID
    assert [rows["right.ipynb"][f"attempts_q00_{i}"] for i in range(1, 5)] == ["1"] * 4
    assert rows["wrong.ipynb"]["total"] == "0" and rows["blank.ipynb"]["total"] == "0"
    assert rows["blank.ipynb"]["attempts_q00_1"] == ""
    assert not any(g.notes for s in run.submissions for g in s.questions.values())
    outputs = "".join(str(o) for c in quick_check_cells(right) for o in c["outputs"])
    assert "Note:" not in outputs, "check() warns only when the grader would read something else"


def test_student_command_line(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lesson.ipynb").write_text(json.dumps(instructor_notebook()))
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", "student", str(tmp_path / "src"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout and "removed 1 solution block" in done.stdout
    assert "1 student version in" in done.stdout
    assert "'b'" not in (tmp_path / "out" / "lesson.ipynb").read_text()


def test_collect_takes_files_and_folders_once():
    files, skipped = collect([NB00, NB00.parent, NB00])
    assert [f.resolve() for f in files].count(NB00.resolve()) == 1
    assert not any(p.suffix == ".ipynb" for p, _ in skipped)


def test_parse_notebook_reports_bom_and_nbformat3():
    bom = "\ufeff" + json.dumps({"cells": [{"cell_type": "code", "source": "answer_q00_1 = 'x'", "outputs": []}]})
    cells, _ = parse_notebook(bom.encode())
    assert cells[0].source == "answer_q00_1 = 'x'"
    v3 = {"worksheets": [{"cells": [{"cell_type": "code", "input": ["student_id = 'old'"], "outputs": []}]}]}
    cells, _ = parse_notebook(json.dumps(v3).encode())
    assert cells[0].source == "student_id = 'old'"
    with pytest.raises(NotANotebook, match="no cell could be recovered"):
        parse_notebook(b'{"cells": [{"cell_type": "co')
