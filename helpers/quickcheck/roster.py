"""An LMS's list of students, read and matched against the graded submissions.

Used by `python -m helpers.quickcheck grade ... --format canvas|gradescope|moodle --roster FILE`
(see `lms` for the files written). The roster is the LMS's own export of its students: Canvas's
exported gradebook (Student, ID, SIS User ID, SIS Login ID, Section), Gradescope's roster (Name or
First Name/Last Name, Email, SID) or Moodle's grade export (First name, Last name, ID number,
Email address). A notebook's `student_id` is matched against one column of it, `--roster-key
COLUMN` (by default the one named in `DEFAULT_KEYS`), after `grades.id_key`: Unicode-normalized,
case and surrounding spaces ignored, so an id typed on a Mac (NFD) matches the LMS's (NFC).

The roster is data too: only a regular file is opened (never a FIFO or a device, which would hang
or never end), read within bounds (by default 50 000 rows and 10 MiB, a guard against a file that
is not a roster; `--roster-max-rows N` raises both for a larger class, the bytes at
`ROSTER_ROW_BYTES` a row, and the refusal names the flag), as UTF-8 or, with its byte-order mark,
UTF-16 (Excel's "Unicode text"); its separator (comma, semicolon, tab) is detected from the header
or named with `--roster-delimiter`. Its names and ids leave the grader only through `escaping`. A
roster that cannot be used (no such column, a key column blank for every student, a header with
no students, an id given to two students, not text) is refused with the fix before anything is
graded or written.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from helpers.quickcheck.escaping import shown, shown_path
from helpers.quickcheck.grades import NOT_GRADED, UNREADABLE, StudentGrade, SubmissionGrade, by_student, id_key

__all__ = [
    "DEFAULT_KEYS",
    "DELIMITERS",
    "MAX_ROSTER_BYTES",
    "MAX_ROSTER_ROWS",
    "REQUIRED",
    "ROSTER_ROW_BYTES",
    "Roster",
    "RosterCheck",
    "RosterError",
    "match_roster",
    "read_roster",
]

MAX_ROSTER_BYTES = 10 * 1024 * 1024
MAX_ROSTER_ROWS = 50_000
ROSTER_ROW_BYTES = MAX_ROSTER_BYTES // MAX_ROSTER_ROWS  # about 210 bytes a row: what --roster-max-rows allows each

# the columns each LMS's import needs from its roster; a tuple is "one of these"
REQUIRED = {
    "canvas": ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"],
    "gradescope": ["Email", ("Name", "Full Name", "First Name")],
    "moodle": ["Email address"],
    "csv": [],
}
DELIMITERS = {",": "comma", ";": "semicolon", "\t": "tab"}
DEFAULT_KEYS = {"canvas": "SIS Login ID", "gradescope": "SID", "moodle": "ID number", "csv": "student_id"}
_HOW_TO_EXPORT = {
    "canvas": "in Canvas, Grades > Export > Export Entire Gradebook",
    "gradescope": "in Gradescope, Roster > Download Roster",
    "moodle": "in Moodle, Grades > Export > Plain text file",
    "csv": "any CSV with a header row",
}


class RosterError(ValueError):
    """A roster that cannot be used; the message says what to change.

    `option` is the flag and value that would let it through ("--roster-max-rows", "61000"), when
    one would: the command line adds the whole command to run again.
    """

    def __init__(self, message: str, option: tuple[str, str] | None = None):
        super().__init__(message)
        self.option = option


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
    """Who matched whom: roster students with their submissions by notebook, and what matched no one."""

    matched: list[tuple[dict[str, str], StudentGrade]]  # roster order
    missing: list[dict[str, str]]  # on the roster, no submission
    unknown: list[SubmissionGrade]  # a student id that is not on the roster
    no_id: list[SubmissionGrade]  # read, but no student id (or unreadable, or no notebook)
    repeated: list[tuple[dict[str, str], str, list[SubmissionGrade]]]  # (student, notebook, its submissions)


def read_roster(
    path: str | Path,
    fmt: str,
    key: str | None = None,
    delimiter: str | None = None,
    max_rows: int = MAX_ROSTER_ROWS,
) -> Roster:
    """Read the LMS's roster export for `--format fmt`; RosterError naming the fix when it cannot be used.

    `delimiter` is one of `DELIMITERS`; default: the one that splits the header into the most columns.
    `max_rows` bounds the rows read (and the file at `ROSTER_ROW_BYTES` a row, at least
    `MAX_ROSTER_BYTES`): raise it for a class over `MAX_ROSTER_ROWS` (`--roster-max-rows`).

    Example:
        >>> roster = read_roster("canvas_export.csv", "canvas")  # doctest: +SKIP
        >>> roster.key, len(roster.students)  # doctest: +SKIP
        ('SIS Login ID', 42)
    """
    path = Path(path)
    if delimiter is not None and delimiter not in DELIMITERS:
        raise RosterError(
            f"--roster-delimiter {shown(delimiter, 20)!r} is not one the grader reads: use one of "
            + ", ".join(f"{d!r} ({name})" for d, name in DELIMITERS.items())
        )
    header, rows, delimiter = _read_rows(path, delimiter, max_rows)
    columns = {h.strip().casefold(): h for h in header if h.strip()}
    for need in REQUIRED[fmt]:
        options = need if isinstance(need, tuple) else (need,)
        if not any(o.casefold() in columns for o in options):
            raise RosterError(
                f"the roster {shown_path(path)} has no {' or '.join(repr(o) for o in options)} column, which a "
                f"{fmt} import needs (its columns, split at each {DELIMITERS[delimiter]}: {_listing(header)}); "
                f"export the roster {_HOW_TO_EXPORT[fmt]}, or name its separator with --roster-delimiter"
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
    if not roster.students and not roster.unkeyed:
        raise RosterError(
            f"the roster {shown_path(path)} has a header but no students: export it again with the class enrolled "
            f"({_HOW_TO_EXPORT[fmt]})"
        )
    if not roster.students:
        raise RosterError(
            f"the roster {shown_path(path)}'s column {shown(roster.key, 100)!r} is blank for all "
            f"{len(roster.unkeyed):,} students, so no notebook can be matched: fill it in the LMS, or match on a "
            f"column that holds the notebooks' student_id with --roster-key, e.g. "
            f"--roster-key {_suggest(header, roster.unkeyed)!r}"
        )
    return roster


def match_roster(results: list[SubmissionGrade], roster: Roster) -> RosterCheck:
    """Match each student's submissions (`grades.by_student`) to the roster's key column, by `grades.id_key`."""
    students = {id_key(st.student_id): st for st in by_student(results)}
    on_roster = {id_key(s[roster.key]) for s in roster.students}
    results = [s for s in results if s.status != NOT_GRADED]  # set aside (`strays`): the report lists them
    no_id = [s for s in results if s.status == UNREADABLE or not s.notebook or not id_key(s.student_id)]
    flagged = {id(s) for s in no_id}
    unknown = [s for s in results if id(s) not in flagged and id_key(s.student_id) not in on_roster]
    matched, missing, repeated = [], [], []
    for student in roster.students:
        st = students.get(id_key(student[roster.key]))
        if st is None:
            missing.append(student)
            continue
        matched.append((student, st))  # each notebook by its best submission, and say so
        repeated += [(student, nb, subs) for nb, subs in sorted(st.files.items()) if len(subs) > 1]
    return RosterCheck(matched, missing, unknown, no_id, repeated)


def _read_rows(path: Path, delimiter: str | None, max_rows: int) -> tuple[list[str], list[list[str]], str]:
    text = _decode(_read_bounded(path, max_rows), path)
    delimiter = delimiter or _detect_delimiter(text)
    try:
        rows = list(_bounded(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter), path, max_rows, text))
    except csv.Error as e:
        raise RosterError(f"the roster {shown_path(path)} is not a CSV file ({shown(e)}): export it as CSV") from None
    if not rows or not any(c.strip() for c in rows[0]):
        raise RosterError(f"the roster {shown_path(path)} is empty: it needs a header row, then one row per student")
    return rows[0], rows[1:], delimiter


def _read_bounded(path: Path, max_rows: int) -> bytes:
    """The bytes of a regular file within `max_rows`' bytes; a FIFO or a device is never read from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    except FileNotFoundError:
        raise RosterError(f"no roster at {shown_path(path)}: give the path of the LMS's roster export") from None
    except OSError as e:
        raise RosterError(f"cannot read the roster {shown_path(path)}: {shown(e.strerror or e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise RosterError(f"the roster {shown_path(path)} is a folder: give the CSV file the LMS exported")
        raise RosterError(
            f"the roster {shown_path(path)} is not a regular file (a pipe or a device): save the LMS's export "
            "to a file and give its path"
        )
    limit = max(MAX_ROSTER_BYTES, max_rows * ROSTER_ROW_BYTES)
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
            size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise RosterError(f"cannot read the roster {shown_path(path)}: {shown(e.strerror or e)}") from None
    if len(data) > limit:
        rows = _round_up(max(size, len(data)) // ROSTER_ROW_BYTES + 1)
        raise RosterError(
            f"the roster {shown_path(path)} is {max(size, len(data)) / 2**20:.1f} MiB, over the {limit / 2**20:.1f} "
            f"MiB the grader reads by default (a guard against a file that is not a roster): export only the "
            f"students' columns (no submissions, no comments), or, if it is your class's roster, raise the bound "
            f"with --roster-max-rows {rows}",
            ("--roster-max-rows", str(rows)),
        )
    return data


def _decode(data: bytes, path: Path) -> str:
    try:
        if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # Excel's "Unicode text"
            return data.decode("utf-16")
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise RosterError(
            f"the roster {shown_path(path)} is not UTF-8 text: save it as 'CSV UTF-8' and try again"
        ) from None


def _detect_delimiter(text: str) -> str:
    """The separator that splits the header into the most columns (a comma when none splits it)."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    counts = {d: len(next(csv.reader([first], delimiter=d), [])) for d in DELIMITERS}
    best = max(counts.values(), default=1)
    return "," if best <= 1 else next(d for d in DELIMITERS if counts[d] == best)


def _bounded(reader, path: Path, max_rows: int, text: str):
    for n, row in enumerate(reader):
        if n > max_rows:  # the header is row 0
            lines = _round_up(text.count("\n") + 1)  # at least the rows it holds (a quoted cell may span lines)
            raise RosterError(
                f"the roster {shown_path(path)} has over {max_rows:,} rows, the most the grader reads by default "
                f"(a guard against a file that is not a roster): check it is the roster; if it is, raise the bound "
                f"with --roster-max-rows {lines}",
                ("--roster-max-rows", str(lines)),
            )
        yield row


def _round_up(n: int) -> int:
    """`n` rounded up to a thousand: a bound to suggest, with room for a few more students."""
    return -(-n // 1000) * 1000


def _fill(roster: Roster, rows: list[list[str]]) -> None:
    """Add the student rows; skip Canvas's "Points Possible" row and blank lines; refuse repeated ids."""
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        if not any(c.strip() for c in row) or (row and row[0].strip().casefold() == "points possible"):
            continue
        student = {h: (row[i] if i < len(row) else "") for i, h in enumerate(roster.header) if h.strip()}
        key = id_key(student.get(roster.key, ""))
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


def _listing(header: list[str]) -> str:
    shown_cols = ", ".join(repr(shown(h, 60)) for h in header[:12])
    return shown_cols + (f" and {len(header) - 12} more" if len(header) > 12 else "") if header else "none"


def _suggest(header: list[str], students: list[dict[str, str]] = ()) -> str:
    """An id column of the header, one filled for every student of `students` when given."""
    for name in ("SIS Login ID", "SIS User ID", "SID", "ID number", "Email", "Email address", "student_id"):
        column = next((h for h in header if h.strip().casefold() == name.casefold()), None)
        if column is not None and all(s.get(column, "").strip() for s in students):
            return name
    return shown(header[0], 60) if header else "student_id"
