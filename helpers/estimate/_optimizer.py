"""The optimizer and the gradients: its states, the temporaries of its step, the gradients it reads.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; notebook 05's 8-bit AdamW).
AdamW keeps two moments per trainable parameter, 8-bit AdamW one byte each, Adafactor a row and a
column per matrix; foreach AdamW builds one state-sized temporary during its step, the fused kernel
none. The byte tables are in `_job` (the settings are checked against them). Pure Python: no torch.
"""

from __future__ import annotations

from helpers.estimate._job import ADAMW_FAMILY, FP32_BYTES, OPTIMIZER_BYTES, Job
from helpers.estimate._shapes import adapter_shapes

__all__ = ["gradients", "optimizer_states", "optimizer_step"]


def gradients(job: Job) -> float:
    """The trainable parameters' gradients, in their dtype: all of them after backward."""
    return job.param_bytes * job.trainable


def optimizer_states(job: Job) -> float:
    """2. the optimizer's states: the AdamW family keeps its moments in the parameter's dtype, 8-bit
    optimizers in 8 bits whatever it is, Adafactor a row and a column of squared-gradient averages per matrix."""
    if job.optimizer == "adafactor":
        return job.param_bytes * sum(_adafactor_state(job))
    in_param_dtype = job.optimizer in ADAMW_FAMILY + ("sgd",)
    return OPTIMIZER_BYTES[job.optimizer] * (job.param_bytes / FP32_BYTES if in_param_dtype else 1) * job.trainable


def optimizer_step(job: Job) -> float:
    """4. the optimizer's step: foreach AdamW builds sqrt(exp_avg_sq) for every tensor at once; the
    per-tensor loop one tensor at a time (the largest trainable tensor bounds it); fused AdamW,
    8-bit optimizers (in place, block by block) and SGD build nothing."""
    shape = job.shape
    if job.optimizer_kind == "adamw_foreach":
        return job.param_bytes * job.trainable
    if job.optimizer_kind not in ("adamw_hf", "adafactor"):
        return 0
    if job.method == "full":
        largest = max([a * b for a, b in shape.linear_shapes().values()] + [shape.vocab * shape.hidden])
    else:
        largest = max(job.lora_r * max(io) for io in adapter_shapes(shape, job.lora_targets).values())
    # Adafactor builds grad**2 and then the factored estimate, each the tensor's size
    return job.param_bytes * largest * (2 if job.optimizer == "adafactor" else 1)


def _adafactor_state(job: Job) -> list[int]:
    """Elements of Adafactor's state for each trainable tensor: rows + columns of a matrix, all of a vector
    (transformers' Adafactor as the Trainer builds it: no first moment)."""
    shape = job.shape
    if job.method != "full":  # the adapters: A (r x in) and B (out x r) in every layer
        adapters = adapter_shapes(shape, job.lora_targets).values()
        return [shape.layers * sum(2 * job.lora_r + i + o for i, o in adapters)]
    counts = shape.parameter_counts()
    matrices = [shape.layers * sum(i + o for i, o in shape.linear_shapes().values()), shape.vocab + shape.hidden]
    if counts["head"]:
        matrices.append(shape.vocab + shape.hidden)
    matrices += [rows + shape.hidden for rows in (shape.max_positions, shape.type_vocab) if rows]  # position tables
    return matrices + [counts["other"]]
