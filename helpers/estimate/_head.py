"""The head and the loop: the logits, the loss's gradients, and what a training loop keeps of the output.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy, which measures both loops).
The logits and their fp32 upcast exist at the end of the forward and the loss's gradients at the
start of the backward, whatever the loop. What happens to the model's output then depends on the
loop (`_job.LOOPS`): the Trainer lets it go before backward; a hand-written loop that binds it to a
name (`outputs = model(**batch)`) keeps it through backward and the optimizer's step, and into the
next forward. Pure Python: no torch.
"""

from __future__ import annotations

from helpers.estimate._activations import Forward, quant_kept_inputs
from helpers.estimate._job import FP32_BYTES, Job

__all__ = ["forward_logits", "held_output", "kv_cache", "logits_moment", "loss_moments"]


def _head_dequant(job: Job) -> float:
    """A quantized head's weight, dequantized (with its fp32 scales) each time the head runs, forward and backward."""
    return (
        (job.dequant_bytes + FP32_BYTES / 64) * job.shape.vocab * job.shape.hidden if job.harness.quantize_head else 0
    )


def logits_moment(job: Job) -> int:
    """3b. the logits at the end of the forward and the fp32 upcast that the loss reads (not saved),
    then the loss's gradients at the start of the backward; a quantized head's dequantized weight."""
    shape, n, head = job.shape, job.per_device_batch * job.seq_len, _head_dequant(job)
    if job.fused_loss and shape.head == "lm":  # one chunk of logits at a time: negligible beside the rest
        return head
    if shape.head == "classifier":
        rows = job.per_device_batch if shape.family == "bert" else n
        return rows * shape.num_labels * (job.compute + FP32_BYTES)
    if job.harness.loss_chunk:  # the fp32 logits stay whole; the loss's gradients (two fp32, one cast back) per chunk
        chunk = job.per_device_batch * min(job.harness.loss_chunk, job.seq_len)
        return n * shape.vocab * FP32_BYTES + chunk * shape.vocab * (2 * FP32_BYTES + job.compute) + head
    return max(loss_moments(job)) + head


def loss_moments(job: Job) -> tuple[int, int]:
    """A causal LM's loss beside the activations: (the end of the forward, the start of the backward).

    The end of the forward holds the logits the model returned (a loop that keeps them counts them
    in its held output instead), their fp32 upcast and the shifted copy, as the release upcasts and
    shifts them (`Harness.logits_upcast`, `logits_shift_copy`); the start of the backward, the loss's
    gradient and log_softmax's input gradient over the positions the loss reads, fp32 unless the loss
    ran in 16 bits. Measured on the CPU allocator with transformers 4.45.2, 4.46.0, 4.48.3 and 4.49.0
    (`_versions`).
    """
    h, c, vocab, b = job.harness, job.compute, job.shape.vocab, job.per_device_batch
    n = b * job.seq_len
    rows = b * (job.seq_len - 1) if h.logits_shift_copy else n  # the positions the loss reads
    mixed = c != FP32_BYTES and not job.true_half  # autocast runs cross_entropy in fp32
    # 1. the logits as the forward returned them: fp32 where it upcast them, else the compute dtype
    returned = n * (FP32_BYTES if h.logits_upcast == "forward" else c)
    # 2. the loss's fp32 upcast of all of them, or cross_entropy's autocast cast of the rows it reads
    upcast = FP32_BYTES * {"loss": n, "none": rows if mixed else 0}.get(h.logits_upcast, 0) * (c != FP32_BYTES)
    # 3. the shifted copy, in the dtype the loss shifted
    shift = rows * {"fp32": FP32_BYTES, "compute": c, None: 0}[h.logits_shift_copy]
    grad = FP32_BYTES if h.logits_upcast != "none" or mixed else c
    forward_end = (returned * (job.loop != "custom") + upcast + shift) * vocab
    return forward_end, 2 * grad * rows * vocab


def forward_logits(job: Job) -> int:
    """3c. the logits as the forward returns them, before the loss: in the compute dtype beside their
    fp32 upcast (the loss reads fp32), or the 16-bit logits beside a quantized head's dequantized weight."""
    shape, head = job.shape, _head_dequant(job)
    if job.fused_loss and shape.head == "lm":
        return head
    rows = job.per_device_batch if shape.family == "bert" else job.per_device_batch * job.seq_len
    elements = rows * (shape.num_labels if shape.head == "classifier" else shape.vocab)
    upcast = elements * FP32_BYTES if job.compute != FP32_BYTES else 0
    return elements * job.compute + max(upcast, head)


def kv_cache(job: Job, f: Forward) -> int:
    """The key/value cache a decoder returns when its config says `use_cache` (transformers' default).

    It holds each layer's key and value, the tensors attention saved for backward: nothing more at
    the end of the forward, but a loop that keeps the output keeps them after backward frees what
    attention saved, and through the next forward. In the rotated key's dtype (fp32 under autocast,
    where rotary reads the fp32 residual's cos/sin). Gradient checkpointing turns the cache off in
    training; an encoder has none.
    """
    s = job.shape
    if not s.use_cache or job.checkpointing or s.family == "bert":
        return 0
    key_bytes = f.resid if s.rotary else f.compute
    return 2 * s.layers * f.tokens * s.kv_heads * s.head_dim * key_bytes


def held_output(job: Job, f: Forward) -> int:
    """What the loop keeps of the model's output (`Job.loop`), beyond what the Trainer keeps: nothing.

    "custom": `outputs = model(**batch)` binds the output until the next forward returns: its
    logits in the head's output dtype (fp32 where the forward upcast them, `Harness.logits_upcast`),
    its key/value cache, and its graph, of which backward released what it saved but not the
    inputs kept on a 4-bit linear's ctx (`quant_kept_inputs`).
    "litgpt": `logits = model(x)` keeps the logits, fp32 as the chunked loss read them, and the graph.
    """
    if job.loop == "trainer":
        return 0
    lm = job.shape.head == "lm" and not job.fused_loss
    if job.loop == "litgpt":
        return (FP32_BYTES * f.tokens * job.shape.vocab if lm else 0) + quant_kept_inputs(job, f)
    rows = job.per_device_batch if job.shape.family == "bert" else f.tokens
    width = job.shape.vocab if job.shape.head == "lm" else job.shape.num_labels
    upcast = job.shape.head == "lm" and job.harness.logits_upcast == "forward"  # the forward returned fp32 logits
    logits = (FP32_BYTES if upcast else f.compute) * rows * width
    return logits + kv_cache(job, f) + quant_kept_inputs(job, f)
