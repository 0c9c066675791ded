"""What the estimator estimates: a model's shape and a training job's settings, checked.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy), which exports `Shape`,
`shape_of` and the byte sizes below. A shape comes from a transformers config, a config dict or a
catalog name (helpers/assets/catalog, through `helpers.catalog`); a `Job` is the settings of
`estimate_training_memory`, checked once, with what follows from them (the compute dtype, autocast,
the trainable parameters). Pure Python: no torch, no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from helpers.catalog import find

__all__ = [
    "ADAMW_FAMILY",
    "COMPUTE_BYTES",
    "FP32_BYTES",
    "HALF_BYTES",
    "LINEAR_TARGETS",
    "NF4_SINGLE_QUANT_BYTES",
    "OPTIMIZER_BYTES",
    "PRECISIONS",
    "WEIGHT_BYTES",
    "Job",
    "Shape",
    "adapter_shapes",
    "batch_argument",
    "shape_of",
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
}
ADAMW_FAMILY = ("adamw", "adamw_foreach", "adamw_hf")
LINEAR_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Shape:
    """The architecture facts the estimator needs, read from a config or the catalog."""

    family: str  # "llama" (also Mistral, Qwen2, SmolLM2, TinyLlama), "gemma", "phi3", "gpt2", "bert"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    act: str = "silu"
    tied: bool = False
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0  # GPT-2 and BERT drop after attention, after the MLP and after embeddings
    attn_impl: str = "sdpa"  # "eager", "sdpa" or "flash_attention_2"
    qkv_bias: bool = False
    max_positions: int = 0  # learned position table size (GPT-2, BERT); 0 with rotary
    head: str = "lm"  # "lm": logits over the vocabulary; "classifier": num_labels logits per sequence
    num_labels: int = 0  # classifier outputs
    type_vocab: int = 0  # BERT's token-type (segment) embeddings
    qkv_fused: bool = False  # one fused q/k/v projection (litgpt's GPT; always for Phi-3 and GPT-2)

    @property
    def gated(self) -> bool:
        return self.family in ("llama", "gemma", "phi3")

    @property
    def layernorm(self) -> bool:
        return self.family in ("gpt2", "bert")

    @property
    def fused_qkv(self) -> bool:
        return self.qkv_fused or self.family in ("phi3", "gpt2")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear in one layer, by LoRA target name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q": (self.hidden, q), "k": (self.hidden, kv), "v": (self.hidden, kv), "o": (q, self.hidden)}
        shapes.update({"gate": (self.hidden, self.intermediate)} if self.gated else {})
        shapes.update({"up": (self.hidden, self.intermediate), "down": (self.intermediate, self.hidden)})
        return shapes

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by where they live: quantizable linears, embeddings and head, norms and biases."""
        h, i = self.hidden, self.intermediate
        linear = self.layers * sum(a * b for a, b in self.linear_shapes().values())
        embed = self.vocab * h + self.max_positions * h + self.type_vocab * h
        if self.head == "classifier":  # BERT pools the first token through a dense layer first
            head = (h * h if self.family == "bert" else 0) + h * self.num_labels
        else:
            head = 0 if self.tied else self.vocab * h
        norm_width = 2 * h if self.layernorm else h  # weight (+ bias)
        other = (2 * self.layers + 1) * norm_width
        if self.qkv_bias:
            other += self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.family == "gpt2":  # every Conv1D has a bias
            other += self.layers * (3 * h + h + i + h)
        if self.family == "bert":  # every other linear has a bias too, and so do the pooler and the classifier
            other += self.layers * (h + i + h) + (h + self.num_labels if self.head == "classifier" else 0)
        return {"linear": linear, "embeddings": embed, "head": head, "other": other}

    @property
    def parameters(self) -> int:
        return sum(self.parameter_counts().values())


def shape_of(model) -> Shape:
    """Read a Shape from a catalog name, a transformers config, or a config dict.

    Example:
        >>> shape_of("Mistral-7B").kv_heads
        8
    """
    if isinstance(model, Shape):
        return model
    if isinstance(model, str):
        return Shape(**find("models", model, otherwise="Or pass a transformers config.")[1]["shape"])
    config = model.to_dict() if hasattr(model, "to_dict") else dict(model)
    impl = getattr(model, "_attn_implementation", None) or config.get("_attn_implementation") or "sdpa"
    return _shape_from_config(config, impl)


def _shape_from_config(c: dict, impl: str) -> Shape:
    kind = c.get("model_type", "")
    if kind == "gpt2":
        return _gpt2_shape(c, impl)
    if kind == "bert":  # an encoder trained with a classification head (BertForSequenceClassification)
        return _bert_shape(c, impl)
    return _decoder_shape(c, impl, kind)


def _gpt2_shape(c: dict, impl: str) -> Shape:
    h = c["n_embd"]
    return Shape(
        "gpt2",
        h,
        c["n_layer"],
        c["n_head"],
        c["n_head"],
        h // c["n_head"],
        c.get("n_inner") or 4 * h,
        c["vocab_size"],
        act=c.get("activation_function", "gelu_new"),
        tied=c.get("tie_word_embeddings", True),
        attn_dropout=c.get("attn_pdrop", 0.1),
        resid_dropout=c.get("resid_pdrop", 0.1),
        attn_impl=impl,
        max_positions=c["n_positions"],
    )


def _bert_shape(c: dict, impl: str) -> Shape:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    labels = c.get("num_labels") or len(c.get("id2label") or {}) or 2
    return Shape(
        "bert",
        h,
        c["num_hidden_layers"],
        heads,
        heads,
        h // heads,
        c["intermediate_size"],
        c["vocab_size"],
        act=c.get("hidden_act", "gelu"),
        attn_dropout=c.get("attention_probs_dropout_prob", 0.1),
        resid_dropout=c.get("hidden_dropout_prob", 0.1),
        attn_impl=impl,
        qkv_bias=True,
        max_positions=c["max_position_embeddings"],
        head="classifier",
        num_labels=labels,
        type_vocab=c.get("type_vocab_size", 2),
    )


def _decoder_shape(c: dict, impl: str, kind: str) -> Shape:
    families = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "gemma", "phi3": "phi3"}
    if kind not in families:
        raise ValueError(
            f"The estimator does not know model_type {kind!r} yet; it knows "
            f"{', '.join(sorted(families) + ['bert', 'gpt2'])}. Pick the closest catalog model instead."
        )
    heads = c["num_attention_heads"]
    return Shape(
        families[kind],
        c["hidden_size"],
        c["num_hidden_layers"],
        heads,
        c.get("num_key_value_heads") or heads,
        c.get("head_dim") or c["hidden_size"] // heads,
        c["intermediate_size"],
        c["vocab_size"],
        act=c.get("hidden_act") or c.get("hidden_activation") or "silu",
        tied=c.get("tie_word_embeddings", False),
        attn_dropout=c.get("attention_dropout", 0.0),
        attn_impl=impl,
        qkv_bias=kind == "qwen2",
    )


def _lora_targets(shape: Shape, targets) -> tuple[str, ...]:
    chosen = LINEAR_TARGETS if targets == "all-linear" else tuple(targets)
    unknown = [t for t in chosen if t not in LINEAR_TARGETS]
    if unknown:
        raise ValueError(f"Unknown LoRA targets {unknown}; use names from {LINEAR_TARGETS} or 'all-linear'")
    return tuple(t for t in chosen if t in shape.linear_shapes())


def adapter_shapes(shape: Shape, targets) -> dict[str, tuple[int, int]]:
    """(in, out) of each adapted module in one layer: fused projections carry one adapter."""
    linears, chosen = shape.linear_shapes(), set(_lora_targets(shape, targets))
    adapters = {t: linears[t] for t in chosen}
    if shape.fused_qkv and chosen & {"q", "k", "v"}:  # GPT-2's c_attn, Phi-3's qkv_proj
        for t in ("q", "k", "v"):
            adapters.pop(t, None)
        adapters["qkv"] = (shape.hidden, linears["q"][1] + 2 * linears["k"][1])
    if shape.family == "phi3" and chosen & {"gate", "up"}:  # Phi-3's gate_up_proj
        adapters.pop("gate", None)
        adapters["up"] = (shape.hidden, 2 * shape.intermediate)
    return adapters


def _lora_parameters(shape: Shape, r: int, targets) -> int:
    """Trainable parameters of a LoRA run: the adapters, and a classifier head trained in full.

    A classification head is new, so it is trained whole (peft's task_type="SEQ_CLS" puts it in
    modules_to_save); with "all-linear", peft also adapts BERT's pooler."""
    count = shape.layers * sum(r * (i + o) for i, o in adapter_shapes(shape, targets).values())
    if shape.head == "classifier":
        count += shape.hidden * shape.num_labels + (shape.num_labels if shape.family == "bert" else 0)
        if shape.family == "bert" and targets == "all-linear":
            count += r * 2 * shape.hidden
    return count


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

    def __post_init__(self):
        _check_choices(self)
        _check_combination(self)

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
    def param_bytes(self) -> float:
        """Bytes of a trainable parameter and of its gradient: the stored (master) weights in full
        fine-tuning; adapters in fp32 (peft), or in 16 bits when everything is 16-bit."""
        if self.method == "full":
            return self.weight_bytes
        return self.compute if self.true_half else FP32_BYTES

    @cached_property
    def trainable(self) -> int:
        """Trainable parameters: all of them, or the adapters and a classifier head."""
        if self.method == "full":
            return self.shape.parameters
        return _lora_parameters(self.shape, self.lora_r, self.lora_targets)


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
    base = job.precision.removesuffix("-true")
    if job.true_half and weights not in (base, "int8", "nf4"):
        raise ValueError(f"precision={job.precision!r} stores every weight in {base}; drop weights={weights!r}")
    if job.compute == FP32_BYTES and weights not in ("fp32",) and not job.quantized:
        raise ValueError(
            f"weights={weights!r} with precision='fp32' would upcast every matmul; use precision={weights!r}"
        )
