"""Notebooks 07 (Kaggle T4 x2) and 08 (capstone), run headless on the embedded model, checked by what they promise.

07: two processes over gloo stand in for the two T4s; the copies of the model must end identical, each
process must have trained on its own data, and the effective batch must count both devices. The
train.py it writes must run under `accelerate launch` and reach the very same weights.
08: the report must give the lesson's effective batch (1 x 16 x 1) and seed, point to a manifest that
exists and records them, and the run must have resumed from a checkpoint after the simulated
disconnect. Run again on the finished run, as after a later disconnect, it must train nothing and
report the same final loss from the adapter it reloads.

They read the suite's one smoke run of every notebook (tests/conftest.py); `--smoke` makes them use
the embedded tiny model and 4 optimizer steps.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.manifest import load_manifest
from helpers.resume import check_checkpoint, list_checkpoints

NB07, NB08 = "07_kaggle_t4x2", "08_capstone"
TIMEOUT_S = 600  # for each subprocess, generous for a loaded machine
# the issue asks for under 30 s per notebook on 2 CPU cores (about 10 s and 15 s measured on an idle
# machine); twice that still passes on a busy one, and catches a notebook that grew by steps or data
SECONDS_LIMIT = 60


@pytest.fixture(scope="module")
def ran(notebook_run):
    """The suite's shared smoke run: (the run, out folder, results by stem)."""
    assert notebook_run.returncode == 0, notebook_run.stdout[-5000:] + notebook_run.stderr[-5000:]
    return notebook_run, notebook_run.out, {stem: notebook_run.results[stem] for stem in (NB07, NB08)}


def outputs_text(path: Path) -> str:
    """Every stream and display output of an executed notebook, as one string."""
    nb = nbformat.read(path, as_version=4)
    texts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            texts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(texts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_both_run_headless_within_the_time_limit(ran):
    _, out, _ = ran
    summary = {s["notebook"]: s for s in json.loads((out / "summary.json").read_text())}
    for stem in (NB07, NB08):
        assert summary[stem]["status"] == "ok", summary[stem]["error"]
        print(f"\n{stem}: {summary[stem]['seconds']:.1f} s")
        assert summary[stem]["seconds"] < SECONDS_LIMIT, f"{stem} took {summary[stem]['seconds']:.1f} s"


# ---------------------------------------------------------------------------------------------
# 07: data parallel


def test_07_ran_two_cpu_processes_over_gloo(ran):
    _, out, results = ran
    r = results[NB07]
    assert r["gpu_count"] == 0 and r["num_processes"] == 2 and r["processes_ran"] == 2
    assert r["backend"] == "gloo"
    assert "NO GPU: launching 2 CPU processes" in outputs_text(out / "notebooks" / f"{NB07}.ipynb")


def test_07_parameters_stay_in_sync_on_different_data(ran):
    r = ran[2][NB07]
    assert r["params_in_sync"] is True
    assert len(r["param_checksums"]) == 2 and r["param_checksums"][0] == r["param_checksums"][1]
    assert r["different_data_per_rank"] is True, "each process must train on its own share of the batches"


def test_07_effective_batch_counts_both_devices(ran):
    r = ran[2][NB07]
    assert r["effective_batch"] == r["per_device_batch"] * r["grad_accum_steps"] * 2 == r["effective_batch_counted"]


def test_07_every_process_holds_a_whole_copy(ran):
    r = ran[2][NB07]
    weights, optimizer = r["weights_mib_per_rank"], r["optimizer_mib_per_rank"]
    assert len(set(weights)) == 1 and weights[0] > 0
    assert optimizer[0] == pytest.approx(2 * weights[0], rel=0.01), "AdamW keeps two moments per weight, per process"


def test_07_train_py_runs_under_accelerate_launch_to_the_same_weights(ran, tmp_path):
    _, out, results = ran
    shutil.copy(out / "work" / NB07 / "build" / "train.py", tmp_path)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # no accelerate config of this machine's
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
            "train.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "ddp_result.json").read_text())
    assert report["num_processes"] == 2 and report["backend"] == "gloo"
    assert [c[0] for c in report["checksums"]] == results[NB07]["param_checksums"], (
        "the script must train exactly what the notebook trained"
    )


# ---------------------------------------------------------------------------------------------
# 08: the capstone


def test_08_report_gives_the_lessons_effective_batch_and_seed(ran):
    r = ran[2][NB08]
    assert r["effective_batch"] == 16 and r["effective_batch_parts"] == [1, 16, 1]
    assert r["seed"] == 42
    assert r["peak_memory_mib"] > 0 and r["peak_memory_measured_by"] in (
        "process peak RSS",
        "torch.cuda.max_memory_allocated",
    )
    assert r["final_loss"] > 0


def test_08_manifest_exists_at_the_recorded_path_and_records_the_run(ran):
    r = ran[2][NB08]
    path = Path(r["manifest_path"])
    assert path.is_file(), path
    manifest = load_manifest(path)
    assert manifest["training"]["seed"] == 42 and manifest["training"]["effective_batch"] == 16
    assert manifest["step"] == r["final_step"] == r["manifest_step"]
    assert manifest["model"]["id"] == "embedded" and "quantization" in manifest["model"]


def test_08_resumed_from_a_checkpoint_after_the_disconnect(ran):
    r = ran[2][NB08]
    assert 0 < r["resumed_from_step"] < r["session1_last_step"] < r["final_step"] == r["total_steps"]
    assert r["steps_redone"] == r["session1_last_step"] - r["resumed_from_step"] >= 1
    checkpoints = list_checkpoints(r["output_dir"])
    assert checkpoints and check_checkpoint(checkpoints[0]) == []
    assert checkpoints[0].name == f"checkpoint-{r['final_step']}"


def test_08_run_again_on_the_finished_run_trains_nothing(ran, tmp_path, monkeypatch):
    """The notebook run a second time on the same folder, as a student would after a later disconnect."""
    import papermill as pm

    _, out, results = ran
    first = results[NB08]
    work = out / "work" / NB08
    monkeypatch.setenv("HELPERS_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("HELPERS_NOTEBOOK", "again")
    # not a smoke run, so the folder is kept: run_name points it at the smoke run's finished folder
    pm.execute_notebook(
        str(NOTEBOOKS_DIR / f"{NB08}.ipynb"),
        str(tmp_path / "again.ipynb"),
        cwd=str(work),
        parameters={"smoke": False, "run_name": "capstone-smoke", "max_steps": 4},
        kernel_name="python3",
        progress_bar=False,
    )
    again = json.loads((tmp_path / "again.json").read_text())
    assert "ends a finished run (step 4 of 4)" in outputs_text(tmp_path / "again.ipynb")
    assert again["output_dir"] == first["output_dir"] and again["final_step"] == 4 and again["train_seconds"] == 0
    assert [p.name for p in list_checkpoints(first["output_dir"])] == ["checkpoint-4", "checkpoint-2"]
    assert again["manifest_path"] == first["manifest_path"]
    assert again["final_loss"] == first["final_loss"], "the report must evaluate the finished run's adapter"
