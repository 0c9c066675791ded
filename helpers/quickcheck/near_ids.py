"""Student ids that are probably one student written two ways (C03, C003, c-03), found for the instructor.

Used by `python -m helpers.quickcheck grade` without `--roster`: the report's "Near-duplicate
student ids" section and the lines printed on the terminal. With a roster, each id is matched to
the LMS's list and an id not on it is reported there instead (`roster`).

Two ids are near duplicates when they differ as ids (`grades.id_key`: Unicode form, case, outer
spaces) but agree once every character that is not a letter or a digit is dropped (spaces, -, _,
., /) and the zeros that pad a run of digits are stripped ("C003" and "c-03" both read "c3").

They are reported, never merged: the grader cannot tell a student's typo from two students of one
scheme (s1 and s01 in two sections), and a wrong merge would hide a student, since a student's
grade takes their best file per notebook. Each file was also graded for the id it holds: the
questions that give each student their own numbers derive them from it, so correcting an id can
change those answers' grades. The instructor fixes the `student_id` line of the files that are
wrong and grades again, or grades with `--roster`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helpers.quickcheck.grades import UNREADABLE, SubmissionGrade, id_key

__all__ = ["NEAR_IDS_ADVICE", "NearDuplicate", "loose_id", "near_duplicates"]

_DIGITS = re.compile(r"[0-9]+")
NEAR_IDS_ADVICE = (
    "graded as different students, not merged (two students can hold such ids). If one is a typo, correct "
    "the student_id line in that student's files and grade again (the questions with each student's own "
    "numbers were judged for the id each file holds), or grade with --roster ROSTER.csv"
)


@dataclass(frozen=True)
class NearDuplicate:
    """Ids that read alike (`loose`), each as first written, with the submissions that hold it."""

    loose: str
    spellings: tuple[tuple[str, tuple[SubmissionGrade, ...]], ...]  # (id as written, its files), first-seen order

    @property
    def files(self) -> int:
        return sum(len(subs) for _, subs in self.spellings)

    def written(self) -> list[str]:
        """Each student's id as their files write it, variants of one id joined: ["C03 / c03", "C003"]."""
        return [" / ".join(dict.fromkeys(s.student_id for s in subs)) for _, subs in self.spellings]


def loose_id(student_id: str) -> str:
    """The id with case, separators and zero padding gone: "C-003 " -> "c3", "s_0420" -> "s420".

    Example:
        >>> loose_id("C003") == loose_id("c-03") == loose_id("C 3")
        True
    """
    kept = "".join(ch for ch in id_key(student_id) if ch.isalnum())
    return _DIGITS.sub(lambda m: m.group().lstrip("0") or "0", kept)  # no int(): a 5,000-digit id stays text


def near_duplicates(results: list[SubmissionGrade]) -> list[NearDuplicate]:
    """Groups of two or more different ids (by `id_key`) that read alike, in the order files were graded."""
    groups: dict[str, dict[str, list[SubmissionGrade]]] = {}
    for s in results:
        key = id_key(s.student_id)
        loose = loose_id(s.student_id) if key and s.status != UNREADABLE else ""
        if loose:
            groups.setdefault(loose, {}).setdefault(key, []).append(s)
    return [
        NearDuplicate(loose, tuple((subs[0].student_id, tuple(subs)) for subs in by_key.values()))
        for loose, by_key in groups.items()
        if len(by_key) > 1
    ]
