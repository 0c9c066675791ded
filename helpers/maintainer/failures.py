"""What stopped a notebook, in words: the cause, the cell it stopped in, and a few KB of its error.

Used by `python -m helpers run` (`execution.execute`) for each failed row. What is written here is
copied three times, into summary.md, summary.json and the terminal, so:

- each part a notebook controls (the error's message, the cell, the traceback) is cut to a few
  KB, saying where and of how many characters, and pointing to the executed notebook, which keeps
  the whole text in the cell's output;
- what is shown is printable (`printable`): ANSI colours dropped, other control characters
  written as escapes (`\\x1b`, `\\r`), so an error can neither clear nor rewrite the terminal.
"""

from __future__ import annotations

import json
import re
import traceback
from pathlib import Path

from helpers._util import NotRegularFile, read_regular_file
from helpers.quickcheck.escaping import shown

__all__ = ["MAX_ERROR_CHARS", "describe_failure", "printable"]

# characters kept of each part of an error before it is cut (the whole stays in the executed notebook)
MESSAGE_CHARS, SOURCE_CHARS, TRACEBACK_CHARS = 1000, 1500, 1500
MAX_ERROR_CHARS = 6000  # of the whole description, the parts above and their headings included
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_failure(path: Path, executed: Path, e: Exception, cell_timeout: float) -> str:
    """What stopped the notebook at `path`, with the cell it stopped in; every part capped, printable.

    `executed` is the executed copy papermill wrote; `cell_timeout` the --cell-timeout in force.
    """
    return printable(_cut(_describe(path, executed, e, cell_timeout), MAX_ERROR_CHARS, executed))


def printable(text: str) -> str:
    """`text` with its lines kept, ANSI colours dropped and other control characters as escapes (\\x1b)."""
    return "\n".join(shown(line, len(line)) for line in ANSI.sub("", text).split("\n"))


def _describe(path: Path, executed: Path, e: Exception, cell_timeout: float) -> str:
    import nbformat
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    if isinstance(e, pm.PapermillExecutionError):
        tb = ANSI.sub("", "\n".join(e.traceback[-8:]))
        return (
            f"{path.name}: cell {e.exec_count} failed with {e.ename}: {_cut(e.evalue, MESSAGE_CHARS, executed)}\n"
            f"  the cell:\n{_indent(_cut(e.source, SOURCE_CHARS, executed))}\n"
            f"  traceback (last lines):\n{_cut(tb, TRACEBACK_CHARS, executed)}"
        )
    if isinstance(e, NotRegularFile):
        return (
            f"{e}: the runner opens only regular files (opening a named pipe waits for a writer, reading a "
            f"device may never end). Put the notebook itself at {path}, or move this out of {path.parent}."
        )
    if isinstance(e, DeadKernelError):
        return (
            f"{path.name}: the kernel died while running a cell (killed, or crashed: most often the system "
            "killed it for using more memory than the machine has; lower per_device_batch or seq_len)"
            f"{_last_cell(executed)}"
        )
    if isinstance(e, CellTimeoutError):
        return (
            f"{path.name}: a cell ran past --cell-timeout ({cell_timeout:g} s) and was stopped; if it is "
            f"only slow on this machine, pass a larger --cell-timeout{_last_cell(executed)}"
        )
    if isinstance(e, (nbformat.reader.NotJSONError, nbformat.ValidationError, json.JSONDecodeError)):
        return (
            f"{path.name} is not a valid notebook ({type(e).__name__}: {_first_line(e)}). Rebuild it from "
            "notebooks/src with `python -m helpers notebooks`, or restore it with git."
        )
    tb = _cut("".join(traceback.format_exception(e)[-6:]), TRACEBACK_CHARS)
    return f"{path.name}: the run stopped with {type(e).__name__}: {_first_line(e)}\n  traceback (last lines):\n{tb}"


def _cut(text: str, limit: int, whole: Path | None = None) -> str:
    """`text` up to `limit` characters; past that, where it was cut, of how many, and where the whole is."""
    if len(text) <= limit:
        return text
    kept = f"the whole is in the executed notebook {whole}" if whole else "the rest is not kept"
    return f"{text[:limit]}\n  [cut at character {limit:,} of {len(text):,}: {kept}]"


def _last_cell(executed: Path) -> str:
    """The cell that was running when the notebook stopped: the last one papermill started."""
    import nbformat

    try:
        cells = nbformat.reads(read_regular_file(executed), as_version=4).cells
    except (OSError, ValueError):  # not written yet: it stopped before the first cell
        return ""
    started = [(i, c) for i, c in enumerate(cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    if not started:
        return ""
    index, cell = started[-1]
    return f"\n  the cell (number {index + 1} of {len(cells)}):\n{_indent(_cut(cell.source, SOURCE_CHARS, executed))}"


def _indent(source: str) -> str:
    return "\n".join("    " + line for line in source.splitlines())


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:300] if lines else ""
