"""Training set-up: seeds and the TrainingArguments precision keywords for this card.

`seed_everything` is taught in notebook 06 (experiment tracking) and used by every notebook that
trains; `precision_kwargs` in notebook 02 (mixed precision) and shown in notebook 00.
"""

from __future__ import annotations

import os
import random

from helpers.env import Gpu, Precision, choose_precision, detect_gpus


def seed_everything(seed: int) -> int:
    """Seed Python, NumPy and torch (CPU and every GPU) so a run can be repeated.

    Pass the same number to TrainingArguments(seed=...): the Trainer reseeds when it starts.

    Returns:
        the seed, so a notebook can record it.
    """
    import numpy as np
    import torch

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}; e.g. seed_everything(42)")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too
    os.environ["PYTHONHASHSEED"] = str(seed)  # for worker processes started after this
    return seed


def precision_kwargs(gpus: tuple[Gpu, ...] | list[Gpu] | None = None) -> dict[str, bool]:
    """The `bf16` / `fp16` keywords of TrainingArguments for this machine.

    bf16 only at compute capability >= 8.0; fp16 on older cards (a T4 is 7.5, and
    `torch.cuda.is_bf16_supported()` says True there only because it emulates bf16); neither
    on CPU, where `fp16=True` would be silently ignored.

    Args:
        gpus: the cards to decide for; default: the ones on this machine.

    Example:
        >>> from transformers import TrainingArguments
        >>> args = TrainingArguments("out", **precision_kwargs())  # doctest: +SKIP
    """
    precision: Precision = choose_precision(detect_gpus() if gpus is None else gpus)
    return {"bf16": precision.name == "bf16", "fp16": precision.name == "fp16"}
