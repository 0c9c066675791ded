"""From a submitted file to its code cells, within the limits of `limits`, never running any of it.

Used by `python -m helpers.quickcheck grade` (`grading`) for every file it grades:

1. `load_cells` opens the file without following a link and without blocking (a FIFO, a device),
   refuses anything that is not a regular file or is over `MAX_FILE_BYTES`, and reads at most that.
   A notebook of more than `MAX_JSON_VALUES` JSON objects, lists and strings (estimated from
   its brackets and quotes before parsing) or numbers (counted while parsing), or of more than
   `MAX_CELLS` code cells, is refused.
2. `parse_notebook` refuses what is not a notebook (a PDF, an HTML export, a script), with the
   reason and the fix, and never converts a JSON number of more than 20 digits. Damaged JSON is
   salvaged: a cut-off file keeps the cells before the cut; extra text after a complete notebook
   is ignored and said (not called "cut off").

Errors are `NotANotebook`, whose message completes "could not be graded: ..." for the student.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from helpers.quickcheck.limits import MAX_CELLS, MAX_FILE_BYTES, MAX_JSON_VALUES
from helpers.quickcheck.reading import Cell

__all__ = ["NotANotebook", "load_cells", "parse_notebook"]

_BINARY = {
    b"%PDF": "a PDF",
    b"PK\x03\x04": "a zip archive",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"\xd0\xcf\x11\xe0": "an old Office document",
}
_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFSOCK: "a socket",
}
_CLEAR_OUTPUTS = "clear its outputs (Edit > Clear all outputs), save, and submit the .ipynb again"


class NotANotebook(ValueError):
    """A file the grader cannot read as a notebook; the message says why and what the student can do."""


def load_cells(path: str | Path) -> tuple[list[Cell], list[str]]:
    """The code cells of a notebook file, and notes about damage that was worked around."""
    return parse_notebook(_read_regular_file(Path(path)))


def parse_notebook(data: bytes) -> tuple[list[Cell], list[str]]:
    """`load_cells` for bytes already read."""
    text = _notebook_text(data)
    # objects, lists and strings, estimated from brackets and quotes; numbers are counted while parsing
    values = text.count("[") + text.count("{") + (text.count('"') - text.count('\\"')) // 2
    if values > MAX_JSON_VALUES:
        raise _too_many(values)
    decoder = _decoder()
    try:
        nb = decoder.decode(text)
    except json.JSONDecodeError as e:
        return _salvage(text, e, decoder)
    except RecursionError:
        raise NotANotebook("its JSON is nested too deeply to read") from None
    return _cells_of(nb), []


class _Numbers:
    """json's number hooks, counting: past MAX_JSON_VALUES numbers the file is refused, mid-parse."""

    def __init__(self):
        self.count = 0

    def integer(self, digits: str) -> int | str:
        self._count()  # an integer of more than 20 digits stays text: converting it costs time, and none is needed
        return int(digits) if len(digits) <= 20 else digits

    def decimal(self, digits: str) -> float:
        self._count()
        return float(digits)

    def _count(self) -> None:
        self.count += 1
        if self.count > MAX_JSON_VALUES:
            raise _too_many(self.count)


def _decoder() -> json.JSONDecoder:
    numbers = _Numbers()
    return json.JSONDecoder(parse_int=numbers.integer, parse_float=numbers.decimal)


def _too_many(values: int) -> NotANotebook:
    return NotANotebook(
        f"it holds more JSON values than the grader reads (over {MAX_JSON_VALUES:,}, about {values:,} found): "
        + _CLEAR_OUTPUTS
    )


def _read_regular_file(path: Path) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP or path.is_symlink():
            raise NotANotebook(
                "it is a symbolic link; the grader reads only regular files: put the file itself in the folder"
            ) from None
        raise NotANotebook(f"cannot open it ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            kind = _KINDS.get(stat.S_IFMT(info.st_mode), "something else")
            raise NotANotebook(f"it is {kind}, not a regular file; submit the .ipynb file")
        if info.st_size > MAX_FILE_BYTES:
            raise _too_large(info.st_size)
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(len(data))
    return data


def _too_large(size: int) -> NotANotebook:
    return NotANotebook(
        f"it is {size / 2**20:,.0f} MB, above the grader's limit of {MAX_FILE_BYTES / 2**20:.0f} MB: {_CLEAR_OUTPUTS}"
    )


def _notebook_text(data: bytes) -> str:
    if not data.strip():
        raise NotANotebook(
            "the file is empty: download the notebook again (File > Download > Download .ipynb) and submit that file"
        )
    for magic, what in _BINARY.items():
        if data.startswith(magic):
            raise NotANotebook(
                f"it is {what}, not a notebook: submit the .ipynb file (Colab: File > Download > Download .ipynb)"
            )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise NotANotebook("it is not text (a binary file); submit the .ipynb file") from None
    head = text.lstrip()[:200].lower()
    if head.startswith("<"):
        raise NotANotebook(
            "it is an HTML page (a notebook exported or saved from the browser), not the .ipynb: "
            "in Colab use File > Download > Download .ipynb"
        )
    if not head.startswith(("{", "[")):
        kind = "a Python script" if re.search(r"^\s*(#|import |from |def |print\()", head) else "plain text"
        raise NotANotebook(
            f"it is {kind}, not a notebook (.ipynb files are JSON starting with '{{'): submit the .ipynb file"
        )
    return text


def _cells_of(nb: Any) -> list[Cell]:
    if not isinstance(nb, dict):
        raise NotANotebook(f"it is JSON, but a {type(nb).__name__}, not a notebook: submit the .ipynb file")
    raw_cells = nb.get("cells")
    if raw_cells is None and isinstance(nb.get("worksheets"), list):  # nbformat 3 (very old Jupyter)
        raw_cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) for c in ws.get("cells", [])]
    if not isinstance(raw_cells, list):
        raise NotANotebook('it is JSON but not a notebook (no "cells" list): submit the .ipynb file')
    code = [
        (number, raw)
        for number, raw in enumerate(raw_cells, 1)
        if isinstance(raw, dict) and raw.get("cell_type") == "code"
    ]
    if len(code) > MAX_CELLS:
        raise NotANotebook(
            f"it has {len(code):,} code cells, more than the grader reads ({MAX_CELLS:,}): "
            "submit the notebook as downloaded, with its quick-check cells"
        )
    return [
        Cell(n, _text(raw.get("source", raw.get("input", ""))), _receipt_text(raw.get("outputs"))) for n, raw in code
    ]


def _salvage(text: str, error: json.JSONDecodeError, decoder: json.JSONDecoder) -> tuple[list[Cell], list[str]]:
    """Grade a complete notebook followed by extra text; else keep the complete cells before the damage."""
    if error.msg == "Extra data":
        nb, _ = decoder.raw_decode(text, len(text) - len(text.lstrip()))
        where = f"line {error.lineno}, column {error.colno}"
        return _cells_of(nb), [f"damaged file: extra text after the end of the notebook ({where}), ignored"]
    cut_off = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string")
    why = (
        f"the file is cut off after {len(text.encode()):,} bytes (an interrupted upload or download)"
        if cut_off
        else f"invalid JSON at line {error.lineno}, column {error.colno} ({error.msg})"
    )
    start = re.search(r'"cells"\s*:\s*\[', text)
    raw_cells = []
    if start:
        pos = start.end()
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            try:
                cell, pos = decoder.raw_decode(text, pos)
            except (json.JSONDecodeError, RecursionError):
                break
            if not isinstance(cell, dict):
                break
            raw_cells.append(cell)
    if not raw_cells:
        raise NotANotebook(f"{why}; no cell could be recovered: download the notebook again and resubmit")
    cells = _cells_of({"cells": raw_cells})
    return cells, [f"damaged file: {why}; graded the {len(raw_cells)} cells before the damage"]


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "".join(v if isinstance(v, str) else str(v) for v in value)
    return value if isinstance(value, str) else ""


def _receipt_text(outputs: Any) -> str:
    if not isinstance(outputs, list):
        return ""
    parts = []
    for out in outputs:
        if not isinstance(out, dict):
            continue
        parts.append(_text(out.get("text", "")))
        data = out.get("data")
        if isinstance(data, dict):
            parts.append(_text(data.get("text/plain", "")))
    text = "\n".join(parts)
    return text if "receipt q" in text else ""
