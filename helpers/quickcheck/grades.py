"""What grading produces: a grade per question, per submission, and the batch's run.

Made by `grading` and written out by `gradebook` and `lms` for `python -m helpers.quickcheck grade`.
A course graded in one batch has one submission per student and notebook; `by_student` gathers
them, so a student's grade is the sum over their notebooks, never their best single file.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from helpers.quickcheck.bank import load_bank
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG

__all__ = [
    "LABELS",
    "MISSING",
    "NOT_GRADED",
    "UNREADABLE",
    "GradeRun",
    "QuestionGrade",
    "StudentGrade",
    "SubmissionGrade",
    "by_student",
    "id_key",
]

UNREADABLE, MISSING = "unreadable", "missing"
NOT_GRADED = "not graded"  # a file set aside: a notebook that was not handed out (`strays`)
LABELS = {
    CORRECT: "correct",
    WRONG: "not yet right",
    UNANSWERED: "not answered",
    INVALID: "not a valid answer",
    NEEDS_ID: "needs your student id",
    UNREADABLE: "could not be read",
    MISSING: "not found",
}


@dataclass
class QuestionGrade:
    question_id: str
    status: str  # one of LABELS
    points: float
    max_points: float
    attempts: int | None  # from the receipts in the outputs; None when there are none
    message: str  # hint, explanation, or what went wrong
    notes: list[str] = field(default_factory=list)
    why_not: str = ""  # a wrong choice answer: its option's own feedback ("You picked c: ...")
    answer: str | None = None  # the normalized answer read ("c", "bd", "160"): the report counts wrong picks


@dataclass
class SubmissionGrade:
    path: Path
    status: str  # "graded", "damaged" (read what survived), "unreadable" or "not graded" (NOT_GRADED)
    reason: str = ""  # why unreadable, or why not graded
    notebook: str = ""  # the handout it is graded as ("03"); "" when unreadable or it cannot be told
    student_id: str = ""
    questions: dict[str, QuestionGrade] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # question ids it mentions that are not its notebook's
    feedback_name: str = ""
    seconds: float = 0.0  # how long reading and grading this file took

    @property
    def total(self) -> float:
        return sum(g.points for g in self.questions.values())

    @property
    def max_points(self) -> float:
        return sum(g.max_points for g in self.questions.values())


@dataclass
class StudentGrade:
    """One student's submissions in a batch, by notebook; the grade is the sum over notebooks."""

    student_id: str  # as the first of their files wrote it
    files: dict[str, list[SubmissionGrade]] = field(default_factory=dict)  # notebook -> its submissions

    @property
    def best(self) -> dict[str, SubmissionGrade]:
        """The highest-scoring submission per notebook (the first of equals, in file order)."""
        return {nb: max(subs, key=lambda s: s.total) for nb, subs in sorted(self.files.items())}

    @property
    def total(self) -> float:
        return sum(s.total for s in self.best.values())

    def max_points(self, issued: list[str] | None) -> float:
        """Out of the issued notebooks' points when they are known, else those this student submitted for."""
        return sum(q.points for nb in (issued or sorted(self.files)) for q in load_bank(nb))


# zero-width and other invisible format characters a copied id can carry (U+200B, U+FEFF, U+2060...)
_INVISIBLE = re.compile(r"[\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u206f\ufeff]")


def id_key(text: str) -> str:
    """What two student ids are compared by: Unicode-normalized (NFKC), invisible marks and outer spaces
    dropped, case folded, so "José" typed on a Mac (NFD) matches the roster's "José" (NFC)."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text or ""))
    return unicodedata.normalize("NFKC", text.strip().casefold())


def by_student(results: list[SubmissionGrade]) -> list[StudentGrade]:
    """The read submissions with a student id and a notebook, gathered per student (first-seen order)."""
    students: dict[str, StudentGrade] = {}
    for s in results:
        key = id_key(s.student_id)
        if s.status == UNREADABLE or not key or not s.notebook:
            continue
        student = students.setdefault(key, StudentGrade(s.student_id))
        student.files.setdefault(s.notebook, []).append(s)
    return list(students.values())


@dataclass
class GradeRun:
    """What `grading.grade` did, for the command line and the tests."""

    submissions: list[SubmissionGrade]
    skipped: list[tuple[Path, str]]
    csv_path: Path
    feedback_dir: Path
    report_path: Path
    seconds: float
    unwritten: list[tuple[Path, str]] = field(default_factory=list)  # feedback files that failed, and why
    roster_check: object | None = None  # a roster.RosterCheck when graded against a roster
    notebooks: list[str] = field(default_factory=list)  # the batch's notebooks, in its columns
    issued: list[str] | None = None  # the notebooks the instructor named (--notebook); None: inferred
    strays: object | None = None  # a strays.Strays: files of notebooks not handed out, set aside (inferred batches)

    @property
    def unreadable(self) -> list[SubmissionGrade]:
        return [s for s in self.submissions if s.status == "unreadable"]
