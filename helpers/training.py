"""Training set-up: TrainingArguments for this card, and the effective batch.

Which notebook teaches what:

- `precision_kwargs` and `training_args`: notebook 02 (mixed precision), shown in 00.
- `effective_batch_size`, `log_effective_batch`, `EffectiveBatchCallback`: notebook 04 (gradient
  accumulation); 07 adds the devices.

The mistakes a configuration can hold are `helpers.audit` (training_args warns about precision
ones); fitting the batch after an out-of-memory error is `helpers.oom`. Importing this module is
cheap: torch and transformers load when a function needs them.
"""

from __future__ import annotations

from helpers._callbacks import lazy_callbacks
from helpers._settings import DEFAULT_SEED, effective_batch, settings, training_arguments_class
from helpers._settings import devices as count_devices
from helpers.audit import warn_precision
from helpers.env import Gpu, Precision, choose_precision, detect_gpus

__all__ = [
    "DEFAULT_SEED",
    "EffectiveBatchCallback",  # noqa: F822 (built on first use by __getattr__ below)
    "effective_batch_size",
    "log_effective_batch",
    "precision_kwargs",
    "training_args",
]


def precision_kwargs(gpus: tuple[Gpu, ...] | list[Gpu] | None = None) -> dict[str, bool]:
    """The `bf16` / `fp16` keywords of TrainingArguments for this machine.

    bf16 only at compute capability >= 8.0; fp16 on older cards (a T4 is 7.5, and
    `torch.cuda.is_bf16_supported()` says True there only because it emulates bf16); neither
    on CPU, where `fp16=True` would be silently ignored.

    Args:
        gpus: the cards to decide for; default: the ones on this machine.

    Example:
        >>> from transformers import TrainingArguments
        >>> args = TrainingArguments("out", **precision_kwargs())  # doctest: +SKIP
    """
    precision: Precision = choose_precision(detect_gpus() if gpus is None else gpus)
    return {"bf16": precision.name == "bf16", "fp16": precision.name == "fp16"}


# ---------------------------------------------------------------------------------------------
# TrainingArguments with the kit's defaults


def training_args(output_dir: str = "out", *, quiet: bool = False, **overrides):
    """Build TrainingArguments with the precision for this card, an explicit seed and logging on.

    What it sets unless you pass it:

    - `bf16` / `fp16` from `precision_kwargs()` (bf16 from compute capability 8.0, fp16 on a T4,
      neither on CPU); `bf16=True` on a CPU machine also gets `use_cpu=True`, which the Trainer
      requires there;
    - `seed=42` (DEFAULT_SEED), printed, so the seed is in the config you report;
    - `logging_steps=10` and `logging_first_step=True`;
    - `report_to="none"`: nothing is sent anywhere unless you ask (`report_to="wandb"`, notebook 06).

    Both names of gradient checkpointing work: transformers 5 renamed `gradient_checkpointing` to
    `activation_checkpointing` (and `gradient_checkpointing_kwargs` to
    `activation_checkpointing_kwargs`); the old name is mapped to the new one, with a note. When
    it is on, `activation_checkpointing_kwargs` defaults to `{"use_reentrant": False}`, PyTorch's
    recommended mode, written out so it is in the saved config.

    With `save_total_limit`, the folder is checked first (`helpers.run_folder.check_run_folder`): writable,
    and holding no folder of yours the Trainer's rotation would delete.

    It prints one summary line (precision, seed, effective batch, checkpointing, tracking) unless
    `quiet=True`, and warns about precision mistakes for this machine (see `helpers.audit.audit`).

    Args:
        output_dir: where the Trainer writes checkpoints.
        quiet: do not print the summary line.
        overrides: any TrainingArguments keyword.

    Returns:
        a transformers TrainingArguments.

    Example:
        >>> args = training_args("out", per_device_train_batch_size=1, gradient_accumulation_steps=16,
        ...                      gradient_checkpointing=True)  # doctest: +SKIP
        training_args: fp16 (Tesla T4 ...), seed 42 (the kit's default), effective batch 1 x 16 x 1 = 16, ...
    """
    if overrides.get("save_total_limit") and overrides.get("save_strategy", "steps") != "no":
        from helpers.run_folder import check_run_folder

        check_run_folder(output_dir)  # writable, and nothing of the user's that the rotation would delete
    kwargs, notes = _checkpointing_names(overrides)
    gpus = detect_gpus()
    precision_note = _set_precision(kwargs, gpus, notes)
    seed_note = _set_defaults(kwargs)
    args = training_arguments_class()(output_dir=output_dir, **kwargs)
    if not quiet:
        n = effective_batch_size(args)
        checkpointing = "on" if args.activation_checkpointing else "off"
        tracking = ", ".join(args.report_to) or "none"
        print(
            f"training_args: {precision_note}, {seed_note}, effective batch {_formula(args)} = {n}, "
            f"activation checkpointing {checkpointing}, report_to {tracking}"
        )
        for note in notes:
            print(f"  note: {note}")
    warn_precision(args, gpus)
    return args


def _checkpointing_names(overrides: dict) -> tuple[dict, list[str]]:
    """Map transformers 4's gradient_checkpointing keywords to transformers 5's; default non-reentrant."""
    kwargs = dict(overrides)
    notes = []
    for old, new in (
        ("gradient_checkpointing", "activation_checkpointing"),
        ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
    ):
        if old in kwargs:
            value = kwargs.pop(old)
            if new in kwargs and kwargs[new] != value:
                raise ValueError(
                    f"{old}={value!r} and {new}={kwargs[new]!r} disagree; they are the same setting "
                    f"(transformers 5 renamed {old} to {new}): pass only {new}"
                )
            kwargs[new] = value
            notes.append(f"{old}= is the transformers 4 name; passed on as {new}=")
    if kwargs.get("activation_checkpointing"):
        kwargs.setdefault("activation_checkpointing_kwargs", {"use_reentrant": False})
    return kwargs, notes


def _set_precision(kwargs: dict, gpus, notes: list[str]) -> str:
    """Set bf16 / fp16 for these cards unless passed (use_cpu for bf16 without a GPU); say which."""
    import torch

    if "bf16" not in kwargs and "fp16" not in kwargs:
        kwargs.update(precision_kwargs(gpus))
        precision = choose_precision(gpus)
        precision_note = f"{precision.name} ({precision.reason})"
    else:
        precision_note = "bf16" if kwargs.get("bf16") else "fp16" if kwargs.get("fp16") else "fp32"
        precision_note += " (as passed)"
    if kwargs.get("bf16") and not torch.cuda.is_available() and "use_cpu" not in kwargs:
        kwargs["use_cpu"] = True  # the Trainer refuses bf16 on a CPU machine without it
        notes.append("bf16=True without a GPU: added use_cpu=True, which the Trainer requires for bf16 autocast on CPU")
    return precision_note


def _set_defaults(kwargs: dict) -> str:
    """Set the seed, logging and tracking defaults unless passed; say which seed."""
    if "seed" not in kwargs:
        kwargs["seed"] = DEFAULT_SEED
        seed_note = f"seed {DEFAULT_SEED} (the kit's default; pass seed=... to choose)"
    else:
        seed_note = f"seed {kwargs['seed']}"
    kwargs.setdefault("logging_steps", 10)
    kwargs.setdefault("logging_first_step", True)
    kwargs.setdefault("report_to", "none")
    if kwargs["report_to"] is None:
        raise ValueError('report_to=None does not turn tracking off in transformers 5; pass report_to="none"')
    return seed_note


# ---------------------------------------------------------------------------------------------
# the effective batch


def effective_batch_size(args, num_devices: int | None = None) -> int:
    """The effective batch: per-device batch x gradient accumulation steps x devices.

    This is the batch the optimizer steps on, and the number to report; the per-device batch
    alone hides the accumulation and the devices.

    Args:
        args: TrainingArguments, or a dict of its keywords (`per_device_train_batch_size`,
            `gradient_accumulation_steps`; TrainingArguments' defaults 8 and 1 when absent).
        num_devices: how many devices train in data parallel. Default: what the Trainer would use
            for these arguments (for TrainingArguments: processes x GPUs per process, which asks
            torch where it runs; on Kaggle T4 x2 before `notebook_launcher`, pass it yourself).

    Example:
        >>> effective_batch_size({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16},
        ...                      num_devices=1)
        16
    """
    return effective_batch(args, num_devices)


def log_effective_batch(args, num_devices: int | None = None, *, record: bool = True) -> int:
    """Print the effective batch as its product and save it with `helpers.record`.

    The line reads `effective batch = per_device_batch 2 x grad_accum_steps 8 x num_devices 1 = 16`.
    `EffectiveBatchCallback` calls this when a Trainer starts; call it yourself at the start
    of a hand-written loop. Taught in notebook 04.

    Args:
        args, num_devices: as for `effective_batch_size`.
        record: also save `effective_batch` and its parts in the notebook's results.

    Returns:
        the effective batch.
    """
    s = settings(args, check_keywords=False)
    devices = count_devices(args, num_devices)
    n = s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] * devices
    print(
        f"effective batch = per_device_batch {s['per_device_train_batch_size']} x grad_accum_steps "
        f"{s['gradient_accumulation_steps']} x num_devices {devices} = {n}"
    )
    if record:
        from helpers.results import record as save

        save("effective_batch", n)
        save(
            "effective_batch_parts",
            {
                "per_device_batch": s["per_device_train_batch_size"],
                "grad_accum_steps": s["gradient_accumulation_steps"],
                "num_devices": devices,
            },
        )
    return n


def _formula(args, num_devices: int | None = None) -> str:
    s = settings(args)
    return (
        f"{s['per_device_train_batch_size']} x {s['gradient_accumulation_steps']} x {count_devices(args, num_devices)}"
    )


_CALLBACK_DOC = """Print and record the effective batch when a Trainer starts training.

    On every (re)start of `trainer.train()` it prints
    `effective batch = per_device_batch 2 x grad_accum_steps 8 x num_devices 1 = 16` and saves
    `effective_batch` with `helpers.record`, so the number that reaches a report is the one the
    optimizer stepped on. Only the main process prints. Taught in notebook 04.

    Args:
        num_devices: override the device count (default: what the Trainer uses).
        record: also save it in the notebook's results (default True).

    Example:
        >>> trainer = Trainer(model, args, train_dataset=data,
        ...                   callbacks=[EffectiveBatchCallback()])  # doctest: +SKIP
    """


class _EffectiveBatch:
    __doc__ = _CALLBACK_DOC

    def __init__(self, num_devices: int | None = None, *, record: bool = True):
        self.num_devices, self.record = num_devices, record
        self.effective_batch: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.effective_batch = log_effective_batch(args, self.num_devices, record=self.record)


# EffectiveBatchCallback subclasses TrainerCallback: built, importing transformers, on first use
__getattr__, __dir__ = lazy_callbacks(globals(), EffectiveBatchCallback=_EffectiveBatch)
