"""helpers.maintainer.gpu_proof on CPU: every section's own code, with tiny models, before a card is lent.

`python -m helpers gpu-proof` runs once, on a borrowed GPU, and must work the first time. These tests
run its sections on CPU with real transformers, peft and bitsandbytes: the catalog configs, the model
each method builds (checked against what the estimator assumes it holds), the QLoRA save-and-reload
in 4 bits, checkpointing on and off, the training steps, the estimator call, fit_batch after an
out-of-memory error, the notebooks' watchdog, and the report. What only a card answers (the
allocator's peak, the memory cap, the card's size and precisions, its name) comes from fakes named
as such: the figures themselves stay for the GPU run.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import bitsandbytes as bnb
import psutil
import pytest
import torch
from fake_nvml import FakeCard, FakeNVML

from helpers.__main__ import main as cli
from helpers.estimate import estimate_training_memory, shape_of
from helpers.footprint import measure_footprint
from helpers.maintainer import gpu_proof, runner
from helpers.maintainer import notebooks as kit_notebooks
from helpers.maintainer.gpu_proof import _cuda, _models, estimator, headline, timing
from helpers.maintainer.gpu_proof import notebooks as proof_notebooks
from helpers.maintainer.gpu_proof import report as proof_report
from helpers.maintainer.gpu_proof._proof import NOTEBOOKS_BUDGET_S, Proof
from helpers.maintainer.notebooks import REPO_ROOT

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
    """The fakes put where every section looks the CUDA-only calls up: `_cuda.peak_bytes()` and the rest."""
    fake = FakeCuda()
    for name in ("peak_bytes", "reserved_bytes", "total_bytes", "cap_memory", "precisions", "machine"):
        monkeypatch.setattr(_cuda, name, getattr(fake, name))
    return fake


@pytest.fixture
def tiny(monkeypatch):
    """The catalog's models replaced by tiny shapes, built through the package's own `config_of`."""
    monkeypatch.setattr(_models, "config", lambda name: _models.config_of(name, TINY_SHAPES[name]))
    monkeypatch.setattr(
        estimator, "ESTIMATOR_CASES", (("Qwen-tiny", "full"), ("Qwen-tiny", "lora"), ("Mistral-tiny", "qlora"))
    )
    monkeypatch.setattr(estimator, "SEQ_LENS", (16, 32))
    monkeypatch.setattr(headline, "HEADLINE_MODEL", "Mistral-tiny")
    monkeypatch.setattr(headline, "HEADLINE_SEQ_LEN", 32)
    monkeypatch.setattr(headline, "OOM_MODEL", "Qwen-tiny")
    monkeypatch.setattr(headline, "OOM_SEQ_LEN", 16)
    monkeypatch.setattr(timing, "TIMING_MODEL", "Qwen-tiny")
    monkeypatch.setattr(timing, "TIMING_SEQ_LEN", 16)
    monkeypatch.setattr(timing, "TIMED_STEPS", 2)


@pytest.fixture
def proof(tmp_path):
    (tmp_path / "scratch").mkdir()
    return Proof(tmp_path / "out", tmp_path / "scratch", device="cpu", precision="bf16", card="fake card")


def lora_b(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}


# --- the models: catalog shapes, and what each method holds --------------------------------------


@pytest.mark.parametrize(
    ("name", "config_class"),
    [("Qwen2.5-0.5B", "Qwen2Config"), ("Qwen2.5-1.5B", "Qwen2Config"), ("Mistral-7B", "MistralConfig")],
)
def test_the_configs_built_have_the_catalog_shapes(name, config_class):
    config = _models.config(name)
    assert type(config).__name__ == config_class
    assert shape_of(config) == shape_of(name)  # so the estimator reads the same model from either
    assert config.use_cache is False


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_each_method_builds_the_model_the_estimator_assumes(tiny, proof, method):
    name = "Mistral-tiny"
    model = _models.model(proof, name, method, "bf16")
    config = _models.config(name)
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
    real_build = _models.build
    monkeypatch.setattr(_models, "build", lambda *a: builds.append(a) or real_build(*a))
    folder = _models.saved(proof, "Mistral-tiny")
    assert _models.saved(proof, "Mistral-tiny") == folder and len(builds) == 1
    assert (folder / "config.json").is_file() and list(folder.glob("*.safetensors"))
    assert not list(proof.scratch.glob("*.partial"))
    model = _models.load_qlora(folder, "bf16", "cpu")
    assert model.config.quantization_config.bnb_4bit_quant_type == "nf4"
    assert model.config.quantization_config.bnb_4bit_use_double_quant


def test_checkpointing_goes_on_and_off_without_leaving_the_input_hook(tiny, proof):
    model = _models.model(proof, "Qwen-tiny", "lora", "bf16")
    _models.set_checkpointing(model, True)
    assert model.is_activation_checkpointing and model.base_model.model._require_grads_hooks
    _models.set_checkpointing(model, False)
    assert not model.is_activation_checkpointing and not model.base_model.model._require_grads_hooks


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_training_steps_train_the_adapters_only(tiny, proof, precision):
    model = _models.model(proof, "Mistral-tiny", "qlora", precision)
    _models.set_checkpointing(model, True)
    before, frozen = lora_b(model), model.get_input_embeddings().weight.detach().clone()
    _models.train_steps(model, precision, 16, steps=2, per_device_batch=2, grad_accum_steps=2, device="cpu")
    after = lora_b(model)
    assert all(after[n].abs().sum() > 0 and not torch.equal(after[n], before[n]) for n in before)
    assert torch.equal(model.get_input_embeddings().weight, frozen)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True) after each step


# --- the sections on CPU --------------------------------------------------------------------------


def assert_the_grid_ran_every_case(result: dict) -> None:
    """The estimator section's 16 rows under `tiny`, each the estimator's figure against the fake card's peak."""
    rows = result["rows"]
    assert [(r["model"], r["method"], r["checkpointing"], r["seq_len"]) for r in rows[:4]] == [
        ("Qwen-tiny", "full", False, 16),
        ("Qwen-tiny", "full", False, 32),
        ("Qwen-tiny", "full", True, 16),
        ("Qwen-tiny", "full", True, 32),
    ]
    assert len(rows) == 16 and {r["method"] for r in rows} == {"full", "lora", "qlora"}
    # the card's own precision, then the QLoRA case again in a T4's (fp16: a T4 has no bf16)
    labels = [(r["model"], r["method"], r["precision"], r["card"], r["stands_for"]) for r in rows]
    assert labels[:12] == [(r["model"], r["method"], "bf16", "fake card", "") for r in rows[:12]]
    assert labels[12:] == [("Mistral-tiny", "qlora", "fp16", "fake card", "T4")] * 4
    for r in rows:
        e = estimate_training_memory(
            _models.config(r["model"]),
            per_device_batch=1,
            seq_len=r["seq_len"],
            precision=r["precision"],
            method=r["method"],
            lora_dropout=0.0,
            checkpointing=r["checkpointing"],
            device="cpu",
        )
        assert r["estimated_gib"] == round(e.allocated / 2**30, 3)
        assert r["error_pct"] == round(100 * (e.allocated - FAKE_PEAK_BYTES) / FAKE_PEAK_BYTES, 1)
        assert r["reserved_error_pct"] == round(100 * (e.reserved - FAKE_RESERVED_BYTES) / FAKE_RESERVED_BYTES, 1)
    assert result["median_abs_error_pct"] > 0 and result["median_abs_reserved_error_pct"] > 0


@pytest.mark.slow
def test_a_card_that_trains_in_fp16_has_no_t4_stand_in_rows(tiny, proof, fake_cuda):
    rows = estimator.estimator_grid(dataclasses.replace(proof, precision="fp16"))["rows"]
    assert len(rows) == 12 and {(r["precision"], r["stands_for"]) for r in rows} == {("fp16", "")}


@pytest.mark.slow
def test_a_model_that_fails_leaves_the_other_rows(tiny, proof, fake_cuda, monkeypatch):
    real = _models.train_steps

    def fake_train_steps(model, precision, seq_len, **kw):
        if seq_len == 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")
        return real(model, precision, seq_len, **kw)

    monkeypatch.setattr(_models, "train_steps", fake_train_steps)
    monkeypatch.setattr(_models, "load_qlora", lambda *a: (_ for _ in ()).throw(OSError("no space left (fake)")))
    result = estimator.estimator_grid(proof)
    assert result["status"] == "failed" and "Mistral-tiny qlora bf16, Mistral-tiny qlora fp16 (T4)" in result["error"]
    assert sum("error_pct" in r for r in result["rows"]) == 4  # the 16-token cases of both Qwen models
    failed = [r for r in result["rows"] if "error" in r]
    assert [r["error"] for r in failed][-2:] == ["OSError: no space left (fake)"] * 2
    assert all(r["precision"] and r["card"] == "fake card" for r in failed)  # labelled, even without a figure


def test_the_headline_loads_and_trains_under_the_t4_cap_then_lifts_it(tiny, proof, fake_cuda):
    from helpers.catalog import gpu_bytes
    from helpers.estimate import CUDA_CONTEXT_BYTES

    result = headline.run_headline(proof)
    cap = gpu_bytes("T4") - CUDA_CONTEXT_BYTES
    assert fake_cuda.fractions == [cap / FAKE_CARD_BYTES, 1.0]
    assert result["passed"] and result["precision"] == "fp16"  # a T4's precision, whatever the card lent
    assert result["ran_on"] == "fake card" and result["stands_for"] == "T4"
    assert result["cap_gib"] == round(cap / 2**30, 2) and result["step_peak_gib"] == round(FAKE_PEAK_BYTES / 2**30, 2)


def test_the_headline_lifts_the_cap_when_loading_fails(tiny, proof, fake_cuda, monkeypatch):
    monkeypatch.setattr(_models, "load_qlora", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("fake")))
    with pytest.raises(torch.OutOfMemoryError):
        headline.run_headline(proof)
    assert fake_cuda.fractions[-1] == 1.0


def test_the_oom_section_halves_the_batch_and_keeps_the_effective_batch(tiny, proof, fake_cuda, monkeypatch):
    real, seen = _models.train_steps, []

    def fake_train_steps(model, precision, seq_len, *, per_device_batch, grad_accum_steps, **kw):
        seen.append((per_device_batch, grad_accum_steps))
        if per_device_batch > 4:  # a pretend card: out of memory past 4 sequences
            raise torch.OutOfMemoryError(f"CUDA out of memory at {per_device_batch} (fake)")
        return real(
            model, precision, seq_len, per_device_batch=per_device_batch, grad_accum_steps=grad_accum_steps, **kw
        )

    monkeypatch.setattr(_models, "train_steps", fake_train_steps)
    result = headline.oom_recovery(proof)
    assert "status" not in result, result.get("error")
    assert result["tried"] == [[32, 1], [16, 2], [8, 4], [4, 8]] == [list(t) for t in seen]
    assert result["errors_caught"] == 3 and result["effective_batch_kept"]
    assert result["precision"] == "bf16" and result["ran_on"] == "fake card"
    assert len(fake_cuda.fractions) == 2 and fake_cuda.fractions[-1] == 1.0


def test_the_oom_section_fails_when_nothing_runs_out_of_memory(tiny, proof, fake_cuda):
    result = headline.oom_recovery(proof)  # the fake card never refuses: nothing was proven
    assert result["status"] == "failed" and result["tried"] == [[32, 1]]


def test_the_precision_section_times_each_precision(tiny, proof, fake_cuda):
    result = timing.precision_timing(proof)
    assert [r["precision"] for r in result["rows"]] == ["fp32", "fp16", "bf16"]
    assert all(r["step_ms"] > 0 and r["card"] == "fake card" for r in result["rows"])


# --- the notebooks' watchdog -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_hung_notebook_is_killed_with_the_processes_it_started(proof, monkeypatch, tmp_path):
    pid_file, finished = tmp_path / "child.pid", tmp_path / "finished"
    # the "notebook" would finish after 30 s (and say so in `finished`), ten times its 3 s bound
    hang = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(30); open({str(finished)!r}, 'w')"
    )
    monkeypatch.setattr(proof_notebooks, "_notebook_command", lambda stem, out: [sys.executable, "-c", hang])
    monkeypatch.setattr(proof_notebooks, "NOTEBOOK_TIMEOUT_S", 3)
    monkeypatch.setattr(runner, "select", lambda names: [Path("01_hangs.ipynb")])
    result = proof_notebooks.run_notebooks(proof)
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


def test_a_notebook_row_holds_card_0s_idle_and_peak_from_the_kits_nvml_sampler(proof, monkeypatch):
    nvml = FakeNVML([FakeCard("Tesla T4", 15 * 2**30)])
    readings = iter([300, 2048])  # MiB: the idle card, then the notebook's peak; 500 MiB from then on
    driver_read = nvml.nvmlDeviceGetMemoryInfo

    def read(i):
        nvml.cards[0].used = next(readings, 500) * 2**20
        return driver_read(i)

    monkeypatch.setattr(nvml, "nvmlDeviceGetMemoryInfo", read)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(proof_notebooks, "_notebook_command", lambda stem, out: [sys.executable, "-c", "pass"])
    monkeypatch.setattr(runner, "select", lambda names: [Path("00_a.ipynb")])
    (row,) = proof_notebooks.run_notebooks(proof)["rows"]
    assert (row["idle_mib"], row["card_peak_mib"]) == (300, 2048) and nvml.open == 0


def test_notebooks_past_the_section_budget_are_skipped(proof, monkeypatch):
    monkeypatch.setattr(runner, "select", lambda names: [Path("00_a.ipynb"), Path("01_b.ipynb")])
    result = proof_notebooks.run_notebooks(dataclasses.replace(proof, notebooks_budget_s=0))
    assert [r["status"] for r in result["rows"]] == ["skipped", "skipped"] and result["status"] == "failed"
    md = proof_report.markdown({"machine": FakeCuda().machine(), "sections": {"notebooks": {**result, "seconds": 0.0}}})
    assert "## notebooks (failed, 0.0 s)" in md and "| 00_a | skipped | budget of 0 s spent |" in md


@pytest.fixture
def bounds(monkeypatch) -> list[float]:
    """The time bound each notebook is started with; every notebook passes at once."""
    seen = []

    def fake_row(stem, out, timeout_s):
        seen.append(timeout_s)
        return {"notebook": stem, "status": "ok", "seconds": 0.0, "error": ""}

    monkeypatch.setattr(proof_notebooks, "_notebook_row", fake_row)
    return seen


def test_each_notebook_gets_what_is_left_of_the_budget_at_most_its_own_bound(proof, monkeypatch, bounds):
    monkeypatch.setattr(runner, "select", lambda names: [Path("00_a.ipynb")])
    proof_notebooks.run_notebooks(dataclasses.replace(proof, notebooks_budget_s=45))  # less than one bound
    proof_notebooks.run_notebooks(dataclasses.replace(proof, notebooks_budget_s=3600))  # more than one bound
    assert 40 < bounds[0] <= 45 and bounds[1] == proof_notebooks.NOTEBOOK_TIMEOUT_S


def test_the_runs_time_limit_leaves_the_notebooks_what_the_model_sections_left(proof, monkeypatch, bounds):
    monkeypatch.setattr(runner, "select", lambda names: [Path("00_a.ipynb"), Path("01_b.ipynb")])
    soon = dataclasses.replace(proof, notebooks_budget_s=3600, deadline=time.monotonic() + 50)
    proof_notebooks.run_notebooks(soon)  # 50 s left of the run, not the hour of the budget
    assert len(bounds) == 2 and all(40 < bound <= 50 for bound in bounds)
    past = dataclasses.replace(proof, notebooks_budget_s=3600, deadline=time.monotonic() - 5)
    assert [r["status"] for r in proof_notebooks.run_notebooks(past)["rows"]] == ["skipped", "skipped"]


@pytest.mark.slow
def test_a_notebook_runs_through_the_kits_own_command(proof, monkeypatch):
    monkeypatch.setattr(runner, "select", lambda names: [REPO_ROOT / "notebooks" / "00_where_to_get_gpus.ipynb"])
    result = proof_notebooks.run_notebooks(proof)
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
    # on disk while a section runs: those before it, finished, and itself in progress
    assert [s["status"] for s in seen_on_disk[0].values()] == ["ok", "in progress"]
    assert list(seen_on_disk[1]) == ["first", "second", "third"] and seen_on_disk[1]["second"]["status"] == "failed"
    assert "the card fell over (fake)" in report["sections"]["second"]["traceback"]
    assert json.loads((out / "gpu-proof.json").read_text()) == report


@pytest.mark.slow
def test_the_estimator_grid_runs_every_case_and_the_report_shows_it(tiny, tmp_path, fake_cuda, monkeypatch):
    real = _models.train_steps

    def fake_train_steps(model, precision, seq_len, *, per_device_batch=1, **kw):
        if per_device_batch > 8:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return real(model, precision, seq_len, per_device_batch=per_device_batch, **kw)

    monkeypatch.setattr(_models, "train_steps", fake_train_steps)
    report = gpu_proof.run_proof(tmp_path / "out", only=("estimator", "oom"), device="cpu", precision="bf16")
    assert {n: s["status"] for n, s in report["sections"].items()} == {"estimator": "ok", "oom": "ok"}
    assert_the_grid_ran_every_case(report["sections"]["estimator"])  # the grid runs once, for both
    md = (tmp_path / "out" / "gpu-proof.md").read_text()
    assert "## estimator (ok," in md and "## oom (ok," in md and "Card: fake card" in md
    table = [line for line in md.splitlines() if line.startswith("| Qwen-tiny") or line.startswith("| Mistral-tiny")]
    assert len(table) == 16
    header = "| model | method | checkpointing | seq_len | measured_gib | estimated_gib | error_pct | reserved_gib |"
    assert header in md
    assert "- tried: [[32, 1], [16, 2], [8, 4]]" in md
    assert "| precision | card | stands_for |" in md and "| fp16 | fake card | T4 |" in md
    assert json.loads((tmp_path / "out" / "gpu-proof.json").read_text()) == report


@pytest.mark.slow
def test_without_cuda_the_command_says_so_in_one_sentence_and_fails(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "gpu-proof", "--out", str(tmp_path / "proof")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # nothing was proven: a script that runs it (`gpu-proof && git commit`) must not read success
    assert done.returncode == gpu_proof.NO_GPU_EXIT == 3, done.stderr
    assert done.stderr == gpu_proof.NEEDS_GPU + "\n" and done.stdout == ""
    assert not (tmp_path / "proof").exists()


def test_an_unknown_section_is_an_error_that_lists_them(tmp_path, capsys):
    assert gpu_proof.main(tmp_path, only=("estimatr",)) == 2
    err = capsys.readouterr().err
    assert "'estimatr'" in err and "estimator, headline, oom, precision, notebooks" in err
    assert not list(tmp_path.iterdir())


# --- the order of the sections, the notebooks budget ------------------------------------------------


def spy_sections(monkeypatch, names=tuple(gpu_proof.SECTIONS)):
    """Replace each section by one that records its name and the run's settings; the calls, in a list."""
    calls = []

    def spy(name):
        return lambda proof: calls.append((name, proof)) or {"ran": name}

    monkeypatch.setattr(gpu_proof, "SECTIONS", {name: spy(name) for name in names})
    return calls


@pytest.mark.slow
def test_the_model_sections_run_first_and_the_notebooks_last_by_default(tmp_path, fake_cuda, monkeypatch):
    assert list(gpu_proof.SECTIONS) == ["estimator", "headline", "oom", "precision", "notebooks"]
    calls = spy_sections(monkeypatch)
    report = gpu_proof.run_proof(tmp_path / "out", device="cpu", precision="bf16")
    assert [name for name, _ in calls] == ["estimator", "headline", "oom", "precision", "notebooks"]
    assert list(report["sections"]) == [name for name, _ in calls]
    assert calls[-1][1].notebooks_budget_s == NOTEBOOKS_BUDGET_S and calls[-1][1].card == "fake card"


@pytest.mark.parametrize(
    ("order", "only", "ran"),
    [
        (("notebooks", "oom", "estimator"), (), ["notebooks", "oom", "estimator"]),
        (("precision", "oom", "estimator"), ("estimator", "precision"), ["precision", "estimator"]),
        (None, ("notebooks", "estimator"), ["estimator", "notebooks"]),
    ],
)
@pytest.mark.slow
def test_the_order_is_honoured_and_only_picks_from_it(tmp_path, fake_cuda, monkeypatch, order, only, ran):
    calls = spy_sections(monkeypatch)
    report = gpu_proof.run_proof(tmp_path / "out", order=order, only=only, device="cpu", precision="bf16")
    assert [name for name, _ in calls] == ran and list(report["sections"]) == ran


def test_the_notebooks_budget_reaches_the_section(tmp_path, fake_cuda, monkeypatch):
    calls = spy_sections(monkeypatch)
    gpu_proof.run_proof(tmp_path / "out", only=("notebooks",), notebooks_budget_s=12.5, device="cpu", precision="bf16")
    ((name, proof),) = calls
    assert name == "notebooks" and proof.notebooks_budget_s == 12.5


@pytest.mark.parametrize(
    ("order", "only", "message"),
    [
        (("estimator", "notebok"), (), "no section 'notebok'; the sections: estimator, headline, oom, precision"),
        (("oom", "oom"), (), "the order names oom more than once"),
        (("oom",), ("headline",), "nothing to run: none of headline is in the order oom"),
    ],
)
def test_an_order_that_cannot_run_is_refused_before_it_starts(tmp_path, fake_cuda, monkeypatch, order, only, message):
    calls = spy_sections(monkeypatch)
    with pytest.raises(ValueError, match=re.escape(message)):
        gpu_proof.run_proof(tmp_path / "out", order=order, only=only, device="cpu", precision="bf16")
    assert calls == [] and not (tmp_path / "out").exists()


# --- in progress: a run killed mid-section says which -------------------------------------------------


def test_a_running_section_is_on_disk_as_in_progress(tmp_path, fake_cuda, monkeypatch):
    out, seen = tmp_path / "out", {}

    def headline_section(proof):  # what a reader finds if the machine is taken back right now
        seen["json"] = json.loads((out / "gpu-proof.json").read_text())["sections"]
        seen["md"] = (out / "gpu-proof.md").read_text()
        return {"passed": True}

    calls = spy_sections(monkeypatch, names=("estimator",))
    monkeypatch.setitem(gpu_proof.SECTIONS, "headline", headline_section)
    report = gpu_proof.run_proof(out, device="cpu", precision="bf16")
    assert [name for name, _ in calls] == ["estimator"]
    assert seen["json"]["estimator"]["status"] == "ok"
    assert seen["json"]["headline"] == {"status": "in progress", "started": report["sections"]["headline"]["started"]}
    assert "## estimator (ok, " in seen["md"] and "## headline (in progress)\n" in seen["md"]
    assert "cut short in this section" in seen["md"]
    assert report["sections"]["headline"]["status"] == "ok" and "seconds" in report["sections"]["headline"]


# --- the kit's commit ------------------------------------------------------------------------------


def git(folder, *args):
    return subprocess.run(
        ["git", "-c", "user.name=kit", "-c", "user.email=kit@example.com", "-C", str(folder), *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_commit_of_a_git_checkout_and_whether_tracked_files_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_COMMIT", "not-this-one")  # a checkout's own HEAD comes first
    git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git(tmp_path, "add", "a.py")
    git(tmp_path, "commit", "-q", "-m", "first")
    head = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "new.py").write_text("")  # untracked: not a change to the kit that ran
    assert proof_report.kit_commit(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")
    assert proof_report.kit_commit(tmp_path) == {"commit": head, "dirty": True}
    (tmp_path / "sub").mkdir()  # a folder inside a checkout is not the top of one: a kit copied into it
    assert proof_report.kit_commit(tmp_path / "sub") == {"commit": "not-this-one", "dirty": None}


def test_outside_a_checkout_the_commit_comes_from_kit_commit_else_unknown(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_COMMIT", " 0123abc \n")
    assert proof_report.kit_commit(tmp_path) == {"commit": "0123abc", "dirty": None}
    monkeypatch.delenv("KIT_COMMIT")
    assert proof_report.kit_commit(tmp_path) == {"commit": "unknown", "dirty": None}
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all: still no error
    assert proof_report.kit_commit(tmp_path) == {"commit": "unknown", "dirty": None}


def test_the_report_names_the_kits_commit(tmp_path, fake_cuda, monkeypatch):
    spy_sections(monkeypatch, names=("oom",))
    report = gpu_proof.run_proof(tmp_path / "out", device="cpu", precision="bf16")
    machine, md = report["machine"], (tmp_path / "out" / "gpu-proof.md").read_text()
    assert machine["commit"] == proof_report.kit_commit()["commit"] and machine["commit"] != ""
    assert f"Kit commit {machine['commit']}" in md
    # a copy of the kit without .git (as a lent machine gets it): the commit it was copied from
    monkeypatch.setattr(kit_notebooks, "REPO_ROOT", tmp_path)
    monkeypatch.setenv("KIT_COMMIT", "f00dfeed")
    report = gpu_proof.run_proof(tmp_path / "out", device="cpu", precision="bf16")
    assert report["machine"]["commit"] == "f00dfeed" and report["machine"]["dirty"] is None
    assert "Kit commit f00dfeed. Written by" in (tmp_path / "out" / "gpu-proof.md").read_text()
    dirty = proof_report.markdown({**report, "machine": {**report["machine"], "dirty": True}})
    assert "Kit commit f00dfeed (with uncommitted changes)." in dirty


# --- the command line ------------------------------------------------------------------------------


def test_the_command_line_passes_order_only_and_budget(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(gpu_proof, "main", lambda out, **kw: seen.append((out, kw)) or 0)
    argv = ["gpu-proof", "--out", str(tmp_path), "--only", "estimator,oom", "--only", "headline"]
    assert cli(argv + ["--order", "oom,headline,estimator", "--notebooks-budget", "90", "--time-limit", "500"]) == 0
    assert cli(["gpu-proof", "--out", str(tmp_path)]) == 0
    assert seen[0] == (
        tmp_path,
        {
            "only": ("estimator", "oom", "headline"),
            "order": ["oom", "headline", "estimator"],
            "notebooks_budget_s": 90,
            "time_limit_s": 500,
        },
    )
    assert seen[1][1] == {"only": (), "order": None, "notebooks_budget_s": NOTEBOOKS_BUDGET_S, "time_limit_s": None}


@pytest.mark.parametrize("budget", ["0", "-5", "abc", "nan", "inf"])
def test_a_notebooks_budget_that_is_not_a_positive_number_is_refused(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as exited:
        cli(["gpu-proof", "--out", str(tmp_path / "proof"), f"--notebooks-budget={budget}"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --notebooks-budget:" in err and "e.g. --notebooks-budget 240" in err


def test_an_unknown_section_in_the_order_exits_2_with_the_list(tmp_path, capsys):
    assert cli(["gpu-proof", "--out", str(tmp_path / "proof"), "--order", "estimator,headlines"]) == 2
    err = capsys.readouterr().err
    assert "no section 'headlines'; the sections: estimator, headline, oom, precision, notebooks" in err
    assert not (tmp_path / "proof").exists()
