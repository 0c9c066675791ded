"""The estimator beside two peer estimators from the package index, on published runs none of them wrote.

Peers (pure Python, installed in the benchmark's own venv, never a dependency of the kit):
- fitcheck-llm 0.3.1 (github.com/Anassbzdd/fitcheck): calibrated on its own Tesla T4 runs, the
  rows of scripts/bench/cases/fitcheck-T4.toml; it separates allocated from reserved memory.
- vramcalc 0.1.2 (pypi.org/project/vramcalc): calibrated on its own RTX A6000 runs, the vramcalc
  rows; allocated memory only, no 4-bit models.

Each peer is compared with the kit on the cases it can express and was not calibrated on: fitcheck
on vramcalc's runs and on the kit's older benchmark cases of the decoder families; vramcalc on
fitcheck's LoRA runs (allocated) and on the same older cases. Run:

    python3 -m venv build/peers
    build/peers/bin/pip install fitcheck-llm==0.3.1 vramcalc==0.1.2
    build/peers/bin/python scripts/bench_peers.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # helpers, scripts

import bench_estimator as bench  # noqa: E402

from helpers.estimate import shape_of  # noqa: E402

MIB, GB = 2**20, 10**9
FAMILIES = {"llama": "llama"}  # the estimator's family -> model_type both peers read (Llama, Mistral, Qwen2)
T4_CONTEXT_MIB = 140.875  # fitcheck's measured T4 context, inside its "overhead": reserved is the rest


def _config(case) -> dict | None:
    """The case's model as a config.json dict, or None outside the decoder families both peers read."""
    s = shape_of(case.model)
    if s.family != "llama" or s.qk_norm:
        return None
    return dict(
        model_type="qwen2" if s.qkv_bias else "llama",
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        intermediate_size=s.intermediate,
        vocab_size=s.vocab,
        head_dim=s.head_dim,
        tie_word_embeddings=s.tied,
    )


def _settings(case) -> dict:
    s = dict(case.settings)
    s["per_device_batch"] = s.pop("batch_size", None) or s.get("per_device_batch")
    return s


def fitcheck(case) -> float | None:
    """fitcheck-llm's figure for `case` in its unit: allocated ("tensors") or reserved (process - context)."""
    from fitcheck import TrainingConfig, estimate
    from fitcheck.config_parser import ModelConfig
    from fitcheck.gpu_db import get_gpu

    config, s = _config(case), _settings(case)
    if config is None or case.quantity not in ("allocated", "reserved"):
        return None
    shape = shape_of(case.model)
    model = ModelConfig(
        "case",
        shape.parameters,
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
        config["vocab_size"],
        config["head_dim"],
        config["tie_word_embeddings"],
    )
    method = s.get("method", "full")
    targets = s.get("lora_targets", ["q", "k", "v", "o"])
    training = TrainingConfig(
        precision={"fp32": "fp32", "fp16": "fp16"}.get(s.get("precision", "bf16"), "bf16"),
        quantization="nf4" if method == "qlora" else "none",
        double_quant=method == "qlora" and s.get("double_quant", True),
        batch_size=s["per_device_batch"],
        seq_len=s["seq_len"],
        lora_rank=None if method == "full" else s.get("lora_r", 16),
        lora_targets=[f"{t}_proj" for t in targets]
        if isinstance(targets, list)
        else ["q_proj", "k_proj", "v_proj", "o_proj"],
        grad_checkpoint=s.get("checkpointing", False),
        flash_attn=s.get("attn_impl", "sdpa") != "eager",
    )
    report = estimate(model, training, get_gpu("t4" if case.source == "fitcheck-T4" else "a6000"))
    tensors = report.total_mib - report.overhead_mib
    value = tensors if case.quantity == "allocated" else report.total_mib - T4_CONTEXT_MIB
    return value * MIB / (MIB if case.unit == "MiB" else GB)


def vramcalc(case) -> float | None:
    """vramcalc's figure for `case` in its unit (allocated only; no 4-bit models)."""
    from vramcalc import estimate

    config, s = _config(case), _settings(case)
    if config is None or case.quantity != "allocated" or s.get("method") == "qlora":
        return None
    precision = s.get("precision", "bf16")
    e = estimate(
        config,
        mode="train",
        dtype="fp16" if precision.startswith("fp16") else "fp32" if precision == "fp32" else "bf16",
        batch=s["per_device_batch"],
        seq_len=s["seq_len"],
        lora_rank=None if s.get("method", "full") == "full" else s.get("lora_r", 16),
        grad_checkpoint=s.get("checkpointing", False),
        precision="amp"
        if s.get("weights") == "fp32" or (s.get("method", "full") == "full" and not precision.endswith("-true"))
        else "pure",
        attn_impl=s.get("attn_impl", "sdpa"),
    )
    return e.total / (MIB if case.unit == "MiB" else GB)


PEERS = {"fitcheck-llm": (fitcheck, "fitcheck-T4"), "vramcalc": (vramcalc, "vramcalc-A6000")}


def compare() -> dict[str, dict]:
    """Per peer: over the cases it can express and was not calibrated on, the kit's and the peer's
    median absolute error, their worst under-estimates, and the count."""
    cases = bench.evaluate(bench.LOOP_CASES + bench.CASES)
    found = {}
    for name, (peer, own_source) in PEERS.items():
        pairs = []
        for case in cases:
            if case.source == own_source or not case.in_median:
                continue
            theirs = peer(case)
            if theirs is not None:
                pairs.append((bench.error(bench.ours(case), case.measured), bench.error(theirs, case.measured)))
        found[name] = dict(
            cases=len(pairs),
            kit=statistics.median(abs(k) for k, _ in pairs),
            peer=statistics.median(abs(p) for _, p in pairs),
            kit_worst=min(k for k, _ in pairs),
            peer_worst=min(p for _, p in pairs),
        )
    return found


def main() -> int:
    for name, row in compare().items():
        print(
            f"{name:13} on {row['cases']:2} cases it was not calibrated on: median error kit {100 * row['kit']:.1f}%, "
            f"{name} {100 * row['peer']:.1f}%; worst under-estimate kit {100 * row['kit_worst']:+.1f}%, "
            f"{name} {100 * row['peer_worst']:+.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
