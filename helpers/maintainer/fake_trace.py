"""Training memory at 7B sizes without a GPU: the real model's steps on fake tensors, every allocation in order.

No notebook calls it. It checks what notebook 01 (memory anatomy) teaches with the estimator
(`helpers.estimate`) at the sizes students plan for: the CPU checks (helpers/_cpu_peak.py) measure
real bytes but only of a tiny model, not a 7B's head, embeddings and grouped heads at full size.
tests/test_fake_trace.py and scripts/bench_fake.py hold the estimator's `allocated` to it.

How: the real transformers model (peft's LoRA, torch's AdamW, transformers' checkpointing) is built
on the meta device, its parameters and buffers then replaced by fake tensors on "cpu"
(`FakeTensorMode`: shapes and dtypes, no memory). A `TorchDispatchMode` sees each operator's
outputs: a storage that is none of its inputs' (not an in-place update, not a view) is an
allocation, and a `weakref.finalize` on it, which fires when its last tensor goes, its free.

It cannot see what a kernel allocates inside itself (cuBLAS, oneDNN workspaces) nor anything
CUDA-only (flash and memory-efficient SDPA: the CPU's SDPA runs here; the CUDA context; the caching
allocator, replayed on the trace instead: `FakeRun.reserved`); bitsandbytes' 4-bit and 8-bit
kernels do not run on fake tensors (no QLoRA, no 8-bit optimizers).
"""

from __future__ import annotations

import gc
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import cache

from helpers._caching_allocator import reserved_peak
from helpers._util import torch_dtype
from helpers.catalog import resolve_model
from helpers.estimate import LINEAR_TARGETS, Job, shape_of
from helpers.estimate._configs import WAYS_IN, config_dict, looks_like_hub_id, looks_like_path
from helpers.job import JobSettingError, TrainingJob, job_settings

__all__ = ["AllocationTrace", "FakeModel", "FakeRun", "fake_model", "model_config", "train_step", "trace_training"]

# TrainingArguments' and the estimator's optimizer names -> how torch's AdamW runs its step (the estimator's
# "adamw" is the fused kernel, TrainingArguments' default optim from torch 2.8)
OPTIMIZER_STEPS = dict(adamw="fused", adamw_torch_fused="fused", adamw_foreach="foreach", adamw_torch="foreach")
OPTIMIZER_STEPS.update(adamw_hf="per tensor", sgd="sgd")
# the catalog's shape fields -> a config's names (GPT-2 spells its own)
_CONFIG_NAMES = dict(hidden="hidden_size", layers="num_hidden_layers", heads="num_attention_heads", vocab="vocab_size")
_CONFIG_NAMES.update(intermediate="intermediate_size", tied="tie_word_embeddings", kv_heads="num_key_value_heads")
_CONFIG_NAMES.update(head_dim="head_dim", rotary_fraction="rotary_pct")
_GPT2_NAMES = dict(hidden="n_embd", layers="n_layer", heads="n_head", vocab="vocab_size", max_positions="n_positions")
# the job's settings beside which the walk runs only what the kit's Trainer does by default
_TRAINER = dict(loop="trainer", fused_loss=False, grad_accum_steps=1, world_size=1)


class AllocationTrace:
    """Every storage allocation and free, in time order: (handle, +bytes) then (handle, -bytes).

    `recording()` sees what operators allocate, on fake or real tensors; `add` counts storages made
    before (the weights). `level` is the bytes alive, `peak` the most since the last `reset_peak`.
    """

    def __init__(self):
        self.events: list[tuple[int, int]] = []
        self.level = 0
        self.peak = 0
        self._live: dict[int, tuple[int, object]] = {}  # id(storage) -> (handle, its finalizer)
        self._closed = False

    def add(self, *tensors) -> None:
        """Count the storages of `tensors` (or storages) as allocated now, each once."""
        for t in tensors:
            storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t
            key, nbytes = id(storage), storage.nbytes()
            if key in self._live or nbytes == 0 or self._closed:
                continue
            handle = len(self.events)
            finalizer = weakref.finalize(storage, self._free, key, handle, nbytes)
            finalizer.atexit = False
            self._live[key] = (handle, finalizer)
            self.level += nbytes
            self.peak = max(self.peak, self.level)
            self.events.append((handle, nbytes))

    def reset_peak(self) -> None:
        self.peak = self.level

    def recording(self):
        """A context in which what every operator allocates is counted (a TorchDispatchMode)."""
        return _recorder()(self)

    def close(self) -> list[tuple[int, int]]:
        """Stop recording frees (the model's own, when it is deleted later); the events so far."""
        self._closed = True
        for _, finalizer in self._live.values():
            finalizer.detach()
        self._live.clear()
        return list(self.events)

    def _free(self, key: int, handle: int, nbytes: int) -> None:  # a finalizer: never called after close()
        self._live.pop(key, None)
        self.level -= nbytes
        self.events.append((handle, -nbytes))


@cache
def _recorder():
    """The TorchDispatchMode behind `AllocationTrace.recording` (torch imported only when a trace runs)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Recorder(TorchDispatchMode):
        def __init__(self, trace: AllocationTrace):
            super().__init__()
            self.trace = trace

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if made:  # an in-place op's or a view's output shares an input's storage: nothing new
                inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
                self.trace.add(*(s for s in (t.untyped_storage() for t in made) if id(s) not in inputs))
            return out

    return Recorder


@dataclass
class FakeModel:
    """A training job on a model made of fake tensors: what `train_step` runs."""

    model: object  # the transformers model (a peft model for LoRA), its parameters fake tensors on "cpu"
    optimizer: object
    mode: object  # the FakeTensorMode its tensors belong to
    job: Job  # the estimator's reading of the settings: precision, autocast, stored weights
    config: dict  # the transformers config it was built from, with model_type


@dataclass
class FakeRun:
    """What `trace_training` recorded: the allocations of a whole run, one training step per length."""

    config: dict  # the transformers config built (pass it to the estimator for the same model)
    job: TrainingJob  # the settings as run, precision and weights resolved; seq_len the longest length
    lengths: tuple[int, ...]
    events: list[tuple[int, int]]  # (handle, +bytes) an allocation, (handle, -bytes) its free; weights first
    weights: int  # bytes of the parameters and buffers before the first step
    step_peaks: list[int]  # the most allocated during each step, weights included
    step_starts: list[int] = field(default_factory=list)  # index in events where each step begins
    seconds: float = 0.0

    @property
    def peak(self) -> int:
        """The most allocated at one moment of the run (torch.cuda.max_memory_allocated)."""
        return max(self.step_peaks, default=self.weights)

    def reserved(self, expandable: bool = False) -> int:
        """The peak torch.cuda's caching allocator would reserve for these requests, the weights' included
        (torch.cuda.max_memory_reserved; expandable: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."""
        return reserved_peak(self.events, expandable=expandable)


def trace_training(model, job: TrainingJob | None = None, /, *, lengths=None, layers=None, **settings) -> FakeRun:
    """Run a training job on fake tensors, one step per sequence length, and record every allocation.

    Args:
        model: a catalog name ("Mistral-7B"), a path to a config.json, a Hub id, a config dict or a
            transformers config of a causal language model the estimator reads (not BERT).
        job: the settings (`helpers.job.TrainingJob`), or by keyword as `estimate_training_memory` takes
            them (per_device_batch, default 1; precision, weights, method, lora_r, lora_targets,
            optimizer, checkpointing, attn_impl): the Trainer's step, one process, no accumulation.
        lengths: each step's sequence length (per_device_batch x length tokens), a whole run; None:
            one step of seq_len.
        layers: this many decoder layers instead of the config's (`FakeRun.config` says it to the estimator).

    Returns:
        a FakeRun: `events` (as `helpers._caching_allocator.reserved_peak` replays them), `weights`,
        `step_peaks`, `peak`, `reserved()`.

    Example:
        >>> run = trace_training("Mistral-7B", lengths=[512, 1024], precision="bf16-true")  # doctest: +SKIP
        >>> estimate_training_memory(run.config, run.job, device="cpu").allocated / run.peak  # doctest: +SKIP
    """
    asked = settings.pop("seq_len", None)
    if lengths is None and asked is None and job is not None:
        asked = job.seq_len  # one step of the job's
    lengths = _lengths(lengths, asked)
    settings["seq_len"] = max(lengths)
    if job is None:
        settings.setdefault("per_device_batch", 1)
    built = fake_model(model, job, layers=layers, **settings)
    trace, starts, peaks = AllocationTrace(), [], []
    gc.collect()  # no garbage of earlier work freed inside the trace
    start = time.perf_counter()
    with built.mode, trace.recording():
        trace.add(*built.model.parameters(), *built.model.buffers())
        weights = trace.level
        for length in lengths:
            starts.append(len(trace.events))
            trace.reset_peak()
            train_step(built, length)
            peaks.append(trace.peak)
    events = trace.close()
    ran = TrainingJob(**{f.name: getattr(built.job, f.name) for f in fields(TrainingJob)})  # precision resolved
    return FakeRun(built.config, ran, tuple(lengths), events, weights, peaks, starts, time.perf_counter() - start)


def fake_model(model, job: TrainingJob | None = None, /, *, layers=None, **settings) -> FakeModel:
    """Build `model` for the job's training, with fake tensors: no memory, the real modules and optimizer."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoConfig, AutoModelForCausalLM

    config = model_config(model, layers=layers)
    settings = job_settings(job, caller="fake_model", **settings)
    built = Job.of(settings, shape_of(config), device="cpu")
    _check_walkable(built, config)
    values = {k: v for k, v in config.items() if k != "model_type"} | {"use_cache": False}  # training: no cache
    with torch.device("meta"):  # fake tensors cannot be cast in place (peft casts its adapters), meta ones can
        net = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(config["model_type"], **values),
            dtype=torch_dtype(built.weights),
            attn_implementation=built.shape.attn_impl,
        )
    if built.method == "lora":
        net = _with_lora(net, built)
    if built.checkpointing:
        _enable_checkpointing(net)
    net.train()
    mode = FakeTensorMode()
    _to_fake(net, mode)
    with mode:
        optimizer = _optimizer([p for p in net.parameters() if p.requires_grad], built.optimizer)
    return FakeModel(net, optimizer, mode, built, config)


def train_step(built: FakeModel, seq_len: int | None = None) -> None:
    """One step as the Trainer takes it: forward (under autocast for mixed precision) to the loss, the
    output let go, backward, the optimizer's step, the gradients set to None."""
    import torch

    job = built.job
    with built.mode, _one_sequence_a_row():
        ids = torch.randint(0, built.model.config.vocab_size, (job.per_device_batch, seq_len or job.seq_len))
        labels = ids.clone()  # the data collator's copy
        with torch.autocast("cpu", dtype=torch_dtype(job.base_dtype), enabled=job.autocast):
            loss = built.model(input_ids=ids, labels=labels).loss  # the output object goes here
        loss.backward()
        del loss, ids, labels
        built.optimizer.step()
        built.optimizer.zero_grad(set_to_none=True)


@contextmanager
def _one_sequence_a_row():
    """Each row is one sequence, as transformers finds by reading real position ids; fake ones have no values, so
    it would keep a 4-D mask (SDPA's masked path, keys and values expanded to every head: 16 MiB a layer more on
    Mistral-7B at 1 x 1024) that a real run never makes."""
    from unittest import mock

    from transformers import masking_utils

    with mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None, create=True):
        yield


def model_config(model, *, layers: int | None = None) -> dict:
    """The whole transformers config (its to_dict(), defaults filled in) that `fake_model` builds for `model`.

    A catalog name is built from the catalog's shape; `layers` replaces the number of decoder layers."""
    from transformers import AutoConfig

    if isinstance(model, str) and not looks_like_path(model):
        try:
            config = _catalog_config(resolve_model(model).entry)
        except ValueError as unknown:
            if not looks_like_hub_id(model):
                raise ValueError(f"{unknown}. {WAYS_IN}") from None
            config = config_dict(model)
    else:
        config = config_dict(model)
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = {"model_type": "gemma3_text", **config["text_config"]}  # the language model
    kind = config.pop("model_type", None)
    config.pop("quantization_config", None)  # a pre-quantized checkpoint: the job's `weights` says how to store
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers={layers!r}: pass a whole number of decoder layers, e.g. layers=2")
        config["n_layer" if kind == "gpt2" else "num_hidden_layers"] = layers
        if isinstance(config.get("layer_types"), list):  # Gemma 2/3, Qwen3: one entry a layer
            config["layer_types"] = config["layer_types"][:layers]
    try:  # the defaults transformers fills in (Gemma 2's soft-capping, its activation) are the model built
        return AutoConfig.for_model(kind, **config).to_dict()
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"transformers cannot build model_type {kind!r} ({e}): pass the model's whole config.json"
        ) from e


def _catalog_config(entry: dict) -> dict:
    """A catalog entry's shape as a config dict of its model_type (tests/test_fake_trace.py proves the round trip)."""
    shape, kind = entry["shape"], entry["model_type"]
    names = _GPT2_NAMES if shape["family"] == "gpt2" else _CONFIG_NAMES
    config = {"model_type": "gemma3_text" if kind == "gemma3" else kind}
    config.update({names[k]: v for k, v in shape.items() if k in names})
    if entry.get("context"):
        config["max_position_embeddings"] = entry["context"]
    return config


def _lengths(lengths, seq_len) -> list[int]:
    """One sequence length a step: `lengths` as given, or one step of seq_len."""
    if lengths is not None and seq_len is not None:
        raise JobSettingError(f"got lengths={lengths!r} and seq_len={seq_len!r}: pass only lengths, one a step")
    steps = [seq_len] if lengths is None else [lengths] if isinstance(lengths, int) else lengths
    odd = not isinstance(steps, list | tuple | range) or not steps
    if odd or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in steps):
        raise JobSettingError(
            f"lengths={lengths!r}: pass the tokens of each step's sequences, whole numbers, e.g. lengths=[512, 1024]"
        )
    return list(steps)


def _check_walkable(job: Job, config: dict) -> None:
    """Settings this walk cannot run are refused, each with what to use instead (nothing is ignored)."""
    fixes = []
    if job.quantized:
        fixes.append(
            f"weights={job.weights!r} needs bitsandbytes' kernels, which do not run on fake tensors: trace "
            "method='lora' with weights='bf16', and check QLoRA against the CPU allocator "
            "(python scripts/bench_estimator.py --allocator) or a card (python -m helpers gpu-proof)"
        )
    if job.shape.family == "bert":
        fixes.append("the estimator counts BERT with a classifier head, the walk builds causal LMs: pass a decoder")
    if job.optimizer not in OPTIMIZER_STEPS:
        fixes.append(f"optimizer={job.optimizer!r} is not walked: pass one of {', '.join(map(repr, OPTIMIZER_STEPS))}")
    fixes += [
        f"{name}={getattr(job, name)!r}: the walk runs the Trainer's step on one process, one micro-batch an "
        f"optimizer step, no fused loss; pass {name}={trainer!r}"
        for name, trainer in _TRAINER.items()
        if getattr(job, name) != trainer
    ]
    if fixes:
        raise JobSettingError(f"trace_training cannot build this {config['model_type']} job: {fixes[0]}")


def _with_lora(net, job: Job):
    """peft's LoRA as the kit puts it on (helpers.qlora.add_adapter): adapters in fp32, or in 16 bits when
    everything is (precision "-true"), as the estimator counts them."""
    from peft import LoraConfig, get_peft_model

    targets = job.lora_targets
    if targets != "all-linear":  # the estimator's own names ("q") are peft's q_proj in the Llama family
        named = (targets,) if isinstance(targets, str) else targets
        targets = [f"{t}_proj" if t in LINEAR_TARGETS and job.shape.family in ("llama", "gemma") else t for t in named]
    adapter = LoraConfig(
        r=job.lora_r,
        lora_alpha=2 * job.lora_r,
        lora_dropout=job.lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(net, adapter, autocast_adapter_dtype=not job.true_half)


def _enable_checkpointing(net) -> None:
    """Checkpoint every layer, non-reentrant, as the kit's TrainingArguments ask (helpers.training)."""
    base = net.get_base_model() if hasattr(net, "get_base_model") else net
    if hasattr(base, "activation_checkpointing_enable"):  # transformers 5's name
        return base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _to_fake(net, mode) -> None:
    """Replace every parameter and buffer (meta tensors) by a fake tensor on "cpu"; tied ones stay one."""
    import torch

    made = {}
    for module in net.modules():
        for tensors in (module._parameters, module._buffers):
            for name, t in ((n, t) for n, t in tensors.items() if t is not None):
                if id(t) not in made:
                    with mode:
                        fake = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    is_parameter = isinstance(t, torch.nn.Parameter)
                    made[id(t)] = torch.nn.Parameter(fake, t.requires_grad) if is_parameter else fake
                tensors[name] = made[id(t)]


def _optimizer(params, name: str):
    import torch

    how = OPTIMIZER_STEPS[name]
    adamw = dict(fused=how == "fused", foreach=how == "foreach")
    return torch.optim.SGD(params, lr=1e-5) if how == "sgd" else torch.optim.AdamW(params, lr=1e-5, **adamw)
