"""Small utilities the helpers modules share, each written once.

Private to the package: notebooks import the public modules, never this one. Importing it is
cheap (standard library only); torch is imported inside `torch_dtype` when it is called.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["GIB", "MIB", "environ", "ipython_shell", "quiet_bitsandbytes", "restore_environ", "torch_dtype"]

MIB = 2**20  # bytes in a mebibyte (what PyTorch and nvidia-smi call "MiB"/"MB")
GIB = 2**30  # bytes in a gibibyte; a GB is 10**9 bytes, 7.4 % less


def ipython_shell():
    """The running IPython shell, or None outside IPython (never imports IPython itself)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def restore_environ(saved: Mapping[str, str | None]) -> None:
    """Put environment variables back as `saved` has them; None means the variable was unset."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block, then put the old ones back."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        restore_environ(saved)


def quiet_bitsandbytes() -> None:
    """Silence bitsandbytes' CPU backend, which logs a warning for every 4-bit matmul on a CPU."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def torch_dtype(precision: str):
    """The torch dtype of a precision name: "bf16" -> torch.bfloat16, "fp16" -> float16, else float32."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
