"""What the student's screen shows: nvidia-smi's figure for the process, term by term.

Private to `helpers.estimate` (taught in notebook 01; `plan` and the planner print both figures).
PyTorch's `max_memory_reserved` is what its caching allocator holds; nvidia-smi, Colab's RAM/GPU
bar and Kaggle's accelerator gauge show the whole process: that reserve, the CUDA context (the
driver's state and the kernels it loaded), and what libraries allocate outside the allocator.
Every term's source is beside it; scripts/bench/screen-terms.md holds the published figures in full.
Pure Python: no torch.
"""

from __future__ import annotations

from helpers._util import GIB, MIB

__all__ = ["CUBLAS_WORKSPACE", "NCCL_GROUP_BYTES", "cublas_workspaces", "nccl_buffers", "screen_rows"]

MB = 10**6
KIB = 1024
# NCCL's buffers for one process group: 544 MB in a group of 2 GPUs, 688 MB in a larger one (NVIDIA/nccl#964,
# 2023-08, 4x A100 over NVLink, a 4 MB all-reduce per group). NCCL sizes them per channel and per peer
# (4 MiB SIMPLE, 512 KiB LL, 4.7 MiB LL128 each: src/init.cc at 5067397c, NCCL 2.30.7) and picks the
# channels from the topology, so a PCIe pair such as Kaggle's two T4s likely uses fewer: this is the
# published ceiling, not a T4 measurement
NCCL_GROUP_BYTES = {2: 544 * MB, "more": 688 * MB}
# cuBLAS's workspace, one per (handle, stream), drawn from the caching allocator: inside the reserve,
# not beside it. CUBLAS_WORKSPACE_CONFIG's default ":4096:2:16:8" is 2 x 4096 KiB + 8 x 16 KiB; compute
# capability 9.0 gets 32 MiB; cuBLASLt adds 1 MiB (pytorch aten/src/ATen/cuda/CublasHandlePool.cpp at
# 26a39059, parseChosenWorkspaceSize, getCUDABlasLtWorkspaceSize). A training step holds two handles:
# the forward's thread and autograd's backward thread
CUBLAS_WORKSPACE = {"default": 2 * 4096 * KIB + 8 * 16 * KIB, (9, 0): 32 * MIB}
CUBLASLT_WORKSPACE = 1024 * KIB
CUBLAS_THREADS = 2


def nccl_buffers(world_size: int) -> int:
    """Bytes NCCL holds on each GPU of a data-parallel or sharded job, outside PyTorch's allocator."""
    if world_size < 2:
        return 0
    return NCCL_GROUP_BYTES[2] if world_size == 2 else NCCL_GROUP_BYTES["more"]


def cublas_workspaces(capability: tuple[int, int] | None) -> int:
    """Bytes of cuBLAS and cuBLASLt workspaces a training step keeps inside the caching allocator's reserve."""
    workspace = CUBLAS_WORKSPACE.get(tuple(capability) if capability else None, CUBLAS_WORKSPACE["default"])
    return CUBLAS_THREADS * (workspace + CUBLASLT_WORKSPACE)


def screen_rows(reserved: int, context: int, nccl: int, capability) -> list[tuple[str, str, str]]:
    """The lines of the screen's figure: (term, GiB, what it is and where the figure comes from)."""
    rows = [
        ("PyTorch reserved", reserved, "torch.cuda.max_memory_reserved: tensors and the allocator's cached blocks"),
        (
            "  of which cuBLAS workspaces",
            cublas_workspaces(capability),
            "2 threads x (cuBLAS + 1 MiB cuBLASLt), from the allocator (PyTorch's CublasHandlePool.cpp)",
        ),
        (
            "CUDA context",
            context,
            "driver state and loaded kernels, lazy loading: 274 MiB (PyTorch PR #86509) to 426 MiB "
            "(unsloth-zoo PR #1053, PyTorch 2.10)",
        ),
    ]
    if nccl:
        rows.append(
            ("NCCL buffers", nccl, "one process group's buffers, NVIDIA/nccl#964 (A100 NVLink; a PCIe pair uses fewer)")
        )
    rows.append(("what nvidia-smi shows", reserved + context + nccl, "the process's memory on the card"))
    return [(name, f"{nbytes / GIB:8.2f} GiB", why) for name, nbytes, why in rows]
