"""A training job's settings as one object: what the estimator, `plan`, the command line and the planner read.

Taught in notebook 01 (memory anatomy), where the planner's controls set these fields, and used by
05 (the 7B plan) and 08 (the capstone's job). `TrainingJob` is built by keyword and checked when it
is made, so a bad value is refused with its fix before any model is read or loaded. The same fields
become `python -m helpers plan`'s flags and the exported train.py's (`helpers.job_flags`, which also
checks the run's schedule: `RUN_SETTINGS`) (`add_job_arguments`, `job_from_arguments`) and the
planner's controls (`helpers.planner`): a setting added here shows up in all three.

Pure Python: no torch, no network.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import MISSING, dataclass, field, fields, replace

__all__ = [
    "ATTENTION",
    "BATCHES",
    "LOOPS",
    "METHODS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RANKS",
    "SEQ_LENS",
    "SHARDING",
    "WORLD_SIZES",
    "WEIGHT_FORMATS",
    "JobSettingError",
    "RUN_SETTINGS",
    "TrainingJob",
    "check_run_setting",
    "check_setting",
    "job_settings",
]

# compute precision: mixed precision via autocast ("fp32", "bf16", "fp16"), or
# "bf16-true" / "fp16-true" (litgpt's names; torchtune's dtype=bf16): every floating tensor is stored
# and computed in 16 bits: no autocast, no fp32 master weights, adapters and their optimizer states
# in 16 bits too, and a quantized model keeps its unquantized parameters in 16 bits (no peft k-bit
# preparation, so the embeddings' output does not require grad)
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-true", "fp16-true")
METHODS = ("full", "lora", "qlora")
WEIGHT_FORMATS = ("fp32", "bf16", "fp16", "int8", "nf4")
# the optimizer kinds the estimator prices (helpers/estimate/_job.py), then TrainingArguments' `optim`
# names for three of them
OPTIMIZERS = (
    "adamw",
    "adamw_foreach",
    "adamw_hf",
    "adamw_8bit",
    "paged_adamw_8bit",
    "sgd",
    "adafactor",
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_bnb_8bit",
)
# the training loop around the model, and what it keeps of the model's output (TrainingJob.loop):
# "trainer": transformers' Trainer (and accelerate's examples): the output goes before backward;
# "custom": `outputs = model(**batch); outputs.loss.backward()`, the Hugging Face course's loop: the
# output (logits, and the key/value cache when the config asks for one) lives through backward and the
# optimizer's step, and into the next forward, until the name is bound again;
# "litgpt": `logits = model(x)` with a chunked loss: its fp32 logits and their graph likewise
LOOPS = ("trainer", "custom", "litgpt")
ATTENTION = ("eager", "sdpa", "flash_attention_2")
# the planner's slider stops: the sizes people actually pick (a value between them is added as a stop)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
RANKS = (4, 8, 16, 32, 64, 128)
WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64)
# how the GPUs of a job share it (notebook 07): "none", data parallel (DDP): every GPU holds the whole model, its
# gradients and optimizer states, plus DDP's gradient buckets; "full": FSDP's full shard (FSDP2's
# fully_shard, DeepSpeed's ZeRO-3): weights, gradients and optimizer states split over the GPUs, each layer's
# weights gathered while it runs; "grad_op": FSDP's SHARD_GRAD_OP (fully_shard(reshard_after_forward=False),
# like ZeRO-2): gradients and optimizer states split, the weights gathered once a step and kept until its backward
SHARDING = ("none", "full", "grad_op")


class JobSettingError(ValueError):
    """A training job's setting that cannot be used; the message names the setting and the fix."""


def _setting(default, help: str, **meta):
    """A field with what the command line and the planner need to show it: `help`; `choices` (and the
    ones the planner `shown`), or a whole number's range up to `most` and slider `stops`, or a fraction
    `below` a bound; the planner's `label`; an `example` for the errors, what a required field `needs`, and a
    default the command line gives where Python asks for the value (`cli_default`)."""
    kwargs = {} if default is MISSING else {"default": default}
    return field(metadata={"help": help, **meta}, **kwargs)


@dataclass(frozen=True, kw_only=True)
class TrainingJob:
    """The settings of one fine-tuning job: the micro-batch, precision, method and the memory techniques.

    The model (what) and the card (where) are not part of it: `estimate_training_memory(model, job,
    gpu=...)` and `plan(model, gpu, job)` take them beside it. Every field is checked when the job
    is made; `replace(job, seq_len=2048)` makes a changed copy, checked again.

    Example:
        >>> job = TrainingJob(per_device_batch=1, seq_len=2048, method="qlora", checkpointing=True)
        >>> job.effective_batch
        1
        >>> TrainingJob(per_device_batch=0, seq_len=512)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        helpers.job.JobSettingError: per_device_batch=0 is out of range: pass a whole number from 1 to 65,536, ...
    """

    per_device_batch: int = _setting(
        MISSING,
        "sequences per micro-batch on one device",
        most=2**16,
        example=1,
        label="per-device batch",
        stops=BATCHES,
        needs="the micro-batch on one device",
        cli_default=1,
    )
    seq_len: int = _setting(
        MISSING, "tokens per sequence", most=2**20, example=512, stops=SEQ_LENS, needs="the tokens per sequence"
    )
    grad_accum_steps: int = _setting(1, "micro-batches per optimizer step", most=2**16, example=16)
    precision: str | None = _setting(
        None,
        "default: the card's half precision (bf16 from compute capability 8.0, fp16 below); "
        "bf16-true / fp16-true: everything in 16 bits, no fp32 copies",
        choices=PRECISIONS,
    )
    weights: str | None = _setting(
        None, "how the weights are stored (default: what the method stores)", choices=WEIGHT_FORMATS
    )
    method: str = _setting(
        "full", "full fine-tune, LoRA on a 16-bit model, or LoRA on a 4-bit NF4 model", choices=METHODS
    )
    lora_r: int = _setting(16, "LoRA rank", most=4096, example=16, label="LoRA rank", stops=RANKS)
    lora_targets: str | tuple[str, ...] = _setting(
        "all-linear", "peft's target_modules: all-linear, or module names such as q_proj,v_proj (lm_head for the head)"
    )
    lora_dropout: float = _setting(0.0, "dropout on the adapters' input", below=1.0, example=0.05)
    double_quant: bool = _setting(True, "nf4 with double quantization (bnb_4bit_use_double_quant)")
    optimizer: str = _setting(
        "adamw", "the optimizer; also TrainingArguments' optim names", choices=OPTIMIZERS, shown=OPTIMIZERS[:7]
    )
    checkpointing: bool = _setting(False, "gradient checkpointing on every layer", label="gradient checkpointing")
    fused_loss: bool = _setting(
        False,
        "a fused / chunked cross-entropy (Liger, Unsloth): no full-sequence logits in fp32",
        label="fused loss (Liger, Unsloth)",
    )
    loop: str = _setting(
        "trainer",
        "trainer: transformers' Trainer; custom: your own `outputs = model(**batch)` loop, which keeps the logits "
        "through backward; litgpt",
        choices=LOOPS,
    )
    attn_impl: str | None = _setting(
        None, "the attention implementation (default: the model config's)", choices=ATTENTION
    )
    world_size: int = _setting(
        1,
        "GPUs training the job together, one process each, over all nodes; the estimate is one GPU's",
        most=4096,
        example=2,
        label="GPUs",
        stops=WORLD_SIZES,
    )
    sharding: str = _setting(
        "none",
        "how the GPUs share the job: none (data parallel: each holds everything), full (FSDP full shard, ZeRO-3: "
        "weights, gradients, optimizer states split), grad_op (FSDP SHARD_GRAD_OP, ZeRO-2: gradients and "
        "optimizer states split)",
        choices=SHARDING,
        label="sharding",
    )

    def __post_init__(self):
        for f in fields(self):
            _check_field(f, getattr(self, f.name))
        if isinstance(self.lora_targets, list):  # frozen: a tuple, so the job can be hashed and compared
            object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        if self.sharding != "none" and self.world_size == 1:
            raise JobSettingError(
                f"sharding={self.sharding!r} on one GPU splits nothing: pass world_size=2 or more (the GPUs that "
                "share the job), or sharding='none'"
            )
        if self.precision is not None:
            _check_combination(self)

    @property
    def effective_batch(self) -> int:
        """Sequences per optimizer step on one device: per_device_batch x grad_accum_steps."""
        return self.per_device_batch * self.grad_accum_steps

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step over every GPU: per_device_batch x grad_accum_steps x world_size."""
        return self.effective_batch * self.world_size

    def stored_weights(self, precision: str) -> str:
        """How the weights are stored under `precision`: as asked, or what the method stores."""
        if self.weights is not None:
            return self.weights
        base = precision.removesuffix("-true")
        return {"full": base if precision.endswith("-true") else "fp32", "lora": base, "qlora": "nf4"}[self.method]

    def with_precision(self, half: str) -> TrainingJob:
        """The job with its precision filled in: `half` (the card's) when none was asked."""
        return self if self.precision is not None else replace(self, precision=half)


def _check_field(f, value) -> None:
    """One field's value: its type, its range or its choices; the error says what would work."""
    name, meta = f.name, f.metadata
    if "choices" in meta:
        if value is None and f.default is None:
            return
        if value not in meta["choices"]:
            lowered = {str(c).lower(): c for c in meta["choices"]}  # "QLoRA" is near "qlora"
            near = [lowered[n] for n in difflib.get_close_matches(str(value).lower(), lowered, n=1)]
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise JobSettingError(f"{name}={value!r} is not one of {', '.join(map(repr, meta['choices']))}{hint}")
    elif "most" in meta:
        if isinstance(value, bool) or not isinstance(value, int):
            raise JobSettingError(f"{name}={value!r} is not a whole number: pass e.g. {name}={meta['example']}")
        if not 1 <= value <= meta["most"]:
            raise JobSettingError(
                f"{name}={value!r} is out of range: pass a whole number from 1 to {meta['most']:,}, "
                f"e.g. {name}={meta['example']}"
            )
    elif "below" in meta:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not 0 <= value < meta["below"]:
            raise JobSettingError(
                f"{name}={value!r} is out of range: pass a number from 0 up to {meta['below']:g}, "
                f"e.g. {name}={meta['example']}"
            )
    elif isinstance(f.default, bool):
        if not isinstance(value, bool):
            raise JobSettingError(f"{name}={value!r}: pass True or False")
    elif name == "lora_targets":
        names = (value,) if isinstance(value, str) else value
        if not isinstance(names, list | tuple) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise JobSettingError(
                f"lora_targets={value!r}: pass 'all-linear' or module names, e.g. ['q_proj', 'v_proj']"
            )


def _check_combination(job: TrainingJob) -> None:
    """The settings make sense together; each error says which one to drop or change."""
    precision = job.precision
    weights = job.stored_weights(precision)
    base = precision.removesuffix("-true")
    if job.method == "qlora" and weights != "nf4":
        raise JobSettingError(f"method='qlora' stores weights in nf4; drop weights={weights!r} or use method='lora'")
    if job.method == "full" and weights in ("int8", "nf4"):
        raise JobSettingError(f"quantized weights ({weights}) cannot be trained in full: use method='qlora' or 'lora'")
    if precision.endswith("-true") and weights not in (base, "int8", "nf4"):
        raise JobSettingError(f"precision={precision!r} stores every weight in {base}; drop weights={weights!r}")
    if base == "fp32" and weights not in ("fp32", "int8", "nf4"):
        raise JobSettingError(
            f"weights={weights!r} with precision='fp32' would upcast every matmul; use precision={weights!r}"
        )


def job_settings(job: TrainingJob | None = None, /, caller: str = "TrainingJob", **settings) -> TrainingJob:
    """A job from a TrainingJob and/or keywords (keywords win), with `batch_size` read as per_device_batch.

    An unknown keyword is refused with the nearest field's name, not TypeError's bare "unexpected keyword".
    """
    for name in ("batch_size", "per_device_batch", "seq_len"):  # None: not given, as these were optional keywords
        if name in settings and settings[name] is None:
            del settings[name]
    if "batch_size" in settings:  # the older spelling of the micro-batch; one figure, one name
        if "per_device_batch" in settings:
            raise JobSettingError(
                f"{caller}() got per_device_batch={settings['per_device_batch']!r} and batch_size="
                f"{settings['batch_size']!r}, two names for one figure: pass only "
                f"per_device_batch={settings['per_device_batch']!r}"
            )
        settings["per_device_batch"] = settings.pop("batch_size")
    names = [f.name for f in fields(TrainingJob)]
    for key in settings:
        if key not in names:
            near = difflib.get_close_matches(key, names, n=1)
            hint = f": did you mean {near[0]}=?" if near else f"; the settings are {', '.join(names)}"
            raise TypeError(f"{caller}() got an unknown setting {key}={settings[key]!r}{hint}")
    if job is None:
        for f in fields(TrainingJob):
            if f.default is MISSING and f.name not in settings:
                raise JobSettingError(
                    f"{caller}() needs {f.metadata['needs']}: pass {f.name}, e.g. {f.name}={f.metadata['example']}"
                )
        return TrainingJob(**settings)
    if not isinstance(job, TrainingJob):
        raise TypeError(f"{caller}() got {job!r} as its job: pass a helpers.job.TrainingJob, or settings by keyword")
    return replace(job, **settings) if settings else job


# a run's schedule and bookkeeping: the exported train.py's settings (notebook 08's parameters) that are
# not the job's memory, each checked like a field: name -> (kind, lowest, highest, example); -1 is also
# taken for max_steps (the Trainer's "the epochs decide")
RUN_SETTINGS = {
    "learning_rate": ("rate", 0.0, 1.0, "2e-4"),  # above 0, below 1: AdamW diverges long before 1
    "tiny_learning_rate": ("rate", 0.0, 1.0, "1e-2"),
    "num_train_epochs": ("rate", 0.0, 10_000.0, "3"),
    "max_steps": ("whole", 1, 10**9, "100"),
    "save_steps": ("whole", 1, 10**9, "20"),
    "logging_steps": ("whole", 1, 10**9, "10"),
    "seed": ("whole", 0, 2**32 - 1, "42"),  # numpy's seeds stop at 2**32 - 1
    "max_new_tokens": ("whole", 1, 2**20, "40"),
    "disconnect_after_step": ("whole", 1, 10**9, "22"),
    "run_name": ("name", None, None, "capstone"),
    "model_id": ("id", None, None, "Qwen/Qwen2.5-7B"),
    "merge_base_id": ("id", None, None, "Qwen/Qwen2.5-7B"),
    "hub_repo": ("repo", None, None, "you/qwen-course-adapter"),
}
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def check_run_setting(name: str, value):
    """`value` for the run setting `name` (RUN_SETTINGS), or JobSettingError naming the value and what works.

    The exported train.py checks every flag with it as the flags are read, before anything is imported
    or loaded: `--learning-rate nan` stops there, not after the 7B has loaded.
    """
    kind, low, high, example = RUN_SETTINGS[name]
    if kind == "rate":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not low < value <= high or (name.endswith("learning_rate") and value >= high):
            bound = f"below {high:g}" if name.endswith("learning_rate") else f"up to {high:,g}"
            raise JobSettingError(
                f"{name}={value!r} is out of range: pass a number above {low:g} and {bound}, e.g. {name}={example}"
            )
    elif kind == "whole":
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not ok or not (low <= value <= high or (name == "max_steps" and value == -1)):
            also = " (or -1: the epochs decide)" if name == "max_steps" else ""
            raise JobSettingError(
                f"{name}={value!r} is out of range: pass a whole number from {low} to {high:,}{also}, "
                f"e.g. {name}={example}"
            )
    elif kind == "name" and not (isinstance(value, str) and _RUN_NAME.fullmatch(value)):
        raise JobSettingError(
            f"{name}={value!r} cannot name a run folder: use letters, digits, '.', '_' and '-' (no '/', no spaces, "
            f"not starting with '.' or '-'), e.g. {name}={example!r}"
        )
    elif kind == "id" and not (isinstance(value, str) and value.strip() and value == value.strip()):
        raise JobSettingError(f"{name}={value!r}: pass a Hub id or a folder, e.g. {name}={example!r}")
    elif kind == "repo" and not (value == "" or isinstance(value, str) and _HUB_REPO.fullmatch(value)):
        raise JobSettingError(
            f"{name}={value!r} is not a Hub repo id: pass your-name/repo-name, e.g. {name}={example!r} (or '' for none)"
        )
    return value


def check_setting(name: str, value):
    """`value` for the setting `name`, a TrainingJob field or a RUN_SETTINGS name: returned when it can be used,
    else JobSettingError naming the value and what works. One check for the notebooks, the estimator,
    `plan`, the planner, `python -m helpers plan`'s flags and the exported train.py's."""
    job_fields = {f.name: f for f in fields(TrainingJob)}
    if name in job_fields:
        _check_field(job_fields[name], value)
        return value
    if name in RUN_SETTINGS:
        return check_run_setting(name, value)
    raise KeyError(f"{name!r} is neither a TrainingJob field nor a run setting ({', '.join(RUN_SETTINGS)})")
