"""The estimate's breakdown: its lines, the moments they compete in, and the verdict on a card.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; `python -m helpers plan`
prints `Estimate.table`). The lines are computed in the other modules of the package; this one
says which of them are alive at once (the peak of torch.cuda.max_memory_allocated), what the caching
allocator reserves on top (`_allocator`), and whether a card holds it. Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from helpers._util import GIB, MIB
from helpers.catalog import card_capability, gpu_bytes
from helpers.estimate._allocator import ALLOCATOR_SLACK, SAFETY_MARGIN
from helpers.estimate._screen import screen_rows

__all__ = ["Estimate", "past_context"]


@dataclass
class Estimate:
    """A breakdown in bytes. `total` is what the card must hold; `allocated` what torch.cuda reports.

    `allocated` is the peak of torch.cuda.max_memory_allocated, `reserved` adds the caching
    allocator's slack (torch.cuda.max_memory_reserved), `total` adds the CUDA context and, on several
    GPUs, NCCL's buffers: what nvidia-smi and NVML show for the process (`screen_table` term by term).
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
    previous_output: int = 0  # litgpt's loop: the previous micro-batch's logits and ctx-kept inputs
    forward_end: int = 0  # the end of the forward with the previous output still held (above the weights)
    output_held: int = 0  # a hand-written loop's `outputs`: held at every moment of the step (loop="custom")
    # several GPUs (`_sharding`): DDP's gradient buckets, held throughout; FSDP's gathered weights, held in the
    # forward and the backward; the backward's unit of gradients before the reduce-scatter
    ddp_buckets: int = 0
    all_gather: int = 0
    reduce_scatter: int = 0
    nccl_buffers: int = 0  # NCCL's buffers on each card of a job on several GPUs: outside the allocator (`_screen`)
    attention: str = ""  # the attention kernel that runs: "eager", "flash", "efficient" or "math" (`_attention`)
    # seq_len past a rotary model's trained context, in words (`past_context`): the bytes are right, the
    # job is not what the model was trained for; every display of the verdict says it ("" when within it)
    context_note: str = ""

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
        # sharded: the gathered weights through the forward and the backward, a unit's gradients before reducing
        forward += self.all_gather
        backward += self.all_gather + self.reduce_scatter
        held = self.weights + self.optimizer + self.output_held + self.ddp_buckets  # at every moment
        if self.grads_in_forward:
            return held + self.gradients + max(forward, backward, self.optimizer_step)
        return held + max(forward, self.gradients + max(backward, self.optimizer_step))

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
        """What the card must hold: the reserve, the CUDA context and NCCL's buffers (what nvidia-smi shows)."""
        return self.reserved + self.cuda_context + self.nccl_buffers

    def screen_table(self, reserved: int | None = None) -> str:
        """What nvidia-smi (Colab's and Kaggle's memory bars too) shows for the process, term by term, with
        each figure's source; `reserved`: a whole run's reserve (`RunEstimate.peak_reserved`) instead of one step's."""
        reserved = self.reserved if reserved is None else reserved
        rows = screen_rows(reserved, self.cuda_context, self.nccl_buffers, card_capability_of(self.settings))
        return "\n".join(f"{name:28} {gib}  {why}" for name, gib, why in rows)

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

    def verdict_line(self, gpu) -> str:
        """The verdict on `gpu` with the figures it compares and the margin it leaves, in one sentence: both
        what PyTorch reserves and what nvidia-smi (Colab's and Kaggle's memory bars) would show."""
        margin = SAFETY_MARGIN[self.settings["method"]]
        peak, what = (
            (self.total, "the training step") if self.total >= self.load_total else (self.load_total, "loading")
        )
        nccl = f" + NCCL buffers {self.nccl_buffers / GIB:.2f} GiB" if self.nccl_buffers else ""
        return (
            f"{self.verdict(gpu)}: {what} needs {peak / GIB:.2f} GiB of {gpu_bytes(gpu) / GIB:.2f} GiB "
            f"(PyTorch reserved {self.reserved / GIB:.2f} GiB, which is what runs out, + CUDA context "
            f"{self.cuda_context / GIB:.2f} GiB{nccl}; nvidia-smi would show {self.total / MIB:,.0f} MiB); "
            f'"fits" leaves {margin:.0%} free for the estimator\'s known error'
            + (f". Note: {self.context_note}" if self.context_note else "")
        )

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
            *([("model output (held by the loop)", self.output_held)] if self.output_held else []),
            *([("DDP gradient buckets", self.ddp_buckets)] if self.ddp_buckets else []),
            *([("gathered weights (sharded)", self.all_gather)] if self.all_gather else []),
            *([("gradients before reduce-scatter", self.reduce_scatter)] if self.reduce_scatter else []),
            ("peak allocated", self.allocated),
            ("allocator slack", self.allocator_slack),
            ("peak reserved", self.reserved),
            ("CUDA context", self.cuda_context),
            *([("NCCL buffers", self.nccl_buffers)] if self.nccl_buffers else []),
            ("total (what nvidia-smi shows)", self.total),
            ("loading (total, before training)", self.load_total),
        ]
        return "\n".join(f"{name:32} {b / GIB:8.2f} GiB" for name, b in rows)


def card_capability_of(settings: dict) -> tuple[int, int] | None:
    """The compute capability of the catalog card an estimate was made for (None: no card named)."""
    gpu = settings.get("gpu")
    return card_capability(gpu) if gpu is not None else None


def past_context(shape, seq_len: int) -> str:
    """What a seq_len past a rotary model's trained context (`Shape.context`) means, in words; "" within it
    or when the context is not known.

    A learned position table cannot take more positions at all (the estimator refuses the job); rotary
    positions can be computed for any length, so the memory is as estimated, but the model never saw
    such distances while it was trained."""
    if not shape.context or seq_len <= shape.context:
        return ""
    whose = f"{shape.name}'s" if shape.name else "the model's"
    quality = "the memory is as estimated, the model's quality there is not"
    if shape.rope_scaling:  # max_position_embeddings may or may not count the stretch already
        return (
            f"seq_len {seq_len:,} is past {whose} max_position_embeddings of {shape.context:,} tokens, which its "
            f"config's rope_scaling ({shape.rope_scaling}) may stretch (see the model card): {quality}"
        )
    scaling = " (no rope_scaling in its config)" if shape.rope_scaling == "" else ""
    return f"seq_len {seq_len:,} is past {whose} trained context of {shape.context:,} tokens{scaling}: {quality}"
