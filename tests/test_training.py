"""helpers.training: seeds, TrainingArguments for the card, the effective batch."""

import json
import random
import warnings

import numpy as np
import pytest
import torch
from random_models import tiny_llama, tiny_llama_config

from helpers.audit import AuditWarning
from helpers.env import GIB, Gpu
from helpers.seeds import seed_everything
from helpers.training import (
    DEFAULT_SEED,
    effective_batch_size,
    log_effective_batch,
    training_args,
)

# training_args warns about precision mistakes (helpers.audit): keep them out of the warnings summary
pytestmark = pytest.mark.filterwarnings("ignore::helpers.audit.AuditWarning")

T4 = Gpu(0, "Tesla T4", 15 * GIB, (7, 5))
A100 = Gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, (8, 0))


def draw():
    return random.random(), np.random.rand(), torch.rand(3).tolist()


def test_same_seed_same_numbers_other_seed_other_numbers():
    assert seed_everything(42) == 42
    first = draw()
    seed_everything(42)
    assert draw() == first
    seed_everything(43)
    assert draw() != first


def test_same_seed_same_model_init():
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(vocab=64, hidden=16, layers=1, heads=2, kv_heads=1)
    seed_everything(7)
    a = LlamaForCausalLM(config).state_dict()
    seed_everything(7)
    b = LlamaForCausalLM(config).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", [-1, 2**32, 4.2, "42", True])
def test_bad_seed_says_what_works(bad):
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\).*such as seed=42"):
        seed_everything(bad)


# ---------------------------------------------------------------- training_args


def test_training_args_defaults_are_explicit_and_said(tmp_path, capsys):
    args = training_args(str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=16)
    out = capsys.readouterr().out
    assert args.seed == DEFAULT_SEED == 42 and "seed 42 (the kit's default" in out
    assert args.report_to == [] and args.logging_steps == 10 and args.logging_first_step
    assert not args.bf16 and not args.fp16  # this machine has no GPU
    assert "effective batch 1 x 16 x 1 = 16" in out and "fp32 (no GPU" in out


def test_training_args_keeps_what_the_caller_passes(tmp_path, capsys):
    args = training_args(str(tmp_path), seed=7, logging_steps=3, report_to="wandb", quiet=True)
    assert (args.seed, args.logging_steps, args.report_to) == (7, 3, ["wandb"])
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("name", ["gradient_checkpointing", "activation_checkpointing"])
def test_training_args_takes_both_names_of_checkpointing(tmp_path, capsys, name):
    args = training_args(str(tmp_path), **{name: True})
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}
    noted = "passed on as activation_checkpointing=" in capsys.readouterr().out
    assert noted == (name == "gradient_checkpointing")


def test_training_args_refuses_two_names_that_disagree_and_report_to_none(tmp_path):
    with pytest.raises(ValueError, match="pass only activation_checkpointing"):
        training_args(str(tmp_path), gradient_checkpointing=True, activation_checkpointing=False)
    with pytest.raises(ValueError, match='report_to="none"'):
        training_args(str(tmp_path), report_to=None)


@pytest.mark.parametrize("card, bf16, fp16", [((T4,), False, True), ((A100,), True, False), ((), False, False)])
def test_training_args_precision_follows_the_card(tmp_path, monkeypatch, card, bf16, fp16):
    monkeypatch.setattr("helpers.training.detect_gpus", lambda: card)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)  # the right precision for a card is no mistake
        args = training_args(str(tmp_path), quiet=True)
    assert (args.bf16, args.fp16) == (bf16, fp16)


def test_training_args_bf16_on_cpu_gets_use_cpu_and_fp16_on_cpu_warns(tmp_path, capsys):
    assert training_args(str(tmp_path), bf16=True).use_cpu is True
    assert "added use_cpu=True" in capsys.readouterr().out
    with pytest.warns(AuditWarning, match=r"fp16=True with no GPU .* trains in fp32"):
        training_args(str(tmp_path), fp16=True, quiet=True)


# ---------------------------------------------------------------- effective batch


def test_effective_batch_is_per_device_times_accumulation_times_devices(tmp_path):
    settings = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    assert effective_batch_size(settings) == 16  # no GPU here: one device
    assert effective_batch_size(settings, num_devices=2) == 32
    assert effective_batch_size({}, num_devices=1) == 8  # TrainingArguments' defaults: 8 x 1
    args = training_args(str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=4, quiet=True)
    assert effective_batch_size(args) == 16
    with pytest.raises(ValueError, match="num_devices must be an int >= 1"):
        effective_batch_size(settings, num_devices=0)


def test_log_effective_batch_prints_the_product_and_records_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HELPERS_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("HELPERS_NOTEBOOK", "nb")
    assert log_effective_batch({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}, 2) == 32
    assert "effective batch = per_device_batch 2 x grad_accum_steps 8 x num_devices 2 = 32" in capsys.readouterr().out
    saved = json.loads((tmp_path / "nb.json").read_text())
    assert saved["effective_batch"] == 32
    assert saved["effective_batch_parts"] == {"per_device_batch": 2, "grad_accum_steps": 8, "num_devices": 2}


def test_effective_batch_callback_logs_when_the_trainer_starts(tmp_path, monkeypatch, capsys):
    from transformers import Trainer

    from helpers.training import EffectiveBatchCallback

    monkeypatch.setenv("HELPERS_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("HELPERS_NOTEBOOK", "nb")
    model = tiny_llama(vocab=64, hidden=16, layers=1, heads=2, kv_heads=1)
    data = [{"input_ids": torch.arange(8), "labels": torch.arange(8)} for _ in range(8)]
    args = training_args(
        str(tmp_path / "out"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        quiet=True,
    )
    callback = EffectiveBatchCallback()
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    assert callback.effective_batch == 4
    assert "effective batch = per_device_batch 2 x grad_accum_steps 2 x num_devices 1 = 4" in capsys.readouterr().out
    assert json.loads((tmp_path / "nb.json").read_text())["effective_batch"] == 4


def test_effective_batch_of_a_dict_imports_no_transformers():
    """Kaggle T4 x2: computed before notebook_launcher, which refuses to start once bitsandbytes is in."""
    import subprocess
    import sys

    code = (
        "import sys; from helpers.training import effective_batch_size as e; "
        "assert e({'per_device_train_batch_size': 4, 'gradient_accumulation_steps': 2}, num_devices=2) == 16; "
        "assert 'transformers' not in sys.modules and 'bitsandbytes' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
