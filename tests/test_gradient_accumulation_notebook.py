"""Notebook 04 (gradient accumulation), run once headless: each claim points the right way.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="04"` runs only
this one). Every assertion checks a direction or an identity from the recorded figures, never a
number typed in from a run: the embedded model's weights may be trained again.
"""

import pytest
from notebook_results import learned

NOTEBOOKS = ("04_gradient_accumulation",)


def test_04_accumulation_gives_the_large_batchs_gradients(figures):
    r = figures["04_gradient_accumulation"]
    assert r["effective_batch"] == 16
    assert r["accumulation_max_abs_diff"] < 1e-6, "accumulation matches the big batch"
    assert r["activation_ratio_micro_to_batch"] == pytest.approx(1 / 8, rel=0.05)


def test_04_variable_lengths_need_the_token_sum(figures):
    r = figures["04_gradient_accumulation"]
    assert len(set(r["variable_length_tokens"])) > 1, "the trap needs micro-batches of different token counts"
    assert r["variable_length_token_sum_max_abs_diff"] < 1e-6
    assert r["variable_length_naive_max_abs_diff"] > 1000 * r["variable_length_token_sum_max_abs_diff"]
    error = r["variable_length_relative_error"]
    assert error["mean of means"] > 1000 * error["sum / all tokens"]
    assert r["trainer_passes_num_items"] is True, "the Trainer's fix applies to this model"


def test_04_fit_batch_keeps_the_effective_batch_and_the_model_learns(figures):
    r = figures["04_gradient_accumulation"]
    assert r["audit_codes"] == ["batch_misreported"]
    assert r["args_differ_from_shortcut"] == []
    assert r["fit_tried"] == [[8, 2], [4, 4], [2, 8]]
    assert r["effective_batch_parts"] == {"per_device_batch": 2, "grad_accum_steps": 8, "num_devices": 1}
    learned(r, steps=10)
