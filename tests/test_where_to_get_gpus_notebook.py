"""Notebook 00 (where to get GPUs): what it says is what it measured, and the model it loads is the kit's.

The figure tests read the suite's one smoke run of every notebook (tests/conftest.py) and check the
direction of each claim the notebook's text makes, never a typed-in result. The last test checks the
embedded model the notebooks fine-tune: pre-trained far below chance on the responses, with the
fine-tuning format still new to it.

    KIT_ONLY="00" .venv/bin/python -m pytest tests/test_where_to_get_gpus_notebook.py   # runs only this one
"""

import math
import re

import pytest
import torch
from notebook_results import source_cells

from helpers.models import load_model

NOTEBOOKS = ("00_where_to_get_gpus",)


def test_00_cites_a_source_and_a_date_for_each_way_to_get_a_gpu():
    table = next(text for _, _, text in source_cells(NOTEBOOKS[0]) if "## Where the GPU time comes from" in text)
    rows = [r for r in table.splitlines() if r.startswith("|") and not r.startswith("|---")][1:]
    assert len(rows) == 4
    for row in rows[:3]:  # the last row, a university cluster, points to the student's own institution
        source = row.split("|")[-2]
        assert "](https://" in source and re.search(r"\b20\d\d\b", source), row


def test_00_gib_and_gb_and_what_fits_a_t4(figures):
    r = figures["00_where_to_get_gpus"]
    assert r["platform"] == "local" and r["gpu_count"] == 0 and r["precision"] == "fp32" and r["four_bit_ok"]
    for where in ("nvidia_smi", "pytorch"):  # the same bytes are more GB than GiB (10^9 < 2^30)
        assert r["t4_gb"][where] > r["t4_gib"][where]
    assert r["t4_gib"]["pytorch"] < r["t4_gib"]["nvidia_smi"] and r["budget_gib"] == r["t4_gib"]["pytorch"]
    assert r["bytes_per_param"]["bf16"] * 2 == r["bytes_per_param"]["fp32"]
    assert r["bytes_per_param"]["nf4"] * 8 == pytest.approx(r["nf4_bits_per_param"], abs=1e-3)
    full, lora, qlora = r["max_params_b"].values()
    assert full < 1 < lora and 7 < lora < qlora, "the text: full under 1B, LoRA about 8B, QLoRA past a 7B"
    assert lora / full == pytest.approx((8 + r["adamw_bytes_per_param"]) / 2, rel=0.02)  # figures rounded to 0.01


def test_00_plain_transformers_loads_the_same_model_which_sits_far_below_chance(figures):
    r = figures["00_where_to_get_gpus"]
    assert r["model"] == "embedded" and r["plain_load_same_weights"] is True
    assert r["chance_loss"] == pytest.approx(math.log(2048), abs=1e-3)
    assert r["base_loss"] < r["chance_loss"] - 1, "the pre-trained model knows the course text"


def test_embedded_model_is_pretrained_on_the_responses_and_the_fine_tune_format_is_new_to_it():
    from helpers.data import load_course_data

    torch.manual_seed(0)
    model, tokenizer = load_model("embedded")
    rows = load_course_data().select(range(16))
    chance = math.log(len(tokenizer))

    def loss(texts):
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        with torch.no_grad():
            return model(**batch, labels=labels).loss.item()

    responses = loss(list(rows["response"]))
    formatted = loss([i + "\n" + r for i, r in zip(rows["instruction"], rows["response"])])
    assert responses < chance / 2, "pre-trained on the responses: far below chance"
    assert responses < formatted < chance, "the instruction -> response format is left for the fine-tune"
