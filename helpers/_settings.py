"""The training settings the kit's checks read, from TrainingArguments or a plain dict.

Private to the package: `helpers.training` (the effective batch), `helpers.audit` (the mistakes)
and `helpers.oom` (fit_batch) read arguments through these, so all three agree on defaults, on
spelling mistakes and on how many devices the Trainer will use.
"""

from __future__ import annotations

import difflib
import os

from helpers._util import quiet_libraries
from helpers.simulate import simulated_card, simulated_devices

# keywords of TRL's SFTConfig that the audit accepts in a dict beside TrainingArguments' own
SFT_KEYWORDS = ("max_length", "max_seq_length", "packing", "dataset_text_field")
DEFAULT_SEED = 42  # what training_args() uses when no seed is given, and says so


def settings(args, *, check_keywords: bool = True) -> dict:
    """The keywords the checks read, from TrainingArguments or a dict (with TrainingArguments' defaults).

    check_keywords=False skips the spelling check of a dict's keywords, which imports
    transformers (and with it bitsandbytes, after which accelerate's notebook_launcher refuses to
    start): the effective-batch helpers read two keys and must stay usable before a launch.
    """
    if isinstance(args, dict) and check_keywords:
        check_spelling(args)
    if isinstance(args, dict):
        get = args.get
    else:

        def get(name, default=None):
            return getattr(args, name, default)

    checkpointing = get("activation_checkpointing")
    if checkpointing is None:
        checkpointing = get("gradient_checkpointing")
    report_to = get("report_to", "none")
    if report_to in (None, "none", ["none"]):
        report_to = []
    elif isinstance(report_to, str):
        report_to = [report_to]
    s = {
        "per_device_train_batch_size": int(get("per_device_train_batch_size", 8)),
        "gradient_accumulation_steps": int(get("gradient_accumulation_steps", 1)),
        "bf16": bool(get("bf16", False)),
        "fp16": bool(get("fp16", False)),
        "use_cpu": bool(get("use_cpu", False)),
        "activation_checkpointing": bool(checkpointing),
        "report_to": list(report_to),
        "max_length": get("max_length"),
        "max_seq_length": get("max_seq_length"),
    }
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if s[name] < 1:
            raise ValueError(f"{name} must be >= 1, got {s[name]}")
    return s


def check_spelling(kwargs: dict) -> None:
    import inspect

    known = set(inspect.signature(training_arguments_class()).parameters) | set(SFT_KEYWORDS)
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, known, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"not TrainingArguments keywords: {', '.join(hints)}")


def training_arguments_class():
    """transformers' TrainingArguments, imported without bitsandbytes' note about an absent kernel.

    Importing it imports bitsandbytes, which on CPUs with AVX512-BF16 logs that an optional kernel
    from the Hub is missing; its built-in CPU path runs instead (as in helpers.env.check_4bit).
    """
    quiet_libraries()
    from transformers import TrainingArguments

    return TrainingArguments


def devices(args, num_devices: int | None) -> int:
    """The devices the Trainer trains on in data parallel: processes x GPUs per process."""
    if num_devices is not None:
        if not isinstance(num_devices, int) or isinstance(num_devices, bool) or num_devices < 1:
            raise ValueError(f"num_devices must be an int >= 1, got {num_devices!r}")
        return num_devices
    if isinstance(args, dict):  # what a Trainer in this process would use: every visible GPU
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return world * max(1, _gpus_per_process() if world == 1 else 1)
    # the Trainer's own count: per_device x max(1, n_gpu) is the batch of one process
    # (DataParallel splits it over n_gpu cards), and world_size processes each take one
    n_gpu = _gpus_per_process() if simulated_card() else args.n_gpu  # a CPU's n_gpu is 0
    return max(1, n_gpu) * args.world_size


def _gpus_per_process() -> int:
    """torch.cuda.device_count(), or the simulated card's visible devices under a simulation."""
    if simulated_card():
        return len(simulated_devices())
    import torch

    return torch.cuda.device_count()


def effective_batch(args, num_devices: int | None = None) -> int:
    """per-device batch x gradient accumulation steps x devices (`helpers.training.effective_batch_size`)."""
    s = settings(args, check_keywords=False)
    return s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] * devices(args, num_devices)
