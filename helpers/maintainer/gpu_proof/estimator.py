"""Section "estimator" of `python -m helpers gpu-proof`: the estimator against the card's allocator.

Models built from catalog configs with random weights (nothing downloaded): a ~0.5B model full and
LoRA, a ~1.5B LoRA and a 7B QLoRA, checkpointing off and on, 512 and 1024 tokens, in the card's own
precision; each row gives the allocator's peak (`torch.cuda.max_memory_allocated`) and the reserved
peak beside the estimator's figures, with the signed error of each. Each QLoRA case is measured a
second time in a T4's precision (fp16: a T4 has no bf16), labelled `stands_for: "T4"`. Every row
says its precision and the card it ran on.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from helpers._util import GIB
from helpers.maintainer.gpu_proof import _cuda, _models
from helpers.maintainer.gpu_proof._proof import Proof

__all__ = ["ESTIMATOR_CASES", "SEQ_LENS", "STAND_IN_CARD", "estimator_grid"]

SEQ_LENS = (512, 1024)
# (catalog model, method): the sizes a student meets, from a full fine-tune to a 7B QLoRA
ESTIMATOR_CASES = (
    ("Qwen2.5-0.5B", "full"),
    ("Qwen2.5-0.5B", "lora"),
    ("Qwen2.5-1.5B", "lora"),
    ("Mistral-7B", "qlora"),
)
STAND_IN_CARD = "T4"  # the card students get for free; the QLoRA cases are measured again in its precision


@dataclass
class _Case:
    model: str
    method: str
    checkpointing: bool
    seq_len: int
    precision: str
    stands_for: str = ""  # a card this row stands for, when it runs in that card's precision, not this one's


def estimator_grid(proof: Proof) -> dict:
    """Every case of `_grid` at every checkpointing and length: a row each, and the median absolute errors."""
    rows = []
    for model_name, method, precision, stands_for in _grid(proof):
        rows += _model_rows(proof, model_name, method, precision, stands_for)
    errors = sorted(abs(r["error_pct"]) for r in rows if "error_pct" in r)
    reserved = sorted(abs(r["reserved_error_pct"]) for r in rows if "reserved_error_pct" in r)
    failed = list(dict.fromkeys(_model_text(r) for r in rows if "error" in r))
    return {
        "rows": rows,
        "median_abs_error_pct": errors[len(errors) // 2] if errors else None,
        "median_abs_reserved_error_pct": reserved[len(reserved) // 2] if reserved else None,
        **({"status": "failed", "error": f"no figure for: {', '.join(failed)}"} if failed else {}),
    }


def _grid(proof: Proof) -> list[tuple[str, str, str, str]]:
    """(model, method, precision, stands_for): ESTIMATOR_CASES in the card's precision, then the QLoRA ones
    again in the stand-in card's (unless this card's precision is already that one)."""
    grid = [(name, method, proof.precision, "") for name, method in ESTIMATOR_CASES]
    stand_in = _models.stand_in_precision(STAND_IN_CARD)
    if stand_in != proof.precision:
        grid += [(name, method, stand_in, STAND_IN_CARD) for name, method in ESTIMATOR_CASES if method == "qlora"]
    return grid


def _model_rows(proof: Proof, model_name: str, method: str, precision: str, stands_for: str) -> list[dict]:
    """One model's rows; one that cannot be built or loaded gives a row with its error, and the others go on."""
    rows = []
    try:
        model, config = _models.model(proof, model_name, method, precision), _models.config(model_name)
        for checkpointing in (False, True):
            for seq_len in SEQ_LENS:
                case = _Case(model_name, method, checkpointing, seq_len, precision, stands_for)
                rows.append(_measure_case(model, config, case, proof))
                print(f"  {_row_text(rows[-1])}", flush=True)
    except Exception as e:
        traceback.print_exc()
        labels = {"precision": precision, "card": proof.card, "stands_for": stands_for}
        rows.append({"model": model_name, "method": method, **labels, "error": f"{type(e).__name__}: {e}"})
    model = None
    _cuda.release()
    return rows


def _measure_case(model, config, case: _Case, proof: Proof) -> dict:
    """Two training steps of `case`: the allocator's peak beside the estimator's `allocated`."""
    import torch

    row = {"model": case.model, "method": case.method, "checkpointing": case.checkpointing, "seq_len": case.seq_len}
    labels = {"precision": case.precision, "card": proof.card, "stands_for": case.stands_for}
    _models.set_checkpointing(model, case.checkpointing)
    _cuda.release()
    try:
        _models.train_steps(model, case.precision, case.seq_len, device=proof.device)
    except torch.OutOfMemoryError as e:
        return {**row, **labels, "error": f"out of memory: {str(e).splitlines()[0]}"}
    measured, reserved = _cuda.peak_bytes(), _cuda.reserved_bytes()
    attn_impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    estimate = _models.estimate(
        config, case.precision, case.seq_len, case.method, case.checkpointing, proof.device, attn_impl
    )
    return {
        **row,
        "measured_gib": round(measured / GIB, 3),
        "estimated_gib": round(estimate.allocated / GIB, 3),
        "error_pct": round(100 * (estimate.allocated - measured) / measured, 1),
        # the caching allocator's slack, ACTIVATION_SLACK's check: reserved against allocated + slack
        "reserved_gib": round(reserved / GIB, 3),
        "estimated_reserved_gib": round(estimate.reserved / GIB, 3),
        "reserved_error_pct": round(100 * (estimate.reserved - reserved) / reserved, 1),
        **labels,
    }


def _model_text(r: dict) -> str:
    """'Mistral-7B qlora fp16 (T4)': which model, method and precision a row measured."""
    return f"{r['model']} {r['method']} {r['precision']}" + (f" ({r['stands_for']})" if r["stands_for"] else "")


def _row_text(r: dict) -> str:
    where = f"{_model_text(r)} ckpt={r['checkpointing']} {r['seq_len']}"
    if "error" in r:
        return f"{where}: {r['error']}"
    figures = f"measured {r['measured_gib']:.2f} GiB, estimated {r['estimated_gib']:.2f} GiB ({r['error_pct']:+.1f} %)"
    return f"{where}: {figures}; reserved {r['reserved_gib']:.2f} GiB ({r['reserved_error_pct']:+.1f} %)"
