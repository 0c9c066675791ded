"""Write the graded batch as an LMS's own grade-import file: Canvas, Gradescope or Moodle.

Used by `python -m helpers.quickcheck grade ... --format canvas|gradescope|moodle --roster FILE`.
The roster (`roster`) gives each student's LMS ids; the file has one row per roster student, in
the roster's order, with the LMS's own columns:

    canvas      Student, ID, SIS User ID, SIS Login ID, Section, "<assignment>"; a second row
                "Points Possible" with the assignment's points. The total only: every further
                column would become an assignment of its own in Canvas.
    gradescope  the roster's name column(s), SID, Email, Total Score, Max Points, then one column
                of points per question (q04_1 ...).
    moodle      the roster's First name, Last name, ID number, Institution, Department, Email
                address (those it has), then "<assignment>" (the total) and one column per
                question; in Moodle's import preview, map "Email address" (or "ID number") to the
                user and each score column to a grade item, or ignore it.

A roster student with no submission gets a blank score, never 0: a 0 would record a grade the
student did not earn and overwrite one typed into the LMS by hand; the report lists them, to
enter 0 or an excuse in the LMS. A submission whose id is not on the roster cannot be given an
LMS id, so it has no row here: the report lists it with its file and score, as it does files
with no id. Every cell is escaped (`escaping.csv_cell`); the file is written whole or not at all.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from helpers.quickcheck.bank import Question
from helpers.quickcheck.escaping import csv_cell, md_code, shown
from helpers.quickcheck.roster import Roster, RosterCheck

__all__ = ["CANVAS_IDS", "FORMATS", "MOODLE_IDS", "default_assignment", "lms_rows", "roster_section", "write_lms"]

FORMATS = ("csv", "canvas", "gradescope", "moodle")
CANVAS_IDS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDS = ["First name", "Last name", "ID number", "Institution", "Department", "Email address"]


def default_assignment(questions: list[Question]) -> str:
    """ "Quick checks 04" (or "Quick checks 00-02"): the name the score column gets without --assignment."""
    nbs = sorted({q.id[1:3] for q in questions})
    return "Quick checks " + (nbs[0] if len(nbs) == 1 else f"{nbs[0]}-{nbs[-1]}" if nbs else "")


def lms_rows(check: RosterCheck, roster: Roster, questions: list[Question], assignment: str) -> list[list]:
    """The header and rows of `roster.fmt`'s import file (strings escaped, numbers as numbers)."""
    graded = {id(student): s for student, s in check.matched}
    max_points = _num(sum(q.points for q in questions))
    ids = [q.id for q in questions]
    name_cols = _name_columns(roster)
    if roster.fmt == "canvas":
        rows = [[*CANVAS_IDS, assignment], ["Points Possible", "", "", "", "", max_points]]
        for student in roster.students:
            s = graded.get(id(student))
            rows.append([*(roster.get(student, c) for c in CANVAS_IDS), _num(s.total) if s else ""])
    elif roster.fmt == "gradescope":
        rows = [[*name_cols, "SID", "Email", "Total Score", "Max Points", *ids]]
        for student in roster.students:
            s = graded.get(id(student))
            scores = [_num(s.total), max_points, *_points(s, ids)] if s else ["", max_points, *[""] * len(ids)]
            rows.append([*(roster.get(student, c) for c in [*name_cols, "SID", "Email"]), *scores])
    else:
        id_cols = [c for c in MOODLE_IDS if roster.has(c)]
        if roster.key.casefold() not in {c.casefold() for c in id_cols}:
            id_cols.append(roster.key)
        rows = [[*id_cols, assignment, *(f"{assignment}: {i}" for i in ids)]]
        for student in roster.students:
            s = graded.get(id(student))
            scores = [_num(s.total), *_points(s, ids)] if s else [""] * (1 + len(ids))
            rows.append([*(roster.get(student, c) for c in id_cols), *scores])
    return [[c if isinstance(c, (int, float)) else csv_cell(c, 300) for c in row] for row in rows]


def write_lms(rows: list[list], path: Path) -> None:
    """Write the rows to `path` whole: to a temporary file beside it, then renamed over it."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows(rows)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def roster_section(check: RosterCheck | None, roster: Roster | None) -> list[str]:
    """The report's "Roster" section: who has no submission, which ids are not on the roster."""
    if check is None or roster is None:
        return []
    key = shown(roster.key, 60)
    lines = [
        "## Roster",
        "",
        f"{len(roster.students)} students on {md_code(roster.path.name, 100)}, matched on {key}: "
        f"{len(check.matched)} with a submission, {len(check.missing)} without, "
        f"{len(check.unknown)} submission(s) with an id not on the roster, {len(check.no_id)} with no id.",
        "",
    ]
    who = _who(roster)
    lines += _items("No submission (blank in the import file: enter 0 or an excuse in the LMS)", check.missing, who)
    lines += _items(
        "Id not on the roster (not in the import file: fix the student_id or the roster, or enter by hand)",
        check.unknown,
        lambda s: f"{md_code(s.student_id, 100)} in {md_code(s.path)}: {_num(s.total)}/{_num(s.max_points)}",
    )
    lines += _items(
        "No student id or unreadable (not in the import file)",
        check.no_id,
        lambda s: f"{md_code(s.path)}: {s.status}",
    )
    lines += _items(
        "Several submissions for one student (the highest total was written)",
        check.repeated,
        lambda pair: f"{who(pair[0])}: " + ", ".join(f"{md_code(s.path)} {_num(s.total)}" for s in pair[1]),
    )
    lines += _items(f"On the roster with no {key} (cannot be matched)", roster.unkeyed, who)
    return lines


def _items(title: str, items: list, fmt) -> list[str]:
    return [f"### {title} ({len(items)})", "", *(f"- {fmt(x)}" for x in items), ""] if items else []


def _who(roster: Roster):
    names = _name_columns(roster)

    def who(student: dict) -> str:
        name = " ".join(roster.get(student, c) for c in names).strip()
        return f"{shown(name, 100)} ({md_code(roster.get(student, roster.key), 100)})"

    return who


def _name_columns(roster: Roster) -> list[str]:
    for cols in (["Student"], ["Name"], ["Full Name"], ["First Name", "Last Name"]):
        if all(roster.has(c) for c in cols):
            return [roster.columns[c.casefold()] for c in cols]
    return []


def _points(s, ids: list[str]) -> list:
    return [_num(s.questions[i].points) if i in s.questions else "" for i in ids]


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)
