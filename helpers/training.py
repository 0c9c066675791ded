"""Training set-up: TrainingArguments for this card, the effective batch, a mistake audit, auto-fit.

Which notebook teaches what:

- `precision_kwargs` and `training_args`: notebook 02 (mixed precision), shown in 00.
- `effective_batch_size`, `log_effective_batch`, `EffectiveBatchCallback`: notebook 04 (gradient
  accumulation); 07 adds the devices.
- `audit`: notebooks 02 to 04, each with the mistakes of its technique.
- `fit_batch` and `activation_budget`: notebooks 03 and 04 (the OOM, and the fix that keeps the
  effective batch).

Importing this module is cheap: torch and transformers load when a function needs them.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

from helpers._callbacks import lazy_callbacks
from helpers.env import GIB, Gpu, Precision, choose_precision, detect_gpus

DEFAULT_SEED = 42  # what training_args() uses when no seed is given, and says so
# keywords of TRL's SFTConfig that audit() accepts in a dict beside TrainingArguments' own
SFT_KEYWORDS = ("max_length", "max_seq_length", "packing", "dataset_text_field")

__all__ = [
    "AuditWarning",
    "BatchFitError",
    "DEFAULT_SEED",
    "EffectiveBatchCallback",
    "Finding",
    "Fitted",
    "activation_budget",
    "audit",
    "effective_batch_size",
    "fit_batch",
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

    It prints one summary line (precision, seed, effective batch, checkpointing, tracking) unless
    `quiet=True`, and warns about precision mistakes for this machine (see `audit`).

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
    import torch

    TrainingArguments = _training_arguments_class()
    kwargs = dict(overrides)
    notes = []
    for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                     ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
        if old in kwargs:
            value = kwargs.pop(old)
            if new in kwargs and kwargs[new] != value:
                raise ValueError(f"{old}={value!r} and {new}={kwargs[new]!r} disagree; they are the same setting "
                                 f"(transformers 5 renamed {old} to {new}): pass only {new}")
            kwargs[new] = value
            notes.append(f"{old}= is the transformers 4 name; passed on as {new}=")
    if kwargs.get("activation_checkpointing"):
        kwargs.setdefault("activation_checkpointing_kwargs", {"use_reentrant": False})

    if "bf16" not in kwargs and "fp16" not in kwargs:
        kwargs.update(precision_kwargs())
        precision = choose_precision(detect_gpus())
        precision_note = f"{precision.name} ({precision.reason})"
    else:
        precision_note = "bf16" if kwargs.get("bf16") else "fp16" if kwargs.get("fp16") else "fp32"
        precision_note += " (as passed)"
    if kwargs.get("bf16") and not torch.cuda.is_available() and "use_cpu" not in kwargs:
        kwargs["use_cpu"] = True  # the Trainer refuses bf16 on a CPU machine without it
        notes.append("bf16=True without a GPU: added use_cpu=True, which the Trainer requires for bf16 autocast on CPU")

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

    args = TrainingArguments(output_dir=output_dir, **kwargs)
    if not quiet:
        n = effective_batch_size(args)
        checkpointing = "on" if args.activation_checkpointing else "off"
        tracking = ", ".join(args.report_to) or "none"
        print(f"training_args: {precision_note}, {seed_note}, effective batch {_formula(args)} = {n}, "
              f"activation checkpointing {checkpointing}, report_to {tracking}")
        for note in notes:
            print(f"  note: {note}")
    for finding in _precision_findings(_settings(args), _this_card()):
        _warn(finding)
    return args


def _training_arguments_class():
    """transformers' TrainingArguments, imported without bitsandbytes' note about an absent kernel.

    Importing it imports bitsandbytes, which on CPUs with AVX512-BF16 logs that an optional kernel
    from the Hub is missing; its built-in CPU path runs instead (as in helpers.env.check_4bit).
    """
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    from transformers import TrainingArguments

    return TrainingArguments


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
    s = _settings(args, check_keywords=False)
    return s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] * _devices(args, num_devices)


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
    s = _settings(args, check_keywords=False)
    devices = _devices(args, num_devices)
    n = s["per_device_train_batch_size"] * s["gradient_accumulation_steps"] * devices
    print(f"effective batch = per_device_batch {s['per_device_train_batch_size']} x grad_accum_steps "
          f"{s['gradient_accumulation_steps']} x num_devices {devices} = {n}")
    if record:
        from helpers.results import record as save

        save("effective_batch", n)
        save("effective_batch_parts", {"per_device_batch": s["per_device_train_batch_size"],
                                       "grad_accum_steps": s["gradient_accumulation_steps"],
                                       "num_devices": devices})
    return n


def _formula(args, num_devices: int | None = None) -> str:
    s = _settings(args)
    return f"{s['per_device_train_batch_size']} x {s['gradient_accumulation_steps']} x {_devices(args, num_devices)}"


def _devices(args, num_devices: int | None) -> int:
    if num_devices is not None:
        if not isinstance(num_devices, int) or isinstance(num_devices, bool) or num_devices < 1:
            raise ValueError(f"num_devices must be an int >= 1, got {num_devices!r}")
        return num_devices
    if isinstance(args, dict):  # what a Trainer in this process would use: every visible GPU
        import torch

        world = int(os.environ.get("WORLD_SIZE", "1"))
        return world * max(1, torch.cuda.device_count() if world == 1 else 1)
    # the Trainer's own count: per_device x max(1, n_gpu) is the batch of one process
    # (DataParallel splits it over n_gpu cards), and world_size processes each take one
    return max(1, args.n_gpu) * args.world_size


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


# ---------------------------------------------------------------------------------------------
# the audit: mistakes experienced researchers catch


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
    plan_arg: str  # how helpers.estimate.plan takes this card: a catalog name in quotes, or GiB


def audit(args, model=None, gpu=None, *, seq_len: int | None = None, reported_batch: int | None = None,
          num_devices: int | None = None) -> list[Finding]:
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
    s = _settings(args)
    card = _card(gpu)
    findings = list(_precision_findings(s, card))
    if isinstance(args, dict) and "seed" not in args:
        findings.append(Finding(
            "seed_not_set",
            f"no seed set: the Trainer falls back to {DEFAULT_SEED} and the data order and initialization depend on "
            f"it; write seed={DEFAULT_SEED} (or your own number) into the arguments and report it beside the result"))
    if not s["report_to"]:
        findings.append(Finding(
            "untracked",
            "report_to='none': nothing outside this process records the loss curve or this config; pass "
            "report_to='wandb' (it runs offline without an account, notebook 06) or 'tensorboard', and keep "
            "args.to_json_string() with every checkpoint"))
    seq_len = seq_len or s.get("max_length") or s.get("max_seq_length")
    # load_qlora turns checkpointing on inside the model itself: that counts as on
    on_in_model = bool(getattr(model, "is_activation_checkpointing", False))
    if model is not None and card is not None and not s["activation_checkpointing"] and not on_in_model:
        if not seq_len:
            raise ValueError("audit(model=...) estimates activations, which grow with the sequence length: "
                             "pass seq_len=, e.g. audit(args, model, seq_len=1024)")
        finding = _checkpointing_finding(s, model, card, seq_len)
        if finding:
            findings.append(finding)
    if reported_batch is not None:
        n = effective_batch_size(args, num_devices)
        if reported_batch != n:
            findings.append(Finding(
                "batch_misreported",
                f"the report says batch size {reported_batch}, but the optimizer steps on per_device_batch "
                f"{s['per_device_train_batch_size']} x grad_accum_steps {s['gradient_accumulation_steps']} x "
                f"num_devices {_devices(args, num_devices)} = {n} sequences: report the effective batch {n}, "
                f"and the three factors beside it"))
    for finding in findings:
        _warn(finding)
    return findings


def _settings(args, *, check_keywords: bool = True) -> dict:
    """The keywords the checks read, from TrainingArguments or a dict (with TrainingArguments' defaults).

    check_keywords=False skips the spelling check of a dict's keywords, which imports
    transformers (and with it bitsandbytes, after which accelerate's notebook_launcher refuses to
    start): the effective-batch helpers read two keys and must stay usable before a launch.
    """
    if isinstance(args, dict) and check_keywords:
        _check_keywords(args)
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


def _check_keywords(kwargs: dict) -> None:
    import inspect

    known = set(inspect.signature(_training_arguments_class()).parameters) | set(SFT_KEYWORDS)
    unknown = [k for k in kwargs if k not in known]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, known, n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ValueError(f"not TrainingArguments keywords: {', '.join(hints)}")


def _this_card() -> _Card | None:
    gpus = detect_gpus()
    if not gpus:
        return None
    weakest = min(gpus, key=lambda g: (g.capability, g.total_bytes))
    return _card(weakest)


def _card(gpu) -> _Card | None:
    if gpu is None:
        return _this_card()
    if isinstance(gpu, Gpu):
        return _Card(gpu.name, gpu.capability, gpu.total_bytes, f"{gpu.total_bytes / GIB:.1f}")
    if isinstance(gpu, str):
        from helpers.estimate import load_catalog

        cards = load_catalog("gpus")
        match = {k.lower(): k for k in cards}.get(gpu.lower())
        if match is None:
            raise ValueError(f"unknown GPU {gpu!r}: the catalog has {', '.join(cards)}; or pass a helpers.env.Gpu")
        c = cards[match]
        return _Card(c["name"], tuple(c["capability"]), int(c["memory_gib"] * GIB), repr(match))
    raise TypeError(f"gpu must be a catalog name such as 'T4', a helpers.env.Gpu, or None; got {gpu!r}")


def _precision_findings(s: dict, card: _Card | None) -> list[Finding]:
    found = []
    on_cpu = card is None or s["use_cpu"]
    if s["bf16"] and card is not None and not s["use_cpu"] and card.capability < (8, 0):
        cc = f"{card.capability[0]}.{card.capability[1]}"
        found.append(Finding(
            "bf16_emulated",
            f"bf16=True on {card.name} (compute capability {cc}): bf16 is emulated below 8.0, slowly, although "
            f"torch.cuda.is_bf16_supported() says True; use fp16=True, bf16=False there "
            f"(helpers.training.precision_kwargs() picks it from the card)"))
    if s["fp16"] and on_cpu:
        where = "use_cpu=True" if s["use_cpu"] else "no GPU on this machine"
        found.append(Finding(
            "fp16_ignored_on_cpu",
            f"fp16=True with {where}: the Trainer ignores it without a word and trains in fp32; drop fp16=True here "
            f"(fp32 is what runs), or for bf16 autocast on CPU pass bf16=True, use_cpu=True"))
    return found


def _checkpointing_finding(s: dict, model, card: _Card, seq_len: int) -> Finding | None:
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
    settings = dict(batch_size=b, seq_len=int(seq_len), precision=precision, method=method, weights=weights)
    without = estimate_training_memory(target, **settings)
    if without.total <= card.total_bytes:
        return None
    with_ckpt = estimate_training_memory(target, checkpointing=True, **settings)
    name = name or "this model"
    head = (f"{name} at per_device_batch {b}, seq_len {seq_len}, {precision}: the estimate is "
            f"{without.total / GIB:.1f} GiB without activation checkpointing, more than the "
            f"{card.total_bytes / GIB:.1f} GiB of {card.name} (an out-of-memory error to come, not a model problem)")
    if with_ckpt.total <= card.total_bytes:
        fix = (f"; with it, {with_ckpt.total / GIB:.1f} GiB fits: pass activation_checkpointing=True "
               f"(gradient_checkpointing=True before transformers 5)")
    else:
        plan = f"helpers.estimate.plan({name!r}, {card.plan_arg}, batch_size={b}, seq_len={seq_len})"
        fix = (f"; even with activation_checkpointing=True it needs {with_ckpt.total / GIB:.1f} GiB: turn it on and "
               f"see {plan} for the next steps")
    return Finding("checkpointing_off", head + fix)


def _warn(finding: Finding) -> None:
    """Issue an AuditWarning from the user's own frame, shown every time.

    warnings.warn remembers what it showed per calling line and stays silent on a repeat, which
    hides the finding when a notebook cell runs a second time. warn_explicit with a fresh
    registry shows it each time, while the user's filters ("ignore", "error") still apply.
    """
    frame = sys._getframe(1)
    here = frame.f_code.co_filename
    while frame.f_back is not None and frame.f_code.co_filename == here:  # leave this module
        frame = frame.f_back
    warnings.warn_explicit(str(finding), AuditWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=frame.f_globals.get("__name__", "__main__"), registry={},
                           module_globals=frame.f_globals)


# ---------------------------------------------------------------------------------------------
# auto-fit after an out-of-memory error


class BatchFitError(RuntimeError):
    """Out of memory even at a per-device batch of 1; the message lists what to try next."""


@dataclass
class Fitted:
    """What `fit_batch` ran: the result of `train`, the arguments that fit, every (batch, accumulation) tried."""

    result: object
    args: object
    tried: list[tuple[int, int]] = field(default_factory=list)


def fit_batch(train, args, *, num_devices: int | None = None) -> Fitted:
    """Run `train(args)`; after an out-of-memory error, halve the batch, double accumulation, retry.

    The per-device batch halves (an odd one drops to its largest proper divisor) and gradient
    accumulation grows by the same factor, so the effective batch, and with it the learning rate
    that suits it, stays what you chose. transformers' own `auto_find_batch_size=True` only
    shrinks the batch (accelerate multiplies it by 0.9) and leaves accumulation alone, so the
    effective batch drops without a word. Each retry is printed. Other errors pass through.

    `train` should start from scratch each time (build the Trainer inside it): an out-of-memory
    error usually comes in the first step, before anything was learned. Taught in notebook 04.

    Args:
        train: a function of one argument, the arguments to run with (e.g.
            `lambda a: Trainer(model, a, train_dataset=data).train()`).
        args: TrainingArguments, or a dict with `per_device_train_batch_size` (and
            `gradient_accumulation_steps`) for a hand-written loop.
        num_devices: for the printed effective batch (default: as `effective_batch_size`).

    Returns:
        a `Fitted`: `result` (what `train` returned), `args` (the arguments that ran), `tried`.

    Raises:
        BatchFitError: out of memory even at a per-device batch of 1; it says what to try next.

    Example:
        >>> fitted = fit_batch(lambda a: Trainer(model, a, train_dataset=data).train(), args)  # doctest: +SKIP
        out of memory at per_device_batch 8 x grad_accum_steps 2: retrying with 4 x 4 (effective batch 16 kept)
    """
    from helpers.memory import free_memory, is_oom_error

    current, tried = args, []
    while True:
        s = _settings(current)
        b, k = s["per_device_train_batch_size"], s["gradient_accumulation_steps"]
        tried.append((b, k))
        try:
            result = train(current)
        except Exception as e:  # anything but an out-of-memory error is re-raised below
            if not is_oom_error(e):
                raise
            free_memory(e)  # drop the failed attempt's activations, held by the traceback's frames
            if b == 1:
                raise BatchFitError(_no_fit_message(s, tried, current, num_devices)) from e
            smaller = _next_batch(b)
            factor = b // smaller
            print(f"out of memory at per_device_batch {b} x grad_accum_steps {k}: retrying with {smaller} x "
                  f"{k * factor} (effective batch {effective_batch_size(current, num_devices)} kept)")
            current = _replace(current, per_device_train_batch_size=smaller, gradient_accumulation_steps=k * factor)
            continue
        if len(tried) > 1:
            print(f"fits at per_device_batch {b} x grad_accum_steps {k}: effective batch "
                  f"{effective_batch_size(current, num_devices)}, as asked")
        return Fitted(result, current, tried)


def _next_batch(b: int) -> int:
    """Half of b when b is even; otherwise b's largest proper divisor (1 for a prime)."""
    if b % 2 == 0:
        return b // 2
    return max(d for d in range(1, b // 2 + 1) if b % d == 0)


def _replace(args, **changes):
    if isinstance(args, dict):
        return {**args, **changes}
    import dataclasses

    return dataclasses.replace(args, **changes)


def _no_fit_message(s: dict, tried, args, num_devices) -> str:
    steps = ", ".join(f"{b} x {k}" for b, k in tried)
    options = []
    if not s["activation_checkpointing"]:
        options.append("activation_checkpointing=True (recompute activations in the backward pass; notebook 03)")
    options += ["a shorter seq_len (activations grow with it)",
                "optim='paged_adamw_8bit' (8-bit optimizer states, bitsandbytes)",
                "LoRA or QLoRA instead of a full fine-tune (notebook 05)"]
    return (f"out of memory even at per_device_batch 1 (tried per_device_batch x grad_accum_steps: {steps}; "
            f"effective batch {effective_batch_size(args, num_devices)}). The batch is not the problem any more; "
            "next, in order of cost: " + "; ".join(options) + ". helpers.estimate.plan(...) predicts which one fits.")


@contextmanager
def activation_budget(max_bytes: int, *models):
    """Act as a card with room for `max_bytes` of activations: raise an out-of-memory error past it.

    A stand-in for a GPU that fills up, for notebooks and tests on a CPU, where a real
    out-of-memory error cannot be produced safely. Inside the block, every tensor autograd saves
    for backward is counted as `helpers.memory.track_saved_tensors` counts it (each storage once,
    the models' parameters excluded, given back when the graph is freed); the save that would
    pass `max_bytes` raises `torch.OutOfMemoryError`, which `helpers.memory.is_oom_error` and
    `fit_batch` recognize like the real one. Tensors saved inside a checkpointed layer never
    reach it, exactly as they never take the card's memory until the backward pass recomputes
    them. Taught in notebooks 03 and 04.

    Args:
        max_bytes: the activation bytes the pretend card holds (what is left after weights,
            gradients and optimizer states).
        models: whose parameters are weights, not activations.

    Example:
        >>> with activation_budget(8 * 2**20, model):  # doctest: +SKIP
        ...     model(**batch).loss.backward()  # torch.OutOfMemoryError past 8 MiB of activations
    """
    import torch

    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
    params = {p.untyped_storage().data_ptr() for m in models for p in m.parameters()}
    held: dict[int, list[int]] = {}  # storage address -> [references the graph holds, bytes]
    live = 0  # bytes the graph holds now

    class Held:  # a saved tensor as the graph keeps it; gives its bytes back when the graph is freed
        __slots__ = ("tensor", "key")

        def __init__(self, tensor, key):
            self.tensor, self.key = tensor, key

        def __del__(self):
            nonlocal live
            entry = held[self.key]
            entry[0] -= 1
            if entry[0] == 0:
                live -= entry[1]
                del held[self.key]

    def pack(t):
        nonlocal live
        key = t.untyped_storage().data_ptr()
        if key in params:
            return t
        if key not in held:
            size = t.untyped_storage().nbytes()
            if live + size > max_bytes:
                raise torch.OutOfMemoryError(
                    f"simulated out of memory: activations would take {(live + size) / 2**20:.2f} MiB, "
                    f"the budget is {max_bytes / 2**20:.2f} MiB (helpers.training.activation_budget)")
            held[key] = [0, size]
            live += size
        held[key][0] += 1
        # a detached alias, not the tensor: the tensor would close a cycle (output -> grad_fn ->
        # saved -> output) that only a backward pass breaks, so a failed step would never be freed
        return Held(t.detach(), key)

    def unpack(h):
        return h.tensor if isinstance(h, Held) else h

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
