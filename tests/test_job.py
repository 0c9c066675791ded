"""helpers.job: one settings object for a training job, read by the estimator, plan, the CLI and the planner."""

import argparse
import doctest
import subprocess
import sys
from dataclasses import fields, replace

import ipywidgets as widgets
import pytest

import helpers.job
from helpers.estimate import OPTIMIZER_BYTES, WEIGHT_BYTES, estimate_training_memory
from helpers.job import (
    OPTIMIZERS,
    RUN_SETTINGS,
    WEIGHT_FORMATS,
    JobSettingError,
    TrainingJob,
    check_setting,
)
from helpers.job_flags import add_job_arguments, job_from_arguments, setting_type
from helpers.plan import plan
from helpers.planner import CONTROLS, START, _controls


def test_the_docstring_examples_hold():
    assert doctest.testmod(helpers.job).failed == 0


def test_the_names_it_accepts_are_the_ones_the_estimator_prices():
    assert tuple(OPTIMIZER_BYTES) == OPTIMIZERS
    assert tuple(WEIGHT_BYTES) == WEIGHT_FORMATS


def test_a_job_and_its_keywords_give_the_same_estimate_and_plan():
    job = TrainingJob(per_device_batch=2, seq_len=1024, method="lora", checkpointing=True)
    by_keyword = estimate_training_memory(
        "Qwen2.5-1.5B", per_device_batch=2, seq_len=1024, method="lora", checkpointing=True
    )
    assert estimate_training_memory("Qwen2.5-1.5B", job).as_dict() == by_keyword.as_dict()
    assert estimate_training_memory("Qwen2.5-1.5B", job, seq_len=2048).settings["seq_len"] == 2048  # keywords win
    steps = plan("Mistral-7B", "T4", job)
    assert [s.estimate.as_dict() for s in steps] == [
        s.estimate.as_dict()
        for s in plan("Mistral-7B", "T4", per_device_batch=2, seq_len=1024, method="lora", checkpointing=True)
    ]
    assert job.effective_batch == 2 and replace(job, grad_accum_steps=8).effective_batch == 16


def test_the_card_decides_the_precision_once():
    job = TrainingJob(per_device_batch=1, seq_len=512, method="qlora")
    assert estimate_training_memory("Mistral-7B", job, gpu="T4").settings["precision"] == "fp16"
    assert estimate_training_memory("Mistral-7B", job, gpu="A100-40GB").settings["precision"] == "bf16"
    assert estimate_training_memory("Mistral-7B", job).settings["precision"] == "bf16"  # no card: a current one
    assert plan("Mistral-7B", "T4", job)[0].estimate.settings["precision"] == "fp16"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(seq_len=0), r"seq_len=0 is out of range: pass a whole number from 1 to 1,048,576, e.g. seq_len=512"),
        (dict(seq_len=True), r"seq_len=True is not a whole number"),  # a bool is an int to Python, not to us
        (dict(grad_accum_steps=-4), r"grad_accum_steps=-4 is out of range"),
        (dict(lora_r=-8), r"lora_r=-8 is out of range"),
        (dict(lora_dropout=1.0), r"lora_dropout=1.0 is out of range: pass a number from 0 up to 1"),
        (dict(lora_dropout=float("inf")), r"lora_dropout=inf is out of range"),
        (dict(fused_loss=1), r"fused_loss=1: pass True or False"),
        (dict(method="QLoRA"), r"method='QLoRA' is not one of 'full', 'lora', 'qlora' \(did you mean 'qlora'\?\)"),
        (dict(lora_targets=[]), r"lora_targets=\[\]: pass 'all-linear' or module names"),
        (dict(lora_targets=["q_proj", 3]), r"lora_targets=\['q_proj', 3\]"),
        (dict(precision="fp32", weights="bf16"), r"weights='bf16' with precision='fp32' would upcast every matmul"),
        (dict(precision="bf16-true", weights="fp32"), r"precision='bf16-true' stores every weight in bf16"),
        (dict(precision="bf16", method="qlora", weights="int8"), r"method='qlora' stores weights in nf4"),
    ],
)
def test_a_bad_setting_is_refused_when_the_job_is_made(settings, message):
    with pytest.raises(JobSettingError, match=message):
        TrainingJob(**{"per_device_batch": 1, "seq_len": 512, **settings})


def test_a_changed_copy_is_checked_again_and_lists_become_tuples():
    job = TrainingJob(per_device_batch=1, seq_len=512, method="lora", lora_targets=["q_proj", "v_proj"])
    assert job.lora_targets == ("q_proj", "v_proj") and hash(job) == hash(replace(job))
    with pytest.raises(JobSettingError, match="seq_len=0"):
        replace(job, seq_len=0)


def parse(*flags: str) -> TrainingJob:
    parser = argparse.ArgumentParser(prog="plan", exit_on_error=False)
    add_job_arguments(parser)
    return job_from_arguments(parser.parse_args(list(flags)))


def test_every_field_is_a_flag_and_the_flags_make_the_same_job():
    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    assert {"--" + f.name.replace("_", "-") for f in fields(TrainingJob)} <= flags
    job = parse(
        "--seq-len", "2048", "--qlora", "--lora-targets", "q_proj,v_proj", "--checkpointing", "--lora-dropout", "0.05"
    )
    assert job == TrainingJob(
        per_device_batch=1,  # the command line's default; Python asks for it
        seq_len=2048,
        method="qlora",
        lora_targets=("q_proj", "v_proj"),
        checkpointing=True,
        lora_dropout=0.05,
    )
    assert parse("--seq-len", "64", "--method", "lora", "--no-double-quant").double_quant is False


def test_the_old_batch_flag_still_works_and_says_the_new_name():
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "plan", "--model", "SmolLM2-135M", "--seq-len", "256", "--batch-size", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "--batch-size is now --per-device-batch" in done.stderr and "per-device batch 2 x 256 tokens" in done.stdout


def test_the_planners_controls_are_the_jobs_fields():
    names = {f.name for f in fields(TrainingJob)}
    assert set(CONTROLS) <= names
    controls = _controls(widgets, "Qwen2.5-1.5B", "t4", dict(START, seq_len=600, per_device_batch=3))
    assert controls["gpu"].value == "T4", "a card spelled otherwise is shown as the catalog spells it"
    assert 600 in controls["seq_len"].options and controls["seq_len"].value == 600  # between stops: no TraitError
    assert controls["per_device_batch"].value == 3
    assert controls["fused_loss"].description == "fused loss (Liger, Unsloth)"


# the run's schedule (train.py's flags, notebook 08's parameters): refused as read, with the fix


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("learning_rate", float("nan"), "learning_rate=nan is out of range: pass a number above 0 and below 1"),
        ("learning_rate", 0.0, "learning_rate=0.0 is out of range"),
        ("learning_rate", -2e-4, "e.g. learning_rate=2e-4"),
        ("learning_rate", 1.0, "below 1"),
        ("learning_rate", float("inf"), "learning_rate=inf is out of range"),
        ("learning_rate", "2e-4", "learning_rate='2e-4' is out of range"),
        ("num_train_epochs", 0, "num_train_epochs=0 is out of range"),
        ("max_steps", 0, "max_steps=0 is out of range: pass a whole number from 1 to 1,000,000,000 (or -1: the"),
        ("max_steps", -2, "max_steps=-2"),
        ("max_steps", 2.5, "max_steps=2.5"),
        ("save_steps", 0, "save_steps=0 is out of range"),
        ("logging_steps", True, "logging_steps=True"),
        ("seed", -1, "seed=-1 is out of range: pass a whole number from 0 to 4,294,967,295"),
        ("seed", 2**32, "seed=4294967296"),
        ("run_name", "../escape", "run_name='../escape' cannot name a run folder"),
        ("run_name", "my run", "e.g. run_name='capstone'"),
        ("run_name", "", "cannot name a run folder"),
        ("model_id", "  ", "model_id='  ': pass a Hub id or a folder"),
        ("hub_repo", "my-adapter", "hub_repo='my-adapter' is not a Hub repo id: pass your-name/repo-name"),
        ("hub_repo", "https://huggingface.co/me/x", "is not a Hub repo id"),
        ("per_device_batch", 0, "per_device_batch=0 is out of range"),
        ("seq_len", -512, "seq_len=-512 is out of range"),
    ],
)
def test_a_run_setting_that_cannot_be_used_is_refused_with_the_fix(name, value, message):
    with pytest.raises(JobSettingError) as refused:
        check_setting(name, value)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [("learning_rate", 2e-4), ("max_steps", -1), ("max_steps", 1), ("seed", 0), ("hub_repo", ""),
     ("hub_repo", "me/qwen-course-adapter"), ("run_name", "capstone-2"), ("num_train_epochs", 0.5)],
)  # fmt: skip
def test_the_values_people_use_are_taken(name, value):
    assert check_setting(name, value) == value


def test_every_run_setting_has_an_example_that_passes_its_own_check():
    for name, (_, _, _, example) in RUN_SETTINGS.items():
        assert setting_type(name, None)(example) is not None, name


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--learning-rate", "nan"], "argument --learning-rate: nan is out of range"),
        (["--learning-rate", "fast"], "argument --learning-rate: 'fast' is out of range"),
        (["--seq-len", "0"], "argument --seq-len: 0 is out of range: pass a whole number from 1"),
        (["--per-device-batch", "0"], "argument --per-device-batch: 0 is out of range"),
        (["--max-steps", "0"], "e.g. --max-steps 100"),
        (["--run-name", "a/b"], "argument --run-name: 'a/b' cannot name a run folder"),
    ],
)
def test_train_py_style_flags_stop_with_exit_code_2_and_the_fix(flags, message, capsys):
    defaults = {"learning_rate": 2e-4, "seq_len": 512, "per_device_batch": 1, "max_steps": -1, "run_name": "x"}
    parser = argparse.ArgumentParser(prog="train.py")
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=setting_type(name, default), default=default)
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(flags)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
