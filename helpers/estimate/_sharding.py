"""One GPU's share of a job that several GPUs train together: data parallel, or sharded.

Private to `helpers.estimate` (taught in notebook 07, Kaggle T4 x2: what each card holds; used by
`helpers.plan.fewest_cards`). The other modules count one GPU's whole job; this one says what each
of `world_size` GPUs holds of it under a sharding strategy (`helpers.job.SHARDING`), and the buffers
the strategy adds, as PyTorch builds them:

- "none", data parallel (`DistributedDataParallel`): every GPU holds everything, and DDP's gradient
  buckets beside the gradients, as large as they (gradient_as_bucket_view=False, DDP's and
  accelerate's default), from the wrapping on.
- "full" (FSDP2's `fully_shard` on every decoder layer and on the model, FSDP's FULL_SHARD, ZeRO-3):
  each parameter split by rows over the GPUs, its gradient and optimizer states with it. While a layer
  runs its weights are gathered whole: the one running and the one whose gather is in flight (FSDP
  prefetches the next), each briefly twice (the gather's flat output, copied out into the parameters).
  The model's own unit, everything outside the layers (embeddings, head, final norm), stays gathered
  from the forward to the end of the backward: FSDP2 does not reshard the root after the forward. In
  the backward each layer's gradients exist whole, and again as the reduce-scatter's flat input, until
  they are reduced to this GPU's share.
- "grad_op" (`fully_shard(reshard_after_forward=False)`, SHARD_GRAD_OP, like ZeRO-2): as "full", but
  every layer stays gathered from its forward to its backward, so the whole model is there at once.

Sharded in mixed precision, FSDP casts the weights itself (`MixedPrecisionPolicy(param_dtype=...)`, as
accelerate's FSDP plugin sets it): they are gathered in 16 bits and the gradients reduced in 16 bits,
and autocast has no fp32 weight to cast, so no 16-bit copies are cached or saved (`sharded_activations`).

A parameter split by rows is padded to a multiple of world_size rows; the padding (under world_size
rows a parameter) is not counted. Pure Python: no torch.
"""

from __future__ import annotations

import math

from helpers.estimate._job import FP32_BYTES, Job
from helpers.job import JobSettingError

__all__ = ["RankShare", "rank_share", "sharded_activations"]


class RankShare:
    """One GPU's weights, gradients and optimizer states, and the buffers its strategy adds, in bytes."""

    def __init__(self, job: Job, weights: float, gradients: float, optimizer: float, step: float):
        n, strategy = job.world_size, job.sharding
        split = (lambda b: math.ceil(b / n)) if strategy != "none" else (lambda b: b)
        self.weights, self.gradients, self.optimizer = split(weights), split(gradients), split(optimizer)
        self.optimizer_step = split(step)  # the step runs on this GPU's share of the states only
        self.ddp_buckets = int(gradients) if strategy == "none" and n > 1 else 0
        self.all_gather = self.reduce_scatter = 0
        if strategy == "none":
            return
        layer, root = _unit_bytes(job, weights)
        trainable_layer, trainable_root = _unit_bytes(job, gradients, trainable=True)
        if job.autocast:  # FSDP's mixed precision: fp32 weights gathered, and gradients reduced, in 16 bits
            half = job.compute / FP32_BYTES
            layer, root = (layer, root * half) if job.quantized else (layer * half, root * half)
            trainable_layer, trainable_root = trainable_layer * half, trainable_root * half
        if strategy == "full":  # the root gathered throughout; a layer running, the next one's gather in flight
            self.all_gather = int(root + 2 * layer)
        else:  # every layer kept gathered until its backward
            self.all_gather = int(root + job.shape.layers * layer + layer)
        # a unit's gradients whole, and the reduce-scatter's flat copy of them
        self.reduce_scatter = int(2 * max(trainable_layer, trainable_root))


def rank_share(job: Job, weights: float, gradients: float, optimizer: float, step: float) -> RankShare:
    """One GPU's share of the job (`RankShare`), or JobSettingError for a world size the model cannot be split over."""
    if job.sharding != "none":
        rows = _fewest_rows(job)
        if job.world_size > rows:
            raise JobSettingError(
                f"world_size={job.world_size} is more than the {rows} rows of the model's smallest parameter "
                f"(hidden_size {job.shape.hidden}): sharding splits every parameter by rows, so GPUs past {rows} "
                f"would hold nothing of it but padding; pass world_size <= {rows}, or sharding='none'"
            )
    return RankShare(job, weights, gradients, optimizer, step)


def _fewest_rows(job: Job) -> int:
    """Rows of the smallest parameter: a norm's hidden_size, or a head's q/k norm (head_dim)."""
    shape = job.shape
    return min(shape.hidden, shape.head_dim) if shape.qk_norm else shape.hidden


def _unit_bytes(job: Job, total: float, trainable: bool = False) -> tuple[float, float]:
    """Bytes of one decoder layer and of the root unit (everything outside the layers) in `total`: the
    weights' bytes (trainable=False) or the trainable parameters' (their gradients)."""
    shape, counts = job.shape, job.shape.parameter_counts()
    norm = (2 if shape.layernorm else 1) * shape.hidden  # the final norm, in the root unit
    outside = counts["embeddings"] + counts["head"] + norm
    if trainable and job.method != "full":  # the adapters are in the layers (the head's, when adapted, aside)
        return total / shape.layers, 0.0
    if job.quantized and not trainable:  # the root's parameters are not quantized: kept in fp32 (or 16 bits)
        kept = job.compute if job.true_half else FP32_BYTES
        root = kept * outside
        return (total - root) / shape.layers, root
    per_param = total / shape.parameters
    return per_param * (shape.parameters - outside) / shape.layers, per_param * outside


def sharded_activations(job: Job, parts: dict[str, int]) -> dict[str, int]:
    """What one layer's forward saves, sharded: FSDP's mixed precision gathers 16-bit weights, so autocast
    keeps no 16-bit copies of fp32 ones (the "weight casts" lines); the rest as on one GPU."""
    if job.sharding == "none" or not job.autocast:
        return parts
    return {k: v for k, v in parts.items() if not k.startswith("weight casts")}
