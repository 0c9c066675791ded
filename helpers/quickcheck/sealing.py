"""Sealed answers: the salted hash of a right answer, and feedback texts that do not show which answer is right.

Used by `python -m helpers.quickcheck seal BANK.json` (`seal_file`, for bank authors), and by
`judging` to compare an answer with the stored hash and to unseal the explanation and the per-option
feedback: every `check()` and `ask()` in notebooks 00 ... 08 and `python -m helpers.quickcheck grade`.

Authoring a question (in `helpers/quickcheck/bank/NN.json`, then run the seal command):

    {
      "id": "q02_1", "kind": "choice",
      "prompt": "Why does fp16 training scale the loss?",
      "choices": {"a": "to speed up the matrix multiplications",
                  "b": "to keep small gradients from underflowing to zero",
                  "c": "to save activation memory",
                  "d": "because bf16 needs it as well"},
      "answer": "b",
      "hint": "Think about the smallest numbers fp16 can hold, not the largest.",
      "explanation": "fp16's smallest normal number is about 6e-5: ... (shown after a right answer)",
      "why_not": {"a": "the scale multiplies the loss once; ... (shown when a student picks a)",
                  "c": "activations are stored in the same format with or without it; ...",
                  "d": "bf16 has fp32's exponent range, so its gradients do not underflow; ..."}
    }

- `why_not` (choice questions): one text per option that is a mistake to pick, each saying why
  in the student's terms; it is shown after "Not yet", before the hint, when the student picks
  that option (`check()`, `ask()`, the grader's feedback file). One-answer questions: every
  option except the answer. Questions with `"multiple": true`: EVERY option: for a wrong one, why
  not to pick it; for a right one, why it belongs (shown when a student leaves it out). A wrong
  multi-letter answer shows the first mistaken option in letter order: one per try, as a
  one-answer question reveals one wrong option per try.
- Number questions have no options, so no `why_not`; they say what they test with `"concept"` (the
  idea the number checks, in at least 6 words the prompt does not already state) or `"measured"`
  (the `helpers.record` key of the notebook's figure the question is about).

    {"id": "q03_4", "kind": "choice", "multiple": true, "answer": "ac", ...,
     "why_not": {"a": "why a belongs", "b": "why not b", "c": "why c belongs", "d": "why not d"}}
    {"id": "q02_4", "kind": "number", "params": {"params_b": [1, 3, 7]}, "expect": "params_b * 2", ...,
     "concept": "bf16 stores every weight in 2 bytes, half of what fp32 takes"}

tests/test_bank_fairness.py checks a bank (`pytest tests/test_bank_fairness.py -k 03`): at least 3
questions, a why-not for every wrong option, a concept or measured figure for every number; and
over the whole bank's one-answer questions, the right option strictly the longest in at most 40 %
and each letter right in at most 40 % of them.

What sealing stores, so the JSON does not show which option is right by its shape: `answer_sha256`
(a salted hash of the normalized answer), `explanation_sealed` (the explanation, encrypted with a
key made from the right answer) and, for a choice question, `feedback_sealed`:
`{"picked": {letter: text, ...}}` with an entry for EVERY option (the answer's entry holds the
explanation), plus `"left_out"` for multi-answer questions (a right option's entry holds its
"why it belongs", a wrong option's is empty). Each entry is encrypted with a key made from its
option and state, and every entry of a question is padded to the same length, so neither the
ciphertexts nor their lengths single out the right option. Those keys are public (a letter), so
this hides answers from a reader of the JSON, not from someone running code: a choice question is
found by trying each option in a millisecond anyway (see `bank`).

An answer is hashed in the canonical form `answers.normalize` gives it ("bd", "160"), the same
form `judging` compares, so a bank sealed here and an answer judged there always agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from helpers.quickcheck.answers import normalize
from helpers.quickcheck.bank import LEFT_OUT, PICKED, BankError, Question, load_bank

__all__ = [
    "answer_hash",
    "canonical_for_sealing",
    "seal_file",
    "seal_text",
    "seal_why_not",
    "unseal_option",
    "unseal_text",
]

_HASH_SALT = "helpers.quickcheck"
_PAD_BLOCK = 64  # bytes: every option's sealed feedback is padded to a multiple of this, the same for all options


def answer_hash(question_id: str, canonical: str) -> str:
    """The salted hash stored for a normalized answer (see `answers.normalize`)."""
    return hashlib.sha256(f"{_HASH_SALT}:{question_id}:{canonical}".encode()).hexdigest()


def seal_text(question_id: str, key: str, text: str, width: int = 0) -> str:
    """Encrypt `text` (padded with NULs to `width` bytes) with a keystream made from `key`.

    `key` is the right answer's canonical form for an explanation, `<state>:<letter>` for an option's
    feedback; `unseal_text` with the same key reverses it.
    """
    data = text.encode().ljust(width, b"\0")
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(question_id, key, len(data))))).decode()


def unseal_text(question_id: str, key: str, sealed: str) -> str:
    """Decrypt what `seal_text` sealed; with any other key the result is garbled text, never an error."""
    data = base64.b64decode(sealed)
    plain = bytes(a ^ b for a, b in zip(data, _keystream(question_id, key, len(data))))
    return plain.decode("utf-8", errors="replace").rstrip("\0")


def unseal_option(q: Question, state: str, letter: str) -> str:
    """The feedback for option `letter` in `state` (PICKED or LEFT_OUT); "" when the bank has none for it."""
    sealed = q.feedback_sealed.get(state, {}).get(letter)
    return unseal_text(q.id, f"{state}:{letter}", sealed) if sealed else ""


def canonical_for_sealing(raw: dict) -> str:
    """The canonical form of a plain bank "answer" (a question as written in JSON, before sealing)."""
    q = Question(
        id=raw["id"],
        kind=raw["kind"],
        prompt="",
        hint="",
        choices=raw.get("choices", {}),
        multiple=raw.get("multiple", False),
        decimals=raw.get("decimals", 0),
    )
    if q.kind not in ("choice", "number"):
        raise ValueError(f'{q.id}: only choice and number questions have one "answer" to seal')
    return normalize(q, raw["answer"])[0]


def seal_why_not(raw: dict, canonical: str) -> dict:
    """The `feedback_sealed` of a plain choice question: an entry per option (and state), all one length.

    BankError naming the question, the missing or extra letters and the fix when `why_not` is incomplete.
    """
    qid, letters, right = raw["id"], list(raw["choices"]), set(canonical)
    multiple = bool(raw.get("multiple"))
    why = raw.get("why_not")
    needed = letters if multiple else [k for k in letters if k not in right]
    what = (
        "every option: for a wrong one why not to pick it, for a right one why it belongs"
        if multiple
        else f"each option but the answer ({canonical})"
    )
    if not isinstance(why, dict):
        raise BankError(f'{qid}: a choice question needs "why_not": {{"letter": "text", ...}} for {what}')
    missing = [k for k in needed if not (isinstance(why.get(k), str) and why[k].strip())]
    answers = sorted(k for k in why if k in right and k not in needed)
    strays = sorted(k for k in why if k not in letters)
    problems = (
        ([f"no text for {', '.join(missing)}"] if missing else [])
        + ([f'a text for the answer {", ".join(answers)} (that is the "explanation")'] if answers else [])
        + ([f"{', '.join(strays)}, which {'is' if len(strays) == 1 else 'are'} not an option"] if strays else [])
    )
    if problems:
        raise BankError(f'{qid}: "why_not" has {" and ".join(problems)}; it needs a text for {what}')
    explanation = (raw.get("explanation") or "").strip()
    if not explanation:
        raise BankError(f'{qid}: needs an "explanation" (shown after a right answer)')
    if multiple:
        texts = {
            PICKED: {k: "" if k in right else why[k].strip() for k in letters},
            LEFT_OUT: {k: why[k].strip() if k in right else "" for k in letters},
        }
    else:
        texts = {PICKED: {k: explanation if k in right else why[k].strip() for k in letters}}
    longest = max(len(t.encode()) for by_letter in texts.values() for t in by_letter.values())
    width = -(-max(longest, 1) // _PAD_BLOCK) * _PAD_BLOCK
    return {
        state: {k: seal_text(qid, f"{state}:{k}", t, width) for k, t in by_letter.items()}
        for state, by_letter in texts.items()
    }


def seal_file(path: Path) -> list[str]:
    """Replace every plain "answer", "explanation" and "why_not" in a bank file by a hash and sealed text.

    Returns the ids it sealed. Questions with params keep their formula: they have no single answer.
    Nothing is written when a question cannot be sealed (BankError naming it and the fix).
    """
    path = Path(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    sealed = []
    for raw in data.get("questions", []):
        if "answer" not in raw:
            continue
        qid = raw.get("id", "?")
        if raw.get("params"):
            raise BankError(
                f"{path}: {qid} has params, so each student's answer differs: "
                f'remove "answer" and give "expect" (number) or "rules" (property)'
            )
        if "why_not" in raw and raw.get("kind") != "choice":
            raise BankError(f'{path}: {qid} is a {raw.get("kind")} question: only choice questions have "why_not"')
        canonical = canonical_for_sealing(raw)
        if raw["kind"] == "choice":
            try:
                raw["feedback_sealed"] = seal_why_not(raw, canonical)
            except BankError as e:
                raise BankError(f"{path}: {e}") from None
            raw.pop("why_not", None)
        raw["answer_sha256"] = answer_hash(qid, canonical)
        if raw.get("explanation"):
            raw["explanation_sealed"] = seal_text(qid, canonical, raw.pop("explanation"))
        del raw["answer"]
        sealed.append(qid)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    load_bank.cache_clear()
    return sealed


def _keystream(question_id: str, key: str, n: int) -> bytes:
    out, block = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{_HASH_SALT}:explain:{question_id}:{key}:{block}".encode()).digest()
        block += 1
    return out[:n]
