"""Write a graded batch's files after checking every path, whole or not at all, feedback fresh each run.

Used by `python -m helpers.quickcheck grade` (`grading.grade`). Grading 200 notebooks must never
end in a traceback halfway through writing, with last week's grades half replaced:

1. `check_targets`, before any file is graded: a folder where a file goes, a file where the
   feedback folder goes, a parent that is a file, each refused with the path and the fix.
2. `write_batch`: the gradebook and the report are written to temporary names beside them (the
   first write proves each folder writable), the feedback files into their folder, and only then
   are the temporary files renamed over their targets. A failure (a read-only folder, a full
   disk) removes the temporary files and raises `OutputError`: the previous gradebook and report
   are left as they were.
3. The feedback folder is written fresh: a file the previous run wrote that this run did not (a
   withdrawn student's) is removed, found through the list each run leaves beside the folder
   (`.grades_feedback.list` for grades_feedback/, so the folder holds only what students get); a file
   the grader did not write is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from helpers.quickcheck.escaping import shown, shown_path

__all__ = ["OutputError", "check_targets", "manifest_of", "write_batch"]


class OutputError(ValueError):
    """An output path that cannot be written; the message names it and what to do."""


def check_targets(files: list[Path], feedback_dir: Path) -> None:
    """Refuse, before grading, output paths that cannot be written as what they must be."""
    for path in files:
        if path.is_dir():
            raise OutputError(
                f"{shown_path(path)} is a folder, and the grader writes a file there: give --out a file name, "
                f"e.g. --out {shown_path(path / 'grades.csv')}, or move the folder"
            )
    if feedback_dir.exists() and not feedback_dir.is_dir():
        raise OutputError(
            f"{shown_path(feedback_dir)} is a file, and the grader writes the students' feedback into a folder "
            "of that name: move the file, or name --out differently"
        )
    for folder in {p.parent for p in [*files, feedback_dir]}:
        blocker = next((f for f in [folder, *folder.parents] if f.exists() and not f.is_dir()), None)
        if blocker is not None:
            raise OutputError(
                f"cannot write into {shown_path(folder)}: {shown_path(blocker)} is a file, not a folder; "
                "give --out a path in a folder"
            )


def write_batch(
    texts: dict[Path, str],
    feedback_dir: Path,
    feedback: dict[str, str],
    report_path: Path,
    report: Callable[[list[tuple[str, str]]], str],
) -> None:
    """Write `texts` (path -> content), the feedback files (`name` -> text, as name.txt) and the
    report (`report(unwritten)`, told which feedback files failed), as the module docstring says.

    Raises:
        OutputError: a file could not be written; the earlier gradebook and report are unchanged.
    """
    staged: dict[Path, Path] = {}
    try:
        for path in [*texts, report_path, manifest_of(feedback_dir)]:  # each folder proved writable first
            path.parent.mkdir(parents=True, exist_ok=True)
            staged[path] = path.with_name(f".{path.name}.tmp")
            staged[path].write_text("", encoding="utf-8")
        for path, text in texts.items():
            staged[path].write_text(text, encoding="utf-8")
        unwritten, written = _write_feedback(feedback_dir, feedback)
        staged[manifest_of(feedback_dir)].write_text("".join(f"{n}\n" for n in written), encoding="utf-8")
        staged[report_path].write_text(report(unwritten), encoding="utf-8")
        for path, tmp in staged.items():
            os.replace(tmp, path)
    except OSError as e:
        where = e.filename or next(iter(staged), report_path)
        raise OutputError(
            f"could not write {shown_path(where)} ({shown(e.strerror or type(e).__name__)}): nothing was "
            "replaced; free some space or choose a writable folder with --out"
        ) from None
    finally:
        for tmp in staged.values():
            Path(tmp).unlink(missing_ok=True)


def manifest_of(feedback_dir: Path) -> Path:
    """The list of the feedback files the last run wrote, one name per line, beside the folder."""
    return feedback_dir.with_name(f".{feedback_dir.name}.list")


def _write_feedback(folder: Path, feedback: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Write each name.txt; remove those the last run wrote that this one does not.

    Returns (name, why) of each file that could not be written, and the file names written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    manifest = manifest_of(folder)
    try:
        before = set(manifest.read_text(encoding="utf-8").split("\n")) - {""}
    except (FileNotFoundError, UnicodeDecodeError):
        before = set()
    failed, written = [], []
    for name, text in feedback.items():
        try:
            (folder / f"{name}.txt").write_text(text, encoding="utf-8")
            written.append(f"{name}.txt")
        except OSError as e:
            failed.append((name, e.strerror or type(e).__name__))
    for stale in sorted(before - set(written)):
        if "/" not in stale and stale.endswith(".txt") and not stale.startswith("."):  # only a name this module writes
            (folder / stale).unlink(missing_ok=True)
    return failed, written
