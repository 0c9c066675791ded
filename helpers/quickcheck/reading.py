"""Read a submitted notebook's answers from the text of its cells, without running any of it.

`python -m helpers.quickcheck grade` uses this module (and so does `check()` in notebooks 00 ... 08,
to warn when the grader would read something else); `submissions` turns a file into `Cell`s first.

1. `scan` parses the cells that can hold an answer (they mention answer_, student_id or check(),
   or a name passed to check(); the cells with a `# QUICK CHECK` marker first) with `ast`,
   IPython magics blanked, and collects the top-level assignments, the `check("q00_1", ...)`
   calls, the markers and the receipts in the outputs. The work is bounded (`limits.Budget`):
   a cell over 50 K characters, or one that does not parse, is read line by line; a file's
   reading stops after 200 K characters of code or a second. At the end, the assignments that can
   be answers are evaluated (`safe_eval.read_value`) and their syntax dropped: no tree outlives the scan.
2. `find_answer` decides what the student answered: the variable passed to the last
   `check("q00_1", name)` call (`answer_q00_1` when there is none), its last assignment that
   gives an answer (a later `= None` left by a duplicated cell does not erase it).

Cells are identified by their position in the notebook (1-based in every message, as a person
counts them), so reordered, duplicated and deleted cells are read as they stand in the file.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from helpers.quickcheck.judging import RECEIPT
from helpers.quickcheck.limits import MAX_IDS, MAX_LINE_CHARS, MAX_NOTES, MAX_PASSED_NAMES, Budget
from helpers.quickcheck.safe_eval import Unreadable, read_value

__all__ = [
    "MARKER",
    "MISSING",
    "STUDENT_ID",
    "Assignment",
    "Cell",
    "CheckCall",
    "Found",
    "Scan",
    "blank_magics",
    "find_answer",
    "find_student_id",
    "python_lines",
    "scan",
]

# [^\S\r\n]: spaces and tabs but never a line end, so a cell of blank lines is read in linear time
MARKER = re.compile(r"^[^\S\r\n]*#[^\S\r\n]*QUICK CHECK[^\S\r\n]+(\S{1,60})", re.I | re.M)
STUDENT_ID = "student_id"
MISSING = object()
_MAGIC = re.compile(r"^(\s*)([%!].*|[\w.]+\?\??\s*)$")  # %time, !pip, obj? (IPython, not Python)
_RELEVANT = re.compile(r"answer_|student_id|\bcheck\s*\(")
_ASSIGNED = re.compile(r"([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)")  # `name =` or `name: T =` at a line's start
_NEWLINE = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


@dataclass
class Cell:
    number: int  # 1-based position in the notebook
    source: str
    outputs: str = ""  # text of the outputs that hold receipts, else ""


@dataclass
class Assignment:
    """`name = value` at the top level of a cell, read at the end of the scan (value MISSING: `problem` says why)."""

    cell: int
    line: int
    value: Any = MISSING
    problem: str = ""
    node: ast.expr | None = field(default=None, repr=False)  # while scanning only: read, then dropped

    @property
    def position(self) -> tuple[int, int]:
        return self.cell, self.line

    def read(self) -> tuple[Any, str]:
        """(value, "") or (MISSING, why it cannot be read)."""
        return (MISSING, self.problem) if self.problem else (self.value, "")


@dataclass
class CheckCall:
    """`check("q00_1", answer)`: the name passed, or the value written in the call itself."""

    cell: int
    line: int
    given: bool = True  # False: no answer argument at all
    name: str = ""  # the variable passed, when it is a plain name
    value: Any = MISSING
    problem: str = ""


@dataclass
class Scan:
    """What `scan` found in a notebook's code cells."""

    assignments: dict[str, list[Assignment]] = field(default_factory=dict)
    calls: dict[str, list[CheckCall]] = field(default_factory=dict)
    markers: dict[str, list[int]] = field(default_factory=dict)
    receipts: dict[str, dict[str, int]] = field(default_factory=dict)  # qid -> {result: highest attempt}
    notes: list[str] = field(default_factory=list)
    complete: bool = True  # False when the limits stopped the reading early
    _dropped: int = 0

    def question_ids(self) -> set[str]:
        """Every question id the notebook mentions: markers, check calls, answer_q.. variables."""
        ids = set(self.markers) | set(self.calls)
        ids |= {name[len("answer_") :] for name in self.assignments if name.startswith("answer_q")}
        return {i for i in ids if re.fullmatch(r"q\d\d_[A-Za-z0-9]+", i)}

    def note(self, text: str) -> None:
        """Keep a note, up to `MAX_NOTES`; the rest are counted."""
        if len(self.notes) < MAX_NOTES:
            self.notes.append(text)
        else:
            self._dropped += 1


@dataclass
class Found:
    """The answer `find_answer` located: value (MISSING when none could be read), where, and why not."""

    value: Any = MISSING
    cell: int | None = None
    problem: str = ""  # why there is no readable answer
    notes: list[str] = field(default_factory=list)


def python_lines(source: str) -> list[str]:
    """The lines of `source` as Python counts them (at \\n, \\r\\n, \\r; not at U+2028 or a form feed), ends kept."""
    return [line for line in _NEWLINE.split(source) if line]


def blank_magics(line: str) -> str:
    """An IPython line (`%time ...`, `!pip ...`, `obj?`) as `pass`, indentation kept; other lines unchanged."""
    return _MAGIC.sub(r"\1pass", line)


def scan(cells: list[Cell], budget: Budget | None = None) -> Scan:
    """Collect assignments, check() calls, markers and receipts from a notebook's code cells."""
    budget = budget or Budget()
    found = Scan()
    marked, relevant, later = [], [], []
    for cell in cells:
        has_marker = _markers_and_receipts(cell, found)
        if _RELEVANT.search(cell.source):
            (marked if has_marker else relevant).append(cell)
        elif "=" in cell.source:
            later.append(cell)
    for cell in marked + relevant:  # the quick-check cells first: junk cells cannot spend their budget
        _read_cell(cell, found, budget)
    passed = {c.name for calls in found.calls.values() for c in calls if c.name}
    passed = set(sorted(n for n in passed if not (n.startswith("answer_") or n == STUDENT_ID))[:MAX_PASSED_NAMES])
    for cell in later:  # a name passed to check() may be set in a cell that mentions nothing else
        if any(name in cell.source for name in passed):
            _read_cell(cell, found, budget)
    found.assignments = {
        name: sorted(assigns, key=lambda a: a.position)
        for name, assigns in found.assignments.items()
        if name.startswith("answer_") or name == STUDENT_ID or name in passed
    }
    for assigns in found.assignments.values():  # read only what can be an answer; no syntax tree outlives the scan
        for a in assigns:
            if a.node is not None:
                (a.value, a.problem), a.node = _read(a.node), None
    found.calls = {qid: sorted(calls, key=lambda c: (c.cell, c.line)) for qid, calls in found.calls.items()}
    if found._dropped:
        found.notes.append(f"and {found._dropped:,} more notes like these")
    return found


def find_answer(found: Scan, question_id: str) -> Found:
    """The student's answer to one question, as the grader reads it (see the module docstring)."""
    calls = found.calls.get(question_id, [])
    variable, before = f"answer_{question_id}", None
    notes = []
    if calls:
        call = calls[-1]
        if not call.given:
            return Found(cell=call.cell, problem=f'check("{question_id}") in cell {call.cell} is given no answer')
        if not call.name:  # check("q00_1", "b"): the answer is in the call itself
            return Found(call.value, call.cell, call.problem)
        variable, before = call.name, (call.cell, call.line)
    assigns = found.assignments.get(variable, [])
    if not assigns:
        why = (
            f"the cell that sets {variable} is missing (deleted?)"
            if variable.startswith("answer_")
            else f'check("{question_id}", {variable}) is called, but {variable} is never set in the notebook'
        )
        return Found(problem=why)
    answered = [a for a in assigns if a.problem or a.value is not None]
    if not answered:
        return Found(None, assigns[-1].cell)
    pool = [a for a in answered if before is None or a.position < before] or answered
    chosen = pool[-1]
    cells = sorted({a.cell for a in assigns})
    if len(cells) > 1:
        listing = ", ".join(map(str, cells[:10])) + (f" and {len(cells) - 10} more" if len(cells) > 10 else "")
        notes.append(f"{variable} is set in cells {listing}; graded the one in cell {chosen.cell}")
    value, problem = chosen.read()
    return Found(value, chosen.cell, problem and f"{variable} in cell {chosen.cell}: {problem}", notes)


def find_student_id(found: Scan) -> tuple[str, str]:
    """(the student id as written, a problem or "")."""
    assigns = found.assignments.get(STUDENT_ID, [])
    problems = []
    for a in reversed(assigns):
        value, problem = a.read()
        if not problem and isinstance(value, str) and len(value) > 100:
            problem = f"it is {len(value):,} characters long; an id is short: write yours"
        if problem:
            problems.append(f"student_id in cell {a.cell}: {problem}")
            continue
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip():
            return str(value).strip(), ""
    if problems:
        return "", problems[0]
    return "", "no student id: student_id is empty or missing"


def _markers_and_receipts(cell: Cell, found: Scan) -> bool:
    """Record the cell's markers and receipts; True when it has a marker."""
    markers = MARKER.findall(cell.source)
    for qid in markers:
        cells = _slot(found.markers, qid, [])
        if cells is not None and cell.number not in cells[-1:]:
            cells.append(cell.number)
    for qid, attempt, result in RECEIPT.findall(cell.outputs) if cell.outputs else ():
        if len(attempt) > 6:
            found.note(
                f"a receipt for {qid} claims attempt {attempt[:12]}… ({len(attempt):,} digits); ignored: "
                "receipts are printed text, which can be edited"
            )
            continue
        best = _slot(found.receipts, qid, {})
        if best is not None:
            best[result] = max(best.get(result, 0), int(attempt))
    return bool(markers)


def _slot(table: dict, key: str, empty: Any) -> Any:
    """table[key], created empty while the table holds fewer than MAX_IDS keys; None past that."""
    if key not in table and len(table) >= MAX_IDS:
        return None
    return table.setdefault(key, empty)


def _read_cell(cell: Cell, found: Scan, budget: Budget) -> None:
    if budget.spent:
        return _stop(found, cell.number)
    source = cell.source
    if not budget.can_parse_whole(len(source)):
        return _read_lines(cell, found, budget, whole_too_long=True)
    if not budget.take(len(source)):
        return _stop(found, cell.number)
    text = "".join(blank_magics(line.rstrip("\r\n")) + "\n" for line in python_lines(source))
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        if source.lstrip().startswith("%%"):
            return  # a cell magic's body (%%bash, %%html) is not Python
        found.note(
            f"cell {cell.number} has a syntax error (line {e.lineno}: {e.msg}), so it never ran; "
            "its lines were read one by one"
        )
        return _read_lines(cell, found, budget)
    except (RecursionError, MemoryError, ValueError):
        found.note(f"cell {cell.number} could not be parsed (nested too deeply); its lines were read one by one")
        return _read_lines(cell, found, budget)
    for stmt in tree.body:
        _collect(stmt, cell.number, found, top_level=True)


def _stop(found: Scan, cell: int, line: int | None = None) -> None:
    """Say once, before every other note, where the limits stopped the reading."""
    if found.complete:
        found.complete = False
        where = f"cell {cell}" + (f", line {line}" if line else "")
        found.notes.insert(0, f"stopped reading at {where}: past the code (or the second) the grader reads per file")


def _read_lines(cell: Cell, found: Scan, budget: Budget, whole_too_long: bool = False) -> None:
    """Read a cell's top-level lines that can set an answer one by one (a cell too long, or broken)."""
    for number, line in enumerate(python_lines(cell.source), 1):
        if line[:1].isspace() or not (_RELEVANT.search(line) or _ASSIGNED.match(line)):
            continue
        assigned = _ASSIGNED.match(line)
        if len(line) > MAX_LINE_CHARS:
            if assigned:
                found.assignments.setdefault(assigned.group(1), []).append(
                    Assignment(
                        cell.number, number, problem=f"its line is {len(line):,} characters long, too long to read"
                    )
                )
            continue
        if not budget.take(len(line)):
            return _stop(found, cell.number, number)
        try:
            stmts = ast.parse(blank_magics(line.rstrip("\r\n"))).body
        except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
            if assigned:
                found.assignments.setdefault(assigned.group(1), []).append(
                    Assignment(cell.number, number, problem=_line_problem(e, len(cell.source), whole_too_long))
                )
            continue
        for stmt in stmts:
            ast.increment_lineno(stmt, number - 1)
            _collect(stmt, cell.number, found, top_level=True)


def _line_problem(error: Exception, cell_chars: int, whole_too_long: bool) -> str:
    if whole_too_long:  # the line may be fine, continued on the next: the cell was too long to parse whole
        return (
            f"it does not parse on its own line, in a cell of {cell_chars:,} characters (too long to read whole): "
            "write the answer on one line, in a cell of its own"
        )
    why = f"has a syntax error ({error.msg})" if isinstance(error, SyntaxError) else "cannot be parsed"
    return f"it {why}, so it never ran: fix the line"


def _read(node: ast.expr) -> tuple[Any, str]:
    try:
        return read_value(node), ""
    except Unreadable as e:
        return MISSING, f"it {e}"
    except (RecursionError, MemoryError):
        return MISSING, "it is nested too deeply to read"


def _collect(stmt: ast.stmt, cell: int, found: Scan, *, top_level: bool) -> None:
    def add(name: str, node: ast.expr | None, problem: str = "") -> None:
        keep = None if problem else node  # read at the end of the scan, if the name turns out to matter
        found.assignments.setdefault(name, []).append(Assignment(cell, stmt.lineno, problem=problem, node=keep))

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
            _collect_call(node, cell, found)


def _collect_call(node: ast.Call, cell: int, found: Scan) -> None:
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name != "check" or not node.args:
        return
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return
    calls = _slot(found.calls, first.value, [])
    if calls is None:
        return
    answer = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "answer"), None)
    if answer is None:
        calls.append(CheckCall(cell, node.lineno, given=False))
    elif isinstance(answer, ast.Name):
        calls.append(CheckCall(cell, node.lineno, name=answer.id))
    else:
        value, problem = _read(answer)
        calls.append(CheckCall(cell, node.lineno, value=value, problem=problem))
