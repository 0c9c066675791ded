"""Notebook 05 (QLoRA), run once headless: each claim points the right way.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="05"` runs only
this one). Every assertion checks a direction or an identity from the recorded figures, or compares
them with a reference computed here (the catalog, the embedded model's config), never a number
typed in from a run: the embedded model's weights may be trained again.
"""

import inspect

import pytest
from notebook_results import figures_of, learned, parameters

from helpers import GIB
from helpers.capstone import CAPSTONE_JOB
from helpers.catalog import gpu_bytes
from helpers.models import EMBEDDED_DIR

NOTEBOOKS = ("05_qlora",)


def test_05_each_format_is_smaller_than_the_last(figures):
    r = figures["05_qlora"]
    assert r["model"] == "embedded"
    mib, bits = r["footprint_mib"], r["bits_per_linear_weight"]
    assert mib["fp32"] > mib["bf16"] > mib["int8"] > max(mib["nf4"], mib["nf4 + double quant"])
    assert mib["bf16"] * 2 == pytest.approx(mib["fp32"], abs=0.001)
    assert bits["fp32"] == 32 and bits["bf16"] == 16
    assert 8 < bits["int8"] < 9 and 4 < bits["nf4"] < 5  # the codes, plus the constants that scale them back


def test_05_the_unquantized_share_of_the_7b_is_what_its_shape_says(figures):
    from helpers.estimate import shape_of

    r = figures["05_qlora"]
    counts = shape_of(r["plan_7b_model"]).parameter_counts()
    kept = counts["embeddings"] + counts["head"] + counts["other"]
    assert r["unquantized_share_7b"] == pytest.approx(kept / sum(counts.values()), abs=1e-4)
    assert r["unquantized_share_7b"] > 0.04, "the capstone's 7B keeps far more than 4 % unquantized"
    assert r["qlora_7b_unquantized_gib"] == pytest.approx(4 * kept / GIB, abs=0.01), "in fp32, 4 bytes a weight"
    assert r["qlora_7b_unquantized_gib"] > r["qlora_7b_weights_gib"] / 2, "as the notebook's text says"
    assert r["embeddings_dtype_before_prepare"] == "bfloat16" and r["embeddings_dtype_after_prepare"] == "float32"


def test_05_double_quantization_lowers_the_bits_per_weight(figures):
    from helpers.estimate import shape_of

    r = figures["05_qlora"]
    # measured on a 4096 x 4096 matrix: 32 / 64 bits without, 8 / 64 + 32 / (64 x 256) with (QLoRA's 0.127)
    assert r["constant_bits_single"] == pytest.approx(32 / 64, abs=1e-3)
    assert r["constant_bits_double"] == pytest.approx(8 / 64 + 32 / (64 * 256), abs=1e-3)
    saved = r["double_quant_saves_bits"]
    assert saved == pytest.approx(r["constant_bits_single"] - r["constant_bits_double"], abs=1e-3)
    linear = shape_of(r["plan_7b_model"]).parameter_counts()["linear"]
    assert r["double_quant_saves_gib_7b"] == pytest.approx(linear * saved / 8 / GIB, abs=0.002)
    # each double-quantized matrix carries a 1 KiB codebook: the embedded model's matrices (at most
    # 11,264 weights) are below the break-even size, so there it costs, as the notebook shows
    assert 10_000 < r["double_quant_break_even_weights"] < 100_000
    assert r["bits_per_linear_weight"]["nf4 + double quant"] > r["bits_per_linear_weight"]["nf4"]


def test_05_the_plain_recipe_equals_load_qlora_and_only_the_adapters_train(figures):
    from transformers import AutoConfig

    r = figures["05_qlora"]
    assert r["plain_recipe_same_as_load_qlora"] == {
        "trainable parameters": True,
        "bytes in memory": True,
        "LoRA settings": True,
    }
    c = AutoConfig.from_pretrained(EMBEDDED_DIR)
    kv = c.num_key_value_heads * c.head_dim
    h, i = c.hidden_size, c.intermediate_size
    # r x (d_in + d_out) for q, k, v, o, gate, up, down in every layer, rank 16
    assert r["trainable_params"] == 16 * c.num_hidden_layers * ((h + h) + 2 * (h + kv) + (h + h) + 3 * (h + i))
    assert r["trainable_pct_7b"] < 1, "on a 7B model the adapters are well under 1 % of the parameters"
    assert r["trainable_pct"] > 10 * r["trainable_pct_7b"], "the embedded model is 64 wide: rank 16 is a large share"
    assert r["frozen_changed"] == 0 and r["adapters_changed_fraction"] == 1.0
    assert abs(r["activation_error_pct"]) < 1  # the estimator against the measured activations
    # LoRA moves the small model less than the noise between batches: the fixed batch's curve is judged
    learned(r, steps=10, curve=False)
    curve = r["eval_losses"]
    assert list(curve) == ["0", "2", "4", "6", "8", "10"], "evaluated before training and every other step"
    assert curve["10"] == r["loss_after"] < curve["0"] == r["loss_before"]
    assert min(list(curve.values())[1:]) < curve["0"]


def test_05_the_7b_plan_ends_in_qlora_and_only_that_fits_a_t4(figures):
    r = figures["05_qlora"]
    totals = list(r["plan_7b_totals_gib"].values())
    assert totals[-1] == min(totals) and totals[-2] < totals[0], "the adapters, then 4 bits, cut the bill most"
    assert r["plan_7b_last_step"] == "QLoRA" and r["plan_7b_fits"] is True
    card = gpu_bytes("T4") / GIB
    assert all(t > card for t in totals[:-1]) and r["plan_7b_total_gib"] == totals[-1] < card


def test_05_and_08_hold_the_capstone_job_in_their_parameters():
    """One 7B job: 05's plan and 08's run take their settings from CAPSTONE_JOB (helpers/capstone.py), whose
    adapter and optimizer are what 08 gets from load_qlora's defaults and the Trainer's."""
    from transformers import TrainingArguments

    from helpers.qlora import load_qlora

    p05, p08, job = parameters("05_qlora"), parameters("08_capstone"), CAPSTONE_JOB
    planned = (p05["plan_model"], p05["plan_gpu"], p05["plan_batch"], p05["plan_grad_accum_steps"], p05["plan_seq_len"])
    assert planned == (job["model"], job["gpu"], job["per_device_batch"], job["grad_accum_steps"], job["seq_len"])
    assert (p05["lora_r"], p05["lora_dropout"]) == (job["lora_r"], job["lora_dropout"])
    assert (p08["per_device_batch"], p08["grad_accum_steps"], p08["seq_len"]) == (
        job["per_device_batch"],
        job["grad_accum_steps"],
        job["seq_len"],
    )
    defaults = inspect.signature(load_qlora).parameters
    assert (defaults["r"].default, defaults["dropout"].default) == (job["lora_r"], job["lora_dropout"])
    assert TrainingArguments.__dataclass_fields__["optim"].default == job["optimizer"]


def test_05_and_08_print_one_figure_for_the_7b_job(notebook_run):
    """`KIT_ONLY="05 08"`: the total 05 prints for notebook 08's job is the one 08 prints before it trains."""
    r = figures_of(notebook_run, ("05_qlora", "08_capstone"))
    assert r["05_qlora"]["capstone_7b_total_gib"] == r["08_capstone"]["planned_total_gib_t4"]
    settings = r["05_qlora"]["capstone_7b_settings"]
    assert (settings["method"], settings["precision"], settings["gpu"]) == ("qlora", "fp16", "T4")
    differ = r["05_qlora"]["plan_7b_differs_from_capstone"]
    assert r["05_qlora"]["plan_7b_total_gib"] == r["05_qlora"]["capstone_7b_total_gib"] or differ, (
        "where the plan's last step and 08's job differ in total, 05 names the settings that differ"
    )
