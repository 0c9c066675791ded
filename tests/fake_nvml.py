"""A stand-in for pynvml (the NVML bindings nvidia-ml-py ships) for the tests: no driver is needed.

`FakeNVML` answers the calls the kit makes through helpers/_nvml.py: init and shutdown (counted in
`open`, so a test can assert NVML was closed again), the device count and handles, each card's
name (as bytes, as older bindings return it), memory (reads counted in `reads`) and compute
capability. A test puts it where the kit imports pynvml from:
`monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([FakeCard("Tesla T4", 15 * GIB)]))`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass


@dataclass
class FakeCard:
    """One card as the fake driver reports it; a test may change `used` while a sampler reads it."""

    name: str
    total: int  # bytes
    capability: tuple[int, int] = (7, 5)  # a T4's unless the test says otherwise
    used: int = 0  # bytes, every process on the card


class FakeNVML(types.ModuleType):
    """Stands in for pynvml, reporting `cards`; without a driver its init fails as NVML's does."""

    class NVMLError(Exception):
        pass

    def __init__(self, cards: list[FakeCard], driver: bool = True):
        super().__init__("pynvml")
        self.cards, self.driver = list(cards), driver
        self.open, self.reads = 0, 0  # NVML sessions not yet shut down; memory reads

    def nvmlInit(self):
        if not self.driver:
            raise self.NVMLError("Driver Not Loaded")
        self.open += 1

    def nvmlShutdown(self):
        self.open -= 1

    def nvmlDeviceGetCount(self):
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, i):
        return self.cards[i].name.encode()  # older bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, i):
        self.reads += 1
        return types.SimpleNamespace(used=self.cards[i].used, total=self.cards[i].total)

    def nvmlDeviceGetCudaComputeCapability(self, i):
        return self.cards[i].capability
