"""Read a submitted notebook's answers from the text of its cells, without running any of it.

`python -m helpers.quickcheck grade` uses this module (and so does `check()` in notebooks 00 ... 08,
to warn when the grader would read something else):

1. `load_cells` turns a file into code cells, or raises `NotANotebook` with the reason and the fix.
   Damaged JSON (a cut-off upload, a stray edit) is salvaged: the cells before the damage are kept.
2. `scan` parses each cell with `ast` (IPython magics blanked) and collects the top-level
   assignments, the `check("q00_1", ...)` calls and the receipts in the outputs.
3. `find_answer` decides what the student answered: the variable passed to the last
   `check("q00_1", name)` call (`answer_q00_1` when there is none), its last assignment that
   gives an answer (a later `= None` left by a duplicated cell does not erase it), read with
   `safe_eval.read_value`: literals and arithmetic only, never a name or a call.

Cells are identified by their position in the notebook (1-based in every message, as a person
counts them), so reordered, duplicated and deleted cells are read as they stand in the file.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from helpers.quickcheck.judging import RECEIPT
from helpers.quickcheck.safe_eval import Unreadable, read_value

__all__ = [
    "MARKER",
    "MISSING",
    "STUDENT_ID",
    "Assignment",
    "Cell",
    "CheckCall",
    "Found",
    "NotANotebook",
    "Scan",
    "find_answer",
    "find_student_id",
    "load_cells",
    "parse_notebook",
    "scan",
]

MARKER = re.compile(r"^\s*#\s*QUICK CHECK\s+(\S+)", re.I | re.M)
STUDENT_ID = "student_id"
_MAGIC = re.compile(r"^(\s*)([%!].*|[\w.]+\?\??\s*)$")  # %time, !pip, obj? (IPython, not Python)
_BINARY = {
    b"%PDF": "a PDF",
    b"PK\x03\x04": "a zip archive",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"\xd0\xcf\x11\xe0": "an old Office document",
}
MISSING = object()


class NotANotebook(ValueError):
    """A file the grader cannot read as a notebook; the message says why and what the student can do."""


@dataclass
class Cell:
    number: int  # 1-based position in the notebook
    source: str
    outputs: str = ""  # text of the outputs that hold receipts, else ""


@dataclass
class Assignment:
    cell: int
    line: int
    node: ast.expr | None  # the assigned expression; None when `problem` says why it cannot be read
    problem: str = ""

    @property
    def position(self) -> tuple[int, int]:
        return self.cell, self.line

    def read(self) -> tuple[Any, str]:
        """(value, "") or (MISSING, why it cannot be read)."""
        if self.problem:
            return MISSING, self.problem
        try:
            return read_value(self.node), ""
        except Unreadable as e:
            return MISSING, f"it {e}"
        except RecursionError:
            return MISSING, "it is nested too deeply to read"


@dataclass
class CheckCall:
    cell: int
    line: int
    arg: ast.expr | None  # the answer argument; None when the call has none


@dataclass
class Scan:
    """What `scan` found in a notebook's code cells."""

    assignments: dict[str, list[Assignment]] = field(default_factory=dict)
    calls: dict[str, list[CheckCall]] = field(default_factory=dict)
    markers: dict[str, list[int]] = field(default_factory=dict)
    receipts: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # qid -> [(attempt, result)]
    notes: list[str] = field(default_factory=list)

    def question_ids(self) -> set[str]:
        """Every question id the notebook mentions: markers, check calls, answer_q.. variables."""
        ids = set(self.markers) | set(self.calls)
        ids |= {name[len("answer_") :] for name in self.assignments if name.startswith("answer_q")}
        return {i for i in ids if re.fullmatch(r"q\d\d_[A-Za-z0-9]+", i)}


@dataclass
class Found:
    """The answer `find_answer` located: value (MISSING when none could be read), where, and why not."""

    value: Any = MISSING
    cell: int | None = None
    problem: str = ""  # why there is no readable answer
    notes: list[str] = field(default_factory=list)


def load_cells(path: Path) -> tuple[list[Cell], list[str]]:
    """The code cells of a notebook file, and notes about damage that was worked around."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise NotANotebook(f"cannot open it ({e.strerror or e})") from None
    return parse_notebook(data)


def parse_notebook(data: bytes) -> tuple[list[Cell], list[str]]:
    """`load_cells` for bytes already read."""
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
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        return _salvage(text, e)
    except RecursionError:
        raise NotANotebook("its JSON is nested too deeply to read") from None
    return _cells_of(nb), []


def scan(cells: list[Cell]) -> Scan:
    """Collect assignments, check() calls, markers and receipts from a notebook's code cells."""
    found = Scan()
    for cell in cells:
        for qid in MARKER.findall(cell.source):
            found.markers.setdefault(qid, []).append(cell.number)
        if cell.outputs:
            for qid, attempt, result in RECEIPT.findall(cell.outputs):
                found.receipts.setdefault(qid, []).append((int(attempt), result))
        tree = _parse_cell(cell, found.notes)
        if tree is None:
            continue
        for stmt in tree.body:
            _collect(stmt, cell.number, found, top_level=True)
    return found


def find_answer(found: Scan, question_id: str) -> Found:
    """The student's answer to one question, as the grader reads it (see the module docstring)."""
    calls = found.calls.get(question_id, [])
    variable, before = f"answer_{question_id}", None
    notes = []
    if calls:
        call = calls[-1]
        if call.arg is None:
            return Found(cell=call.cell, problem=f'check("{question_id}") in cell {call.cell} is given no answer')
        if isinstance(call.arg, ast.Name):
            variable, before = call.arg.id, (call.cell, call.line)
        else:  # check("q00_1", "b"): the answer is in the call itself
            value, problem = Assignment(call.cell, call.line, call.arg).read()
            return Found(value, call.cell, problem)
    assigns = found.assignments.get(variable, [])
    if not assigns:
        why = (
            f"the cell that sets {variable} is missing (deleted?)"
            if variable.startswith("answer_")
            else f'check("{question_id}", {variable}) is called, but {variable} is never set in the notebook'
        )
        return Found(problem=why)
    answered = [a for a in assigns if a.problem or not _is_none(a.node)]
    if not answered:
        return Found(None, assigns[-1].cell)
    pool = [a for a in answered if before is None or a.position < before] or answered
    chosen = pool[-1]
    if len(assigns) > 1:
        cells = sorted({a.cell for a in assigns})
        if len(cells) > 1:
            listing = ", ".join(map(str, cells))
            notes.append(f"{variable} is set in cells {listing}; graded the one in cell {chosen.cell}")
    value, problem = chosen.read()
    return Found(value, chosen.cell, problem and f"{variable} in cell {chosen.cell}: {problem}", notes)


def find_student_id(found: Scan) -> tuple[str, str]:
    """(the student id as written, a problem or "")."""
    assigns = found.assignments.get(STUDENT_ID, [])
    problems = []
    for a in reversed(assigns):
        value, problem = a.read()
        if problem:
            problems.append(f"student_id in cell {a.cell}: {problem}")
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip(), ""
    if problems:
        return "", problems[0]
    return "", "no student id: student_id is empty or missing"


def _cells_of(nb: Any) -> list[Cell]:
    if not isinstance(nb, dict):
        raise NotANotebook(f"it is JSON, but a {type(nb).__name__}, not a notebook: submit the .ipynb file")
    raw_cells = nb.get("cells")
    if raw_cells is None and isinstance(nb.get("worksheets"), list):  # nbformat 3 (very old Jupyter)
        raw_cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) for c in ws.get("cells", [])]
    if not isinstance(raw_cells, list):
        raise NotANotebook('it is JSON but not a notebook (no "cells" list): submit the .ipynb file')
    cells = []
    for number, raw in enumerate(raw_cells, 1):
        if isinstance(raw, dict) and raw.get("cell_type") == "code":
            source = _text(raw.get("source", raw.get("input", "")))
            cells.append(Cell(number, source, _receipt_text(raw.get("outputs"))))
    return cells


def _salvage(text: str, error: json.JSONDecodeError) -> tuple[list[Cell], list[str]]:
    """Keep the complete cells before the damage; NotANotebook when there are none."""
    cut_off = not text.rstrip().endswith(("}", "]"))  # a whole notebook ends with its closing brace
    why = (
        f"the file is cut off after {len(text.encode())} bytes (an interrupted upload or download)"
        if cut_off
        else f"invalid JSON at line {error.lineno}, column {error.colno} ({error.msg})"
    )
    start = re.search(r'"cells"\s*:\s*\[', text)
    raw_cells, decoder = [], json.JSONDecoder()
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


def _parse_cell(cell: Cell, notes: list[str]) -> ast.Module | None:
    tree, problem = _parse_source(cell.source)
    if problem:
        notes.append(f"cell {cell.number} {problem}")
    return tree


@lru_cache(maxsize=4096)  # a class's submissions share most cells: parse each text once
def _parse_source(source: str) -> tuple[ast.Module | None, str]:
    """(the cell's syntax tree, "" or what went wrong); magics blanked, never raises."""
    source = "\n".join(_MAGIC.sub(r"\1pass", line) for line in source.splitlines())
    try:
        return ast.parse(source), ""
    except SyntaxError as e:
        relevant = "answer_" in source or "check(" in source or STUDENT_ID in source
        if not relevant or source.lstrip().startswith("%%"):
            return None, ""
        # read what can be read line by line: the answer lines are usually fine on their own
        body = []
        for number, line in enumerate(source.splitlines(), 1):
            if line[:1].isspace() or not line.strip():
                continue
            try:
                stmts = ast.parse(line).body
            except SyntaxError:
                continue
            for stmt in stmts:
                ast.increment_lineno(stmt, number - 1)
            body += stmts
        return ast.Module(body=body, type_ignores=[]), (
            f"has a syntax error (line {e.lineno}: {e.msg}), so it never ran; its other lines were read one by one"
        )
    except (RecursionError, MemoryError, ValueError):
        return None, "could not be parsed (too large or nested too deeply)"


def _collect(stmt: ast.stmt, cell: int, found: Scan, *, top_level: bool) -> None:
    def add(name: str, node: ast.expr | None, problem: str = "") -> None:
        found.assignments.setdefault(name, []).append(Assignment(cell, stmt.lineno, node, problem))

    if not top_level:  # an assignment in an if/for/def may or may not have run: report, don't guess
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name) and (target.id.startswith("answer_") or target.id == STUDENT_ID):
                        add(
                            target.id,
                            None,
                            "it is set inside an indented block (if/for/def/with); "
                            "the grader reads top-level lines only",
                        )
        return
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                add(target.id, stmt.value)
            elif isinstance(target, (ast.Tuple, ast.List)):
                values = stmt.value.elts if isinstance(stmt.value, (ast.Tuple, ast.List)) else None
                for i, t in enumerate(target.elts):
                    if isinstance(t, ast.Name):
                        if values is not None and len(values) == len(target.elts):
                            add(t.id, values[i])
                        else:
                            add(t.id, None, "it is unpacked from an expression; write `name = value`")
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        add(stmt.target.id, stmt.value)
    elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        add(stmt.target.id, None, f"it is changed with {type(stmt.op).__name__.lower()}=; write `name = value`")
    elif isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef)):
        _collect(stmt, cell, found, top_level=False)
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call):
            _collect_calls(node, cell, found)


def _collect_calls(node: ast.expr, cell: int, found: Scan) -> None:
    if not isinstance(node, ast.Call):
        return
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name != "check" or not node.args:
        return
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        answer = (
            node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "answer"), None)
        )
        found.calls.setdefault(first.value, []).append(CheckCall(cell, node.lineno, answer))


def _is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None
