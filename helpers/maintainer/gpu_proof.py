"""`python -m helpers gpu-proof --out DIR`: the kit proven on one real CUDA card, in one command.

For a machine with one CUDA GPU and no internet; about 5-8 minutes on an A100/H100 class card.
It writes `DIR/gpu-proof.md` (the tables a reviewer reads) and `DIR/gpu-proof.json` (the same
figures), section by section as each finishes, so a run cut short still leaves what it measured:

1. every notebook executed on the GPU with the embedded model (pass/fail, seconds, peak device
   memory sampled through NVML while it ran);
2. the estimator against `torch.cuda.max_memory_allocated` on models built from catalog configs
   with random weights (nothing downloaded): a ~0.5B model full and LoRA, a ~1.5B LoRA, a 7B
   QLoRA, checkpointing off and on, 512 and 1024 tokens, with the signed error of each line;
3. the headline: a 7B QLoRA training step in a process capped to a T4's usable memory
   (`torch.cuda.set_per_process_memory_fraction`), loading included;
4. a real `torch.OutOfMemoryError` caught, and `helpers.oom.fit_batch` recovering with the
   effective batch kept;
5. step time of the same model in fp32, fp16 autocast and bf16 autocast (what the card supports).

Without CUDA it prints one sentence and exits 0: nothing here can be simulated honestly.

Longer than 400 lines because it is one command that must run whole the first time a card is
lent: its five sections share the model builders, and the report is written as each finishes.
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from helpers._util import GIB, MIB

__all__ = ["ESTIMATOR_CASES", "main", "run_proof"]

SEQ_LENS = (512, 1024)
# (catalog model, method): the sizes a student meets, from a full fine-tune to a 7B QLoRA
ESTIMATOR_CASES = (
    ("Qwen2.5-0.5B", "full"),
    ("Qwen2.5-0.5B", "lora"),
    ("Qwen2.5-1.5B", "lora"),
    ("Mistral-7B", "qlora"),
)
HEADLINE_MODEL = "Mistral-7B"
HEADLINE_CARD = "T4"
LORA_R = 16
NEEDS_GPU = "gpu-proof needs one CUDA GPU (torch.cuda.is_available() is False here); nothing was run."


def main(out: Path, *, only: tuple[str, ...] = ()) -> int:
    """Run every section (or those named in `only`) and write DIR/gpu-proof.{md,json}; 0 unless a section failed."""
    import torch

    if not torch.cuda.is_available():
        print(NEEDS_GPU)
        return 0
    report = run_proof(Path(out), only=only)
    failed = [name for name, section in report["sections"].items() if section.get("status") != "ok"]
    print(f"wrote {Path(out) / 'gpu-proof.md'}" + (f"; failed sections: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def run_proof(out: Path, *, only: tuple[str, ...] = ()) -> dict:
    """The sections in order, each isolated: one that raises is recorded as failed and the rest go on."""
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": _machine(), "sections": {}}
    sections = {
        "notebooks": lambda: _notebooks(out),
        "estimator": _estimator_grid,
        "headline": _headline,
        "oom": _oom_recovery,
        "precision": _precision_timing,
    }
    for name, section in sections.items():
        if only and name not in only:
            continue
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            result = {"status": "ok", **section()}
        except Exception as e:  # the report says which section failed and why; the others still run
            result = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        result["seconds"] = round(time.perf_counter() - start, 1)
        report["sections"][name] = result
        _release_cuda()
        _write(out, report)  # after every section: a run cut short keeps what it measured
    return report


# ---------------------------------------------------------------------------------------------
# the machine


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


def _release_cuda() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)
    torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------------------------
# 1. the notebooks on the card


class _NvmlPeak:
    """Sample the card's used memory through NVML in a thread: the peak of a notebook's kernel process."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _sample(self):
        from helpers.env import _nvml_devices

        with _nvml_devices() as devices:
            while devices and not self._stop.is_set():
                self.peak = max(self.peak, devices[0].memory().used)
                self._stop.wait(self.interval_s)


def _notebooks(out: Path) -> dict:
    from helpers.maintainer import runner

    rows = []
    for path in runner.select(None):
        with _NvmlPeak() as peak:
            outcome = runner.execute(path, out / "notebook-run", smoke=True)
        rows.append(
            {
                "notebook": outcome.notebook,
                "status": outcome.status,
                "seconds": round(outcome.seconds, 1),
                "peak_used_mib": round(peak.peak / MIB),  # the whole card, as nvidia-smi counts it
                "error": outcome.error.splitlines()[-1] if outcome.error else "",
            }
        )
        print(f"  {rows[-1]['status']:6} {outcome.notebook} {rows[-1]['seconds']} s", flush=True)
    failed = [r["notebook"] for r in rows if r["status"] != "ok"]
    return {"rows": rows, **({"status": "failed", "error": f"failed: {', '.join(failed)}"} if failed else {})}


# ---------------------------------------------------------------------------------------------
# 2. the estimator against the allocator


@dataclass
class _Case:
    model: str
    method: str
    checkpointing: bool
    seq_len: int


def _estimator_grid() -> dict:
    rows = []
    for model_name, method in ESTIMATOR_CASES:
        with _built(model_name, method) as (model, precision):
            for checkpointing in (False, True):
                for seq_len in SEQ_LENS:
                    case = _Case(model_name, method, checkpointing, seq_len)
                    rows.append(_measure_case(model, precision, case))
                    print(f"  {_row_text(rows[-1])}", flush=True)
    errors = sorted(abs(r["error_pct"]) for r in rows if r.get("error_pct") is not None)
    return {"rows": rows, "median_abs_error_pct": errors[len(errors) // 2] if errors else None}


def _row_text(r: dict) -> str:
    if "error" in r:
        return f"{r['model']} {r['method']} ckpt={r['checkpointing']} {r['seq_len']}: {r['error']}"
    return (
        f"{r['model']} {r['method']} ckpt={r['checkpointing']} {r['seq_len']}: measured {r['measured_gib']:.2f} GiB, "
        f"estimated {r['estimated_gib']:.2f} GiB ({r['error_pct']:+.1f} %)"
    )


def _config(model_name: str):
    """A transformers config for a catalog model, from the catalog's shape (no download)."""
    from transformers import AutoConfig

    from helpers.catalog import find

    shape = find("models", model_name)[1]["shape"]
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


def _precision() -> str:
    from helpers.env import choose_precision, detect_gpus

    return choose_precision(detect_gpus()).name


class _built:
    """Build a catalog model with random weights on the card for one method; free it afterwards."""

    def __init__(self, model_name: str, method: str):
        self.model_name, self.method, self.folder = model_name, method, None

    def __enter__(self):
        import torch

        config, precision = _config(self.model_name), _precision()
        if self.method == "qlora":
            self.folder = Path(tempfile.mkdtemp(prefix="gpu-proof-"))
            self.model = _qlora_from_random(config, self.folder, precision)
        else:
            from transformers import AutoModelForCausalLM

            with torch.device("cuda"):
                self.model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            if self.method == "lora":
                self.model = _with_lora(self.model)
        self.model.config.use_cache = False
        return self.model, precision

    def __exit__(self, *exc):
        del self.model
        _release_cuda()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _with_lora(model):
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    return get_peft_model(model, LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules="all-linear"))


def _qlora_from_random(config, folder: Path, precision: str):
    """Save a random 16-bit model to disk, then load it the way `helpers.qlora.load_qlora` does."""
    import torch
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from helpers._util import torch_dtype

    compute = torch_dtype(precision)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=compute)
    model.save_pretrained(folder)
    del model
    _release_cuda()
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=quant, dtype=compute, device_map={"": 0})
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    return _with_lora(model)


def _set_checkpointing(model, on: bool) -> None:
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    else:
        model.gradient_checkpointing_disable()


def _train_steps(model, precision: str, seq_len: int, steps: int = 2, per_device_batch: int = 1) -> None:
    """`steps` optimizer steps of AdamW under the card's autocast, on random tokens."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    vocab = model.config.vocab_size
    for _ in range(steps):
        ids = torch.randint(0, vocab, (per_device_batch, seq_len), device="cuda")
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    del optimizer


def _measure_case(model, precision: str, case: _Case) -> dict:
    import torch

    from helpers.estimate import estimate_training_memory

    row = {"model": case.model, "method": case.method, "checkpointing": case.checkpointing, "seq_len": case.seq_len}
    _set_checkpointing(model, case.checkpointing)
    model.train()
    _release_cuda()
    try:
        _train_steps(model, precision, case.seq_len)
    except torch.OutOfMemoryError as e:
        return {**row, "error": f"out of memory: {str(e).splitlines()[0]}"}
    measured = torch.cuda.max_memory_allocated()
    est = estimate_training_memory(
        case.model,
        per_device_batch=1,
        seq_len=case.seq_len,
        precision=precision,
        method=case.method,
        lora_r=LORA_R,
        checkpointing=case.checkpointing,
        attn_impl=getattr(model.config, "_attn_implementation", None) or "sdpa",
    )
    predicted = est.allocated
    return {
        **row,
        "measured_gib": round(measured / GIB, 3),
        "estimated_gib": round(predicted / GIB, 3),
        "error_pct": round(100 * (predicted - measured) / measured, 1),
    }


# ---------------------------------------------------------------------------------------------
# 3. the headline: a 7B QLoRA step inside a T4's memory


def _headline() -> dict:
    import torch

    from helpers.catalog import gpu_bytes

    limit = gpu_bytes(HEADLINE_CARD)
    total = torch.cuda.get_device_properties(0).total_memory
    if total < limit:
        return {"status": "failed", "error": f"this card ({total / GIB:.1f} GiB) is smaller than a {HEADLINE_CARD}"}
    torch.cuda.set_per_process_memory_fraction(limit / total)  # the allocator refuses past this
    start = time.perf_counter()
    with _built(HEADLINE_MODEL, "qlora") as (model, precision):
        loaded = torch.cuda.max_memory_allocated()
        _set_checkpointing(model, True)
        torch.cuda.reset_peak_memory_stats()
        _train_steps(model, precision, seq_len=1024)
        step_peak = torch.cuda.max_memory_allocated()
    return {
        "model": HEADLINE_MODEL,
        "cap_gib": round(limit / GIB, 2),
        "load_peak_gib": round(loaded / GIB, 2),
        "step_peak_gib": round(step_peak / GIB, 2),
        "seq_len": 1024,
        "precision": precision,
        "passed": True,
        "wall_s": round(time.perf_counter() - start, 1),
    }


# ---------------------------------------------------------------------------------------------
# 4. a real out-of-memory error, and fit_batch


def _oom_recovery() -> dict:
    import torch

    from helpers.oom import fit_batch

    cap = 4 * GIB  # a small card, so the first batch overflows quickly
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total)
    with _built("Qwen2.5-0.5B", "lora") as (model, precision):
        _set_checkpointing(model, False)
        caught = []

        def train(args):
            try:
                for _ in range(args["gradient_accumulation_steps"]):
                    _train_steps(model, precision, 1024, steps=1, per_device_batch=args["per_device_train_batch_size"])
            except torch.OutOfMemoryError as e:
                caught.append(type(e).__name__)
                raise
            return args

        fitted = fit_batch(train, {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 1})
    return {
        "cap_gib": round(cap / GIB, 2),
        "tried": [list(t) for t in fitted.tried],
        "errors_caught": caught,
        "effective_batch_kept": all(b * k == 32 for b, k in fitted.tried),
    }


# ---------------------------------------------------------------------------------------------
# 5. step time by precision


def _precision_timing() -> dict:
    import torch

    rows = []
    with _built("Qwen2.5-0.5B", "full") as (model, _):
        supported = ["fp32", "fp16"] + (["bf16"] if torch.cuda.get_device_capability() >= (8, 0) else [])
        for precision in supported:
            _train_steps(model, precision, 512, steps=2)  # warm-up: kernels chosen, states allocated
            torch.cuda.synchronize()
            start = time.perf_counter()
            _train_steps(model, precision, 512, steps=5)
            torch.cuda.synchronize()
            rows.append({"precision": precision, "step_ms": round(1000 * (time.perf_counter() - start) / 5, 1)})
    return {"model": "Qwen2.5-0.5B", "seq_len": 512, "rows": rows}


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
            keys = [k for k in rows[0] if k != "error"] + (["error"] if any("error" in r for r in rows) else [])
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
        rest = {k: v for k, v in section.items() if k not in ("rows", "status", "seconds", "error", "traceback")}
        lines += [f"- {k}: {v}" for k, v in rest.items()]
    return "\n".join(lines) + "\n"
