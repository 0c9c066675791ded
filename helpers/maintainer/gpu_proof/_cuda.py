"""The CUDA-only calls of `python -m helpers gpu-proof`, one small function each.

What only a card answers: the allocator's peaks, the card's size, name and precisions, the memory
cap. tests/test_gpu_proof.py replaces these with fakes, so every section looks them up here at
call time (`_cuda.peak_bytes()`), never through a copy imported into its own module.
"""

from __future__ import annotations

import platform
import shutil
import time
from pathlib import Path

from helpers._util import GIB

__all__ = [
    "cap_memory",
    "machine",
    "peak_bytes",
    "precision",
    "precisions",
    "release",
    "reserved_bytes",
    "scratch_root",
    "sync",
    "total_bytes",
]


def machine() -> dict:
    """The card, CUDA, Python and the pinned packages' versions, for the report's header."""
    import torch

    from helpers.manifest import package_versions

    p = torch.cuda.get_device_properties(0)
    return {
        "card": p.name,
        "total_gib": round(p.total_memory / GIB, 2),
        "capability": f"{p.major}.{p.minor}",
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "versions": package_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def precision() -> str:
    """The card's own training precision, as the notebooks choose it (bf16 from compute capability 8.0)."""
    from helpers.env import choose_precision, detect_gpus

    return choose_precision(detect_gpus()).name


def precisions() -> list[str]:
    """Every precision the card runs natively, for the step-time section."""
    import torch

    from helpers.env import half_precision

    return ["fp32", "fp16"] + (["bf16"] if half_precision(torch.cuda.get_device_capability()) == "bf16" else [])


def peak_bytes() -> int:
    import torch

    return torch.cuda.max_memory_allocated()


def reserved_bytes() -> int:
    import torch

    return torch.cuda.max_memory_reserved()


def total_bytes() -> int:
    import torch

    return torch.cuda.get_device_properties(0).total_memory


def cap_memory(fraction: float) -> None:
    """Let this process's allocator reserve at most `fraction` of the card; 1.0 lifts the cap."""
    import torch

    torch.cuda.set_per_process_memory_fraction(fraction)


def release() -> None:
    """Collect the last model's garbage, hand the allocator's cache back, start the peak again."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def sync() -> None:
    """Wait for the card's queued kernels, so a timer reads the work and not its launch."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def scratch_root() -> str | None:
    """/dev/shm when it has room for a 7B in bf16 twice over (no 14 GB disk write), else the usual temp folder."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shutil.disk_usage(shm).free > 32 * GIB else None
