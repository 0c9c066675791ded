"""What grading produces: a grade per question, per submission, and the batch's run.

Made by `grading` and written out by `gradebook` for `python -m helpers.quickcheck grade`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG

__all__ = ["LABELS", "MISSING", "UNREADABLE", "GradeRun", "QuestionGrade", "SubmissionGrade"]

UNREADABLE, MISSING = "unreadable", "missing"
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
    status: str  # "graded", "damaged" (read what survived) or "unreadable"
    reason: str = ""  # why unreadable
    student_id: str = ""
    questions: dict[str, QuestionGrade] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    feedback_name: str = ""
    seconds: float = 0.0  # how long reading and grading this file took

    @property
    def total(self) -> float:
        return sum(g.points for g in self.questions.values())

    @property
    def max_points(self) -> float:
        return sum(g.max_points for g in self.questions.values())


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

    @property
    def unreadable(self) -> list[SubmissionGrade]:
        return [s for s in self.submissions if s.status == "unreadable"]
