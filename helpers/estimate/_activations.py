"""What one micro-batch's forward pass saves for backward, op by op: the estimator's per-layer walk.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy). "Saved" means what
saved-tensor hooks see (`helpers.saved_tensors.track_saved_tensors`): each storage once, parameters
excluded. The decoder layers (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, GPT-NeoX, GPT-2) and
BERT's post-norm encoder layer share one walk: norms (and Qwen3's and Gemma 3's per-head q/k
norms), the projections' inputs, rotary, attention (eager, sdpa's fused kernel or its math
fallback), the MLP, dropout, LoRA adapters on a 16-bit or a 4-bit base; each op adds what it
saves, in the dtype it saves it in. A frozen linear (LoRA, QLoRA) saves no input: autograd keeps
a linear's input only for its weight's gradient. `outside_layers` counts the embeddings, the final
norm, the head and the loss; `backward_transient` the gradients alive inside one layer's backward;
`weight_casts` the 16-bit weight copies autocast keeps.
tests/test_estimate.py and tests/test_estimate_families.py hold the walk to the bytes measured on
CPU for every family, eager and sdpa, dropout on and off, in fp32, under autocast, in pure bf16,
with peft's LoRA and with QLoRA. Longer than 400 lines because the walk is one sequence of ops that
every family shares with its own variations: split by family, each op's rule would be repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING

# FP32_BYTES: autocast's residual stream, softmax and loss upcasts, LayerNorm statistics
from helpers.estimate._attention import attention_kernel
from helpers.estimate._job import FP32_BYTES
from helpers.estimate._shapes import adapter_shapes

if TYPE_CHECKING:
    from helpers.estimate._job import Job
    from helpers.estimate._shapes import Shape

__all__ = [
    "ACTIVATION_SAVES",
    "CUDA_FP32_RECOMPUTED_SCORES",
    "CUDA_MASK_BYTES",
    "INDEX_BYTES",
    "Adapters",
    "Forward",
    "backward_transient",
    "layer_activations",
    "outside_layers",
    "quant_kept_inputs",
    "recomputed_scores",
    "weight_casts",
]

INDEX_BYTES = 8  # an int64 token id, label or position id
CUDA_MASK_BYTES = 1  # a dropout mask is bool on CUDA; on CPU it has its input's dtype
# what the activation function saves for backward, in tensors of the MLP's width:
# silu, relu, gelu and tanh-gelu save one tensor; GPT-2's python "gelu_new" saves four
ACTIVATION_SAVES = {"silu": 1, "relu": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4, "gelu_fast": 4}
# fp32 score matrices a card holds beyond the walk's count while a checkpointed layer with
# materialized fp32 scores (eager, or SDPA's math kernel) recomputes and runs its backward. Measured,
# not derived: the fitcheck T4 rows in fp32 (k-bit training without autocast) fall 11 to 23 % short
# without it and land within 4.1 % with it, none over (scripts/bench_estimator.py); the CPU
# allocator does not show it (tests/test_estimate_allocator.py), so it is counted on CUDA only
CUDA_FP32_RECOMPUTED_SCORES = 1.35


@dataclass(frozen=True, kw_only=True)
class Forward:
    """One micro-batch's forward pass: the model's shape, the tokens, the dtypes it runs in.

    compute: bytes of the compute dtype (4, or 2 for bf16/fp16). autocast: weights stay fp32 and
    each matmul casts; the residual stream then stays fp32. device: "cuda" or "cpu" (dropout
    masks and the attention kernel differ).
    """

    shape: Shape
    per_device_batch: int
    seq_len: int
    compute: int
    autocast: bool
    device: str = "cuda"
    quantized: bool = False  # a 4-bit base after peft's k-bit preparation (fp32 norms)
    dtype: str = "bf16"  # the compute dtype's name, "fp32", "bf16" or "fp16": it decides the attention kernel
    capability: tuple[int, int] | None = None  # the card's compute capability; None: `_attention.DEFAULT_CAPABILITY`
    pinned: str | None = None  # the SDPA kernel a harness pins (`Harness.sdpa_kernel`)

    @property
    def tokens(self) -> int:
        return self.per_device_batch * self.seq_len

    @property
    def resid(self) -> int:
        """Bytes of the residual stream and a norm's output: fp32 under autocast or in fp32."""
        return FP32_BYTES if (self.autocast or self.compute == FP32_BYTES) else self.compute

    @property
    def mlp_bytes(self) -> int:
        """Bytes of the MLP's width tensors: a 4-bit linear returns its output in its input's dtype,
        and under autocast the fp32 norms of peft's k-bit preparation feed gate and up in fp32."""
        return FP32_BYTES if self.quantized and self.autocast else self.compute

    @property
    def scores(self) -> int:
        """Elements of one attention matrix (all heads, the whole micro-batch)."""
        return self.per_device_batch * self.shape.heads * self.seq_len * self.seq_len

    @cached_property  # read by every term of every layer: decided once per forward pass
    def kernel(self) -> str:
        """The attention kernel that runs (`_attention.attention_kernel`)."""
        s = self.shape
        if self.pinned and s.attn_impl != "eager":
            return self.pinned
        return attention_kernel(
            s.attn_impl,
            dtype=self.dtype,
            heads=s.heads,
            kv_heads=s.kv_heads,
            head_dim=s.head_dim,
            dropout=s.attn_dropout,
            device=self.device,
            capability=self.capability,
        )

    @property
    def math_path(self) -> bool:
        """Attention materializes the scores: eager, or SDPA's math kernel (on the CPU with dropout; on
        a card in fp32 with grouped key/value heads, or in 16 bits below compute capability 8.0)."""
        return self.kernel in ("eager", "math")

    @property
    def attn_bytes(self) -> int:
        """Bytes of attention's operands: CPU's math kernel for sdpa upcasts half inputs to fp32."""
        upcast = self.math_path and self.shape.attn_impl != "eager" and self.device == "cpu"
        return FP32_BYTES if upcast else self.compute


@dataclass(frozen=True, kw_only=True)
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
    adapter_bytes: int = FP32_BYTES
    keeps_input: bool = False
    cast_under_autocast: bool = True  # peft's LoRA Linear casts its input even under autocast; the 4-bit one not


def layer_activations(f: Forward, adapters: Adapters | None = None, input_grad: bool = True) -> dict[str, int]:
    """Bytes one layer saves for backward, by component.

    adapters: None when every weight is trained; otherwise the base is frozen and only adapted
    linears (and kept inputs) save inputs. input_grad: False for the first layer of a frozen model
    whose embeddings' output needs no gradient: its first norm saves nothing, nor do the ops whose
    other operand needs no gradient.
    """
    s, inputs = f.shape, _Inputs(f, adapters)
    parts = {
        "norms": _norms(f, inputs, input_grad, frozen=adapters is not None),
        "attention": _attention(f, inputs, adapters, input_grad),
        "mlp": _mlp(f, inputs, input_grad or not s.parallel_residual or "up" in adapters.targets),
    }
    if s.resid_dropout > 0:  # after attention, after the MLP
        # on CPU a mask has its input's dtype: the MLP's output comes in its input's (fp32 from a 4-bit down)
        masks = 2 * CUDA_MASK_BYTES if f.device == "cuda" else f.compute + f.mlp_bytes
        parts["dropout"] = masks * f.tokens * s.hidden
    if adapters is not None:  # the adapters' saves on one line of their own, not in the part that feeds them
        up = "mlp" if s.family == "bert" else "norms"  # post-norm BERT's up reads attention's output, not a norm's
        parts["lora"] = inputs.adapter_bytes
        for part, targets in (
            ("norms", ("qkv", "q", "k", "v", "gate")),
            (up, ("up",)),
            ("attention", ("o",)),
            ("mlp", ("down",)),
        ):
            parts[part] -= inputs.adapter_bytes_in(targets)
    return parts


def _norms(f: Forward, inputs: _Inputs, input_grad: bool, frozen: bool) -> int:
    """What the layer's norms save for themselves, and what the linears reading their outputs keep."""
    s, own = f.shape, _norm_own(f, frozen)
    if s.family == "bert":  # post-norm: the layer's input (the previous norm's output) feeds q, k, v
        return 2 * own + inputs.group(s.hidden, f.resid, ("q", "k", "v"), grad=input_grad)
    qkv = ("qkv",) if s.fused_qkv else ("q", "k", "v")
    mlp = ("up",) if not s.gated or s.family == "phi3" else ("gate", "up")
    if s.parallel_residual:  # both norms read the layer's input: it is kept once, the statistics twice
        own = own + _ln_stats(f, max(f.resid, f.compute)) if input_grad else 0
    else:
        own *= 2 if input_grad else 1
    if s.sandwich_norms:  # Gemma 2/3 also normalize attention's and the MLP's outputs
        own += 2 * _norm_own(f, frozen)
    mlp_grad = input_grad or not s.parallel_residual  # a parallel MLP reads the layer's input too
    return (
        own
        + inputs.group(s.hidden, f.resid, qkv, grad=input_grad)
        + inputs.group(s.hidden, f.resid, mlp, grad=mlp_grad)
    )


def _attention(f: Forward, inputs: _Inputs, adapters: Adapters | None, input_grad: bool) -> int:
    """Query, key and value as attention keeps them, the probabilities or the fused kernel's output, o's input."""
    s, q = f.shape, f.shape.heads * f.shape.head_dim
    if s.family == "bert":
        kept = _bert_qkv(f, adapters, input_grad)
    elif s.family == "gpt2":  # eager: views of the fused projection; math kernel: contiguous copies
        kept = 3 * f.tokens * s.hidden * f.attn_bytes
        if s.attn_impl == "eager" and f.per_device_batch == 1:  # matmul copies key and value, keeps query a view
            kept += 2 * f.tokens * s.hidden * f.attn_bytes
    else:
        kept = _rotary_qkv(f, adapters, input_grad)
    if f.math_path:  # the heads merged into one contiguous tensor: saved only by o_proj, for its weight
        # CPU's math kernel returns the query's dtype: fp32 under autocast (rotary upcasts it)
        o_bytes = f.attn_bytes if f.autocast else f.compute
        return kept + _probabilities(f) + inputs.group(q, o_bytes, ("o",))
    # the fused kernel saves its output and a log-sum-exp per query in fp32; o_proj reads the output
    # as a view, except on CPU after a fused projection: rotary then writes the query head-major, the
    # kernel's output follows it, and merging the heads copies
    lse = FP32_BYTES * f.per_device_batch * s.heads * f.seq_len
    copied = s.fused_qkv and s.rotary and f.device == "cpu"
    return kept + lse + f.compute * f.tokens * q + inputs.group(q, f.compute, ("o",), already_saved=not copied)


def _rotary_qkv(f: Forward, adapters: Adapters | None, input_grad: bool) -> int:
    """Llama-style attention's saved query, key and value, after rotary embeddings."""
    s, c, n = f.shape, f.attn_bytes, f.tokens  # CPU's math kernel for sdpa keeps fp32 copies
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    if f.math_path and s.kv_heads < s.heads:  # repeat_kv materializes k and v per query head
        kept = c * n * q * 3
    elif s.fused_qkv and not f.math_path and f.device == "cuda":  # the value: a view of the fused output
        kept = c * n * (q + kv) + c * n * (q + 2 * kv)
    else:  # the rotated query and key, the value (a strided slice of a fused output is copied: by the
        # matmul on the math path, by CPU's fused kernel)
        kept = c * n * (q + kv) + c * n * kv
    if s.qk_norm:  # Qwen3, Gemma 3: each head's query and key normalized, in fp32
        for side, heads in (("q", s.heads), ("k", s.kv_heads)):
            if input_grad or (adapters is not None and side in adapters.targets):
                kept += _norm_own(f, adapters is not None, s.head_dim, heads, f.compute)
    if f.math_path and not input_grad and not s.fused_qkv:  # q @ k^T keeps each side for the other's grad
        k_bytes = c * n * (q if s.kv_heads < s.heads else kv)
        kept -= (0 if "k" in adapters.targets else c * n * q) + (0 if "q" in adapters.targets else k_bytes)
    return kept


def _bert_qkv(f: Forward, adapters: Adapters | None, input_grad: bool) -> int:
    """BERT's query, key and value: contiguous copies for the math path's matmuls, or the fused kernel's."""
    width = f.attn_bytes * f.tokens * f.shape.hidden
    kept = 3 * width
    if f.math_path and not input_grad:  # q @ k^T keeps each side for the other's gradient
        kept -= width * (("k" not in adapters.targets) + ("q" not in adapters.targets))
    return kept


def _probabilities(f: Forward) -> int:
    """The math path's softmax output, and its dropout mask and dropped copy, or its cast back."""
    s, cb, scores = f.shape, f.attn_bytes, f.scores
    if s.family == "bert":  # softmax in fp32 under CUDA autocast, else in the scores' dtype
        soft = FP32_BYTES if f.autocast and f.device == "cuda" else cb
        cpu_mask = soft
    else:  # Llama's eager softmax upcasts; GPT-2's runs in the scores' dtype (fp32 under autocast
        # through its fp32 mask), and so does the math kernel
        soft = f.compute if s.family == "gpt2" and s.attn_impl == "eager" and f.resid != FP32_BYTES else FP32_BYTES
        if f.kernel == "math" and f.device == "cuda":  # the CUDA math kernel's softmax keeps its input's dtype
            soft = cb
        # eager rotary attention casts the probabilities back to the query's dtype before dropout:
        # fp32 under autocast (rotary with the fp32 residual's cos/sin upcasts the query)
        cpu_mask = FP32_BYTES if f.autocast and s.rotary else cb
    kept = soft * scores
    if s.attn_softcap:  # Gemma 2: tanh(scores / cap) keeps its output, in the scores' dtype
        kept += cb * scores
    if s.attn_dropout > 0:  # the dropout mask, and the dropped probabilities the next matmul reads
        kept += (CUDA_MASK_BYTES if f.device == "cuda" else cpu_mask) * scores + cb * scores
    elif soft != cb:  # the probabilities cast back to the compute dtype for the matmul
        kept += cb * scores
    return kept


def _mlp(f: Forward, inputs: _Inputs, grad: bool = True) -> int:
    """What the activation saves, the gated product's operands, and the projections' inputs.

    grad: whether the MLP's input requires grad (not in a parallel-residual model's first frozen
    layer, whose MLP reads the embeddings' output directly): without it the activation saves nothing."""
    s = f.shape
    width = f.mlp_bytes * f.tokens * s.intermediate if grad else 0  # one tensor of the MLP's width
    saves = ACTIVATION_SAVES.get(s.act, 1)
    # gated: the activation's saves (the gate's output among them), and up and act(gate), which
    # their product keeps (Phi-3 fuses gate and up into one output)
    kept = (2 + saves) * width if s.gated else saves * width
    if s.family == "bert":  # its up projection reads the attention block's normed output
        kept += inputs.group(s.hidden, f.resid, ("up",))
    return kept + inputs.group(s.intermediate, f.mlp_bytes, ("down",))


class _Inputs:
    """What a group of linears reading the same tensor keeps of it, for their backward.

    A trained linear keeps its input (under autocast, its own 16-bit cast of it). A frozen one
    keeps nothing, unless it carries a LoRA adapter: lora_A keeps its input (after peft's cast to
    the adapter dtype and the LoRA dropout, each a new tensor per adapter) and lora_B keeps
    lora_A's output (tokens x r). A quantized base that keeps its input keeps a compute-dtype copy.
    """

    def __init__(self, f: Forward, adapters: Adapters | None):
        self.n, self.c, self.autocast, self.device, self.adapters = f.tokens, f.compute, f.autocast, f.device, adapters
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
            lora, new = self._adapter(t, width, xb, grad)
            shared = shared or not new
            total += lora
        if shared and not already_saved:
            total += xb * n * width
        return total

    def _adapter(self, target: str, width: int, xb: int, grad: bool) -> tuple[int, bool]:
        """What one adapter keeps, and whether lora_A reads a new tensor rather than the shared input."""
        n, c, a = self.n, self.c, self.adapters
        lora, yb, new = 0, xb, False
        if a.adapter_bytes != xb and (not self.autocast or a.cast_under_autocast):
            yb, new = a.adapter_bytes, True  # peft casts the input to the adapter dtype
        if a.dropout > 0:  # a mask, and a dropped copy
            lora += (CUDA_MASK_BYTES if self.device == "cuda" else yb) * n * width if grad else 0
            new = True
        if self.autocast and yb != c:  # lora_A casts its input under autocast
            lora, new = lora + c * n * width, True
        elif new:
            lora += yb * n * width
        lora += (c if self.autocast else a.adapter_bytes) * n * a.r  # lora_A's output, read by lora_B
        self._by_target[target] = lora
        self.adapter_bytes += lora
        return lora, new

    def adapter_bytes_in(self, targets) -> int:
        return sum(self._by_target.get(t, 0) for t in targets)


def _norm_own(f: Forward, frozen: bool, width: int = 0, heads: int = 1, in_bytes: int = 0) -> int:
    """What one norm saves for itself (not its output, which its consumers keep).

    width, heads, in_bytes: a norm over each head (Qwen3's and Gemma 3's q/k norms: head_dim wide,
    `heads` rows a token, reading the projection's output); by default the residual stream's."""
    s, n, h = f.shape, f.tokens * heads, width or f.shape.hidden
    if s.layernorm:  # input, mean, rstd; computed in fp32 under autocast
        return max(f.resid, f.compute) * n * h + _ln_stats(f, max(f.resid, f.compute))
    # RMSNorm upcasts: the fp32 input (pow and the product with 1/rms keep it) and 1/rms
    kept = FP32_BYTES * n * h + FP32_BYTES * n
    if s.family == "gemma":  # x * (1 + weight) in fp32: keeps (1 + weight), and x for the weight
        return kept + FP32_BYTES * h + (0 if frozen else FP32_BYTES * n * h)
    if not frozen:  # weight * x.to(input dtype) keeps that x for the weight's gradient
        kept += (in_bytes or f.resid) * n * h
    return kept


def _ln_stats(f: Forward, dtype_bytes: int) -> int:
    """LayerNorm's mean and 1/std per token: fp32 on CUDA, the input's dtype on CPU."""
    return 2 * (FP32_BYTES if f.device == "cuda" else dtype_bytes) * f.tokens


def recomputed_scores(f: Forward) -> int:
    """What a checkpointed layer's backward holds on a card beyond its saved tensors and its gradients
    when its scores are materialized in fp32 (CUDA_FP32_RECOMPUTED_SCORES); 0 elsewhere."""
    fp32_scores = f.math_path and f.attn_bytes == FP32_BYTES and f.device == "cuda"
    return int(CUDA_FP32_RECOMPUTED_SCORES * FP32_BYTES * f.scores) if fp32_scores else 0


def backward_transient(f: Forward, dequant_bytes: int = 0) -> int:
    """Gradients alive at once inside one layer's backward, beside that layer's saved tensors.

    While autograd walks back through a layer, an op's output gradient and its input gradient are
    alive together: two tensors of the largest shape in the layer (the attention matrix on the
    math path, in fp32 around the softmax; otherwise the MLP's width, three with a gated MLP). A
    4-bit linear also dequantizes its weight for its input's gradient (`dequant_bytes` per weight:
    the compute dtype, and first the dtype it was quantized from when that differs; 0 when nothing
    is quantized), and its absmax (one fp32 per 64 weights) first.
    """
    s = f.shape
    transient = (3 if s.gated else 2) * f.mlp_bytes * f.tokens * s.intermediate
    if f.math_path:  # BERT's softmax gradient runs in the residual dtype, the decoders' in fp32
        soft = f.resid if s.family == "bert" else FP32_BYTES
        transient = max(transient, 2 * soft * f.scores)
    if dequant_bytes:
        transient += (dequant_bytes + FP32_BYTES / 64) * max(a * b for a, b in s.linear_shapes().values())
    return transient


def quant_kept_inputs(job: Job, f: Forward) -> int:
    """The inputs bitsandbytes up to 0.43.1 kept on each 4-bit linear's autograd ctx (`quant_keeps_input`).

    A ctx attribute is not a saved tensor: backward does not release it (it goes with the graph),
    and non-reentrant checkpointing does not drop it. In the compute dtype: each layer's q/k/v input
    (not the first layer's when it needs no gradient), o's, the MLP's and down's, and the head's when
    it is quantized too.
    """
    if not (job.harness.quant_keeps_input and job.quantized):
        return 0
    s = job.shape
    inputs = s.layers * (2 * s.hidden + s.heads * s.head_dim + s.intermediate)
    inputs += (s.hidden if job.harness.quantize_head else 0) - (0 if job.first_grad else s.hidden)
    return f.compute * f.tokens * inputs


def outside_layers(
    f: Forward, *, checkpointing: bool, frozen: bool, pooler: Adapters | None = None, head: Adapters | None = None
) -> dict[str, int]:
    """Embeddings, the final norm (or BERT's embedding norm and pooler), the head's input, the loss.

    pooler, head: the adapter on BERT's pooler, or on the LM head (peft's target "lm_head")."""
    s, n = f.shape, f.tokens
    parts = {"input ids and labels": _indices(f, frozen)}
    if s.rotary and not checkpointing:
        parts["rotary cos/sin"] = 2 * f.resid * f.seq_len * int(s.head_dim * s.rotary_fraction)
    if s.embed_dropout > 0:
        parts["embedding dropout"] = (CUDA_MASK_BYTES if f.device == "cuda" else f.resid) * n * s.hidden
    if s.family == "bert":
        parts["embedding norm"] = f.resid * n * s.hidden + _ln_stats(f, f.resid)
        parts["pooler and classifier"] = _bert_pooler(f, frozen, pooler)
    else:
        parts["final norm"] = _final_norm(f, frozen, head)
    rows, width = (f.per_device_batch, s.num_labels) if s.head == "classifier" else (n, s.vocab)
    if s.logit_softcap:  # Gemma 2: tanh(logits / cap) keeps its output, in the logits' dtype
        parts["logit soft-capping"] = f.compute * rows * width
    parts["loss log-probs"] = FP32_BYTES * rows * width + FP32_BYTES  # log_softmax's output in fp32, the loss
    return parts


def _indices(f: Forward, frozen: bool) -> int:
    """The token ids the embeddings keep for their weights' gradients, and the labels the loss keeps."""
    s, n = f.shape, f.tokens
    if s.family == "bert":  # word, position (a view of a max_positions buffer) and token-type ids; labels
        return (0 if frozen else INDEX_BYTES * (n + s.max_positions + f.seq_len)) + INDEX_BYTES * f.per_device_batch
    kept = (INDEX_BYTES if frozen else 2 * INDEX_BYTES) * n  # labels; a trained embedding keeps the ids too
    if s.family == "gpt2":
        kept += INDEX_BYTES * f.seq_len  # position ids
    if s.family == "neox":  # its loss shifts the labels by padding each sequence with one more
        kept += INDEX_BYTES * f.per_device_batch
    if s.family == "gemma":
        kept += FP32_BYTES  # the embedding scale, one scalar
    return kept


def _final_norm(f: Forward, frozen: bool, head: Adapters | None) -> int:
    """The decoder's final norm, and the head's input (a frozen head keeps only what its adapter does)."""
    s, nh = f.shape, f.tokens * f.shape.hidden
    if s.layernorm:  # GPT-2's ln_f keeps its input and statistics
        final, head_in = f.resid * nh + _ln_stats(f, f.resid), f.compute * nh
    else:
        final, head_in = _norm_own(f, frozen), (f.compute if f.autocast else f.resid) * nh
    if frozen and s.head != "classifier":  # a frozen head keeps nothing of its input, its adapter does
        head_in = 0 if head is None else _Inputs(f, head).group(s.hidden, f.resid, ("head",))
    return final + head_in


def _bert_pooler(f: Forward, frozen: bool, pooler: Adapters | None) -> int:
    """BERT's pooler (dense and tanh on the first token) and its classifier (always trained)."""
    b, h, c = f.per_device_batch, f.shape.hidden, f.compute
    if frozen and pooler is None:  # a frozen pooler keeps nothing
        pooled = 0
    elif frozen:  # its adapter keeps the first token's state, through peft's cast and dropout if any
        pooled = _Inputs(replace(f, seq_len=1), pooler).group(h, f.resid, ("pooler",))
        if not f.autocast and pooler.adapter_bytes == f.resid and pooler.dropout == 0:
            pooled += f.resid * h * (f.tokens - b)  # a view of the last hidden state: its whole storage
    elif f.autocast:  # the pooler's dense casts the first token's state
        pooled = c * b * h
    else:  # the pooler's dense keeps a view of the last hidden state: its whole storage
        pooled = f.resid * f.tokens * h
    act = (c if f.autocast else f.resid) * b * h  # tanh keeps its output
    if f.shape.resid_dropout == 0:  # no dropout: the classifier reads tanh's output, already kept
        return pooled + act
    # the classifier keeps its input, the dropped pooled state, and the dropout mask
    mask = CUDA_MASK_BYTES if f.device == "cuda" else c if f.autocast else f.resid
    return pooled + act + mask * b * h + (c if f.autocast else f.resid) * b * h


def weight_casts(job: Job, adapted_pooler: bool, adapted_head: bool) -> dict[str, int]:
    """Under autocast each linear's weight is cast to the compute dtype and kept: a linear needs its
    weight for its input's gradient, frozen or not (a 4-bit base is dequantized, not kept)."""
    shape, counts, parts = job.shape, job.shape.parameter_counts(), {}
    if not job.autocast:
        return parts
    if not job.checkpointing:
        cast = (0 if job.quantized else counts["linear"]) + (job.trainable if job.method != "full" else 0)
        if not job.first_grad and not job.quantized:  # the first layer's q, k, v need no input gradient: no weight kept
            free = ("q", "k", "v") + (("gate", "up") if shape.parallel_residual else ())  # nor a parallel MLP's
            if shape.parallel_residual and not set(adapter_shapes(shape, job.lora_targets)) & {"gate", "up"}:
                free += ("down",)
            cast -= sum(a * b for t, (a, b) in shape.linear_shapes().items() if t in free)
        parts["weight casts"] = job.compute * cast
    head = counts["head"] if shape.head == "classifier" else shape.vocab * shape.hidden  # tied or not
    head *= not job.harness.quantize_head  # bitsandbytes dequantizes a 4-bit head itself: autocast casts nothing
    if job.harness.loss_chunk and shape.head == "lm" and job.method != "full":  # a head run chunk by chunk:
        # autocast caches the casts of trained weights only; a frozen one, per call
        head *= -(-job.seq_len // job.harness.loss_chunk)
    if adapted_pooler and job.checkpointing:  # the pooler's adapter lies outside the checkpointed layers
        head += 2 * job.lora_r * shape.hidden
    if adapted_head and job.checkpointing:  # so does the LM head's
        head += job.lora_r * (shape.hidden + shape.vocab)
    parts["weight casts (head)"] = job.compute * head
    return parts
