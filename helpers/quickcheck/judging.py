"""Judge one answer to one question: the single rule shared by `check()` in a notebook and the grader.

`judge` normalizes the answer for the question's kind (letters, a number, a dict of values), then
compares it without ever holding the right answer in plain text: choice questions and fixed
numbers against the bank's salted hash, per-student numbers and properties by computing the
expected value or the rules from the student's parameters. The messages it returns are a hint
or the explanation, never the expected value.

Receipts (`format_receipt`, `RECEIPT`) are the line `check()` prints after each attempt; the grader
reads the attempt counts back from the submitted notebook's outputs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from helpers.quickcheck.bank import (
    Question,
    answer_hash,
    format_text,
    normalize_student_id,
    params_for,
    unseal_text,
)
from helpers.quickcheck.safe_eval import Unreadable, evaluate

CORRECT, WRONG, UNANSWERED, INVALID, NEEDS_ID = "correct", "wrong", "unanswered", "invalid", "needs_id"
RECEIPT = re.compile(r"receipt (q\d\d_[A-Za-z0-9]+) · attempt (\d+) · (correct|not yet)")


@dataclass(frozen=True)
class Verdict:
    """The outcome of judging one answer.

    status: correct, wrong, unanswered (None), invalid (not an answer of this kind) or needs_id
    (a per-student question without a student id). message: the explanation when correct, the
    hint when wrong, otherwise what to do. canonical: the normalized answer ("bd", "160", ...).
    """

    question_id: str
    status: str
    points: float
    message: str
    canonical: str | None = None

    @property
    def counts_as_attempt(self) -> bool:
        return self.status in (CORRECT, WRONG)


def judge(question: Question, answer: Any, student_id: Any = None) -> Verdict:
    """Judge `answer` to `question` for this student; never raises for a bad answer.

    Example:
        >>> from helpers.quickcheck.bank import get_question
        >>> judge(get_question("q04_1"), None).status
        'unanswered'
    """
    q = question
    needs_id = q.personal and not normalize_student_id(student_id)
    set_id = ("This question gives each student their own numbers: set student_id in the cell at the start "
              "of the quick checks and run it, then this cell." if student_id is not None else
              "This question gives each student their own numbers: pass your id, "
              f'check("{q.id}", {q.variable}, student_id=student_id).')
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
        return Verdict(q.id, WRONG, 0, failed_hint or format_text(q.hint, params), canonical)
    if q.explanation_sealed:
        explanation = unseal_text(q.id, key, q.explanation_sealed)
    else:
        explanation = format_text(q.explanation, {**params, **(value if isinstance(value, dict) else {})})
    return Verdict(q.id, CORRECT, q.points, explanation, canonical)


def normalize(q: Question, answer: Any) -> tuple[str, Any]:
    """(canonical text, value) of an answer; ValueError saying how to write it when it is not one."""
    if q.kind == "choice":
        letters = _letters(q, answer)
        return "".join(sorted(letters)), letters
    if q.kind == "number":
        value = _number(q, answer)
        return (str(math.floor(value * 10**q.decimals + 0.5)) if not q.personal else f"{value:.6g}"), value
    return _fields(q, answer)


def answer_format(q: Question) -> str:
    """How an answer to this question is written, for messages (never an example that could be right)."""
    if q.kind == "choice":
        letters = ", ".join(f'"{k}"' for k in q.choices)
        if q.multiple:
            return f"every letter that applies, in one string, in any order (from {letters})"
        return f"one letter in quotes ({letters.rsplit(', ', 1)[0]} or {letters.rsplit(', ', 1)[1]})"
    if q.kind == "number":
        rounding = f", to {q.decimals} decimal{'s' if q.decimals != 1 else ''}" if q.decimals and not q.personal else ""
        return f"a number, without quotes or units{rounding}"
    keys = ", ".join(f'"{k}": ...' for k in q.fields)
    return f"a dict {{{keys}}} of {'whole numbers' if set(q.fields.values()) == {'int'} else 'numbers'}"


def format_receipt(verdict: Verdict, attempt: int) -> str:
    """The receipt line check() prints: question, attempt, result; never the answer."""
    result = "correct" if verdict.status == CORRECT else "not yet"
    return f"receipt {verdict.question_id} · attempt {attempt} · {result}"


def canonical_for_sealing(raw: dict) -> str:
    """The canonical form of a plain bank "answer", for `bank.seal_file`."""
    q = Question(id=raw["id"], kind=raw["kind"], prompt="", hint="", choices=raw.get("choices", {}),
                 multiple=raw.get("multiple", False), decimals=raw.get("decimals", 0))
    if q.kind not in ("choice", "number"):
        raise ValueError(f'{q.id}: only choice and number questions have one "answer" to seal')
    return normalize(q, raw["answer"])[0]


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


def _letters(q: Question, answer: Any) -> frozenset:
    options = ", ".join(q.choices)
    if isinstance(answer, str):
        text = answer.strip().lower()
        by_text = [k for k, v in q.choices.items() if v.strip().lower() == text]
        if by_text:
            return frozenset(by_text)
        parts = [p for p in re.split(r"[\s,;/()\[\].+&]+", text) if p]
        letters = list("".join(parts)) if all(set(p) <= set(q.choices) for p in parts) else None
    elif isinstance(answer, (list, tuple, set, frozenset)) and all(isinstance(a, str) for a in answer):
        letters = [a.strip().lower().strip("()") for a in answer]
        if not all(a in q.choices for a in letters):
            letters = None
    else:
        raise ValueError(f"{q.variable} is {type(answer).__name__} {answer!r}; write {answer_format(q)}")
    if not letters:
        raise ValueError(f"{q.variable} = {answer!r} is not made of the choices' letters ({options}); "
                         f"write {answer_format(q)}")
    if not q.multiple and len(set(letters)) != 1:
        raise ValueError(f"{q.variable} = {answer!r} picks {len(set(letters))} letters; this question has "
                         f"one right choice: write {answer_format(q)}")
    return frozenset(letters)


def _number(q: Question, answer: Any) -> float:
    value = answer
    if isinstance(answer, str):
        try:
            value = float(answer.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"{q.variable} = {answer!r} is text; write {answer_format(q)}") from None
    elif isinstance(answer, bool) or not hasattr(answer, "__float__") or isinstance(answer, complex):
        raise ValueError(f"{q.variable} is {type(answer).__name__} {answer!r:.60}; write {answer_format(q)}")
    value = float(value)  # numpy and torch scalars too
    if not math.isfinite(value):
        raise ValueError(f"{q.variable} is {value}; write a finite number")
    return value


def _fields(q: Question, answer: Any) -> tuple[str, dict]:
    if not isinstance(answer, dict):
        raise ValueError(f"{q.variable} is {type(answer).__name__} {answer!r:.60}; write {answer_format(q)}")
    missing = [k for k in q.fields if k not in answer]
    extra = [k for k in answer if k not in q.fields]
    if missing or extra:
        parts = ([f"needs {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"has keys this question does not use: {', '.join(map(repr, extra))}"] if extra else [])
        raise ValueError(f"{q.variable} {' and '.join(parts)}; write {answer_format(q)}")
    values = {}
    for key, kind in q.fields.items():
        v = answer[key]
        if v is Ellipsis:
            raise ValueError(f"{q.variable}[{key!r}] is still ...: replace it with a number")
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__index__"):
            raise ValueError(f"{q.variable}[{key!r}] is {type(v).__name__} {v!r:.40}; write a number")
        if not math.isfinite(float(v)):
            raise ValueError(f"{q.variable}[{key!r}] is {v!r}; write a finite number")
        if kind == "int":
            if float(v) != int(v):
                raise ValueError(f"{q.variable}[{key!r}] is {v!r}; write a whole number")
            v = int(v)
        values[key] = v
    return json.dumps(values, sort_keys=True), values
