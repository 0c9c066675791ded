"""The question bank: one JSON file per notebook in `bank/` (`00.json` ... `08.json`), data, not code.

Every notebook's quick checks (the last section of notebooks 00 ... 08) look their questions up here,
and so do the commands `python -m helpers.quickcheck grade` and `student`. A question is a JSON object:

    id            "q04_2": the notebook's number, then the question's
    kind          "choice" (letters), "number", or "property" (a dict of values that must satisfy rules)
    prompt        the question; `{name}` is replaced by the student's own parameter values
    choices       choice: {"a": "...", "b": "..."}; "multiple": true when several letters are right
    decimals      number without params: an answer is right when it rounds, to this many decimals, to the right one
    params        {"memory_gb": [8, 12, 16]}: each student gets one value of each, picked from their id
    expect        number with params: the expected value, an expression over the params
    tolerance     number with params: relative tolerance (0 = exact); default 0.01
    fields        property: {"per_device_batch": "int"}: the keys the answer dict must have
    rules         property: [{"require": "<expression>", "hint": "<shown when it fails>"}], in order
    hint          shown after a wrong answer; explanation: shown after a right one
    feedback_sealed  choice: per option, why picking it (or, multi-answer, leaving it out) is a mistake
    concept       number: the idea the number checks; measured: the notebook's record key it is about
    points        what a right answer is worth; default 1

No answer is stored in plain text. Questions without params keep only `answer_sha256` (a salted
hash of the normalized answer), `explanation_sealed` (the explanation, encrypted with a key made
from the right answer, so only a student who found it can read it) and, for choice questions,
`feedback_sealed` (every option's feedback, each encrypted with a key made from that option and
all of one length, so the file does not show which option is right; see `sealing`). Questions with params keep
the formula or rules: each student's numbers differ, so the method is not an answer to copy.
This keeps answers out of sight; it is not an exam lock: anything checked offline can be found
by trying every choice (about a millisecond for a choice question). The receipts' attempt counts
do not prove how often a student tried either: they are printed text the student controls (the
grade report says what they can and cannot show).

To add or change a question, write it with a plain `"answer"`, `"explanation"` and, for a choice
question, `"why_not"` (the authoring format, with an example, is at the top of `sealing`), then run
`python -m helpers.quickcheck seal helpers/quickcheck/bank/NN.json`, which replaces them with the
hash and the sealed texts (`sealing.seal_file`). The tests fail while a plain answer is left in a
bank file; tests/test_bank_fairness.py checks each bank is fair to a student who reads.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "BANK_DIR",
    "FEEDBACK_STATES",
    "LEFT_OUT",
    "PICKED",
    "QUESTION_ID",
    "BankError",
    "Question",
    "Rule",
    "bank_notebooks",
    "format_text",
    "get_question",
    "load_bank",
    "normalize_student_id",
    "notebook_of",
    "params_for",
]

BANK_DIR = Path(__file__).with_name("bank")
QUESTION_ID = re.compile(r"^q(\d\d)_([A-Za-z0-9]+)$")
_KINDS = ("choice", "number", "property")
_FIELD_TYPES = ("int", "number")
# an option's state in a student's answer: the keys of `feedback_sealed` (LEFT_OUT only for multi-answer questions)
PICKED, LEFT_OUT = "picked", "left_out"
FEEDBACK_STATES = (PICKED, LEFT_OUT)


class BankError(ValueError):
    """A bank file or question that cannot be used; the message names the file, the question and the fix."""


@dataclass(frozen=True)
class Rule:
    require: str
    hint: str


@dataclass(frozen=True)
class Question:
    """One quick check, as loaded from its notebook's bank file."""

    id: str
    kind: str
    prompt: str
    hint: str
    points: float = 1
    explanation: str = ""
    explanation_sealed: str = ""
    feedback_sealed: dict = field(default_factory=dict)
    concept: str = ""
    measured: str = ""
    choices: dict = field(default_factory=dict)
    multiple: bool = False
    answer_sha256: str = ""
    decimals: int = 0
    params: dict = field(default_factory=dict)
    expect: str = ""
    tolerance: float = 0.01
    fields: dict = field(default_factory=dict)
    rules: tuple = ()

    @property
    def notebook(self) -> str:
        """The notebook number, "00" ... "08"."""
        return self.id[1:3]

    @property
    def variable(self) -> str:
        """The variable a notebook's answer cell assigns: answer_q04_2."""
        return f"answer_{self.id}"

    @property
    def personal(self) -> bool:
        """True when each student gets their own numbers (the question has params)."""
        return bool(self.params)


def notebook_of(question_id: str) -> str:
    """The notebook number of a question id ("q04_2" -> "04"); ValueError for a malformed id."""
    m = QUESTION_ID.match(question_id) if isinstance(question_id, str) else None
    if not m:
        raise ValueError(f"{question_id!r} is not a question id: they look like 'q04_2' (notebook 04, question 2)")
    return m.group(1)


@cache
def load_bank(notebook: str, folder: Path = BANK_DIR) -> tuple[Question, ...]:
    """The questions of one notebook ("00" ... "08"), in bank order; empty if it has no bank file."""
    path = Path(folder) / f"{notebook}.json"
    if not path.exists():
        return ()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BankError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise BankError(f'{path} must hold an object with a "questions" list')
    questions = tuple(_question(q, path, notebook) for q in data["questions"])
    ids = [q.id for q in questions]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise BankError(f"{path}: question ids {duplicated} appear more than once; give each question its own id")
    return questions


def bank_notebooks(folder: Path = BANK_DIR) -> list[str]:
    """The notebook numbers that have a bank file, sorted."""
    return sorted(p.stem for p in Path(folder).glob("[0-9][0-9].json"))


def get_question(question_id: str) -> Question:
    """The question with this id; KeyError listing the notebook's ids when there is none."""
    notebook = notebook_of(question_id)
    for q in load_bank(notebook):
        if q.id == question_id:
            return q
    known = ", ".join(q.id for q in load_bank(notebook)) or "none"
    raise KeyError(f"no quick check {question_id!r} in {BANK_DIR / (notebook + '.json')}; its questions: {known}")


def normalize_student_id(student_id: Any) -> str:
    """The id as the parameters are derived from it: text, stripped, case-insensitive ("" for none)."""
    if student_id is None or isinstance(student_id, bool):
        return ""
    return str(student_id).strip().casefold()


def params_for(question: Question, student_id: Any) -> dict:
    """This student's values of the question's parameters: the same id always gets the same numbers."""
    sid = normalize_student_id(student_id)
    values = {}
    for name, options in question.params.items():
        # surrogatepass: an id read from a cell may hold a lone surrogate ("\udce9"); valid text hashes as before
        digest = hashlib.sha256(f"{question.id}:{name}:{sid}".encode("utf-8", "surrogatepass")).digest()
        values[name] = options[int.from_bytes(digest[:8], "big") % len(options)]
    return values


def format_text(template: str, values: dict) -> str:
    """Fill `{name}` placeholders; numbers print without a trailing .0 (16, not 16.0)."""
    shown = {k: (f"{v:g}" if isinstance(v, float) else v) for k, v in values.items()}
    return template.format_map(shown) if values else template


def _question(raw: Any, path: Path, notebook: str) -> Question:
    where = f"{path}: question {raw.get('id', '?') if isinstance(raw, dict) else raw!r}"
    if not isinstance(raw, dict):
        raise BankError(f"{where} must be a JSON object")
    if "answer" in raw:
        raise BankError(f"{where} has a plain answer; run `python -m helpers.quickcheck seal {path}`")
    if "why_not" in raw:
        raise BankError(
            f'{where} has a plain "why_not": give it its "answer" and "explanation" too, then run '
            f"`python -m helpers.quickcheck seal {path}`"
        )
    qid = raw.get("id", "")
    if not QUESTION_ID.match(str(qid)) or notebook_of(qid) != notebook:
        raise BankError(f"{where}: the id must look like q{notebook}_1 (this file is notebook {notebook})")
    kind = raw.get("kind")
    if kind not in _KINDS:
        raise BankError(f"{where}: kind {kind!r} is not one of {_KINDS}")
    for key in ("prompt", "hint"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise BankError(f"{where}: needs a non-empty {key!r} text")
    for key in ("concept", "measured"):
        if not isinstance(raw.get(key, ""), str):
            raise BankError(f"{where}: {key!r} must be text (a sentence, or a record key)")
    params = raw.get("params", {})
    if not isinstance(params, dict) or not all(isinstance(v, list) and v for v in params.values()):
        raise BankError(f'{where}: "params" maps each name to a non-empty list of values')
    rules = tuple(Rule(r["require"], r["hint"]) for r in raw.get("rules", []))
    known = {k: raw[k] for k in Question.__dataclass_fields__ if k in raw and k != "rules"}
    q = Question(**{**known, "params": params, "rules": rules})
    problem = _kind_problem(q) or _placeholder_problem(q)
    if problem:
        raise BankError(f"{where}: {problem}")
    return q


def _placeholder_problem(q: Question) -> str:
    """A `{name}` in the texts that neither the params nor the answer fields define, or ""."""
    texts = [q.prompt, q.hint, q.explanation, *(r.hint for r in q.rules)]
    names = {name for text in texts for _, name, _, _ in string.Formatter().parse(text) if name is not None}
    unknown = sorted(names - set(q.params) - set(q.fields))
    return f"the texts use {{{unknown[0]}}}, which is not one of its params or fields" if unknown else ""


def _kind_problem(q: Question) -> str:
    """What is missing for the question's kind, or ""."""
    if q.kind == "choice":
        if len(q.choices) < 2 or not all(re.fullmatch(r"[a-z]", k) for k in q.choices):
            return 'a choice question needs "choices" with at least two single-letter keys ("a", "b", ...)'
        if not q.answer_sha256 or q.params:
            return 'a choice question needs "answer_sha256" and no "params"'
        return _feedback_problem(q)
    elif q.kind == "number":
        if q.params and not q.expect:
            return 'a number question with "params" needs "expect", the expected value as an expression'
        if not q.params and not q.answer_sha256:
            return 'a number question without "params" needs "answer_sha256" (write "answer", then seal)'
    elif q.kind == "property":
        if not q.fields or not q.rules:
            return 'a property question needs "fields" and "rules"'
        if any(t not in _FIELD_TYPES for t in q.fields.values()):
            return f'"fields" types must be one of {_FIELD_TYPES}'
    return ""


def _feedback_problem(q: Question) -> str:
    """What is wrong with a choice question's `feedback_sealed` (optional: older banks have none), or ""."""
    if not q.feedback_sealed:
        return ""
    states = FEEDBACK_STATES if q.multiple else (PICKED,)
    fb = q.feedback_sealed
    if not isinstance(fb, dict) or set(fb) != set(states):
        return f'"feedback_sealed" must have the keys {list(states)}: write "why_not" and seal the question again'
    for state in states:
        entries = fb[state]
        texts = isinstance(entries, dict) and all(isinstance(v, str) for v in entries.values())
        if not texts or set(entries) != set(q.choices):
            return (
                f'"feedback_sealed" {state!r} must have an entry for every option ({", ".join(q.choices)}): '
                'write "why_not" and seal the question again'
            )
    return ""
