"""What a CUDA process holds beyond its tensors: the context, and what the caching allocator reserves.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; notebook 03's OOM). The
peak of torch.cuda.max_memory_allocated is the sum of the tensors alive at once (`_breakdown`);
a card runs out when the caching allocator cannot reserve a new segment, and nvidia-smi shows the
context on top. This module holds both, and the margin a verdict leaves for the estimator's known
error. Pure Python: no torch.
"""

from __future__ import annotations

from helpers._util import MIB

__all__ = [
    "ACTIVATION_SLACK",
    "ALLOCATOR_SLACK",
    "CUDA_CONTEXT_BYTES",
    "SAFETY_MARGIN",
    "SCORE_SLACK",
    "allocator_slack",
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
# and, where attention materializes its scores (eager, or SDPA's math kernel: `_attention`), one
# and a half more fp32 score matrices of one layer: each layer allocates and frees score-sized
# blocks (the scores, their softmax, its gradients, in 16 and 32 bits), and the allocator, which
# serves a request from the smallest cached block that fits and splits it, keeps reserving fresh
# ones. 1.5: on the fitcheck T4 rows (scripts/bench_estimator.py) the reserved figure's worst miss
# goes from -30 % (none) to -13 % with 1.0 to 2.5 alike, and 1.5 over-estimates least (+11 %, 2.0: +18 %);
# the caching allocator replayed on the CPU's trace (helpers/_caching_allocator.py) reserves 0.3 to
# 1.3 score matrices more for eager than for SDPA at the CPU grid's tiny sizes
SCORE_SLACK = 1.5
# the estimator's known error on a GPU, by method: its worst under-prediction of a published
# measurement (scripts/bench_estimator.py, docs/estimator-accuracy.md), with room to spare: full
# fine-tuning and LoRA share their 16-bit terms and their worst, -6.3 % (LoRA, litgpt, StableLM-3B
# at 4 x 1034 tokens; full fine-tuning alone -4.6 %, bert-large, fp16, V100); QLoRA -6.8 % (litgpt,
# Llama-2-13B, bitsandbytes 0.41), and its 4-bit path is not yet measured on a card with the pinned
# versions. This close to the card it is "borderline"
SAFETY_MARGIN = {"full": 0.08, "lora": 0.08, "qlora": 0.10}


def allocator_slack(allocated: int, activations: int, scores: int) -> int:
    """Bytes torch.cuda.max_memory_reserved shows above max_memory_allocated.

    scores: elements of one layer's attention scores where attention materializes them, else 0."""
    return int(ALLOCATOR_SLACK * allocated + ACTIVATION_SLACK * activations + SCORE_SLACK * 4 * scores)
