"""Several GPUs as memory: what each one holds when the job is sharded, and what the sharding costs.

Taught in notebook 07 (Kaggle T4 x2), after its data-parallel run: the same model trained sharded
with PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`), each process measured. The notebook
writes the sharding out (a `fully_shard` per decoder layer, then one on the model); these are the
pieces around it:

- `decoder_layers(model)`: the blocks to shard one by one, found by the class names transformers
  lists in `_no_split_modules` (a peft model's too);
- `step_peak()`: the most allocated during a block above what was held at its start, the same
  quantity on a GPU (torch.cuda's peak) and on CPU processes (torch's CPU allocator, `_cpu_peak`);
- `traffic_per_step(...)`: the bytes each GPU sends per optimizer step under each strategy;
- `rank_table(rows)`: the per-rank table, measured beside estimated.

What each strategy keeps is `helpers.job.SHARDING`; the estimator's per-rank terms are in
`helpers/estimate/_sharding.py`, and `helpers.plan.fewest_cards` finds how many cards of a kind a job needs.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from helpers._util import GIB, MIB
from helpers.catalog import gpu_bytes
from helpers.estimate import Estimate, estimate_training_memory, shape_of
from helpers.job import SHARDING, JobSettingError, TrainingJob, job_settings

__all__ = [
    "Cards",
    "accumulation_for",
    "decoder_layers",
    "fewest_cards",
    "rank_table",
    "shard",
    "step_peak",
    "traffic_per_step",
]

MOST_CARDS = 64  # fewest_cards looks this far: eight nodes of eight GPUs


@dataclass
class Cards:
    """How many cards of a kind a job needs (`fewest_cards`): `count` (None when even `most` cards cannot hold
    it), the sharding that gets there, the estimate of one card's share there, and one card's estimate alone."""

    model: str
    gpu: object
    count: int | None
    sharding: str
    estimate: Estimate  # one card's share at `count` cards (at `most` when none is enough)
    alone: Estimate  # the job on one card
    most: int

    def __str__(self) -> str:
        s = self.alone.settings
        card = f"{self.gpu}s" if isinstance(self.gpu, str) else f"{self.gpu:g} GiB each"
        job = f"{self.model}, {s['method']}, {s['per_device_batch']} x {s['seq_len']:,} tokens"
        usable = gpu_bytes(self.gpu) / GIB
        if self.count == 1:
            return f"{job}: one card holds it ({self.alone.total / GIB:.2f} GiB of {usable:.2f} GiB)"
        if self.count is not None:
            batch = s["per_device_batch"] * s["grad_accum_steps"]  # the job's effective batch on one card
            per_step = s["per_device_batch"] * self.count  # every card's micro-batch: the effective batch's unit
            try:
                keep = f"grad_accum_steps {accumulation_for(batch, s['per_device_batch'], self.count)} keeps its "
                keep += f"effective batch of {batch}"
            except JobSettingError:  # the job's effective batch is not a multiple of the cards' micro-batches
                accum = max(1, round(batch / per_step))
                keep = (
                    f"its effective batch of {batch} is not a multiple of the {per_step} sequences a micro-batch on "
                    f"every card takes: grad_accum_steps {accum} gives {accum * per_step} "
                    "(tune the learning rate to it)"
                )
            return (
                f"{job}: {self.count} cards ({card}), fully sharded: {self.estimate.total / GIB:.2f} GiB of "
                f"{usable:.2f} GiB on each (one card alone would need {self.alone.total / GIB:.2f} GiB); {keep}"
            )
        e = self.estimate
        kept = e.activations + max(e.logits, e.backward_transient) + e.all_gather
        return (
            f"{job}: {self.most} cards ({card}) fully sharded still need {e.total / GIB:.2f} GiB each of "
            f"{usable:.2f} GiB: sharding splits weights, gradients and optimizer states, not the activations "
            f"and gathered layers ({kept / GIB:.2f} GiB on every card); use gradient checkpointing, a smaller "
            f"per-device batch, a shorter seq_len or QLoRA (python -m helpers plan shows the ladder)"
        )


def fewest_cards(model, gpu, job: TrainingJob | None = None, /, *, most: int = MOST_CARDS, **settings) -> Cards:
    """The fewest cards of kind `gpu` that hold the job with the estimator's known error to spare (verdict
    "fits"): one card as asked, else 2, 3, ... `most` cards fully sharded (FSDP's full shard, ZeRO-3).

    model, job, settings: as `helpers.estimate.estimate_training_memory` takes them (world_size and
    sharding are set here). gpu: a catalog card ("T4") or GiB. Taught in notebook 07.

    Example:
        >>> print(fewest_cards("Llama-2-7B", "T4", method="full", per_device_batch=1, seq_len=1024,
        ...                    checkpointing=True))  # doctest: +SKIP
    """
    if isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= 4096:
        raise JobSettingError(f"most={most!r}: pass the most cards to consider, a whole number from 1 to 4,096")
    shape, card = shape_of(model), gpu_bytes(gpu)
    extra = {k: settings.pop(k) for k in ("harness", "device") if k in settings}
    named = {"gpu": gpu} if isinstance(gpu, str) else {}
    asked = job_settings(job, caller="fewest_cards", **settings)
    alone = estimate_training_memory(shape, asked, world_size=1, sharding="none", **named, **extra)
    name = model if isinstance(model, str) else shape.name or "the model"
    if alone.verdict(card) == "fits":
        return Cards(name, gpu, 1, "none", alone, alone, most)
    e = alone
    for n in range(2, most + 1):
        e = estimate_training_memory(shape, asked, world_size=n, sharding="full", **named, **extra)
        if e.verdict(card) == "fits":
            return Cards(name, gpu, n, "full", e, alone, most)
    return Cards(name, gpu, None, "full", e, alone, most)


def decoder_layers(model) -> list:
    """The model's repeated blocks (LlamaDecoderLayer, Qwen2DecoderLayer, ...), in order: FSDP's units.

    Read from transformers' `_no_split_modules` (the blocks it never splits across devices), through a
    peft wrapper. Raises ValueError naming the model's class when it lists none, with the fix."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(base).__name__} names no repeated blocks in _no_split_modules, so there is nothing to shard "
            "layer by layer: pass the blocks yourself, e.g. fully_shard(block) for block in model.model.layers"
        )
    return layers


def shard(model, sharding: str):
    """`model` wrapped for data parallel ("none": DistributedDataParallel) or sharded with FSDP2 ("full": every
    decoder layer, then the model, each `fully_shard`-ed; "grad_op": the same, kept gathered from the forward to
    the backward). Notebook 07 writes this out; call it in every process, after `init_process_group`.

    Raises JobSettingError for an unknown strategy, or for sharding without a process group of two or more."""
    import torch.distributed as dist

    if sharding not in SHARDING:
        raise JobSettingError(f"sharding={sharding!r} is not one of {', '.join(map(repr, SHARDING))}")
    if not dist.is_initialized():
        raise JobSettingError(
            "no process group: call torch.distributed.init_process_group(...) in every process first "
            "(torchrun or accelerate's notebook_launcher start them and set RANK and WORLD_SIZE)"
        )
    if sharding == "none":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if dist.get_world_size() < 2:
        raise JobSettingError(
            f"sharding={sharding!r} on one process splits nothing: launch 2 or more (one per GPU), or sharding='none'"
        )
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):  # each layer gathered on its own while it runs
        fully_shard(layer, reshard_after_forward=sharding == "full")
    return fully_shard(model, reshard_after_forward=sharding == "full")


@contextmanager
def step_peak(device=None):
    """Measure the most allocated inside the block, above what was allocated at its start, in bytes.

    On a GPU: torch.cuda's peak since the block began, less what was allocated at its start. On CPU:
    torch's CPU allocator, read from its profiler (`helpers._cpu_peak`). Both count every tensor:
    the activations, the gathered weights, the gradients and the optimizer's step.

    Example:
        >>> with step_peak() as peak:  # doctest: +SKIP
        ...     model(**batch).loss.backward(); optimizer.step()
        >>> peak.bytes  # doctest: +SKIP
    """
    import torch

    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    result = _Peak()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            yield result
        finally:
            torch.cuda.synchronize(device)
            result.bytes = torch.cuda.max_memory_allocated(device) - start
        return
    from helpers._cpu_peak import track_allocations

    with track_allocations() as allocated:
        yield result
    result.bytes = allocated.peak


class _Peak:
    bytes: int = 0


def accumulation_for(effective_batch: int, per_device_batch: int, world_size: int) -> int:
    """The grad_accum_steps that keep `effective_batch` sequences per optimizer step on `world_size` GPUs, each
    taking `per_device_batch` per micro-batch: effective batch = per_device_batch x grad_accum_steps x world_size.

    Raises JobSettingError when the ranks cannot share it evenly, naming the GPU counts and batches that work.

    Example:
        >>> accumulation_for(16, 1, 4)
        4
    """
    for name, value in (("effective_batch", effective_batch), ("per_device_batch", per_device_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobSettingError(f"{name}={value!r}: pass a whole number of sequences, 1 or more")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise JobSettingError(f"world_size={world_size!r}: pass the number of GPUs, 1 or more")
    per_step = per_device_batch * world_size  # sequences one micro-batch of every GPU adds
    if effective_batch % per_step == 0:
        return effective_batch // per_step
    counts = [
        n for n in range(1, effective_batch // per_device_batch + 1) if effective_batch % (per_device_batch * n) == 0
    ]
    below = max((n for n in counts if n < world_size), default=None)  # the nearest GPU counts that share it evenly
    above = min((n for n in counts if n > world_size), default=None)
    near = " or ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in (below, above) if n)
    batches = [b for b in (effective_batch // per_step * per_step, (effective_batch // per_step + 1) * per_step) if b]
    why = (
        f"is less than one micro-batch of every GPU ({per_step} sequences: per_device_batch {per_device_batch} x "
        f"{world_size} GPUs)"
        if effective_batch < per_step
        else f"does not split over {world_size} GPUs taking per_device_batch {per_device_batch} each ({per_step} "
        "sequences a micro-batch)"
    )
    raise JobSettingError(
        f"an effective batch of {effective_batch} {why}: use {near + ', or ' if near else ''}an effective batch of "
        f"{' or '.join(map(str, batches))} (grad_accum_steps {' or '.join(str(b // per_step) for b in batches)})"
    )


def traffic_per_step(sharding: str, world_size: int, weight_bytes: int, gradient_bytes: int) -> int:
    """Bytes one GPU sends per optimizer step (one micro-batch), as ring collectives move them.

    Data parallel all-reduces the gradients: 2 (N-1)/N of their bytes. Full sharding all-gathers the
    weights twice (the forward, and again for the backward) and reduce-scatters the gradients: (N-1)/N
    of each, 1.5 times data parallel's bytes when weights and gradients are the same size. grad_op
    gathers the weights once.

    weight_bytes, gradient_bytes: the whole model's (one GPU's in data parallel), not a shard's.
    """
    if sharding not in SHARDING:
        raise JobSettingError(f"sharding={sharding!r} is not one of {', '.join(map(repr, SHARDING))}")
    if world_size < 1:
        raise JobSettingError(f"world_size={world_size!r}: pass the number of GPUs, 1 or more")
    share = (world_size - 1) / world_size  # what leaves this GPU in a ring: all but its own part
    gathers = {"none": 0, "full": 2, "grad_op": 1}[sharding]
    reduce = 2 * gradient_bytes if sharding == "none" else gradient_bytes  # all-reduce = reduce-scatter + all-gather
    return round(share * (gathers * weight_bytes + reduce))


def rank_table(rows: list[dict]) -> str:
    """The per-rank table: for each row (a dict with `run`, `rank` and, for each of weights, gradients,
    optimizer and peak, the measured bytes and `<name>_estimate`), measured / estimated in MiB."""
    names = ("weights", "gradients", "optimizer", "peak")
    header = f"{'run':24} {'rank':>4} " + " ".join(f"{n + ' (meas./est.)':>22}" for n in names)
    lines = [header, "-" * len(header)]
    for row in rows:
        cells = [f"{row[n] / MIB:9.3f} /{row[n + '_estimate'] / MIB:9.3f}" for n in names]
        lines.append(f"{row['run']:24} {row['rank']:>4} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines) + "\n(MiB; peak: the step's most allocated above what is held between steps)"
