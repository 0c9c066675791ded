"""Which attention kernel runs, decided as PyTorch and transformers decide it.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; notebook 05's 7B on a T4).
The kernel decides whether the scores (batch x heads x sequence x sequence) are materialized:
eager attention and SDPA's math kernel do; the flash and memory-efficient kernels do not. Sources:
transformers 5.23's integrations/sdpa_attention.py (`enable_gqa=True` when there is no mask and
the head dim is at most 256, else the key/value heads are repeated first) and PyTorch's
aten/src/ATen/native/transformers/cuda/sdp_utils.cpp (flash: 16-bit inputs, compute capability
8.0 or newer, head dim up to 256, grouped-query heads allowed; memory-efficient: no grouped-query
heads, bf16 only from 8.0; math: everything). On the CPU, the flash kernel takes fp32 and grouped
heads (PyTorch 2.13, checked in tests/test_estimate_published_loops.py) but not dropout. The kit's batches carry
no padding mask. Pure Python: no torch.
"""

from __future__ import annotations

__all__ = ["DEFAULT_CAPABILITY", "KERNELS", "attention_kernel"]

KERNELS = ("eager", "flash", "efficient", "math")
# the card assumed when none is named: the bf16 cards (A100, L4, H100); a T4 is (7, 5)
DEFAULT_CAPABILITY = (8, 0)
MAX_FUSED_HEAD_DIM = 256  # flash's limit, and transformers' for passing enable_gqa


def attention_kernel(
    attn_impl: str,
    *,
    dtype: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dropout: float = 0.0,
    device: str = "cuda",
    capability: tuple[int, int] | None = None,
) -> str:
    """The kernel one attention call runs: "eager", "flash", "efficient" or "math".

    dtype: what SDPA's inputs are in, "fp32", "fp16" or "bf16" (autocast casts them to its 16-bit
    dtype; a model computing in fp32 passes fp32). capability: the card's compute capability;
    None: DEFAULT_CAPABILITY."""
    if attn_impl == "eager":
        return "eager"
    if device == "cpu":
        return "math" if dropout > 0 else "flash"
    capability = capability or DEFAULT_CAPABILITY
    # transformers hands SDPA the grouped key/value heads (enable_gqa) when no mask and the head dim allows
    grouped = kv_heads < heads and head_dim <= MAX_FUSED_HEAD_DIM
    ampere = capability >= (8, 0)
    if dtype != "fp32" and ampere and head_dim <= MAX_FUSED_HEAD_DIM:
        return "flash"
    if not grouped and (dtype != "bf16" or ampere):
        return "efficient"
    return "math"
