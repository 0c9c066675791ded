"""The training-memory estimator: what a fine-tune needs before it starts, line by line.

Taught in notebook 01 (memory anatomy), used by 03 (the OOM it predicts), 05 (the 7B plan) and by
`helpers.plan` (`python -m helpers plan`). Pure Python on purpose: it answers for a 7B in
milliseconds without importing torch, and works offline from the shipped catalogs
(`helpers.catalog`).

`activations` is the bytes autograd keeps for backward over one micro-batch's forward pass, each
storage once, parameters excluded: exactly what saved-tensor hooks see
(`helpers.saved_tensors.track_saved_tensors`). On a GPU the peak also holds what is not saved for
backward: the logits and their fp32 upcast at the end of the forward, what the training loop keeps
of the model's output, the gradients flowing back through one layer, one recomputed layer during a
checkpointed backward, the optimizer's temporaries during its step, the CUDA context and what the
caching allocator reserves. Those are separate lines, each a stated constant or formula.

One module per family of terms, each private to this package:

| module | what it counts |
|---|---|
| `_shapes` | the model: a catalog name, a config.json, a Hub id or a config, read into a `Shape` |
| `_fields` | each field of a config as it is read: a whole number in range, a probability; `ModelConfigError` |
| `_job` | the job as counted (`Job`: a `helpers.job.TrainingJob` on a model and a card), the byte sizes, `Harness` |
| `_weights` | the stored weights and the loading peak |
| `_optimizer` | the gradients, the optimizer's states and its step's temporaries |
| `_activations` | what each layer, and the embeddings, final norm and loss, save for backward |
| `_head` | the logits, the loss's gradients, and what a loop keeps of the output |
| `_allocator` | the CUDA context, the caching allocator's reserve, the verdict's margin |
| `_versions` | the terms the installed transformers, peft and bitsandbytes decide, each with its release |
| `_screen` | what nvidia-smi shows beyond the reserve: the CUDA context, NCCL's buffers |
| `_breakdown` | the `Estimate`: which lines are alive at once, and the verdict on a card |
| `_step` | one step's estimate, assembled from the terms above |
| `_run`, `_run_estimate` | a whole run: batch lengths, the caching allocator replayed over them, `RunEstimate` |

docs/estimator-accuracy.md holds the estimator against published GPU measurements
(scripts/bench_estimator.py reruns it).
"""

from __future__ import annotations

import functools

from helpers.estimate._allocator import ACTIVATION_SLACK, ALLOCATOR_SLACK, CUDA_CONTEXT_BYTES, SAFETY_MARGIN
from helpers.estimate._breakdown import Estimate
from helpers.estimate._fields import ModelConfigError
from helpers.estimate._job import (
    ADAMW_FAMILY,
    COMPUTE_BYTES,
    FP32_BYTES,
    HALF_BYTES,
    OPTIMIZER_BYTES,
    WEIGHT_BYTES,
    Harness,
    Job,
)
from helpers.estimate._run import BATCHINGS, expandable_in_environment
from helpers.estimate._run_estimate import RunEstimate, run_estimate
from helpers.estimate._shapes import LINEAR_TARGETS, Shape, shape_of
from helpers.estimate._step import step_estimate
from helpers.estimate._versions import harness_for, installed_versions
from helpers.job import LOOPS, PRECISIONS, TrainingJob, job_settings

__all__ = [
    "ADAMW_FAMILY",
    "ACTIVATION_SLACK",
    "ALLOCATOR_SLACK",
    "COMPUTE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "FP32_BYTES",
    "HALF_BYTES",
    "LINEAR_TARGETS",
    "LOOPS",
    "OPTIMIZER_BYTES",
    "PRECISIONS",
    "SAFETY_MARGIN",
    "WEIGHT_BYTES",
    "BATCHINGS",
    "Estimate",
    "Harness",
    "ModelConfigError",
    "RunEstimate",
    "Shape",
    "TrainingJob",
    "estimate_run_memory",
    "estimate_training_memory",
    "shape_of",
]


def estimate_training_memory(
    model,
    job: TrainingJob | None = None,
    /,
    *,
    gpu: str | None = None,
    device: str = "cuda",
    harness: Harness | None = None,
    **settings,
) -> Estimate:
    """Estimate the memory of one training step, in bytes, before anything is loaded.

    Args:
        model: a catalog name ("Mistral-7B", "Qwen3-0.6B"), a path to a config.json or its folder,
            a Hub id ("Qwen/Qwen3-32B": only its config.json is fetched, when the Hub answers; a
            catalog model's id, "Qwen/Qwen3-14B", needs no network), a transformers config, or a
            config dict. Families: Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, GPT-NeoX, GPT-2, BERT.
        job: the job's settings (`helpers.job.TrainingJob`); or pass them by keyword, the same
            names: per_device_batch and seq_len (tokens = per_device_batch x seq_len; `batch_size`
            is per_device_batch's older name), precision (None: the card's half precision, bf16
            without a card; "bf16-true" / "fp16-true": everything in 16 bits), weights, method
            ("full", "lora", "qlora"), lora_r, lora_targets, lora_dropout, double_quant, optimizer
            (also TrainingArguments' names), checkpointing, fused_loss, loop ("trainer", "custom":
            a hand-written `outputs = model(**batch)` loop that keeps the logits through backward,
            "litgpt"), grad_accum_steps, attn_impl. Keywords given beside a job replace its fields.
            `TrainingJob`'s docstring says what each one means.
        gpu: the catalog card it runs on ("T4", "A100-40GB"): its compute capability decides the
            precision when none is asked and the attention kernel (no flash attention below 8.0, so
            grouped key/value heads run SDPA's math kernel on a T4, which materializes the scores).
            None: a card of capability 8.0 or newer.
        device: "cuda" (default) or "cpu": dropout masks and the attention kernel differ.
        harness: facts about a training harness other than the kit's (`Harness`: PyTorch 1.x's
            zeroed gradients, bitsandbytes before 0.44, Lightning's quantized head, litgpt's chunked
            loss, a measured CUDA context); only scripts/bench_estimator.py needs them.

    Returns:
        an Estimate: weights, gradients, optimizer, activations, logits, recompute, cuda_context,
        allocator_slack, load_peak in bytes, and `allocated` / `reserved` / `total` / `load_total`,
        `fits(gpu)` and `verdict(gpu)` ("fits", "borderline" or "does not fit"); `context_note` says
        a seq_len past a rotary model's trained context ("" within it), and `verdict_line` with it.

    Raises:
        ModelConfigError (a ValueError): a config field the estimator cannot use (0 heads, a size
            written as text, a dropout of 1.5), naming the field, the value, where it came from and the fix.
        helpers.job.JobSettingError: a setting that cannot be used, or a seq_len past a learned
            position table (GPT-2's 1,024, BERT's 512).

    Example:
        >>> e = estimate_training_memory("Mistral-7B", per_device_batch=1, seq_len=512, method="qlora",
        ...                              checkpointing=True)
        >>> e.fits("T4")
        True
    """
    settings = job_settings(job, caller="estimate_training_memory", **settings)
    return step_estimate(_resolve(model, settings, gpu=gpu, device=device, harness=harness))


def estimate_run_memory(
    model,
    job: TrainingJob | None = None,
    /,
    *,
    lengths,
    batching: str = "dynamic",
    shuffle: bool = True,
    pad_to_multiple_of: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    expandable_segments: bool | None = None,
    empty_cache_every: int | None = None,
    gpu: str | None = None,
    device: str = "cuda",
    harness: Harness | None = None,
    **settings,
) -> RunEstimate:
    """Estimate a whole run's peak memory over real data, before it starts (notebook 03).

    One step's estimate (`estimate_training_memory`) is one batch shape. Over a run of
    variable-length batches the caching allocator keeps the blocks of shorter steps cached where a
    longer step cannot use them, so the reserve grows past what the longest step needs alone: a
    plan that says "fits" for one step can run out at step 300. This replays the run's requests,
    batch by batch, through the allocator's policy (`helpers._caching_allocator`), anchored to the
    one-step estimate (`helpers/estimate/_run.py` says how).

    Args:
        model, job, gpu, device, harness, **settings: as `estimate_training_memory`; seq_len is the
            run's max_length (sequences are cut there).
        lengths: each example's token count, e.g. `[len(ids) for ids in tokenized["input_ids"]]`.
        batching: "dynamic" (each batch padded to its longest: the kit's collator), "padded" (every
            batch to seq_len) or "packed" (sequences joined into seq_len blocks).
        pad_to_multiple_of: the collator's rounding of a dynamic batch's length (8 on tensor cores).
        shuffle: draw the examples in a seeded random order, as the Trainer's sampler does; False:
            in the order given (a run sorted by length, or one replayed batch by batch).
        steps: micro-batches to replay (None: one epoch; later epochs reshuffle). About 1,000 a
            second for a 7B in pure Python.
        seed: the shuffle's seed: the order of lengths decides what the allocator strands.
        expandable_segments: the run's allocator has PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True:
            segments grow in place, and the run reserves little above its peak allocation. None:
            as this process's PYTORCH_CUDA_ALLOC_CONF says (`helpers.start()` sets it on one GPU).
        empty_cache_every: the run calls torch.cuda.empty_cache() after every this many steps.

    Returns:
        a RunEstimate: `lengths`, `allocated`, `reserved` (the running peak) and `after` (right after
        each step) per step, `peak_reserved`, `worst_step`
        (the step that sets the reserve), `history` (what the order of lengths adds), `longest` (the
        one-step Estimate at the longest batch), `out_of_memory` (the step the card runs out at, with
        a gpu), `verdict(gpu)` and `line(gpu)`.

    Example:
        >>> run = estimate_run_memory("Qwen2.5-0.5B", lengths=[120, 900, 40, 512] * 50, seq_len=1024,
        ...                           per_device_batch=4, gpu="T4", method="lora", checkpointing=True)
        >>> run.peak_reserved >= run.longest.reserved
        True
    """
    settings = job_settings(job, caller="estimate_run_memory", **settings)
    resolved = _resolve(model, settings, gpu=gpu, device=device, harness=harness)
    if expandable_segments is None:
        expandable_segments = expandable_in_environment()
    return run_estimate(
        resolved,
        lengths,
        batching=batching,
        shuffle=shuffle,
        pad_to_multiple_of=pad_to_multiple_of,
        steps=steps,
        seed=seed,
        expandable_segments=expandable_segments,
        empty_cache_every=empty_cache_every,
    )


@functools.cache
def _installed() -> tuple[tuple[str, str | None], ...]:
    return tuple(installed_versions().items())  # read once a process: the libraries do not change under it


def _resolve(model, settings: TrainingJob, *, gpu, device: str, harness: Harness | None) -> Job:
    """The estimator's job: the model's shape, the card, the device, and the harness facts, from this
    process's transformers, peft and bitsandbytes when none are given (`_versions`: the releases that
    changed what a step holds)."""
    shape = shape_of(model)
    if harness is None:
        harness = harness_for(dict(_installed()), model_type=shape.family)
    return Job.of(settings, shape, gpu=gpu, device=device, harness=harness)
