"""The training-memory estimator: what a fine-tune needs before it starts, line by line.

Taught in notebook 01 (memory anatomy), used by 03 (the OOM it predicts), 05 (the 7B plan) and by
`helpers.plan` (`python -m helpers plan`). Pure Python on purpose: it answers for a 7B in
milliseconds without importing torch, and works offline from the shipped catalogs
(`helpers.catalog`).

`activations` is the bytes autograd keeps for backward over one micro-batch's forward pass, each
storage once, parameters excluded: exactly what saved-tensor hooks see
(`helpers.saved_tensors.track_saved_tensors`), counted op by op in helpers/_activations.py. The model's
shape and the job's settings are read and checked in helpers/_job.py.

On a GPU the peak also holds what is not saved for backward: the logits and their fp32 upcast at
the end of the forward, the gradients flowing back through one layer, one recomputed layer during
a checkpointed backward, the optimizer's temporaries during its step, the CUDA context and the
caching allocator's slack. Those are separate lines, each a stated constant or formula.
docs/estimator-accuracy.md holds the estimator against published GPU measurements
(scripts/bench_estimator.py reruns it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from helpers._activations import (
    Adapters,
    Forward,
    backward_transient,
    held_previous_output,
    layer_activations,
    outside_layers,
    quant_kept_inputs,
    weight_casts,
)
from helpers._families import LINEAR_TARGETS, Shape, adapter_shapes, adapts_head, shape_of
from helpers._job import (
    ADAMW_FAMILY,
    COMPUTE_BYTES,
    FP32_BYTES,
    HALF_BYTES,
    OPTIMIZER_BYTES,
    PRECISIONS,
    WEIGHT_BYTES,
    Job,
    batch_argument,
    forward_logits,
    load_peak,
    logits_moment,
    optimizer_states,
    optimizer_step,
    stored_weights,
)
from helpers._util import GIB, MIB
from helpers.catalog import gpu_bytes

__all__ = [
    "ADAMW_FAMILY",
    "ACTIVATION_SLACK",
    "ALLOCATOR_SLACK",
    "COMPUTE_BYTES",
    "CUDA_CONTEXT_BYTES",
    "FP32_BYTES",
    "HALF_BYTES",
    "LINEAR_TARGETS",
    "OPTIMIZER_BYTES",
    "PRECISIONS",
    "SAFETY_MARGIN",
    "WEIGHT_BYTES",
    "Estimate",
    "Shape",
    "estimate_training_memory",
    "shape_of",
]

# memory a CUDA process holds that torch.cuda.max_memory_allocated does not show
CUDA_CONTEXT_BYTES = 400 * MIB  # CUDA context + cuBLAS workspace with lazy module loading
ALLOCATOR_SLACK = 0.05  # reserved above allocated: the caching allocator's rounding and fragmentation
# and, on top, a share of the activations: they are allocated and freed every step, and the caching
# allocator splits the blocks the backward frees to serve the next forward's smaller requests, then
# reserves new segments for the large ones; weights and optimizer states are allocated once and do
# not fragment. 0.17: the median the five HF-V100 runs without checkpointing need (0.12 to 0.29,
# bert-large, PyTorch 1.10, docs/estimator-accuracy.md); `helpers gpu-proof` measures it on a card
ACTIVATION_SLACK = 0.17
# the estimator's known error on a GPU, by method: its worst under-prediction of a published
# measurement (scripts/bench_estimator.py, docs/estimator-accuracy.md), with room to spare: full
# fine-tuning and LoRA share their 16-bit terms and their worst, -6.3 % (LoRA, litgpt, StableLM-3B
# at 4 x 1034 tokens; full fine-tuning alone -4.6 %, bert-large, fp16, V100); QLoRA -6.8 % (litgpt,
# Llama-2-13B, bitsandbytes 0.41), and its 4-bit path is not yet measured on a card with the pinned
# versions. This close to the card it is "borderline"
SAFETY_MARGIN = {"full": 0.08, "lora": 0.08, "qlora": 0.10}


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
    load_peak: int = 0  # allocated while the model loads, before the first step (`_load_peak`)
    previous_output: int = 0  # the previous micro-batch's logits and ctx-kept inputs, held by the loop
    forward_end: int = 0  # the end of the forward with the previous output still held (above the weights)

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
        forward = max(forward, self.forward_end)  # a loop holding the previous output: before the loss
        # a checkpointed layer's backward holds its recomputed activations and the gradients flowing
        # through it at once (measured against the CPU allocator: tests/test_estimate_allocator.py)
        backward = self.recompute + self.backward_transient if self.recompute else 0
        if self.grads_in_forward:
            return self.weights + self.optimizer + self.gradients + max(forward, backward, self.optimizer_step)
        return self.weights + self.optimizer + max(forward, self.gradients + max(backward, self.optimizer_step))

    @property
    def load_total(self) -> int:
        """What the card must hold while the model loads: its peak, the CUDA context and the slack."""
        return self.load_peak + self.cuda_context + int(ALLOCATOR_SLACK * self.load_peak) * (self.cuda_context > 0)

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
        """True when the estimate fits `gpu`: a catalog name ("T4"), a GiB figure, or bytes.

        Both moments must fit: the training step (`total`) and the loading (`load_total`). True for
        a borderline estimate too; `verdict` tells the two apart."""
        return max(self.total, self.load_total) <= gpu_bytes(gpu)

    def verdict(self, gpu) -> str:
        """The verdict on `gpu`: "fits", "borderline" (within the estimator's known error for the
        method, SAFETY_MARGIN, of the card's limit: it may run out) or "does not fit"."""
        card, peak = gpu_bytes(gpu), max(self.total, self.load_total)
        if peak > card:
            return "does not fit"
        return "fits" if peak * (1 + SAFETY_MARGIN[self.settings["method"]]) <= card else "borderline"

    def table(self) -> str:
        rows = [
            ("weights", self.weights),
            ("gradients", self.gradients),
            ("optimizer", self.optimizer),
            ("activations", self.activations),
            ("logits (transient)", self.logits),
            ("autocast cache (transient)", self.autocast_cache),
            ("backward (transient)", self.backward_transient),
            ("recompute (checkpointing)", self.recompute),
            ("optimizer step (transient)", self.optimizer_step),
            *([("previous micro-batch (held)", self.previous_output)] if self.previous_output else []),
            ("CUDA context", self.cuda_context),
            ("allocator slack", self.allocator_slack),
            ("total", self.total),
            ("loading (total, before training)", self.load_total),
        ]
        return "\n".join(f"{name:32} {b / GIB:8.2f} GiB" for name, b in rows)


def estimate_training_memory(
    model,
    *,
    per_device_batch: int | None = None,
    batch_size: int | None = None,
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
    fused_loss: bool = False,
    quantize_head: bool = False,
    quant_dtype: str | None = None,
    loss_chunk: int = 0,
    holds_last_output: bool = False,
) -> Estimate:
    """Estimate the memory of one training step, in bytes, before anything is loaded.

    Args:
        model: a catalog name ("Mistral-7B", "Qwen3-0.6B"), a path to a config.json or its folder,
            a Hub id ("Qwen/Qwen3-32B": only its config.json is fetched, when the Hub answers; a
            catalog model's id, "Qwen/Qwen3-14B", needs no network), a transformers config, or a
            config dict. Families: Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, GPT-NeoX, GPT-2, BERT.
        per_device_batch, seq_len: the micro-batch on one device (tokens = per_device_batch x
            seq_len). `batch_size` is the older name of per_device_batch: pass one of the two.
        precision: compute precision: "fp32", "bf16" or "fp16" (mixed precision via autocast), or
            "bf16-true" / "fp16-true" (everything in 16 bits, no autocast: litgpt, torchtune).
        weights: how the weights are stored: "fp32" (default for full fine-tuning: the fp32
            master weights of mixed precision), "bf16"/"fp16" (pure half), "int8" or "nf4".
        method: "full", "lora" (frozen base + adapters) or "qlora" (nf4 base + adapters).
        lora_r, lora_targets: adapter rank and targets: "all-linear", peft's module names
            (["q_proj", "v_proj"], "qkv_proj", "query_key_value", "lm_head" for the head too) or
            the estimator's (LINEAR_TARGETS).
        optimizer: "adamw" (fused, the Trainer's default), "adamw_foreach" (torch.optim.AdamW's
            default: one state-sized temporary during the step), "adamw_hf" (one tensor at a time:
            transformers' old AdamW), "adamw_8bit", "paged_adamw_8bit", "adafactor", "sgd", or
            TrainingArguments' names "adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit".
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
        fused_loss: a fused or chunked linear cross-entropy (Liger's, unsloth's, torchtune's
            chunked loss with the head inside it): the logits and their fp32 log-probabilities are
            never held for the whole sequence; the gradient of the head's input is kept instead.
        quantize_head: the LM head is quantized with the other linears, as Lightning's bitsandbytes
            plugin (litgpt's --quantize) does; transformers and peft keep it in 16 bits (then fp32).
            It is stored in 4 bits, and each time the head runs, forward and backward, bitsandbytes
            dequantizes the whole vocab x hidden matrix: the largest transient of the step.
        quant_dtype: the dtype the weights were quantized from ("fp16", "bf16", "fp32"); default
            the compute dtype, as helpers.qlora loads them. bitsandbytes dequantizes to that dtype
            and then casts to the compute dtype: a second copy of each weight while it runs when
            they differ (Lightning's plugin quantizes from fp16 whatever the compute dtype).
        loss_chunk: the head and the cross-entropy run on chunks of this many positions (litgpt:
            128), the fp32 logits kept whole through the backward: the loss's gradients exist one
            chunk at a time, and under autocast a frozen head keeps a 16-bit copy per chunk.
        holds_last_output: the training loop keeps the previous micro-batch's output until the next
            forward returns (litgpt's `logits = model(...)`; the Trainer does not): its fp32 logits
            and what its graph keeps outside saved tensors (`quant_keeps_input`) live through the
            next forward, on top of it, before the loss.

    Returns:
        an Estimate: weights, gradients, optimizer, activations, logits, recompute, cuda_context,
        allocator_slack, load_peak in bytes, and `allocated` / `reserved` / `total` / `load_total`,
        `fits(gpu)` and `verdict(gpu)` ("fits", "borderline" or "does not fit").

    Example:
        >>> e = estimate_training_memory("Mistral-7B", per_device_batch=1, seq_len=512, method="qlora",
        ...                              checkpointing=True)
        >>> e.fits("T4")
        True
    """
    batch_name, batch = batch_argument(per_device_batch, batch_size, "estimate_training_memory")
    shape = shape_of(model)
    job = Job(
        replace(shape, attn_impl=attn_impl) if attn_impl else shape,
        batch,
        seq_len,
        precision,
        weights,
        method,
        lora_r,
        lora_targets,
        optimizer,
        checkpointing,
        device,
        lora_dropout,
        double_quant,
        grad_accum_steps,
        set_to_none,
        quant_keeps_input,
        batch_name,
        fused_loss,
        quantize_head,
        quant_dtype,
        loss_chunk,
        holds_last_output,
    )
    e = _estimate(job)
    if device == "cuda":
        e.cuda_context = CUDA_CONTEXT_BYTES if cuda_context_bytes is None else int(cuda_context_bytes)
        e.allocator_slack = int(ALLOCATOR_SLACK * e.allocated + ACTIVATION_SLACK * e.activations)
    return e


def _estimate(job: Job) -> Estimate:
    """The four numbered steps, on the allocator's view (the caller adds the CUDA lines)."""
    shape, f, trainable = job.shape, _forward(job), job.trainable
    parts, layer = _saved_for_backward(job, f)  # 3.
    held = held_previous_output(job, f) if job.holds_last_output else 0
    # the AdamW family keeps its moments in the parameter's dtype; 8-bit optimizers in 8 bits whatever it is
    weights = stored_weights(job)
    return Estimate(
        weights=int(weights),  # 1.
        gradients=int(job.param_bytes * trainable),  # 2. in the trainable parameters' dtype
        optimizer=int(optimizer_states(job)),
        activations=int(sum(parts.values())),
        logits=int(logits_moment(job)),
        recompute=int(sum(layer.values())) if job.checkpointing else 0,
        cuda_context=0,
        allocator_slack=0,
        trainable=trainable,
        parameters=shape.parameters,
        settings=job.settings(),
        activation_parts={k: int(v) for k, v in parts.items()},
        backward_transient=int(backward_transient(f, job.dequant_bytes if job.quantized else 0)),
        optimizer_step=int(optimizer_step(job)),  # 4.
        grads_in_forward=job.grad_accum_steps > 1 or not job.set_to_none,
        # autocast caches the 16-bit copy of every trainable fp32 weight until the forward's autocast
        # region ends; without checkpointing the copies are saved anyway (the "weight casts" lines)
        autocast_cache=(
            job.compute * shape.parameter_counts()["linear"]
            if job.autocast and job.checkpointing and job.method == "full"
            else 0
        ),
        load_peak=int(load_peak(job, weights)),
        previous_output=int(held),
        forward_end=int(sum(parts.values()) - parts.get("loss log-probs", 0) + forward_logits(job) + held) * (held > 0),
    )


def _forward(job: Job) -> Forward:
    return Forward(job.shape, job.batch, job.seq_len, job.compute, job.autocast, job.device, job.quantized)


def _saved_for_backward(job: Job, f: Forward) -> tuple[dict[str, int], dict[str, int]]:
    """3. activations by component, and what one layer saves (a checkpointed backward recomputes it)."""
    shape, adapters = job.shape, None
    if job.method != "full":
        adapters = Adapters(
            frozenset(adapter_shapes(shape, job.lora_targets)),
            job.lora_r,
            job.lora_dropout,
            job.param_bytes,
            keeps_input=job.quant_keeps_input and job.quantized,
            cast_under_autocast=not job.quantized,
        )
    layer = layer_activations(f, adapters)
    first = layer if job.first_grad else layer_activations(f, adapters, input_grad=False)
    parts = {k: v * (shape.layers - 1) + first.get(k, 0) for k, v in layer.items() if v}
    if job.checkpointing:  # only each layer's inputs survive the forward
        parts = {"layer inputs (checkpointed)": shape.layers * f.resid * f.tokens * shape.hidden}
        if shape.family == "gpt2" and shape.attn_impl == "eager":  # its causal mask is an input too
            parts["attention mask"] = f.resid * job.batch * job.seq_len * job.seq_len
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
        parts["fused loss (input gradient)"] = job.compute * job.batch * job.seq_len * shape.hidden
    return parts, layer
