"""Write a graded batch out: the CSV, a feedback file per student, the instructor's report.

Used by `python -m helpers.quickcheck grade` (`grading.grade`). Every string that came from a
submission (its name, the student id, the notes) goes through `escaping`, so no file name or id
can crash a writer, break a row over two lines or inject a spreadsheet formula; a row or a
feedback file that still fails to be written is replaced or reported, never lost silently.
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from pathlib import Path
from statistics import median

from helpers.quickcheck.bank import Question
from helpers.quickcheck.escaping import csv_cell, md_code, shown, shown_path
from helpers.quickcheck.grades import LABELS, MISSING, UNREADABLE, GradeRun, SubmissionGrade
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG

__all__ = ["ATTEMPTS", "feedback_text", "report_text", "score_summary", "write_csv", "write_feedback"]

ATTEMPTS = (
    "Attempt counts come from the receipts `check()` printed in each notebook's outputs, and the "
    "student controls those outputs: a count can be edited, reset (a restarted runtime counts from 1 "
    "again; cleared outputs show none) or copied from another file. So a count proves nothing on its "
    "own: 1 does not show a first try and a blank does not show no try. Use it to start a "
    "conversation, never as evidence. Answers are not locked either: a choice question, or a number "
    "with few plausible values, can be found offline by trying every option against the bank's hash "
    "in about a millisecond; only the per-student questions (numbers that differ by student id) "
    "resist copying."
)


def write_csv(results: list[SubmissionGrade], questions: list[Question], path: Path) -> None:
    """One row per submission, whatever it holds: a row that fails to write is replaced by a plain one."""
    ids = [q.id for q in questions]
    header = ["file", "student_id", "status", *ids, "total", "max_points", *(f"attempts_{i}" for i in ids), "notes"]
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for s in results:
            try:
                writer.writerow(_row(s, ids))
            except (csv.Error, UnicodeError, ValueError) as e:  # should not happen: every cell is escaped
                failed = f"the grader could not write this row ({type(e).__name__}); see the report"
                writer.writerow(
                    [csv_cell(shown_path(s.path)), "", "unreadable", *[""] * len(ids), 0, "", *[""] * len(ids), failed]
                )


def write_feedback(results: list[SubmissionGrade], folder: Path) -> list[tuple[Path, str]]:
    """Write `<feedback_name>.txt` per submission; return the (submission, why) that could not be written."""
    folder.mkdir(parents=True, exist_ok=True)
    failed = []
    for s in results:
        try:
            (folder / f"{s.feedback_name}.txt").write_text(feedback_text(s), encoding="utf-8")
        except OSError as e:
            failed.append((s.path, e.strerror or type(e).__name__))
    return failed


def feedback_text(s: SubmissionGrade) -> str:
    """The feedback file for one submission, written for the student."""
    lines = [f"Quick checks: {shown_path(s.path.name)}"]
    if s.status == "unreadable":
        return "\n".join(lines + ["", f"This file could not be graded: {shown(s.reason, 600)}.", ""])
    lines += [
        f"Student id: {shown(s.student_id, 100) or '(none: set student_id in the notebook)'}",
        f"Score: {s.total:g} / {s.max_points:g}",
        "",
    ]
    for g in s.questions.values():
        lines.append(f"{g.question_id}: {LABELS[g.status]}, {g.points:g}/{g.max_points:g}")
        if g.why_not:
            lines.append("    " + "\n    ".join(shown(part, 2000) for part in g.why_not.split("\n")))
        if g.message:
            prefix = "Hint: " if g.status == WRONG else ""
            lines.append(f"    {prefix}" + "\n    ".join(shown(part, 2000) for part in g.message.split("\n")))
    notes = s.notes + [n for g in s.questions.values() for n in g.notes]
    if notes:
        lines += ["", "Notes:"] + [f"- {shown(n, 600)}" for n in notes]
    return "\n".join(lines) + "\n"


def report_text(run: GradeRun, questions: list[Question]) -> str:
    """The instructor's report: what could not be read, problems, ids, results per question, what attempts prove."""
    subs = run.submissions
    damaged = [s for s in subs if s.status == "damaged"]
    slowest = max(subs, key=lambda s: s.seconds, default=None)
    lines = [
        "# Quick-check grading report",
        "",
        f"{len(subs)} submissions in {run.seconds:.1f} s: {len(subs) - len(run.unreadable) - len(damaged)} read, "
        f"{len(damaged)} damaged but graded, {len(run.unreadable)} could not be read."
        + (f" The slowest file took {slowest.seconds:.2f} s ({md_code(slowest.path.name, 80)})." if slowest else ""),
        "",
    ]
    lines += _section("Could not read", [f"{md_code(s.path)}: {shown(s.reason, 400)}" for s in run.unreadable])
    lines += _section("Feedback not written", [f"{md_code(p)}: {shown(why)}" for p, why in run.unwritten])
    lines += _section("Read, with notes", [_notes_line(s) for s in subs if s.status != UNREADABLE and _notes_of(s)])
    lines += _section("Skipped in folders", [f"{md_code(p)}: {why}" for p, why in run.skipped])
    lines += _ids_section([s for s in subs if s.status != UNREADABLE])
    if questions and len(run.unreadable) < len(subs):
        lines += _scores_section([s for s in subs if s.status != UNREADABLE])
        lines += _questions_table([s for s in subs if s.status != UNREADABLE], questions)
        lines += ["## What attempt counts prove", "", ATTEMPTS, ""]
    return "\n".join(lines)


def _row(s: SubmissionGrade, ids: list[str]) -> list:
    if s.status == UNREADABLE:
        return [
            csv_cell(shown_path(s.path)),
            "",
            UNREADABLE,
            *[""] * len(ids),
            0,
            "",
            *[""] * len(ids),
            csv_cell(s.reason, 400),
        ]
    points = [_num(s.questions[i].points) if i in s.questions else "" for i in ids]
    attempts = [s.questions[i].attempts if i in s.questions and s.questions[i].attempts else "" for i in ids]
    problems = [
        f"{g.question_id} {LABELS[g.status]}"
        for g in s.questions.values()
        if g.status in (UNREADABLE, MISSING, INVALID, NEEDS_ID)
    ]
    notes = "; ".join(shown(n, 200) for n in s.notes[:2] + problems)
    return [
        csv_cell(shown_path(s.path)),
        csv_cell(s.student_id, 100),
        s.status,
        *points,
        _num(s.total),
        _num(s.max_points),
        *attempts,
        csv_cell(notes, 1000),
    ]


def _section(title: str, items: list[str]) -> list[str]:
    return [f"## {title} ({len(items)})", "", *(f"- {item}" for item in items), ""] if items else []


def _notes_of(s: SubmissionGrade) -> list[str]:
    return s.notes + [f"{g.question_id}: {n}" for g in s.questions.values() for n in g.notes]


def _notes_line(s: SubmissionGrade) -> str:
    notes = _notes_of(s)
    shown_notes = "; ".join(shown(n, 300) for n in notes[:10])
    more = f"; and {len(notes) - 10} more" if len(notes) > 10 else ""
    return f"{md_code(s.path)}: {shown_notes}{more}"


def _ids_section(readable: list[SubmissionGrade]) -> list[str]:
    no_id = [s for s in readable if not s.student_id]
    by_id = defaultdict(list)
    for s in readable:
        if s.student_id:
            by_id[s.student_id.casefold()].append(s)
    shared = {k: v for k, v in by_id.items() if len(v) > 1}
    if not (no_id or shared):
        return []
    lines = ["## Student ids", ""]
    if no_id:
        lines.append(f"- no student id ({len(no_id)}): " + ", ".join(md_code(s.path.name, 80) for s in no_id))
    for _, group in sorted(shared.items()):
        lines.append(
            f"- id {md_code(group[0].student_id, 100)} in {len(group)} submissions: "
            + ", ".join(md_code(s.path) for s in group)
        )
    return lines + [""]


def score_summary(results: list[SubmissionGrade]) -> str:
    """One line on the class's scores over the files that were read: mean, median, full marks, none."""
    graded = [s for s in results if s.status != UNREADABLE and s.max_points > 0]
    if not graded:
        return "no file could be graded"
    shares = sorted(s.total / s.max_points for s in graded)
    maxima = {s.max_points for s in graded}
    mean = f"{100 * sum(shares) / len(shares):.0f} %"
    if len(maxima) == 1:  # one notebook's questions for all: points read better than shares
        most = maxima.pop()
        middle = f"{_num(median(s.total for s in graded))} of {_num(most)}"
        mean = f"{sum(s.total for s in graded) / len(graded):.1f} of {_num(most)} points ({mean})"
    else:
        middle = f"{100 * median(shares):.0f} %"
    full, none = sum(x == 1 for x in shares), sum(x == 0 for x in shares)
    return f"{len(graded)} graded: mean {mean}, median {middle}; {full} with full marks, {none} with none"


def _scores_section(readable: list[SubmissionGrade]) -> list[str]:
    """The score line and how many files got each score (points / max), lowest first."""
    count = Counter((s.max_points, s.total) for s in readable if s.max_points > 0)
    rows = [f"| {_num(total)} / {_num(most)} | {n} |" for (most, total), n in sorted(count.items())]
    return ["## Scores", "", score_summary(readable) + ".", "", "| score | files |", "|---|---:|", *rows, ""]


def _common_wrong(q: Question, grades: list) -> str:
    """The wrong answers given most often ("c (41), d (12)"), for questions where everyone answers the same."""
    if q.personal or q.kind == "property":
        return "-"  # each student's right (and wrong) numbers differ: counting them says nothing
    wrong = Counter(g.answer for g in grades if g.status == WRONG and g.answer is not None)
    if q.kind == "number":  # the canonical form is scaled to the question's decimals: show the number
        return ", ".join(f"{int(a) / 10**q.decimals:g} ({n})" for a, n in wrong.most_common(3)) or "-"
    return ", ".join(f"{a} ({n})" for a, n in wrong.most_common(3)) or "-"


def _questions_table(readable: list[SubmissionGrade], questions: list[Question]) -> list[str]:
    lines = [
        "## Questions",
        "",
        "Most common wrong answers: what the class believed instead (choice questions and fixed numbers).",
        "",
        "| question | points | correct | not yet | not answered | other | mean attempts | most common wrong answers |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for q in questions:
        grades = [s.questions[q.id] for s in readable if q.id in s.questions]
        count = Counter(g.status for g in grades)
        attempts = [g.attempts for g in grades if g.attempts]
        mean = f"{sum(attempts) / len(attempts):.1f}" if attempts else "-"
        other = len(grades) - count[CORRECT] - count[WRONG] - count[UNANSWERED]
        lines.append(
            f"| {q.id} | {q.points:g} | {count[CORRECT]} | {count[WRONG]} | {count[UNANSWERED]} | {other} | {mean} "
            f"| {_common_wrong(q, grades)} |"
        )
    return lines + [""]


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)
