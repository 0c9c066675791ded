"""Grade a batch of submitted notebooks: `python -m helpers.quickcheck grade SUBMISSION... --out grades.csv`.

No student code runs: each notebook's answers are read from the text of its cells (`submissions`,
`reading`) and judged by the same rule `check()` uses (`judging`). Every file gets a row, whatever
it holds; one bad file never stops the batch. Next to the CSV, `gradebook` writes:

    grades.csv            one row per submission: file, student_id, status, points per question,
                          total, max_points, attempts per question, notes
    grades_feedback/      one text file per submission, for the student: result, hint or
                          explanation per question (never the right answer to a missed question)
    grades_report.md      for the instructor: files that could not be read and why, damaged files,
                          missing or shared student ids, ids that read alike without a roster
                          (`near_ids`), how the class did on each question, and what an attempt
                          count can and cannot prove

Each file is read, graded and let go before the next (nothing it held outlives its row), within
the bounds of `limits`: at most 25 MB read, 200 K characters of code parsed, about a second.

Which questions count comes from the handouts, never from what one submission holds: each file
is graded as exactly one notebook, `notebooks=["03"]` when the instructor names it (or several:
a course in one batch), else the notebook most of its quick-check cells belong to. A cell pasted
from another notebook (`check("q05_1", ...)` in notebook 03) is reported, not scored, and cannot
add notebook 05's questions to anyone's total. A course batch is graded per student: the sum over
their notebooks (`grades.by_student`), against the issued notebooks' points when `notebooks` names
them, else against the notebooks each student submitted for; the report says which. Without
`notebooks`, only what was handed out makes columns: a notebook few of the batch's students handed
in (a file dropped into the folder) is set aside, not graded, and named once (`strays`).

In folders, every *.ipynb entry gets a row; a symbolic link or a FIFO gets an "unreadable" row
saying so, and is never followed or opened for reading, so no link can take over another
student's row. A file named on the command line is followed to what it links to.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.quickcheck import gradebook, lms, reading, writing
from helpers.quickcheck.bank import Question, bank_notebooks, load_bank
from helpers.quickcheck.escaping import feedback_names, shown, shown_path
from helpers.quickcheck.grades import LABELS, MISSING, UNREADABLE, GradeRun, QuestionGrade, SubmissionGrade
from helpers.quickcheck.judging import CORRECT, NEEDS_ID, WRONG, judge
from helpers.quickcheck.roster import Roster, match_roster
from helpers.quickcheck.strays import Strays, set_aside_strays
from helpers.quickcheck.submissions import NotANotebook, load_cells

__all__ = ["collect", "grade", "grade_submission", "show_graded"]

_SKIP_DIRS = {"__MACOSX", ".ipynb_checkpoints"}


@dataclass
class _Waiting:
    """A file with none of the candidate notebooks' questions: placed once the batch's notebooks are known."""

    grade: SubmissionGrade
    id_problem: str
    receipts: dict
    mentioned: set[str]


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
    assignment: str | list[str] | None = None,
) -> GradeRun:
    """Grade every submission under `paths`; write the CSV, the feedback files and the report.

    Args:
        paths: notebook files and folders of them.
        out_csv: the gradebook to write; the feedback folder and report go next to it. It must
            not be (or put the report or a feedback file on) a submission or the roster, and
            every output path must be writable: ValueError (`writing.OutputError`) before
            anything is written.
        notebooks: the notebooks handed out ("00" ... "08"); each file is graded as one of them
            and a student's total is out of all of them. Default: the notebooks the files are for,
            each student's total out of the notebooks they submitted for.
        roster: the LMS's students (`roster.read_roster`): `out_csv` is then written in its
            format (Canvas, Gradescope or Moodle, see `lms`; "csv" keeps the plain gradebook)
            and the report lists roster students with no submission and ids not on the roster.
        assignment: the score column's name in an LMS file (Canvas: "Name (assignment id)" to
            fill an existing assignment), or "NN=name" per notebook of a course; default
            "Quick checks NN" (see `lms.assignment_names`).

    Example:
        >>> run = grade(["submissions/"], "grades.csv")  # doctest: +SKIP
        >>> print(run.csv_path, len(run.unreadable))  # doctest: +SKIP
    """
    issued = _issued(notebooks)
    start = time.perf_counter()
    files, skipped = collect(paths)
    out_csv = Path(out_csv)
    feedback_dir = out_csv.with_name(f"{out_csv.stem}_feedback")
    report_path = out_csv.with_name(f"{out_csv.stem}_report.md")
    all_csv = out_csv.with_name(f"{out_csv.stem}_all.csv")  # with an LMS format: every file's row, as in csv
    lms_format = roster is not None and roster.fmt != "csv"
    names = feedback_names(files)
    outputs = [report_path, *([all_csv] if lms_format else []), *(feedback_dir / f"{n}.txt" for n in names)]
    _refuse_overwriting(files, out_csv, outputs, roster)
    writing.check_targets([out_csv, report_path, *([all_csv] if lms_format else [])], feedback_dir)
    results, waiting = [], []
    for path, name in zip(files, names):  # one file at a time: what it held is let go before the next
        result, wait = _grade_file(path, issued)
        result.feedback_name = name
        results.append(result)
        waiting += [wait] if wait else []
        show_graded(len(results), len(files))
    strays = Strays() if issued else set_aside_strays(results)  # only what was handed out makes columns
    batch = issued or sorted({s.notebook for s in results if s.notebook})
    for wait in waiting:
        _place(wait, batch)
    batch = issued or sorted({s.notebook for s in results if s.notebook})
    questions = _questions(batch)
    columns = lms.assignment_names(batch, assignment) if lms_format else {}  # ValueError before any write
    check = match_roster(results, roster) if roster else None
    texts = {}
    if lms_format:
        texts[out_csv] = lms.lms_text(lms.lms_rows(check, roster, batch, issued, columns))
        texts[all_csv] = gradebook.csv_text(results, questions)
    else:
        texts[out_csv] = gradebook.csv_text(results, questions)
    feedback = {s.feedback_name: gradebook.feedback_text(s) for s in results}
    run = GradeRun(results, skipped, out_csv, feedback_dir, report_path, 0.0, [], check, batch, issued, strays)

    def report(unwritten: list[tuple[str, str]]) -> str:
        by_name = {s.feedback_name: s.path for s in results}
        run.unwritten = [(by_name[name], why) for name, why in unwritten]
        run.seconds = time.perf_counter() - start
        return gradebook.report_text(run, questions) + "\n".join(lms.roster_section(check, roster))

    writing.write_batch(texts, feedback_dir, feedback, report_path, report)
    return run


def grade_submission(path: str | Path, notebooks: list[str] | None = None) -> SubmissionGrade:
    """Grade one file on its own (no CSV); never raises for a bad file."""
    issued = _issued(notebooks)
    result, wait = _grade_file(Path(path), issued)
    if wait:
        _place(wait, issued or [])
    return result


def _issued(notebooks: list[str] | None) -> list[str] | None:
    """The notebooks named, checked against the bank, sorted, each once; None when none are named."""
    if not notebooks:
        return None
    unknown = [nb for nb in notebooks if nb not in bank_notebooks()]
    if unknown:
        raise ValueError(f"notebook {unknown[0]!r} has no quick checks; the bank has {', '.join(bank_notebooks())}")
    return sorted(set(notebooks))


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
    path: Path, found: reading.Scan, damage: list[str], issued: list[str] | None
) -> tuple[SubmissionGrade, _Waiting | None]:
    mentioned = found.question_ids()
    notes = list(damage) + found.notes
    if not mentioned:
        where = "in the part of the file that could be read" if damage else "(deleted?)"
        notes.append(f"no quick-check cells found {where}; graded as unanswered")
    student_id, id_problem = reading.find_student_id(found)
    result = SubmissionGrade(path, "damaged" if damage else "graded", student_id=student_id, notes=notes)
    notebook, why = _which_notebook(path, mentioned, issued)
    if not notebook:
        return result, _Waiting(result, id_problem, found.receipts, mentioned)
    _grade_as(result, notebook, why, mentioned, found, id_problem)
    return result, None


def _which_notebook(path: Path, mentioned: set[str], candidates: list[str] | None) -> tuple[str, str]:
    """The one notebook a file is graded as, among `candidates` (default: every notebook in the bank),
    and a note when that was a close call; "" when none of its cells belongs to a candidate.

    The notebook most of its questions belong to: a cell pasted from another notebook is outvoted by
    the handout's own. A tie goes to the notebook number in the file's name, else the first.
    """
    candidates = candidates or bank_notebooks()
    counts = {nb: len(mentioned & _ids(nb)) for nb in candidates}
    top = max(counts.values(), default=0)
    if not top:
        return "", ""
    tied = [nb for nb in candidates if counts[nb] == top]
    if len(tied) == 1:
        return tied[0], ""
    named = _named_notebook(path, tied)
    if named:
        return named, ""
    return tied[0], (
        f"it holds as many quick checks of notebook {tied[0]} as of {', '.join(tied[1:])}: graded as "
        f"{tied[0]}; to grade it as another, grade it alone with --notebook NN"
    )


def _named_notebook(path: Path, candidates: list[str]) -> str:
    """The one candidate notebook number in the file's name (`..._03_gradient_checkpointing.ipynb`), else ""."""
    numbers = set(re.findall(r"(?<!\d)(\d\d)(?!\d)", path.name)) & set(candidates)
    return numbers.pop() if len(numbers) == 1 else ""


def _place(wait: _Waiting, batch: list[str]) -> None:
    """Grade a file that mentions none of the batch's questions once the batch is known: the batch's one
    notebook, else the one its name gives; else it is not scored, and its row says why."""
    result = wait.grade
    notebook = batch[0] if len(batch) == 1 else _named_notebook(result.path, batch)
    if notebook:
        _grade_as(result, notebook, "", wait.mentioned, reading.Scan(receipts=wait.receipts), wait.id_problem)
        return
    result.notes.append(
        "could not tell which notebook it is (none of its cells is a quick check of "
        f"{', '.join(batch) or 'any notebook'} and its name holds no notebook number): not scored; "
        "grade it alone with --notebook NN"
    )
    _note_foreign(result, wait.mentioned, set())


def _grade_as(
    result: SubmissionGrade, notebook: str, why: str, mentioned: set[str], found: reading.Scan, id_problem: str
) -> None:
    result.notebook = notebook
    if why:
        result.notes.append(why)
    _note_foreign(result, mentioned, _ids(notebook))
    _add_questions(result, load_bank(notebook), found, id_problem)


def _note_foreign(result: SubmissionGrade, mentioned: set[str], own: set[str]) -> None:
    """Questions the file mentions that are not its notebook's: kept on the row, never scored."""
    result.foreign = sorted(q for q in mentioned if q not in own)
    if not result.foreign:
        return
    listing = ", ".join(shown(q, 40) for q in result.foreign[:5]) + (
        f" and {len(result.foreign) - 5:,} more" if len(result.foreign) > 5 else ""
    )
    where = f"notebook {result.notebook}'s questions" if result.notebook else "a graded notebook's questions"
    result.notes.append(
        f"mentions {listing}, which {'is' if len(result.foreign) == 1 else 'are'} not among {where} "
        "(a cell from another notebook, or a typo in the id): reported, not scored"
    )


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


def _ids(notebook: str) -> set[str]:
    return {q.id for q in load_bank(notebook)}
