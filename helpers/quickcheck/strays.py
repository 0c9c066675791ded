"""Files for a notebook nobody handed out: set aside, not graded, named once with what to do.

Used by `python -m helpers.quickcheck grade` (`grading.grade`) when no `--notebook` says which
notebooks were handed out. The batch's notebooks are then inferred from the files, and one file
must not widen them: a notebook a student or a TA dropped into an assignment's folder would add a
column (a Canvas assignment, a Moodle grade item) for the whole class. So a notebook counts as
handed out only when more than a quarter of the batch's students handed it in (`STRAY_SHARE`;
the most handed-in notebook always counts). Each file of any other notebook is set aside: its row
says "not graded" and why, it adds no column, no question and no points, and the report and the
terminal name it once, with the `--notebook` list that would grade it. With `--notebook` the
instructor has said what was handed out, and nothing is inferred.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from helpers.quickcheck.escaping import md_code
from helpers.quickcheck.grades import NOT_GRADED, UNREADABLE, SubmissionGrade, id_key

__all__ = ["STRAY_SHARE", "Strays", "set_aside_strays"]

STRAY_SHARE = 4  # a notebook handed in by 1 / STRAY_SHARE of the batch's students or fewer is a stray


@dataclass
class Strays:
    """The set-aside files by notebook, how many students handed each notebook in, and out of how many."""

    files: dict[str, list[SubmissionGrade]] = field(default_factory=dict)
    students: dict[str, int] = field(default_factory=dict)
    everyone: int = 0

    def advice(self, batch: list[str]) -> str:
        """What to do: the --notebook list that grades them too, or removing them."""
        wanted = " ".join(f"--notebook {nb}" for nb in sorted({*batch, *self.files}))
        many = sum(map(len, self.files.values())) > 1
        return (
            f"if you handed out notebook {', '.join(self.files)} too, grade again with {wanted}; if not, remove "
            f"{'these files' if many else 'this file'} from the folder (nothing of {'them' if many else 'it'} "
            "was counted)"
        )

    def section(self, batch: list[str]) -> list[str]:
        """The report's section: each notebook once, who handed it in, its files, and what to do."""
        if not self.files:
            return []
        lines = [f"## Not handed out, not graded ({sum(map(len, self.files.values()))})", ""]
        for nb, files in self.files.items():
            listing = ", ".join(md_code(s.path) for s in files[:20])
            more = f" and {len(files) - 20:,} more" if len(files) > 20 else ""
            lines.append(
                f"- notebook {nb}, handed in by {self.students[nb]} of the batch's {self.everyone} students: "
                f"{listing}{more}"
            )
        return lines + [
            "",
            "Few students handed these notebooks in, so their files were taken for files dropped into the folder, "
            f"not notebooks you handed out: they add no column and no points. {self.advice(batch).capitalize()}.",
            "",
        ]


def set_aside_strays(results: list[SubmissionGrade]) -> Strays:
    """Set aside, in place, the files of the notebooks few of the batch's students handed in.

    A student is a student id (`grades.id_key`); a file with no id counts as a student of its own.
    A set-aside file's status is `grades.NOT_GRADED`, its reason says why, and it keeps no notebook,
    question or points.
    """
    students = defaultdict(set)
    for s in results:
        if s.status != UNREADABLE and s.notebook:
            students[s.notebook].add(id_key(s.student_id) or f"file {s.path}")
    everyone = len(set().union(*students.values())) if students else 0
    most = max(sorted(students), key=lambda nb: len(students[nb]), default=None)  # the first, on a tie
    strays = Strays(everyone=everyone)
    for nb, who in sorted(students.items()):
        if nb != most and len(who) * STRAY_SHARE <= everyone:
            strays.files[nb], strays.students[nb] = [], len(who)
    for s in results:
        if s.notebook in strays.files:
            s.reason = (
                f"it is notebook {s.notebook}, which {strays.students[s.notebook]} of the batch's {everyone} "
                "students handed in: taken for a file that was not handed out, so it was not graded"
            )
            strays.files[s.notebook].append(s)
            s.status, s.notebook, s.questions, s.foreign, s.notes = NOT_GRADED, "", {}, [], []
    return strays
