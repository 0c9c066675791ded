"""What the estimator estimates: a training job's settings, checked, and what it stores.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy), which exports the byte sizes
below. The model's `Shape` comes from helpers/_families.py; a `Job` is the settings of
`estimate_training_memory`, checked once, with what follows from them (the compute dtype, autocast,
the trainable parameters), and the steps that need no activations: the stored weights, the loading
peak, the optimizer's states and its step's temporaries, the logits and the loss's gradients at the
end of the forward. Pure Python: no torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from helpers._families import Shape, adapter_shapes, lora_parameters

__all__ = [
    "ADAMW_FAMILY",
    "COMPUTE_BYTES",
    "FP32_BYTES",
    "HALF_BYTES",
    "NF4_SINGLE_QUANT_BYTES",
    "OPTIMIZER_BYTES",
    "OPTIMIZER_NAMES",
    "PRECISIONS",
    "WEIGHT_BYTES",
    "Job",
    "batch_argument",
    "stored_weights",
    "optimizer_step",
    "optimizer_states",
    "load_peak",
    "logits_moment",
    "forward_logits",
]

FP32_BYTES = 4
HALF_BYTES = 2  # bf16 or fp16
# bytes per parameter of stored weights; int8 keeps one fp32 scale per 4096 weights; nf4 with
# double quantization: 4-bit codes, one 8-bit scale per 64 weights, one fp32 scale per 256 scales
# (4 + 8/64 + 32/(64*256) = 4.127 bits); without double quantization one fp32 scale per 64 weights
# (4 + 32/64 = 4.5 bits)
WEIGHT_BYTES = {
    "fp32": FP32_BYTES,
    "bf16": HALF_BYTES,
    "fp16": HALF_BYTES,
    "int8": 1 + FP32_BYTES / 4096,
    "nf4": 4.127 / 8,
}
NF4_SINGLE_QUANT_BYTES = 4.5 / 8
COMPUTE_BYTES = {"fp32": FP32_BYTES, "bf16": HALF_BYTES, "fp16": HALF_BYTES}
# "bf16-true" / "fp16-true" (litgpt's names; torchtune's dtype=bf16): every floating tensor is stored
# and computed in 16 bits: no autocast, no fp32 master weights, adapters and their optimizer states
# in 16 bits too, and a quantized model keeps its unquantized parameters in 16 bits (no peft k-bit
# preparation, so the embeddings' output does not require grad)
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-true", "fp16-true")
# optimizer state per trainable parameter, beyond the parameter itself, for fp32 parameters; the
# AdamW family keeps its two moments (exp_avg, exp_avg_sq) in the parameter's dtype (half of this
# for 16-bit parameters); 8-bit AdamW keeps each moment in one byte with an fp32 scale per 256
ADAMW_MOMENTS = 2
ADAMW_8BIT_BYTES = ADAMW_MOMENTS * (1 + FP32_BYTES / 256)
OPTIMIZER_BYTES = {
    "adamw": ADAMW_MOMENTS * FP32_BYTES,
    "adamw_foreach": ADAMW_MOMENTS * FP32_BYTES,
    "adamw_hf": ADAMW_MOMENTS * FP32_BYTES,
    "adamw_8bit": ADAMW_8BIT_BYTES,
    "paged_adamw_8bit": ADAMW_8BIT_BYTES,
    "sgd": 0,
    "adafactor": 0,  # factored second moment: by the tensors' shapes (estimate.py), no first moment
}
# TrainingArguments' `optim` names for the same optimizers: torch's AdamW (foreach on CUDA), its
# fused kernel (the Trainer's default from torch 2.8), bitsandbytes' 8-bit AdamW
OPTIMIZER_NAMES = {"adamw_torch": "adamw_foreach", "adamw_torch_fused": "adamw", "adamw_bnb_8bit": "adamw_8bit"}
OPTIMIZER_BYTES.update({name: OPTIMIZER_BYTES[kind] for name, kind in OPTIMIZER_NAMES.items()})
ADAMW_FAMILY = ("adamw", "adamw_foreach", "adamw_hf", "adamw_torch", "adamw_torch_fused")
# settings that describe another harness than the kit's (litgpt's): reported only when set
HARNESS_OPTIONS = ("quantize_head", "quant_dtype", "loss_chunk", "holds_last_output")


def batch_argument(per_device_batch, batch_size, caller: str) -> tuple[str, int]:
    """The micro-batch a caller was given, and the name it was given under: exactly one of the two."""
    if per_device_batch is not None and batch_size is not None:
        raise ValueError(
            f"{caller}() got per_device_batch={per_device_batch!r} and batch_size={batch_size!r}, two "
            f"names for one figure: pass only per_device_batch={per_device_batch!r}"
        )
    if per_device_batch is None and batch_size is None:
        raise ValueError(
            f"{caller}() needs the micro-batch on one device: pass per_device_batch, "
            f"e.g. per_device_batch=1 (batch_size=1 is the older spelling)"
        )
    return ("batch_size", batch_size) if per_device_batch is None else ("per_device_batch", per_device_batch)


@dataclass
class Job:
    """One training job's settings (those of `estimate_training_memory`), checked, and what follows."""

    shape: Shape
    batch: int
    seq_len: int
    precision: str
    weights: str | None  # None: what the method stores (checking fills it in)
    method: str
    lora_r: int
    lora_targets: object
    optimizer: str
    checkpointing: bool
    device: str
    lora_dropout: float
    double_quant: bool
    grad_accum_steps: int
    set_to_none: bool
    quant_keeps_input: bool
    batch_name: str = "per_device_batch"  # how the caller spelled the batch, for the errors
    fused_loss: bool = False  # a fused (chunked) linear cross-entropy: the logits are never held whole
    quantize_head: bool = False  # the LM head quantized too (Lightning's bitsandbytes plugin, litgpt)
    quant_dtype: str | None = None  # the dtype the weights were quantized from; None: the compute dtype
    loss_chunk: int = 0  # positions per chunk of a cross-entropy over logits kept whole in fp32 (litgpt: 128)
    holds_last_output: bool = False  # the loop keeps the previous micro-batch's output into the next forward

    def __post_init__(self):
        _check_choices(self)
        _check_combination(self)

    @property
    def optimizer_kind(self) -> str:
        """The optimizer under TrainingArguments' name for it ("adamw_torch" is "adamw_foreach")."""
        return OPTIMIZER_NAMES.get(self.optimizer, self.optimizer)

    @property
    def true_half(self) -> bool:
        return self.precision.endswith("-true")

    @property
    def compute(self) -> int:
        """Bytes of the compute dtype."""
        return COMPUTE_BYTES[self.precision.removesuffix("-true")]

    @property
    def quantized(self) -> bool:
        return self.weights in ("int8", "nf4")

    @property
    def autocast(self) -> bool:
        """Autocast whenever the matmuls run in a lower precision than the stored weights."""
        return self.compute != FP32_BYTES and (self.weights == "fp32" or self.quantized) and not self.true_half

    @property
    def first_grad(self) -> bool:
        """The first layer's input requires grad: transformers' gradient checkpointing (and peft's k-bit
        preparation with it) makes the embeddings' output require grad; otherwise a frozen model's
        first layer reads a tensor that needs no gradient."""
        return self.method == "full" or (not self.true_half and self.checkpointing)

    @property
    def weight_bytes(self) -> float:
        """Bytes a stored weight takes: nf4 without double quantization keeps an fp32 scale per 64."""
        return NF4_SINGLE_QUANT_BYTES if self.weights == "nf4" and not self.double_quant else WEIGHT_BYTES[self.weights]

    @property
    def dequant_bytes(self) -> int:
        """Bytes per weight that dequantizing a 4-bit weight for a matmul allocates: bitsandbytes
        restores it in the dtype it was quantized from, then casts it to the compute dtype, a second
        copy when the two differ (Lightning's plugin quantizes from fp16 for bf16 compute)."""
        source = COMPUTE_BYTES[self.quant_dtype] if self.quant_dtype else self.compute
        return source + (self.compute if self.quant_dtype and self.quant_dtype != self.base_dtype else 0)

    @property
    def base_dtype(self) -> str:
        """The compute dtype's name: "fp32", "bf16" or "fp16"."""
        return self.precision.removesuffix("-true")

    @property
    def param_bytes(self) -> float:
        """Bytes of a trainable parameter and of its gradient: the stored (master) weights in full
        fine-tuning; adapters in fp32 (peft), or in 16 bits when everything is 16-bit."""
        if self.method == "full":
            return self.weight_bytes
        return self.compute if self.true_half else FP32_BYTES

    def settings(self) -> dict:
        """The settings as the Estimate reports them; the harness options only when they are set."""
        return dict(
            batch_size=self.batch,
            seq_len=self.seq_len,
            precision=self.precision,
            weights=self.weights,
            method=self.method,
            lora_r=self.lora_r,
            optimizer=self.optimizer,
            checkpointing=self.checkpointing,
            device=self.device,
            attn_impl=self.shape.attn_impl,
            grad_accum_steps=self.grad_accum_steps,
            set_to_none=self.set_to_none,
            lora_targets=self.lora_targets,
            lora_dropout=self.lora_dropout,
            fused_loss=self.fused_loss,
            **{name: value for name in HARNESS_OPTIONS if (value := getattr(self, name))},
        )

    @cached_property
    def trainable(self) -> int:
        """Trainable parameters: all of them, or the adapters and a classifier head."""
        if self.method == "full":
            return self.shape.parameters
        return lora_parameters(self.shape, self.lora_r, self.lora_targets)


def _check_choices(job: Job) -> None:
    """Each setting is one the estimator knows; weights default to what the method stores."""
    _check_choice("precision", job.precision, PRECISIONS)
    _check_choice("optimizer", job.optimizer, OPTIMIZER_BYTES)
    _check_choice("method", job.method, ("full", "lora", "qlora"))
    base = job.precision.removesuffix("-true")
    if job.weights is None:
        job.weights = {"full": "fp32" if not job.true_half else base, "lora": base, "qlora": "nf4"}[job.method]
    _check_choice("weights", job.weights, WEIGHT_BYTES)
    for name, value in (
        (job.batch_name, job.batch),
        ("seq_len", job.seq_len),
        ("grad_accum_steps", job.grad_accum_steps),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _check_combination(job: Job) -> None:
    """The settings make sense together; each error says which one to drop or change."""
    weights, shape = job.weights, job.shape
    if job.method == "qlora" and weights != "nf4":
        raise ValueError(f"method='qlora' stores weights in nf4; drop weights={weights!r} or use method='lora'")
    if job.method == "full" and job.quantized:
        raise ValueError(f"quantized weights ({weights}) cannot be trained in full: use method='qlora' or 'lora'")
    if shape.head == "classifier" and shape.num_labels < 1:
        raise ValueError("a classifier head needs num_labels >= 1 in the model's shape")
    if shape.family == "bert" and shape.head != "classifier":
        raise ValueError("BERT is modeled with its sequence-classification head: use head='classifier' and num_labels")
    if job.loss_chunk and (job.fused_loss or job.loss_chunk < 0):
        raise ValueError(
            f"loss_chunk={job.loss_chunk!r}: pass a positive number of positions per chunk, and not with "
            "fused_loss=True (a fused loss never holds the logits whole)"
        )
    if (job.quantize_head or job.quant_dtype) and not job.quantized:
        setting = "quantize_head=True" if job.quantize_head else f"quant_dtype={job.quant_dtype!r}"
        raise ValueError(f"{setting} describes quantized weights; use method='qlora' or drop it")
    if job.quant_dtype is not None:
        _check_choice("quant_dtype", job.quant_dtype, tuple(COMPUTE_BYTES))
    if job.quantize_head and (shape.head != "lm" or shape.tied):
        what = "a classifier head" if shape.head != "lm" else "a head tied to the embeddings (the same tensor)"
        raise ValueError(f"quantize_head=True, but this model has {what}: drop quantize_head")
    base = job.precision.removesuffix("-true")
    if job.true_half and weights not in (base, "int8", "nf4"):
        raise ValueError(f"precision={job.precision!r} stores every weight in {base}; drop weights={weights!r}")
    if job.compute == FP32_BYTES and weights not in ("fp32",) and not job.quantized:
        raise ValueError(
            f"weights={weights!r} with precision='fp32' would upcast every matmul; use precision={weights!r}"
        )


def optimizer_states(job: Job) -> float:
    """2. the optimizer's states: the AdamW family keeps its moments in the parameter's dtype, 8-bit
    optimizers in 8 bits whatever it is, Adafactor a row and a column of squared-gradient averages per matrix."""
    if job.optimizer == "adafactor":
        return job.param_bytes * sum(_adafactor_state(job))
    in_param_dtype = job.optimizer in ADAMW_FAMILY + ("sgd",)
    return OPTIMIZER_BYTES[job.optimizer] * (job.param_bytes / FP32_BYTES if in_param_dtype else 1) * job.trainable


def load_peak(job: Job, weights: float) -> float:
    """0. loading, before the first step. transformers loads one checkpoint tensor at a time, so a
    16-bit or fp32 model peaks at its own size. With bitsandbytes 4-bit quantization on the fly each
    linear arrives in 16 bits beside its packed codes and scales (2 + 1/2 + 1/8 + 1/64 bytes per
    weight, the largest linear last); then peft's k-bit preparation casts the unquantized
    parameters to fp32 one at a time (the largest, the embedding, in 16 and 32 bits at once).
    Sources: transformers 5.23's core_model_loading.py (one tensor at a time when quantizing on the
    fly) and peft 0.21's utils/other.py (prepare_model_for_kbit_training)."""
    if not job.quantized:
        return weights
    counts, half = job.shape.parameter_counts(), HALF_BYTES
    head = counts["head"] * (not job.quantize_head)
    largest = max([a * b for a, b in job.shape.linear_shapes().values()] + [counts["head"] - head])
    kept = counts["embeddings"] + head + counts["other"]
    quantized = (counts["linear"] + counts["head"] - head) * job.weight_bytes + half * kept
    quantized += (2 + 1 / 2 + 1 / 8 + 1 / 64) * largest
    if job.true_half:  # no k-bit preparation: the unquantized parameters stay in 16 bits
        return max(quantized, weights)
    return max(quantized, weights + half * job.shape.vocab * job.shape.hidden)


def stored_weights(job: Job) -> float:
    """1. weights: quantized runs keep embeddings, head and norms in fp32 (peft's k-bit preparation),
    or in 16 bits when everything is 16-bit (litgpt's bf16-true, torchtune). 2. the adapters (and a
    new classifier head) are stored beside a frozen base."""
    counts = job.shape.parameter_counts()
    if job.quantized:
        kept = job.compute if job.true_half else FP32_BYTES
        head = counts["head"] * (not job.quantize_head)  # a quantized head is stored as its linears are
        quantized = counts["linear"] + counts["head"] - head
        stored = quantized * job.weight_bytes + kept * (counts["embeddings"] + head + counts["other"])
    else:
        stored = job.shape.parameters * job.weight_bytes
    return stored if job.method == "full" else stored + job.param_bytes * job.trainable


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


def _head_dequant(job: Job) -> float:
    """A quantized head's weight, dequantized (with its fp32 scales) each time the head runs, forward and backward."""
    return (job.dequant_bytes + FP32_BYTES / 64) * job.shape.vocab * job.shape.hidden if job.quantize_head else 0


def logits_moment(job: Job) -> int:
    """3b. the logits at the end of the forward and the fp32 upcast that the loss reads (not saved),
    then the loss's gradients at the start of the backward; a quantized head's dequantized weight."""
    shape, n, head = job.shape, job.batch * job.seq_len, _head_dequant(job)
    if job.fused_loss and shape.head == "lm":  # one chunk of logits at a time: negligible beside the rest
        return head
    if shape.head == "classifier":
        rows = job.batch if shape.family == "bert" else n
        return rows * shape.num_labels * (job.compute + FP32_BYTES)
    if job.loss_chunk:  # the fp32 logits stay whole; the loss's gradients (two fp32, one cast back) per chunk
        chunk = job.batch * min(job.loss_chunk, job.seq_len)
        return n * shape.vocab * FP32_BYTES + chunk * shape.vocab * (2 * FP32_BYTES + job.compute) + head
    # the logits and their fp32 upcast at the end of the forward; at the start of the backward the
    # loss's fp32 gradient and log_softmax's fp32 input gradient, beside the saved log-probs
    return n * shape.vocab * max(job.compute + FP32_BYTES, 2 * FP32_BYTES) + head


def forward_logits(job: Job) -> int:
    """3c. the logits as the forward returns them, before the loss: in the compute dtype beside their
    fp32 upcast (the loss reads fp32), or the 16-bit logits beside a quantized head's dequantized weight."""
    shape, head = job.shape, _head_dequant(job)
    if job.fused_loss and shape.head == "lm":
        return head
    rows = job.batch if shape.family == "bert" else job.batch * job.seq_len
    elements = rows * (shape.num_labels if shape.head == "classifier" else shape.vocab)
    upcast = elements * FP32_BYTES if job.compute != FP32_BYTES else 0
    return elements * job.compute + max(upcast, head)
