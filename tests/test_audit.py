"""helpers.audit: one test per mistake, on dicts, on TrainingArguments and on faked cards."""

import warnings

import pytest

from helpers.audit import AuditWarning, audit
from helpers.env import GIB, Gpu
from helpers.training import training_args

# the audit's findings are the point of several tests below: keep them out of the warnings summary
pytestmark = pytest.mark.filterwarnings("ignore::helpers.audit.AuditWarning")

T4 = Gpu(0, "Tesla T4", 15 * GIB, (7, 5))
A100 = Gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, (8, 0))


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
    findings = audit(run, model="Qwen2.5-0.5B", gpu="T4", seq_len=768)
    assert codes(findings) == ["checkpointing_off"]
    message = findings[0].message
    assert "Qwen2.5-0.5B at per_device_batch 4, seq_len 768, fp16" in message
    assert "pass activation_checkpointing=True" in message and "fits" in message
    assert audit({**run, "activation_checkpointing": True}, model="Qwen2.5-0.5B", gpu="T4", seq_len=768) == []
    assert audit({**run, "gradient_checkpointing": True}, model="Qwen2.5-0.5B", gpu="T4", seq_len=768) == []
    assert audit({**run, "per_device_train_batch_size": 1}, model="Qwen2.5-0.5B", gpu="T4", seq_len=512) == []
    # at 1,024 tokens checkpointing alone is not enough (the loss's backward needs the logits twice more)
    longer = audit(run, model="Qwen2.5-0.5B", gpu="T4", seq_len=1024)
    assert codes(longer) == ["checkpointing_off"] and "turn it on and see helpers.plan.plan(" in longer[0].message
    worse = audit({**run, "per_device_train_batch_size": 16}, model="Qwen2.5-0.5B", gpu="T4", seq_len=2048)
    assert "helpers.plan.plan('Qwen2.5-0.5B', 'T4', per_device_batch=16, seq_len=2048)" in worse[0].message
    with pytest.raises(ValueError, match="pass seq_len="):
        audit(run, model="Qwen2.5-0.5B", gpu="T4")


def test_checkpointing_switched_on_inside_the_model_counts(monkeypatch):
    """load_qlora turns checkpointing on in the model, not in TrainingArguments."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "qwen2",
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    )
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


def test_a_finding_is_shown_from_a_notebook_cell_on_every_python():
    # an IPython cell runs in globals whose __spec__ and __loader__ are None; Python 3.12+ refuses
    # such globals as warn_explicit's module_globals (ValueError), which stopped notebook 02 on
    # Colab (3.13) and Kaggle (3.12). Python 3.11 does not check: the runtime matrix runs this there.
    cell = {"__name__": "__main__", "__spec__": None, "__loader__": None, "__builtins__": __builtins__}
    source = (
        "from helpers.audit import audit\nfound = audit({'bf16': True, 'seed': 1, 'report_to': 'wandb'}, gpu='T4')\n"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(source, "<ipython-input-3>", "exec"), cell)
    assert [f.code for f in cell["found"]] == ["bf16_emulated"]
    shown = [w for w in caught if issubclass(w.category, AuditWarning)]
    assert len(shown) == 1 and shown[0].filename == "<ipython-input-3>" and shown[0].lineno == 2
