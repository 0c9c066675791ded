"""The estimator against published runs of hand-written loops on a T4, allocated and reserved (issue 26).

The rows are scripts/bench/cases/fitcheck-T4.toml's (the fitcheck archive: 44 distinct runs, each with
torch.cuda.max_memory_allocated and max_memory_reserved); scripts/bench_estimator.py prints the
table. Also the two facts the reserved figure rests on, each checked where it can be: which
attention kernel runs (helpers/estimate/_attention.py) and what the caching allocator reserves
for a known sequence of requests (helpers/_caching_allocator.py).
"""

import pytest
from bench_script import bench_estimator

from helpers._caching_allocator import reserved_peak, round_size, segment_size
from helpers.estimate import Harness, estimate_training_memory
from helpers.estimate._allocator import SCORE_SLACK
from helpers.estimate._attention import attention_kernel

MIB = 2**20
BENCH = bench_estimator()


@pytest.fixture(scope="module")
def summary():
    return BENCH.loop_summary(BENCH.evaluate(BENCH.LOOP_CASES))


def test_every_row_is_a_distinct_run_with_both_figures():
    rows = BENCH.SOURCES["fitcheck-T4"].rows
    assert len(rows) == 44 and len({r["name"].split()[0] for r in rows}) == 44
    assert all(r["reserved"] >= r["allocated"] > r["loaded"] > 0 for r in rows), "reserved >= allocated > loading"
    assert {c.quantity for c in BENCH.LOOP_CASES} == {"allocated", "reserved"}


def test_allocated_within_the_issues_targets(summary):
    assert summary["allocated"]["median"] <= 0.05 and summary["allocated"]["over_10_low"] == 0, summary["allocated"]
    assert summary["allocated, QLoRA"]["median"] <= 0.07, summary["allocated, QLoRA"]
    vramcalc = BENCH.loop_summary(BENCH.evaluate(BENCH.LOOP_CASES), "vramcalc-A6000")["allocated"]
    assert vramcalc["median"] <= 0.05 and vramcalc["over_10_low"] == 0, vramcalc


def test_reserved_within_the_issues_targets(summary):
    reserved = summary["reserved"]
    assert reserved["median"] <= 0.10 and reserved["over_20_low"] == 0, reserved


def test_the_loop_is_what_brings_the_allocated_figure_in():
    """The same rows estimated as if the Trainer ran them miss the logits the loop holds."""
    as_trainer = [
        BENCH.Case(
            c.name, c.source, c.measured, c.unit, c.quantity, c.model, dict(c.settings, loop="trainer"), "float16"
        )
        for c in BENCH.LOOP_CASES
        if c.quantity == "allocated"
    ]
    trainer = BENCH.loop_summary(BENCH.evaluate(as_trainer))["allocated"]
    custom = BENCH.loop_summary(BENCH.evaluate([c for c in BENCH.LOOP_CASES if c.quantity == "allocated"]))["allocated"]
    assert trainer["median"] > 2 * custom["median"] and trainer["over_10_low"] > custom["over_10_low"]


@pytest.mark.parametrize(
    "settings, kernel",
    [
        (dict(attn_impl="eager", dtype="bf16", heads=32, kv_heads=8, head_dim=128), "eager"),
        (dict(attn_impl="sdpa", dtype="bf16", heads=32, kv_heads=8, head_dim=128), "flash"),  # an A100 by default
        (dict(attn_impl="sdpa", dtype="fp16", heads=32, kv_heads=8, head_dim=128, capability=(7, 5)), "math"),
        (dict(attn_impl="sdpa", dtype="fp16", heads=32, kv_heads=32, head_dim=128, capability=(7, 5)), "efficient"),
        (dict(attn_impl="sdpa", dtype="fp32", heads=32, kv_heads=8, head_dim=128), "math"),  # k-bit without autocast
        (dict(attn_impl="sdpa", dtype="fp32", heads=32, kv_heads=32, head_dim=128), "efficient"),
        (dict(attn_impl="sdpa", dtype="bf16", heads=32, kv_heads=32, head_dim=128, capability=(7, 5)), "math"),
        (dict(attn_impl="sdpa", dtype="bf16", heads=8, kv_heads=8, head_dim=512), "efficient"),  # past flash's 256
        (dict(attn_impl="sdpa", dtype="fp32", heads=8, kv_heads=2, head_dim=64, device="cpu"), "flash"),
        (dict(attn_impl="sdpa", dtype="fp32", heads=8, kv_heads=2, head_dim=64, device="cpu", dropout=0.1), "math"),
    ],
)
def test_the_attention_kernel_is_the_one_pytorch_picks(settings, kernel):
    assert attention_kernel(settings.pop("attn_impl"), **settings) == kernel


def test_the_cpu_flash_kernel_takes_fp32_and_grouped_heads_as_the_rule_says():
    """The one rule checkable here: PyTorch's CPU flash kernel accepts what `attention_kernel` says it does."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, kv = torch.randn(1, 8, 64, 32), torch.randn(1, 2, 64, 32)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if the kernel refuses the inputs
        out = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    assert out.shape == q.shape


def test_a_gqa_model_on_a_t4_materializes_its_scores_and_reserves_for_them():
    args = dict(per_device_batch=1, seq_len=2048, method="qlora", precision="fp16", checkpointing=True)
    t4 = estimate_training_memory("Qwen2.5-1.5B", gpu="T4", **args)
    a100 = estimate_training_memory("Qwen2.5-1.5B", gpu="A100-40GB", **args)
    assert (t4.attention, a100.attention) == ("math", "flash")
    scores = 12 * 2048 * 2048  # heads x sequence x sequence, one micro-batch of one
    assert t4.recompute > a100.recompute and t4.reserved - t4.allocated > a100.reserved - a100.allocated
    assert t4.allocator_slack - a100.allocator_slack >= SCORE_SLACK * 4 * scores  # fp32 score matrices more
    with pytest.raises(ValueError, match=r"sdpa_kernel='fast' is not one of 'flash', 'efficient', 'math'"):
        estimate_training_memory("Qwen2.5-1.5B", harness=Harness(sdpa_kernel="fast"), **args)


def test_the_caching_allocator_rounds_splits_and_reuses_as_pytorch_does():
    assert round_size(1) == 512 and round_size(513) == 1024
    assert segment_size(4096) == 2 * MIB and segment_size(3 * MIB) == 20 * MIB and segment_size(11 * MIB) == 12 * MIB
    # a 10 MiB block freed serves a 4 MiB request (split, 6 MiB left cached); 12 MiB needs a new segment
    assert reserved_peak([("a", 10 * MIB), ("a", -10 * MIB), ("b", 4 * MIB), ("c", 12 * MIB)]) == 22 * MIB
    # freed neighbours merge: two 6 MiB halves of a 12 MiB segment serve a 12 MiB request again
    trace = [("a", 12 * MIB), ("a", -12 * MIB), ("b", 6 * MIB), ("c", 6 * MIB), ("b", -6 * MIB), ("c", -6 * MIB)]
    assert reserved_peak([*trace, ("d", 12 * MIB)]) == 12 * MIB
    # small requests share 2 MiB segments
    assert reserved_peak([(i, 100_000) for i in range(20)]) == 2 * MIB
