"""Notebook 02 (mixed precision): the fine-tune learns, the plain recipe is the shortcut, a T4 trains in fp16.

They read the suite's smoke runs (tests/conftest.py; `KIT_ONLY="02"` runs only this one). Notebook
02's number-format figures are checked in tests/test_techniques.py::test_02_figures.
"""

import math

import pytest
from notebook_results import figures_of, simulated_figures

NOTEBOOKS = ("02_mixed_precision",)


@pytest.fixture(scope="module")
def figures(notebook_run):
    """The figures notebook 02 recorded, from the shared smoke run on this CPU."""
    return figures_of(notebook_run, NOTEBOOKS)


def test_02_fine_tune_lowers_the_held_out_loss_with_the_plain_recipe_equal_to_the_shortcut(figures):
    r = figures["02_mixed_precision"]
    assert r["loss_after"] < r["loss_before"] < math.log(2048)
    assert len(r["train_losses"]) == 4 and all(math.isfinite(x) for x in r["train_losses"])  # the smoke run's 4 steps
    assert r["args_differ_from_shortcut"] == [] and r["trained_in"] == r["precision"]
    ratio = r["activations_mib"]["bf16"] / r["activations_mib"]["fp32"]
    assert 0.5 < ratio < 1, "16 bits shrink the activations by less than half"


def test_a_simulated_t4_trains_02_in_fp16_and_00_plans_for_its_memory(simulated_runs):
    assert all(run.returncode == 0 for run in simulated_runs.values())
    r = simulated_figures(simulated_runs)
    r00, r02 = r["00_where_to_get_gpus"], r["02_mixed_precision"]
    assert r00["budget_gib"] == pytest.approx(r00["gpu_memory_gib"], abs=0.01)
    assert r02["trained_in"] == "fp16" and r02["args_differ_from_shortcut"] == []
