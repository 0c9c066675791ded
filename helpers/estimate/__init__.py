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
| `_breakdown` | the `Estimate`: which lines are alive at once, and the verdict on a card |

docs/estimator-accuracy.md holds the estimator against published GPU measurements
(scripts/bench_estimator.py reruns it).
"""

from __future__ import annotations

from dataclasses import replace

from helpers.estimate._activations import (
    Adapters,
    Forward,
    backward_transient,
    layer_activations,
    outside_layers,
    quant_kept_inputs,
    recomputed_scores,
    weight_casts,
)
from helpers.estimate._allocator import (
    ACTIVATION_SLACK,
    ALLOCATOR_SLACK,
    CUDA_CONTEXT_BYTES,
    SAFETY_MARGIN,
    allocator_slack,
)
from helpers.estimate._breakdown import Estimate, past_context
from helpers.estimate._fields import ModelConfigError
from helpers.estimate._head import forward_logits, held_output, logits_moment
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
from helpers.estimate._optimizer import gradients, optimizer_states, optimizer_step
from helpers.estimate._shapes import LINEAR_TARGETS, Shape, adapter_shapes, adapts_head, shape_of
from helpers.estimate._sharding import rank_share, sharded_activations
from helpers.estimate._weights import load_peak, stored_weights
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
    "Estimate",
    "Harness",
    "ModelConfigError",
    "Shape",
    "TrainingJob",
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
    job = Job.of(settings, shape_of(model), gpu=gpu, device=device, harness=harness)
    e = _estimate(job)
    if job.device == "cuda":
        context = job.harness.cuda_context_bytes
        e.cuda_context = CUDA_CONTEXT_BYTES if context is None else int(context)
        f = _forward(job)
        e.allocator_slack = allocator_slack(e.allocated, e.activations, f.scores if f.math_path else 0)
    return e


def _estimate(job: Job) -> Estimate:
    """The four numbered steps, on the allocator's view (the caller adds the CUDA lines)."""
    shape, f, trainable = job.shape, _forward(job), job.trainable
    parts, layer = _saved_for_backward(job, f)  # 3.
    parts = sharded_activations(job, parts)
    held = held_output(job, f) if job.loop == "litgpt" else 0
    # the AdamW family keeps its moments in the parameter's dtype; 8-bit optimizers in 8 bits whatever it is
    weights = stored_weights(job)
    # one GPU's share when several train the job together, and the buffers data parallel or sharding adds
    share = rank_share(job, weights, gradients(job), optimizer_states(job), optimizer_step(job))
    return Estimate(
        weights=int(share.weights),  # 1.
        gradients=int(share.gradients),  # 2. in the trainable parameters' dtype
        optimizer=int(share.optimizer),
        activations=int(sum(parts.values())),
        logits=int(logits_moment(job)),
        recompute=int(sum(layer.values()) + recomputed_scores(f)) if job.checkpointing else 0,
        cuda_context=0,
        allocator_slack=0,
        trainable=trainable,
        parameters=shape.parameters,
        settings=job.settings(),
        attention=f.kernel,
        activation_parts={k: int(v) for k, v in parts.items()},
        backward_transient=int(backward_transient(f, job.dequant_bytes if job.quantized else 0)),
        optimizer_step=int(share.optimizer_step),  # 4.
        ddp_buckets=share.ddp_buckets,
        all_gather=share.all_gather,
        reduce_scatter=share.reduce_scatter,
        grads_in_forward=job.grad_accum_steps > 1 or not job.harness.set_to_none,
        # autocast caches the 16-bit copy of every trainable fp32 weight until the forward's autocast
        # region ends; without checkpointing the copies are saved anyway (the "weight casts" lines)
        autocast_cache=(
            job.compute * shape.parameter_counts()["linear"]
            if job.autocast and job.checkpointing and job.method == "full" and job.sharding == "none"
            else 0
        ),
        # sharded, each process loads the model into CPU memory (or onto the meta device) and moves only its shard
        # to the GPU, as accelerate's FSDP loading does; data parallel loads the whole model onto every GPU
        load_peak=int(load_peak(job, weights)) if job.sharding == "none" else share.weights,
        previous_output=int(held),
        forward_end=int(sum(parts.values()) - parts.get("loss log-probs", 0) + forward_logits(job) + held) * (held > 0),
        output_held=int(held_output(job, f)) if job.loop == "custom" else 0,
        context_note=past_context(shape, job.seq_len),
    )


def _forward(job: Job) -> Forward:
    return Forward(
        shape=job.shape,
        per_device_batch=job.per_device_batch,
        seq_len=job.seq_len,
        compute=job.compute,
        autocast=job.autocast,
        device=job.device,
        quantized=job.quantized,
        dtype=job.base_dtype,
        capability=job.capability,
        pinned=job.harness.sdpa_kernel,
    )


def _saved_for_backward(job: Job, f: Forward) -> tuple[dict[str, int], dict[str, int]]:
    """3. activations by component, and what one layer saves (a checkpointed backward recomputes it)."""
    shape, adapters = job.shape, None
    if job.method != "full":
        adapters = Adapters(
            targets=frozenset(adapter_shapes(shape, job.lora_targets)),
            r=job.lora_r,
            dropout=job.lora_dropout,
            adapter_bytes=job.param_bytes,
            keeps_input=job.harness.quant_keeps_input and job.quantized,
            cast_under_autocast=not job.quantized,
        )
    layer = layer_activations(f, adapters)
    first = layer if job.first_grad else layer_activations(f, adapters, input_grad=False)
    parts = {k: v * (shape.layers - 1) + first.get(k, 0) for k, v in layer.items() if v}
    if job.checkpointing:  # only each layer's inputs survive the forward
        parts = {"layer inputs (checkpointed)": shape.layers * f.resid * f.tokens * shape.hidden}
        if shape.family == "gpt2" and shape.attn_impl == "eager":  # its causal mask is an input too
            parts["attention mask"] = f.resid * job.per_device_batch * job.seq_len * job.seq_len
        if quant_kept_inputs(job, f):  # not saved tensors: checkpointing does not drop them
            parts["4-bit inputs (kept on ctx)"] = quant_kept_inputs(job, f)
    pooler = None  # with "all-linear", peft adapts BERT's pooler too
    if adapters is not None and shape.family == "bert" and job.lora_targets == "all-linear":
        pooler = replace(adapters, targets=frozenset({"pooler"}))
    head = None  # LoRA on the LM head (peft's "lm_head" target)
    if adapters is not None and shape.head == "lm" and adapts_head(job.lora_targets):
        head = replace(adapters, targets=frozenset({"head"}))
    parts.update(
        outside_layers(f, checkpointing=job.checkpointing, frozen=adapters is not None, pooler=pooler, head=head)
    )
    if not job.first_grad:  # the embeddings' dropout and BERT's embedding norm act on a tensor without grad
        parts.pop("embedding dropout", None)
        parts.pop("embedding norm", None)
    parts.update(weight_casts(job, pooler is not None, head is not None))
    if job.fused_loss and shape.head == "lm":  # no log-probs: the loss's gradient for the head's input instead
        del parts["loss log-probs"]
        parts["fused loss (input gradient)"] = job.compute * job.per_device_batch * job.seq_len * shape.hidden
    return parts, layer
