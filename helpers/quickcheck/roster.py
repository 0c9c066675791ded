"""An LMS's list of students, read and matched against the graded submissions.

Used by `python -m helpers.quickcheck grade ... --format canvas|gradescope|moodle --roster FILE`
(see `lms` for the files written). The roster is the LMS's own export of its students: Canvas's
exported gradebook (Student, ID, SIS User ID, SIS Login ID, Section), Gradescope's roster (Name or
First Name/Last Name, Email, SID) or Moodle's grade export (First name, Last name, ID number,
Email address). A notebook's `student_id` is matched, ignoring case and surrounding spaces,
against one column of it: `--roster-key COLUMN`, by default the one named in `DEFAULT_KEYS`.

The roster is data too: it is read within bounds (10 MiB, 50 000 rows), its names and ids leave
the grader only through `escaping`, and a roster that cannot be used (no such column, an id given
to two students, not UTF-8) is refused with the fix before anything is graded or written.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from helpers.quickcheck.escaping import shown, shown_path
from helpers.quickcheck.grades import UNREADABLE, SubmissionGrade

__all__ = [
    "DEFAULT_KEYS",
    "MAX_ROSTER_BYTES",
    "MAX_ROSTER_ROWS",
    "REQUIRED",
    "Roster",
    "RosterCheck",
    "RosterError",
    "match_roster",
    "read_roster",
]

MAX_ROSTER_BYTES = 10 * 1024 * 1024
MAX_ROSTER_ROWS = 50_000

# the columns each LMS's import needs from its roster; a tuple is "one of these"
REQUIRED = {
    "canvas": ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"],
    "gradescope": ["Email", ("Name", "Full Name", "First Name")],
    "moodle": ["Email address"],
    "csv": [],
}
DEFAULT_KEYS = {"canvas": "SIS Login ID", "gradescope": "SID", "moodle": "ID number", "csv": "student_id"}
_HOW_TO_EXPORT = {
    "canvas": "in Canvas, Grades > Export > Export Entire Gradebook",
    "gradescope": "in Gradescope, Roster > Download Roster",
    "moodle": "in Moodle, Grades > Export > Plain text file",
    "csv": "any CSV with a header row",
}


class RosterError(ValueError):
    """A roster that cannot be used; the message says what to change."""


@dataclass
class Roster:
    path: Path
    fmt: str
    key: str  # the key column, spelled as in the file
    header: list[str]  # the header row as in the file
    columns: dict[str, str]  # canonical name (casefolded) -> the header as spelled in the file
    students: list[dict[str, str]]  # one dict per student row, by the file's headers
    unkeyed: list[dict[str, str]] = field(default_factory=list)  # rows whose key cell is empty

    def get(self, student: dict[str, str], column: str) -> str:
        """The cell of `column` (any case) for `student`, "" when the roster has no such column."""
        return student.get(self.columns.get(column.casefold(), ""), "") or ""

    def has(self, column: str) -> bool:
        return column.casefold() in self.columns


@dataclass
class RosterCheck:
    """Who matched whom: roster students with their best submission, and what matched no one."""

    matched: list[tuple[dict[str, str], SubmissionGrade]]  # roster order
    missing: list[dict[str, str]]  # on the roster, no submission
    unknown: list[SubmissionGrade]  # a student id that is not on the roster
    no_id: list[SubmissionGrade]  # read, but no student id (or unreadable)
    repeated: list[tuple[dict[str, str], list[SubmissionGrade]]]  # several submissions for one student


def read_roster(path: str | Path, fmt: str, key: str | None = None) -> Roster:
    """Read the LMS's roster export for `--format fmt`; RosterError naming the fix when it cannot be used.

    Example:
        >>> roster = read_roster("canvas_export.csv", "canvas")  # doctest: +SKIP
        >>> roster.key, len(roster.students)  # doctest: +SKIP
        ('SIS Login ID', 42)
    """
    path = Path(path)
    header, rows = _read_rows(path)
    columns = {h.strip().casefold(): h for h in header if h.strip()}
    for need in REQUIRED[fmt]:
        options = need if isinstance(need, tuple) else (need,)
        if not any(o.casefold() in columns for o in options):
            raise RosterError(
                f"the roster {shown_path(path)} has no {' or '.join(repr(o) for o in options)} column, which a "
                f"{fmt} import needs (its columns: {_listing(header)}); export the roster {_HOW_TO_EXPORT[fmt]}"
            )
    key = key or DEFAULT_KEYS[fmt]
    if key.strip().casefold() not in columns:
        raise RosterError(
            f"the roster {shown_path(path)} has no column {shown(key, 100)!r} to match student_id against; "
            f"name one of its columns with --roster-key, e.g. --roster-key {_suggest(header)!r} "
            f"(its columns: {_listing(header)})"
        )
    roster = Roster(path, fmt, columns[key.strip().casefold()], header, columns, [])
    _fill(roster, rows)
    return roster


def match_roster(results: list[SubmissionGrade], roster: Roster) -> RosterCheck:
    """Match each submission's student_id to the roster's key column, ignoring case and outer spaces."""
    by_key = {_norm(s[roster.key]): s for s in roster.students}
    found: dict[str, list[SubmissionGrade]] = {}
    unknown, no_id = [], []
    for s in results:
        sid = _norm(s.student_id)
        if s.status == UNREADABLE or not sid:
            no_id.append(s)
        elif sid in by_key:
            found.setdefault(sid, []).append(s)
        else:
            unknown.append(s)
    matched, missing, repeated = [], [], []
    for student in roster.students:
        subs = found.get(_norm(student[roster.key]), [])
        if not subs:
            missing.append(student)
            continue
        matched.append((student, max(subs, key=lambda s: s.total)))  # the best of several, and say so
        if len(subs) > 1:
            repeated.append((student, subs))
    return RosterCheck(matched, missing, unknown, no_id, repeated)


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        if path.stat().st_size > MAX_ROSTER_BYTES:
            raise RosterError(
                f"the roster {shown_path(path)} is over {MAX_ROSTER_BYTES // 2**20} MiB: export only the "
                "students' columns (no submissions, no comments)"
            )
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise RosterError(f"no roster at {shown_path(path)}: give the path of the LMS's roster export") from None
    except UnicodeDecodeError:
        raise RosterError(
            f"the roster {shown_path(path)} is not UTF-8 text: save it as 'CSV UTF-8' and try again"
        ) from None
    except OSError as e:
        raise RosterError(f"cannot read the roster {shown_path(path)}: {shown(e.strerror or e)}") from None
    try:
        rows = list(_bounded(csv.reader(io.StringIO(text, newline="")), path))
    except csv.Error as e:
        raise RosterError(f"the roster {shown_path(path)} is not a CSV file ({shown(e)}): export it as CSV") from None
    if not rows or not any(c.strip() for c in rows[0]):
        raise RosterError(f"the roster {shown_path(path)} is empty: it needs a header row, then one row per student")
    return rows[0], rows[1:]


def _bounded(reader, path: Path):
    for n, row in enumerate(reader):
        if n > MAX_ROSTER_ROWS:
            raise RosterError(f"the roster {shown_path(path)} has over {MAX_ROSTER_ROWS:,} rows: is it the roster?")
        yield row


def _fill(roster: Roster, rows: list[list[str]]) -> None:
    """Add the student rows; skip Canvas's "Points Possible" row and blank lines; refuse repeated ids."""
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        if not any(c.strip() for c in row) or (row and row[0].strip().casefold() == "points possible"):
            continue
        student = {h: (row[i] if i < len(row) else "") for i, h in enumerate(roster.header) if h.strip()}
        key = _norm(student.get(roster.key, ""))
        if not key:
            roster.unkeyed.append(student)
        elif key in seen:
            raise RosterError(
                f"the roster {shown_path(roster.path)} gives {roster.key} {shown(student[roster.key], 100)!r} to two "
                f"students (lines {seen[key]} and {line}): fix the roster, or match on a column that is unique "
                "with --roster-key"
            )
        else:
            seen[key] = line
            roster.students.append(student)


def _norm(text: str) -> str:
    return (text or "").strip().casefold()


def _listing(header: list[str]) -> str:
    shown_cols = ", ".join(repr(shown(h, 60)) for h in header[:12])
    return shown_cols + (f" and {len(header) - 12} more" if len(header) > 12 else "") if header else "none"


def _suggest(header: list[str]) -> str:
    for name in ("SIS Login ID", "SIS User ID", "SID", "ID number", "Email", "Email address", "student_id"):
        if any(h.strip().casefold() == name.casefold() for h in header):
            return name
    return shown(header[0], 60) if header else "student_id"
