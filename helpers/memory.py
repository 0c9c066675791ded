"""Memory readouts: what a block of training code really holds, measured.

Taught in notebook 01 (memory anatomy) and used by every notebook that shows a readout:

- `measure(label, model=..., optimizer=...)` measures a block: the exact bytes of weights,
  gradients, optimizer states and activations, and the peak the machine saw (torch.cuda's
  allocator on a GPU, the process RSS on CPU, NVML per card where CUDA must stay untouched);
- `compare(readouts)` and `plot(readouts)` put several blocks side by side (fp32, bf16,
  checkpointing);
- `track_saved_tensors(*models)` is the activation count on its own: the definition the
  estimator (`helpers.estimate`) predicts;
- `LiveMemoryCallback` shows step, loss and memory in one output area while a Trainer runs
  (notebooks 03 and 08);
- `free_memory(...)` and `is_oom_error(exc)` let a notebook go on after a CUDA out-of-memory
  error without restarting the runtime (notebooks 03 and 08);
- `read_gpu_memory()` reads every card's used and total memory through NVML, never touching
  torch.cuda (notebook 07, where accelerate's notebook_launcher needs CUDA uninitialized).

Importing this module is cheap: torch, transformers, psutil and matplotlib load when used.
"""

from __future__ import annotations

import gc
import inspect
import multiprocessing
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

from helpers._callbacks import lazy_callbacks

MIB = 2**20
GIB = 2**30

# the parts of the training bill that add up to `Readout.total` (the estimator's names)
COMPONENTS = ("weights", "gradients", "optimizer", "activations")
NVML_INTERVAL_S = 0.05  # how often measure(device="nvml") samples each card
RSS_INTERVAL_S = 0.01  # how often the RSS is sampled where the kernel's peak cannot be reset

__all__ = [
    "COMPONENTS",
    "Figure",
    "GpuMemory",
    "LiveMemoryCallback",
    "Readout",
    "SavedTensors",
    "compare",
    "free_memory",
    "is_oom_error",
    "measure",
    "plot",
    "read_gpu_memory",
    "track_saved_tensors",
]


# ---------------------------------------------------------------------------------------------
# activations: what autograd saves for backward


@dataclass
class SavedTensors:
    """What autograd kept for backward during a `track_saved_tensors` block."""

    bytes: int = 0  # each storage once, parameters excluded
    count: int = 0  # distinct storages
    by_dtype: dict = field(default_factory=dict)  # dtype name -> bytes
    peak_bytes: int = 0  # most bytes held for backward at one moment (equals `bytes` for one forward)


class _Held:
    """A saved tensor as the graph holds it; tells the tracker when the graph lets go of it."""

    __slots__ = ("tensor", "_release")

    def __init__(self, tensor, release):
        self.tensor, self._release = tensor, release

    def __del__(self):  # the graph was freed (after backward) or dropped
        self._release()


@contextmanager
def track_saved_tensors(*models):
    """Count the bytes autograd saves for backward inside the block: the activations.

    Every tensor an op saves for its backward pass goes through a saved-tensor hook; this counts
    each underlying storage once (a view of a counted tensor adds nothing) and skips the storages
    of the given models' parameters, which are weights, not activations. On CPU this is exact, and
    it is the definition the estimator (`helpers.estimate`) predicts. Taught in notebook 01.

    `bytes` adds up everything saved in the block; `peak_bytes` is the most the graph held at one
    moment, which is what a block of several training steps needs (each backward frees its graph).

    Args:
        models: the modules whose parameters are not to be counted.

    Returns:
        a `SavedTensors`, filled as the block runs.

    Example:
        >>> with track_saved_tensors(model) as saved:  # doctest: +SKIP
        ...     loss = model(**batch).loss
        >>> saved.bytes  # doctest: +SKIP
    """
    import torch

    params = {p.untyped_storage().data_ptr() for m in models for p in m.parameters()}
    seen: set[int] = set()
    held: dict[int, list[int]] = {}  # storage address -> [saved references alive, bytes]
    saved = SavedTensors()
    live = 0  # bytes the graph holds now

    def release(key):
        nonlocal live
        entry = held[key]
        entry[0] -= 1
        if entry[0] == 0:
            live -= entry[1]
            del held[key]

    def pack(t):
        nonlocal live
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in params:
            return t
        if key not in seen:
            seen.add(key)
            saved.bytes += storage.nbytes()
            saved.count += 1
            name = str(t.dtype).removeprefix("torch.")
            saved.by_dtype[name] = saved.by_dtype.get(name, 0) + storage.nbytes()
        if key not in held:  # first reference the graph holds to this storage
            held[key] = [0, storage.nbytes()]
            live += storage.nbytes()
            saved.peak_bytes = max(saved.peak_bytes, live)
        held[key][0] += 1
        return _Held(t.detach(), lambda: release(key))  # detached: no cycle through an output's grad_fn

    def unpack(h):
        return h.tensor if isinstance(h, _Held) else h

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield saved


# ---------------------------------------------------------------------------------------------
# measure(): one readout of a block


@dataclass(frozen=True)
class Figure:
    """One measured number and how it was measured."""

    name: str  # "weights", "activations", "peak_allocated", ...
    bytes: int
    how: str  # the function or counter that gave it, e.g. "torch.cuda.max_memory_allocated(cuda:0)"

    @property
    def mib(self) -> float:
        return self.bytes / MIB


@dataclass
class Readout:
    """What `measure` found for one block; filled when the block exits.

    Index it by figure name for bytes (`readout["activations"]`); `total` is the training bill
    (weights + gradients + optimizer + activations, those measured), comparable with the
    estimator's `total`. Peaks (`peak_allocated`, `rss_peak_delta`, ...) are separate figures.
    """

    label: str
    device: str = "cpu"  # "cpu", "cuda:0", ... or "nvml"
    seconds: float = 0.0  # wall-clock time of the block (after a CUDA synchronize)
    figures: dict[str, Figure] = field(default_factory=dict)
    saved: SavedTensors | None = None  # the activations in detail (by dtype, count)

    def __getitem__(self, name: str) -> int:
        if name == "total":
            return self.total
        try:
            return self.figures[name].bytes
        except KeyError:
            raise KeyError(
                f"{self.label!r} has no figure {name!r}; it has {', '.join(self.figures) or 'none yet'} "
                "(a readout is filled when its `with measure(...)` block exits)"
            ) from None

    def __contains__(self, name: str) -> bool:
        return name in self.figures

    @property
    def total(self) -> int:
        """Bytes of weights + gradients + optimizer states + activations (those measured)."""
        return sum(f.bytes for n, f in self.figures.items() if n in COMPONENTS)

    def as_dict(self) -> dict:
        """Label, device, seconds, every figure in bytes and the total: ready for `helpers.record`."""
        figures = {n: f.bytes for n, f in self.figures.items()}
        return {"label": self.label, "device": self.device, "seconds": self.seconds, **figures, "total": self.total}

    def __str__(self) -> str:
        lines = [f"{self.label} ({self.device}, {self.seconds:.3f} s)"]
        rows = [(n, f.bytes, f.how) for n, f in self.figures.items() if n in COMPONENTS]
        if rows:
            rows.append(("total", self.total, " + ".join(n for n, _, _ in rows)))
        rows += [(n, f.bytes, f.how) for n, f in self.figures.items() if n not in COMPONENTS]
        unit, size = _unit(max((abs(b) for _, b, _ in rows), default=0))
        lines += [f"  {n:<16}{b / size:>12,.2f} {unit}  {how}" for n, b, how in rows]
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle):  # IPython shows the table, not the dataclass repr
        p.text(str(self))


@contextmanager
def measure(label: str, *, model=None, optimizer=None, device: str | None = None):
    """Measure the memory a block of training code uses; the readout is filled when it exits.

    Always, and exactly (on any device):
        weights      bytes of `model`'s parameters, each storage once;
        gradients    bytes of the parameters' `.grad` that exist when the block exits;
        optimizer    bytes of the tensors in `optimizer.state` when the block exits;
        activations  bytes autograd held for backward at the block's peak (saved-tensor hooks,
                     each storage once, `model`'s parameters excluded).
    And the machine's own view:
        on a GPU     `peak_allocated` and `peak_reserved` from torch.cuda since the block began;
        on CPU       `rss_delta` (RSS at exit minus at entry) and `rss_peak_delta` (peak RSS minus
                     RSS at entry: the kernel's high-water mark, reset at entry, on Linux);
        device="nvml"  `gpu<i>_peak_used` for every card, sampled through NVML, CUDA untouched.

    Taught in notebook 01 (memory anatomy). If the block raises (an out-of-memory error, say),
    the readout is still filled with what was reached, then the error propagates. Blocks do not
    nest: an inner `measure`, or a `LiveMemoryCallback` when training begins, resets the same
    peak counters (torch.cuda's, the kernel's RSS high-water mark) the outer block reads.

    Args:
        label: the name of this block in tables and charts ("fp32", "bf16", "checkpointing").
        model: the model the block trains; gives weights and gradients and keeps its parameters
            out of the activations. Without it, weights a layer saves count as activations.
        optimizer: the optimizer the block steps; gives the optimizer states.
        device: "cpu", "cuda", "cuda:1" or "nvml"; default: where `model` is, else "cuda" when
            torch sees a GPU, else "cpu".

    Returns:
        a `Readout` (empty until the block exits).

    Example:
        >>> with measure("fp32", model=model, optimizer=optimizer) as fp32:  # doctest: +SKIP
        ...     model(**batch).loss.backward()
        ...     optimizer.step()
        >>> print(fp32)  # doctest: +SKIP
    """
    if not isinstance(label, str) or not label:
        raise TypeError(f"measure() needs a non-empty string label, e.g. measure('fp32', ...); got {label!r}")
    readout = Readout(label, _resolve_device(device, model))
    probe = _probe_for(readout.device)
    with track_saved_tensors(*([model] if model is not None else [])) as saved:
        probe.start()
        start = time.perf_counter()
        try:
            yield readout
        finally:
            probe.sync()
            readout.seconds = time.perf_counter() - start
            readout.saved = saved
            readout.figures = {f.name: f for f in _exact_figures(model, optimizer, saved) + probe.stop()}


def _exact_figures(model, optimizer, saved: SavedTensors) -> list[Figure]:
    figures = []
    if model is not None:
        params = list(model.parameters())
        figures.append(Figure("weights", _storage_bytes(params),
                              "sum of nbytes over model.parameters(), each storage once"))
        figures.append(Figure("gradients", _storage_bytes(p.grad for p in params if p.grad is not None),
                              "sum of nbytes over the parameters' .grad at exit"))
    if optimizer is not None:
        figures.append(Figure("optimizer", _storage_bytes(_state_tensors(optimizer)),
                              "sum of nbytes over the tensors in optimizer.state at exit"))
    excluded = "model's parameters excluded" if model is not None else "no model given, so saved weights count too"
    figures.append(Figure("activations", saved.peak_bytes,
                          f"saved-tensor hooks: peak bytes held for backward, each storage once, {excluded}"))
    return figures


def _resolve_device(device, model) -> str:
    import torch

    if device is None:
        param = next(model.parameters(), None) if model is not None else None
        if param is not None:
            device = str(param.device)
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
    device = str(device)
    if device in ("cpu", "nvml"):
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"measure(device={device!r}) but torch sees no CUDA GPU here. Pass device='cpu', or attach "
                "a GPU (Colab: Runtime > Change runtime type > T4 GPU; Kaggle: Settings > Accelerator)."
            )
        index = torch.device(device).index
        return f"cuda:{torch.cuda.current_device() if index is None else index}"
    raise ValueError(f"measure() reads 'cpu', 'cuda', 'cuda:N' or 'nvml', not device={device!r}")


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views and tied weights count once)."""
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen or storage.data_ptr() == 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _state_tensors(optimizer):
    import torch

    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value


class _CpuProbe:
    """Process RSS: at exit minus at entry, and the peak (kernel high-water mark, else sampled)."""

    def start(self):
        import psutil

        self._process = psutil.Process()
        self._entry = self._process.memory_info().rss
        self._sampler = None
        if not _reset_peak_rss():  # not Linux, or /proc not writable: sample instead
            self._sampler = _PeakSampler(lambda: [self._process.memory_info().rss], RSS_INTERVAL_S)

    def sync(self):
        pass

    def stop(self) -> list[Figure]:
        rss = self._process.memory_info().rss
        if self._sampler is None:
            peak = max(_read_peak_rss() or 0, rss)
            how = "VmHWM in /proc/self/status (reset at entry through /proc/self/clear_refs) minus RSS at entry"
        else:
            peak = self._sampler.stop()[0]
            how = f"psutil RSS sampled every {RSS_INTERVAL_S * 1000:.0f} ms: peak minus RSS at entry"
        return [
            Figure("rss_delta", rss - self._entry, "psutil RSS at exit minus at entry (whole process)"),
            Figure("rss_peak_delta", peak - self._entry, how),
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

    def stop(self) -> list[Figure]:
        import torch

        return [
            Figure("peak_allocated", torch.cuda.max_memory_allocated(self.device),
                   f"torch.cuda.max_memory_allocated({self.device}), peak reset at entry"),
            Figure("peak_reserved", torch.cuda.max_memory_reserved(self.device),
                   f"torch.cuda.max_memory_reserved({self.device}), peak reset at entry"),
        ]


class _NvmlProbe:
    """Every card's used memory through NVML, sampled in a thread; torch.cuda is never touched."""

    def start(self):
        self._stack = ExitStack()
        nvml = self._stack.enter_context(_nvml())
        if nvml is None:
            self._stack.close()
            raise ValueError(
                "measure(device='nvml') found no NVIDIA driver (pynvml could not initialise). "
                "On a machine without a GPU use device='cpu'."
            )
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self._sampler = _PeakSampler(lambda: [nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles], NVML_INTERVAL_S)

    def sync(self):
        pass

    def stop(self) -> list[Figure]:
        try:
            peaks = self._sampler.stop()
        finally:
            self._stack.close()
        how = f"NVML used memory, every process on the card, peak of samples every {NVML_INTERVAL_S * 1000:.0f} ms"
        return [Figure(f"gpu{i}_peak_used", peak, how) for i, peak in enumerate(peaks)]


def _probe_for(device: str):
    if device == "cpu":
        return _CpuProbe()
    if device == "nvml":
        return _NvmlProbe()
    return _CudaProbe(device)


class _PeakSampler:
    """Calls `read()` (a list of ints) every `interval_s` in a daemon thread; keeps each one's max."""

    def __init__(self, read, interval_s: float):
        self._read, self._interval = read, interval_s
        self._done = threading.Event()
        self.peak = list(read())
        self._thread = threading.Thread(target=self._run, name="helpers.memory sampler", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.wait(self._interval):
            self._update(self._read())

    def _update(self, values):
        self.peak = [max(a, b) for a, b in zip(self.peak, values)]

    def stop(self) -> list[int]:
        self._done.set()
        self._thread.join()
        self._update(self._read())
        return self.peak


def _reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark of this process's RSS (Linux 4.0+); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5 = reset the peak RSS only
    except OSError:
        return False
    return _read_peak_rss() is not None


def _read_peak_rss() -> int | None:
    """VmHWM, the peak RSS since the last reset, in bytes; None where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------------
# several readouts side by side


def compare(readouts) -> str:
    """Put several readouts side by side: one column each, one row per figure, ratios to the first.

    Taught in notebook 01 (memory anatomy); notebooks 02 and 03 compare precisions and
    checkpointing with it. Plain text, so it reads the same in Colab, Kaggle and a terminal.

    Args:
        readouts: `Readout`s from `measure`, the first one the baseline.

    Returns:
        the table (in MiB; KiB or GiB when the numbers are that small or large), then how
        each figure was measured.

    Example:
        >>> print(compare([fp32, bf16, checkpointed]))  # doctest: +SKIP
    """
    readouts = _check_readouts(readouts, "compare")
    names = _row_names(readouts)
    unit, size = _unit(max(abs(r[n]) for r in readouts for n in names if n == "total" or n in r))
    width = max(20, *(len(r.label) + 2 for r in readouts))

    def row(name, values, fmt):
        """One line: the value of each readout, then its ratio to the first readout's."""
        cells = []
        for i, value in enumerate(values):
            text = "-" if value is None else fmt.format(value)
            if i and value is not None:
                text += f" {value / values[0]:5.2f}x" if values[0] else "      -"
            cells.append(text.rjust(width))
        return f"{name:<16}" + "".join(cells)

    lines = [f"{'':<16}" + "".join(r.label.rjust(width) for r in readouts),
             f"{'':<16}" + "".join(f"({r.device})".rjust(width) for r in readouts)]
    for name in names:
        values = [r[name] / size if (name == "total" or name in r) else None for r in readouts]
        lines.append(row(name, values, "{:,.2f} " + unit))
    lines.append(row("time", [r.seconds for r in readouts], "{:,.3f} s"))
    lines.append("")
    lines.append("how each figure was measured:")
    hows = {}
    for r in readouts:
        for n, f in r.figures.items():
            hows.setdefault(n, f.how)
    hows["total"] = " + ".join(n for n in COMPONENTS if n in hows)
    lines += [f"  {n:<16}{hows[n]}" for n in names]
    return "\n".join(lines)


def plot(readouts, ax=None):
    """Draw a stacked bar per readout: weights, gradients, optimizer, activations.

    Where torch.cuda measured a peak, a black tick marks it on the bar, so the bill and the
    allocator's own number can be compared. Taught in notebook 01 (memory anatomy). Never calls
    `plt.show()`: a notebook shows the figure by itself, a script saves it.

    Args:
        readouts: `Readout`s from `measure`.
        ax: a matplotlib Axes to draw on; default: a new figure's.

    Returns:
        the Axes.

    Example:
        >>> ax = plot([fp32, bf16, checkpointed])  # doctest: +SKIP
        >>> ax.figure.savefig("memory.png")  # doctest: +SKIP
    """
    readouts = _check_readouts(readouts, "plot")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(2 + 1.4 * len(readouts), 4))
    unit, size = _unit(max(max(r.total, r["peak_allocated"] if "peak_allocated" in r else 0) for r in readouts))
    x = list(range(len(readouts)))
    bottom = [0.0] * len(readouts)
    for name in COMPONENTS:
        if not any(name in r for r in readouts):
            continue
        heights = [r[name] / size if name in r else 0.0 for r in readouts]
        ax.bar(x, heights, bottom=bottom, label=name, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:,.1f}", (i, total), ha="center", va="bottom", fontsize=8)
    peaks = [(i, r["peak_allocated"] / size) for i, r in enumerate(readouts) if "peak_allocated" in r]
    if peaks:
        ax.scatter([i for i, _ in peaks], [p for _, p in peaks], marker="_", s=900, color="black",
                   zorder=3, label="peak allocated (torch.cuda)")
    ax.set_xticks(x)
    ax.set_xticklabels([r.label for r in readouts])
    ax.set_ylabel(unit)
    ax.set_title("memory by component")
    ax.margins(y=0.1)  # room for the totals above the bars
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=8)  # same order as the stack, top first
    return ax


def _check_readouts(readouts, caller: str) -> list[Readout]:
    readouts = list(readouts)
    if not readouts or not all(isinstance(r, Readout) for r in readouts):
        raise TypeError(
            f"{caller}() takes a list of Readouts from `with measure(...) as r:` blocks, "
            f"e.g. {caller}([fp32, bf16]); got {[type(r).__name__ for r in readouts] or 'an empty list'}"
        )
    return readouts


def _row_names(readouts) -> list[str]:
    seen = {n for r in readouts for n in r.figures}
    names = [n for n in COMPONENTS if n in seen] + ["total"]
    for r in readouts:
        names += [n for n in r.figures if n not in COMPONENTS and n not in names]
    return names


# ---------------------------------------------------------------------------------------------
# NVML: every card, without touching torch.cuda


@dataclass(frozen=True)
class GpuMemory:
    """One card's memory as the driver reports it (every process on the card counts)."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int

    def __str__(self) -> str:
        return (f"gpu {self.index} {self.name}: {self.used_bytes / GIB:.2f} of {self.total_bytes / GIB:.2f} GiB "
                f"used ({self.used_bytes / self.total_bytes:.0%})")


@contextmanager
def _nvml():
    """pynvml, initialised for the block; None where there is no NVML (no package or no driver)."""
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
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def read_gpu_memory() -> list[GpuMemory]:
    """Read every card's used and total memory through NVML, leaving CUDA uninitialized.

    Taught in notebook 07 (Kaggle T4 x2): accelerate's notebook_launcher refuses to start once a
    cell has touched CUDA, so the cards are read through the driver instead of torch.cuda.
    "used" is what nvidia-smi shows: every process, CUDA contexts included.

    Returns:
        one `GpuMemory` per card; [] where there is no NVIDIA driver.

    Example:
        >>> for card in read_gpu_memory():  # doctest: +SKIP
        ...     print(card)
        gpu 0 Tesla T4: 0.42 of 15.00 GiB used (3%)
    """
    with _nvml() as nvml:
        if nvml is None:
            return []
        cards = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name  # older bindings return bytes
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            cards.append(GpuMemory(i, name, int(info.used), int(info.total)))
        return cards


# ---------------------------------------------------------------------------------------------
# live readout while a Trainer runs


# LiveMemoryCallback is this class plus transformers.TrainerCallback, put together on first use
# (see __getattr__ below) so that importing helpers.memory does not import transformers.
class _LiveReadout:
    """Show step, loss and memory in one output area while a Trainer trains.

    Every `every_n_steps` steps one line is refreshed in place: step / max steps, the last logged
    loss, current and peak memory against the card's capacity (torch.cuda allocated, peak and
    reserved on a GPU; the process RSS against total RAM on CPU, and it says which), and seconds
    per step. When training ends a summary line follows and `callback.summary` holds the same
    figures for `helpers.record`. In a notebook (Colab, Kaggle, JupyterLab) the line is a
    text/plain display updated through its display id, so it needs no widgets; headless it prints
    one plain line per update. Only the main process shows anything (data parallel runs).

    It reads counters only (no synchronize, no NVML), so it costs far below 2 % of a step
    (scripts/bench_live_readout.py measures it). The peak counters are reset when training begins.
    The loss is the last one the Trainer logged: set `logging_steps` to `every_n_steps` to see a
    fresh one on every update. Taught in notebooks 03 (gradient checkpointing) and 08 (capstone).

    Args:
        every_n_steps: refresh every this many optimizer steps.
        output: "auto" (a display in a notebook, lines otherwise), "notebook" or "text".

    Example:
        >>> trainer = Trainer(model=model, args=args, train_dataset=data,
        ...                   callbacks=[LiveMemoryCallback(every_n_steps=10)])  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
        step 10/100 | loss 3.2107 (step 10) | cuda:0 1.10 GiB allocated, peak 2.31 GiB (peak reserved ...
    """

    def __init__(self, every_n_steps: int = 10, *, output: str = "auto"):
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}; e.g. LiveMemoryCallback(10)")
        if output not in ("auto", "notebook", "text"):
            raise ValueError(f"output must be 'auto', 'notebook' or 'text', got {output!r}")
        self.every_n_steps = every_n_steps
        self.output = output
        self.summary: dict = {}  # filled at the end of training, ready for helpers.record
        # set again by on_train_begin; here so that a log before any training (trainer.evaluate()) finds them
        self._pending, self._loss, self._train_loss = False, None, None
        self._notebook, self._handle, self._line = False, None, ""

    def on_train_begin(self, args, state, control, **kwargs):
        self._meter = _Meter(str(args.device))
        self._notebook = self.output == "notebook" or (self.output == "auto" and _in_notebook())
        self._handle = None
        self._line = ""
        self._loss = self._train_loss = None
        self._pending = False
        self._first_step = state.global_step  # not 0 when resuming from a checkpoint
        self._start = time.perf_counter()
        self.summary = {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_n_steps or not state.is_world_process_zero:
            return
        if control.should_log:  # the Trainer logs this step's loss next: show the line then
            self._pending = True
        else:
            self._show_status(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self._loss = (float(logs["loss"]), state.global_step)
        if "train_loss" in logs:  # the Trainer's last log: mean loss over the run
            self._train_loss = float(logs["train_loss"])
        if self._pending and state.is_world_process_zero:
            self._pending = False
            self._show_status(state)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self._pending:  # a log the Trainer skipped: show the step without it
            self._show_status(state)
        steps = state.global_step - self._first_step
        seconds = time.perf_counter() - self._start
        _, peak, reserved = self._meter.read()
        self.summary = {
            "steps": steps,
            "seconds": seconds,
            "seconds_per_step": seconds / steps if steps else None,
            "loss": self._loss[0] if self._loss else None,
            "train_loss": self._train_loss,
            "device": self._meter.device,
            "peak_bytes": peak,
            "capacity_bytes": self._meter.capacity,
        }
        losses = ([f"last loss {self._loss[0]:.4f}"] if self._loss else []) + (
            [f"mean loss {self._train_loss:.4f}"] if self._train_loss is not None else [])
        loss = "".join(", " + text for text in losses)
        per_step = f" ({seconds / steps:.3f} s/step)" if steps else ""
        text = (f"done: {steps} steps in {seconds:.1f} s{per_step}{loss}, "
                f"peak {self._meter.describe_peak(peak, reserved)}")
        self._show(f"{self._line}\n{text}" if self._notebook and self._line else text)

    def _show_status(self, state):
        current, peak, reserved = self._meter.read()
        done = state.global_step - self._first_step
        per_step = (time.perf_counter() - self._start) / done if done else 0.0
        loss = f"loss {self._loss[0]:.4f} (step {self._loss[1]})" if self._loss else "loss -"
        self._line = (f"step {state.global_step}/{state.max_steps} | {loss} | "
                      f"{self._meter.describe(current, peak, reserved)} | {per_step:.3f} s/step")
        self._show(self._line)

    def _show(self, text: str):
        if not self._notebook:
            print(text, flush=True)
            return
        from IPython import display

        bundle = {"text/plain": text}  # plain text: renders in Colab, Kaggle, JupyterLab, no widgets
        if self._handle is None:
            self._handle = display.display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


class _Meter:
    """Current and peak memory of one device, read from counters only (no synchronize, no NVML)."""

    def __init__(self, device: str):
        import torch

        if device.startswith("cuda") and torch.cuda.is_available():
            self.device = f"cuda:{torch.device(device).index or 0}"
            self.capacity = torch.cuda.get_device_properties(self.device).total_memory  # bytes
            torch.cuda.reset_peak_memory_stats(self.device)  # peak = peak of this training run
        else:
            import psutil

            self.device = "cpu"
            self.capacity = psutil.virtual_memory().total  # bytes of RAM
            self._process = psutil.Process()
            self._exact_peak = _reset_peak_rss()
            self._peak = 0

    def read(self) -> tuple[int, int, int | None]:
        """(current, peak, peak reserved) in bytes; reserved is None on CPU."""
        if self.device != "cpu":
            import torch

            return (torch.cuda.memory_allocated(self.device), torch.cuda.max_memory_allocated(self.device),
                    torch.cuda.max_memory_reserved(self.device))
        rss = self._process.memory_info().rss
        self._peak = max(self._peak, rss, (_read_peak_rss() or 0) if self._exact_peak else 0)
        return rss, self._peak, None

    def describe(self, current: int, peak: int, reserved: int | None) -> str:
        if reserved is None:
            return (f"RSS {_human(current)}, peak {_human(peak)} "
                    f"= {peak / self.capacity:.0%} of {_human(self.capacity)} RAM")
        return (f"{self.device} {_human(current)} allocated, peak {_human(peak)} "
                f"(peak reserved {_human(reserved)} = {reserved / self.capacity:.0%} of {_human(self.capacity)})")

    def describe_peak(self, peak: int, reserved: int | None) -> str:
        if reserved is None:
            return f"RSS {_human(peak)} = {peak / self.capacity:.0%} of {_human(self.capacity)} RAM"
        return (f"{self.device} {_human(peak)} allocated, {_human(reserved)} reserved "
                f"= {reserved / self.capacity:.0%} of {_human(self.capacity)}")


def _unit(largest: int) -> tuple[str, int]:
    """The unit a table of byte counts reads best in: KiB below 1 MiB, GiB from 10 GiB, else MiB."""
    if largest < MIB:
        return "KiB", 1024
    return ("GiB", GIB) if largest >= 10 * GIB else ("MiB", MIB)


def _human(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _in_notebook() -> bool:
    """True inside a Jupyter kernel's own process (Colab, Kaggle, JupyterLab, papermill)."""
    if "IPython" not in sys.modules or multiprocessing.parent_process() is not None:
        return False  # no IPython loaded, or a worker started by notebook_launcher / DataLoader
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


# LiveMemoryCallback subclasses TrainerCallback: built, importing transformers, on first use
__getattr__, __dir__ = lazy_callbacks(globals(), LiveMemoryCallback=_LiveReadout)


# ---------------------------------------------------------------------------------------------
# going on after an out-of-memory error

_OOM_MESSAGES = (
    "out of memory",  # CUDA, HIP, XPU: "CUDA out of memory. Tried to allocate ..."; MPS
    "cublas_status_alloc_failed",  # cuBLAS could not get its workspace
    "cudnn_status_alloc_failed",
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
)


def is_oom_error(exc: BaseException) -> bool:
    """Say whether `exc` (or an exception it was raised from) is an out-of-memory error.

    Recognises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) and the RuntimeErrors that
    report the same in words: "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory". Taught in notebooks 03 and 08.

    Args:
        exc: the exception caught.

    Returns:
        True when retrying with less memory (smaller batch, checkpointing) is the fix.

    Example:
        >>> try:  # doctest: +SKIP
        ...     trainer.train()
        ... except Exception as e:
        ...     if not is_oom_error(e):
        ...         raise
        ...     trainer, model = free_memory(trainer, model)
    """
    torch = sys.modules.get("torch")
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if torch is not None and isinstance(exc, torch.OutOfMemoryError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_memory(*objects) -> list[None]:
    """Free the memory an out-of-memory error left behind, so the notebook goes on without a restart.

    After an error in a notebook cell, Python keeps the traceback (sys.last_traceback, IPython's
    last result), and the traceback keeps every frame the error passed through, and the frames
    keep their local variables: the activations of the forward pass that failed. That, not the
    GPU, is why a notebook "needs a restart" after a CUDA out-of-memory error. This clears the
    local variables of the frames of that error (and of the one being handled, and of any
    exception passed in), drops the passed objects from IPython's output cache (`Out`, `_`,
    `_12`: a cell that showed `model` keeps it), runs the garbage collector and returns
    torch.cuda's cached blocks to the driver. Post-mortem debugging (%debug) of that error is
    no longer possible afterwards. Taught in notebooks 03 and 08.

    Python cannot delete the caller's variables: reassign them from the list returned, as with
    accelerate's `release_memory`.

    Args:
        objects: what to let go of (the trainer, the model, an optimizer, a batch, an exception).

    Returns:
        a list of None, one per object, to assign back.

    Example:
        >>> trainer.train()  # doctest: +SKIP
        OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB ...
        >>> # the next cell, no restart: let go, then build again with a smaller batch
        >>> trainer, model = free_memory(trainer, model)  # doctest: +SKIP
    """
    objects = list(objects)
    n = len(objects)
    shell = _ipython_shell()
    errors = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None), sys.exc_info()[1]]
    if shell is not None:
        errors.append(getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None))
        _drop_from_output_cache(shell, objects)
    errors += [o for o in objects if isinstance(o, BaseException)]
    for exc in errors:
        _clear_frames(exc)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    del errors, objects  # this function's own references go before collecting
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # hand cached blocks back to the driver (nvidia-smi shows it)
    return [None] * n


def _ipython_shell():
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def _clear_frames(exc):
    """Drop the local variables of every finished frame in `exc`'s traceback and its chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
            except RuntimeError:  # a frame still running (the caller's own) keeps its variables
                pass
            else:
                if frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # a function's frame, not a module's
                    # a traceback printer that read frame.f_locals left a dict copy of the locals on
                    # the frame (Python < 3.13), which clear() keeps; reading it again re-syncs it
                    # with the now empty frame and empties it
                    frame.f_locals  # noqa: B018
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def _drop_from_output_cache(shell, objects):
    """Remove `objects` from IPython's output history: Out[n], _n, _, __ and ___."""
    if not objects:
        return
    ids = {id(o) for o in objects if o is not None}
    out = shell.user_ns.get("_oh")  # the dict `Out` names
    if isinstance(out, dict):
        for key in [k for k, v in out.items() if id(v) in ids]:
            del out[key]
    for ns in (shell.user_ns, getattr(shell, "user_ns_hidden", {})):
        for key in [k for k, v in ns.items() if id(v) in ids and k.startswith("_") and k.strip("_").isdigit()]:
            del ns[key]
        for key in ("_", "__", "___"):
            if id(ns.get(key)) in ids:
                ns[key] = ""
    hook = getattr(shell, "displayhook", None)
    for attr in ("_", "__", "___"):
        if id(getattr(hook, attr, None)) in ids:
            setattr(hook, attr, "")
    last = getattr(shell, "last_execution_result", None)  # the previous cell's value
    if id(getattr(last, "result", None)) in ids:
        last.result = None
