"""Notebook 06 (experiment tracking), run once headless: its figures point the way the text says.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="06"` runs only
this one), which is given a planted wandb key and Hub token (fakes, named as such) and a wandb server
that refuses connections, so notebook 06 takes the "key found, server unreachable" path and the last
test can look for the planted values in everything the run printed or wrote.
"""

import base64
import math
import statistics

import pytest
from notebook_results import figures_of, parameters

from helpers.manifest import load_manifest

NB06 = "06_experiment_tracking"
NOTEBOOKS = (NB06,)
MINE = (NB06, "07_kaggle_t4x2", "08_capstone")  # the notebooks whose learning rates must agree


@pytest.fixture(scope="module")
def run(notebook_run):
    """(figures by notebook, output folder, what the runner printed), from the shared smoke run."""
    return figures_of(notebook_run, NOTEBOOKS), notebook_run.out, notebook_run.printed


def test_06_07_and_08_recommend_the_same_learning_rates():
    full_06, full_07, lora_08 = (parameters(stem)["learning_rate"] for stem in MINE)
    assert full_06 == full_07, "a full fine-tune's rate: 06 and 07 must agree"
    assert lora_08 > full_06, "LoRA's rate lies above a full fine-tune's, as notebook 06 measures"
    rates = parameters(NB06)["sweep_learning_rates"]
    assert full_06 in rates and lora_08 in rates, "the sweep tries a real model's rates too"


def test_06_the_tiny_models_rates_are_the_sweeps_best_on_it(ran):
    """Every notebook gives the tiny built-in model `tiny_learning_rate`: its full and LoRA values are the
    best of this sweep on it (the smoke run trains the tiny model), and a real model's rates barely move it."""
    r = ran[0][NB06]
    assert r["best_lr_full"] == parameters(NB06)["tiny_learning_rate"]
    lora = {parameters(stem)["tiny_learning_rate"] for stem in ("05_qlora", "08_capstone")}
    assert lora == {r["best_lr_lora"]}
    rates, full = r["sweep_learning_rates"], r["sweep_eval_loss_full"]
    real = full[rates.index(parameters(NB06)["learning_rate"])]
    assert r["base_eval_loss"] - real < (r["base_eval_loss"] - min(full)) / 2, "5e-5 moves the tiny model little"


def test_06_the_plain_recipe_and_the_shortcut_give_the_same_run(ran):
    r = ran[0][NB06]
    assert r["plain_kit_differing_args"] == []
    assert r["plain_losses"] == r["kit_losses"] and len(r["plain_losses"]) == 4  # max_steps=4 in the smoke run


def test_06_lora_wants_a_higher_learning_rate_than_a_full_fine_tune(ran):
    r = ran[0][NB06]
    rates = r["sweep_learning_rates"]
    for method in ("full", "lora"):
        losses = r[f"sweep_eval_loss_{method}"]
        assert len(losses) == len(rates) and all(math.isfinite(x) for x in losses)
        assert r[f"best_lr_{method}"] == rates[losses.index(min(losses))], "the best is the lowest held-out loss"
        assert min(losses) < r["base_eval_loss"], f"{method}: the best run lowers the held-out loss"
    assert r["best_lr_lora"] > r["best_lr_full"]


def test_06_no_seed_differs_although_the_trainer_defaults_to_42(ran):
    r = ran[0][NB06]
    assert r["trainer_default_seed"] == 42
    assert r["trainer_default_learning_rate"] == parameters(NB06)["learning_rate"], "06 starts at the default"
    assert r["no_seed_max_abs_diff"] > 0


def test_06_every_seed_lowers_the_held_out_loss_along_its_own_path(ran):
    r = ran[0][NB06]
    curves = r["held_out_curve_per_seed"]
    assert len(curves) == 3 and all(len(c) == 5 for c in curves.values())  # step 0, then 4 steps
    assert len({c[0] for c in curves.values()}) == 1, "every seed starts from the same model"
    assert all(c[-1] < c[0] for c in curves.values()), "each fine-tune lowers the held-out loss"
    assert sorted(c[-1] for c in curves.values()) == sorted(r["eval_loss_per_seed"])
    assert len({tuple(c[1:]) for c in curves.values()}) == 3, "each seed takes its own path"


def test_06_same_seed_same_losses_other_seeds_spread(run):
    r = run[0]["06_experiment_tracking"]
    assert r["same_seed_max_abs_diff"] == 0.0, "same seed on CPU: the plain recipe and the kit's, bit for bit"
    assert r["other_seed_max_abs_diff"] > 0
    values = r["eval_loss_per_seed"]
    assert len(values) == 3 and len(set(values)) == 3
    assert r["eval_loss_std"] > 0
    assert r["eval_loss_mean"] == pytest.approx(statistics.fmean(values))
    assert r["eval_loss_std"] == pytest.approx(statistics.stdev(values))


def test_06_manifest_of_the_best_checkpoint_names_its_seed(run):
    figures, out, _ = run
    r = figures["06_experiment_tracking"]
    work = out / "work" / "06_experiment_tracking"
    checkpoints = sorted((work / "build" / "runs").glob("seed-*/checkpoint-*"))
    assert len(checkpoints) == 6  # 3 seeds x (half way, end)
    manifests = {c: load_manifest(c) for c in checkpoints}  # one next to every checkpoint
    best = min(checkpoints, key=lambda c: manifests[c]["metrics"]["last_eval_log"]["eval_loss"])
    assert r["best_checkpoint"] == best.relative_to(work).as_posix()
    assert r["manifest_seed"] == r["best_checkpoint_seed"] == int(best.parent.name.removeprefix("seed-"))
    assert r["manifest_effective_batch"] == 8
    assert r["manifest_learning_rate"] == r["seed_learning_rate"] == r["best_lr_full"], "the sweep's best full rate"
    for c, m in manifests.items():
        assert m["training"]["seed"] == int(c.parent.name.removeprefix("seed-"))
        assert m["metrics"]["last_eval_log"]["step"] == m["step"] == int(c.name.removeprefix("checkpoint-"))
        assert m["tracking"]["mode"] == "offline"


def test_06_tracking_went_offline_without_a_prompt_and_leaked_nothing(run, notebook_run):
    _, out, printed = run
    nb06 = (out / "notebooks" / "06_experiment_tracking.ipynb").read_text()
    assert "a W&B key was found (the WANDB_API_KEY environment variable)" in nb06
    assert "wandb sync " in nb06
    needles = [
        form
        for secret in notebook_run.planted_secrets  # as text, and as an HTTP Basic header carries it
        for form in (secret.encode(), base64.b64encode(f"api:{secret}".encode()), base64.b64encode(secret.encode()))
    ]
    leaks = [str(p) for p in out.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]
    assert leaks == [], f"a planted secret was written to {leaks}"
    assert not any(n.decode() in printed for n in needles)
