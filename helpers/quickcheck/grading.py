"""Grade a batch of submitted notebooks: `python -m helpers.quickcheck grade SUBMISSION... --out grades.csv`.

No student code runs: each notebook's answers are read from the text of its cells (`submissions`,
`reading`) and judged by the same rule `check()` uses (`judging`). Every file gets a row, whatever
it holds; one bad file never stops the batch. Next to the CSV, `gradebook` writes:

    grades.csv            one row per submission: file, student_id, status, points per question,
                          total, max_points, attempts per question, notes
    grades_feedback/      one text file per submission, for the student: result, hint or
                          explanation per question (never the right answer to a missed question)
    grades_report.md      for the instructor: files that could not be read and why, damaged files,
                          missing or shared student ids, how the class did on each question, and
                          what an attempt count can and cannot prove

Each file is read, graded and let go before the next (nothing it held outlives its row), within
the bounds of `limits`: at most 25 MB read, 200 K characters of code parsed, about a second.
Which questions: those of the notebooks a submission's cells mention (q04_* -> notebook 04), or
`notebooks=["04"]` to fix them. A submission whose quick-check cells were all deleted is graded
on the batch's notebooks and gets zeros with a note.

In folders, every *.ipynb entry gets a row; a symbolic link or a FIFO gets an "unreadable" row
saying so, and is never followed or opened for reading, so no link can take over another
student's row. A file named on the command line is followed to what it links to.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.quickcheck import gradebook, lms, reading
from helpers.quickcheck.bank import Question, bank_notebooks, load_bank
from helpers.quickcheck.escaping import feedback_names, shown, shown_path
from helpers.quickcheck.grades import LABELS, MISSING, UNREADABLE, GradeRun, QuestionGrade, SubmissionGrade
from helpers.quickcheck.judging import CORRECT, NEEDS_ID, WRONG, judge
from helpers.quickcheck.roster import Roster, match_roster
from helpers.quickcheck.submissions import NotANotebook, load_cells

__all__ = ["collect", "grade", "grade_submission", "show_graded"]

_SKIP_DIRS = {"__MACOSX", ".ipynb_checkpoints"}


@dataclass
class _Waiting:
    """A file that mentions no quick check, graded on the batch's questions once they are known."""

    grade: SubmissionGrade
    id_problem: str
    receipts: dict


def collect(paths: list[str | Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The submissions to grade, and files skipped inside folders (with why).

    A file named on the command line is always graded (it gets a row even when it is not a
    notebook), followed to its target when it is a link; inside a folder, every *.ipynb entry is
    graded (links, FIFOs and devices get a row saying what they are, and are never read), and
    hidden files, `__MACOSX` and `.ipynb_checkpoints` are passed over.
    """
    files, skipped, seen = [], [], set()
    for p in map(Path, paths):
        if p.is_dir():
            found, passed = _walk_folder(p)
            skipped += passed
        else:
            found = [Path(os.path.realpath(p))] if p.is_symlink() else [p]
        for f in found:
            key = os.path.abspath(f) if f.is_symlink() else os.path.realpath(f)
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files, skipped


def show_graded(done: int, total: int, stream=None) -> None:
    """On a terminal, rewrite one `graded done/total` line on stderr; elsewhere (a pipe, a log) print nothing."""
    stream = stream or sys.stderr
    if stream.isatty():
        stream.write(f"\rgraded {done}/{total}" + ("\n" if done == total else ""))
        stream.flush()


def grade(
    paths: list[str | Path],
    out_csv: str | Path = "grades.csv",
    *,
    notebooks: list[str] | None = None,
    roster: Roster | None = None,
    assignment: str | None = None,
) -> GradeRun:
    """Grade every submission under `paths`; write the CSV, the feedback files and the report.

    Args:
        paths: notebook files and folders of them.
        out_csv: the gradebook to write; the feedback folder and report go next to it. It must
            not be (or put the report or a feedback file on) a submission: ValueError.
        notebooks: grade these notebooks' questions ("00" ... "08"); default: the ones the
            submissions mention.
        roster: the LMS's students (`roster.read_roster`): `out_csv` is then written in its
            format (Canvas, Gradescope or Moodle, see `lms`; "csv" keeps the plain gradebook)
            and the report lists roster students with no submission and ids not on the roster.
        assignment: the score column's name in an LMS file (Canvas: "Name (assignment id)" to
            fill an existing assignment); default "Quick checks NN".

    Example:
        >>> run = grade(["submissions/"], "grades.csv")  # doctest: +SKIP
        >>> print(run.csv_path, len(run.unreadable))  # doctest: +SKIP
    """
    unknown = [nb for nb in notebooks or [] if nb not in bank_notebooks()]
    if unknown:
        raise ValueError(f"notebook {unknown[0]!r} has no quick checks; the bank has {', '.join(bank_notebooks())}")
    start = time.perf_counter()
    files, skipped = collect(paths)
    out_csv = Path(out_csv)
    feedback_dir = out_csv.with_name(f"{out_csv.stem}_feedback")
    report_path = out_csv.with_name(f"{out_csv.stem}_report.md")
    all_csv = out_csv.with_name(f"{out_csv.stem}_all.csv")  # with an LMS format: every file's row, as in csv
    names = feedback_names(files)
    outputs = [report_path, *([all_csv] if roster else []), *(feedback_dir / f"{n}.txt" for n in names)]
    _refuse_overwriting(files, out_csv, outputs, roster)
    results, waiting = [], []
    for path, name in zip(files, names):  # one file at a time: what it held is let go before the next
        result, wait = _grade_file(path, notebooks)
        result.feedback_name = name
        results.append(result)
        waiting += [wait] if wait else []
        show_graded(len(results), len(files))
    mentioned = sorted({nb for s in results for nb in _notebooks_of(s)})
    batch = notebooks or mentioned
    for wait in waiting:
        _add_questions(wait.grade, _questions(batch), reading.Scan(receipts=wait.receipts), wait.id_problem)
    questions = _questions(sorted(set(mentioned) | set(batch)))
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    check = match_roster(results, roster) if roster else None
    if roster and roster.fmt != "csv":
        name = assignment or lms.default_assignment(questions)
        lms.write_lms(lms.lms_rows(check, roster, questions, name), out_csv)
        gradebook.write_csv(results, questions, all_csv)
    else:
        gradebook.write_csv(results, questions, out_csv)
    unwritten = gradebook.write_feedback(results, feedback_dir)
    run = GradeRun(results, skipped, out_csv, feedback_dir, report_path, time.perf_counter() - start, unwritten, check)
    report = gradebook.report_text(run, questions) + "\n".join(lms.roster_section(check, roster))
    report_path.write_text(report, encoding="utf-8")
    return run


def grade_submission(path: str | Path, notebooks: list[str] | None = None) -> SubmissionGrade:
    """Grade one file on its own (no CSV); never raises for a bad file."""
    result, wait = _grade_file(Path(path), notebooks)
    if wait:
        _add_questions(wait.grade, _questions(notebooks or []), reading.Scan(receipts=wait.receipts), wait.id_problem)
    return result


def _walk_folder(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    files, skipped = [], []
    for root, dirs, names in os.walk(folder):  # never follows a link to a folder
        root = Path(root)
        skipped += [(root / d, "a link to a folder: not followed") for d in dirs if (root / d).is_symlink()]
        dirs[:] = sorted(d for d in dirs if not (d.startswith(".") or d in _SKIP_DIRS or (root / d).is_symlink()))
        for name in sorted(names):
            if name.startswith("."):
                continue
            if name.lower().endswith(".ipynb"):
                files.append(root / name)
            else:
                skipped.append((root / name, "not a .ipynb file"))
    return sorted(files), skipped


def _refuse_overwriting(files: list[Path], out_csv: Path, outputs: list[Path], roster: Roster | None) -> None:
    if roster and os.path.realpath(out_csv) == os.path.realpath(roster.path):
        raise ValueError(
            f"--out {shown_path(out_csv)} is the roster: writing it would destroy the LMS's export; "
            f"write the import file elsewhere, e.g. --out {shown_path(out_csv.with_name('import.csv'))}"
        )
    if out_csv.suffix.lower() == ".ipynb":
        raise ValueError(
            f"--out {shown_path(out_csv)} names a notebook: the gradebook is a CSV, and a submission must "
            "never be overwritten; use e.g. --out grades.csv"
        )
    taken = {os.path.realpath(f) for f in files}
    for out in [out_csv, *outputs]:
        if roster and os.path.realpath(out) == os.path.realpath(roster.path) and out != out_csv:
            raise ValueError(f"writing {shown_path(out)} would overwrite the roster: name --out differently")
        if os.path.realpath(out) in taken:
            raise ValueError(
                f"writing {shown_path(out)} would overwrite the submission of that name: "
                "put the gradebook in another folder, e.g. --out grades.csv"
            )


def _grade_file(path: Path, notebooks: list[str] | None) -> tuple[SubmissionGrade, _Waiting | None]:
    """Read and grade one file within the limits; never raises. A file that mentions no question waits."""
    start = time.perf_counter()
    try:
        cells, damage = load_cells(path)
        found = reading.scan(cells)
        del cells  # the cells' text is not needed past the scan
        result, wait = _grade_scan(path, found, damage, notebooks)
    except NotANotebook as e:
        result, wait = SubmissionGrade(path, UNREADABLE, reason=str(e)), None
    except Exception as e:  # a file this module did not foresee: report it, keep grading the others
        why = f"the grader failed on it ({type(e).__name__}: {shown(e, 200)}); please report this file"
        result, wait = SubmissionGrade(path, UNREADABLE, reason=why), None
    result.seconds = time.perf_counter() - start
    return result, wait


def _grade_scan(
    path: Path, found: reading.Scan, damage: list[str], notebooks: list[str] | None
) -> tuple[SubmissionGrade, _Waiting | None]:
    mentioned = found.question_ids()
    own = sorted({qid[1:3] for qid in mentioned} & set(bank_notebooks()))
    graded_nbs = notebooks or own
    notes = list(damage) + found.notes
    if not mentioned:
        where = "in the part of the file that could be read" if damage else "(deleted?)"
        notes.append(f"no quick-check cells found {where}; graded as unanswered")
    known = {q.id for q in _questions(graded_nbs)}
    stray = sorted(qid for qid in mentioned if qid not in known)
    if stray:
        listing = ", ".join(shown(s, 40) for s in stray[:5]) + (
            f" and {len(stray) - 5:,} more" if len(stray) > 5 else ""
        )
        notes.append(
            f"mentions {listing}, which {'is' if len(stray) == 1 else 'are'} not among the graded "
            "questions (a typo in the id, or another notebook)"
        )
    student_id, id_problem = reading.find_student_id(found)
    result = SubmissionGrade(path, "damaged" if damage else "graded", student_id=student_id, notes=notes)
    if not graded_nbs:
        return result, _Waiting(result, id_problem, found.receipts)
    _add_questions(result, _questions(graded_nbs), found, id_problem)
    return result, None


def _add_questions(result: SubmissionGrade, questions: list[Question], found: reading.Scan, id_problem: str) -> None:
    if id_problem and any(q.personal for q in questions):
        result.notes.append(id_problem)
    for q in questions:
        result.questions[q.id] = _grade_question(q, found, result.student_id)


def _grade_question(q: Question, found: reading.Scan, student_id: str) -> QuestionGrade:
    answer = reading.find_answer(found, q.id)
    receipts = found.receipts.get(q.id, {})
    attempts = max(receipts.values(), default=None)
    if answer.value is reading.MISSING:
        status = MISSING if answer.cell is None else UNREADABLE
        return QuestionGrade(q.id, status, 0, q.points, attempts, answer.problem, answer.notes)
    verdict = judge(q, answer.value, student_id)
    notes = list(answer.notes)
    if verdict.status == NEEDS_ID:
        message = "student_id is empty, so this question's numbers are unknown: it needs your id to be graded"
    else:
        message = verdict.message
    result = "correct" if verdict.status == CORRECT else "not yet"
    if verdict.status in (CORRECT, WRONG) and receipts and result not in receipts:
        notes.append(
            f"graded {LABELS[verdict.status]}, but no receipt in the notebook says so: the answer was "
            "edited after its last check, or the notebook was not re-run"
        )
    return QuestionGrade(
        q.id, verdict.status, verdict.points, q.points, attempts, message, notes, verdict.why_not, verdict.canonical
    )


def _questions(notebooks: list[str]) -> list[Question]:
    return [q for nb in notebooks for q in load_bank(nb)]


def _notebooks_of(s: SubmissionGrade) -> set[str]:
    return {qid[1:3] for qid in s.questions}
