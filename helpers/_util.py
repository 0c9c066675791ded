"""Small utilities the helpers modules share, each written once.

Private to the package: notebooks import the public modules, never this one. Importing it is
cheap (standard library only); torch is imported inside `torch_dtype` when it is called.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "GIB",
    "HEADLESS",
    "MIB",
    "NotRegularFile",
    "environ",
    "error_line",
    "headless",
    "ipython_shell",
    "quiet_libraries",
    "read_regular_file",
    "restore_environ",
    "torch_dtype",
]

# set by the kit's runner and the tests for the kernels they start: nothing shows those kernels' widgets
HEADLESS = "HELPERS_HEADLESS"
MIB = 2**20  # bytes in a mebibyte (what PyTorch and nvidia-smi call "MiB"/"MB")
GIB = 2**30  # bytes in a gibibyte; a GB is 10**9 bytes, 7.4 % less
_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


class NotRegularFile(OSError):
    """A path that is not a regular file (nor a link to one); its message says what it is instead."""


def read_regular_file(path: str | os.PathLike) -> bytes:
    """The bytes of `path`, a regular file or a symbolic link to one; `NotRegularFile` otherwise.

    `python -m helpers run` reads every notebook through this before papermill opens it.

    1. `os.stat` first, which opens nothing: a FIFO (whose open blocks until a writer comes), a
       device (/dev/zero never ends; opening some devices acts on them) or a socket is refused unopened.
    2. Then a non-blocking open and `fstat` of what was opened: a path swapped for a FIFO between
       the two steps is refused too, without blocking.
    """
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(_not_regular(path, info))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(_not_regular(path, info))
        return f.read()


def _not_regular(path, info: os.stat_result) -> str:
    link = f" (a symbolic link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    return f"{Path(path).name} is {_KINDS.get(stat.S_IFMT(info.st_mode), 'something else')}{link}, not a regular file"


def error_line(e: BaseException) -> str:
    """An error in one line for a message: its type and the first line of its text (200 characters at most)."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


def ipython_shell():
    """The running IPython shell, or None outside IPython (never imports IPython itself)."""
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def headless() -> bool:
    """True in a kernel no front end shows (HELPERS_HEADLESS=1: the kit's runner, the tests): a widget there is
    seen by nobody, and nbclient can wait forever on a cell that opens one (jupyter/nbclient#312)."""
    return os.environ.get(HEADLESS) == "1"


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


def quiet_libraries() -> None:
    """Silence what the libraries say about their own code, which a student would take for an error in theirs.

    bitsandbytes' CPU backend logs a warning for every 4-bit matmul on a CPU and, on a CPU with
    AVX512-BF16, one when it is imported without the optional `kernels` package. peft's
    get_peft_model reads transformers 5's deprecated `is_gradient_checkpointing`, and transformers
    warns at its own line, not the caller's, so only the message can tell it apart.
    """
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", r"`is_gradient_checkpointing` is deprecated", FutureWarning)


def torch_dtype(precision: str):
    """The torch dtype of a precision name: "bf16" -> torch.bfloat16, "fp16" -> float16, else float32."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
