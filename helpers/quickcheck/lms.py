"""Write the graded batch as an LMS's own grade-import file: Canvas, Gradescope or Moodle.

Used by `python -m helpers.quickcheck grade ... --format canvas|gradescope|moodle --roster FILE`.
The roster (`roster`) gives each student's LMS ids; the file has one row per roster student, in
the roster's order, with the LMS's own columns. A batch of several notebooks (a course) is graded
per student, each notebook counted once, by its best submission (`grades.by_student`):

    canvas      Student, ID, SIS User ID, SIS Login ID, Section, then one column per notebook
                ("Quick checks 03"; each becomes, or fills, one Canvas assignment); a second row
                "Points Possible" with each notebook's points. No per-question columns: each
                would become an assignment of its own in Canvas.
    gradescope  the roster's name column(s), SID, Email, Total Score, Max Points, then one column
                of points per question (q04_1 ...). Total Score is the sum over the notebooks;
                Max Points is the issued notebooks' points (`--notebook`), else those of the
                notebooks the student submitted for (the report says which).
    moodle      the roster's First name, Last name, ID number, Institution, Department, Email
                address (those it has), then per notebook "<assignment>" (its total) and one
                column per question; in Moodle's import preview, map "Email address" (or "ID
                number") to the user and each score column to a grade item, or ignore it.

A roster student with no submission gets a blank score, never 0: a 0 would record a grade the
student did not earn and overwrite one typed into the LMS by hand; the report lists them, to
enter 0 or an excuse in the LMS. A submission whose id is not on the roster cannot be given an
LMS id, so it has no row here: the report lists it with its file and score, as it does files
with no id. Every cell is escaped (`escaping.csv_cell`); `writing` writes the file whole or not at all.
"""

from __future__ import annotations

import csv
import io
import re

from helpers.quickcheck.bank import bank_notebooks, load_bank
from helpers.quickcheck.escaping import csv_cell, md_code, md_text, shown
from helpers.quickcheck.roster import Roster, RosterCheck

__all__ = [
    "CANVAS_IDS",
    "FORMATS",
    "MOODLE_IDS",
    "assignment_names",
    "default_assignment",
    "lms_rows",
    "lms_text",
    "roster_section",
]

FORMATS = ("csv", "canvas", "gradescope", "moodle")
CANVAS_IDS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDS = ["First name", "Last name", "ID number", "Institution", "Department", "Email address"]
_PER_NOTEBOOK = re.compile(r"(\d\d)=(.*)", re.S)


def default_assignment(notebook: str) -> str:
    """ "Quick checks 04": the name a notebook's score column gets without --assignment."""
    return f"Quick checks {notebook}"


def assignment_names(notebooks: list[str], assignment: str | list[str] | None) -> dict[str, str]:
    """The score column's name per notebook: `assignment` is one NAME for a batch of one notebook, or
    "NN=NAME" per notebook (the others keep `default_assignment`). ValueError naming the fix otherwise."""
    given = [assignment] if isinstance(assignment, str) else list(assignment or [])
    names = {nb: default_assignment(nb) for nb in notebooks}
    for value in given:
        per = _PER_NOTEBOOK.fullmatch(value) if value[:2] in bank_notebooks() else None
        notebook, name = (per.group(1), per.group(2)) if per else (None, value)
        if notebook is None and len(notebooks) != 1:
            example = " ".join(f"--assignment '{nb}=Quick checks {nb}'" for nb in notebooks[:2])
            raise ValueError(
                f"--assignment {shown(value, 100)!r} names one column, but this batch grades notebooks "
                f"{', '.join(notebooks)}: name each notebook's column, e.g. {example}"
            )
        notebook = notebook or notebooks[0]
        if notebook not in names:
            raise ValueError(
                f"--assignment {shown(value, 100)!r} names notebook {notebook}'s column, but this batch grades "
                f"{', '.join(notebooks) or 'no notebook'}: add --notebook {notebook}, or drop it"
            )
        if not name.strip() or any(c in name for c in "\r\n"):
            raise ValueError(
                f"--assignment {shown(value, 100)!r}: a column name must be one line of text, e.g. "
                f"--assignment 'Quick checks {notebook}'"
            )
        names[notebook] = name.strip()
    repeated = [n for n in names.values() if list(names.values()).count(n) > 1]
    if repeated:
        raise ValueError(f"--assignment gives two notebooks the column {shown(repeated[0], 100)!r}: name them apart")
    return names


def lms_rows(
    check: RosterCheck, roster: Roster, notebooks: list[str], issued: list[str] | None, columns: dict[str, str]
) -> list[list]:
    """The header and rows of `roster.fmt`'s import file (strings escaped, numbers as numbers)."""
    graded = {id(student): st for student, st in check.matched}
    points = {nb: _num(sum(q.points for q in load_bank(nb))) for nb in notebooks}
    ids = {nb: [q.id for q in load_bank(nb)] for nb in notebooks}
    name_cols = _name_columns(roster)
    if roster.fmt == "canvas":
        rows = [[*CANVAS_IDS, *columns.values()], ["Points Possible", "", "", "", "", *points.values()]]
        for student in roster.students:
            best = graded[id(student)].best if id(student) in graded else {}
            scores = [_num(best[nb].total) if nb in best else "" for nb in notebooks]
            rows.append([*(roster.get(student, c) for c in CANVAS_IDS), *scores])
    elif roster.fmt == "gradescope":
        all_ids = [q for nb in notebooks for q in ids[nb]]
        rows = [[*name_cols, "SID", "Email", "Total Score", "Max Points", *all_ids]]
        for student in roster.students:
            st = graded.get(id(student))
            if st:
                scores = [_num(st.total), _num(st.max_points(issued)), *_points(st.best, all_ids)]
            else:
                scores = ["", _num(sum(points.values())), *[""] * len(all_ids)]
            rows.append([*(roster.get(student, c) for c in [*name_cols, "SID", "Email"]), *scores])
    else:
        id_cols = [c for c in MOODLE_IDS if roster.has(c)]
        if roster.key.casefold() not in {c.casefold() for c in id_cols}:
            id_cols.append(roster.key)
        header = [*id_cols]
        for nb in notebooks:
            header += [columns[nb], *(f"{columns[nb]}: {i}" for i in ids[nb])]
        rows = [header]
        for student in roster.students:
            best = graded[id(student)].best if id(student) in graded else {}
            scores = []
            for nb in notebooks:
                s = best.get(nb)
                scores += [_num(s.total), *_points({nb: s}, ids[nb])] if s else [""] * (1 + len(ids[nb]))
            rows.append([*(roster.get(student, c) for c in id_cols), *scores])
    return [[c if isinstance(c, (int, float)) else csv_cell(c, 300) for c in row] for row in rows]


def lms_text(rows: list[list]) -> str:
    """The rows as CSV text."""
    out = io.StringIO(newline="")
    csv.writer(out).writerows(rows)
    return out.getvalue()


def roster_section(check: RosterCheck | None, roster: Roster | None) -> list[str]:
    """The report's "Roster" section: who has no submission, which ids are not on the roster."""
    if check is None or roster is None:
        return []
    key = md_text(roster.key, 60)
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
        lambda s: (
            f"{md_code(s.student_id, 100)} in {md_code(s.path)}: {_num(s.total)}/{_num(s.max_points)}"
            + (f" (notebook {s.notebook})" if s.notebook else "")
        ),
    )
    lines += _items(
        "No student id or unreadable (not in the import file)",
        check.no_id,
        lambda s: f"{md_code(s.path)}: {s.status}",
    )
    lines += _items(
        "Several submissions for one student and notebook (the highest total was written)",
        check.repeated,
        lambda r: f"{who(r[0])}, notebook {r[1]}: " + ", ".join(f"{md_code(s.path)} {_num(s.total)}" for s in r[2]),
    )
    lines += _items(f"On the roster with no {key} (cannot be matched)", roster.unkeyed, who)
    return lines


def _items(title: str, items: list, fmt) -> list[str]:
    return [f"### {title} ({len(items)})", "", *(f"- {fmt(x)}" for x in items), ""] if items else []


def _who(roster: Roster):
    names = _name_columns(roster)

    def who(student: dict) -> str:
        name = " ".join(roster.get(student, c) for c in names).strip()
        return f"{md_text(name, 100)} ({md_code(roster.get(student, roster.key), 100)})"

    return who


def _name_columns(roster: Roster) -> list[str]:
    for cols in (["Student"], ["Name"], ["Full Name"], ["First Name", "Last Name"]):
        if all(roster.has(c) for c in cols):
            return [roster.columns[c.casefold()] for c in cols]
    return []


def _points(best: dict, ids: list[str]) -> list:
    """Each question's points from the submission of its notebook, "" where there is none."""
    got = {qid: g.points for s in best.values() for qid, g in s.questions.items()}
    return [_num(got[i]) if i in got else "" for i in ids]


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)
