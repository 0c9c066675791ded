"""helpers.maintainer.gpu_proof on CPU: every section's own code, with tiny models, before a card is lent.

`python -m helpers gpu-proof` runs once, on a borrowed GPU, and must work the first time. These tests
run its sections on CPU with real transformers, peft and bitsandbytes: the catalog configs, the model
each method builds (checked against what the estimator assumes it holds), the QLoRA save-and-reload
in 4 bits, checkpointing on and off, the training steps, the estimator call, fit_batch after an
out-of-memory error, the notebooks' watchdog, and the report. What only a card answers (the
allocator's peak, the memory cap, the card's size and precisions, its name) comes from fakes named
as such: the figures themselves stay for the GPU run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import bitsandbytes as bnb
import psutil
import pytest
import torch

from helpers.estimate import estimate_training_memory, shape_of
from helpers.maintainer import gpu_proof, runner
from helpers.maintainer.notebooks import REPO_ROOT
from helpers.qlora import measure_footprint

# tiny stand-ins for the catalog's shapes: Qwen2 (qkv bias, tied embeddings) and Mistral (untied)
TINY = dict(family="llama", layers=2, heads=4, kv_heads=2, vocab=256)
TINY_SHAPES = {
    "Qwen-tiny": TINY | dict(hidden=64, head_dim=16, intermediate=128, tied=True, qkv_bias=True),
    "Mistral-tiny": TINY | dict(hidden=128, head_dim=32, intermediate=256, tied=False),
}
FAKE_PEAK_BYTES = 100 * 2**20  # what the fake allocator reports as its peak
FAKE_RESERVED_BYTES = 120 * 2**20  # and as its reserved peak
FAKE_CARD_BYTES = 80 * 2**30  # the fake card's size


class FakeCuda:
    """Stands in for the CUDA-only calls: a fixed peak, a card of FAKE_CARD_BYTES, the caps asked for."""

    def __init__(self):
        self.fractions = []

    def peak_bytes(self):
        return FAKE_PEAK_BYTES

    def reserved_bytes(self):
        return FAKE_RESERVED_BYTES

    def total_bytes(self):
        return FAKE_CARD_BYTES

    def cap_memory(self, fraction):
        assert 0 < fraction <= 1, fraction
        self.fractions.append(fraction)

    def precisions(self):
        return ["fp32", "fp16", "bf16"]

    def machine(self):
        card = {"card": "fake card", "total_gib": 80.0, "capability": "9.0", "cuda": "fake"}
        return card | {"python": "3.11", "versions": {"torch": torch.__version__}, "date": "today"}


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    for name in ("peak_bytes", "reserved_bytes", "total_bytes", "cap_memory", "precisions", "machine"):
        monkeypatch.setattr(gpu_proof, f"_{name}", getattr(fake, name))
    return fake


@pytest.fixture
def tiny(monkeypatch):
    """The catalog's models replaced by tiny shapes, built through the module's own `_config_of`."""
    monkeypatch.setattr(gpu_proof, "_config", lambda name: gpu_proof._config_of(name, TINY_SHAPES[name]))
    monkeypatch.setattr(
        gpu_proof, "ESTIMATOR_CASES", (("Qwen-tiny", "full"), ("Qwen-tiny", "lora"), ("Mistral-tiny", "qlora"))
    )
    monkeypatch.setattr(gpu_proof, "SEQ_LENS", (16, 32))
    monkeypatch.setattr(gpu_proof, "HEADLINE_MODEL", "Mistral-tiny")
    monkeypatch.setattr(gpu_proof, "HEADLINE_SEQ_LEN", 32)
    monkeypatch.setattr(gpu_proof, "OOM_MODEL", "Qwen-tiny")
    monkeypatch.setattr(gpu_proof, "OOM_SEQ_LEN", 16)
    monkeypatch.setattr(gpu_proof, "TIMING_MODEL", "Qwen-tiny")
    monkeypatch.setattr(gpu_proof, "TIMING_SEQ_LEN", 16)
    monkeypatch.setattr(gpu_proof, "TIMED_STEPS", 2)


@pytest.fixture
def proof(tmp_path):
    (tmp_path / "scratch").mkdir()
    return gpu_proof._Proof(tmp_path / "out", tmp_path / "scratch", device="cpu", precision="bf16")


def lora_b(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}


# --- the models: catalog shapes, and what each method holds --------------------------------------


@pytest.mark.parametrize(
    ("name", "config_class"),
    [("Qwen2.5-0.5B", "Qwen2Config"), ("Qwen2.5-1.5B", "Qwen2Config"), ("Mistral-7B", "MistralConfig")],
)
def test_the_configs_built_have_the_catalog_shapes(name, config_class):
    config = gpu_proof._config(name)
    assert type(config).__name__ == config_class
    assert shape_of(config) == shape_of(name)  # so the estimator reads the same model from either
    assert config.use_cache is False


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_each_method_builds_the_model_the_estimator_assumes(tiny, proof, method):
    name = "Mistral-tiny"
    model = gpu_proof._model(proof, name, method, "bf16")
    config = gpu_proof._config(name)
    e = estimate_training_memory(config, per_device_batch=1, seq_len=16, precision="bf16", method=method, lora_r=16)
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == e.trainable
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # adapters, master weights
    if method == "qlora":
        assert any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
        assert measure_footprint(model).total_bytes == pytest.approx(e.weights, rel=0.05)  # nf4 blocks on a tiny model
    else:  # full: fp32 master weights; lora: the frozen base in bf16, the adapters in fp32, as the estimator counts
        stored = sum(p.numel() * p.element_size() for p in model.parameters())
        assert stored == e.weights
        frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
        assert frozen == ({torch.bfloat16} if method == "lora" else set())


def test_the_qlora_model_is_saved_once_and_loaded_in_4_bits(tiny, proof, monkeypatch):
    builds = []
    real_build = gpu_proof._build
    monkeypatch.setattr(gpu_proof, "_build", lambda *a: builds.append(a) or real_build(*a))
    folder = gpu_proof._saved(proof, "Mistral-tiny")
    assert gpu_proof._saved(proof, "Mistral-tiny") == folder and len(builds) == 1
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    assert not list(proof.scratch.glob("*.partial"))
    model = gpu_proof._load_qlora(folder, "bf16", "cpu")
    assert model.config.quantization_config.bnb_4bit_quant_type == "nf4"
    assert model.config.quantization_config.bnb_4bit_use_double_quant


def test_checkpointing_goes_on_and_off_without_leaving_the_input_hook(tiny, proof):
    model = gpu_proof._model(proof, "Qwen-tiny", "lora", "bf16")
    gpu_proof._set_checkpointing(model, True)
    assert model.is_activation_checkpointing and model.base_model.model._require_grads_hooks
    gpu_proof._set_checkpointing(model, False)
    assert not model.is_activation_checkpointing and not model.base_model.model._require_grads_hooks


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_training_steps_train_the_adapters_only(tiny, proof, precision):
    model = gpu_proof._model(proof, "Mistral-tiny", "qlora", precision)
    gpu_proof._set_checkpointing(model, True)
    before, frozen = lora_b(model), model.get_input_embeddings().weight.detach().clone()
    gpu_proof._train_steps(model, precision, 16, steps=2, per_device_batch=2, grad_accum_steps=2, device="cpu")
    after = lora_b(model)
    assert all(after[n].abs().sum() > 0 and not torch.equal(after[n], before[n]) for n in before)
    assert torch.equal(model.get_input_embeddings().weight, frozen)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True) after each step


# --- the sections on CPU --------------------------------------------------------------------------


def test_the_estimator_grid_runs_every_case(tiny, proof, fake_cuda):
    result = gpu_proof._estimator_grid(proof)
    rows = result["rows"]
    assert "status" not in result, result.get("error")
    assert [(r["model"], r["method"], r["checkpointing"], r["seq_len"]) for r in rows[:4]] == [
        ("Qwen-tiny", "full", False, 16),
        ("Qwen-tiny", "full", False, 32),
        ("Qwen-tiny", "full", True, 16),
        ("Qwen-tiny", "full", True, 32),
    ]
    assert len(rows) == 12 and {r["method"] for r in rows} == {"full", "lora", "qlora"}
    for r in rows:
        e = estimate_training_memory(
            gpu_proof._config(r["model"]),
            per_device_batch=1,
            seq_len=r["seq_len"],
            precision="bf16",
            method=r["method"],
            lora_dropout=0.0,
            checkpointing=r["checkpointing"],
            device="cpu",
        )
        assert r["estimated_gib"] == round(e.allocated / 2**30, 3)
        assert r["error_pct"] == round(100 * (e.allocated - FAKE_PEAK_BYTES) / FAKE_PEAK_BYTES, 1)
        assert r["reserved_error_pct"] == round(100 * (e.reserved - FAKE_RESERVED_BYTES) / FAKE_RESERVED_BYTES, 1)
    assert result["median_abs_error_pct"] > 0 and result["median_abs_reserved_error_pct"] > 0


def test_a_model_that_fails_leaves_the_other_rows(tiny, proof, fake_cuda, monkeypatch):
    real = gpu_proof._train_steps

    def fake_train_steps(model, precision, seq_len, **kw):
        if seq_len == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")
        return real(model, precision, seq_len, **kw)

    monkeypatch.setattr(gpu_proof, "_train_steps", fake_train_steps)
    monkeypatch.setattr(gpu_proof, "_load_qlora", lambda *a: (_ for _ in ()).throw(OSError("no space left (fake)")))
    result = gpu_proof._estimator_grid(proof)
    assert result["status"] == "failed" and "Mistral-tiny qlora" in result["error"]
    assert sum("error_pct" in r for r in result["rows"]) == 4  # the 16-token cases of both Qwen models
    assert [r["error"] for r in result["rows"] if "error" in r][-1] == "OSError: no space left (fake)"


def test_the_headline_loads_and_trains_under_the_t4_cap_then_lifts_it(tiny, proof, fake_cuda):
    from helpers.catalog import gpu_bytes
    from helpers.estimate import CUDA_CONTEXT_BYTES

    result = gpu_proof._headline(proof)
    cap = gpu_bytes("T4") - CUDA_CONTEXT_BYTES
    assert fake_cuda.fractions == [cap / FAKE_CARD_BYTES, 1.0]
    assert result["passed"] and result["precision"] == "fp16"  # a T4's precision, whatever the card lent
    assert result["cap_gib"] == round(cap / 2**30, 2) and result["step_peak_gib"] == round(FAKE_PEAK_BYTES / 2**30, 2)


def test_the_headline_lifts_the_cap_when_loading_fails(tiny, proof, fake_cuda, monkeypatch):
    monkeypatch.setattr(gpu_proof, "_load_qlora", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("fake")))
    with pytest.raises(torch.OutOfMemoryError):
        gpu_proof._headline(proof)
    assert fake_cuda.fractions[-1] == 1.0


def test_the_oom_section_halves_the_batch_and_keeps_the_effective_batch(tiny, proof, fake_cuda, monkeypatch):
    real, seen = gpu_proof._train_steps, []

    def fake_train_steps(model, precision, seq_len, *, per_device_batch, grad_accum_steps, **kw):
        seen.append((per_device_batch, grad_accum_steps))
        if per_device_batch > 4:  # a pretend card: out of memory past 4 sequences
            raise torch.OutOfMemoryError(f"CUDA out of memory at {per_device_batch} (fake)")
        return real(
            model, precision, seq_len, per_device_batch=per_device_batch, grad_accum_steps=grad_accum_steps, **kw
        )

    monkeypatch.setattr(gpu_proof, "_train_steps", fake_train_steps)
    result = gpu_proof._oom_recovery(proof)
    assert "status" not in result, result.get("error")
    assert result["tried"] == [[32, 1], [16, 2], [8, 4], [4, 8]] == [list(t) for t in seen]
    assert result["errors_caught"] == 3 and result["effective_batch_kept"]
    assert len(fake_cuda.fractions) == 2 and fake_cuda.fractions[-1] == 1.0


def test_the_oom_section_fails_when_nothing_runs_out_of_memory(tiny, proof, fake_cuda):
    result = gpu_proof._oom_recovery(proof)  # the fake card never refuses: nothing was proven
    assert result["status"] == "failed" and result["tried"] == [[32, 1]]


def test_the_precision_section_times_each_precision(tiny, proof, fake_cuda):
    result = gpu_proof._precision_timing(proof)
    assert [r["precision"] for r in result["rows"]] == ["fp32", "fp16", "bf16"]
    assert all(r["step_ms"] > 0 for r in result["rows"])


# --- the notebooks' watchdog -----------------------------------------------------------------------


def test_a_hung_notebook_is_killed_with_the_processes_it_started(proof, monkeypatch, tmp_path):
    pid_file, finished = tmp_path / "child.pid", tmp_path / "finished"
    # the "notebook" would finish after 30 s (and say so in `finished`), ten times its 3 s bound
    hang = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(30); open({str(finished)!r}, 'w')"
    )
    monkeypatch.setattr(gpu_proof, "_notebook_command", lambda stem, out: [sys.executable, "-c", hang])
    monkeypatch.setattr(gpu_proof, "NOTEBOOK_TIMEOUT_S", 3)
    monkeypatch.setattr(runner, "select", lambda names: [Path("01_hangs.ipynb")])
    result = gpu_proof._notebooks(proof)
    # an order, not a duration: the section returned while the notebook had not finished, so it was
    # stopped at its bound, not waited for (a wait past 30 s would find `finished` written)
    assert not finished.exists(), "the hung notebook was waited for instead of killed at NOTEBOOK_TIMEOUT_S"
    (row,) = result["rows"]
    print(f"\nthe hung notebook was killed after {row['seconds']} s (bound: 3 s)")
    assert row["status"] == "timed out" and result["status"] == "failed"
    child = int(pid_file.read_text())  # the grandchild, in a session of its own as a kernel is, is gone too
    try:
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE  # killed, waiting for init to reap it
    except psutil.NoSuchProcess:
        pass


def test_notebooks_past_the_section_budget_are_skipped(proof, monkeypatch):
    monkeypatch.setattr(gpu_proof, "NOTEBOOKS_BUDGET_S", 0)
    monkeypatch.setattr(runner, "select", lambda names: [Path("00_a.ipynb"), Path("01_b.ipynb")])
    result = gpu_proof._notebooks(proof)
    assert [r["status"] for r in result["rows"]] == ["skipped", "skipped"] and result["status"] == "failed"
    md = gpu_proof._markdown({"machine": FakeCuda().machine(), "sections": {"notebooks": {**result, "seconds": 0.0}}})
    assert "## notebooks (failed, 0.0 s)" in md and "| 00_a | skipped | 0 s spent |" in md


def test_a_notebook_runs_through_the_kits_own_command(proof, monkeypatch):
    monkeypatch.setattr(runner, "select", lambda names: [REPO_ROOT / "notebooks" / "00_where_to_get_gpus.ipynb"])
    result = gpu_proof._notebooks(proof)
    (row,) = result["rows"]
    assert row["status"] == "ok", row["error"]
    assert row["card_peak_mib"] == 0 and row["idle_mib"] == 0  # no NVML on a CPU machine
    assert (proof.out / "notebook-run" / "00_where_to_get_gpus" / "notebooks" / "00_where_to_get_gpus.ipynb").is_file()


# --- the run and its report ------------------------------------------------------------------------


def test_a_failing_section_is_recorded_and_the_report_is_written_after_each(tmp_path, fake_cuda, monkeypatch):
    out, seen_on_disk = tmp_path / "out", []

    def first(proof):
        return {"rows": [{"model": "m", "error_pct": 1.5}]}

    def second(proof):
        seen_on_disk.append(json.loads((out / "gpu-proof.json").read_text())["sections"])
        raise RuntimeError("the card fell over (fake)")

    def third(proof):
        seen_on_disk.append(json.loads((out / "gpu-proof.json").read_text())["sections"])
        assert "RuntimeError" in (out / "gpu-proof.md").read_text()
        return {"passed": True}

    monkeypatch.setattr(gpu_proof, "SECTIONS", {"first": first, "second": second, "third": third})
    report = gpu_proof.run_proof(out, device="cpu", precision="bf16")
    assert [s["status"] for s in report["sections"].values()] == ["ok", "failed", "ok"]
    assert list(seen_on_disk[0]) == ["first"] and list(seen_on_disk[1]) == ["first", "second"]
    assert "the card fell over (fake)" in report["sections"]["second"]["traceback"]
    assert json.loads((out / "gpu-proof.json").read_text()) == report


def test_the_report_of_real_sections(tiny, tmp_path, fake_cuda, monkeypatch):
    real = gpu_proof._train_steps

    def fake_train_steps(model, precision, seq_len, *, per_device_batch=1, **kw):
        if per_device_batch > 8:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return real(model, precision, seq_len, per_device_batch=per_device_batch, **kw)

    monkeypatch.setattr(gpu_proof, "_train_steps", fake_train_steps)
    report = gpu_proof.run_proof(tmp_path / "out", only=("estimator", "oom"), device="cpu", precision="bf16")
    assert {n: s["status"] for n, s in report["sections"].items()} == {"estimator": "ok", "oom": "ok"}
    md = (tmp_path / "out" / "gpu-proof.md").read_text()
    assert "## estimator (ok," in md and "## oom (ok," in md and "Card: fake card" in md
    table = [line for line in md.splitlines() if line.startswith("| Qwen-tiny") or line.startswith("| Mistral-tiny")]
    assert len(table) == 12
    header = "| model | method | checkpointing | seq_len | measured_gib | estimated_gib | error_pct | reserved_gib |"
    assert header in md
    assert "- tried: [[32, 1], [16, 2], [8, 4]]" in md
    assert json.loads((tmp_path / "out" / "gpu-proof.json").read_text()) == report


def test_without_cuda_the_command_says_so_in_one_sentence_and_exits_0(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "gpu-proof", "--out", str(tmp_path / "proof")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == gpu_proof.NEEDS_GPU + "\n"
    assert not (tmp_path / "proof").exists()


def test_an_unknown_section_is_an_error_that_lists_them(tmp_path, capsys):
    assert gpu_proof.main(tmp_path, only=("estimatr",)) == 2
    err = capsys.readouterr().err
    assert "'estimatr'" in err and "notebooks, estimator, headline, oom, precision" in err
    assert not list(tmp_path.iterdir())
