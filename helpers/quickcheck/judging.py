"""Judge one answer to one question: the single rule shared by `check()` in a notebook and the grader.

Used by every `check()` at the end of notebooks 00 ... 08 and by `python -m helpers.quickcheck grade`.

`judge` normalizes the answer for the question's kind (`answers.normalize`: letters, a number, a
dict of values), then compares it without ever holding the right answer in plain text: choice
questions and fixed numbers against the bank's salted hash (`sealing`), per-student numbers and
properties by computing the expected value or the rules from the student's parameters. The
messages it returns are a hint or the explanation, never the expected value; a wrong choice answer
also gets its option's own feedback (`Verdict.why_not`: "You picked c: ..."), unsealed with a key
made from the option the student picked, so judging still never needs the right answer.

Receipts (`format_receipt`, `RECEIPT`) are the line `check()` prints after each attempt; the grader
reads the attempt counts back from the submitted notebook's outputs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from helpers.quickcheck.answers import answer_format, normalize
from helpers.quickcheck.bank import LEFT_OUT, PICKED, Question, format_text, normalize_student_id, params_for
from helpers.quickcheck.safe_eval import Unreadable, evaluate
from helpers.quickcheck.sealing import answer_hash, unseal_option, unseal_text

__all__ = ["CORRECT", "INVALID", "NEEDS_ID", "RECEIPT", "UNANSWERED", "WRONG", "Verdict", "format_receipt", "judge"]

CORRECT, WRONG, UNANSWERED, INVALID, NEEDS_ID = "correct", "wrong", "unanswered", "invalid", "needs_id"
RECEIPT = re.compile(r"receipt (q\d\d_[A-Za-z0-9]+) · attempt (\d+) · (correct|not yet)")


@dataclass(frozen=True)
class Verdict:
    """The outcome of judging one answer.

    status: correct, wrong, unanswered (None), invalid (not an answer of this kind) or needs_id
    (a per-student question without a student id). message: the explanation when correct, the
    hint when wrong, otherwise what to do. canonical: the normalized answer ("bd", "160", ...).
    why_not: for a wrong choice answer, the feedback of the (first) mistaken option, e.g.
    "You picked c: ..." or, multi-answer, "You left out b: ..."; "" when the bank has none.
    """

    question_id: str
    status: str
    points: float
    message: str
    canonical: str | None = None
    why_not: str = ""

    @property
    def counts_as_attempt(self) -> bool:
        return self.status in (CORRECT, WRONG)


def judge(question: Question, answer: Any, student_id: Any = None) -> Verdict:
    """Judge `answer` to `question` for this student; never raises, whatever the answer is.

    Example:
        >>> from helpers.quickcheck.bank import get_question
        >>> judge(get_question("q04_1"), None).status
        'unanswered'
    """
    try:
        return _judge(question, answer, student_id)
    except Exception as e:  # an answer no rule foresaw (a raising __eq__, a hostile id) is invalid, not a crash
        return Verdict(
            question.id,
            INVALID,
            0,
            f"{question.variable} could not be checked ({type(e).__name__}); write {answer_format(question)}",
        )


def _judge(q: Question, answer: Any, student_id: Any) -> Verdict:
    needs_id = q.personal and not normalize_student_id(student_id)
    set_id = (
        "This question gives each student their own numbers: set student_id in the cell at the start "
        "of the quick checks and run it, then this cell."
        if student_id is not None
        else "This question gives each student their own numbers: pass your id, "
        f'check("{q.id}", {q.variable}, student_id=student_id).'
    )
    if answer is None:
        first = f"{set_id} " if needs_id else ""
        return Verdict(q.id, UNANSWERED, 0, f"{first}Not answered yet: set {q.variable} to {answer_format(q)}.")
    if needs_id:
        return Verdict(q.id, NEEDS_ID, 0, set_id)
    params = params_for(q, student_id) if q.personal else {}
    try:
        canonical, value = normalize(q, answer)
    except ValueError as e:
        return Verdict(q.id, INVALID, 0, str(e))
    ok, key, failed_hint = _compare(q, canonical, value, params)
    if not ok:
        why_not = _why_not(q, value) if q.kind == "choice" else ""
        return Verdict(q.id, WRONG, 0, failed_hint or format_text(q.hint, params), canonical, why_not)
    if q.explanation_sealed:
        explanation = unseal_text(q.id, key, q.explanation_sealed)
    else:
        explanation = format_text(q.explanation, {**params, **(value if isinstance(value, dict) else {})})
    return Verdict(q.id, CORRECT, q.points, explanation, canonical)


def format_receipt(verdict: Verdict, attempt: int) -> str:
    """The receipt line check() prints: question, attempt, result; never the answer."""
    result = "correct" if verdict.status == CORRECT else "not yet"
    return f"receipt {verdict.question_id} · attempt {attempt} · {result}"


def _why_not(q: Question, picked: frozenset) -> str:
    """The first option, in letter order, whose sealed feedback for its state (picked or left out) is not empty.

    One-answer questions seal a text for every option as picked, so the picked wrong one always has
    its own. Multi-answer questions seal empty texts for the states that are right, so the first
    non-empty one is the first mistake; one per try, as a one-answer question shows one per try.
    """
    for letter in q.choices:
        state = PICKED if letter in picked else LEFT_OUT
        text = unseal_option(q, state, letter)
        if text:
            return f"You {'picked' if state == PICKED else 'left out'} {letter}: {text}"
    return ""


def _compare(q: Question, canonical: str, value: Any, params: dict) -> tuple[bool, str, str]:
    """(right?, the canonical key that matched, the hint of the first failed rule)."""
    if q.kind == "choice":
        return answer_hash(q.id, canonical) == q.answer_sha256, canonical, ""
    if q.kind == "number" and not q.personal:
        scaled = value * 10**q.decimals  # right when it rounds to the answer, halves either way
        for key in dict.fromkeys((str(math.floor(scaled + 0.5 + 1e-9)), str(math.ceil(scaled - 0.5 - 1e-9)))):
            if answer_hash(q.id, key) == q.answer_sha256:
                return True, key, ""
        return False, "", ""
    if q.kind == "number":
        expected = evaluate(q.expect, params)
        close = abs(value - expected) <= max(q.tolerance * abs(expected), 1e-9)
        return close, canonical, ""
    names = {**params, **value}
    for rule in q.rules:
        try:
            passed = bool(evaluate(rule.require, names))
        except Unreadable:
            passed = False
        if not passed:
            return False, "", format_text(rule.hint, names)
    return True, canonical, ""
