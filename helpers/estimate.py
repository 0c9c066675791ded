"""The training-memory estimator: what a fine-tune needs before it starts, line by line.

Taught in notebook 01 (memory anatomy), used by 03 (the OOM it predicts), 05 (the 7B plan) and
`python -m helpers plan`. Pure Python on purpose: it answers for a 7B in milliseconds without
importing torch, and works offline from the shipped catalogs (helpers/assets/catalog).

How activations are counted. `activations` is the bytes autograd keeps for backward over one
micro-batch's forward pass, each storage once, parameters excluded: exactly what saved-tensor
hooks see (`helpers.memory.track_saved_tensors`). The estimator walks a layer op by op (norm,
projections, rotary, attention, MLP, dropout, LoRA adapters) and adds what each op saves, in the
dtype it saves it in. A frozen linear (LoRA, QLoRA) saves no input: autograd keeps a linear's
input only for its weight's gradient. The tests hold it to the measured bytes on CPU for Llama,
Qwen2, Gemma, GPT-2 and BERT, in fp32, under autocast, in pure bf16 and with peft's LoRA.

On a GPU the peak also holds what is not saved for backward: the logits and their fp32 upcast at
the end of the forward, the gradients flowing back through one layer, one recomputed layer during
a checkpointed backward, the optimizer's temporaries during its step, the CUDA context and the
caching allocator's slack. Those are separate lines, each a stated constant or formula.
docs/estimator-accuracy.md holds the estimator against published GPU measurements
(scripts/bench_estimator.py reruns it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

MIB, GIB = 2**20, 2**30
CATALOG_DIR = Path(__file__).parent / "assets" / "catalog"

# bytes per parameter of stored weights; nf4 with double quantization: 4-bit codes, one 8-bit
# scale per 64 weights, one fp32 scale per 256 scales (4 + 8/64 + 32/(64*256) = 4.127 bits);
# without double quantization one fp32 scale per 64 weights (4 + 32/64 = 4.5 bits)
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + 4 / 4096, "nf4": 4.127 / 8}
NF4_SINGLE_QUANT_BYTES = 4.5 / 8
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# "bf16-true" / "fp16-true" (litgpt's names; torchtune's dtype=bf16): every floating tensor is stored
# and computed in 16 bits: no autocast, no fp32 master weights, adapters and their optimizer states
# in 16 bits too, and a quantized model keeps its unquantized parameters in 16 bits (no peft k-bit
# preparation, so the embeddings' output does not require grad)
PRECISIONS = ("fp32", "bf16", "fp16", "bf16-true", "fp16-true")
# optimizer state per trainable parameter, beyond the parameter itself, for fp32 parameters; the
# AdamW family keeps its two moments in the parameter's dtype (half of this for 16-bit parameters)
OPTIMIZER_BYTES = {"adamw": 8.0, "adamw_foreach": 8.0, "adamw_hf": 8.0, "adamw_8bit": 2.0 + 8 / 256,
                   "paged_adamw_8bit": 2.0 + 8 / 256, "sgd": 0.0}
ADAMW_FAMILY = ("adamw", "adamw_foreach", "adamw_hf")
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


@dataclass
class Estimate:
    """A breakdown in bytes. `total` is what the card must hold; `allocated` what torch.cuda reports.

    `allocated` is the peak of torch.cuda.max_memory_allocated, `reserved` adds the caching
    allocator's slack (torch.cuda.max_memory_reserved), `total` adds the CUDA context too (what
    nvidia-smi and NVML show for the process).
    """

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
    backward_transient: int = 0  # gradients flowing through the last layer while its activations still live
    optimizer_step: int = 0  # temporaries of the optimizer's step (foreach or per-tensor AdamW)
    grads_in_forward: bool = False  # gradients stay allocated during the forward (accumulation, zero_grad to zeros)
    autocast_cache: int = 0  # 16-bit weight copies autocast holds until the forward ends (not saved when checkpointing)

    @property
    def allocated(self) -> int:
        """Peak bytes as torch.cuda.max_memory_allocated would report them."""
        # three moments compete: the end of the forward and the start of the backward (all
        # activations, and either the logits or the gradients flowing through the last layer),
        # the end of the backward (all gradients, one recomputed layer) and the optimizer's step
        # (gradients and its temporaries). Activations and gradients barely overlap when the
        # gradients are freed at each step (set_to_none); with accumulation or zeroed gradients
        # they are there during the forward too
        forward = self.activations + max(self.logits + self.autocast_cache, self.backward_transient)
        if self.grads_in_forward:
            return self.weights + self.optimizer + self.gradients + max(forward, self.recompute, self.optimizer_step)
        return self.weights + self.optimizer + max(forward, self.gradients + max(self.recompute, self.optimizer_step))

    @property
    def reserved(self) -> int:
        """Peak bytes as torch.cuda.max_memory_reserved would report them: allocated plus slack."""
        return self.allocated + self.allocator_slack

    @property
    def total(self) -> int:
        return self.allocated + self.cuda_context + self.allocator_slack

    def __getitem__(self, key: str) -> int:
        return getattr(self, key)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(allocated=self.allocated, reserved=self.reserved, total=self.total)
        return d

    def fits(self, gpu) -> bool:
        """True when the estimate fits `gpu`: a catalog name ("T4"), a GiB figure, or bytes."""
        return self.total <= gpu_bytes(gpu)

    def table(self) -> str:
        rows = [("weights", self.weights), ("gradients", self.gradients), ("optimizer", self.optimizer),
                ("activations", self.activations), ("logits (transient)", self.logits),
                ("autocast cache (transient)", self.autocast_cache),
                ("backward (transient)", self.backward_transient), ("recompute (checkpointing)", self.recompute),
                ("optimizer step (transient)", self.optimizer_step), ("CUDA context", self.cuda_context),
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
    if kind == "bert":  # an encoder trained with a classification head (BertForSequenceClassification)
        h, heads = c["hidden_size"], c["num_attention_heads"]
        labels = c.get("num_labels") or len(c.get("id2label") or {}) or 2
        return Shape("bert", h, c["num_hidden_layers"], heads, heads, h // heads, c["intermediate_size"],
                     c["vocab_size"], act=c.get("hidden_act", "gelu"),
                     attn_dropout=c.get("attention_probs_dropout_prob", 0.1),
                     resid_dropout=c.get("hidden_dropout_prob", 0.1), attn_impl=impl, qkv_bias=True,
                     max_positions=c["max_position_embeddings"], head="classifier", num_labels=labels,
                     type_vocab=c.get("type_vocab_size", 2))
    families = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma": "gemma", "phi3": "phi3"}
    if kind not in families:
        raise ValueError(f"The estimator does not know model_type {kind!r} yet; it knows "
                         f"{', '.join(sorted(families) + ['bert', 'gpt2'])}. Pick the closest catalog model instead.")
    heads = c["num_attention_heads"]
    return Shape(families[kind], c["hidden_size"], c["num_hidden_layers"], heads, c.get("num_key_value_heads") or heads,
                 c.get("head_dim") or c["hidden_size"] // heads, c["intermediate_size"], c["vocab_size"],
                 act=c.get("hidden_act") or c.get("hidden_activation") or "silu", tied=c.get("tie_word_embeddings", False),
                 attn_dropout=c.get("attention_dropout", 0.0), attn_impl=impl, qkv_bias=kind == "qwen2")


def _lora_targets(shape: Shape, targets) -> tuple[str, ...]:
    chosen = LINEAR_TARGETS if targets == "all-linear" else tuple(targets)
    unknown = [t for t in chosen if t not in LINEAR_TARGETS]
    if unknown:
        raise ValueError(f"Unknown LoRA targets {unknown}; use names from {LINEAR_TARGETS} or 'all-linear'")
    return tuple(t for t in chosen if t in shape.linear_shapes())


def _adapter_shapes(shape: Shape, targets) -> dict[str, tuple[int, int]]:
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
    count = shape.layers * sum(r * (i + o) for i, o in _adapter_shapes(shape, targets).values())
    if shape.head == "classifier":
        count += shape.hidden * shape.num_labels + (shape.num_labels if shape.family == "bert" else 0)
        if shape.family == "bert" and targets == "all-linear":
            count += r * 2 * shape.hidden
    return count


@dataclass(frozen=True)
class Adapters:
    """How a frozen base is trained: which linears carry LoRA adapters, and what they save.

    targets: adapted modules ("q", ..., "down"; "qkv" for a fused projection). r: rank.
    dropout: LoRA dropout before lora_A (a mask and a dropped copy of the input per adapter).
    adapter_bytes: the adapters' dtype (peft keeps them in fp32 and casts its input to it).
    keeps_input: the quantized base linear keeps its input alive for backward (bitsandbytes
    releases of 2023, e.g. 0.41, kept `ctx.tensors = (A, B)`; current ones keep only the weight).
    """

    targets: frozenset = frozenset()
    r: int = 16
    dropout: float = 0.0
    adapter_bytes: int = 4
    keeps_input: bool = False
    cast_under_autocast: bool = True  # peft's LoRA Linear casts its input even under autocast; the 4-bit one not


def layer_activations(shape: Shape, *, batch_size: int, seq_len: int, compute: int, autocast: bool,
                      device: str = "cuda", adapters: Adapters | None = None,
                      input_grad: bool = True) -> dict[str, int]:
    """Bytes one layer saves for backward, by component.

    compute: bytes of the compute dtype (4, or 2 for bf16/fp16). autocast: weights stay fp32 and
    each matmul casts; the residual stream then stays fp32. adapters: None when every weight is
    trained; otherwise the base is frozen and only adapted linears (and kept inputs) save inputs.
    input_grad: False for the first layer of a frozen model whose embeddings' output needs no
    gradient: its first norm saves nothing, nor do the ops whose other operand needs no gradient.
    """
    if shape.family == "bert":
        return _bert_layer(shape, batch_size, seq_len, compute, autocast, device, adapters, input_grad)
    s = shape
    n, h, i = batch_size * seq_len, s.hidden, s.intermediate
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    resid = 4 if (autocast or compute == 4) else compute  # residual stream dtype
    scores = batch_size * s.heads * seq_len * seq_len  # elements of one attention matrix
    mask = 1 if device == "cuda" else compute  # dropout mask: bool on CUDA, input dtype on CPU
    inputs = _Inputs(n, compute, autocast, device, adapters)
    parts: dict[str, int] = {}
    out = resid  # a norm's output: fp32 under autocast or in fp32, else the compute dtype
    qkv_group = ("qkv",) if s.fused_qkv else ("q", "k", "v")
    mlp_group = ("up",) if not s.gated or s.family == "phi3" else ("gate", "up")
    own = _norm_own(s, n, resid, compute, frozen=adapters is not None, device=device)
    parts["norms"] = (own * (2 if input_grad else 1)
                      + inputs.group(h, out, qkv_group, grad=input_grad) + inputs.group(h, out, mlp_group))

    drop_attn = s.attn_dropout > 0
    math_path = s.attn_impl == "eager" or (drop_attn and device == "cpu")  # CPU's fused kernel has no dropout
    # CPU's math kernel for sdpa upcasts half inputs and computes attention in fp32
    cb = 4 if math_path and s.attn_impl != "eager" and device == "cpu" else compute
    if s.family == "gpt2":  # eager: views of the fused projection; math kernel: contiguous copies
        attn = 3 * n * h * cb
        if s.attn_impl == "eager" and batch_size == 1:  # matmul copies key and value, keeps query a view
            attn += 2 * n * h * cb
    else:
        fused = compute * n * (q + 2 * kv)
        rotated_qk = compute * n * (q + kv)
        if math_path and s.kv_heads < s.heads:  # repeat_kv materializes k and v per query head
            attn = compute * n * q * 3
        else:
            attn = rotated_qk + (fused if s.fused_qkv else compute * n * kv)
        if math_path and not input_grad and not s.fused_qkv:  # q @ k^T keeps each side for the other's grad
            k_bytes = compute * n * (q if s.kv_heads < s.heads else kv)
            attn -= (0 if "k" in adapters.targets else compute * n * q) + (0 if "q" in adapters.targets else k_bytes)
    if math_path:
        # softmax output: fp32 (Llama's eager softmax upcasts; GPT-2's runs in the scores' dtype,
        # fp32 under autocast through its fp32 mask, and so does the math kernel)
        soft = compute if s.family == "gpt2" and s.attn_impl == "eager" and resid != 4 else 4
        attn += soft * scores
        if drop_attn:  # the dropout mask, and the dropped probabilities the next matmul reads
            attn += (1 if device == "cuda" else cb) * scores + cb * scores
        elif soft != cb:  # the probabilities cast back to the compute dtype for the matmul
            attn += cb * scores
        # the heads merged into one contiguous tensor: saved only by o_proj, for its weight
        attn += inputs.group(q, compute, ("o",))
    else:  # the fused kernel saves its output, which o_proj reads as a view
        attn += 4 * batch_size * s.heads * seq_len + compute * n * q  # log-sum-exp per query, fp32
        attn += inputs.group(q, compute, ("o",), already_saved=True)
    parts["attention"] = attn
    if s.gated:
        mlp = (2 * i if s.family == "phi3" else i) * compute * n  # gate (fused with up in Phi-3)
        mlp += (0 if s.family == "phi3" else compute * n * i)  # up
        mlp += compute * n * i  # act(gate), saved by the product with up
        mlp += (ACTIVATION_SAVES.get(s.act, 1) - 1) * compute * n * i
    else:
        mlp = ACTIVATION_SAVES.get(s.act, 1) * compute * n * i  # what the activation saves
    parts["mlp"] = mlp + inputs.group(i, compute, ("down",))  # + the input of the down projection
    if s.resid_dropout > 0:
        parts["dropout"] = 2 * mask * n * h  # after attention, after the MLP
    if adapters is not None:
        parts["lora"] = inputs.adapter_bytes
        parts["norms"] -= inputs.adapter_bytes_in(("qkv", "q", "k", "v", "gate", "up"))
        parts["attention"] -= inputs.adapter_bytes_in(("o",))
        parts["mlp"] -= inputs.adapter_bytes_in(("down",))
    return parts


class _Inputs:
    """What a group of linears reading the same tensor keeps of it, for their backward.

    A trained linear keeps its input (under autocast, its own 16-bit cast of it). A frozen one
    keeps nothing, unless it carries a LoRA adapter: lora_A keeps its input (after peft's cast to
    the adapter dtype and the LoRA dropout, each a new tensor per adapter) and lora_B keeps
    lora_A's output (tokens x r). A quantized base that keeps its input keeps a compute-dtype copy.
    """

    def __init__(self, n, compute, autocast, device, adapters):
        self.n, self.c, self.autocast, self.device, self.adapters = n, compute, autocast, device, adapters
        self.adapter_bytes = 0
        self._by_target: dict[str, int] = {}

    def group(self, width: int, xb: int, targets, already_saved: bool = False, grad: bool = True) -> int:
        """Bytes kept for the input (`xb` bytes an element, `width` wide) of the linears `targets`.

        grad: whether the input requires grad (a dropout on one that does not keeps no mask)."""
        n, c, a = self.n, self.c, self.adapters
        if a is None:  # every linear is trained
            if self.autocast and xb != c:
                return len(targets) * c * n * width  # each linear casts the input for itself
            return 0 if already_saved else xb * n * width
        total, shared = 0, False
        if a.keeps_input:  # the quantized base casts its input to the compute dtype and keeps it
            if xb == c:
                shared = True
            else:
                total += len(targets) * c * n * width
        for t in targets:
            if t not in a.targets:
                continue
            lora, yb, new = 0, xb, False
            if a.adapter_bytes != xb and (not self.autocast or a.cast_under_autocast):
                yb, new = a.adapter_bytes, True  # peft casts the input to the adapter dtype
            if a.dropout > 0:  # a mask, and a dropped copy
                lora += (1 if self.device == "cuda" else yb) * n * width if grad else 0
                new = True
            if self.autocast and yb != c:  # lora_A casts its input under autocast
                lora += c * n * width
            elif new:
                lora += yb * n * width
            else:
                shared = True
            lora += (c if self.autocast else a.adapter_bytes) * n * a.r  # lora_A's output, read by lora_B
            self._by_target[t] = lora
            self.adapter_bytes += lora
            total += lora
        if shared and not already_saved:
            total += xb * n * width
        return total

    def adapter_bytes_in(self, targets) -> int:
        return sum(self._by_target.get(t, 0) for t in targets)


def _norm_own(s: Shape, n: int, resid: int, compute: int, frozen: bool, device: str = "cuda") -> int:
    """What one norm saves for itself (not its output, which its consumers keep)."""
    h = s.hidden
    if s.layernorm:  # input, mean, rstd; computed in fp32 under autocast
        return max(resid, compute) * n * h + _ln_stats(n, max(resid, compute), device)
    # RMSNorm upcasts: the fp32 input (pow and the product with 1/rms keep it) and 1/rms
    b = 4 * n * h + 4 * n
    if s.family == "gemma":  # x * (1 + weight) in fp32: keeps (1 + weight), and x for the weight
        return b + 4 * h + (0 if frozen else 4 * n * h)
    if not frozen:  # weight * x.to(input dtype) keeps that x for the weight's gradient
        b += 4 * n * h if resid == 4 else compute * n * h
    return b


def _ln_stats(n: int, dtype_bytes: int, device: str) -> int:
    """LayerNorm's mean and 1/std per token: fp32 on CUDA, the input's dtype on CPU."""
    return 2 * (4 if device == "cuda" else dtype_bytes) * n


def _bert_layer(s: Shape, batch_size, seq_len, compute, autocast, device, adapters, input_grad=True) -> dict[str, int]:
    """A post-LayerNorm encoder layer (BERT): attention, add & norm, GELU MLP, add & norm."""
    n, h, i = batch_size * seq_len, s.hidden, s.intermediate
    resid = 4 if (autocast or compute == 4) else compute
    scores = batch_size * s.heads * seq_len * seq_len
    mask = 1 if device == "cuda" else compute  # hidden dropouts act on a linear's output
    inputs = _Inputs(n, compute, autocast, device, adapters)
    parts: dict[str, int] = {}
    # the layer's input (the previous norm's output) feeds query, key and value
    parts["norms"] = (2 * _norm_own(s, n, resid, compute, frozen=adapters is not None, device=device)
                      + inputs.group(h, resid, ("q", "k", "v"), grad=input_grad))
    drop_attn = s.attn_dropout > 0
    math_path = s.attn_impl == "eager" or (drop_attn and device == "cpu")
    cb = 4 if math_path and s.attn_impl != "eager" and device == "cpu" else compute
    if math_path:
        # matmul copies the transposed query, key and value into contiguous batches
        attn = 3 * cb * n * h
        if not input_grad:  # q @ k^T keeps each side for the other's gradient
            attn -= cb * n * h * (("k" not in adapters.targets) + ("q" not in adapters.targets))
        # softmax output: fp32 under CUDA autocast, else the dtype of the scores
        soft = 4 if (autocast and device == "cuda") else cb
        attn += soft * scores
        if drop_attn:  # the mask, and the dropped probabilities the next matmul reads (cast under autocast)
            attn += (1 if device == "cuda" else soft) * scores + cb * scores
        elif soft != cb:
            attn += cb * scores
        attn += inputs.group(h, compute, ("o",))  # the heads merged into one tensor, read by the output dense
    else:  # the fused kernel keeps query, key, value, its output and the log-sum-exp
        attn = 4 * compute * n * h + 4 * batch_size * s.heads * seq_len
        attn += inputs.group(h, compute, ("o",), already_saved=True)  # its (b, s, heads, d) output, as a view
    parts["attention"] = attn
    act = ACTIVATION_SAVES.get(s.act, 1) * compute * n * i  # GELU keeps its input
    parts["mlp"] = inputs.group(h, resid, ("up",)) + act + inputs.group(i, compute, ("down",))
    parts["dropout"] = 2 * mask * n * h if s.resid_dropout > 0 else 0
    if adapters is not None:
        parts["lora"] = inputs.adapter_bytes
        parts["norms"] -= inputs.adapter_bytes_in(("q", "k", "v"))
        parts["attention"] -= inputs.adapter_bytes_in(("o",))
        parts["mlp"] -= inputs.adapter_bytes_in(("up", "down"))
    return parts


def _backward_transient(shape: Shape, batch_size: int, seq_len: int, compute: int, autocast: bool,
                        device: str = "cuda", quantized: bool = False) -> int:
    """Gradients alive at once inside one layer's backward, beside that layer's saved tensors.

    While autograd walks back through a layer, an op's output gradient and its input gradient are
    alive together: two tensors of the largest shape in the layer (the attention matrix on the
    math path, in fp32 around the softmax; otherwise the MLP's width, three with a gated MLP). A
    4-bit linear also dequantizes its weight to the compute dtype for its input's gradient.
    """
    n, i = batch_size * seq_len, shape.intermediate
    transient = (3 if shape.gated else 2) * compute * n * i
    if shape.attn_impl == "eager" or (shape.attn_dropout > 0 and device == "cpu"):
        scores = batch_size * shape.heads * seq_len * seq_len
        soft = 4 if (autocast or compute == 4 or shape.family != "bert") else compute
        transient = max(transient, 2 * soft * scores)
    if quantized:
        transient += compute * max(a * b for a, b in shape.linear_shapes().values())
    return transient


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
    lora_dropout: float = 0.0,
    double_quant: bool = True,
    grad_accum_steps: int = 1,
    set_to_none: bool = True,
    quant_keeps_input: bool = False,
    cuda_context_bytes: int | None = None,
) -> Estimate:
    """Estimate the memory of one training step, in bytes, before anything is loaded.

    Args:
        model: a catalog name ("Mistral-7B"), a transformers config, or a config dict.
        batch_size, seq_len: the per-device micro-batch (tokens = batch_size x seq_len).
        precision: compute precision: "fp32", "bf16" or "fp16" (mixed precision via autocast), or
            "bf16-true" / "fp16-true" (everything in 16 bits, no autocast: litgpt, torchtune).
        weights: how the weights are stored: "fp32" (default for full fine-tuning: the fp32
            master weights of mixed precision), "bf16"/"fp16" (pure half), "int8" or "nf4".
        method: "full", "lora" (frozen base + adapters) or "qlora" (nf4 base + adapters).
        lora_r, lora_targets: adapter rank and targets ("all-linear" or names from LINEAR_TARGETS).
        optimizer: "adamw" (fused, the Trainer's default), "adamw_foreach" (torch.optim.AdamW's
            default: one state-sized temporary during the step), "adamw_hf" (one tensor at a time:
            transformers' old AdamW), "adamw_8bit", "paged_adamw_8bit" or "sgd".
        checkpointing: gradient checkpointing (non-reentrant) on every layer.
        device: "cuda" (default) or "cpu": dropout masks and the attention kernel differ.
        attn_impl: override the config's attention implementation ("eager", "sdpa").
        lora_dropout: LoRA dropout (peft's default is 0.0; litgpt and torchtune use 0.05).
        double_quant: nf4 with double quantization (bnb_4bit_use_double_quant, torchao's NF4).
        grad_accum_steps: micro-batches per optimizer step; above 1 the gradients are alive
            during the forward of the next micro-batch.
        set_to_none: optimizer.zero_grad(set_to_none=True) frees the gradients after each step
            (PyTorch 2.x, the Trainer). False keeps them allocated as zeros (PyTorch 1.x's
            model.zero_grad()), beside the next forward's activations.
        quant_keeps_input: each quantized linear keeps its input for backward (bitsandbytes
            releases of 2023); current releases keep only the packed weight.
        cuda_context_bytes: the CUDA context (and library kernels) outside the allocator;
            default CUDA_CONTEXT_BYTES. Pass a measured figure when you have one.

    Returns:
        an Estimate: weights, gradients, optimizer, activations, logits, recompute, cuda_context,
        allocator_slack in bytes, and `allocated` / `reserved` / `total` / `fits(gpu)`.

    Example:
        >>> e = estimate_training_memory("Mistral-7B", batch_size=1, seq_len=512, method="qlora", checkpointing=True)
        >>> e.fits("T4")
        True
    """
    shape = shape_of(model)
    if attn_impl:
        shape = replace(shape, attn_impl=attn_impl)
    _check_choice("precision", precision, PRECISIONS)
    _check_choice("optimizer", optimizer, OPTIMIZER_BYTES)
    _check_choice("method", method, ("full", "lora", "qlora"))
    true_half = precision.endswith("-true")
    base = precision.removesuffix("-true")
    if weights is None:
        weights = {"full": "fp32" if not true_half else base, "lora": base, "qlora": "nf4"}[method]
    _check_choice("weights", weights, WEIGHT_BYTES)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("grad_accum_steps", grad_accum_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if method == "qlora" and weights != "nf4":
        raise ValueError(f"method='qlora' stores weights in nf4; drop weights={weights!r} or use method='lora'")
    if method == "full" and weights in ("int8", "nf4"):
        raise ValueError(f"quantized weights ({weights}) cannot be trained in full: use method='qlora' or 'lora'")
    if shape.head == "classifier" and shape.num_labels < 1:
        raise ValueError("a classifier head needs num_labels >= 1 in the model's shape")
    if shape.family == "bert" and shape.head != "classifier":
        raise ValueError("BERT is modeled with its sequence-classification head: use head='classifier' and num_labels")

    counts = shape.parameter_counts()
    compute = COMPUTE_BYTES[base]
    quantized = weights in ("int8", "nf4")
    if true_half and weights not in (base, "int8", "nf4"):
        raise ValueError(f"precision={precision!r} stores every weight in {base}; drop weights={weights!r}")
    if compute == 4 and weights not in ("fp32",) and not quantized:
        raise ValueError(f"weights={weights!r} with precision='fp32' would upcast every matmul; "
                         f"use precision={weights!r}")
    weight_per_param = NF4_SINGLE_QUANT_BYTES if weights == "nf4" and not double_quant else WEIGHT_BYTES[weights]
    # 1. weights: quantized runs keep embeddings, head and norms in fp32 (peft's k-bit preparation),
    #    or in 16 bits when everything is 16-bit (litgpt's bf16-true, torchtune)
    kept = compute if true_half else 4
    if quantized:
        unquantized = counts["embeddings"] + counts["head"] + counts["other"]
        weight_bytes = counts["linear"] * weight_per_param + kept * unquantized
    else:
        weight_bytes = shape.parameters * weight_per_param
    # 2. trainable parameters, their gradients and optimizer states (the AdamW family keeps its
    #    moments in the parameter's dtype; 8-bit optimizers quantize them whatever the dtype)
    if method == "full":
        trainable = shape.parameters
        param_bytes = weight_per_param  # gradients match the stored (master) weights
    else:
        trainable = _lora_parameters(shape, lora_r, lora_targets)
        param_bytes = compute if true_half else 4  # peft keeps adapters in fp32
        weight_bytes += param_bytes * trainable
    grad_bytes = param_bytes
    opt_bytes = OPTIMIZER_BYTES[optimizer] * (param_bytes / 4 if optimizer in ADAMW_FAMILY + ("sgd",) else 1)
    # 3. activations: autocast whenever the matmuls run in a lower precision than the stored weights
    autocast = compute != 4 and (weights == "fp32" or quantized) and not true_half
    adapters = None
    if method != "full":
        adapters = Adapters(frozenset(_adapter_shapes(shape, lora_targets)), lora_r, lora_dropout, param_bytes,
                            keeps_input=quant_keeps_input and quantized, cast_under_autocast=not quantized)
    args = dict(batch_size=batch_size, seq_len=seq_len, compute=compute, autocast=autocast, device=device,
                adapters=adapters)
    layer = layer_activations(shape, **args)
    n = batch_size * seq_len
    resid = 4 if (autocast or compute == 4) else compute
    # transformers' gradient checkpointing (and peft's k-bit preparation with it) makes the
    # embeddings' output require grad; otherwise a frozen model's first layer reads a tensor that
    # needs no gradient
    first_grad = method == "full" or (not true_half and checkpointing)
    first = layer if first_grad else layer_activations(shape, **args, input_grad=False)
    parts = {k: v * (shape.layers - 1) + first.get(k, 0) for k, v in layer.items() if v}
    if checkpointing:  # only each layer's inputs survive the forward
        parts = {"layer inputs (checkpointed)": shape.layers * resid * n * shape.hidden}
        if shape.family == "gpt2" and shape.attn_impl == "eager":  # its causal mask is an input too
            parts["attention mask"] = resid * batch_size * seq_len * seq_len
    pooler = None
    if adapters is not None and shape.family == "bert" and lora_targets == "all-linear":
        pooler = replace(adapters, targets=frozenset({"pooler"}))
    parts.update(_outside_layers(shape, batch_size, seq_len, compute, autocast, resid, device, checkpointing,
                                 frozen=adapters is not None, keeps_head_input=False, pooler=pooler))
    if not first_grad:  # the embeddings' dropout and BERT's embedding norm act on a tensor without grad
        parts.pop("embedding dropout", None)
        parts.pop("embedding norm", None)
    # under autocast each linear's weight is cast to the compute dtype and kept: a linear needs its
    # weight for its input's gradient, frozen or not (a 4-bit base is dequantized, not kept)
    if autocast and not checkpointing:
        cast = (0 if quantized else counts["linear"]) + (trainable if method != "full" else 0)
        if not first_grad and not quantized:  # the first layer's q, k, v need no input gradient: no weight kept
            cast -= sum(a * b for t, (a, b) in shape.linear_shapes().items() if t in ("q", "k", "v"))
        parts["weight casts"] = compute * cast
    if autocast:
        head = counts["head"] if shape.head == "classifier" else shape.vocab * shape.hidden  # tied or not
        if pooler is not None and checkpointing:  # the pooler's adapter lies outside the checkpointed layers
            head += 2 * lora_r * shape.hidden
        parts["weight casts (head)"] = compute * head
    activations = int(sum(parts.values()))
    if shape.head == "classifier":
        rows = batch_size if shape.family == "bert" else n
        logits = rows * shape.num_labels * (compute + 4)
    else:
        logits = n * shape.vocab * (compute + 4)  # logits and the fp32 upcast that the loss reads
    recompute = int(sum(layer.values())) if checkpointing else 0
    backward = _backward_transient(shape, batch_size, seq_len, compute, autocast, device, quantized)
    # 4. the optimizer's step: foreach AdamW builds sqrt(exp_avg_sq) for every tensor at once; the
    #    per-tensor loop one tensor at a time (the largest trainable tensor bounds it)
    if optimizer == "adamw_foreach":
        step = param_bytes * trainable
    elif optimizer == "adamw_hf":
        if method == "full":
            largest = max([a * b for a, b in shape.linear_shapes().values()] + [shape.vocab * shape.hidden])
        else:
            largest = max(lora_r * max(io) for io in _adapter_shapes(shape, lora_targets).values())
        step = param_bytes * largest
    else:  # fused AdamW, 8-bit optimizers (in place, block by block) and SGD
        step = 0
    grads_in_forward = grad_accum_steps > 1 or not set_to_none
    # autocast caches the 16-bit copy of every trainable fp32 weight until the forward's autocast
    # region ends; without checkpointing the copies are saved anyway (the "weight casts" lines)
    autocast_cache = compute * counts["linear"] if autocast and checkpointing and method == "full" else 0
    e = Estimate(
        weights=int(weight_bytes),
        gradients=int(grad_bytes * trainable),
        optimizer=int(opt_bytes * trainable),
        activations=activations,
        logits=int(logits),
        recompute=recompute,
        cuda_context=0,
        allocator_slack=0,
        trainable=trainable,
        parameters=shape.parameters,
        settings=dict(batch_size=batch_size, seq_len=seq_len, precision=precision, weights=weights, method=method,
                      lora_r=lora_r, optimizer=optimizer, checkpointing=checkpointing, device=device,
                      attn_impl=shape.attn_impl, grad_accum_steps=grad_accum_steps, set_to_none=set_to_none),
        activation_parts={k: int(v) for k, v in parts.items()},
        backward_transient=int(backward),
        optimizer_step=int(step),
        grads_in_forward=grads_in_forward,
        autocast_cache=autocast_cache,
    )
    if device == "cuda":
        e.cuda_context = CUDA_CONTEXT_BYTES if cuda_context_bytes is None else int(cuda_context_bytes)
        e.allocator_slack = int(ALLOCATOR_SLACK * e.allocated)
    return e


def _outside_layers(shape, batch_size, seq_len, compute, autocast, resid, device, checkpointing,
                    frozen=False, keeps_head_input=False, pooler: Adapters | None = None) -> dict[str, int]:
    """Embeddings, the final norm, the head's input, the loss's saved log-probabilities."""
    n, h = batch_size * seq_len, shape.hidden
    parts = {"input ids and labels": (8 if frozen else 16) * n}  # the embedding keeps the ids for its weight
    if not shape.layernorm and not checkpointing:
        parts["rotary cos/sin"] = 2 * (4 if resid == 4 else compute) * seq_len * shape.head_dim
    if shape.family == "gpt2":
        parts["input ids and labels"] += 8 * seq_len  # position ids
    if shape.resid_dropout > 0:
        parts["embedding dropout"] = (1 if device == "cuda" else resid) * n * h
    if shape.family == "gemma":
        parts["input ids and labels"] += 4  # the embedding scale
    if shape.family == "bert":
        return _bert_outside(shape, batch_size, seq_len, compute, autocast, resid, device, frozen, parts, pooler)
    if shape.layernorm:
        final = resid * n * h + _ln_stats(n, resid, device)
        head_in = (compute if autocast else 4 if compute == 4 else compute) * n * h
    else:
        final = _norm_own(shape, n, resid, compute, frozen, device)
        head_in = (compute if autocast else resid) * n * h
    if frozen and not keeps_head_input and shape.head != "classifier":  # a frozen head keeps nothing of its input
        head_in = 0
    parts["final norm"] = final + head_in
    if shape.head == "classifier":
        parts["loss log-probs"] = 4 * batch_size * shape.num_labels + 4
    else:
        parts["loss log-probs"] = 4 * n * shape.vocab + 4  # log_softmax output in fp32, the loss
    return parts


def _bert_outside(shape, batch_size, seq_len, compute, autocast, resid, device, frozen, parts,
                  pooler) -> dict[str, int]:
    """BERT's embeddings (word + position + token type, LayerNorm, dropout), pooler and classifier."""
    n, h, b = batch_size * seq_len, shape.hidden, batch_size
    # the word, position and token-type embeddings keep their indices (the position ids are a
    # view of a buffer of max_positions), the loss its labels
    parts["input ids and labels"] = (0 if frozen else 8 * n + 8 * shape.max_positions + 8 * seq_len) + 8 * b
    parts["embedding norm"] = resid * n * h + _ln_stats(n, resid, device)
    if frozen and pooler is None:  # a frozen pooler keeps nothing
        pooled = 0
    elif frozen:  # its adapter keeps the first token's state, through peft's cast and dropout if any
        last = _Inputs(b, compute, autocast, device, pooler)
        pooled = last.group(h, resid, ("pooler",))
        if not autocast and pooler.adapter_bytes == resid and pooler.dropout == 0:
            pooled += resid * h * (n - b)  # a view of the last hidden state: its whole storage
    elif autocast:  # the pooler's dense casts the first token's state
        pooled = compute * b * h
    else:  # the pooler's dense keeps a view of the last hidden state: its whole storage
        pooled = resid * n * h
    act = (compute if autocast else resid) * b * h  # tanh keeps its output
    # the classifier (always trained) keeps its input, the dropped pooled state, and the mask
    drop = ((1 if device == "cuda" else compute if autocast else resid) * b * h
            + (compute if autocast else resid) * b * h)
    parts["pooler and classifier"] = pooled + act + drop
    parts["loss log-probs"] = 4 * b * shape.num_labels + 4
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
    gradient accumulation (same effective batch, slower steps; skipped when the gradients, alive
    during the next micro-batch, outweigh the activations it saves), an 8-bit optimizer, LoRA,
    then QLoRA (both change what is trained). Each is kept once applied; the plan stops at the
    first estimate that fits. The first step is the job as asked.

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
    accumulation = current.get("grad_accum_steps", 1)
    while current["batch_size"] > 1:  # halve the micro-batch, double accumulation: same effective batch
        b = current["batch_size"] // 2
        trial = estimate_training_memory(model, **dict(current, batch_size=b, grad_accum_steps=2 * accumulation))
        if trial.total >= steps[-1].estimate.total:  # the gradients, alive during the next micro-batch,
            break  # outweigh the activations it saves: accumulation saves nothing here
        accumulation *= 2
        if step("gradient accumulation", f"per-device batch {b} x {accumulation} accumulation steps", batch_size=b,
                grad_accum_steps=accumulation):
            return steps
    if current.get("optimizer", "adamw") in ADAMW_FAMILY:
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
