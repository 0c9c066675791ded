"""The shipped catalogs of models and cards, and one way to look a name up in them.

Used by the estimator (notebook 01), `plan` (notebooks 01, 05, `python -m helpers plan`) and the
training audit (notebooks 02-04). The catalogs are JSON under helpers/assets/catalog: "models"
(architecture shapes of real models, with their Hub ids) and "gpus" (cards: memory, compute
capability, where students find them). Pure Python: no torch, no network.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

from helpers._util import GIB

__all__ = ["CATALOG_DIR", "card_capability", "describe_card", "find", "gpu_bytes", "load_catalog"]

CATALOG_DIR = Path(__file__).parent / "assets" / "catalog"
_KINDS = {"models": "model", "gpus": "GPU"}


@cache
def _read(kind: str) -> dict:
    return json.loads((CATALOG_DIR / f"{kind}.json").read_text())


def load_catalog(kind: str) -> dict:
    """A shipped catalog as a dict keyed by name: kind is "models" or "gpus"."""
    if kind not in _KINDS:
        raise ValueError(f"no catalog named {kind!r}: the kit ships {', '.join(_KINDS)}")
    return json.loads(json.dumps(_read(kind)))  # a copy: callers may change theirs


def find(kind: str, name: str, *, otherwise: str = "") -> tuple[str, dict]:
    """Look `name` up in a catalog, ignoring case; return (the catalog's spelling, its entry).

    Args:
        kind: "models" or "gpus".
        name: what the caller typed, e.g. "t4" or "Mistral-7B"; a model's Hub id
            ("mistralai/Mistral-7B-v0.1") names its entry too, so it needs no network.
        otherwise: the caller's other ways in, appended to the error, e.g.
            "Or pass its memory in GiB, e.g. 15.0".

    Example:
        >>> find("gpus", "t4")[0]
        'T4'
    """
    entries = _read(kind) if kind in _KINDS else load_catalog(kind)
    names = {k.lower(): k for k in entries}
    names.update({e["hub_id"].lower(): k for k, e in entries.items() if isinstance(e, dict) and e.get("hub_id")})
    match = names.get(str(name).strip().lower())
    if match is None:
        message = f"unknown {_KINDS[kind]} {name!r}: the catalog has {', '.join(entries)}"
        raise ValueError(message + (f". {otherwise}" if otherwise else ""))
    return match, json.loads(json.dumps(entries[match]))


def gpu_bytes(gpu) -> int:
    """Memory of a card in bytes: a catalog name ("T4", "A100-40GB"), GiB as a float, or bytes as an int."""
    if isinstance(gpu, str):
        return int(find("gpus", gpu, otherwise="Or pass its memory in GiB, e.g. 15.0")[1]["memory_gib"] * GIB)
    if isinstance(gpu, float) and math.isfinite(gpu) and gpu > 0:
        return int(gpu * GIB)
    if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu > 0:
        return gpu
    raise ValueError(
        f"gpu must be a catalog name such as 'T4', GiB as a positive float (15.0) or bytes as a "
        f"positive int; got {gpu!r}"
    )


def card_capability(gpu) -> tuple[int, int] | None:
    """The compute capability of a catalog card, or None when `gpu` is a bare size."""
    if not isinstance(gpu, str):
        return None
    return tuple(find("gpus", gpu)[1]["capability"])


def describe_card(gpu) -> str:
    """The card and the memory a plan holds it to, saying which figure that is.

    A T4 is 15,360 MiB to nvidia-smi but 14.75 GiB to PyTorch, and only the second can be used.

    Example:
        >>> describe_card("T4")
        'T4 (14.75 GiB as PyTorch reports it; nvidia-smi shows 15,360 MiB)'
    """
    if not isinstance(gpu, str):
        return f"{gpu_bytes(gpu) / GIB:.2f} GiB"
    name, entry = find("gpus", gpu)
    if entry.get("memory_source") == "pytorch":
        smi = entry["nvidia_smi_mib"]
        return f"{name} ({entry['memory_gib']:.2f} GiB as PyTorch reports it; nvidia-smi shows {smi:,} MiB)"
    return f"{name} ({entry['memory_gib']:.2f} GiB as nvidia-smi reports it; PyTorch sees a little less)"
