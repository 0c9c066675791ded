"""A graded batch as text: the CSV, a feedback file per submission, the instructor's report.

Used by `python -m helpers.quickcheck grade` (`grading.grade`, which writes them through
`writing`). Every string that came from a submission or a roster (a file name, a student id, a
name, the notes) goes through `escaping`, so no file name or id can crash a writer, break a row
over two lines, inject a spreadsheet formula or put HTML or a link in the report (a table cell
through `escaping.md_cell`, so no "|" splits it); a row that still fails to be written is replaced
by a plain one, never lost silently.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from statistics import median

from helpers.quickcheck.bank import Question
from helpers.quickcheck.escaping import csv_cell, md_cell, md_code, md_text, shown, shown_path
from helpers.quickcheck.grades import (
    LABELS,
    MISSING,
    NOT_GRADED,
    UNREADABLE,
    GradeRun,
    SubmissionGrade,
    by_student,
    id_key,
)
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG
from helpers.quickcheck.near_ids import NEAR_IDS_ADVICE, near_duplicates

__all__ = ["ATTEMPTS", "course_basis", "csv_text", "feedback_text", "report_text", "score_summary"]

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


def csv_text(results: list[SubmissionGrade], questions: list[Question]) -> str:
    """One row per submission, whatever it holds: a row that fails to be made is replaced by a plain one."""
    ids = [q.id for q in questions]
    attempts = [f"attempts_{i}" for i in ids]
    header = ["file", "student_id", "status", "notebook", *ids, "total", "max_points", *attempts, "notes"]
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(header)
    for s in results:
        try:
            writer.writerow(_row(s, ids))
        except (csv.Error, UnicodeError, ValueError) as e:  # should not happen: every cell is escaped
            failed = f"the grader could not write this row ({type(e).__name__}); see the report"
            writer.writerow(
                [csv_cell(shown_path(s.path)), "", UNREADABLE, "", *[""] * len(ids), 0, "", *[""] * len(ids), failed]
            )
    return out.getvalue()


def feedback_text(s: SubmissionGrade) -> str:
    """The feedback file for one submission, written for the student."""
    lines = [f"Quick checks: {shown_path(s.path.name)}"]
    if s.status in (UNREADABLE, NOT_GRADED):
        return "\n".join(lines + ["", f"This file was not graded: {shown(s.reason, 600)}.", ""])
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
    """The instructor's report: unreadable files, problems, ids, the course, each question, what attempts prove."""
    subs = run.submissions
    damaged = [s for s in subs if s.status == "damaged"]
    slowest = max(subs, key=lambda s: s.seconds, default=None)
    readable = [s for s in subs if s.status not in (UNREADABLE, NOT_GRADED)]
    aside = len(subs) - len(readable) - len(run.unreadable)
    lines = [
        "# Quick-check grading report",
        "",
        f"{len(subs)} submissions in {run.seconds:.1f} s: {len(readable) - len(damaged)} read, "
        f"{len(damaged)} damaged but graded, {len(run.unreadable)} could not be read"
        + (f", {aside} not handed out (not graded)." if aside else ".")
        + (f" The slowest file took {slowest.seconds:.2f} s ({md_code(slowest.path.name, 80)})." if slowest else ""),
        "",
    ]
    lines += _section("Could not read", [f"{md_code(s.path)}: {md_text(s.reason, 400)}" for s in run.unreadable])
    lines += run.strays.section(run.notebooks) if run.strays else []
    lines += _section("Feedback not written", [f"{md_code(p)}: {md_text(why)}" for p, why in run.unwritten])
    lines += _section(
        "Questions from other notebooks (reported, not scored)",
        [
            f"{md_code(s.path)}, graded as notebook {s.notebook or '(none)'}: "
            + ", ".join(md_code(q, 40) for q in s.foreign[:10])
            + (f" and {len(s.foreign) - 10:,} more" if len(s.foreign) > 10 else "")
            for s in readable
            if s.foreign
        ],
    )
    lines += _section("Read, with notes", [_notes_line(s) for s in readable if _notes_of(s)])
    lines += _section("Skipped in folders", [f"{md_code(p)}: {md_text(why)}" for p, why in run.skipped])
    lines += _ids_section(readable)
    if run.roster_check is None:  # with a roster, an id that matches no one is listed in its Roster section
        lines += _near_ids_section(readable)
    if len(run.notebooks) > 1:
        lines += _course_section(readable, run.notebooks, run.issued)
    if questions and readable:
        lines += _scores_section(readable, run.issued)
        lines += _questions_table(readable, questions)
        lines += ["## What attempt counts prove", "", ATTEMPTS, ""]
    return "\n".join(lines)


def course_basis(notebooks: list[str], issued: list[str] | None) -> str:
    """How a course batch's totals are counted, for the report and the terminal."""
    if issued:
        return f"each student's total is the sum over notebooks {', '.join(issued)}, out of all of them"
    return (
        f"each student's total is the sum over the notebooks they submitted for, out of those notebooks' "
        f"points (notebooks {', '.join(notebooks)} were submitted; name the ones you handed out with "
        "--notebook NN ... to count a missing one as 0)"
    )


def _course_section(readable: list[SubmissionGrade], notebooks: list[str], issued: list[str] | None) -> list[str]:
    """Files per notebook, and each student's points per notebook and in all."""
    students = by_student(readable)
    lines = [
        "## Course",
        "",
        f"Graded as a course of {len(notebooks)} notebooks: {course_basis(notebooks, issued)}.",
        "",
        "| student | " + " | ".join(map(md_cell, notebooks)) + " | total |",
        "|---|" + "---:|" * (len(notebooks) + 1),
    ]
    for st in students:
        best = st.best
        cells = [f"{_num(best[nb].total)}/{_num(best[nb].max_points)}" if nb in best else "-" for nb in notebooks]
        lines.append(
            f"| {md_cell(st.student_id, 100, code=True)} | "
            + " | ".join(cells)
            + f" | {_num(st.total)}/{_num(st.max_points(issued))} |"
        )
    return lines + [""]


def _row(s: SubmissionGrade, ids: list[str]) -> list:
    if s.status in (UNREADABLE, NOT_GRADED):
        return [
            csv_cell(shown_path(s.path)),
            csv_cell(s.student_id, 100),
            s.status,
            "",
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
        s.notebook,
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
    shown_notes = "; ".join(md_text(n, 300) for n in notes[:10])
    more = f"; and {len(notes) - 10} more" if len(notes) > 10 else ""
    return f"{md_code(s.path)}: {shown_notes}{more}"


def _ids_section(readable: list[SubmissionGrade]) -> list[str]:
    """Files with no id, and ids on several files for one notebook (one student's resubmission, or a copy)."""
    no_id = [s for s in readable if not id_key(s.student_id)]
    by_id = defaultdict(list)
    for s in readable:
        if id_key(s.student_id):
            by_id[(id_key(s.student_id), s.notebook)].append(s)
    shared = {k: v for k, v in by_id.items() if len(v) > 1}
    if not (no_id or shared):
        return []
    lines = ["## Student ids", ""]
    if no_id:
        lines.append(f"- no student id ({len(no_id)}): " + ", ".join(md_code(s.path.name, 80) for s in no_id))
    for (_, notebook), group in sorted(shared.items()):
        lines.append(
            f"- id {md_code(group[0].student_id, 100)} in {len(group)} submissions"
            + (f" of notebook {notebook}" if notebook else "")
            + " (the highest total counts): "
            + ", ".join(md_code(s.path) for s in group)
        )
    return lines + [""]


def _near_ids_section(readable: list[SubmissionGrade]) -> list[str]:
    """Ids that differ only by case, zero padding or separators (C03, C003, c-03): one student, or two?"""
    groups = near_duplicates(readable)
    if not groups:
        return []
    lines = [f"## Near-duplicate student ids ({len(groups)})", "", f"These ids read alike: {NEAR_IDS_ADVICE}.", ""]
    for group in groups:
        students = []
        for written, (_, subs) in zip(group.written(), group.spellings):
            files = ", ".join(f"{md_code(s.path)} (notebook {s.notebook or '-'})" for s in subs)
            students.append(f"{md_code(written, 200)} in {files}")
        lines.append(f"- {len(students)} students: " + "; ".join(students))
    return lines + [""]


def score_summary(results: list[SubmissionGrade], issued: list[str] | None = None) -> str:
    """One line on the class's scores, per student (summed over their notebooks): mean, median, full marks, none.

    A read file with no student id counts as a student of its own.
    """
    readable = [s for s in results if s.status != UNREADABLE and s.notebook]
    scores = [(st.total, st.max_points(issued)) for st in by_student(readable)]
    scores += [(s.total, s.max_points) for s in readable if not id_key(s.student_id)]
    scores = [(total, most) for total, most in scores if most > 0]
    if not scores:
        return "no file could be graded"
    shares = sorted(total / most for total, most in scores)
    maxima = {most for _, most in scores}
    mean = f"{100 * sum(shares) / len(shares):.0f} %"
    if len(maxima) == 1:  # one maximum for all: points read better than shares
        most = maxima.pop()
        middle = f"{_num(median(total for total, _ in scores))} of {_num(most)}"
        mean = f"{sum(total for total, _ in scores) / len(scores):.1f} of {_num(most)} points ({mean})"
    else:
        middle = f"{100 * median(shares):.0f} %"
    full, none = sum(x == 1 for x in shares), sum(x == 0 for x in shares)
    n = len(scores)
    return (
        f"{n} student{'s' if n != 1 else ''} graded: mean {mean}, median {middle}; "
        f"{full} with full marks, {none} with none"
    )


def _scores_section(readable: list[SubmissionGrade], issued: list[str] | None) -> list[str]:
    """The score line, and how many files got each score (points / max), lowest first."""
    count = Counter((s.max_points, s.total) for s in readable if s.max_points > 0)
    rows = [f"| {_num(total)} / {_num(most)} | {n} |" for (most, total), n in sorted(count.items())]
    head = ["## Scores", "", score_summary(readable, issued) + ".", ""]
    return head + ["Per file:", "", "| score | files |", "|---|---:|", *rows, ""]


def _common_wrong(q: Question, grades: list) -> str:
    """The wrong answers given most often ("c (41), d (12)"), for questions where everyone answers the same;
    each answer a table cell's text (`md_cell`)."""
    if q.personal or q.kind == "property":
        return "-"  # each student's right (and wrong) numbers differ: counting them says nothing
    wrong = Counter(g.answer for g in grades if g.status == WRONG and g.answer is not None)
    if q.kind == "number":  # the canonical form is scaled to the question's decimals: show the number
        return ", ".join(f"{md_cell(f'{int(a) / 10**q.decimals:g}')} ({n})" for a, n in wrong.most_common(3)) or "-"
    return ", ".join(f"{md_cell(a)} ({n})" for a, n in wrong.most_common(3)) or "-"


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
            f"| {md_cell(q.id)} | {q.points:g} | {count[CORRECT]} | {count[WRONG]} | {count[UNANSWERED]} | {other} "
            f"| {mean} | {_common_wrong(q, grades)} |"
        )
    return lines + [""]


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)
