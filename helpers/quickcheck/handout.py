"""Student versions: `python -m helpers.quickcheck student SRC_DIR OUT_DIR`.

From an instructor's notebook (the kit's own, or one with worked solutions) it makes the copy
students get:

1. every block between `# BEGIN SOLUTION` and `# END SOLUTION` lines (`<!-- BEGIN SOLUTION -->`
   in markdown) is removed; a variable the block assigned is left as `name = None  # YOUR ANSWER`,
   anything else as `# YOUR CODE HERE`, so Run all still works;
2. any answer line that still holds a value (`answer_q.. = ...`, `student_id = ...`, or a name
   passed to `check()`) is blanked (None, ""), so an answer written outside the markers never
   reaches students; each one is listed (`blanking`);
3. outputs, execution counts, widget state and cell metadata are stripped, except the tags and
   how a cell is folded (`FOLDING`: the install cell and the cell that records the figures start
   folded in the kit's notebooks, `jupyter.source_hidden` for JupyterLab, `cellView` for Colab),
   kept exactly as the original has them.

A notebook that holds the answer key's marker (`key.KEY_MARKER`: the key pasted into a cell) is
refused: the key never reaches a student version.

It refuses what it cannot blank for sure, instead of passing it through: an answer set in an
if-block, unpacked, passed to `check()` itself, named in a string, on an IPython line, in a cell
that does not parse... (see `blanking`). The error names the notebook, the cell, the line and the
form; the result is then read back with the grader's own reader, and any answer it would still
find is refused too. A BEGIN without its END is refused the same way. Every notebook is checked
before any is written: on a refusal, nothing is written.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from helpers.quickcheck.bank import QUESTION_ID, get_question
from helpers.quickcheck.blanking import blank_answers, passed_names
from helpers.quickcheck.key import KEY_COMMAND, KEY_MARKER
from helpers.quickcheck.reading import (
    MARKER,
    MISSING,
    STUDENT_ID,
    Cell,
    find_answer,
    find_student_id,
    python_lines,
    scan,
)

__all__ = ["BEGIN", "END", "FOLDING", "HandoutError", "student_version", "write_student_versions"]

BEGIN = re.compile(r"^\s*(#+|<!--)\s*BEGIN SOLUTION\b", re.I)
END = re.compile(r"^\s*(#+|<!--)\s*END SOLUTION\b", re.I)
# the cell metadata a student version keeps: tags, and how the cell is folded (Colab's form view,
# JupyterLab's hidden source or outputs, classic Jupyter's collapsed outputs); "jupyter" keeps only these keys
FOLDING = {"tags": None, "cellView": None, "collapsed": None, "jupyter": ("source_hidden", "outputs_hidden")}


class HandoutError(ValueError):
    """An instructor notebook that cannot be turned into a student version safely; says where and why."""


def student_version(nb: dict, name: str = "notebook") -> tuple[dict, list[str]]:
    """Return (the student version of a notebook dict, notes on what was removed or blanked).

    Raises:
        HandoutError: unbalanced solution markers, or answers it cannot blank for sure; the
            message names the cell, the line and the form, one problem per line.
    """
    notes, problems, cells = [], [], []
    raw_cells = [dict(c) for c in nb.get("cells", [])]
    sources = []
    for number, cell in enumerate(raw_cells, 1):
        source, removed = _remove_solutions(_source(cell), cell.get("cell_type"), f"{name}, cell {number}")
        if removed:
            notes.append(f"cell {number}: removed {removed} solution block{'s' if removed > 1 else ''}")
        sources.append(source)
    extra = passed_names([s for c, s in zip(raw_cells, sources) if c.get("cell_type") == "code"])
    for number, (cell, source) in enumerate(zip(raw_cells, sources), 1):
        if cell.get("cell_type") == "code":
            result = blank_answers(source, extra)
            problems += [f"{name}, cell {number}, {p}" for p in result.problems]
            source = result.source
            notes += [
                f"cell {number}: {v} held a value outside the solution markers; set it blank" for v in result.blanked
            ]
            notes += [f"cell {number}: {c} was computed; check that no cell gives it away" for c in result.computed]
            notes += _marker_notes(source, number)
            cell["outputs"], cell["execution_count"] = [], None
        if KEY_MARKER in source:
            problems.append(
                f"{name}, cell {number}: holds the answer key ({KEY_COMMAND}'s output): delete the cell, the key "
                "is for instructors only"
            )
        cell["metadata"] = _kept_metadata(cell.get("metadata"))
        cell["source"] = python_lines(source)
        cells.append(cell)
    problems = problems or _still_answered(cells, name)
    if problems:
        raise HandoutError(
            f"{name}: {len(problems)} answer{'s' if len(problems) > 1 else ''} could not be blanked for sure "
            "(nothing was written):\n" + "\n".join(problems)
        )
    out = {**nb, "cells": cells, "metadata": {k: v for k, v in nb.get("metadata", {}).items() if k != "widgets"}}
    return out, notes


def write_student_versions(src: Path, out: Path) -> list[tuple[Path, list[str]]]:
    """Write the student version of every notebook in `src` (a folder or one .ipynb) to `out`.

    Returns (written path, notes) per notebook. Raises HandoutError, before writing anything,
    when `out` would overwrite the sources or when any notebook cannot be handed out safely
    (the message lists every problem of every notebook).
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
    versions, errors = [], []
    for path in paths:
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
            versions.append((path, *student_version(nb, path.name)))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            errors.append(f"{path} is not a readable notebook ({e})")
        except HandoutError as e:
            errors.append(str(e))
    if errors:
        raise HandoutError("\n".join(errors))
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for path, version, notes in versions:
        target = out / path.name
        target.write_text(json.dumps(version, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        made.append((target, notes))
    return made


def _kept_metadata(metadata: object) -> dict:
    """The tags and folding of a cell's metadata, as the original has them (`FOLDING`); nothing else."""
    metadata = metadata if isinstance(metadata, dict) else {}
    kept = {}
    for key, inner in FOLDING.items():
        value = metadata.get(key)
        if inner is not None:
            value = {k: value[k] for k in inner if k in value} if isinstance(value, dict) else None
        if value not in (None, [], {}):
            kept[key] = value
    return kept


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source if isinstance(source, str) else ""


def _marker_notes(source: str, number: int) -> list[str]:
    return [
        f"cell {number}: `# QUICK CHECK {qid}` names no question in the bank"
        for qid in MARKER.findall(source)
        if qid != "student" and not _known(qid)
    ]


def _still_answered(cells: list[dict], name: str) -> list[str]:
    """What the grader's own reader would still find as an answer in the student version (nothing, normally)."""
    code = [Cell(i, "".join(c["source"])) for i, c in enumerate(cells, 1) if c.get("cell_type") == "code"]
    found = scan(code)
    problems = []
    for qid in sorted(found.question_ids()):
        answer = find_answer(found, qid)
        if answer.value is not None and answer.value is not MISSING:
            problems.append(f"{name}, cell {answer.cell}: the grader would still read an answer to {qid} there")
    if find_student_id(found)[0]:
        problems.append(f"{name}: the grader would still read a student id in it")
    return problems


def _remove_solutions(source: str, kind: str | None, where: str) -> tuple[str, int]:
    lines = python_lines(source)
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
    return "".join(line[len(indent) :] if line.startswith(indent) else line for line in python_lines(block))


def _blank_for(name: str) -> str:
    return '""' if name == STUDENT_ID else "None"


def _known(qid: str) -> bool:
    if not QUESTION_ID.match(qid):
        return False
    try:
        get_question(qid)
    except KeyError:
        return False
    return True
