"""Right on the cards students get: a simulated T4 and Kaggle T4 x2, and the defects only a card shows.

The simulated runs execute every notebook on this CPU as if on the card (`helpers.simulate`): they
walk the code paths a T4 takes (fp16, the single-GPU pin, the card's memory) and a fake GPU stands
in only where a real one must exist (a CUDA device for `load_model`'s placement).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from notebook_results import simulated_figures

from helpers import env, models, simulate
from helpers._requirements import read_pins
from helpers._util import GIB, MIB
from helpers.catalog import gpu_bytes, load_catalog
from helpers.maintainer.notebooks import NOTEBOOKS_DIR, REPO_ROOT
from helpers.session import start
from helpers.training import effective_batch_size, training_args

NOTEBOOKS = sorted(p.stem for p in NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.fixture
def card(monkeypatch):
    """Simulate a card in this process: card("T4x2")."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def use(name):
        monkeypatch.setenv(simulate.VARIABLE, name)

    return use


# ---------------------------------------------------------------------------------------------
# the simulation itself


def test_a_simulated_t4_reports_what_pytorch_reports_on_colab(card):
    card("T4")
    (gpu,) = env.detect_gpus()
    assert gpu.total_bytes == 15_102 * MIB and gpu.capability == (7, 5) and gpu.name.endswith("(simulated)")
    assert env.choose_precision(env.detect_gpus()).name == "fp16"
    machine = env.describe()
    assert machine.simulated and "SIMULATED T4" in machine.summary() and "measured on the CPU" in machine.summary()


def test_a_simulated_card_is_the_catalogs_card_as_pytorch_reports_it(card):
    card("A100")
    (gpu,) = env.detect_gpus()
    assert (gpu.name, gpu.total_bytes, gpu.capability) == ("NVIDIA A100-SXM4-40GB (simulated)", 40_536 * MIB, (8, 0))
    assert env.choose_precision(env.detect_gpus()).name == "bf16"
    gpus = load_catalog("gpus")
    for name, (entry, count) in simulate.CARDS.items():
        assert gpus[entry]["memory_source"] == "pytorch", f"{name}: simulate what PyTorch reports, not nvidia-smi"
        card(name)
        assert env.detect_gpus() == tuple(
            env.Gpu(i, gpus[entry]["device_name"] + " (simulated)", gpu_bytes(entry), tuple(gpus[entry]["capability"]))
            for i in range(count)
        )


def test_an_unknown_card_names_the_ones_there_are(card):
    card("V100")
    with pytest.raises(ValueError, match="use one of T4, T4x2, A100"):
        env.detect_gpus()


def test_nvml_lists_both_t4s_whatever_the_mask(card, monkeypatch):
    card("T4x2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert len(env.detect_gpus()) == 1 and len(env.detect_gpus(use_nvml=True)) == 2


def test_the_runner_refuses_an_unknown_card(tmp_path):
    from helpers.maintainer.runner import UsageError, run

    with pytest.raises(UsageError, match="--simulate 'H200' is not a card"):
        run(["00"], smoke=True, out=tmp_path, simulate="H200")


# ---------------------------------------------------------------------------------------------
# Kaggle T4 x2: one card per single-GPU notebook, and an effective batch that says so


def test_on_t4x2_an_unpinned_trainer_doubles_the_effective_batch_and_the_pin_restores_it(card, monkeypatch, capsys):
    card("T4x2")
    settings = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16}
    args = training_args(str(Path("/tmp/kit-t4x2")), quiet=True, **settings)
    assert effective_batch_size(args) == 32, "what the Trainer's n_gpu = 2 really steps on"
    assert effective_batch_size(settings) == 32
    assert env.use_one_gpu() == 1
    assert "trains on GPU 0 only" in capsys.readouterr().out
    assert effective_batch_size(args) == 16 and effective_batch_size(settings) == 16


def test_the_pin_is_refused_once_cuda_has_started(card, monkeypatch, capsys):
    card("T4x2")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # a fake: CUDA cannot start here
    assert env.use_one_gpu() == 2
    assert "restart the kernel" in capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_every_single_gpu_notebook_pins_one_gpu_in_its_first_cells():
    for stem in NOTEBOOKS:
        cells = json.loads((NOTEBOOKS_DIR / f"{stem}.ipynb").read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        # the install cell, the parameters cell, then the setup call, before anything can start CUDA
        calls = re.findall(r"^machine = helpers\.start\((.*)\)$", code[2], re.M)
        assert len(calls) == 1, f"{stem}: the third code cell should be the setup call, machine = helpers.start(...)"
        pinned = "one_gpu=False" not in calls[0]
        assert pinned == (stem != "07_kaggle_t4x2"), f"{stem}: only notebook 07 may leave both cards visible"


def test_start_pins_one_card_on_t4x2_and_says_it_is_simulated(card, capsys):
    card("T4x2")
    machine = start(seed=None)
    out = capsys.readouterr().out
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0" and len(machine.gpus) == 1
    assert out.count("SIMULATED T4x2") == 1 and "trains on GPU 0 only" in out and "seed" not in out


@pytest.mark.slow
def test_start_for_notebook_07_keeps_both_cards_and_cuda_unstarted(card, capsys):
    card("T4x2")
    with pytest.raises(ValueError, match=r"start\(seed=7, one_gpu=False\).*Pass seed=None.*set_seed\(7\) there"):
        start(seed=7, one_gpu=False)
    machine = start(seed=None, one_gpu=False)
    assert len(machine.gpus) == 2 and "CUDA_VISIBLE_DEVICES" not in os.environ
    # what accelerate's notebook_launcher checks in the notebook's process: no CUDA, no bitsandbytes
    code = "import sys, torch, helpers; helpers.start(seed=None, one_gpu=False); "
    code += "assert not torch.cuda.is_initialized() and 'bitsandbytes' not in sys.modules"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


# ---------------------------------------------------------------------------------------------
# the dtype a card picks silently, and the T4's usable memory


def test_load_model_keeps_fp32_weights_on_a_t4(card, monkeypatch, tmp_path):
    """On a T4 the default used to be fp16 weights: a pure-fp16 AdamW step, NaN after one step."""
    card("T4")
    folder = tmp_path / "model"
    folder.mkdir()
    loaded = {}

    class FakeModel:  # stands in for a model on a GPU, which cannot exist here
        def to(self, device):
            loaded["device"] = device
            return self

    def fake_from_pretrained(source, *, dtype, **kwargs):
        loaded["dtype"] = dtype
        return FakeModel(), None

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a fake: a T4 is attached
    monkeypatch.setattr(models, "load_pretrained", fake_from_pretrained)
    models.load_model(str(folder))
    assert loaded == {"dtype": torch.float32, "device": "cuda"}


def test_the_catalog_plans_against_what_pytorch_can_use_on_a_t4():
    t4 = load_catalog("gpus")["T4"]
    assert gpu_bytes("T4") == 15_102 * MIB and t4["memory_source"] == "pytorch" and t4["nvidia_smi_mib"] == 15_360
    from helpers.estimate import estimate_training_memory

    e = estimate_training_memory("Qwen2.5-0.5B", per_device_batch=4, seq_len=640, precision="fp16")
    edge = type(e)(**{**e.__dict__, "weights": e.weights + int(14.9 * GIB) - e.total})  # a 14.9 GiB job
    assert round(edge.total / GIB, 2) == 14.9
    assert edge.fits(15.0) and not edge.fits("T4"), "fits 15.0 GiB, not the 14.75 GiB PyTorch has on a T4"


def test_kaggle_p100_is_gone_from_the_catalog_and_the_notebooks():
    assert "P100" not in load_catalog("gpus")
    for source in (REPO_ROOT / "notebooks" / "src").glob("*.py"):
        assert "P100" not in source.read_text(), f"{source.name} still offers Kaggle's P100"


def test_the_python_floor_is_what_the_pinned_libraries_need():
    import importlib.metadata as metadata
    import tomllib

    from packaging.specifiers import SpecifierSet

    floor = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    pins = list(read_pins(REPO_ROOT / "requirements.txt"))
    needs = {p: metadata.metadata(p).get("Requires-Python") or "" for p in pins}
    for version in ("3.10", "3.11", "3.12", "3.13"):
        ours = version in SpecifierSet(floor)
        theirs = all(version in SpecifierSet(n) for n in needs.values())
        assert ours == theirs or not ours, f"Python {version}: the kit says {floor}, the pins say {needs}"
        assert ours or not theirs, f"Python {version} works for every pin but the kit refuses it ({floor})"
    assert "Python 3.11+" in (REPO_ROOT / "README.md").read_text()
    assert "(3, 11)" in (REPO_ROOT / "Makefile").read_text()


# ---------------------------------------------------------------------------------------------
# each notebook under one simulated card, 07 under both (tests/conftest.py, ONLY)


def _numbers(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_every_notebook_runs_under_the_simulated_card(simulated_runs, simulated):
    run = simulated_runs[simulated]
    assert run.returncode == 0, run.printed[-5000:]
    assert sorted(run.summary()) == run.ran(NOTEBOOKS) and all(s["status"] == "ok" for s in run.summary().values())
    assert f"simulating {simulated} on this CPU" in run.stdout
    assert f"Simulated {simulated} on a CPU" in (run.out / "summary.md").read_text()


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_no_recorded_figure_is_nan_or_inf(simulated_runs, simulated):
    bad = {
        stem: [x for x in _numbers(figures) if not math.isfinite(x)]
        for stem, figures in simulated_runs[simulated].results.items()
    }
    assert not any(bad.values()), f"non-finite figures under a simulated {simulated}: {bad}"


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_every_notebook_says_it_is_a_simulation(simulated_runs, simulated):
    run = simulated_runs[simulated]
    for stem in run.ran(NOTEBOOKS):
        text = (run.out / "notebooks" / f"{stem}.ipynb").read_text()
        assert f"SIMULATED {simulated}" in text, f"{stem} shows no simulation banner"


def test_the_card_picks_fp16_and_the_effective_batch_is_what_each_notebook_states(simulated_runs):
    r = simulated_figures(simulated_runs)
    assert r["00_where_to_get_gpus"]["precision"] == "fp16" and r["02_mixed_precision"]["precision"] == "fp16"
    assert r["00_where_to_get_gpus"]["gpu_name"] == "Tesla T4 (simulated)"
    assert r["00_where_to_get_gpus"]["gpu_count"] == 1, "the single-GPU notebooks see one card, even on T4 x2"
    assert r["04_gradient_accumulation"]["effective_batch"] == 16  # 2 x 8 x 1, as its text says
    assert r["08_capstone"]["effective_batch"] == 16 and r["08_capstone"]["effective_batch_parts"] == [1, 16, 1]
    assert r["06_experiment_tracking"]["manifest_effective_batch"] == 8


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_07_launches_one_process_per_simulated_card(simulated_runs, simulated):
    r07 = simulated_runs[simulated].results["07_kaggle_t4x2"]
    devices = 2 if simulated == "T4x2" else 1
    assert r07["num_processes"] == devices and r07["gpu_count"] == devices
