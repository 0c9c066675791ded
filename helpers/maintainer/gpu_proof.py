"""`python -m helpers gpu-proof --out DIR`: the kit proven on one real CUDA card, in one command.

For a machine with one CUDA GPU and no internet; about 4-6 minutes on an H100/H200 class card, under
8 at worst (each notebook, and all of them, run under a time limit, so nothing waits forever). It
writes `DIR/gpu-proof.md` (the tables a reviewer reads) and `DIR/gpu-proof.json` (the same figures)
after each section, so a run cut short still leaves what it measured:

1. every notebook executed on the GPU with the embedded model, each in its own
   `python -m helpers run --only NAME --smoke` process killed past NOTEBOOK_TIMEOUT_S (pass/fail,
   seconds, the card's peak memory sampled through NVML while it ran);
2. the estimator against `torch.cuda.max_memory_allocated` on models built from catalog configs
   with random weights (nothing downloaded): a ~0.5B model full and LoRA, a ~1.5B LoRA, a 7B
   QLoRA, checkpointing off and on, 512 and 1024 tokens, with the signed error of each line;
3. the headline: a 7B QLoRA training step, loading included, in the T4's precision, in a process
   whose allocator may hold what a T4's can (`torch.cuda.set_per_process_memory_fraction`);
4. a real `torch.OutOfMemoryError` caught, and `helpers.oom.fit_batch` recovering with the
   effective batch kept;
5. step time of the same model in fp32, fp16 autocast and bf16 autocast (what the card supports).

The 7B is built once with random bf16 weights and saved to a scratch folder (/dev/shm when it has
room, so no disk write); sections 2 and 3 load it in 4 bits from there, as a student loads a
download. Without CUDA it prints one sentence and exits 0: its figures cannot be simulated honestly.
tests/test_gpu_proof.py runs every section's code on CPU with tiny models instead, with the few
CUDA-only calls (peak bytes, the memory cap, the card's size and precisions) replaced by fakes.

Longer than 400 lines because it is one command that must run whole the first time a card is
lent: its five sections share the model builders and the CUDA-only calls the tests replace, and the
report is written as each finishes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from helpers._util import GIB, MIB

__all__ = ["ESTIMATOR_CASES", "SECTIONS", "main", "run_proof"]

SEQ_LENS = (512, 1024)
# (catalog model, method): the sizes a student meets, from a full fine-tune to a 7B QLoRA
ESTIMATOR_CASES = (
    ("Qwen2.5-0.5B", "full"),
    ("Qwen2.5-0.5B", "lora"),
    ("Qwen2.5-1.5B", "lora"),
    ("Mistral-7B", "qlora"),
)
HEADLINE_MODEL, HEADLINE_CARD, HEADLINE_SEQ_LEN = "Mistral-7B", "T4", 1024
OOM_MODEL, OOM_BATCH, OOM_SEQ_LEN = "Qwen2.5-0.5B", 32, 1024  # 32 x 1024 tokens: ~110 GiB by the estimator
TIMING_MODEL, TIMING_SEQ_LEN, TIMED_STEPS = "Qwen2.5-0.5B", 512, 5
LORA_R = 16
NOTEBOOK_TIMEOUT_S = 120  # a smoke notebook takes 10-30 s on a GPU; a hung one is killed past this
NOTEBOOKS_BUDGET_S = 240  # all nine (~15 s each); those left when it is spent are recorded as skipped
NEEDS_GPU = "gpu-proof needs one CUDA GPU (torch.cuda.is_available() is False here); nothing was run."


def main(out: Path, *, only: tuple[str, ...] = ()) -> int:
    """Run every section (or those named in `only`) and write DIR/gpu-proof.{md,json}; 0 unless a section failed."""
    import torch

    unknown = [name for name in only if name not in SECTIONS]
    if unknown:
        print(
            f"error: no section {', '.join(map(repr, unknown))}; the sections: {', '.join(SECTIONS)}", file=sys.stderr
        )
        return 2
    if not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    from helpers.simulate import VARIABLE as SIMULATE

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no internet: nothing, here or in a notebook, waits on the Hub
    os.environ[SIMULATE] = ""  # this card's own figures, never those of a card `helpers.simulate` pretends
    report = run_proof(Path(out), only=only)
    failed = [name for name, section in report["sections"].items() if section.get("status") != "ok"]
    print(f"wrote {Path(out) / 'gpu-proof.md'}" + (f"; failed sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


@dataclass
class _Proof:
    """What the sections share: the output folder, the scratch folder of saved models, the device, its precision."""

    out: Path
    scratch: Path
    device: str = "cuda"
    precision: str = "bf16"


def run_proof(out: Path, *, only: tuple[str, ...] = (), device: str = "cuda", precision: str | None = None) -> dict:
    """The sections in order, each isolated: one that raises is recorded as failed and the rest go on.

    `device` and `precision` default to the card and what it supports; the tests pass "cpu" and "bf16".
    """
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": _machine(), "sections": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-proof-", dir=_scratch_root(), ignore_cleanup_errors=True) as scratch:
        proof = _Proof(out, Path(scratch), device, precision or _precision())
        for name, section in SECTIONS.items():
            if only and name not in only:
                continue
            print(f"== {name}", flush=True)
            start = time.perf_counter()
            try:
                result = {"status": "ok", **section(proof)}
            except Exception as e:  # the report says which section failed and why; the others still run
                result = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            result["seconds"] = round(time.perf_counter() - start, 1)
            report["sections"][name] = result
            _release()
            _write(out, report)  # after every section: a run cut short keeps what it measured
    return report


# ---------------------------------------------------------------------------------------------
# the machine; the CUDA-only calls, one small function each (the tests replace them with fakes)


def _machine() -> dict:
    import torch

    from helpers.manifest import package_versions

    p = torch.cuda.get_device_properties(0)
    return {
        "card": p.name,
        "total_gib": round(p.total_memory / GIB, 2),
        "capability": f"{p.major}.{p.minor}",
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "versions": package_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _precision() -> str:
    from helpers.env import choose_precision, detect_gpus

    return choose_precision(detect_gpus()).name


def _precisions() -> list[str]:
    import torch

    return ["fp32", "fp16"] + (["bf16"] if torch.cuda.get_device_capability() >= (8, 0) else [])


def _peak_bytes() -> int:
    import torch

    return torch.cuda.max_memory_allocated()


def _reserved_bytes() -> int:
    import torch

    return torch.cuda.max_memory_reserved()


def _total_bytes() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def _cap_memory(fraction: float) -> None:
    """Let this process's allocator reserve at most `fraction` of the card; 1.0 lifts the cap."""
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction)


def _release() -> None:
    """Collect the last model's garbage, hand the allocator's cache back, start the peak again."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _sync() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _scratch_root() -> str | None:
    """/dev/shm when it has room for a 7B in bf16 twice over (no 14 GB disk write), else the usual temp folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 32 * GIB else None


# ---------------------------------------------------------------------------------------------
# 1. the notebooks on the card


class _NvmlPeak:
    """Sample the card's used memory through NVML in a thread: `idle` before a notebook, `peak` while it runs."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s, self.idle, self.peak = interval_s, 0, 0
        self._stop, self._first = threading.Event(), threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self._first.wait(timeout=5)  # the idle figure is read before the notebook starts
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)  # a driver that stopped answering must not hold the run

    def _sample(self):
        from helpers.env import _nvml_devices

        try:
            with _nvml_devices() as devices:
                while devices and not self._stop.is_set():
                    used = devices[0].memory().used
                    self.idle, self.peak = self.idle or used, max(self.peak, used)
                    self._first.set()
                    self._stop.wait(self.interval_s)
        finally:
            self._first.set()


def _notebooks(proof: _Proof) -> dict:
    from helpers.maintainer import runner

    deadline, rows = time.monotonic() + NOTEBOOKS_BUDGET_S, []
    for path in runner.select(None):
        left = deadline - time.monotonic()
        if left < 30:
            rows.append({"notebook": path.stem, "status": "skipped", "error": f"{NOTEBOOKS_BUDGET_S} s spent"})
            continue
        rows.append(
            _notebook_row(path.stem, (proof.out / "notebook-run" / path.stem).resolve(), min(left, NOTEBOOK_TIMEOUT_S))
        )
        print(f"  {rows[-1]['status']:9} {path.stem} {rows[-1]['seconds']} s {rows[-1]['error']}", flush=True)
    failed = [r["notebook"] for r in rows if r["status"] != "ok"]
    return {"rows": rows, **({"status": "failed", "error": f"not ok: {', '.join(failed)}"} if failed else {})}


def _notebook_command(stem: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "helpers", "run", "--only", stem, "--smoke", "--out", str(out)]


def _notebook_row(stem: str, out: Path, timeout_s: float) -> dict:
    """Run one notebook in its own process (and its kernel), killed with its children past `timeout_s`."""
    from helpers.maintainer.notebooks import REPO_ROOT

    out.mkdir(parents=True, exist_ok=True)
    log, summary = out / "output.log", out / "summary.json"
    summary.unlink(missing_ok=True)
    start = time.perf_counter()
    with _NvmlPeak() as peak, log.open("w") as f:  # a file, not a pipe: a chatty notebook cannot fill it and stall
        process = subprocess.Popen(_notebook_command(stem, out), cwd=REPO_ROOT, stdout=f, stderr=subprocess.STDOUT)
        timed_out = False
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(process.pid)
            timed_out = True
    row = {"notebook": stem, "status": "failed", "seconds": round(time.perf_counter() - start, 1)}
    row.update(card_peak_mib=round(peak.peak / MIB), idle_mib=round(peak.idle / MIB))
    if timed_out:
        return {**row, "status": "timed out", "error": f"killed after {timeout_s:.0f} s; its output: {log}"}
    if not summary.is_file():
        tail = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
        return {**row, "error": f"exit code {process.returncode}, no summary.json: {tail}"}
    outcome = json.loads(summary.read_text())[0]
    return {**row, "status": outcome["status"], "error": (outcome["error"].strip().splitlines() or [""])[-1]}


def _kill_tree(pid: int) -> None:
    """Kill the process `pid` and everything it started (a Jupyter kernel runs in a session of its own)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        processes = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in processes:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(processes, timeout=10)


# ---------------------------------------------------------------------------------------------
# 2. the estimator against the allocator


@dataclass
class _Case:
    model: str
    method: str
    checkpointing: bool
    seq_len: int


def _estimator_grid(proof: _Proof) -> dict:
    rows = []
    for model_name, method in ESTIMATOR_CASES:
        try:  # one model that cannot be built or loaded leaves the others' rows
            model, config = _model(proof, model_name, method, proof.precision), _config(model_name)
            for checkpointing in (False, True):
                for seq_len in SEQ_LENS:
                    case = _Case(model_name, method, checkpointing, seq_len)
                    rows.append(_measure_case(model, config, proof.precision, case, proof.device))
                    print(f"  {_row_text(rows[-1])}", flush=True)
        except Exception as e:
            traceback.print_exc()
            rows.append({"model": model_name, "method": method, "error": f"{type(e).__name__}: {e}"})
        model = None
        _release()
    errors = sorted(abs(r["error_pct"]) for r in rows if "error_pct" in r)
    reserved = sorted(abs(r["reserved_error_pct"]) for r in rows if "reserved_error_pct" in r)
    failed = list(dict.fromkeys(f"{r['model']} {r['method']}" for r in rows if "error" in r))
    return {
        "rows": rows,
        "median_abs_error_pct": errors[len(errors) // 2] if errors else None,
        "median_abs_reserved_error_pct": reserved[len(reserved) // 2] if reserved else None,
        **({"status": "failed", "error": f"no figure for: {', '.join(failed)}"} if failed else {}),
    }


def _row_text(r: dict) -> str:
    where = f"{r['model']} {r['method']} ckpt={r['checkpointing']} {r['seq_len']}"
    if "error" in r:
        return f"{where}: {r['error']}"
    figures = f"measured {r['measured_gib']:.2f} GiB, estimated {r['estimated_gib']:.2f} GiB ({r['error_pct']:+.1f} %)"
    return f"{where}: {figures}; reserved {r['reserved_gib']:.2f} GiB ({r['reserved_error_pct']:+.1f} %)"


def _config(model_name: str):
    """A transformers config for a catalog model, from the catalog's shape (no download)."""
    from helpers.catalog import find

    return _config_of(model_name, find("models", model_name)[1]["shape"])


def _config_of(model_name: str, shape: dict):
    from transformers import AutoConfig

    model_type = {"llama": "llama", "gemma": "gemma", "phi3": "phi3"}[shape["family"]]
    if shape.get("qkv_bias"):
        model_type = "qwen2"
    if model_name.startswith("Mistral"):
        model_type = "mistral"
    return AutoConfig.for_model(
        model_type,
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=shape["intermediate"],
        vocab_size=shape["vocab"],
        tie_word_embeddings=shape.get("tied", False),
        max_position_embeddings=4096,
        use_cache=False,
    )


def _model(proof: _Proof, model_name: str, method: str, precision: str):
    """Full: fp32 master weights built on the device. LoRA: the base in the compute dtype, as the estimator's
    "lora" stores it. QLoRA: the saved bf16 model loaded in 4 bits."""
    if method == "qlora":
        return _load_qlora(_saved(proof, model_name), precision, proof.device)
    model = _build(_config(model_name), "fp32" if method == "full" else precision, proof.device)
    return _with_lora(model) if method == "lora" else model


def _build(config, precision: str, device: str = "cuda"):
    """A model with random weights, made directly on `device` in `precision`'s dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from helpers._util import torch_dtype

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(precision))
    model.config.use_cache = False
    return model


def _saved(proof: _Proof, model_name: str) -> Path:
    """The model with random bf16 weights, as a Hub checkpoint ships it: built and saved once per run."""
    folder = proof.scratch / model_name
    if not folder.is_dir():
        model = _build(_config(model_name), "bf16", proof.device)
        partial = folder.parent / f"{folder.name}.partial"
        model.save_pretrained(partial)
        partial.rename(folder)  # a save cut short is never taken for a whole one
        model = None
        _release()
    return folder


def _load_qlora(folder: Path, precision: str, device: str = "cuda"):
    """Load as `helpers.qlora.load_qlora` does: NF4, double quantization, peft's k-bit preparation, LoRA."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from helpers._util import torch_dtype
    from helpers.qlora import disable_cpu_repacking

    compute = torch_dtype(precision)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    device_map = {"": 0} if device == "cuda" else None  # as load_qlora: the whole model on the card
    model = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quant, dtype=compute, device_map=device_map
    )
    disable_cpu_repacking(model)  # nothing on a GPU; on CPU, keeps the LoRA gradients right
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model.config.use_cache = False
    return _with_lora(model)


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", r".*is_gradient_checkpointing.*", FutureWarning)
        return get_peft_model(model, adapter)


def _set_checkpointing(model, on: bool) -> None:
    """Non-reentrant checkpointing on every layer, as notebooks 01 and 03 switch it (the embeddings' output
    then requires grad, which the estimator counts); off again removes that hook as well."""
    if on:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
        model.disable_input_require_grads()  # transformers leaves it on a model peft wrapped


def _train_steps(
    model, precision: str, seq_len: int, *, steps=2, per_device_batch=1, grad_accum_steps=1, device="cuda"
):
    """`steps` optimizer steps of fused AdamW (the Trainer's default) under autocast, on random tokens."""
    import torch

    from helpers._util import torch_dtype

    half = precision in ("bf16", "fp16")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    model.train()
    for _ in range(steps):
        for _ in range(grad_accum_steps):
            ids = torch.randint(0, model.config.vocab_size, (per_device_batch, seq_len), device=device)
            with torch.autocast(device, dtype=torch_dtype(precision) if half else torch.bfloat16, enabled=half):
                loss = model(input_ids=ids, labels=ids).loss / grad_accum_steps
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def _measure_case(model, config, precision: str, case: _Case, device: str = "cuda") -> dict:
    """Two training steps of `case`: the allocator's peak beside the estimator's `allocated`."""
    import torch

    row = {"model": case.model, "method": case.method, "checkpointing": case.checkpointing, "seq_len": case.seq_len}
    _set_checkpointing(model, case.checkpointing)
    _release()
    try:
        _train_steps(model, precision, case.seq_len, device=device)
    except torch.OutOfMemoryError as e:
        return {**row, "error": f"out of memory: {str(e).splitlines()[0]}"}
    measured, reserved = _peak_bytes(), _reserved_bytes()
    attn_impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    estimate = _estimate(config, precision, case.seq_len, case.method, case.checkpointing, device, attn_impl)
    return {
        **row,
        "measured_gib": round(measured / GIB, 3),
        "estimated_gib": round(estimate.allocated / GIB, 3),
        "error_pct": round(100 * (estimate.allocated - measured) / measured, 1),
        # the caching allocator's slack, ACTIVATION_SLACK's check: reserved against allocated + slack
        "reserved_gib": round(reserved / GIB, 3),
        "estimated_reserved_gib": round(estimate.reserved / GIB, 3),
        "reserved_error_pct": round(100 * (estimate.reserved - reserved) / reserved, 1),
    }


def _estimate(config, precision, seq_len, method, checkpointing, device, attn_impl=None):
    """The estimator's figure for one sequence, with the LoRA settings the models here are built with."""
    from helpers.estimate import estimate_training_memory

    return estimate_training_memory(
        config,  # the catalog model's shape: the tests check that config and catalog name agree
        per_device_batch=1,
        seq_len=seq_len,
        precision=precision,
        method=method,
        lora_r=LORA_R,
        lora_dropout=0.0,
        checkpointing=checkpointing,
        device=device,
        attn_impl=attn_impl,
    )


# ---------------------------------------------------------------------------------------------
# 3. the headline: a 7B QLoRA step inside a T4's memory


def _headline(proof: _Proof) -> dict:
    from helpers.catalog import card_capability, gpu_bytes
    from helpers.env import Gpu, choose_precision
    from helpers.estimate import CUDA_CONTEXT_BYTES

    card, total = gpu_bytes(HEADLINE_CARD), _total_bytes()
    if total < card:
        return {"status": "failed", "error": f"this card ({total / GIB:.1f} GiB) is smaller than a {HEADLINE_CARD}"}
    cap = card - CUDA_CONTEXT_BYTES  # what a T4's allocator has once its CUDA context took its share
    precision = choose_precision([Gpu(0, HEADLINE_CARD, card, card_capability(HEADLINE_CARD))]).name  # fp16
    folder = _saved(proof, HEADLINE_MODEL)  # made before the cap, as a download is
    _release()
    _cap_memory(cap / total)  # the allocator refuses past this, as a T4 would
    try:
        start = time.perf_counter()
        model = _load_qlora(folder, precision, proof.device)
        loaded = _peak_bytes()
        _set_checkpointing(model, True)
        _release()
        _train_steps(model, precision, HEADLINE_SEQ_LEN, device=proof.device)
        step_peak, wall_s = _peak_bytes(), time.perf_counter() - start
        model = None
    finally:
        _cap_memory(1.0)
    estimate = _estimate(_config(HEADLINE_MODEL), precision, HEADLINE_SEQ_LEN, "qlora", True, proof.device)
    return {
        "model": HEADLINE_MODEL,
        "card": HEADLINE_CARD,
        "cap_gib": round(cap / GIB, 2),
        "precision": precision,
        "seq_len": HEADLINE_SEQ_LEN,
        "load_peak_gib": round(loaded / GIB, 2),
        "step_peak_gib": round(step_peak / GIB, 2),
        "estimated_gib": round(estimate.allocated / GIB, 2),
        "passed": True,
        "wall_s": round(wall_s, 1),
    }


# ---------------------------------------------------------------------------------------------
# 4. a real out-of-memory error, and fit_batch


def _oom_recovery(proof: _Proof) -> dict:
    import torch

    from helpers.oom import fit_batch

    one = _estimate(_config(OOM_MODEL), proof.precision, OOM_SEQ_LEN, "lora", False, proof.device)
    cap = 2 * one.reserved  # room for a per-device batch of about 2, far from OOM_BATCH
    model, caught = _model(proof, OOM_MODEL, "lora", proof.precision), []

    def train(args):
        model.zero_grad(set_to_none=True)  # an attempt that failed in backward leaves gradients behind
        b, k = args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
        try:  # one optimizer step of b x k sequences
            _train_steps(
                model,
                proof.precision,
                OOM_SEQ_LEN,
                steps=1,
                per_device_batch=b,
                grad_accum_steps=k,
                device=proof.device,
            )
        except torch.OutOfMemoryError as e:
            caught.append(str(e).splitlines()[0][:160])
            raise
        return args

    _release()
    _cap_memory(cap / _total_bytes())
    try:
        fitted = fit_batch(train, {"per_device_train_batch_size": OOM_BATCH, "gradient_accumulation_steps": 1})
    finally:
        _cap_memory(1.0)
    kept = all(b * k == OOM_BATCH for b, k in fitted.tried)
    return {
        "model": OOM_MODEL,
        "cap_gib": round(cap / GIB, 2),
        "tried": [list(t) for t in fitted.tried],
        "errors_caught": len(caught),
        "first_error": caught[0] if caught else "",
        "effective_batch_kept": kept,
        **({} if caught and kept else {"status": "failed", "error": "no out-of-memory error, or the batch changed"}),
    }


# ---------------------------------------------------------------------------------------------
# 5. step time by precision


def _precision_timing(proof: _Proof) -> dict:
    model, rows = _model(proof, TIMING_MODEL, "full", "fp32"), []
    for precision in _precisions():
        _train_steps(model, precision, TIMING_SEQ_LEN, steps=2, device=proof.device)  # warm-up: kernels chosen
        _sync()
        start = time.perf_counter()
        _train_steps(model, precision, TIMING_SEQ_LEN, steps=TIMED_STEPS, device=proof.device)
        _sync()
        rows.append({"precision": precision, "step_ms": round(1000 * (time.perf_counter() - start) / TIMED_STEPS, 1)})
        print(f"  {precision}: {rows[-1]['step_ms']} ms a step", flush=True)
    return {"model": TIMING_MODEL, "seq_len": TIMING_SEQ_LEN, "rows": rows}


SECTIONS = {
    "notebooks": _notebooks,
    "estimator": _estimator_grid,
    "headline": _headline,
    "oom": _oom_recovery,
    "precision": _precision_timing,
}


# ---------------------------------------------------------------------------------------------
# the report


def _write(out: Path, report: dict) -> None:
    (out / "gpu-proof.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu-proof.md").write_text(_markdown(report))


def _markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# GPU proof",
        "",
        f"Card: {m['card']} ({m['total_gib']} GiB, compute capability {m['capability']}), CUDA {m['cuda']}, "
        f"Python {m['python']}; {m['date']}. Written by `python -m helpers gpu-proof`.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
    ]
    for name, section in report["sections"].items():
        lines += ["", f"## {name} ({section['status']}, {section['seconds']} s)", ""]
        if section["status"] != "ok" and "error" in section:
            lines.append(f"Failed: `{section['error']}`")
        rows = section.get("rows")
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r if k != "error"))
            keys += ["error"] if any(r.get("error") for r in rows) else []
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
        rest = {k: v for k, v in section.items() if k not in ("rows", "status", "seconds", "error", "traceback")}
        lines += [f"- {k}: {v}" for k, v in rest.items()]
    return "\n".join(lines) + "\n"
