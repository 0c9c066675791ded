"""Notebook 08 (capstone), run headless on the embedded model, checked by what it promises.

The report must give the lesson's effective batch (1 x 16 x 1) and seed, point to a manifest that
exists and records them, and the run must have resumed from a checkpoint after the simulated
disconnect. Run again on the finished run, as after a later disconnect, it must train nothing and
report the same final loss from the adapter it reloads; run again with one setting changed, as the
exercises do, it must train a new run in a folder beside it and leave the first one as it was.

They read the suite's one smoke run of every notebook and its three reruns of this one (tests/conftest.py;
`KIT_ONLY="08"` runs only this one); `--smoke` makes them use the embedded tiny model and 4 optimizer steps.
"""

import json
import sys
import types
from pathlib import Path

import pytest
from notebook_results import outputs_text, source_cells

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


def rerun(capstone_reruns, name):
    """One of the suite's reruns of 08 (tests/conftest.py, CAPSTONE_RERUNS): (its figures, its printed text)."""
    run = capstone_reruns[name]
    assert run.returncode == 0, run.printed[-5000:]
    return run.results[name], outputs_text(run.out / f"{name}.ipynb")


def test_08_run_again_on_the_finished_run_trains_nothing(ran, capstone_reruns):
    """The notebook run a second time on the same folder, as a student would after a later disconnect."""
    first = ran[0][NB08]
    again, text = rerun(capstone_reruns, "08-again")
    assert f"this run trains in {first['output_dir']}: the same settings as its checkpoints" in text
    assert "ends a finished run (step 4 of 4)" in text
    assert again["output_dir"] == first["output_dir"] and again["final_step"] == 4 and again["train_seconds"] == 0
    assert again["steps_trained"] == 0
    assert [p.name for p in list_checkpoints(first["output_dir"])] == ["checkpoint-4", "checkpoint-2"]
    assert again["manifest_path"] == first["manifest_path"]
    assert again["final_loss"] == first["final_loss"], "the report must evaluate the finished run's adapter"


def test_08_a_changed_setting_trains_a_new_run_beside_the_finished_one(ran, capstone_reruns):
    """The exercise on a finished run: max_steps raised, by one step (4 -> 5), is another run, trained from step 0.

    Going on from the finished run would train 1 step, the old notebook trained none ("nothing left to train").
    """
    first = ran[0][NB08]
    second, text = rerun(capstone_reruns, "08-changed")
    new = f"{first['output_dir']}-2"
    assert "capstone-smoke holds a run with other settings: max_steps 4 -> 5\n" in text
    assert f"this run trains in {new}: a new run (no checkpoint there yet)" in text
    assert "ends a finished run" not in text
    assert second["output_dir"] == new and second["total_steps"] == second["final_step"] == 5
    assert second["steps_trained"] == 5 + second["steps_redone"] == 6, "every step from 0, the disconnect's twice"
    assert first["steps_trained"] == 4 + first["steps_redone"]
    assert list_checkpoints(new)[0].name == "checkpoint-5"
    assert [p.name for p in list_checkpoints(first["output_dir"])] == ["checkpoint-4", "checkpoint-2"], "kept"
    assert load_manifest(list_checkpoints(new)[0])["training"]["args"]["max_steps"] == 5
    print(f"\nfirst run: {first['steps_trained']} steps trained in {first['output_dir']}")
    print(f"second run (max_steps 5): {second['steps_trained']} steps trained in {second['output_dir']}")


def test_08_trains_on_the_answers_only_in_the_models_chat_format(ran):
    r, out = ran[0][NB08], ran[1]
    assert 0 < r["tokens_in_loss"] < r["tokens_total"], "the prompt tokens are masked, the answers' kept"
    text = outputs_text(out / "notebooks" / f"{NB08}.ipynb")
    assert "<|bos|>user\n" in text and "<|bos|>assistant\n" in text, "the embedded tokenizer's chat template"
    assert f"tokens in the loss: {r['tokens_in_loss']:,} of {r['tokens_total']:,}" in text
    assert r["base_loss_unmasked"] != r["base_loss"]


def test_08_the_adapter_is_saved_alone_reloaded_to_the_same_answer_and_merged(ran):
    r = ran[0][NB08]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(r["adapter_files"])
    assert r["adapter_bytes"] < 2 * r["adapter_params"] * 4, "the adapter alone: fp32 weights, no base"
    assert r["reload_same_answer"] is True and r["reload_logits_max_diff"] == 0.0
    merged = Path(r["merged_dir"])
    config = json.loads((merged / "config.json").read_text())
    assert (
        config["dtype"] == "bfloat16"
        and "quantization_config" not in config
        and (merged / "model.safetensors").is_file()
    )
    assert not (merged / "adapter_config.json").exists(), "merge_and_unload leaves a plain model"
    rows = {step: (estimated, measured) for step, estimated, measured in r["estimate_vs_measured"]}
    estimated, measured = rows["merged, 16-bit weights"]
    assert measured == r["merged_bytes"] and abs(estimated - measured) / measured < 0.05


def test_08_the_resume_rows_exist_on_the_lessons_own_logging(capstone_reruns):
    """A run long enough for the lesson's save_steps 20, disconnect 22 and logging_steps 10 (the 7B's path)."""
    r, text = rerun(capstone_reruns, "08-long")
    assert r["total_steps"] == 26 and "a 26-step run" not in text, "no override"
    first = {int(k): v for k, v in r["session1_losses"].items()}
    second = {int(k): v for k, v in r["session2_losses"].items()}
    assert r["resumed_from_step"] == 20 and r["session1_last_step"] == 22
    assert sorted(first) == [10, 20, 21, 22] and sorted(second) == [21, 22], "logged on both sides"
    for step in (21, 22):
        assert second[step] == pytest.approx(first[step], rel=1e-6), f"step {step} after the resume"
        print(f"\nstep {step}: loss {first[step]!r} in session 1, {second[step]!r} after the resume")
    assert r["final_step"] == 26


@pytest.mark.parametrize("use_drive", [True, False])
def test_08_says_before_run_all_that_drive_asks_and_use_drive_false_skips_the_dialog(monkeypatch, use_drive):
    """The folder cell run as on Colab, with a stand-in for google.colab.drive (Colab's own is not here)."""
    cells = source_cells(NB08)
    (folder_cell,) = [text for kind, _, text in cells if kind == "code" and "drive.mount(" in text]
    before = cells[[text for _, _, text in cells].index(folder_cell) - 1]
    for kind, _, text in (cells[0], before):  # the first cell, and the prose right before the mount
        assert kind == "markdown" and "authorize" in text and "`use_drive = False`" in text
    mounted = []
    colab = types.ModuleType("google.colab")
    colab.drive = types.SimpleNamespace(mount=mounted.append)  # stand-in: Colab's dialog cannot open here
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setenv("COLAB_RELEASE_TAG", "stand-in")
    for name in ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE"):
        monkeypatch.delenv(name, raising=False)
    cell = {"use_drive": use_drive, "smoke": False, "run_name": "capstone"}
    exec(folder_cell, cell)
    assert mounted == (["/content/drive"] if use_drive else [])
    assert str(cell["runs"]).startswith("/content/drive/" if use_drive else "/content/runs")
    assert cell["survives"].startswith("yes: Google Drive" if use_drive else "NO: use_drive = False")
