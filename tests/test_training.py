"""helpers.training: seeds, TrainingArguments for the card, the effective batch, the audit, auto-fit after OOM."""

import dataclasses
import json
import random
import warnings

import numpy as np
import pytest
import torch

from helpers.env import GIB, Gpu
from helpers.seeds import seed_everything
from helpers.training import (
    DEFAULT_SEED,
    AuditWarning,
    BatchFitError,
    activation_budget,
    audit,
    effective_batch_size,
    fit_batch,
    log_effective_batch,
    training_args,
)

# the audit's findings are the point of several tests below: keep them out of the warnings summary
pytestmark = pytest.mark.filterwarnings("ignore::helpers.training.AuditWarning")

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
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    seed_everything(7)
    a = LlamaForCausalLM(config).state_dict()
    seed_everything(7)
    b = LlamaForCausalLM(config).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", [-1, 2**32, 4.2, "42", True])
def test_bad_seed_says_what_works(bad):
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\).*seed_everything\(42\)"):
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
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer

    from helpers.training import EffectiveBatchCallback

    monkeypatch.setenv("HELPERS_RESULTS_DIR", str(tmp_path))
    monkeypatch.setenv("HELPERS_NOTEBOOK", "nb")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    data = [{"input_ids": torch.arange(8), "labels": torch.arange(8)} for _ in range(8)]
    args = training_args(str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
                         max_steps=1, save_strategy="no", disable_tqdm=True, dataloader_pin_memory=False, quiet=True)
    callback = EffectiveBatchCallback()
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    assert callback.effective_batch == 4
    assert "effective batch = per_device_batch 2 x grad_accum_steps 2 x num_devices 1 = 4" in capsys.readouterr().out
    assert json.loads((tmp_path / "nb.json").read_text())["effective_batch"] == 4


# ---------------------------------------------------------------- audit: one test per mistake

GOOD = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "seed": 42, "report_to": "wandb"}


def codes(findings):
    return [f.code for f in findings]


def test_a_sound_configuration_has_no_findings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)
        assert audit(GOOD) == []
        assert audit({**GOOD, "fp16": True}, gpu="T4") == []
        assert audit({**GOOD, "bf16": True}, gpu=A100) == []


def test_bf16_on_a_t4_says_fp16_instead():
    with pytest.warns(AuditWarning) as caught:
        findings = audit({**GOOD, "bf16": True}, gpu="T4")
    assert codes(findings) == ["bf16_emulated"]
    message = findings[0].message
    assert "bf16=True on NVIDIA Tesla T4 (compute capability 7.5)" in message and "use fp16=True" in message
    assert str(caught[0].message) == str(findings[0])
    assert codes(audit({**GOOD, "bf16": True}, gpu=T4)) == ["bf16_emulated"]  # a helpers.env.Gpu works too


def test_fp16_on_cpu_is_a_silent_no_op_and_says_so():
    findings = audit({**GOOD, "fp16": True})  # no GPU on this machine
    assert codes(findings) == ["fp16_ignored_on_cpu"]
    assert "trains in fp32" in findings[0].message and "bf16=True, use_cpu=True" in findings[0].message
    assert codes(audit({**GOOD, "fp16": True, "use_cpu": True}, gpu="T4")) == ["fp16_ignored_on_cpu"]


def test_missing_seed_is_found_in_the_keywords():
    findings = audit({k: v for k, v in GOOD.items() if k != "seed"})
    assert codes(findings) == ["seed_not_set"] and "seed=42" in findings[0].message


def test_nothing_tracked():
    findings = audit({**GOOD, "report_to": "none"})
    assert codes(findings) == ["untracked"] and "report_to='wandb'" in findings[0].message
    assert codes(audit({k: v for k, v in GOOD.items() if k != "report_to"})) == ["untracked"]  # the default


def test_checkpointing_off_while_the_estimate_exceeds_the_card():
    run = {**GOOD, "fp16": True}
    findings = audit(run, model="Qwen2.5-0.5B", gpu="T4", seq_len=1024)
    assert codes(findings) == ["checkpointing_off"]
    message = findings[0].message
    assert "Qwen2.5-0.5B at per_device_batch 4, seq_len 1024, fp16" in message
    assert "pass activation_checkpointing=True" in message and "fits" in message
    assert audit({**run, "activation_checkpointing": True}, model="Qwen2.5-0.5B", gpu="T4", seq_len=1024) == []
    assert audit({**run, "gradient_checkpointing": True}, model="Qwen2.5-0.5B", gpu="T4", seq_len=1024) == []
    assert audit({**run, "per_device_train_batch_size": 1}, model="Qwen2.5-0.5B", gpu="T4", seq_len=512) == []
    worse = audit({**run, "per_device_train_batch_size": 16}, model="Qwen2.5-0.5B", gpu="T4", seq_len=2048)
    assert "helpers.estimate.plan('Qwen2.5-0.5B', 'T4', batch_size=16, seq_len=2048)" in worse[0].message
    with pytest.raises(ValueError, match="pass seq_len="):
        audit(run, model="Qwen2.5-0.5B", gpu="T4")


def test_checkpointing_switched_on_inside_the_model_counts(monkeypatch):
    """load_qlora turns checkpointing on in the model, not in TrainingArguments."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)
    model = type("Model", (), {"config": config, "is_activation_checkpointing": False})()
    run = {**GOOD, "fp16": True}
    assert codes(audit(run, model=model, gpu="T4", seq_len=1024)) == ["checkpointing_off"]
    model.is_activation_checkpointing = True
    assert audit(run, model=model, gpu="T4", seq_len=1024) == []


def test_per_device_batch_reported_as_the_batch_size():
    findings = audit(GOOD, reported_batch=4, num_devices=2)
    assert codes(findings) == ["batch_misreported"]
    assert "per_device_batch 4 x grad_accum_steps 4 x num_devices 2 = 32" in findings[0].message
    assert "report the effective batch 32" in findings[0].message
    assert audit(GOOD, reported_batch=32, num_devices=2) == []


def test_audit_reads_training_arguments_and_warns_again_on_a_repeat(tmp_path):
    args = training_args(str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=8, quiet=True)
    for _ in range(2):  # a notebook cell run twice shows its findings twice
        with pytest.warns(AuditWarning, match="untracked"):
            assert codes(audit(args, reported_batch=2)) == ["untracked", "batch_misreported"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditWarning)  # a script can stop at the first finding
        with pytest.raises(AuditWarning, match="untracked"):
            audit(args)


def test_audit_names_a_misspelled_keyword():
    with pytest.raises(ValueError, match="'gradient_accumulation_step' \\(did you mean 'gradient_accumulation_steps'"):
        audit({"gradient_accumulation_step": 4})


# ---------------------------------------------------------------- fit_batch on a fake out-of-memory error

def fake_train(fits_up_to, error=lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")):
    """A train(args) that fails like a GPU for per-device batches above `fits_up_to`."""
    seen = []

    def train(args):
        b = args["per_device_train_batch_size"] if isinstance(args, dict) else args.per_device_train_batch_size
        seen.append(b)
        if b > fits_up_to:
            raise error()
        return f"trained at {b}"

    return train, seen


def test_fit_batch_halves_the_batch_and_keeps_the_effective_batch(capsys):
    train, seen = fake_train(fits_up_to=2)
    fitted = fit_batch(train, {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}, num_devices=1)
    assert fitted.tried == [(8, 2), (4, 4), (2, 8)] and seen == [8, 4, 2]
    assert fitted.result == "trained at 2"
    assert fitted.args == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    out = capsys.readouterr().out
    assert ("out of memory at per_device_batch 8 x grad_accum_steps 2: "
            "retrying with 4 x 4 (effective batch 16 kept)") in out
    assert "fits at per_device_batch 2 x grad_accum_steps 8: effective batch 16" in out


def test_fit_batch_with_an_odd_batch_keeps_the_product_exact():
    train, _ = fake_train(fits_up_to=1)
    fitted = fit_batch(train, {"per_device_train_batch_size": 6, "gradient_accumulation_steps": 1}, num_devices=1)
    assert fitted.tried == [(6, 1), (3, 2), (1, 6)]


def test_fit_batch_works_on_training_arguments(tmp_path):
    args = training_args(str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=4,
                         gradient_checkpointing=True, quiet=True)
    train, _ = fake_train(fits_up_to=1, error=lambda: RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    fitted = fit_batch(train, args)
    assert fitted.tried == [(4, 4), (2, 8), (1, 16)]
    assert dataclasses.is_dataclass(fitted.args) and fitted.args.activation_checkpointing is True
    assert effective_batch_size(fitted.args) == effective_batch_size(args) == 16


def test_fit_batch_passes_other_errors_through_at_once():
    train, seen = fake_train(fits_up_to=0, error=lambda: ValueError("labels are missing"))
    with pytest.raises(ValueError, match="labels are missing"):
        fit_batch(train, {"per_device_train_batch_size": 8})
    assert seen == [8]


def test_fit_batch_at_batch_one_says_what_to_try_next():
    train, _ = fake_train(fits_up_to=0)
    with pytest.raises(BatchFitError) as caught:
        fit_batch(train, {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}, num_devices=1)
    message = str(caught.value)
    assert "tried per_device_batch x grad_accum_steps: 4 x 2, 2 x 4, 1 x 8; effective batch 8" in message
    assert "activation_checkpointing=True" in message and "paged_adamw_8bit" in message and "QLoRA" in message
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    with pytest.raises(BatchFitError) as again:
        fit_batch(train, {"per_device_train_batch_size": 1, "activation_checkpointing": True})
    assert "activation_checkpointing=True" not in str(again.value)  # already on: not offered again


# ---------------------------------------------------------------- activation_budget: a pretend card

@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    seed_everything(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    return model.train()


def step(model, batch):
    model(input_ids=batch, labels=batch).loss.backward()
    model.zero_grad(set_to_none=True)


def test_activation_budget_admits_exactly_what_saved_tensor_hooks_count(tiny_model):
    from helpers.memory import is_oom_error, track_saved_tensors

    model, batch = tiny_model, torch.randint(0, 128, (2, 16))
    with track_saved_tensors(model) as saved:
        step(model, batch)
    with activation_budget(saved.peak_bytes, model):
        step(model, batch)
        step(model, batch)  # each backward frees its graph: a second step fits the same budget
    with pytest.raises(torch.OutOfMemoryError, match="simulated out of memory") as caught:
        with activation_budget(saved.peak_bytes - 1, model):
            step(model, batch)
    assert is_oom_error(caught.value)


def test_activation_budget_frees_a_failed_step(tiny_model):
    from helpers.memory import track_saved_tensors

    model = tiny_model
    small, big = torch.randint(0, 128, (1, 16)), torch.randint(0, 128, (4, 16))
    with track_saved_tensors(model) as saved:
        step(model, small)
    with activation_budget(2 * saved.peak_bytes, model):
        with pytest.raises(torch.OutOfMemoryError):
            step(model, big)
        step(model, small)  # the failed step's graph is gone once its frames are


def test_fit_batch_on_a_pretend_card_finds_the_batch_that_fits(tiny_model):
    from helpers.memory import track_saved_tensors

    model, data = tiny_model, torch.randint(0, 128, (8, 16))
    with track_saved_tensors(model) as saved:
        step(model, data[:2])

    def train(args):  # one optimizer step, accumulated over micro-batches
        for micro in data.split(args["per_device_train_batch_size"]):
            (model(input_ids=micro, labels=micro).loss / args["gradient_accumulation_steps"]).backward()
        model.zero_grad(set_to_none=True)

    with activation_budget(saved.peak_bytes * 5 // 4, model):
        fitted = fit_batch(train, {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}, num_devices=1)
    assert fitted.tried == [(8, 1), (4, 2), (2, 4)]


def test_effective_batch_of_a_dict_imports_no_transformers():
    """Kaggle T4 x2: computed before notebook_launcher, which refuses to start once bitsandbytes is in."""
    import subprocess
    import sys

    code = ("import sys; from helpers.training import effective_batch_size as e; "
            "assert e({'per_device_train_batch_size': 4, 'gradient_accumulation_steps': 2}, num_devices=2) == 16; "
            "assert 'transformers' not in sys.modules and 'bitsandbytes' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
