"""Where am I running: platform, GPUs, and the precision this machine should train in.

Taught in notebook 00 (where to get GPUs); every other notebook starts with `describe()`.
Notebook 07 reads the cards through NVML (`describe(use_nvml=True)`), leaving CUDA uninitialized.

The precision rule is the one traps are made of: `torch.cuda.is_bf16_supported()` answers True
on a T4 because bf16 is emulated there, slowly. Native bf16 arrives with compute capability 8.0
(Ampere), so the decision below reads the capability, never that function. Whether this runtime
is online: `helpers.network`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from helpers._nvml import nvml_devices
from helpers._util import GIB, quiet_libraries
from helpers.simulate import banner, simulated_card, simulated_devices

__all__ = [
    "BF16_MIN_CAPABILITY",
    "FP16_MIN_CAPABILITY",
    "TORCH_MIN_CAPABILITY",
    "Gpu",
    "Machine",
    "Precision",
    "CPU_BF16_FLAGS",
    "check_4bit",
    "choose_precision",
    "cpu_bf16_units",
    "describe",
    "detect_gpus",
    "detect_platform",
    "half_precision",
    "machine_notes",
    "use_one_gpu",
]

# compute capability where each precision has hardware support (tensor cores)
BF16_MIN_CAPABILITY = (8, 0)  # A100, L4, A10G, H100, RTX 30xx and newer
FP16_MIN_CAPABILITY = (7, 0)  # V100, T4, RTX 20xx
# oldest capability that current PyTorch wheels still ship kernels for
TORCH_MIN_CAPABILITY = (7, 0)


def half_precision(capability: tuple[int, int] | None) -> str:
    """The 16-bit format a card of this compute capability trains in: "bf16" from 8.0, "fp16" below.

    A T4 (7.5) says True to torch.cuda.is_bf16_supported() but only emulates bf16, slowly: the rule
    is the capability, never that call. None (a card known only by its memory, as the planner takes
    one) counts as a current card: "bf16". The rule's one copy: `choose_precision`, the estimator's
    callers (plan, the planner, the capstone's job), the export, the audit and gpu-proof ask it.

    Example:
        >>> half_precision((7, 5)), half_precision((8, 0)), half_precision(None)
        ('fp16', 'bf16', 'bf16')
    """
    return "bf16" if capability is None or tuple(capability) >= BF16_MIN_CAPABILITY else "fp16"


@dataclass(frozen=True)
class Gpu:
    """One CUDA device as the driver reports it."""

    index: int
    name: str
    total_bytes: int
    capability: tuple[int, int]

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


@dataclass(frozen=True)
class Precision:
    """The training precision chosen for a machine, and why."""

    name: str  # "bf16", "fp16" or "fp32"
    reason: str


@dataclass(frozen=True)
class Machine:
    """What `describe()` found: platform, GPUs, host memory and how the GPUs were read."""

    platform: str  # "colab", "kaggle" or "local"
    gpus: tuple[Gpu, ...]
    gpu_source: str  # "torch.cuda", "nvml", "simulated" or "none"
    cpu_count: int
    ram_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def precision(self) -> Precision:
        return choose_precision(self.gpus)

    @property
    def simulated(self) -> bool:
        """True under `helpers.simulate`: the GPUs are pretended, everything runs on the CPU."""
        return self.gpu_source == "simulated"

    @property
    def gpu_memory_bytes(self) -> int:
        """Memory of the smallest card: each data-parallel copy must fit on every card."""
        return min((g.total_bytes for g in self.gpus), default=0)

    def summary(self) -> str:
        """A plain-text table that reads the same in Colab, Kaggle and a terminal."""
        lines = [
            f"platform   : {self.platform}",
            f"cpu        : {self.cpu_count} cores, {self.ram_bytes / GIB:.1f} GiB RAM",
        ]
        if not self.gpus:
            lines.append("gpu        : none")
        for g in self.gpus:
            lines.append(
                f"gpu {g.index}      : {g.name}, {g.total_gib:.1f} GiB, "
                f"compute capability {g.capability[0]}.{g.capability[1]} (read via {self.gpu_source})"
            )
        p = self.precision
        lines.append(f"precision  : {p.name} ({p.reason})")
        lines += [f"note       : {n}" for n in self.notes]
        return "\n".join(lines)


def detect_platform(environ: dict[str, str] | None = None) -> str:
    """Return "colab", "kaggle" or "local" from the variables each service sets.

    Kaggle first: its image is built on Colab's, so it sets COLAB_RELEASE_TAG too (and may hold google.colab).
    """
    environ = os.environ if environ is None else environ
    if "KAGGLE_KERNEL_RUN_TYPE" in environ or "KAGGLE_URL_BASE" in environ:
        return "kaggle"
    if "COLAB_RELEASE_TAG" in environ or "COLAB_GPU" in environ or "google.colab" in sys.modules:
        return "colab"
    return "local"


def detect_gpus(use_nvml: bool = False) -> tuple[Gpu, ...]:
    """List the CUDA devices (under `helpers.simulate`, the simulated card's).

    Args:
        use_nvml: read them through NVML instead of torch.cuda, so CUDA stays uninitialized.
            The multi-GPU notebook needs this: accelerate's notebook_launcher refuses to start
            once any cell has touched CUDA.
    """
    if simulated_card():
        devices = simulated_devices(through_nvml=use_nvml)
        return tuple(Gpu(i, name, total, capability) for i, (name, total, capability) in enumerate(devices))
    return _gpus_from_nvml() if use_nvml else _gpus_from_torch()


def use_one_gpu() -> int:
    """Pin this process to one GPU before CUDA starts; return how many GPUs it will use.

    Kaggle's "GPU T4 x2" shows both cards to every process. A single-process Trainer then sets
    n_gpu = 2: it wraps a full fine-tune in DataParallel and feeds a 4-bit model micro-batches of
    2 on one card, so the effective batch doubles without a word. Every single-GPU notebook calls
    this first, through `helpers.start()` (setting CUDA_VISIBLE_DEVICES=0 only works before CUDA
    starts); notebook 07 teaches training on both cards instead.
    """
    visible = _visible_without_cuda()
    if visible <= 1:
        return visible
    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        print(
            f"{visible} GPUs are visible and CUDA has already started in this kernel, so it can no longer be "
            "pinned to one: restart the kernel (Colab: Runtime > Restart session; Kaggle: Run > Restart & "
            "clear cell outputs) and run from the top, so this cell runs before anything touches the GPU."
        )
        return visible
    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    print(
        f"{visible} GPUs visible: this notebook trains on GPU 0 only (CUDA_VISIBLE_DEVICES=0). With both, the "
        "Trainer would run DataParallel and double the effective batch unasked; notebook 07 uses both cards."
    )
    return 1


def _visible_without_cuda() -> int:
    """How many GPUs CUDA would show this process, read without starting CUDA (NVML and the mask)."""
    if simulated_card():
        return len(simulated_devices())
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        return len([i for i in mask.split(",") if i.strip() and not i.strip().startswith("-")])
    return len(_gpus_from_nvml())


def _gpus_from_torch() -> tuple[Gpu, ...]:
    import torch

    if not torch.cuda.is_available():
        return ()
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(Gpu(i, p.name, int(p.total_memory), (int(p.major), int(p.minor))))
    return tuple(gpus)


def _gpus_from_nvml() -> tuple[Gpu, ...]:
    with nvml_devices() as devices:
        return tuple(Gpu(d.index, d.name, int(d.memory().total), d.capability()) for d in devices or ())


# CPU instructions that multiply bf16 matrices in hardware, as Linux's /proc/cpuinfo names them: a
# CPU with them (Intel Sapphire Rapids' AMX, AMD Zen 4's AVX512-BF16) can run bf16 matmuls faster
# than fp32, as tensor cores do on a GPU; without them bf16 is converted and computed in fp32
CPU_BF16_FLAGS = {"amx_bf16": "AMX-BF16", "avx512_bf16": "AVX512-BF16"}


def cpu_bf16_units(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The bf16 matrix instructions this CPU has, e.g. ("AMX-BF16", "AVX512-BF16"); () where it has
    none, or where /proc/cpuinfo cannot be read (macOS, Windows). Taught in notebook 02.

    cpuinfo: the text of /proc/cpuinfo (read from the machine when None)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return ()
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return tuple(name for flag, name in CPU_BF16_FLAGS.items() if flag in flags)


def choose_precision(gpus: tuple[Gpu, ...] | list[Gpu]) -> Precision:
    """Pick bf16, fp16 or fp32 from the compute capability of the weakest card.

    Example:
        >>> choose_precision([Gpu(0, "Tesla T4", 15 * GIB, (7, 5))]).name
        'fp16'
    """
    if not gpus:
        return Precision(
            "fp32",
            "no GPU: fp16=True does nothing on CPU (the Trainer silently ignores it), so train in fp32",
        )
    weakest = min(gpus, key=lambda g: g.capability)
    cc = f"{weakest.capability[0]}.{weakest.capability[1]}"
    if half_precision(weakest.capability) == "bf16":
        return Precision("bf16", f"{weakest.name} has compute capability {cc} >= 8.0: native bf16, no loss scaling")
    if weakest.capability >= FP16_MIN_CAPABILITY:
        return Precision(
            "fp16",
            f"{weakest.name} has compute capability {cc} < 8.0: bf16 is only emulated there, "
            "so use fp16 with loss scaling",
        )
    return Precision(
        "fp16",
        f"{weakest.name} has compute capability {cc}: no tensor cores; fp16 still halves memory",
    )


def machine_notes(platform: str, gpus: tuple[Gpu, ...]) -> tuple[str, ...]:
    """Warnings a student should read before running anything, each with what to do."""
    notes = [banner()] if simulated_card() else []
    if not gpus:
        if platform == "colab":
            notes.append("No GPU attached: Runtime > Change runtime type > T4 GPU, then Run all again.")
        elif platform == "kaggle":
            notes.append("No GPU attached: Settings > Accelerator > GPU T4 x2, then Run all again.")
        else:
            notes.append("No GPU: the notebooks fall back to the embedded tiny model and train in fp32.")
    for g in gpus:
        if platform == "kaggle" and "P100" in g.name:
            notes.append(
                f"{g.name}: Kaggle's current image no longer runs PyTorch on the P100 "
                "(compute capability 6.0). Switch Settings > Accelerator to GPU T4 x2."
            )
        elif g.capability < TORCH_MIN_CAPABILITY:
            notes.append(
                f"{g.name} has compute capability {g.capability[0]}.{g.capability[1]}; current PyTorch "
                "builds need 7.0 or newer. Pick a T4 or a newer card."
            )
    return tuple(notes)


def describe(use_nvml: bool = False) -> Machine:
    """Describe this machine: platform, GPUs, CPU, RAM and the notes that apply.

    Example:
        >>> print(describe().summary())  # doctest: +SKIP
    """
    import psutil

    gpus = detect_gpus(use_nvml=use_nvml)
    platform = detect_platform()
    return Machine(
        platform=platform,
        gpus=gpus,
        gpu_source="simulated" if simulated_card() else ("nvml" if use_nvml else "torch.cuda") if gpus else "none",
        cpu_count=os.cpu_count() or 1,
        ram_bytes=psutil.virtual_memory().total,
        notes=machine_notes(platform, gpus),
    )


def check_4bit(device: str | None = None) -> tuple[bool, str]:
    """Quantize a small matrix to 4-bit NF4 on `device` and back; say whether that worked.

    A real round trip through bitsandbytes, not a version check: a broken install or a card
    without kernels fails here rather than in the middle of a QLoRA load.
    """
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    # On CPUs with AVX512-BF16, importing bitsandbytes tries an optional kernel from the Hub and
    # logs a warning when it is absent; its built-in CPU path runs instead, so keep that quiet.
    quiet_libraries()
    try:
        import bitsandbytes.functional as F

        w = torch.randn(64, 64, device=device)
        q, state = F.quantize_4bit(w, quant_type="nf4")
        err = (F.dequantize_4bit(q, state) - w).abs().mean().item()
    except Exception as e:  # any failure means "no 4-bit here"; the message says which
        return False, f"4-bit NF4 failed on {device}: {type(e).__name__}: {e}"
    return True, f"4-bit NF4 works on {device} (mean round-trip error {err:.3f} on N(0,1) weights)"
