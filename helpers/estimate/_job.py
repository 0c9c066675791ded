"""What the estimator estimates: a training job's settings, checked, and the units they are counted in.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy), which exports the byte sizes
below. The model's `Shape` comes from `_shapes`; a `Job` is the settings of
`estimate_training_memory`, checked once, with what follows from them (the compute dtype, autocast,
the trainable parameters). `Harness` gathers what only a benchmark states: facts about another
training harness than the kit's (the Trainer, peft and a current bitsandbytes). Pure Python: no
torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property

from helpers.catalog import card_capability
from helpers.env import half_precision
from helpers.estimate._shapes import Shape, lora_parameters
from helpers.job import JobSettingError, TrainingJob

__all__ = [
    "ADAMW_FAMILY",
    "COMPUTE_BYTES",
    "FP32_BYTES",
    "HALF_BYTES",
    "NF4_SINGLE_QUANT_BYTES",
    "OPTIMIZER_BYTES",
    "OPTIMIZER_NAMES",
    "WEIGHT_BYTES",
    "Harness",
    "Job",
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
    "adafactor": 0,  # factored second moment: by the tensors' shapes (`_optimizer`), no first moment
}
# TrainingArguments' `optim` names for the same optimizers: torch's AdamW (foreach on CUDA), its
# fused kernel (the Trainer's default from torch 2.8), bitsandbytes' 8-bit AdamW
OPTIMIZER_NAMES = {"adamw_torch": "adamw_foreach", "adamw_torch_fused": "adamw", "adamw_bnb_8bit": "adamw_8bit"}
OPTIMIZER_BYTES.update({name: OPTIMIZER_BYTES[kind] for name, kind in OPTIMIZER_NAMES.items()})
ADAMW_FAMILY = ("adamw", "adamw_foreach", "adamw_hf", "adamw_torch", "adamw_torch_fused")


@dataclass(frozen=True)
class Harness:
    """What only a benchmark states: facts about a training harness other than the kit's.

    The kit's own stack (the Trainer or a loop of its own, transformers >= 4.49, peft >= 0.12,
    bitsandbytes >= 0.43.2, PyTorch 2.x) needs none of these; the published cases
    (scripts/bench/cases/*.toml, run by scripts/bench_estimator.py) set them to hold the estimator
    against runs published from other harnesses (litgpt with Lightning's bitsandbytes plugin,
    PyTorch 1.x). `_versions.harness_for` sets the facts that follow from library releases.

    Attributes:
        set_to_none: optimizer.zero_grad(set_to_none=True) frees the gradients after each step
            (PyTorch 2.x, the Trainer). False keeps them allocated as zeros (PyTorch 1.x's
            model.zero_grad()), beside the next forward's activations.
        quant_keeps_input: each quantized linear keeps its input for backward on its autograd ctx
            (bitsandbytes 0.39 to 0.43.1); 0.43.2 on keeps only the packed weight. Under reentrant
            checkpointing the forward builds no graph, so only the layer being recomputed keeps them.
        quantize_head: the LM head is quantized with the other linears, as Lightning's bitsandbytes
            plugin (litgpt's --quantize) does; transformers and peft keep it in 16 bits (then fp32).
            Each time the head runs, forward and backward, bitsandbytes dequantizes the whole
            vocab x hidden matrix: the largest transient of the step.
        quant_dtype: the dtype the weights were quantized from ("fp16", "bf16", "fp32"); None: the
            compute dtype, as helpers.qlora loads them. bitsandbytes dequantizes to that dtype and
            then casts to the compute dtype: a second copy of each weight while it runs when they
            differ (Lightning's plugin quantizes from fp16 whatever the compute dtype).
        loss_chunk: the head and the cross-entropy run on chunks of this many positions (litgpt:
            128), the fp32 logits kept whole through the backward: the loss's gradients exist one
            chunk at a time, and under autocast a frozen head keeps a 16-bit copy per chunk.
        cuda_context_bytes: the CUDA context (and library kernels) outside the allocator, as a run
            measured it; None: the estimator's CUDA_CONTEXT_BYTES.
        sdpa_kernel: the SDPA kernel a harness pins (`torch.nn.attention.sdpa_kernel`): "flash",
            "efficient" or "math", instead of the one PyTorch would choose (`_attention`).
        logits_upcast: where a causal LM's logits become fp32 for its loss. "loss": the model returns
            them in the compute dtype and the loss upcasts a copy, both alive while it runs
            (transformers' `ForCausalLMLoss`). "forward": the forward upcasts them and returns fp32
            logits, its 16-bit ones freed at once: one 16-bit copy fewer at the loss (Llama 4.31 to
            4.45). "none": no upcast (GPT-2 before 4.48.3, GPT-NeoX before 4.49): under mixed precision
            cross_entropy casts what it reads to fp32; in 16 bits throughout ("bf16-true") the loss
            runs in 16 bits, its log-probs too, which the activations still count in fp32.
        logits_shift_copy: the loss copies the logits shifted by one position
            (`logits[..., :-1, :].contiguous()`) and reads per_device_batch x (seq_len - 1) of them:
            "fp32" after an upcast, "compute" without one; None: it shifts the labels instead
            (transformers 4.49 on).
        adapters_upcast: peft casts the adapters it builds in a 16-bit base's dtype to fp32
            (`autocast_adapter_dtype`, peft 0.12 on); False: they stay in the base's 16-bit dtype
            (peft before 0.12), and so do their gradients and AdamW moments.
    """

    set_to_none: bool = True
    quant_keeps_input: bool = False
    quantize_head: bool = False
    quant_dtype: str | None = None
    loss_chunk: int = 0
    cuda_context_bytes: int | None = None
    sdpa_kernel: str | None = None
    logits_upcast: str = "loss"
    logits_shift_copy: str | None = None
    adapters_upcast: bool = True

    def changed(self) -> dict:
        """The facts that differ from the kit's harness."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


@dataclass(frozen=True, kw_only=True)
class Job(TrainingJob):
    """One training job as the estimator counts it: the settings (`helpers.job.TrainingJob`) with the
    precision and the stored weights filled in, the model's shape, the card, the device and the harness."""

    shape: Shape
    gpu: str | None = None  # the catalog card it runs on: its compute capability decides the attention kernel
    device: str = "cuda"  # "cuda" or "cpu": dropout masks and the attention kernel differ
    harness: Harness = field(default_factory=Harness)

    def __post_init__(self):
        super().__post_init__()
        if self.precision is None or self.weights is None:
            raise ValueError("Job takes a resolved job: build it with Job.of(settings, shape, ...)")
        _check_choice("device", self.device, ("cuda", "cpu"))
        _check_harness(self)
        _check_shape(self)

    @classmethod
    def of(cls, settings: TrainingJob, shape: Shape, *, gpu=None, device="cuda", harness=None) -> Job:
        """The estimator's job: `settings` in the card's half precision unless another was asked, the
        weights as the method stores them unless asked, the attention implementation on the shape."""
        settings = settings.with_precision(half_precision(card_capability(gpu) if gpu is not None else None))
        values = {f.name: getattr(settings, f.name) for f in fields(TrainingJob)}
        values["weights"] = settings.stored_weights(settings.precision)
        if settings.attn_impl:
            shape = replace(shape, attn_impl=settings.attn_impl)
        return cls(**values, shape=shape, gpu=gpu, device=device, harness=Harness() if harness is None else harness)

    @property
    def optimizer_kind(self) -> str:
        """The optimizer under TrainingArguments' name for it ("adamw_torch" is "adamw_foreach")."""
        return OPTIMIZER_NAMES.get(self.optimizer, self.optimizer)

    @property
    def capability(self) -> tuple[int, int] | None:
        """The card's compute capability, or None when no card is named."""
        return card_capability(self.gpu) if self.gpu is not None else None

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
        source = COMPUTE_BYTES[self.harness.quant_dtype] if self.harness.quant_dtype else self.compute
        return source + (
            self.compute if self.harness.quant_dtype and self.harness.quant_dtype != self.base_dtype else 0
        )

    @property
    def base_dtype(self) -> str:
        """The compute dtype's name: "fp32", "bf16" or "fp16"."""
        return self.precision.removesuffix("-true")

    @property
    def param_bytes(self) -> float:
        """Bytes of a trainable parameter and of its gradient: the stored (master) weights in full
        fine-tuning; adapters in fp32 (peft), or in 16 bits when everything is 16-bit or when peft
        keeps them in a 16-bit base's dtype (`Harness.adapters_upcast`)."""
        if self.method == "full":
            return self.weight_bytes
        if not self.harness.adapters_upcast and self.weights in ("bf16", "fp16"):  # peft before 0.12
            return HALF_BYTES
        return self.compute if self.true_half else FP32_BYTES

    def settings(self) -> dict:
        """The settings as the Estimate reports them, under the names that pass them back in: the job's
        fields, the card and the device; the harness only when it differs from the kit's."""
        values = {f.name: getattr(self, f.name) for f in fields(TrainingJob)}
        values.update(attn_impl=self.shape.attn_impl, gpu=self.gpu, device=self.device)
        return values | ({"harness": self.harness} if self.harness.changed() else {})

    @cached_property
    def trainable(self) -> int:
        """Trainable parameters: all of them, or the adapters and a classifier head."""
        if self.method == "full":
            return self.shape.parameters
        return lora_parameters(self.shape, self.lora_r, self.lora_targets)


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


def _check_shape(job: Job) -> None:
    """The model can be trained as the settings say."""
    shape = job.shape
    if shape.head == "classifier" and shape.num_labels < 1:
        raise ValueError("a classifier head needs num_labels >= 1 in the model's shape")
    if shape.family == "bert" and shape.head != "classifier":
        raise ValueError("BERT is modeled with its sequence-classification head: use head='classifier' and num_labels")
    if shape.max_positions and job.seq_len > shape.max_positions:  # a rotary model's context: Estimate.context_note
        whose = f"{shape.name}'s" if shape.name else "the model's"
        raise JobSettingError(
            f"seq_len={job.seq_len} is past {whose} {shape.max_positions:,} learned positions: its position table "
            f"has no row beyond them, so the model cannot take a longer sequence; pass seq_len <= "
            f"{shape.max_positions} (or pick a model with rotary positions)"
        )


def _check_harness(job: Job) -> None:
    """The harness's facts fit the settings; each error says which one to drop or change."""
    harness, shape = job.harness, job.shape
    if not isinstance(harness, Harness):
        raise TypeError(f"harness={harness!r}: pass a helpers.estimate.Harness, e.g. Harness(set_to_none=False)")
    if harness.loss_chunk and (job.fused_loss or harness.loss_chunk < 0):
        raise ValueError(
            f"loss_chunk={harness.loss_chunk!r}: pass a positive number of positions per chunk, and not with "
            "fused_loss=True (a fused loss never holds the logits whole)"
        )
    if (harness.quantize_head or harness.quant_dtype) and not job.quantized:
        setting = "quantize_head=True" if harness.quantize_head else f"quant_dtype={harness.quant_dtype!r}"
        raise ValueError(f"{setting} describes quantized weights; use method='qlora' or drop it")
    if harness.sdpa_kernel is not None:
        _check_choice("sdpa_kernel", harness.sdpa_kernel, ("flash", "efficient", "math"))
    _check_choice("logits_upcast", harness.logits_upcast, ("loss", "forward", "none"))
    _check_choice("logits_shift_copy", harness.logits_shift_copy, (None, "fp32", "compute"))
    if harness.loss_chunk and (harness.logits_upcast != "loss" or harness.logits_shift_copy):
        raise ValueError(
            f"loss_chunk={harness.loss_chunk!r} is litgpt's chunked loss; logits_upcast and logits_shift_copy "
            "describe transformers' loss: drop one of them"
        )
    if harness.quant_dtype is not None:
        _check_choice("quant_dtype", harness.quant_dtype, tuple(COMPUTE_BYTES))
    if harness.quantize_head and (shape.head != "lm" or shape.tied):
        what = "a classifier head" if shape.head != "lm" else "a head tied to the embeddings (the same tensor)"
        raise ValueError(f"quantize_head=True, but this model has {what}: drop quantize_head")
