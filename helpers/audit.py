"""The audit: the training-setup mistakes experienced researchers catch, each with its fix.

Taught in notebooks 02 to 04, each with the mistakes of its technique: bf16 on a card that
emulates it, fp16 ignored on CPU, no seed, nothing tracked, activation checkpointing off while
the estimate exceeds the card, the per-device batch reported as the batch size.
`helpers.training.training_args` runs the precision checks on the arguments it builds.

Importing this module is cheap: torch and transformers load when a check needs them.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

from helpers._settings import DEFAULT_SEED, devices, effective_batch, settings
from helpers._util import GIB
from helpers.catalog import find, gpu_bytes
from helpers.env import Gpu, detect_gpus, half_precision

__all__ = ["AuditWarning", "Finding", "audit", "warn_precision"]


class AuditWarning(UserWarning):
    """A mistake `audit` found. Make them errors in a script with `warnings.simplefilter("error", AuditWarning)`."""


@dataclass(frozen=True)
class Finding:
    """One mistake: a short code, and a message that names the fix in the caller's own values."""

    code: str  # "bf16_emulated", "fp16_ignored_on_cpu", "seed_not_set", "untracked", "checkpointing_off", ...
    message: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


@dataclass(frozen=True)
class _Card:
    name: str
    capability: tuple[int, int]
    total_bytes: int
    plan_arg: str  # how helpers.plan.plan takes this card: a catalog name in quotes, or GiB


def audit(
    args,
    model=None,
    gpu=None,
    *,
    seq_len: int | None = None,
    reported_batch: int | None = None,
    num_devices: int | None = None,
) -> list[Finding]:
    """Check training settings for the mistakes experienced researchers catch; warn about each.

    The checks, each a `Finding` whose message says what to change, in your values:

    - `bf16_emulated`: bf16=True on a card below compute capability 8.0 (a T4), where bf16 is
      emulated; use fp16 there.
    - `fp16_ignored_on_cpu`: fp16=True without a GPU, which the Trainer silently ignores (it
      trains in fp32 and says nothing).
    - `seed_not_set`: no `seed` among the keywords (needs a dict: a TrainingArguments object
      always holds one, 42 unless set, so it cannot say whether anyone chose it).
    - `untracked`: `report_to` is "none": the loss curve and the config leave no record.
    - `checkpointing_off`: activation checkpointing off while the estimator
      (`helpers.estimate`) says this micro-batch does not fit the card (needs `model` and
      `seq_len`, and a card: `gpu`, or this machine's).
    - `batch_misreported`: `reported_batch` (the batch size you put in your report) is not the
      effective batch.

    Each finding is also issued as an `AuditWarning`, every time (a repeated call in a notebook
    shows it again); filters still apply, so `simplefilter("error", AuditWarning)` makes a
    script stop at the first one. Taught in notebooks 02 to 04.

    Args:
        args: TrainingArguments, or a dict of its keywords: a dict can describe a run for a card
            this machine does not have (`bf16=True` for a T4, checked from a laptop).
        model: for the checkpointing check: a catalog name ("SmolLM2-135M"), a transformers
            config or dict, or a model (its `.config`; a peft model counts as LoRA).
        gpu: the card to check for: a catalog name ("T4", "A100-40GB"), a `helpers.env.Gpu`, or
            None for this machine's (none on a CPU-only machine: the card checks are skipped).
        seq_len: tokens per sequence, for the checkpointing check (default: `max_length` in the
            dict, as TRL's SFTConfig names it).
        reported_batch: the batch size your report states, to compare with the effective batch.
        num_devices: devices in data parallel (default: as `effective_batch_size`).

    Returns:
        the findings, in the order above; an empty list when nothing is wrong.

    Example:
        >>> audit({"bf16": True, "seed": 1, "report_to": "wandb"}, gpu="T4")  # doctest: +SKIP
        [Finding(code='bf16_emulated', message='bf16=True on NVIDIA Tesla T4 (compute capability 7.5): ...')]
    """
    s = settings(args)
    card = _card(gpu)
    findings = _precision_findings(s, card) + _habit_findings(args, s)
    if model is not None and card is not None:
        findings += _checkpointing_findings(s, model, card, seq_len or s.get("max_length") or s.get("max_seq_length"))
    if reported_batch is not None:
        findings += _batch_findings(args, s, reported_batch, num_devices)
    for finding in findings:
        _warn(finding)
    return findings


def _habit_findings(args, s: dict) -> list[Finding]:
    """seed_not_set and untracked: what leaves a run impossible to repeat or to look back at."""
    found = []
    if isinstance(args, dict) and "seed" not in args:
        found.append(
            Finding(
                "seed_not_set",
                f"no seed set: the Trainer falls back to {DEFAULT_SEED} and the data order and initialization "
                f"depend on it; write seed={DEFAULT_SEED} (or your own number) into the arguments and report it beside "
                "the result",
            )
        )
    if not s["report_to"]:
        found.append(
            Finding(
                "untracked",
                "report_to='none': nothing outside this process records the loss curve or this config; pass "
                "report_to='wandb' (it runs offline without an account, notebook 06) or 'tensorboard', and keep "
                "args.to_json_string() with every checkpoint",
            )
        )
    return found


def _batch_findings(args, s: dict, reported_batch: int, num_devices: int | None) -> list[Finding]:
    """batch_misreported: the batch size in the report is not the effective batch."""
    n = effective_batch(args, num_devices)
    if reported_batch == n:
        return []
    return [
        Finding(
            "batch_misreported",
            f"the report says batch size {reported_batch}, but the optimizer steps on per_device_batch "
            f"{s['per_device_train_batch_size']} x grad_accum_steps {s['gradient_accumulation_steps']} x "
            f"num_devices {devices(args, num_devices)} = {n} sequences: report the effective batch {n}, "
            f"and the three factors beside it",
        )
    ]


def warn_precision(args, gpus) -> None:
    """Warn about the precision mistakes of `args` on `gpus` (what training_args runs on its result)."""
    for finding in _precision_findings(settings(args), _weakest_card(gpus)):
        _warn(finding)


def _weakest_card(gpus) -> _Card | None:
    if not gpus:
        return None
    weakest = min(gpus, key=lambda g: (g.capability, g.total_bytes))
    return _card(weakest)


def _card(gpu) -> _Card | None:
    if gpu is None:
        return _weakest_card(detect_gpus())
    if isinstance(gpu, Gpu):
        return _Card(gpu.name, gpu.capability, gpu.total_bytes, f"{gpu.total_bytes / GIB:.1f}")
    if isinstance(gpu, str):
        name, entry = find("gpus", gpu, otherwise="Or pass a helpers.env.Gpu")
        return _Card(entry["name"], tuple(entry["capability"]), gpu_bytes(name), repr(name))
    raise TypeError(f"gpu must be a catalog name such as 'T4', a helpers.env.Gpu, or None; got {gpu!r}")


def _precision_findings(s: dict, card: _Card | None) -> list[Finding]:
    found = []
    on_cpu = card is None or s["use_cpu"]
    if s["bf16"] and card is not None and not s["use_cpu"] and half_precision(card.capability) == "fp16":
        cc = f"{card.capability[0]}.{card.capability[1]}"
        found.append(
            Finding(
                "bf16_emulated",
                f"bf16=True on {card.name} (compute capability {cc}): bf16 is emulated below 8.0, slowly, although "
                f"torch.cuda.is_bf16_supported() says True; use fp16=True, bf16=False there "
                f"(helpers.training.precision_kwargs() picks it from the card)",
            )
        )
    if s["fp16"] and on_cpu:
        where = "use_cpu=True" if s["use_cpu"] else "no GPU on this machine"
        found.append(
            Finding(
                "fp16_ignored_on_cpu",
                f"fp16=True with {where}: the Trainer ignores it without a word and trains in fp32; drop fp16=True "
                f"here (fp32 is what runs), or for bf16 autocast on CPU pass bf16=True, use_cpu=True",
            )
        )
    return found


def _checkpointing_findings(s: dict, model, card: _Card, seq_len: int | None) -> list[Finding]:
    """checkpointing_off: activation checkpointing off while the estimate for this batch exceeds the card."""
    # load_qlora turns checkpointing on inside the model itself: that counts as on
    if s["activation_checkpointing"] or getattr(model, "is_activation_checkpointing", False):
        return []
    if not seq_len:
        raise ValueError(
            "audit(model=...) estimates activations, which grow with the sequence length: "
            "pass seq_len=, e.g. audit(args, model, seq_len=1024)"
        )
    from helpers.estimate import estimate_training_memory

    method, weights, name = "full", None, model if isinstance(model, str) else None
    target = model
    if hasattr(model, "config") and not isinstance(model, dict):  # a model: read its config
        target = model.config
        name = getattr(model.config, "_name_or_path", None) or type(model).__name__
        if hasattr(model, "peft_config"):
            quantized = getattr(model.config, "quantization_config", None) is not None
            method = "qlora" if quantized else "lora"
    precision = "bf16" if s["bf16"] else "fp16" if s["fp16"] else "fp32"
    if method == "lora" and precision == "fp32":
        weights = "fp32"
    b = s["per_device_train_batch_size"]
    settings = dict(per_device_batch=b, seq_len=int(seq_len), precision=precision, method=method, weights=weights)
    without = estimate_training_memory(target, **settings)
    if without.total <= card.total_bytes:
        return []
    with_ckpt = estimate_training_memory(target, checkpointing=True, **settings)
    name = name or "this model"
    head = (
        f"{name} at per_device_batch {b}, seq_len {seq_len}, {precision}: the estimate is "
        f"{without.total / GIB:.1f} GiB without activation checkpointing, more than the "
        f"{card.total_bytes / GIB:.1f} GiB of {card.name} (an out-of-memory error to come, not a model problem)"
    )
    if with_ckpt.total <= card.total_bytes:
        fix = (
            f"; with it, {with_ckpt.total / GIB:.1f} GiB fits: pass activation_checkpointing=True "
            f"(gradient_checkpointing=True before transformers 5)"
        )
    else:
        plan = f"helpers.plan.plan({name!r}, {card.plan_arg}, per_device_batch={b}, seq_len={seq_len})"
        fix = (
            f"; even with activation_checkpointing=True it needs {with_ckpt.total / GIB:.1f} GiB: turn it on and "
            f"see {plan} for the next steps"
        )
    return [Finding("checkpointing_off", head + fix)]


def _warn(finding: Finding) -> None:
    """Issue an AuditWarning from the user's own frame, shown every time.

    warnings.warn remembers what it showed per calling line and stays silent on a repeat, which
    hides the finding when a notebook cell runs a second time. warn_explicit with a fresh
    registry shows it each time, while the user's filters ("ignore", "error") still apply.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and _in_helpers(frame):  # leave the kit (audit, training_args)
        frame = frame.f_back
    # no module_globals: it only helps linecache find the source of a zipped module, and Python
    # 3.12+ raises ValueError on globals whose __spec__ and __loader__ are None, which is what
    # every IPython cell has (Colab runs 3.13, Kaggle 3.12); IPython puts cell sources in linecache
    warnings.warn_explicit(
        str(finding),
        AuditWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "__main__"),
        registry={},
    )


def _in_helpers(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == "helpers" or name.startswith("helpers.")
