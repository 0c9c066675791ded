"""Notebook 08 (capstone), run headless on the embedded model, checked by what it promises.

The report must give the lesson's effective batch (1 x 16 x 1) and seed, point to a manifest that
exists and records them, and the run must have resumed from a checkpoint after the simulated
disconnect. Run again on the finished run, as after a later disconnect, it must train nothing and
report the same final loss from the adapter it reloads.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="08"` runs only
this one); `--smoke` makes them use the embedded tiny model and 4 optimizer steps.
"""

import json
from pathlib import Path

import pytest
from notebook_results import outputs_text

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.manifest import load_manifest
from helpers.resume import check_checkpoint, list_checkpoints

NB08 = "08_capstone"
NOTEBOOKS = (NB08,)


def test_08_the_fine_tune_lowers_the_held_out_loss_and_both_answers_are_recorded(ran):
    r, out = ran[0][NB08], ran[1]
    assert r["final_loss"] < r["base_loss"]
    assert isinstance(r["reply_before"], str) and isinstance(r["reply_after"], str)
    text = outputs_text(out / "notebooks" / f"{NB08}.ipynb")
    assert f"question: {r['question']}" in text and repr(r["reply_after"]) in text


def test_08_the_resumed_session_repeats_the_steps_it_trains_again(ran):
    r = ran[0][NB08]
    first = {int(k): v for k, v in r["session1_losses"].items()}
    second = {int(k): v for k, v in r["session2_losses"].items()}
    assert sorted(first) == list(range(1, r["session1_last_step"] + 1))
    assert sorted(second) == list(range(r["resumed_from_step"] + 1, r["final_step"] + 1))
    twice = sorted(set(first) & set(second))
    assert len(twice) == r["steps_redone"] >= 1
    for step in twice:
        assert second[step] == pytest.approx(first[step], rel=1e-6), f"step {step} after the resume"


def test_08_report_gives_the_lessons_effective_batch_and_seed(ran):
    r = ran[0][NB08]
    assert r["effective_batch"] == 16 and r["effective_batch_parts"] == [1, 16, 1]
    assert r["seed"] == 42
    assert r["peak_memory_mib"] > 0 and r["peak_memory_measured_by"] in (
        "process peak RSS",
        "torch.cuda.max_memory_allocated",
    )
    assert r["final_loss"] > 0


def test_08_manifest_exists_at_the_recorded_path_and_records_the_run(ran):
    r = ran[0][NB08]
    path = Path(r["manifest_path"])
    assert path.is_file(), path
    manifest = load_manifest(path)
    assert manifest["training"]["seed"] == 42 and manifest["training"]["effective_batch"] == 16
    assert manifest["step"] == r["final_step"] == r["manifest_step"]
    assert manifest["model"]["id"] == "embedded" and "quantization" in manifest["model"]


def test_08_resumed_from_a_checkpoint_after_the_disconnect(ran):
    r = ran[0][NB08]
    assert 0 < r["resumed_from_step"] < r["session1_last_step"] < r["final_step"] == r["total_steps"]
    assert r["steps_redone"] == r["session1_last_step"] - r["resumed_from_step"] >= 1
    checkpoints = list_checkpoints(r["output_dir"])
    assert checkpoints and check_checkpoint(checkpoints[0]) == []
    assert checkpoints[0].name == f"checkpoint-{r['final_step']}"


def test_08_run_again_on_the_finished_run_trains_nothing(ran, tmp_path, monkeypatch):
    """The notebook run a second time on the same folder, as a student would after a later disconnect."""
    import papermill as pm

    results, out = ran
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
