"""Blank the answers in one code cell of an instructor's notebook, or say why that cannot be done for sure.

Used by `python -m helpers.quickcheck student` (`handout`) for every code cell it hands out. An
answer name is `answer_q..`, `student_id`, or a name the notebook passes to `check()`.

The only form it blanks is the one it can be sure of: a plain top-level `name = value` (or
`name: T = value`, chained `a = name = value`, several on a line with `;`), in a cell that is
Python once IPython's `%` / `!` lines are set aside (`%%time`, `%%timeit`, `%%capture` cells too).
Every other way a cell can hold an answer is a problem to fix, named with its line: an answer set
inside an if/for/def, unpacked, looped over, changed with +=, set with :=, declared global, passed
to `check()` itself, named in a string (exec, globals()[...]), on an IPython line, in a cell
that does not parse, or in a cell magic whose body is not Python. Lines are counted as Python
counts them (a U+2028 or a form feed earlier in the cell moves nothing). The result is analysed
again: anything left to blank is a problem too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from helpers.quickcheck.reading import STUDENT_ID, blank_magics, python_lines

__all__ = ["Blanked", "blank_answers", "passed_names"]

_PYTHON_CELL_MAGICS = {"time", "timeit", "capture", "prun"}
_HOW = {
    ast.Tuple: "set by unpacking (a, b = ...)",
    ast.List: "set by unpacking ([a, b] = ...)",
    ast.Starred: "set by unpacking (*a = ...)",
    ast.For: "a loop variable",
    ast.AsyncFor: "a loop variable",
    ast.comprehension: "a loop variable",
    ast.AugAssign: "changed with an augmented assignment (+= ...)",
    ast.NamedExpr: "set with :=",
    ast.withitem: "bound by `with ... as`",
    ast.Delete: "deleted",
    ast.Assign: "set inside an indented block (if/for/def/with), or together with other targets",
    ast.AnnAssign: "set inside an indented block (if/for/def/with)",
}


@dataclass
class Blanked:
    """What `blank_answers` did to a cell."""

    source: str
    blanked: list[str] = field(default_factory=list)  # answer names set blank
    problems: list[str] = field(default_factory=list)  # "line L: ..." it could not blank for sure
    computed: list[str] = field(default_factory=list)  # "name (from a, b)": blanked, but computed from names


def passed_names(sources: list[str]) -> set[str]:
    """The plain names passed as the answer to `check()` in these cells (mine in check("q00_1", mine))."""
    names = set()
    for source in sources:
        tree = _parse(source)[0] if "check" in source else None
        for node in ast.walk(tree) if tree else ():
            answer = _check_answer(node)
            if isinstance(answer, ast.Name):
                names.add(answer.id)
    return names


def blank_answers(source: str, extra: set[str] = frozenset()) -> Blanked:
    """Blank the values of a cell's answer lines; list what cannot be blanked for sure.

    Example:
        >>> blank_answers("answer_q00_1 = 'b'  # mine").source
        'answer_q00_1 = None  # mine'
    """
    names = _NameTest(extra)
    if not names.mentioned(source):
        return Blanked(source)
    tree, problems = _parse(source, names)
    if tree is None:
        return Blanked(source, problems=problems)
    edits, computed = _answer_lines(tree, names)
    problems += _other_forms(tree, names, {id(t) for stmt in edits for t in _targets(stmt)})
    if problems:
        return Blanked(source, problems=problems)
    lines = python_lines(source)
    for stmt in sorted(edits, key=lambda s: (s.value.lineno, s.value.col_offset), reverse=True):
        first, last = stmt.value.lineno - 1, stmt.value.end_lineno - 1
        head = lines[first].encode()[: stmt.value.col_offset].decode()  # ast offsets count UTF-8 bytes
        tail = lines[last].encode()[stmt.value.end_col_offset :].decode()
        lines[first : last + 1] = [head + _blank_for(_targets(stmt)[0].id) + tail]
    result = Blanked("".join(lines), sorted({t.id for s in edits for t in _targets(s) if names.answer(t.id)}))
    result.computed = computed
    again = _parse(result.source, names)[0]
    if again is None or _answer_lines(again, names)[0]:  # what was blanked must read blank now
        result.problems.append("line 1: the answers could not be blanked for sure (the cell reads differently after)")
    return result


class _NameTest:
    def __init__(self, extra: set[str]):
        self.extra = set(extra)
        words = "|".join(["answer_\\w+", STUDENT_ID, *map(re.escape, sorted(self.extra))])
        self.in_text = re.compile(rf"\b({words})\b")
        self.set_in_text = re.compile(rf"\b({words})\s*(?::[^=\n]*)?=(?!=)")

    def answer(self, name: str) -> bool:
        return name.startswith("answer_") or name == STUDENT_ID or name in self.extra

    def mentioned(self, text: str) -> bool:
        return "check" in text or bool(self.in_text.search(text))


def _parse(source: str, names: _NameTest | None = None) -> tuple[ast.Module | None, list[str]]:
    """The cell's tree with IPython lines set aside, or (None, the problems that prevent reading it)."""
    lines, problems = [], []
    for number, line in enumerate(python_lines(source), 1):
        text = line.rstrip("\r\n")
        if number == 1 and text.lstrip().startswith("%%"):
            magic = text.lstrip()[2:].split(maxsplit=1)[0] if text.strip() != "%%" else ""
            if magic not in _PYTHON_CELL_MAGICS:
                return None, [f"line 1: the cell runs %%{magic}, whose body is not Python, so what it sets is unknown"]
            text = "pass"
        elif blank_magics(text) != text:
            found = names.in_text.search(text) if names else None
            if found:
                problems.append(
                    f"line {number}: the IPython line `{text.strip()[:60]}` mentions {found.group(1)}; "
                    "write the answer on a plain Python line"
                )
            text = blank_magics(text)
        lines.append(text + "\n")
    try:
        tree = ast.parse("".join(lines))
    except SyntaxError as e:
        return None, problems + [f"line {e.lineno}: a syntax error ({e.msg}), so what the cell sets is unknown"]
    except (RecursionError, MemoryError, ValueError):
        return None, problems + ["line 1: the cell cannot be parsed (nested too deeply)"]
    return (None, problems) if problems else (tree, [])


def _answer_lines(tree: ast.Module, names: _NameTest) -> tuple[list[ast.stmt], list[str]]:
    """The top-level `name = value` statements whose value is to be blanked, and notes on computed values."""
    edits, computed = [], []
    for stmt in tree.body:
        targets = _targets(stmt)
        if not targets or not any(names.answer(t.id) for t in targets) or _is_blank(stmt.value):
            continue
        edits.append(stmt)
        used = sorted({n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)})
        if used:
            computed.append(f"{targets[0].id} (from {', '.join(used[:5])})")
    return edits, computed


def _targets(stmt: ast.stmt) -> list[ast.Name]:
    """The targets of a plain `a = b = value` or `a: T = value`, all names; [] for any other statement."""
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target]
    return []


def _other_forms(tree: ast.Module, names: _NameTest, blanked_targets: set[int]) -> list[str]:
    """Every place the cell binds, passes or names an answer in a form that is not blanked for sure."""
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    problems = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None) or getattr(parents.get(id(node)), "lineno", "?")
        for name, how in _bindings(node, parents):
            if names.answer(name) and id(node) not in blanked_targets and not _blank_binding(node, parents):
                problems.append(
                    f"line {line}: {name} is {how}; only a plain top-level `{name} = ...` line can be "
                    "blanked: write it that way, or put it between # BEGIN SOLUTION and # END SOLUTION"
                )
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            hit = names.set_in_text.search(text) or (names.in_text.fullmatch(text.strip()) if text.strip() else None)
            if hit:
                problems.append(
                    f"line {line}: the text {text[:40]!r} names {hit.group(1)} (exec, globals()[...]?), so "
                    "whether it sets an answer is unknown: set it with a plain line"
                )
        problems += _check_call_problem(node, line)
    return problems


def _bindings(node: ast.AST, parents: dict) -> list[tuple[str, str]]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        parent = parents.get(id(node))
        return [(node.id, _HOW.get(type(parent), "bound"))]
    if isinstance(node, ast.arg):
        return [(node.arg, "a parameter")]
    if isinstance(node, ast.alias):
        return [((node.asname or node.name).split(".")[0], "imported")]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return [(n, "declared global") for n in node.names]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, "defined with def or class")]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [(node.name, "bound by `except ... as`")]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [(node.name, "bound in a match pattern")]
    return []


def _blank_binding(node: ast.AST, parents: dict) -> bool:
    """An assignment of None or "" anywhere (a solution block's placeholder inside a def) gives nothing away."""
    parent = parents.get(id(node))
    return isinstance(parent, (ast.Assign, ast.AnnAssign)) and _is_blank(parent.value)


def _check_call_problem(node: ast.AST, line: object) -> list[str]:
    if not (isinstance(node, ast.Call) and _func_name(node) == "check"):
        return []
    if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
        return [f"line {line}: check() gets its arguments through * or **, so its answer is unknown"]
    answer = _check_answer(node)
    student = next((k.value for k in node.keywords if k.arg == STUDENT_ID), None)
    if answer is not None and not isinstance(answer, ast.Name) and not _is_blank(answer):
        return [
            f"line {line}: the answer is written in the check() call itself; set `answer_qNN_k = ...` "
            "on its own line and pass that name"
        ]
    if student is not None and not isinstance(student, ast.Name) and not _is_blank(student):
        return [f"line {line}: check() is given a student id in the call; pass student_id=student_id"]
    return []


def _check_answer(node: ast.AST) -> ast.expr | None:
    if not (isinstance(node, ast.Call) and _func_name(node) == "check"):
        return None
    if len(node.args) > 1:
        return node.args[1]
    return next((k.value for k in node.keywords if k.arg == "answer"), None)


def _func_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _is_blank(node: ast.expr | None) -> bool:
    return (
        isinstance(node, ast.Constant) and (node.value is None or node.value == "") and not isinstance(node.value, bool)
    )


def _blank_for(name: str) -> str:
    return '""' if name == STUDENT_ID else "None"
