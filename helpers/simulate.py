"""A simulated card: the notebooks walk a T4's, Kaggle's T4 x2's or an A100's code paths on a CPU.

Used by `python -m helpers run --simulate T4|T4x2|A100` (the tests run every notebook under a
simulated T4 and T4 x2) and by anyone who sets HELPERS_SIMULATE before starting a kernel. Under a
simulation `helpers.env` reports the card (name, compute capability, memory as PyTorch reports it,
number of devices), so the precision choice, the dtype a model loads in, the training arguments,
the audit, the single-GPU pin (`helpers.env.use_one_gpu`) and the effective batch all follow that
card. Nothing runs on a GPU: every time and memory figure is still measured on this CPU, and every
card name carries "(simulated)" so no figure can pass for a GPU measurement.
"""

from __future__ import annotations

import os

from helpers._util import GIB
from helpers.catalog import card_capability, find, gpu_bytes

__all__ = ["CARDS", "VARIABLE", "banner", "find_card", "simulated_card", "simulated_devices"]

VARIABLE = "HELPERS_SIMULATE"
SUFFIX = " (simulated)"

# name -> (the catalog's card, devices). The card is the catalog's (helpers/assets/catalog/gpus.json),
# written there once: its name as the driver reports it ("Tesla T4"), its compute capability, and its
# memory as torch.cuda.get_device_properties printed it in published runs (memory_source "pytorch").
# PyTorch sees less than nvidia-smi: 14.75 GiB of a T4's 15,360 MiB on Colab, 39.59 GiB of an
# A100-SXM4-40GB's 40,960 MiB.
CARDS = {
    "T4": ("T4", 1),  # Colab's free tier
    "T4x2": ("T4", 2),  # Kaggle's "GPU T4 x2"
    "A100": ("A100-40GB", 1),  # Colab's paid tiers, rented by the hour
}


def find_card(asked: str) -> str | None:
    """The simulated card `asked` names, spelled as the kit spells it ("t4x2" is "T4x2"); None if none."""
    return {name.lower(): name for name in CARDS}.get(asked.strip().lower())


def simulated_card() -> str | None:
    """The card HELPERS_SIMULATE names ("T4", "T4x2", "A100"), or None when nothing is simulated."""
    asked = os.environ.get(VARIABLE, "").strip()
    if not asked:
        return None
    match = find_card(asked)
    if match is None:
        raise ValueError(f"{VARIABLE}={asked!r} is not a card the kit simulates: use one of {', '.join(CARDS)}")
    return match


def _card(simulated: str) -> tuple[str, int, tuple[int, int], int]:
    """(device name, total bytes as PyTorch reports them, compute capability, devices) from the catalog."""
    entry, count = CARDS[simulated]
    return find("gpus", entry)[1]["device_name"], gpu_bytes(entry), card_capability(entry), count


def simulated_devices(*, through_nvml: bool = False) -> list[tuple[str, int, tuple[int, int]]]:
    """The simulated card's devices as this process would see them: (name, total bytes, capability).

    CUDA_VISIBLE_DEVICES narrows them as it narrows real ones ("0" leaves the first of two T4s);
    NVML, like the driver it reads, lists every card whatever that variable says.
    """
    card = simulated_card()
    if card is None:
        return []
    name, total, capability, count = _card(card)
    visible = list(range(count))
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and not through_nvml:
        wanted = [int(i) for i in mask.replace(" ", "").split(",") if i.lstrip("-").isdigit()]
        visible = [i for i in wanted if 0 <= i < count]
    return [(name + SUFFIX, total, capability) for _ in visible]


def banner() -> str | None:
    """The line a notebook shows under a simulation, or None on a real machine."""
    card = simulated_card()
    if card is None:
        return None
    name, total, capability, count = _card(card)
    cards = f"{count} x {name}" if count > 1 else name
    return (
        f"SIMULATED {card} ({cards}, {total / GIB:.2f} GiB as PyTorch reports it, compute capability "
        f"{capability[0]}.{capability[1]}) on this CPU: the card's choices are taken, nothing runs on a GPU, "
        "and every time and memory figure below is measured on the CPU."
    )
