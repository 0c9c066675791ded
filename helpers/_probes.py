"""How the machine's own peak memory is read, for `helpers.memory.measure` and `helpers.live`.

Private to the package: notebook 01 (memory anatomy) teaches the readouts built on it. Three
probes, one per place memory lives:

- CPU: the process RSS, with the kernel's high-water mark (reset at entry) on Linux, or RSS sampled
  in a thread where it cannot be reset;
- CUDA: torch.cuda's caching allocator, peak allocated and reserved since entry;
- NVML: every card's used memory sampled in a thread, CUDA untouched (notebook 07).

A probe's `stop()` returns (name, bytes, how) triples; `helpers.memory` makes them `Figure`s.
The NVML sampler is the kit's one: `python -m helpers gpu-proof` reads a card's idle and peak
memory around each notebook through `nvml_peaks` too. Importing this module is cheap: torch,
psutil and pynvml load when a probe starts.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack, contextmanager

from helpers._nvml import nvml_devices

__all__ = [
    "NVML_INTERVAL_S",
    "RSS_INTERVAL_S",
    "STOP_WAIT_S",
    "PeakSampler",
    "nvml_peaks",
    "probe_for",
    "read_peak_rss",
    "reset_peak_rss",
]

NVML_INTERVAL_S = 0.05  # how often measure(device="nvml") samples each card
RSS_INTERVAL_S = 0.01  # how often the RSS is sampled where the kernel's peak cannot be reset
STOP_WAIT_S = 5.0  # how long stopping waits for a read in flight: a driver that stopped answering must not hold a run


def probe_for(device: str):
    """The probe for a resolved device: "cpu", "nvml" or "cuda:N"."""
    if device == "cpu":
        return _CpuProbe()
    if device == "nvml":
        return _NvmlProbe()
    return _CudaProbe(device)


class _CpuProbe:
    """Process RSS: at exit minus at entry, and the peak (kernel high-water mark, else sampled)."""

    def start(self):
        import psutil

        self._process = psutil.Process()
        self._entry = self._process.memory_info().rss
        self._sampler = None
        if not reset_peak_rss():  # not Linux, or /proc not writable: sample instead
            self._sampler = PeakSampler(lambda: [self._process.memory_info().rss], RSS_INTERVAL_S)

    def sync(self):
        pass

    def stop(self) -> list[tuple[str, int, str]]:
        rss = self._process.memory_info().rss
        if self._sampler is None:
            peak = max(read_peak_rss() or 0, rss)
            how = "VmHWM in /proc/self/status (reset at entry through /proc/self/clear_refs) minus RSS at entry"
        else:
            peak = self._sampler.stop()[0]
            how = f"psutil RSS sampled every {RSS_INTERVAL_S * 1000:.0f} ms: peak minus RSS at entry"
        return [
            ("rss_delta", rss - self._entry, "psutil RSS at exit minus at entry (whole process)"),
            ("rss_peak_delta", peak - self._entry, how),
        ]


class _CudaProbe:
    """torch.cuda's caching allocator: peak allocated and reserved since entry."""

    def __init__(self, device: str):
        self.device = device

    def start(self):
        import torch

        torch.cuda.reset_peak_memory_stats(self.device)

    def sync(self):
        import torch

        torch.cuda.synchronize(self.device)  # so the block's time includes its queued kernels

    def stop(self) -> list[tuple[str, int, str]]:
        import torch

        return [
            (
                "peak_allocated",
                torch.cuda.max_memory_allocated(self.device),
                f"torch.cuda.max_memory_allocated({self.device}), peak reset at entry",
            ),
            (
                "peak_reserved",
                torch.cuda.max_memory_reserved(self.device),
                f"torch.cuda.max_memory_reserved({self.device}), peak reset at entry",
            ),
        ]


class _NvmlProbe:
    """Every card's used memory through NVML, sampled in a thread; torch.cuda is never touched."""

    def start(self):
        self._stack = ExitStack()
        self._sampler = self._stack.enter_context(nvml_peaks(NVML_INTERVAL_S))
        if self._sampler is None:
            self._stack.close()
            raise ValueError(
                "measure(device='nvml') found no NVIDIA driver (pynvml could not initialise). "
                "On a machine without a GPU use device='cpu'."
            )

    def sync(self):
        pass

    def stop(self) -> list[tuple[str, int, str]]:
        self._stack.close()  # stops the sampler, then NVML
        how = f"NVML used memory, every process on the card, peak of samples every {NVML_INTERVAL_S * 1000:.0f} ms"
        return [(f"gpu{i}_peak_used", peak, how) for i, peak in enumerate(self._sampler.peak)]


@contextmanager
def nvml_peaks(interval_s: float):
    """Sample every card's used memory through NVML in a thread while the block runs; CUDA untouched.

    Yields the `PeakSampler`: `first` holds each card's used bytes at entry (an idle card's), `peak`
    the most seen (final once the block has ended). None where there is no NVML (no package or no
    driver).

    Example:
        >>> with nvml_peaks(0.05) as cards:  # doctest: +SKIP
        ...     run_the_job()
        >>> cards.first[0], cards.peak[0]  # doctest: +SKIP
    """
    with nvml_devices() as devices:
        if devices is None:
            yield None
            return
        sampler = PeakSampler(lambda: [d.memory().used for d in devices], interval_s)
        try:
            yield sampler
        finally:
            sampler.stop()


class PeakSampler:
    """Calls `read()` (a list of ints) every `interval_s` in a daemon thread; keeps each one's max.

    `first` is the first reading (taken before the thread starts), `peak` each value's max so far.
    """

    def __init__(self, read, interval_s: float):
        self._read, self._interval = read, interval_s
        self._done = threading.Event()
        self.first = list(read())
        self.peak = list(self.first)
        self._thread = threading.Thread(target=self._run, name="helpers.memory sampler", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(self._interval):
            self._update(self._read())

    def _update(self, values):
        self.peak = [max(a, b) for a, b in zip(self.peak, values)]

    def stop(self) -> list[int]:
        """Stop sampling and read once more; a read still hanging after STOP_WAIT_S is left to its thread."""
        self._done.set()
        self._thread.join(timeout=STOP_WAIT_S)
        if not self._thread.is_alive():
            self._update(self._read())
        return self.peak


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of this process's RSS (Linux 4.0+); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5 = reset the peak RSS only
    except OSError:
        return False
    return read_peak_rss() is not None


def read_peak_rss() -> int | None:
    """VmHWM, the peak RSS since the last reset, in bytes; None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None
