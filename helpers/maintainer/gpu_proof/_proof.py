"""One `python -m helpers gpu-proof` run's settings, which every section reads: the `Proof` record."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["NOTEBOOKS_BUDGET_S", "Proof"]

NOTEBOOKS_BUDGET_S = 240  # all nine (~15 s each); those left when it is spent are recorded as skipped


@dataclass
class Proof:
    """What the sections share: the output folder, the scratch folder of saved models, the device, its
    precision, the card's name (every row says where it ran), the notebooks section's time budget and
    the whole run's deadline (`time.monotonic()` seconds, or None): the notebooks get what is left."""

    out: Path
    scratch: Path
    device: str = "cuda"
    precision: str = "bf16"
    card: str = ""
    notebooks_budget_s: float = NOTEBOOKS_BUDGET_S
    deadline: float | None = None
