"""Evaluate small Python expressions by walking their syntax tree: never `eval`, never `exec`.

Two readers share one walker:

- `read_value` reads a student's answer from the text of a cell, for the grader
  (`python -m helpers.quickcheck grade`, and `check()`'s warnings in notebooks 00 ... 08): literals
  (`"b"`, `16`, `None`), arithmetic on numbers (`24 / 0.52`), lists, and dicts
  (`{"per_device_batch": 4}` or `dict(per_device_batch=4)`). A name or a call is refused,
  because its value only exists in the student's kernel.
- `evaluate` computes the bank's per-student expressions for `judging` (so for every `check()`
  and `grade`): `memory_gb / 0.52`, `per_device_batch * grad_accum_steps * num_devices == target`
  over the names it is given, with comparisons, `and` / `or` / `not` and abs, min, max, round.

Sizes are checked on the syntax tree before anything is computed (`limits`): an answer of more
than 1 000 parts, a string of more than 1 000 characters or an integer literal of more than 128
bits (a megabyte of hex digits) is refused without doing its arithmetic.

Whatever is refused raises `Unreadable`, whose message completes "the answer ..." with what was
found ("calls float(), which only runs in the notebook: write the value itself"); the grader
prints it in the student's feedback.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from helpers.quickcheck.limits import MAX_INT_BITS, MAX_TEXT_CHARS, MAX_VALUE_NODES

__all__ = ["Unreadable", "evaluate", "read_value"]

_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARISONS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": round}
# bounds that keep a hostile cell (`9 ** 9 ** 9`) from eating the grader's memory or time
_MAX_EXPONENT = 64
_MAX_INT = 10**30


class Unreadable(ValueError):
    """An expression these readers will not evaluate; the message says what was found."""


def read_value(expression: str | ast.expr) -> Any:
    """Read an answer written as a literal, with arithmetic on numbers allowed.

    Args:
        expression: source text (`"24 / 0.52"`) or an already parsed expression node.

    Returns:
        the value: str, int, float, bool, None, a list or a dict of those.

    Raises:
        Unreadable: the expression needs the kernel (a name, a call, an f-string...).

    Example:
        >>> read_value("2 * 8")
        16
    """
    node = _parse(expression) if isinstance(expression, str) else expression
    for count, _ in enumerate(ast.walk(node)):  # stops at the limit: a huge list costs no more than a small one
        if count >= MAX_VALUE_NODES:
            raise Unreadable(f"is an expression of more than {MAX_VALUE_NODES:,} parts, too large to be an answer")
    return _walk(node, None)


def evaluate(expression: str, names: Mapping[str, Any]) -> Any:
    """Evaluate a bank expression over `names` (a question's parameters and answer fields).

    Example:
        >>> evaluate("per_device_batch * grad_accum_steps == 32", {"per_device_batch": 4, "grad_accum_steps": 8})
        True
    """
    return _walk(_parse(expression), names)


@lru_cache(maxsize=1024)
def _parse(text: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise Unreadable(f"is not a Python expression ({e.msg})") from None


def _walk(node: ast.expr, names: Mapping[str, Any] | None) -> Any:
    """The value of `node`; names (and comparisons, and/or/not, functions) only when `names` is given."""
    with_names = names is not None
    if isinstance(node, ast.Constant):
        return _constant(node)
    if isinstance(node, ast.UnaryOp):
        return _unary(node.op, _walk(node.operand, names), with_names)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        return _arithmetic(node.op, _walk(node.left, names), _walk(node.right, names))
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_walk(e, names) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise Unreadable("builds a dict with **")
        keys = [_walk(k, names) for k in node.keys]
        if not all(isinstance(k, str) for k in keys):
            raise Unreadable("has dict keys that are not strings")
        return dict(zip(keys, (_walk(v, names) for v in node.values)))
    if isinstance(node, ast.Call):
        return _call(node, names)
    if isinstance(node, ast.Name):
        if with_names and node.id in names:
            return names[node.id]
        raise Unreadable(
            f"uses the name {node.id[:40]}, whose value only exists while the notebook runs: write the value itself"
        )
    if isinstance(node, ast.Compare) and with_names:
        return _compare(node, names)
    if isinstance(node, ast.BoolOp) and with_names:
        return _bool_op(node, names)
    if isinstance(node, ast.JoinedStr):
        raise Unreadable("is an f-string, which only runs in the notebook: write the value itself")
    raise Unreadable(f"is a {type(node).__name__} expression ({ast.unparse(node)[:40]}), not a value")


def _constant(node: ast.Constant) -> Any:
    value = node.value
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_INT_BITS:
        digits = int(value.bit_length() * 0.30103) + 1
        raise Unreadable(f"has a number of about {digits:,} digits, out of range for an answer")
    if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
        raise Unreadable(f"is a text of {len(value):,} characters; an answer is at most {MAX_TEXT_CHARS:,}")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if node.value is Ellipsis:
        raise Unreadable("still has ... where a value goes")
    raise Unreadable(f"is a {type(node.value).__name__} literal")


def _unary(op: ast.unaryop, value: Any, with_names: bool) -> Any:
    if isinstance(op, ast.Not) and with_names:
        return not value
    if isinstance(op, (ast.USub, ast.UAdd)) and _is_number(value):
        return -value if isinstance(op, ast.USub) else value
    raise Unreadable(f"applies {_op_text(op)} to {type(value).__name__}")


def _arithmetic(op: ast.operator, left: Any, right: Any) -> Any:
    if not (_is_number(left) and _is_number(right)):
        raise Unreadable(f"does arithmetic on {type(left).__name__} and {type(right).__name__}")
    if isinstance(op, ast.Pow) and abs(right) > _MAX_EXPONENT:
        raise Unreadable(f"has an exponent above {_MAX_EXPONENT}")
    try:
        result = _ARITHMETIC[type(op)](left, right)
    except (ZeroDivisionError, OverflowError) as e:
        raise Unreadable(f"does arithmetic that fails ({e})") from None
    if isinstance(result, complex) or (isinstance(result, int) and abs(result) > _MAX_INT):
        raise Unreadable("gives a number out of range")
    return result


def _call(node: ast.Call, names: Mapping[str, Any] | None) -> Any:
    func = ast.unparse(node.func)[:40]
    if func == "dict" and not node.args and all(k.arg for k in node.keywords):
        return {k.arg: _walk(k.value, names) for k in node.keywords}
    if names is not None and func in _FUNCTIONS and not node.keywords:
        return _FUNCTIONS[func](*(_walk(a, names) for a in node.args))
    raise Unreadable(f"calls {func}(), which only runs in the notebook: write the value itself")


def _compare(node: ast.Compare, names: Mapping[str, Any]) -> bool:
    left = _walk(node.left, names)
    for op, right_node in zip(node.ops, node.comparators):
        right = _walk(right_node, names)
        if type(op) not in _COMPARISONS:
            raise Unreadable(f"uses the comparison {_op_text(op)}")
        if not _COMPARISONS[type(op)](left, right):
            return False
        left = right
    return True


def _bool_op(node: ast.BoolOp, names: Mapping[str, Any]) -> Any:
    is_and = isinstance(node.op, ast.And)
    for value_node in node.values:
        value = _walk(value_node, names)
        if bool(value) is not is_and:  # short-circuit like Python
            return value
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _op_text(op: ast.AST) -> str:
    return type(op).__name__
