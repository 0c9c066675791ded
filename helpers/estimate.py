"""The training-memory estimator: what a fine-tune needs before it starts, line by line.

Taught in notebook 01 (memory anatomy), used by 03 (the OOM it predicts), 05 (the 7B plan) and
`python -m helpers plan`. Pure Python on purpose: it answers for a 7B in milliseconds without
importing torch, and works offline from the shipped catalogs (helpers/assets/catalog).

How activations are counted. `activations` is the bytes autograd keeps for backward over one
micro-batch's forward pass, each storage once, parameters excluded: exactly what saved-tensor
hooks see (`helpers.memory.track_saved_tensors`). The estimator walks a decoder layer op by op
(norm, projections, rotary, attention, MLP, dropout) and adds what each op saves, in the dtype it
saves it in. The tests hold it to the measured bytes on CPU for Llama, Qwen2, Gemma and GPT-2.

On a GPU the peak also holds what is not saved for backward: the logits and their fp32 upcast at
the end of the forward, one recomputed layer during a checkpointed backward, the CUDA context
and the allocator's slack. Those are separate lines, each a stated constant or formula.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

MIB, GIB = 2**20, 2**30
CATALOG_DIR = Path(__file__).parent / "assets" / "catalog"

# bytes per parameter of stored weights; nf4 with double quantization: 4-bit codes, one 8-bit
# scale per 64 weights, one fp32 scale per 256 scales (4 + 8/64 + 32/(64*256) = 4.127 bits)
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + 4 / 4096, "nf4": 4.127 / 8}
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# optimizer state per trainable parameter, beyond the parameter itself
OPTIMIZER_BYTES = {"adamw": 8.0, "adamw_8bit": 2.0 + 8 / 256, "paged_adamw_8bit": 2.0 + 8 / 256, "sgd": 0.0}
# what the activation function saves for backward, in tensors of the MLP's width:
# silu, relu, gelu and tanh-gelu save one tensor; GPT-2's python "gelu_new" saves four
ACTIVATION_SAVES = {"silu": 1, "relu": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4, "gelu_fast": 4}
# memory a CUDA process holds that torch.cuda.max_memory_allocated does not show
CUDA_CONTEXT_BYTES = 400 * MIB  # CUDA context + cuBLAS workspace with lazy module loading
ALLOCATOR_SLACK = 0.05  # reserved above allocated: the caching allocator's rounding and fragmentation
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

    @property
    def gated(self) -> bool:
        return self.family in ("llama", "gemma", "phi3")

    @property
    def layernorm(self) -> bool:
        return self.family in ("gpt2", "bert")

    @property
    def fused_qkv(self) -> bool:
        return self.family in ("phi3", "gpt2")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear in one layer, by LoRA target name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q": (self.hidden, q), "k": (self.hidden, kv), "v": (self.hidden, kv), "o": (q, self.hidden)}
        shapes.update({"gate": (self.hidden, self.intermediate)} if self.gated else {})
        shapes.update({"up": (self.hidden, self.intermediate), "down": (self.intermediate, self.hidden)})
        return shapes

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by where they live: quantizable linears, embeddings and head, norms and biases."""
        linear = self.layers * sum(i * o for i, o in self.linear_shapes().values())
        embed = self.vocab * self.hidden + self.max_positions * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        norm_width = 2 * self.hidden if self.layernorm else self.hidden  # weight (+ bias)
        other = (2 * self.layers + 1) * norm_width
        if self.qkv_bias:
            other += self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.family == "gpt2":  # every Conv1D has a bias
            other += self.layers * (3 * self.hidden + self.hidden + self.intermediate + self.hidden)
        return {"linear": linear, "embeddings": embed, "head": head, "other": other}

    @property
    def parameters(self) -> int:
        return sum(self.parameter_counts().values())


@dataclass
class Estimate:
    """A breakdown in bytes. `total` is what the card must hold; `allocated` what torch.cuda reports."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int  # transient at the end of the forward: logits and their fp32 upcast (not saved)
    recompute: int  # one layer recomputed during a checkpointed backward
    cuda_context: int
    allocator_slack: int
    trainable: int  # trainable parameters (a count, not bytes)
    parameters: int  # all parameters (a count)
    settings: dict = field(default_factory=dict)
    activation_parts: dict = field(default_factory=dict)  # activations by component, bytes

    @property
    def allocated(self) -> int:
        """Peak bytes as torch.cuda.max_memory_allocated would report them."""
        # activations and gradients barely overlap: the forward ends with all activations and no
        # gradients (the Trainer frees them at each step); the backward turns one into the other
        return self.weights + self.optimizer + max(self.activations + self.logits, self.gradients + self.recompute)

    @property
    def total(self) -> int:
        return self.allocated + self.cuda_context + self.allocator_slack

    def __getitem__(self, key: str) -> int:
        return getattr(self, key)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(allocated=self.allocated, total=self.total)
        return d

    def fits(self, gpu) -> bool:
        """True when the estimate fits `gpu`: a catalog name ("T4"), a GiB figure, or bytes."""
        return self.total <= gpu_bytes(gpu)

    def table(self) -> str:
        rows = [("weights", self.weights), ("gradients", self.gradients), ("optimizer", self.optimizer),
                ("activations", self.activations), ("logits (transient)", self.logits),
                ("recompute (checkpointing)", self.recompute), ("CUDA context", self.cuda_context),
                ("allocator slack", self.allocator_slack), ("total", self.total)]
        return "\n".join(f"{name:26} {b / GIB:8.2f} GiB" for name, b in rows)


def load_catalog(name: str) -> dict:
    """A shipped catalog: "models" (shapes of real models) or "gpus" (cards)."""
    return json.loads((CATALOG_DIR / f"{name}.json").read_text())


def gpu_bytes(gpu) -> int:
    """Memory of a card: a catalog name ("T4", "A100-40GB"), GiB as a float, or bytes as an int."""
    if isinstance(gpu, str):
        cards = load_catalog("gpus")
        match = {k.lower(): k for k in cards}.get(gpu.lower())
        if match is None:
            raise ValueError(f"Unknown GPU {gpu!r}; the catalog has {', '.join(cards)}. Or pass its memory in GiB, e.g. 15.0")
        return int(cards[match]["memory_gib"] * GIB)
    if isinstance(gpu, float):
        return int(gpu * GIB)
    if isinstance(gpu, int) and gpu > 0:
        return gpu
    raise ValueError(f"gpu must be a catalog name, GiB as a float or bytes as an int; got {gpu!r}")


def shape_of(model) -> Shape:
    """Read a Shape from a catalog name, a transformers config, or a config dict."""
    if isinstance(model, Shape):
        return model
    if isinstance(model, str):
        models = load_catalog("models")
        match = {k.lower(): k for k in models}.get(model.lower())
        if match is None:
            raise ValueError(f"Unknown model {model!r}; the catalog has {', '.join(models)}. Or pass a transformers config.")
        return Shape(**models[match]["shape"])
    config = model.to_dict() if hasattr(model, "to_dict") else dict(model)
    impl = getattr(model, "_attn_implementation", None) or config.get("_attn_implementation") or "sdpa"
    return _shape_from_config(config, impl)


def _shape_from_config(c: dict, impl: str) -> Shape:
    kind = c.get("model_type", "")
    if kind == "gpt2":
        h = c["n_embd"]
        return Shape("gpt2", h, c["n_layer"], c["n_head"], c["n_head"], h // c["n_head"], c.get("n_inner") or 4 * h,
                     c["vocab_size"], act=c.get("activation_function", "gelu_new"), tied=c.get("tie_word_embeddings", True),
                     attn_dropout=c.get("attn_pdrop", 0.1), resid_dropout=c.get("resid_pdrop", 0.1), attn_impl=impl,
                     max_positions=c["n_positions"])
    families = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "gemma", "phi3": "phi3"}
    if kind not in families:
        raise ValueError(f"The estimator does not know model_type {kind!r} yet; it knows "
                         f"{', '.join(sorted(families) + ['gpt2'])}. Pick the closest catalog model instead.")
    heads = c["num_attention_heads"]
    return Shape(families[kind], c["hidden_size"], c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                 c.get("head_dim") or c["hidden_size"] // heads, c["intermediate_size"], c["vocab_size"],
                 act=c.get("hidden_act") or c.get("hidden_activation") or "silu", tied=c.get("tie_word_embeddings", False),
                 attn_dropout=c.get("attention_dropout", 0.0), attn_impl=impl, qkv_bias=kind == "qwen2")


def _lora_parameters(shape: Shape, r: int, targets) -> int:
    chosen = LINEAR_TARGETS if targets == "all-linear" else tuple(targets)
    unknown = [t for t in chosen if t not in LINEAR_TARGETS]
    if unknown:
        raise ValueError(f"Unknown LoRA targets {unknown}; use names from {LINEAR_TARGETS} or 'all-linear'")
    return shape.layers * sum(r * (i + o) for t, (i, o) in shape.linear_shapes().items() if t in chosen)


def layer_activations(shape: Shape, *, batch_size: int, seq_len: int, compute: int, autocast: bool,
                      device: str = "cuda") -> dict[str, int]:
    """Bytes one decoder layer saves for backward, by component.

    compute: bytes of the compute dtype (4, or 2 for bf16/fp16). autocast: weights stay fp32 and
    each matmul casts; the residual stream then stays fp32.
    """
    s = shape
    n, h, i = batch_size * seq_len, s.hidden, s.intermediate
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    resid = 4 if (autocast or compute == 4) else compute  # residual stream dtype
    scores = batch_size * s.heads * seq_len * seq_len  # elements of one attention matrix
    mask = 1 if device == "cuda" else compute  # dropout mask: bool on CUDA, input dtype on CPU
    parts: dict[str, int] = {}

    def norm(consumers: int) -> int:
        """A norm and the inputs of the `consumers` linears that read its output."""
        if s.layernorm:  # input, mean, rstd; computed in fp32 under autocast
            b = max(resid, compute) * n * h + 8 * n
            out = 4 if (autocast or compute == 4) else compute
        else:  # RMSNorm upcasts: input in fp32, 1/rms, normalized x in fp32
            b = 4 * n * h + 4 * n + 4 * n * h + (4 * h if s.family == "gemma" else 0)
            out = resid
            if resid != 4:  # weight * x.to(half): the half copy is saved for the weight's gradient
                b += compute * n * h
        # autocast casts the norm output once per consuming linear; otherwise they share it
        b += (consumers * compute if autocast and out == 4 else out) * n * h
        return b

    parts["norms"] = norm(1 if s.fused_qkv else 3) + norm(1 if s.gated and s.family == "phi3" else (2 if s.gated else 1))
    drop_attn = s.attn_dropout > 0
    math_path = s.attn_impl == "eager" or (drop_attn and device == "cpu")  # CPU's fused kernel has no dropout
    # CPU's math kernel for sdpa upcasts half inputs and computes attention in fp32
    cb = 4 if math_path and s.attn_impl != "eager" and device == "cpu" else compute
    if s.family == "gpt2":  # eager: views of the fused projection; math kernel: contiguous copies
        attn = 3 * n * h * cb
    else:
        fused = compute * n * (q + 2 * kv)
        rotated_qk = compute * n * (q + kv)
        if math_path and s.kv_heads < s.heads:  # repeat_kv materializes k and v per query head
            attn = compute * n * q * 3
        elif math_path:
            attn = rotated_qk + (fused if s.fused_qkv else compute * n * kv)
        else:
            attn = rotated_qk + (fused if s.fused_qkv else compute * n * kv)
    if math_path:
        attn += 4 * scores  # softmax output, fp32
        if drop_attn:  # the dropout mask, and the dropped probabilities the next matmul reads
            attn += (1 if device == "cuda" else cb) * scores + cb * scores
        elif compute != 4:  # the probabilities cast back to the compute dtype for the matmul
            attn += compute * scores
    else:
        attn += 4 * batch_size * s.heads * seq_len  # log-sum-exp per query, fp32
    parts["attention"] = attn + compute * n * q  # + the attention output read by o_proj
    if s.gated:
        mlp = (2 * i if s.family == "phi3" else i) * compute * n  # gate (fused with up in Phi-3)
        mlp += (0 if s.family == "phi3" else compute * n * i)  # up
        mlp += 2 * compute * n * i  # act(gate), act(gate) * up
        mlp += (ACTIVATION_SAVES.get(s.act, 1) - 1) * compute * n * i
    else:
        mlp = (ACTIVATION_SAVES.get(s.act, 1) + 1) * compute * n * i  # what the activation saves, its output
    parts["mlp"] = mlp
    if s.resid_dropout > 0:
        parts["dropout"] = 2 * mask * n * h  # after attention, after the MLP
    return parts


def estimate_training_memory(
    model,
    *,
    batch_size: int,
    seq_len: int,
    precision: str = "bf16",
    weights: str | None = None,
    method: str = "full",
    lora_r: int = 16,
    lora_targets="all-linear",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    device: str = "cuda",
    attn_impl: str | None = None,
) -> Estimate:
    """Estimate the memory of one training step, in bytes, before anything is loaded.

    Args:
        model: a catalog name ("Mistral-7B"), a transformers config, or a config dict.
        batch_size, seq_len: the per-device micro-batch (tokens = batch_size x seq_len).
        precision: compute precision, "fp32", "bf16" or "fp16" (mixed precision via autocast).
        weights: how the weights are stored: "fp32" (default for full fine-tuning: the fp32
            master weights of mixed precision), "bf16"/"fp16" (pure half), "int8" or "nf4".
        method: "full", "lora" (frozen base + adapters) or "qlora" (nf4 base + adapters).
        lora_r, lora_targets: adapter rank and targets ("all-linear" or names from LINEAR_TARGETS).
        optimizer: "adamw", "adamw_8bit", "paged_adamw_8bit" or "sgd".
        checkpointing: gradient checkpointing (non-reentrant) on every decoder layer.
        device: "cuda" (default) or "cpu": dropout masks and the attention kernel differ.
        attn_impl: override the config's attention implementation ("eager", "sdpa").

    Returns:
        an Estimate: weights, gradients, optimizer, activations, logits, recompute, cuda_context,
        allocator_slack in bytes, and `allocated` / `total` / `fits(gpu)`.

    Example:
        >>> e = estimate_training_memory("Mistral-7B", batch_size=1, seq_len=512, method="qlora", checkpointing=True)
        >>> e.fits("T4")
        True
    """
    shape = shape_of(model)
    if attn_impl:
        shape = replace(shape, attn_impl=attn_impl)
    _check_choice("precision", precision, COMPUTE_BYTES)
    _check_choice("optimizer", optimizer, OPTIMIZER_BYTES)
    _check_choice("method", method, ("full", "lora", "qlora"))
    if weights is None:
        weights = {"full": "fp32", "lora": precision if precision != "fp32" else "fp32", "qlora": "nf4"}[method]
    _check_choice("weights", weights, WEIGHT_BYTES)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if method == "qlora" and weights != "nf4":
        raise ValueError(f"method='qlora' stores weights in nf4; drop weights={weights!r} or use method='lora'")
    if method == "full" and weights in ("int8", "nf4"):
        raise ValueError(f"quantized weights ({weights}) cannot be trained in full: use method='qlora' or 'lora'")

    counts = shape.parameter_counts()
    compute = COMPUTE_BYTES[precision]
    quantized = weights in ("int8", "nf4")
    # 1. weights: quantized runs keep embeddings, head and norms in fp32 (peft's k-bit preparation)
    if quantized:
        weight_bytes = counts["linear"] * WEIGHT_BYTES[weights] + 4 * (counts["embeddings"] + counts["head"] + counts["other"])
    else:
        weight_bytes = shape.parameters * WEIGHT_BYTES[weights]
    # 2. trainable parameters, their gradients and optimizer states
    if method == "full":
        trainable = shape.parameters
        grad_bytes = WEIGHT_BYTES[weights]  # gradients match the stored (master) weights
        opt_bytes = OPTIMIZER_BYTES[optimizer] * (1 if weights == "fp32" or optimizer != "adamw" else 0.5)
    else:
        trainable = _lora_parameters(shape, lora_r, lora_targets)
        weight_bytes += 4 * trainable  # adapters are kept in fp32
        grad_bytes, opt_bytes = 4, OPTIMIZER_BYTES[optimizer]
    # 3. activations: autocast whenever the matmuls run in a lower precision than the stored weights
    autocast = compute != 4 and (weights == "fp32" or quantized)
    if compute == 4 and weights not in ("fp32",) and not quantized:
        raise ValueError(f"weights={weights!r} with precision='fp32' would upcast every matmul; use precision={weights!r}")
    layer = layer_activations(shape, batch_size=batch_size, seq_len=seq_len, compute=compute,
                              autocast=autocast, device=device)
    n = batch_size * seq_len
    resid = 4 if (autocast or compute == 4) else compute
    parts = {k: v * shape.layers for k, v in layer.items()}
    if checkpointing:  # only each layer's inputs survive the forward
        parts = {"layer inputs (checkpointed)": shape.layers * resid * n * shape.hidden}
        if shape.family == "gpt2" and shape.attn_impl == "eager":  # its causal mask is an input too
            parts["attention mask"] = 4 * batch_size * seq_len * seq_len
    parts.update(_outside_layers(shape, batch_size, seq_len, compute, autocast, resid, device, checkpointing))
    if autocast and not checkpointing:  # each linear's weight cast to the compute dtype, saved
        parts["weight casts"] = compute * counts["linear"]
    if autocast:
        parts["weight casts (head)"] = compute * shape.vocab * shape.hidden
    activations = int(sum(parts.values()))
    logits = n * shape.vocab * (compute + 4)  # logits and the fp32 upcast that the loss reads
    recompute = int(sum(layer.values())) if checkpointing else 0
    allocated = weight_bytes + opt_bytes * trainable + max(activations + logits, grad_bytes * trainable + recompute)
    return Estimate(
        weights=int(weight_bytes),
        gradients=int(grad_bytes * trainable),
        optimizer=int(opt_bytes * trainable),
        activations=activations,
        logits=int(logits),
        recompute=recompute,
        cuda_context=CUDA_CONTEXT_BYTES if device == "cuda" else 0,
        allocator_slack=int(ALLOCATOR_SLACK * allocated) if device == "cuda" else 0,
        trainable=trainable,
        parameters=shape.parameters,
        settings=dict(batch_size=batch_size, seq_len=seq_len, precision=precision, weights=weights, method=method,
                      lora_r=lora_r, optimizer=optimizer, checkpointing=checkpointing, device=device,
                      attn_impl=shape.attn_impl),
        activation_parts={k: int(v) for k, v in parts.items()},
    )


def _outside_layers(shape, batch_size, seq_len, compute, autocast, resid, device, checkpointing) -> dict[str, int]:
    """Embeddings, the final norm, the head's input, the loss's saved log-probabilities."""
    n, h = batch_size * seq_len, shape.hidden
    parts = {"input ids and labels": 16 * n}
    if not shape.layernorm and not checkpointing:
        parts["rotary cos/sin"] = 2 * 4 * seq_len * shape.head_dim
    if shape.family == "gpt2":
        parts["input ids and labels"] += 8 * seq_len  # position ids
    if shape.resid_dropout > 0:
        parts["embedding dropout"] = (1 if device == "cuda" else resid) * n * h
    if shape.family == "gemma":
        parts["input ids and labels"] += 4  # the embedding scale
    if shape.layernorm:
        final = resid * n * h + 8 * n
        head_in = (compute if autocast else 4 if compute == 4 else compute) * n * h
    else:
        final = 4 * n * h + 4 * n + 4 * n * h + (4 * h if shape.family == "gemma" else 0)
        final += compute * n * h if resid != 4 else 0
        head_in = (compute if autocast else resid) * n * h
    parts["final norm"] = final + head_in
    parts["loss log-probs"] = 4 * n * shape.vocab + 4  # log_softmax output in fp32, the loss
    return parts


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, allowed))}")


@dataclass
class PlanStep:
    """One technique applied on the way to fitting a card, and the estimate after it."""

    technique: str
    why: str
    estimate: Estimate
    fits: bool


def plan(model, gpu, *, batch_size: int, seq_len: int, **settings) -> list[PlanStep]:
    """The cheapest sequence of techniques that makes a job fit `gpu`, with the memory after each.

    Techniques are tried in order of what they cost: mixed precision (nothing, and faster),
    gradient checkpointing (about a quarter more compute), a smaller per-device batch with
    gradient accumulation (same effective batch, slower steps), an 8-bit optimizer, LoRA, then
    QLoRA (both change what is trained). Each is kept once applied; the plan stops at the first
    estimate that fits. The first step is the job as asked.

    Example:
        >>> steps = plan("Mistral-7B", "T4", batch_size=4, seq_len=512)
        >>> [s.technique for s in steps][-1], steps[-1].fits
        ('QLoRA', True)
    """
    card = gpu_bytes(gpu)
    capability = None
    if isinstance(gpu, str):
        capability = tuple({k.lower(): v for k, v in load_catalog("gpus").items()}[gpu.lower()]["capability"])
    half = "bf16" if capability is None or capability >= (8, 0) else "fp16"
    current = dict(settings, batch_size=batch_size, seq_len=seq_len)
    current.setdefault("precision", half)  # the card's half precision unless asked otherwise
    accumulation = 1

    def step(technique, why, **change):
        current.update(change)
        e = estimate_training_memory(model, **current)
        steps.append(PlanStep(technique, why, e, e.total <= card))
        return e.total <= card

    steps: list[PlanStep] = []
    if step("as asked", "the job with the settings given"):
        return steps
    ladder = []
    if current.get("precision", "bf16") == "fp32":
        ladder.append(("mixed precision", f"{half} activations: half the bytes, faster on tensor cores", dict(precision=half)))
    if not current.get("checkpointing"):
        ladder.append(("gradient checkpointing", "keep only each layer's input; recompute the rest in backward",
                       dict(checkpointing=True)))
    for technique, why, change in ladder:
        if step(technique, why, **change):
            return steps
    while current["batch_size"] > 1:  # halve the micro-batch, double accumulation: same effective batch
        accumulation *= 2
        b = current["batch_size"] // 2
        if step("gradient accumulation", f"per-device batch {b} x {accumulation} accumulation steps", batch_size=b):
            return steps
    if current.get("optimizer", "adamw") == "adamw":
        if step("8-bit optimizer", "AdamW states in 8 bits (bitsandbytes)", optimizer="paged_adamw_8bit"):
            return steps
    if current.get("method", "full") == "full":
        if step("LoRA", "freeze the model in 16 bits, train low-rank adapters", method="lora", weights=half):
            return steps
    if current.get("method") != "qlora":
        step("QLoRA", "freeze the model in 4-bit NF4, train low-rank adapters", method="qlora", weights="nf4")
    return steps


def format_plan(steps: list[PlanStep], gpu) -> str:
    """The plan as plain text: one line per step with the predicted total against the card."""
    card = gpu_bytes(gpu)
    lines = [f"{'step':24} {'predicted total':>16}  fits {gpu if isinstance(gpu, str) else ''} ({card / GIB:.1f} GiB)"]
    for s in steps:
        lines.append(f"{s.technique:24} {s.estimate.total / GIB:12.2f} GiB  {'yes' if s.fits else 'no ':3}  {s.why}")
    if not steps[-1].fits:
        lines.append(f"Nothing fits: even the last step needs {steps[-1].estimate.total / GIB:.1f} GiB. "
                     "Use a shorter seq_len, a smaller model, or a bigger card (A100-40GB, A100-80GB).")
    return "\n".join(lines)
