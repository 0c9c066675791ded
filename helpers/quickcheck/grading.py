"""Grade a batch of submitted notebooks: `python -m helpers.quickcheck grade SUBMISSION... --out grades.csv`.

No student code runs: each notebook's answers are read from the text of its cells (`reading`)
and judged by the same rule `check()` uses (`judging`). Every file gets a row, whatever state it
is in; one bad file never stops the batch. Next to the CSV it writes:

    grades.csv            one row per submission: file, student_id, status, points per question,
                          total, max_points, attempts per question, notes
    grades_feedback/      one text file per submission, for the student: result, hint or
                          explanation per question (never the right answer to a missed question)
    grades_report.md      for the instructor: files that could not be read and why, damaged files,
                          missing or shared student ids, and how the class did on each question

Which questions: those of the notebooks a submission's cells mention (q04_* -> notebook 04), or
`notebooks=["04"]` to fix them. A submission whose quick-check cells were all deleted is graded
on the batch's notebooks and gets zeros with a note.

Longer than 400 lines because one pass over the submissions writes the rows, the feedback files
and the report together: a file that is read once can't disagree with itself across outputs.
"""

from __future__ import annotations

import csv
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from helpers.quickcheck import reading
from helpers.quickcheck.bank import Question, bank_notebooks, load_bank
from helpers.quickcheck.judging import CORRECT, INVALID, NEEDS_ID, UNANSWERED, WRONG, judge

__all__ = [
    "LABELS",
    "MISSING",
    "UNREADABLE",
    "GradeRun",
    "QuestionGrade",
    "SubmissionGrade",
    "collect",
    "feedback_text",
    "grade",
    "grade_submission",
    "report_text",
]

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
_SKIP_DIRS = {"__MACOSX", ".ipynb_checkpoints"}


@dataclass
class QuestionGrade:
    question_id: str
    status: str  # one of LABELS
    points: float
    max_points: float
    attempts: int | None  # from the receipts in the outputs; None when there are none
    message: str  # hint, explanation, or what went wrong
    notes: list[str] = field(default_factory=list)


@dataclass
class SubmissionGrade:
    path: Path
    status: str  # "graded", "damaged" (read what survived) or "unreadable"
    reason: str = ""  # why unreadable
    student_id: str = ""
    questions: dict[str, QuestionGrade] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    feedback_name: str = ""

    @property
    def total(self) -> float:
        return sum(g.points for g in self.questions.values())

    @property
    def max_points(self) -> float:
        return sum(g.max_points for g in self.questions.values())


@dataclass
class GradeRun:
    """What `grade` did, for the command line and the tests."""

    submissions: list[SubmissionGrade]
    skipped: list[tuple[Path, str]]
    csv_path: Path
    feedback_dir: Path
    report_path: Path
    seconds: float

    @property
    def unreadable(self) -> list[SubmissionGrade]:
        return [s for s in self.submissions if s.status == "unreadable"]


@dataclass
class _Read:
    path: Path
    scan: reading.Scan | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)


def collect(paths: list[str | Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The submissions to grade, and files skipped inside folders (with why).

    A file named on the command line is always graded (it gets a row even when it is not a
    notebook); inside a folder, only *.ipynb files are, and hidden files, `__MACOSX` and
    `.ipynb_checkpoints` are passed over.
    """
    files, skipped, seen = [], [], set()
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                parts = f.relative_to(p).parts
                if any(part.startswith(".") or part in _SKIP_DIRS for part in parts) or not f.is_file():
                    continue
                if f.suffix.lower() == ".ipynb":
                    candidates = [f]
                else:
                    skipped.append((f, "not a .ipynb file"))
                    candidates = []
                for c in candidates:
                    if c.resolve() not in seen:
                        seen.add(c.resolve())
                        files.append(c)
        elif p.resolve() not in seen:
            seen.add(p.resolve())
            files.append(p)
    return files, skipped


def grade(
    paths: list[str | Path], out_csv: str | Path = "grades.csv", *, notebooks: list[str] | None = None
) -> GradeRun:
    """Grade every submission under `paths`; write the CSV, the feedback files and the report.

    Args:
        paths: notebook files and folders of them.
        out_csv: the gradebook to write; the feedback folder and report go next to it.
        notebooks: grade these notebooks' questions ("00" ... "08"); default: the ones the
            submissions mention.

    Example:
        >>> run = grade(["submissions/"], "grades.csv")  # doctest: +SKIP
        >>> print(run.csv_path, len(run.unreadable))  # doctest: +SKIP
    """
    unknown = [nb for nb in notebooks or [] if nb not in bank_notebooks()]
    if unknown:
        raise ValueError(f"notebook {unknown[0]!r} has no quick checks; the bank has {', '.join(bank_notebooks())}")
    start = time.perf_counter()
    files, skipped = collect(paths)
    reads = [_read(f) for f in files]
    batch = notebooks or sorted(
        {qid[1:3] for r in reads if r.scan for qid in r.scan.question_ids()} & set(bank_notebooks())
    )
    results = [_grade(r, batch, fixed=bool(notebooks)) for r in reads]
    _name_feedback_files(results)
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    feedback_dir = out_csv.with_name(f"{out_csv.stem}_feedback")
    report_path = out_csv.with_name(f"{out_csv.stem}_report.md")
    questions = [
        q for nb in sorted({nb for s in results for nb in _notebooks_of(s)} | set(batch)) for q in load_bank(nb)
    ]
    _write_csv(results, questions, out_csv)
    feedback_dir.mkdir(exist_ok=True)
    for s in results:
        (feedback_dir / f"{s.feedback_name}.txt").write_text(feedback_text(s), encoding="utf-8")
    seconds = time.perf_counter() - start
    run = GradeRun(results, skipped, out_csv, feedback_dir, report_path, seconds)
    report_path.write_text(report_text(run, questions), encoding="utf-8")
    return run


def grade_submission(path: str | Path, notebooks: list[str] | None = None) -> SubmissionGrade:
    """Grade one file on its own (no CSV); never raises for a bad file."""
    return _grade(_read(Path(path)), notebooks or [], fixed=bool(notebooks))


def feedback_text(s: SubmissionGrade) -> str:
    """The feedback file for one submission, written for the student."""
    lines = [f"Quick checks: {s.path.name}"]
    if s.status == "unreadable":
        return "\n".join(lines + ["", f"This file could not be graded: {s.reason}.", ""])
    lines += [
        f"Student id: {s.student_id or '(none: set student_id in the notebook)'}",
        f"Score: {s.total:g} / {s.max_points:g}",
        "",
    ]
    for g in s.questions.values():
        lines.append(f"{g.question_id}: {LABELS[g.status]}, {g.points:g}/{g.max_points:g}")
        if g.message:
            prefix = "Hint: " if g.status == WRONG else ""
            lines.append(f"    {prefix}{g.message}")
    notes = s.notes + [n for g in s.questions.values() for n in g.notes]
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def report_text(run: GradeRun, questions: list[Question]) -> str:
    """The instructor's report: what could not be read, problems, ids, and results per question."""
    subs = run.submissions
    damaged = [s for s in subs if s.status == "damaged"]
    lines = [
        "# Quick-check grading report",
        "",
        f"{len(subs)} submissions in {run.seconds:.1f} s: {len(subs) - len(run.unreadable) - len(damaged)} read, "
        f"{len(damaged)} damaged but graded, {len(run.unreadable)} could not be read.",
        "",
    ]
    if run.unreadable:
        lines += [f"## Could not read ({len(run.unreadable)})", ""]
        lines += [f"- `{s.path}`: {s.reason}" for s in run.unreadable] + [""]
    with_notes = [
        s for s in subs if s.status != "unreadable" and (s.notes or any(g.notes for g in s.questions.values()))
    ]
    if with_notes:
        lines += [f"## Read, with notes ({len(with_notes)})", ""]
        for s in with_notes:
            notes = s.notes + [f"{g.question_id}: {n}" for g in s.questions.values() for n in g.notes]
            lines.append(f"- `{s.path}`: " + "; ".join(notes))
        lines.append("")
    if run.skipped:
        lines += [f"## Skipped in folders ({len(run.skipped)})", ""]
        lines += [f"- `{p}`: {why}" for p, why in run.skipped] + [""]
    readable = [s for s in subs if s.status != "unreadable"]
    no_id = [s for s in readable if not s.student_id]
    by_id = defaultdict(list)
    for s in readable:
        if s.student_id:
            by_id[s.student_id.casefold()].append(s)
    shared = {k: v for k, v in by_id.items() if len(v) > 1}
    if no_id or shared:
        lines += ["## Student ids", ""]
        if no_id:
            lines.append(f"- no student id ({len(no_id)}): " + ", ".join(f"`{s.path.name}`" for s in no_id))
        for _, group in sorted(shared.items()):
            lines.append(
                f"- id `{group[0].student_id}` in {len(group)} submissions: " + ", ".join(f"`{s.path}`" for s in group)
            )
        lines.append("")
    if questions and readable:
        lines += [
            "## Questions",
            "",
            "| question | points | correct | not yet | not answered | other | mean attempts |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for q in questions:
            grades = [s.questions[q.id] for s in readable if q.id in s.questions]
            count = Counter(g.status for g in grades)
            attempts = [g.attempts for g in grades if g.attempts]
            mean = f"{sum(attempts) / len(attempts):.1f}" if attempts else "-"
            other = len(grades) - count[CORRECT] - count[WRONG] - count[UNANSWERED]
            lines.append(
                f"| {q.id} | {q.points:g} | {count[CORRECT]} | {count[WRONG]} | {count[UNANSWERED]} "
                f"| {other} | {mean} |"
            )
        lines.append("")
    return "\n".join(lines)


def _read(path: Path) -> _Read:
    try:
        cells, notes = reading.load_cells(path)
        return _Read(path, reading.scan(cells), notes=notes)
    except reading.NotANotebook as e:
        return _Read(path, error=str(e))
    except Exception as e:  # a file this module did not foresee: report it, keep grading the others
        return _Read(path, error=f"the grader failed on it ({type(e).__name__}: {e}); please report this file")


def _grade(r: _Read, batch: list[str], *, fixed: bool) -> SubmissionGrade:
    if r.error:
        return SubmissionGrade(r.path, "unreadable", reason=r.error)
    try:
        return _grade_scan(r, batch, fixed=fixed)
    except Exception as e:  # never let one submission stop the batch
        return SubmissionGrade(
            r.path, "unreadable", reason=f"the grader failed on it ({type(e).__name__}: {e}); please report this file"
        )


def _grade_scan(r: _Read, batch: list[str], *, fixed: bool) -> SubmissionGrade:
    scan = r.scan
    mentioned = scan.question_ids()
    banks = set(bank_notebooks())
    own = sorted({qid[1:3] for qid in mentioned} & banks)
    graded_nbs = batch if fixed or not own else own
    notes = list(r.notes) + scan.notes
    if not mentioned:
        where = "in the part of the file that could be read" if r.notes else "(deleted?)"
        notes.append(f"no quick-check cells found {where}; graded as unanswered")
    questions = [q for nb in graded_nbs for q in load_bank(nb)]
    known = {q.id for q in questions}
    stray = sorted(qid for qid in mentioned if qid not in known)
    if stray:
        notes.append(
            f"mentions {', '.join(stray)}, which {'is' if len(stray) == 1 else 'are'} not among the graded "
            "questions (a typo in the id, or another notebook)"
        )
    student_id, id_problem = reading.find_student_id(scan)
    if id_problem and any(q.personal for q in questions):
        notes.append(id_problem)
    result = SubmissionGrade(r.path, "damaged" if r.notes else "graded", student_id=student_id, notes=notes)
    for q in questions:
        result.questions[q.id] = _grade_question(q, scan, student_id)
    return result


def _grade_question(q: Question, scan: reading.Scan, student_id: str) -> QuestionGrade:
    found = reading.find_answer(scan, q.id)
    receipts = scan.receipts.get(q.id, [])
    attempts = max((a for a, _ in receipts), default=None)
    if found.value is reading.MISSING:
        status = MISSING if found.cell is None else UNREADABLE
        return QuestionGrade(q.id, status, 0, q.points, attempts, found.problem, found.notes)
    verdict = judge(q, found.value, student_id)
    notes = list(found.notes)
    if verdict.status == NEEDS_ID:
        message = "student_id is empty, so this question's numbers are unknown: it needs your id to be graded"
    else:
        message = verdict.message
    result = "correct" if verdict.status == CORRECT else "not yet"
    if verdict.status in (CORRECT, WRONG) and receipts and result not in {r for _, r in receipts}:
        notes.append(
            f"graded {LABELS[verdict.status]}, but no receipt in the notebook says so: the answer was "
            "edited after its last check, or the notebook was not re-run"
        )
    return QuestionGrade(q.id, verdict.status, verdict.points, q.points, attempts, message, notes)


def _notebooks_of(s: SubmissionGrade) -> set[str]:
    return {qid[1:3] for qid in s.questions}


def _name_feedback_files(results: list[SubmissionGrade]) -> None:
    """A unique, readable file name per submission: its stem, prefixed by its folders when stems repeat."""
    stems = Counter(s.path.stem for s in results)
    used = set()
    for s in results:
        name = s.path.stem
        if stems[name] > 1:
            name = "__".join([*s.path.parent.parts[-2:], s.path.stem]).replace("/", "_").lstrip("._") or "submission"
        base, n = name, 2
        while name in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        s.feedback_name = name


def _write_csv(results: list[SubmissionGrade], questions: list[Question], path: Path) -> None:
    ids = [q.id for q in questions]
    header = ["file", "student_id", "status", *ids, "total", "max_points", *(f"attempts_{i}" for i in ids), "notes"]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for s in results:
            if s.status == "unreadable":
                writer.writerow(
                    [_cell(str(s.path)), "", "unreadable", *[""] * len(ids), 0, "", *[""] * len(ids), _cell(s.reason)]
                )
                continue
            points = [_num(s.questions[i].points) if i in s.questions else "" for i in ids]
            attempts = [s.questions[i].attempts if i in s.questions and s.questions[i].attempts else "" for i in ids]
            problems = [
                f"{g.question_id} {LABELS[g.status]}"
                for g in s.questions.values()
                if g.status in (UNREADABLE, MISSING, INVALID, NEEDS_ID)
            ]
            writer.writerow(
                [
                    _cell(str(s.path)),
                    _cell(s.student_id),
                    s.status,
                    *points,
                    _num(s.total),
                    _num(s.max_points),
                    *attempts,
                    _cell("; ".join(s.notes[:2] + problems)),
                ]
            )


def _cell(text: str) -> str:
    """Text a spreadsheet shows as text: a student id like =HYPERLINK(...) must not become a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def _num(x: float) -> int | float:
    return int(x) if float(x).is_integer() else round(x, 3)
