"""The forms of an answer: `normalize` one for its question's kind, `answer_format` says how to write one.

Used by `judging` (every `check()` in notebooks 00 ... 08, and `python -m helpers.quickcheck grade`)
and by `sealing` (`python -m helpers.quickcheck seal`), so that an answer is hashed when sealed in
the very form it is compared in when judged: choice letters sorted ("bd"), a fixed number scaled
to its decimals and rounded ("160"), a per-student number to six significant digits, a property
answer as sorted JSON. A value that is not an answer of the kind raises ValueError saying how to
write one, showing the value cut short (`escaping.shown_value`): a megabyte string or a
400-digit number is named, not echoed.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from helpers.quickcheck.bank import Question
from helpers.quickcheck.escaping import shown_value
from helpers.quickcheck.limits import MAX_TEXT_CHARS

__all__ = ["answer_format", "normalize"]


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


def _letters(q: Question, answer: Any) -> frozenset:
    options = ", ".join(q.choices)
    if isinstance(answer, (str, list, tuple, set, frozenset)) and len(answer) > MAX_TEXT_CHARS:
        raise ValueError(f"{q.variable} is {shown_value(answer)}, far too long; write {answer_format(q)}")
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
        raise ValueError(f"{q.variable} is {type(answer).__name__} {shown_value(answer)}; write {answer_format(q)}")
    if not letters:
        raise ValueError(
            f"{q.variable} = {shown_value(answer)} is not made of the choices' letters ({options}); "
            f"write {answer_format(q)}"
        )
    if not q.multiple and len(set(letters)) != 1:
        raise ValueError(
            f"{q.variable} = {shown_value(answer)} picks {len(set(letters))} letters; this question has "
            f"one right choice: write {answer_format(q)}"
        )
    return frozenset(letters)


def _number(q: Question, answer: Any) -> float:
    value = answer
    if isinstance(answer, str):
        try:
            value = float(answer.strip().replace("_", "")) if len(answer) <= MAX_TEXT_CHARS else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"{q.variable} = {shown_value(answer)} is text; write {answer_format(q)}")
    elif isinstance(answer, bool) or not hasattr(answer, "__float__") or isinstance(answer, complex):
        raise ValueError(f"{q.variable} is {type(answer).__name__} {shown_value(answer)}; write {answer_format(q)}")
    value = _float(value)  # numpy and torch scalars too
    if value is None:
        raise ValueError(
            f"{q.variable} is {type(answer).__name__} {shown_value(answer)}, which is not one number; "
            f"write {answer_format(q)}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{q.variable} is {value}; write a finite number")
    return value


def _float(value: Any) -> float | None:
    """float(value), or None for what has no single float value (an array of several, an int past 1e308)."""
    value = _element(value)
    # still an array: it holds several; text or a bool out of a one-element array is no number either
    if getattr(value, "ndim", 0) or isinstance(value, (str, bytes, bool)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _element(value: Any) -> Any:
    """The element of an array or tensor that holds one, whatever its shape; any other value as it is.

    float() of a numpy array of shape (1,) is 16.0 with a DeprecationWarning on numpy 2.1 (Colab's) and a
    TypeError on numpy 2.4, while torch takes any one-element tensor: a verdict must not depend on which
    numpy the notebook runs with.
    """
    if getattr(value, "ndim", 0):
        try:
            return value.item()
        except (ValueError, RuntimeError):  # several elements: numpy's ValueError, torch's RuntimeError
            pass
    return value


def _fields(q: Question, answer: Any) -> tuple[str, dict]:
    if not isinstance(answer, dict):
        raise ValueError(f"{q.variable} is {type(answer).__name__} {shown_value(answer)}; write {answer_format(q)}")
    missing = [k for k in q.fields if k not in answer]
    extra = [k for k in answer if k not in q.fields]
    if missing or extra:
        parts = ([f"needs {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"has keys this question does not use: {shown_value(extra)}"] if extra else []
        )
        raise ValueError(f"{q.variable} {' and '.join(parts)}; write {answer_format(q)}")
    values = {}
    for key, kind in q.fields.items():
        v = _element(answer[key])
        if v is Ellipsis:
            raise ValueError(f"{q.variable}[{key!r}] is still ...: replace it with a number")
        number = (
            None
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__index__")
            else _float(v)
        )
        if number is None:
            raise ValueError(f"{q.variable}[{key!r}] is {type(v).__name__} {shown_value(v, 40)}; write a number")
        if not math.isfinite(number):
            raise ValueError(f"{q.variable}[{key!r}] is {shown_value(v, 40)}; write a finite number")
        if kind == "int":
            if number != int(v):
                raise ValueError(f"{q.variable}[{key!r}] is {shown_value(v, 40)}; write a whole number")
            v = int(v)
        values[key] = v
    return json.dumps(values, sort_keys=True), values
