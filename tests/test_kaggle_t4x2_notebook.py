"""Notebook 07 (Kaggle T4 x2), run headless on the embedded model, checked by what it promises.

Two processes over gloo stand in for the two T4s; the copies of the model must end identical, each
process must have trained on its own data, and the effective batch must count both devices. The
train.py it writes must run under `accelerate launch` and reach the very same weights.

They read the suite's smoke runs (tests/conftest.py; `KIT_ONLY="07"` runs only this one); `--smoke`
makes them use the embedded tiny model and 4 optimizer steps.
"""

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from background import background
from notebook_results import outputs_text, simulated_figures

NB06, NB07 = "06_experiment_tracking", "07_kaggle_t4x2"
NOTEBOOKS = (NB07,)
TIMEOUT_S = 600  # for each subprocess, generous for a loaded machine
SLOW_FIXTURES = ("accelerate_launch",)  # train.py's 2 processes, in the background lane (conftest: slow)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_07_ran_two_cpu_processes_over_gloo(ran):
    results, out = ran
    r = results[NB07]
    assert r["gpu_count"] == 0 and r["num_processes"] == 2 and r["processes_ran"] == 2
    assert r["backend"] == "gloo"
    assert "NO GPU: launching 2 CPU processes" in outputs_text(out / "notebooks" / f"{NB07}.ipynb")


def test_07_parameters_stay_in_sync_on_different_data(ran):
    r = ran[0][NB07]
    assert r["params_in_sync"] is True
    assert len(r["param_checksums"]) == 2 and r["param_checksums"][0] == r["param_checksums"][1]
    assert r["different_data_per_rank"] is True, "each process must train on its own share of the batches"


def test_07_effective_batch_counts_both_devices(ran):
    r = ran[0][NB07]
    assert r["effective_batch"] == r["per_device_batch"] * r["grad_accum_steps"] * 2 == r["effective_batch_counted"]


def test_07_every_process_holds_a_whole_copy(ran):
    r = ran[0][NB07]
    weights, optimizer = r["weights_mib_per_rank"], r["optimizer_mib_per_rank"]
    assert len(set(weights)) == 1 and weights[0] > 0
    assert optimizer[0] == pytest.approx(2 * weights[0], rel=0.01), "AdamW keeps two moments per weight, per process"


def test_07_sharded_each_process_holds_half_of_every_state_to_the_estimators_byte(ran):
    rows = {(row["run"], row["rank"]): row for row in ran[0][NB07]["sharded_rows"]}
    assert {run for run, _ in rows} == {"full, data parallel", "full, sharded", "lora, data parallel", "lora, sharded"}
    for row in rows.values():  # measured on two CPU processes (FSDP2 over gloo) against the estimate
        for term in ("weights", "gradients", "optimizer"):
            assert row[term] == row[term + "_estimate"], (row["run"], row["rank"], term)
        # the step's peak: activations, gathered layers, reduce-scatter buffers; FSDP's timing moves it a little
        assert row["peak"] == pytest.approx(row["peak_estimate"], rel=0.05), (row["run"], row["rank"])
    for method in ("full", "lora"):
        whole, shard = rows[(f"{method}, data parallel", 0)], rows[(f"{method}, sharded", 1)]
        assert shard["weights"] * 2 == whole["weights"] and shard["gradients"] * 2 == whole["gradients"]


def test_07_on_one_card_each_row_is_the_single_gpu_bill(simulated_runs):
    """Under one T4 (simulated) the launcher runs a single process: no DDP around the model, whose gradient buckets
    (a second copy of the gradients) kept a copy in step with nothing; with them the full fine-tune's peak read
    24,793,352 bytes against the one-card estimate of 23,537,668 (5.1 % over). So every row is the one-card bill:
    weights, gradients, AdamW to the byte and the step's peak within 5 %."""
    rows = simulated_runs["T4"].results[NB07]["sharded_rows"]
    assert {row["rank"] for row in rows} == {0} and len(rows) == 4
    for row in rows:
        for term in ("weights", "gradients", "optimizer"):
            assert row[term] == row[term + "_estimate"], (row["run"], term)
        assert row["peak"] == pytest.approx(row["peak_estimate"], rel=0.05), row["run"]


def test_07_sharded_training_takes_the_same_steps_as_data_parallel(ran):
    r = ran[0][NB07]
    assert set(r["sharded_loss_gap"]) == {"full", "lora"}
    assert all(gap < 1e-4 for gap in r["sharded_loss_gap"].values())
    assert r["sharded_traffic_ratio"] == pytest.approx(1.5, rel=0.01)
    losses = r["qlora_sharded_losses"]  # bitsandbytes' 4-bit weights shard under FSDP2 on this runtime
    assert losses and len(losses) == 2 and all(0 < x < 20 for x in losses)


def test_07_fewest_t4s_orders_full_lora_qlora(ran):
    needed = ran[0][NB07]["fewest_t4s"]
    full, lora, qlora = needed["Llama-2-7B full"], needed["Llama-2-7B lora"], needed["Llama-2-13B qlora"]
    assert full > lora >= qlora >= 1


@background
def accelerate_launch(folder: Path, env: dict[str, str], notebook_run) -> tuple[subprocess.CompletedProcess, Path]:
    """The train.py notebook 07 wrote in the cpu run, under `accelerate launch` with 2 processes, in `folder`; run
    by the lane right after that run, beside the tests: (the finished command, folder)."""
    shutil.copy(notebook_run.out / "work" / NB07 / "build" / "train.py", folder)
    launch = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command = [sys.executable, *launch, "--main_process_port", str(free_port()), "train.py"]
    env = env | {"HF_HOME": str(folder / "hf")}  # no accelerate config of this machine's
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT_S), folder


def test_07_train_py_runs_under_accelerate_launch_to_the_same_weights(ran, accelerate_launch):
    (results, _), (done, folder) = ran, accelerate_launch
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((folder / "ddp_result.json").read_text())
    assert report["num_processes"] == 2 and report["backend"] == "gloo"
    assert [c[0] for c in report["checksums"]] == results[NB07]["param_checksums"], (
        "the script must train exactly what the notebook trained"
    )


def test_07_one_device_and_two_see_the_same_batch_and_the_time_is_measured(ran):
    r, out = ran[0][NB07], ran[1]
    assert r["grad_accum_steps_one_device"] == 2 * r["grad_accum_steps"]
    assert r["effective_batch_one_device_counted"] == r["effective_batch_counted"] == r["effective_batch"]
    assert len(r["losses_one_device"]) == len(r["losses_data_parallel"]) == 4  # max_steps=4 in the smoke run
    assert r["step_seconds_one_device"] > 0 and r["step_seconds_data_parallel"] > 0
    ratio = r["step_seconds_one_device"] / r["step_seconds_data_parallel"]
    assert r["step_time_ratio_one_over_launched"] == pytest.approx(ratio), "the printed ratio is the measured one"
    assert r["step_time_measured_on"] == "cpu processes"
    assert "this says nothing about two T4s" in outputs_text(out / "notebooks" / f"{NB07}.ipynb")


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_under_a_simulated_card_the_text_says_what_was_measured(simulated_runs, simulated):
    run = simulated_runs[simulated]
    r06, r07 = simulated_figures(simulated_runs)[NB06], run.results[NB07]
    assert set(r06["plain_kit_differing_args"]) <= {"bf16", "fp16"}, "only the precision follows the simulated card"
    assert r07["step_time_measured_on"] == "cpu processes"
    if simulated == "T4x2":
        text = outputs_text(run.out / "notebooks" / f"{NB07}.ipynb")
        assert "the T4s are simulated: no GPU ran" in text
        assert r07["effective_batch_counted"] == r07["effective_batch_one_device_counted"] == r07["effective_batch"]
