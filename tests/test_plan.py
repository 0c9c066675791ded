"""helpers.plan: the ladder of changes that make a job fit a card, cheapest first, the plan as text and the
stack an estimate assumes."""

import subprocess
import sys

import pytest

from helpers.estimate import LOOPS, OPTIMIZER_BYTES, estimate_training_memory
from helpers.plan import (
    LADDER,
    LOOP_LABELS,
    LORA_R_FLOOR,
    OPTIMIZER_LABELS,
    SEQ_LEN_FLOOR,
    assumed_stack,
    format_plan,
    plan,
)


def test_plan_reaches_qlora_for_a_7b_on_a_t4():
    steps = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512)
    assert steps[0].technique == "as asked" and not steps[0].fits
    assert steps[-1].technique == "QLoRA" and steps[-1].fits
    totals = [s.estimate.total for s in steps]
    assert totals == sorted(totals, reverse=True), "every step lowers the predicted memory"
    assert steps[0].estimate.settings["precision"] == "fp16", "a T4 plans in fp16"
    text = format_plan(steps, "T4")
    assert "QLoRA" in text and "yes" in text


def test_the_students_question_llama_3_8b_qlora_at_2048_tokens_on_a_t4_fits_with_a_fused_loss():
    steps = plan("Llama-3-8B", "T4", per_device_batch=1, seq_len=2048, method="qlora")
    assert [s.technique for s in steps] == ["as asked", "fused loss", "gradient checkpointing"]
    assert [s.verdict for s in steps] == ["does not fit", "does not fit", "fits"]
    last = steps[-1].estimate.settings
    assert last["fused_loss"] and last["checkpointing"] and last["method"] == "qlora", "each rung is kept"
    assert all(s.cost for s in steps[1:]) and steps[0].cost == ""
    # asked with checkpointing on, the fused loss alone is what makes it fit
    steps = plan("Llama-3-8B", "T4", per_device_batch=1, seq_len=2048, method="qlora", checkpointing=True)
    assert [(s.technique, s.verdict) for s in steps] == [("as asked", "does not fit"), ("fused loss", "fits")]


@pytest.mark.parametrize(
    "job",
    [
        dict(model="Mistral-7B", per_device_batch=4, seq_len=512, precision="fp32"),
        dict(model="Qwen2.5-0.5B", per_device_batch=16, seq_len=2048, method="lora", loop="custom"),
        dict(model="Qwen2.5-1.5B", per_device_batch=4, seq_len=2048, method="lora", attn_impl="eager"),
        dict(model="Llama-3.1-8B", per_device_batch=8, seq_len=4096, gpu=4.0),
    ],
    ids=["fp32 7B", "custom loop", "eager attention", "nothing fits"],
)
def test_the_ladder_is_climbed_in_its_order_and_each_rung_says_what_it_costs(job):
    job = dict(job)
    model, gpu = job.pop("model"), job.pop("gpu", "T4")
    steps = plan(model, gpu, **job)
    taken = [LADDER.index(s.technique) for s in steps[1:]]
    assert taken == sorted(taken), [s.technique for s in steps]
    text = format_plan(steps, gpu)
    assert all(s.cost and f"{s.why} (cost: {s.cost})" in text for s in steps[1:]), text


def test_a_hand_written_loop_frees_the_output_first_and_that_costs_nothing():
    steps = plan("Qwen2.5-0.5B", "T4", per_device_batch=16, seq_len=2048, method="lora", loop="custom")
    assert steps[1].technique == "drop the output before backward" and steps[1].cost == "nothing"
    assert steps[1].estimate.settings["loop"] == "trainer" and steps[1].estimate.total < steps[0].estimate.total


def test_plan_halves_the_micro_batch_and_keeps_the_effective_batch():
    steps = plan("Llama-3-8B", "T4", per_device_batch=6, seq_len=2048, method="qlora", checkpointing=True)
    accumulation = [s.estimate.settings for s in steps if s.technique == "gradient accumulation"]
    assert [(s["per_device_batch"], s["grad_accum_steps"]) for s in accumulation] == [(3, 2), (1, 6)]
    assert steps[-1].fits


def test_when_nothing_fits_the_ladder_goes_down_to_its_floors_and_says_so():
    steps = plan("Llama-3.1-8B", 4.0, per_device_batch=1, seq_len=4096)
    assert not steps[-1].fits and steps[-1].technique == "shorter seq_len"
    last = steps[-1].estimate.settings
    assert (last["method"], last["lora_r"], last["seq_len"]) == ("qlora", LORA_R_FLOOR, SEQ_LEN_FLOOR)
    assert [s.estimate.settings["lora_r"] for s in steps if s.technique == "smaller LoRA rank"] == [8, 4]
    assert "Nothing fits" in format_plan(steps, 4.0)


def test_a_rung_that_would_not_lower_the_estimate_is_left_out_and_named():
    """Accumulation keeps the gradients alive through the next micro-batch: on a 7B in full it saves nothing."""
    steps = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512, precision="fp32")
    assert "gradient accumulation" in steps.left_out and "gradient accumulation" not in [s.technique for s in steps]
    assert steps[1].technique == "mixed precision", "kept for its speed, though it lowers nothing at 7B"


def test_plan_stops_as_soon_as_it_fits():
    steps = plan("SmolLM2-135M", "A100-80GB", per_device_batch=8, seq_len=512, precision="fp32")
    assert [s.technique for s in steps] == ["as asked"] and steps[0].fits


def test_plan_takes_batch_size_as_the_older_name_of_per_device_batch():
    old = plan("Mistral-7B", "T4", batch_size=4, seq_len=512)
    new = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512)
    assert [s.estimate.as_dict() for s in old] == [s.estimate.as_dict() for s in new]
    with pytest.raises(ValueError, match=r"plan\(\) got per_device_batch=4 and batch_size=4.*pass only"):
        plan("Mistral-7B", "T4", per_device_batch=4, batch_size=4, seq_len=512)
    with pytest.raises(ValueError, match=r"plan\(\) needs the micro-batch on one device: pass per_device_batch"):
        plan("Mistral-7B", "T4", seq_len=512)


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(ValueError, match=r"unknown GPU 'T5': the catalog has T4.*Or pass its memory in GiB"):
        plan("Mistral-7B", "T5", per_device_batch=1, seq_len=512)


def test_the_stack_is_said_from_the_settings():
    args = dict(per_device_batch=1, seq_len=512, method="qlora", checkpointing=True)
    plain = assumed_stack(estimate_training_memory("Mistral-7B", precision="fp16", gpu="T4", **args))
    assert plain.startswith("assumes: the Hugging Face Trainer; fp16 mixed precision")
    assert "peft LoRA r=16 on every linear layer over a bitsandbytes NF4 base" in plain
    assert "math kernel" in plain and "PyTorch's fused AdamW" in plain and "; gradient checkpointing;" in plain
    assert plain.endswith("no fused kernels (Liger's or Unsloth's would take less)")
    other = dict(args, lora_r=8, optimizer="paged_adamw_8bit", fused_loss=True, loop="custom", checkpointing=False)
    changed = assumed_stack(estimate_training_memory("Mistral-7B", gpu="A100-40GB", **other))
    for said in ("hand-written loop", "bf16 mixed precision", "r=8", "flash kernel", "paged AdamW 8-bit"):
        assert said in changed and said not in plain, said
    assert "no gradient checkpointing" in changed and "a fused linear cross-entropy" in changed
    # every choice the estimator takes has words on screen
    assert set(OPTIMIZER_BYTES) <= set(OPTIMIZER_LABELS) and set(LOOPS) == set(LOOP_LABELS)


def test_planning_never_imports_torch():
    """Planning works in a fresh process without torch: that is what makes it answer in milliseconds."""
    code = (
        "import sys, helpers.plan as p; p.plan('Mistral-7B', 'T4', per_device_batch=1, seq_len=512); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
