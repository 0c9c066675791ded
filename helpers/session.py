"""A notebook's setup in one call: the cards it trains on, its seed, and what this machine is.

Every notebook's first code cell after its parameters is `machine = helpers.start()`, so the cells
after it teach rather than set up. Notebook 00 takes the call apart (`use_one_gpu`, `describe`,
`seed_everything`); notebook 07, which trains on both of Kaggle's cards, calls
`helpers.start(seed=None, one_gpu=False)`. Installing the kit, and naming a student's own `helpers` that
would hide it, is the install cell's job: it runs before anything can import `helpers`.
"""

from __future__ import annotations

import os
import sys

from helpers.env import Machine, describe, use_one_gpu
from helpers.estimate._run import ALLOC_CONF, expandable_in_environment
from helpers.seeds import seed_everything

__all__ = ["start", "use_expandable_segments"]

EXPANDABLE = "expandable_segments:True"


def start(seed: int | None = 0, *, one_gpu: bool = True) -> Machine:
    """Set up a notebook's session and return what `describe()` found, after printing its summary.

    In order, because each step must come before the next can break it:
    1. with `one_gpu` (every notebook but 07), pin this process to GPU 0 before CUDA starts:
       Kaggle's "GPU T4 x2" shows two cards, and a Trainer that sees two wraps the model in
       DataParallel and doubles the effective batch without a word;
    2. describe the machine; with `one_gpu=False` the cards are read through NVML, so CUDA stays
       unstarted for the processes notebook 07 launches;
    3. on one GPU, ask torch's caching allocator for expandable segments (`use_expandable_segments`)
       before CUDA starts: over batches of varying length the default allocator strands the shorter
       steps' blocks and reserves gigabytes more than the run ever holds (notebook 03 shows it);
    4. seed Python, NumPy and torch with `seed` (None leaves them unseeded), so a rerun of the
       notebook draws the same data order, dropout masks and LoRA starts. Notebook 07 passes
       None: its launched processes seed themselves, and seeding here would import bitsandbytes
       (transformers' `set_seed` module does), which accelerate's `notebook_launcher` refuses.

    Example:
        >>> machine = start(seed=0)  # doctest: +SKIP
        platform   : colab
        ...
    """
    if not one_gpu and seed is not None:
        raise ValueError(
            f"helpers.start(seed={seed!r}, one_gpu=False): seeding here imports bitsandbytes, and "
            "accelerate's notebook_launcher then refuses to start the training processes. Pass seed=None "
            f"and seed inside the training function instead (set_seed({seed!r}) there, as notebook 07 does)."
        )
    if one_gpu:
        use_one_gpu()
        use_expandable_segments()
    machine = describe(use_nvml=not one_gpu)
    print(machine.summary())
    if seed is not None:
        seed_everything(seed)
        print(f"seed       : {seed} (Python, NumPy and torch)")
    return machine


def use_expandable_segments(environ=None) -> bool:
    """Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the allocator is already configured.

    Taught in notebook 03. Segments then grow in place, so a longer batch extends the memory a
    shorter one freed instead of reserving a new block beside it
    (`helpers.estimate.estimate_run_memory(..., expandable_segments=True)` models the difference).
    It only takes effect before CUDA's first allocation, and only on Linux (the only platform whose
    PyTorch builds support it). Kept off in notebook 07: processes that share memory with NCCL are
    where expandable segments have had bugs. A setting the student made (either variable) is left
    as it is. Returns whether the setting is on."""
    environ = os.environ if environ is None else environ
    if any(environ.get(name) for name in ALLOC_CONF):
        return expandable_in_environment(environ)
    if not sys.platform.startswith("linux"):
        return False
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        return False  # too late for this process: its allocator has read its settings
    environ["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE
    return True
