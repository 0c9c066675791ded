"""`check()` and `ask()`: the quick checks at the end of every notebook (00 ... 08).

A quick-check cell looks like this (the first line marks it for people and for the grader):

    # QUICK CHECK q04_2
    answer_q04_2 = None  # one letter in quotes
    check("q04_2", answer_q04_2)

`check` prints the question, then at once: "not answered yet", the explanation, or, for a wrong
answer, the picked option's own feedback ("You picked c: ...", choice questions) and a hint, and a
receipt line (question, attempt, result) that stays in the notebook file the student hands in.
It never prints the expected answer, and it never raises for an answer, whatever it is (an
array, a 400-digit int, a megabyte of text): it prints a verdict. Only an unknown question id
raises, naming the notebook's real ids.
`ask` shows the same multiple-choice question as clickable buttons where widgets render (Colab,
Jupyter); it is for practice, and says so: the grade comes from the cell's `answer_...` line.
"""

from __future__ import annotations

import html
import importlib.util
import os
from typing import Any

from helpers._util import headless, ipython_shell
from helpers.quickcheck import reading
from helpers.quickcheck.answers import answer_format
from helpers.quickcheck.bank import Question, format_text, get_question, normalize_student_id, params_for
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, Verdict, format_receipt, judge

__all__ = ["ask", "check"]

# the distinct answers tried per question in this kernel: an attempt is a new answer, not a re-run
_tried: dict[tuple[str, str], list[str]] = {}


def check(question_id: str, answer: Any, student_id: Any = None) -> None:
    """Check an answer to a quick-check question and print the feedback and a receipt.

    Args:
        question_id: the question, e.g. "q04_2" (its cell's `# QUICK CHECK` line names it).
        answer: the student's answer; None means not answered yet (no attempt is counted).
        student_id: needed by questions that give each student their own numbers.

    Example:
        >>> check("q04_2", None)  # doctest: +ELLIPSIS
        Quick check q04_2 ...
    """
    q = get_question(question_id)  # a wrong id is the notebook's mistake: it raises, naming the real ids
    try:
        lines = _check_lines(q, answer, student_id)
    except Exception as e:  # whatever the answer is, the student gets a verdict, never a traceback
        lines = [
            _describe_question(q),
            "",
            f"? Can't check this answer: {q.variable} could not be read ({type(e).__name__}); "
            f"write {answer_format(q)}.",
        ]
    print("\n".join(lines))


def _check_lines(q: Question, answer: Any, student_id: Any) -> list[str]:
    verdict = judge(q, answer, student_id)
    attempt = _record_attempt(verdict, student_id)
    lines = [_describe_question(q, student_id), "", _feedback_line(verdict)]
    if verdict.counts_as_attempt:
        lines.append(format_receipt(verdict, attempt))
    try:
        lines += [f"Note: {w}" for w in _grader_view_warnings(q, answer, verdict, student_id)]
    except Exception as e:  # the notes are advice: failing to give them must not hide the verdict
        lines.append(f"Note: could not compare with what the grader will read ({type(e).__name__}).")
    return lines


def ask(question_id: str, *, student_id: Any = None, widget: bool | None = None) -> None:
    """Show a multiple-choice question as buttons (practice); print it as text where widgets can't render.

    Put it above the question's answer cell. Clicking Check gives the same instant feedback as
    `check`, but only the `answer_...` line in the cell is graded, and the widget says so.

    Args:
        widget: True or False forces the choice; None uses widgets in Colab and Jupyter, not on
            Kaggle (whose front end may not render them) and not outside a notebook.

    Example:
        >>> ask("q04_2")  # doctest: +SKIP
    """
    q = get_question(question_id)
    use_widget = _widgets_available() if widget is None else widget
    if q.kind != "choice" or not use_widget:
        print(_describe_question(q, student_id))
        print(f'\nAnswer in the cell: {q.variable} = ..., then check("{q.id}", {q.variable}).')
        return
    from IPython.display import display

    display(_choice_widget(q))


def _describe_question(q: Question, student_id: Any = None) -> str:
    """The question as text: header, prompt with this student's numbers, choices, how to answer."""
    points = f"{q.points:g} point{'s' if q.points != 1 else ''}"
    lines = [f"Quick check {q.id} ({points})"]
    if q.personal and not normalize_student_id(student_id):
        lines.append(format_text(q.prompt, {name: "…" for name in q.params}))  # the numbers need the id
    else:
        lines.append(format_text(q.prompt, params_for(q, student_id) if q.personal else {}))
    lines += [f"  {k}) {text}" for k, text in q.choices.items()]
    return "\n".join(lines)


def _feedback_line(verdict: Verdict) -> str:
    if verdict.status == CORRECT:
        return f"✓ Correct. {verdict.message}"
    if verdict.status in (UNANSWERED, NEEDS_ID):
        return verdict.message
    if verdict.status == INVALID:
        return f"? Can't check this answer: {verdict.message}."
    why_not = f"{verdict.why_not}\n" if verdict.why_not else ""
    return f"✗ Not yet. {why_not}Hint: {verdict.message}"


def _record_attempt(verdict: Verdict, student_id: Any = None) -> int:
    """Count a new answer to this question in this kernel; return how many different answers were tried.

    Running the cell again with the same answer is not a new attempt; a restarted runtime starts at 0.
    """
    tried = _tried.setdefault((verdict.question_id, normalize_student_id(student_id)), [])
    if verdict.counts_as_attempt and verdict.canonical not in tried:
        tried.append(verdict.canonical)
    return len(tried)


def _grader_view_warnings(q: Question, answer: Any, verdict: Verdict, student_id: Any) -> list[str]:
    """Warn when the grader, reading this notebook's text, would see a different answer or id.

    Inside IPython the text is the cells run so far (`In`); elsewhere there is nothing to compare.
    """
    history = _input_history()
    if history is None or verdict.status == UNANSWERED:
        return []
    found = reading.scan([reading.Cell(i, text) for i, text in enumerate(history, 1)])
    if not found.complete:  # the history is past the reader's limits: no warning rather than a wrong one
        return []
    warnings = []
    seen = reading.find_answer(found, q.id)
    if seen.value is reading.MISSING:
        warnings.append(
            f"the grader reads answers from the notebook's text and will not find this one "
            f"({seen.problem}). Keep your answer in the line `{q.variable} = ...`."
        )
    elif verdict.canonical is not None:
        graded = judge(q, seen.value, student_id)
        if graded.canonical != verdict.canonical:
            warnings.append(
                f"the {q.variable} line in your notebook's text differs from the answer just checked; "
                "the grader reads the text: run the cell that sets it again."
            )
    if q.personal and verdict.status != NEEDS_ID:
        written, _ = reading.find_student_id(found)
        if normalize_student_id(written) != normalize_student_id(student_id):
            warnings.append(
                'the grader reads your id from the line `student_id = "..."`, and it holds a '
                "different one: write your id there, in quotes, and run that cell."
            )
    return warnings


def _widgets_available() -> bool:
    """True in a notebook front end that renders ipywidgets (Colab, Jupyter); False on Kaggle or headless."""
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or headless() or importlib.util.find_spec("ipywidgets") is None:
        return False
    shell = ipython_shell()
    return shell is not None and type(shell).__name__ in ("ZMQInteractiveShell", "Shell")  # Shell: Colab's


def _choice_widget(q: Question):
    """The ipywidgets UI for one choice question: choices, a Check button, and the feedback."""
    import ipywidgets as w

    options = [(f"{k}) {text}", k) for k, text in q.choices.items()]
    if q.multiple:
        boxes = [w.Checkbox(description=label, value=False, indent=False) for label, _ in options]
        picker = w.VBox(boxes)

        def selected():
            return "".join(k for box, (_, k) in zip(boxes, options) if box.value) or None
    else:
        picker = w.RadioButtons(options=options, value=None, layout=w.Layout(width="max-content"))

        def selected():
            return picker.value

    button = w.Button(description="Check", button_style="primary")
    feedback = w.HTML()

    def on_click(_):
        verdict = judge(q, selected())
        attempt = _record_attempt(verdict)
        text = _feedback_line(verdict)
        if verdict.counts_as_attempt:
            text += f"\n{format_receipt(verdict, attempt)}"
        text += (
            f"\nPractice only: to hand it in, write your letter{'s' if q.multiple else ''} in "
            f"{q.variable} = ... in the next cell and run it."
        )
        feedback.value = f"<pre style='white-space: pre-wrap'>{html.escape(text)}</pre>"

    button.on_click(on_click)
    header = w.HTML(f"<b>Quick check {q.id}</b><br>{html.escape(q.prompt)}")
    return w.VBox([header, picker, button, feedback])


def _input_history() -> list[str] | None:
    shell = ipython_shell()
    history = getattr(shell, "user_ns", {}).get("In") if shell is not None else None
    return [h for h in history if isinstance(h, str)] if isinstance(history, list) else None
