"""helpers.plan: the cheapest techniques that make a job fit a card, and the plan as text."""

import subprocess
import sys

import pytest

from helpers.plan import format_plan, plan


def test_plan_reaches_qlora_for_a_7b_on_a_t4():
    steps = plan("Mistral-7B", "T4", per_device_batch=4, seq_len=512)
    assert steps[0].technique == "as asked" and not steps[0].fits
    assert steps[-1].technique == "QLoRA" and steps[-1].fits
    totals = [s.estimate.total for s in steps]
    assert totals == sorted(totals, reverse=True), "every step lowers the predicted memory"
    assert steps[0].estimate.settings["precision"] == "fp16", "a T4 plans in fp16"
    text = format_plan(steps, "T4")
    assert "QLoRA" in text and "yes" in text


def test_plan_halves_the_micro_batch_and_keeps_the_effective_batch():
    steps = plan("Qwen2.5-1.5B", "T4", per_device_batch=16, seq_len=1024, method="lora")
    accumulation = [s for s in steps if s.technique == "gradient accumulation"]
    assert accumulation, [s.technique for s in steps]
    for s in accumulation:
        settings = s.estimate.settings
        assert settings["batch_size"] * settings["grad_accum_steps"] == 16
    assert steps[-1].fits


def test_plan_that_cannot_fit_says_what_to_do():
    steps = plan("Llama-3.1-8B", 4.0, per_device_batch=1, seq_len=4096)
    assert not steps[-1].fits
    assert "Nothing fits" in format_plan(steps, 4.0)


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


def test_planning_never_imports_torch():
    """Planning works in a fresh process without torch: that is what makes it answer in milliseconds."""
    code = (
        "import sys, helpers.plan as p; p.plan('Mistral-7B', 'T4', per_device_batch=1, seq_len=512); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
