"""Memory readouts: what a block of training code really holds, measured.

Taught in notebook 01 (memory anatomy) and used by every notebook that shows a readout:

- `measure(label, model=..., optimizer=...)` measures a block: the exact bytes of weights,
  gradients, optimizer states and activations, and the peak the machine saw (torch.cuda's
  allocator on a GPU, the process RSS on CPU, NVML per card where CUDA must stay untouched);
- `compare(readouts)` and `plot(readouts)` put several blocks side by side (fp32, bf16,
  checkpointing);
- `read_gpu_memory()` reads every card's used and total memory through NVML, never touching
  torch.cuda (notebook 07, where accelerate's notebook_launcher needs CUDA uninitialized).

The activations line comes from `helpers.saved_tensors`; the live readout while a Trainer runs is
`helpers.live`; going on after an out-of-memory error
is `helpers.oom`. Importing this module is cheap: torch, psutil and matplotlib load when used.

Longer than 400 lines because `measure`, `compare` and `plot` share the `Readout` they build and
are taught together in notebook 01; the probes behind them are apart, in `helpers._probes`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from helpers import _probes
from helpers._cpu_peak import track_allocations  # re-exported: notebook 01 compares two loops with it
from helpers._nvml import nvml_devices
from helpers._util import GIB, MIB
from helpers.saved_tensors import SavedTensors, track_saved_tensors

# the parts of the training bill that add up to `Readout.total` (the estimator's names)
COMPONENTS = ("weights", "gradients", "optimizer", "activations")

__all__ = [
    "COMPONENTS",
    "Figure",
    "GpuMemory",
    "Readout",
    "compare",
    "measure",
    "plot",
    "read_gpu_memory",
    "track_allocations",
]


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
        weights      bytes of `model`'s parameters, each storage once (a sharded one: this process's shard);
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
    nest: an inner `measure`, or a `helpers.live.LiveMemoryCallback` when training begins, resets the same
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
    probe = _probes.probe_for(readout.device)
    with track_saved_tensors(*([model] if model is not None else [])) as saved:
        probe.start()
        start = time.perf_counter()
        try:
            yield readout
        finally:
            probe.sync()
            readout.seconds = time.perf_counter() - start
            readout.saved = saved
            figures = _exact_figures(model, optimizer, saved) + [Figure(*f) for f in probe.stop()]
            readout.figures = {f.name: f for f in figures}


def _exact_figures(model, optimizer, saved: SavedTensors) -> list[Figure]:
    figures = []
    if model is not None:
        params = list(model.parameters())
        figures.append(
            Figure("weights", _storage_bytes(params), "sum of nbytes over model.parameters(), each storage once")
        )
        figures.append(
            Figure(
                "gradients",
                _storage_bytes(p.grad for p in params if p.grad is not None),
                "sum of nbytes over the parameters' .grad at exit",
            )
        )
    if optimizer is not None:
        figures.append(
            Figure(
                "optimizer",
                _storage_bytes(_state_tensors(optimizer)),
                "sum of nbytes over the tensors in optimizer.state at exit",
            )
        )
    excluded = "model's parameters excluded" if model is not None else "no model given, so saved weights count too"
    figures.append(
        Figure(
            "activations",
            saved.peak_bytes,
            f"saved-tensor hooks: peak bytes held for backward, each storage once, {excluded}",
        )
    )
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
    """Bytes of the distinct storages behind `tensors` (views and tied weights count once); of a sharded
    parameter (FSDP2's DTensor), its gradient or optimizer state, the shard this process holds."""
    seen, total = set(), 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this process's shard
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

    lines = [
        f"{'':<16}" + "".join(r.label.rjust(width) for r in readouts),
        f"{'':<16}" + "".join(f"({r.device})".rjust(width) for r in readouts),
    ]
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
        ax.scatter(
            [i for i, _ in peaks],
            [p for _, p in peaks],
            marker="_",
            s=900,
            color="black",
            zorder=3,
            label="peak allocated (torch.cuda)",
        )
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
# NVML: every card, without touching torch.cuda (opened as helpers.env opens it)


@dataclass(frozen=True)
class GpuMemory:
    """One card's memory as the driver reports it (every process on the card counts)."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int

    def __str__(self) -> str:
        return (
            f"gpu {self.index} {self.name}: {self.used_bytes / GIB:.2f} of {self.total_bytes / GIB:.2f} GiB "
            f"used ({self.used_bytes / self.total_bytes:.0%})"
        )


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
    with nvml_devices() as devices:
        if devices is None:
            return []
        cards = []
        for d in devices:
            info = d.memory()
            cards.append(GpuMemory(d.index, d.name, int(info.used), int(info.total)))
        return cards


def _unit(largest: int) -> tuple[str, int]:
    """The unit a table of byte counts reads best in: KiB below 1 MiB, GiB from 10 GiB, else MiB."""
    if largest < MIB:
        return "KiB", 1024
    return ("GiB", GIB) if largest >= 10 * GIB else ("MiB", MIB)
