"""Sealed answers: the salted hash of a right answer, and explanations only that answer decrypts.

Used by `python -m helpers.quickcheck seal BANK.json` (`seal_file`, for bank authors), and by
`judging` to compare an answer with the stored hash and to unseal the explanation it unlocks:
every `check()` in notebooks 00 ... 08 and `python -m helpers.quickcheck grade`.

An answer is hashed in the canonical form `answers.normalize` gives it ("bd", "160"), the same
form `judging` compares, so a bank sealed here and an answer judged there always agree.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from helpers.quickcheck.answers import normalize
from helpers.quickcheck.bank import BankError, Question, load_bank

__all__ = ["answer_hash", "canonical_for_sealing", "seal_file", "seal_text", "unseal_text"]

_HASH_SALT = "helpers.quickcheck"


def answer_hash(question_id: str, canonical: str) -> str:
    """The salted hash stored for a normalized answer (see `answers.normalize`)."""
    return hashlib.sha256(f"{_HASH_SALT}:{question_id}:{canonical}".encode()).hexdigest()


def seal_text(question_id: str, canonical: str, text: str) -> str:
    """Encrypt `text` with a key made from the right answer; `unseal_text` with that answer reverses it."""
    data = text.encode()
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(question_id, canonical, len(data))))).decode()


def unseal_text(question_id: str, canonical: str, sealed: str) -> str:
    """Decrypt what `seal_text` sealed; with any other answer the result is garbled text, never an error."""
    data = base64.b64decode(sealed)
    plain = bytes(a ^ b for a, b in zip(data, _keystream(question_id, canonical, len(data))))
    return plain.decode("utf-8", errors="replace")


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


def seal_file(path: Path) -> list[str]:
    """Replace every plain "answer" (and its "explanation") in a bank file by a hash and sealed text.

    Returns the ids it sealed. Questions with params keep their formula: they have no single answer.
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
        canonical = canonical_for_sealing(raw)
        raw["answer_sha256"] = answer_hash(qid, canonical)
        if raw.get("explanation"):
            raw["explanation_sealed"] = seal_text(qid, canonical, raw.pop("explanation"))
        del raw["answer"]
        sealed.append(qid)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    load_bank.cache_clear()
    return sealed


def _keystream(question_id: str, canonical: str, n: int) -> bytes:
    out, block = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{_HASH_SALT}:explain:{question_id}:{canonical}:{block}".encode()).digest()
        block += 1
    return out[:n]
