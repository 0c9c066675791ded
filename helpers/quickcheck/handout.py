"""Student versions: `python -m helpers.quickcheck student SRC_DIR OUT_DIR`.

From an instructor's notebook (the kit's own, or one with worked solutions) it makes the copy
students get:

1. every block between `# BEGIN SOLUTION` and `# END SOLUTION` lines (`<!-- BEGIN SOLUTION -->`
   in markdown) is removed; a variable the block assigned is left as `name = None  # YOUR ANSWER`,
   anything else as `# YOUR CODE HERE`, so Run all still works;
2. any `answer_q..` or `student_id` line that still holds a value is blanked (None, ""), so an
   answer written outside the markers never reaches students; each one is listed;
3. outputs, execution counts, widget state and cell metadata other than tags are stripped.

The quick-check cells themselves stay. A BEGIN without its END stops that notebook (writing it
would hand out the rest of the solution) and names the cell and line to fix.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from helpers.quickcheck.bank import QUESTION_ID, get_question
from helpers.quickcheck.reading import MARKER, STUDENT_ID

__all__ = ["BEGIN", "END", "HandoutError", "student_version", "write_student_versions"]

BEGIN = re.compile(r"^\s*(#+|<!--)\s*BEGIN SOLUTION\b", re.I)
END = re.compile(r"^\s*(#+|<!--)\s*END SOLUTION\b", re.I)


class HandoutError(ValueError):
    """An instructor notebook that cannot be turned into a student version safely."""


def student_version(nb: dict, name: str = "notebook") -> tuple[dict, list[str]]:
    """Return (the student version of a notebook dict, notes on what was removed or blanked).

    Raises:
        HandoutError: unbalanced solution markers; the message names the cell and line.
    """
    notes = []
    cells = []
    for number, cell in enumerate(nb.get("cells", []), 1):
        cell = dict(cell)
        source = "".join(cell.get("source", "")) if isinstance(cell.get("source"), list) else cell.get("source", "")
        kind = cell.get("cell_type")
        source, removed = _remove_solutions(source, kind, f"{name}, cell {number}")
        if removed:
            notes.append(f"cell {number}: removed {removed} solution block{'s' if removed > 1 else ''}")
        if kind == "code":
            source, blanked = _blank_answers(source)
            notes += [
                f"cell {number}: {var} held a value outside the solution markers; set it blank" for var in blanked
            ]
            for qid in MARKER.findall(source):
                if qid != "student" and not _known(qid):
                    notes.append(f"cell {number}: `# QUICK CHECK {qid}` names no question in the bank")
            cell["outputs"], cell["execution_count"] = [], None
        tags = cell.get("metadata", {}).get("tags")
        cell["metadata"] = {"tags": tags} if tags else {}
        cell["source"] = source.splitlines(keepends=True)
        cells.append(cell)
    out = {**nb, "cells": cells, "metadata": {k: v for k, v in nb.get("metadata", {}).items() if k != "widgets"}}
    return out, notes


def write_student_versions(src: Path, out: Path) -> list[tuple[Path, list[str]]]:
    """Write the student version of every notebook in `src` (a folder or one .ipynb) to `out`.

    Returns (written path, notes) per notebook. Raises HandoutError before writing anything when
    `out` would overwrite the sources, and for the first notebook with unbalanced markers.
    """
    src, out = Path(src), Path(out)
    paths = sorted(src.glob("*.ipynb")) if src.is_dir() else [src]
    if not paths or not all(p.is_file() for p in paths):
        raise HandoutError(f"no notebooks at {src}: pass a folder of .ipynb files or one .ipynb file")
    if out.resolve() in {p.parent.resolve() for p in paths}:
        raise HandoutError(
            f"OUT_DIR {out} is where the notebooks are: the student versions would overwrite "
            "your originals; pass another folder, e.g. handout/"
        )
    made = []
    for path in paths:
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise HandoutError(f"{path} is not a readable notebook ({e})") from None
        version, notes = student_version(nb, path.name)
        out.mkdir(parents=True, exist_ok=True)
        target = out / path.name
        target.write_text(json.dumps(version, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        made.append((target, notes))
    return made


def _remove_solutions(source: str, kind: str | None, where: str) -> tuple[str, int]:
    lines = source.splitlines(keepends=True)
    kept, block, start, removed = [], None, 0, 0
    for i, line in enumerate(lines, 1):
        if BEGIN.match(line):
            if block is not None:
                raise HandoutError(
                    f"{where}, line {i}: BEGIN SOLUTION inside the block opened at line {start}; "
                    "close the first one with # END SOLUTION"
                )
            block, start = [], i
            indent = line[: len(line) - len(line.lstrip())]
        elif END.match(line):
            if block is None:
                raise HandoutError(f"{where}, line {i}: END SOLUTION without a BEGIN SOLUTION above it")
            kept += _placeholder("".join(block), kind, indent)
            block, removed = None, removed + 1
        elif block is not None:
            block.append(line)
        else:
            kept.append(line)
    if block is not None:
        raise HandoutError(
            f"{where}, line {start}: BEGIN SOLUTION has no END SOLUTION; add one where the "
            "solution ends (nothing was written for this notebook)"
        )
    return "".join(kept), removed


def _placeholder(block: str, kind: str | None, indent: str) -> list[str]:
    if kind != "code":
        return [f"{indent}YOUR ANSWER HERE\n"]
    names = []
    try:
        tree = ast.parse(_dedent(block, indent))
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            names += [t.id for t in targets if isinstance(t, ast.Name) and t.id not in names]
    except SyntaxError:
        pass  # not parseable on its own: fall back to the comment
    if names:
        return [f"{indent}{n} = {_blank_for(n)}  # YOUR ANSWER\n" for n in names]
    return [f"{indent}# YOUR CODE HERE\n"]


def _dedent(block: str, indent: str) -> str:
    return "".join(line[len(indent) :] if line.startswith(indent) else line for line in block.splitlines(True))


def _blank_answers(source: str) -> tuple[str, list[str]]:
    """Set `answer_q.. = <value>` and `student_id = <value>` top-level lines to None / ""."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source, []
    lines = source.splitlines(keepends=True)
    blanked = []
    for stmt in reversed(tree.body):  # bottom-up, so earlier positions stay valid
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        if not any(n.startswith("answer_") or n == STUDENT_ID for n in names):
            continue
        blank = _blank_for(names[0])
        value = stmt.value
        if isinstance(value, ast.Constant) and value.value in (None, "") and not isinstance(value.value, bool):
            continue
        first, last = value.lineno - 1, value.end_lineno - 1
        head = _byte_prefix(lines[first], value.col_offset)
        tail = _byte_suffix(lines[last], value.end_col_offset)
        lines[first : last + 1] = [head + blank + tail]
        blanked.append(names[0])
    return "".join(lines), sorted(blanked)


def _blank_for(name: str) -> str:
    return '""' if name == STUDENT_ID else "None"


def _byte_prefix(line: str, offset: int) -> str:  # ast offsets count UTF-8 bytes
    return line.encode()[:offset].decode()


def _byte_suffix(line: str, offset: int) -> str:
    return line.encode()[offset:].decode()


def _known(qid: str) -> bool:
    if not QUESTION_ID.match(qid):
        return False
    try:
        get_question(qid)
    except KeyError:
        return False
    return True
