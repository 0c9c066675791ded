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

from helpers._util import GIB, MIB

__all__ = ["CARDS", "VARIABLE", "banner", "simulated_card", "simulated_devices"]

VARIABLE = "HELPERS_SIMULATE"
SUFFIX = " (simulated)"

# name -> (device name, total memory in bytes as torch.cuda.get_device_properties reports it,
# compute capability, devices). PyTorch sees less than nvidia-smi: a T4 is 15,360 MiB there but
# 15,102 MiB (14.75 GiB) to PyTorch on Colab; an A100-SXM4-40GB is 40,960 MiB there, 40,536 MiB
# (39.59 GiB) to PyTorch (both as printed by get_device_properties in published runs).
CARDS = {
    "T4": ("Tesla T4", 15_102 * MIB, (7, 5), 1),  # Colab's free tier
    "T4x2": ("Tesla T4", 15_102 * MIB, (7, 5), 2),  # Kaggle's "GPU T4 x2"
    "A100": ("NVIDIA A100-SXM4-40GB", 40_536 * MIB, (8, 0), 1),  # Colab's paid tiers, rented by the hour
}


def simulated_card() -> str | None:
    """The card HELPERS_SIMULATE names ("T4", "T4x2", "A100"), or None when nothing is simulated."""
    asked = os.environ.get(VARIABLE, "").strip()
    if not asked:
        return None
    match = {name.lower(): name for name in CARDS}.get(asked.lower())
    if match is None:
        raise ValueError(f"{VARIABLE}={asked!r} is not a card the kit simulates: use one of {', '.join(CARDS)}")
    return match


def simulated_devices(*, through_nvml: bool = False) -> list[tuple[str, int, tuple[int, int]]]:
    """The simulated card's devices as this process would see them: (name, total bytes, capability).

    CUDA_VISIBLE_DEVICES narrows them as it narrows real ones ("0" leaves the first of two T4s);
    NVML, like the driver it reads, lists every card whatever that variable says.
    """
    card = simulated_card()
    if card is None:
        return []
    name, total, capability, count = CARDS[card]
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
    name, total, capability, count = CARDS[card]
    cards = f"{count} x {name}" if count > 1 else name
    return (
        f"SIMULATED {card} ({cards}, {total / GIB:.2f} GiB as PyTorch reports it, compute capability "
        f"{capability[0]}.{capability[1]}) on this CPU: the card's choices are taken, nothing runs on a GPU, "
        "and every time and memory figure below is measured on the CPU."
    )
