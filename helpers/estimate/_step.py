"""One training step's estimate, assembled from the terms: the four numbered steps of notebook 01.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy): `estimate_training_memory`
resolves the job and calls `step_estimate`; `_run_estimate` calls it once per batch length of a run.
Pure Python: no torch.
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
from helpers.estimate._allocator import CUDA_CONTEXT_BYTES, allocator_slack
from helpers.estimate._breakdown import Estimate, past_context
from helpers.estimate._head import forward_logits, held_output, logits_moment
from helpers.estimate._job import Job
from helpers.estimate._optimizer import gradients, optimizer_states, optimizer_step
from helpers.estimate._screen import nccl_buffers
from helpers.estimate._shapes import adapter_shapes, adapts_head
from helpers.estimate._sharding import rank_share, sharded_activations
from helpers.estimate._weights import load_peak, stored_weights

__all__ = ["forward_of", "saved_for_backward", "step_estimate"]


def step_estimate(job: Job) -> Estimate:
    """The estimate of one step of `job`; on a card with the CUDA context and the allocator's reserve."""
    e = _estimate(job)
    if job.device == "cuda":
        context = job.harness.cuda_context_bytes
        e.cuda_context = CUDA_CONTEXT_BYTES if context is None else int(context)
        f = forward_of(job)
        e.allocator_slack = allocator_slack(e.allocated, e.activations, f.scores if f.math_path else 0)
        e.nccl_buffers = nccl_buffers(job.world_size)
    return e


def _estimate(job: Job) -> Estimate:
    """The four numbered steps, on the allocator's view (the caller adds the CUDA lines)."""
    shape, f, trainable = job.shape, forward_of(job), job.trainable
    parts, layer = saved_for_backward(job, f)  # 3.
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


def forward_of(job: Job) -> Forward:
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


def saved_for_backward(job: Job, f: Forward) -> tuple[dict[str, int], dict[str, int]]:
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
