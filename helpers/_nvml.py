"""The cards as the driver lists them, through NVML, with CUDA left uninitialized.

Private to the package: `helpers.env.detect_gpus(use_nvml=True)`, `helpers.memory.read_gpu_memory`
and the NVML probe of `helpers.memory.measure` (helpers/_probes.py) read cards this way, which
notebook 07 (Kaggle T4 x2) needs: `accelerate.notebook_launcher` refuses to start once a cell has
touched CUDA. Importing this module is cheap: pynvml loads when a block opens.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["NvmlDevice", "nvml_devices"]


@dataclass(frozen=True)
class NvmlDevice:
    """One card as NVML lists it, with the handle to ask the driver more."""

    index: int
    name: str
    handle: object
    nvml: object  # the pynvml module, initialised while the `nvml_devices` block runs

    def memory(self):
        """The driver's memory info for this card: `.used` and `.total`, in bytes."""
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle)

    def capability(self) -> tuple[int, int]:
        major, minor = self.nvml.nvmlDeviceGetCudaComputeCapability(self.handle)
        return int(major), int(minor)


@contextmanager
def nvml_devices():
    """Open NVML for the block and list its cards; None where there is no NVML (no package or no driver).

    The one way the kit reads cards through the driver, leaving CUDA uninitialized: for
    `detect_gpus(use_nvml=True)` here, and `helpers.memory.read_gpu_memory` and
    `measure(device="nvml")` there.
    """
    try:
        import pynvml  # shipped by nvidia-ml-py
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver: a CPU machine
        yield None
        return
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name  # older bindings return bytes
            devices.append(NvmlDevice(i, name, handle, pynvml))
        yield devices
    finally:
        pynvml.nvmlShutdown()
