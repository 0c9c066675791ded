"""The instructors' answer key, made from the bank: `python -m helpers.quickcheck key [--out KEY.md]`.

For every quick check of notebooks 00 ... 08 (the last section of each): its id, notebook, points,
question, the right option or value with what counts as right, and why (the explanation `check()`
gives after a right answer; for a choice question also what it says after each wrong pick). Points
per notebook and in all are summed from the bank, so the key is the one place a total is printed
(the README and the notebooks name no number: see tests/test_quickcheck_key.py).

The bank stores no answer in plain text (see `bank`), so the key finds each one as anyone with
the bank could: a choice question by trying every option (multi-answer: every set of options)
against its salted hash; a fixed number by trying every value at its decimals outward from 0, up
to MAX_UNITS steps either way; the explanation is then unsealed with the answer found. A question
that gives each student their own numbers has no single answer: the key gives its formula (or
its rules) with the tolerance and each parameter's values; `student_id` adds that student's
numbers, as the grader derives them from the id.

It is for instructors: its first lines say so and carry KEY_MARKER, and `handout` refuses to make
a student version of a notebook that holds the marker (a key pasted into a cell).
"""

from __future__ import annotations

import itertools
import string

from helpers.quickcheck.bank import LEFT_OUT, PICKED, Question, bank_notebooks, format_text, load_bank, params_for
from helpers.quickcheck.escaping import md_cell
from helpers.quickcheck.safe_eval import evaluate
from helpers.quickcheck.sealing import answer_hash, unseal_option, unseal_text

__all__ = ["KEY_COMMAND", "KEY_MARKER", "MAX_UNITS", "answer_key", "notebook_points", "right_answer"]

KEY_MARKER = "<!-- helpers.quickcheck answer key: for instructors only, never hand out -->"
KEY_COMMAND = "python -m helpers.quickcheck key"
MAX_UNITS = 1_000_000  # a fixed number is searched within +-10^6 steps of its last decimal (about a second)


def right_answer(q: Question) -> str | None:
    """The right answer's canonical form ("c", "bd", "160" in units of the last decimal), found by its hash.

    None for a question with params (each student's answer differs) or when no candidate matches.

    Example:
        >>> from helpers.quickcheck.bank import get_question
        >>> right_answer(get_question("q00_4")) is None  # per-student numbers
        True
    """
    if q.personal or q.kind == "property":
        return None
    if q.kind == "choice":
        sizes = range(1, len(q.choices) + 1) if q.multiple else [1]
        candidates = ("".join(c) for n in sizes for c in itertools.combinations(sorted(q.choices), n))
    else:  # 0, 1, -1, 2, -2, ...: most answers are small
        candidates = (str(s * u) for u in range(MAX_UNITS + 1) for s in ((1,) if u == 0 else (1, -1)))
    return next((c for c in candidates if answer_hash(q.id, c) == q.answer_sha256), None)


def notebook_points(notebooks: list[str] | None = None) -> dict[str, float]:
    """Each notebook's quick-check points, summed from the bank ({"00": 4, ...}), in notebook order."""
    return {nb: sum(q.points for q in load_bank(nb)) for nb in notebooks or bank_notebooks()}


def answer_key(notebooks: list[str] | None = None, student_id: str | None = None) -> str:
    """The answer key as Markdown (readable as it is in a terminal): header, points, every question.

    Args:
        notebooks: the notebooks to include ("00" ... "08"); default all of the bank's.
        student_id: an id as a student writes it: adds their own numbers to the per-student questions.
    """
    notebooks = notebooks or bank_notebooks()
    lines = _header(notebooks, student_id)
    for nb in notebooks:
        questions = load_bank(nb)
        lines += [f"## Notebook {nb} ({_points(sum(q.points for q in questions))})", ""]
        for q in questions:
            lines += _question_lines(q, student_id)
    return "\n".join(lines).rstrip("\n") + "\n"


def _header(notebooks: list[str], student_id: str | None) -> list[str]:
    points = notebook_points(notebooks)
    counts = {nb: len(load_bank(nb)) for nb in notebooks}
    lines = [
        "# Quick-check answer key: for instructors only",
        "",
        KEY_MARKER,
        "",
        "For instructors only: it gives every right answer. Keep it out of the student versions and of "
        "anything students can open (a shared folder, the course repository, an LMS page).",
        "",
        f"Made from the bank (helpers/quickcheck/bank/NN.json) by `{KEY_COMMAND}`: make it again after "
        "changing a question. Questions marked *own numbers* give each student their own values, "
        "derived from their student_id: the key gives the formula"
        + (f", and the numbers of student {student_id!r}." if student_id else "; add --student ID for one student's."),
        "",
        "| notebook | questions | points |",
        "|---|---:|---:|",
        *(f"| {md_cell(nb)} | {counts[nb]} | {points[nb]:g} |" for nb in notebooks),
        f"| total | {sum(counts.values())} | {sum(points.values()):g} |",
        "",
    ]
    return lines


def _question_lines(q: Question, student_id: str | None) -> list[str]:
    own = ", own numbers" if q.personal else ""
    head = [f"### {q.id} (notebook {q.notebook}, {q.kind}{own}, {_points(q.points)})", ""]
    values = params_for(q, student_id) if q.personal and student_id else {}
    head += [_fill(q.prompt, values), ""]
    if q.kind == "choice":
        body = _choice_lines(q)
    elif q.kind == "number" and not q.personal:
        body = _fixed_number_lines(q)
    elif q.kind == "number":
        body = _personal_number_lines(q, student_id, values)
    else:
        body = _property_lines(q, student_id, values)
    return head + body + [""]


def _choice_lines(q: Question) -> list[str]:
    canonical = right_answer(q)
    if canonical is None:
        return [f"Answer: not found (no option matches the bank's hash): seal {q.id} again with its answer."]
    lines = []
    for letter, text in q.choices.items():
        right = letter in canonical
        lines.append(f"- **{letter}) {text}** (right)" if right else f"- {letter}) {text}")
        if q.multiple and right:
            feedback, label = unseal_option(q, LEFT_OUT, letter), "why it belongs"
        else:
            feedback, label = ("" if right else unseal_option(q, PICKED, letter)), "why not"
        if feedback:
            lines.append(f"  - {label}: {feedback}")
    how = "these letters in one string, in any order" if len(canonical) > 1 else "one letter in quotes"
    lines += ["", f'Answer: `"{canonical}"` ({how}).']
    return lines + _why(q, canonical)


def _fixed_number_lines(q: Question) -> list[str]:
    units = right_answer(q)
    if units is None:
        return [
            f"Answer: not found within {MAX_UNITS:,} steps of {10**-q.decimals:g} either side of 0: "
            f"seal {q.id} again with its answer."
        ]
    step, value = 10**-q.decimals, int(units) / 10**q.decimals
    low, high = value - step / 2, value + step / 2
    places = q.decimals + 1
    lines = [
        f"Answer: `{value:.{q.decimals}f}` (right when it rounds to it at {q.decimals} decimals: "
        f"{low:.{places}f} to {high:.{places}f}).",
        *([f"About: the notebook's figure `{q.measured}`."] if q.measured else []),
    ]
    return lines + _why(q, units)


def _personal_number_lines(q: Question, student_id: str | None, values: dict) -> list[str]:
    within = f"within {100 * q.tolerance:g} % of it (relative)" if q.tolerance else "exactly"
    lines = [f"Answer: `{q.expect}`, {within}.", *_param_lines(q)]
    if student_id:
        expected = evaluate(q.expect, values)
        margin = max(q.tolerance * abs(expected), 1e-9)  # the grader's own margin (judging)
        accepted = f"right from {expected - margin:.6g} to {expected + margin:.6g}" if q.tolerance else "exactly"
        lines.append(f"Student {student_id!r}: {_assignments(values)}, so `{expected:.6g}` ({accepted}).")
    return lines + _why(q, "", values)


def _property_lines(q: Question, student_id: str | None, values: dict) -> list[str]:
    fields = ", ".join(f'"{k}": {"whole number" if t == "int" else "number"}' for k, t in q.fields.items())
    lines = [
        f"Answer: a dict {{{fields}}} for which every rule holds; rules are checked in order and the first "
        "that fails gives its hint:"
    ]
    lines += [f"  {n}. `{rule.require}`: {rule.hint}" for n, rule in enumerate(q.rules, 1)]
    lines += _param_lines(q)
    if student_id:
        lines.append(f"Student {student_id!r}: {_assignments(values)}.")
    return lines + _why(q, "", values)


def _param_lines(q: Question) -> list[str]:
    """Each parameter's values, one picked per student from a hash of their id."""
    return [f"- `{name}`: one of {', '.join(map(_value, options))}" for name, options in q.params.items()]


def _why(q: Question, key: str, values: dict | None = None) -> list[str]:
    """The explanation a right answer unlocks: unsealed with the answer, or the bank's template."""
    text = unseal_text(q.id, key, q.explanation_sealed) if q.explanation_sealed else _fill(q.explanation, values or {})
    return [f"Why: {text}"] if text else []


def _fill(template: str, values: dict) -> str:
    """The text with this student's values; kept as written while a `{name}` has no value."""
    names = {name for _, name, _, _ in string.Formatter().parse(template) if name}
    return format_text(template, values) if values and names <= set(values) else template


def _assignments(values: dict) -> str:
    return ", ".join(f"{k} = {_value(v)}" for k, v in values.items())


def _value(v: object) -> str:
    return f"{v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _points(points: float) -> str:
    return f"{points:g} point{'s' if points != 1 else ''}"
