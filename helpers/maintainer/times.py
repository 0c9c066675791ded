"""How long each notebook takes on a CPU, over every machine measured: the **Time:** line of every first cell.

Used by `python -m helpers notebooks --times SUMMARY.json` (maintainers, after `python -m helpers
run`). A notebook's time on a CPU depends on the CPU more than on anything a student sets: one with
bf16 matrix units (AVX512-BF16, AMX) runs notebook 02's bf16 cells in a fraction of the time one
with AVX2 only needs. So every machine measured keeps its row in docs/notebook-times.csv (the
machine with its bf16 units, the day, the seconds of each notebook), the run's summary adds or
replaces this machine's row, and each **Time:** line gives the range over the rows, naming the
machines at both ends. The GPU half stays marked as an estimate until a run on that card replaces it.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from helpers.env import cpu_bf16_units
from helpers.maintainer.notebooks import SOURCES_DIR, sources

__all__ = [
    "TIMES_FILE",
    "TIME_LINE",
    "MachineTimes",
    "cpu_clause",
    "describe_cpu",
    "read_times",
    "stamp_sources",
    "stamp_times",
    "write_times",
]

# the first cell's line: "**Time:** <the GPU's clause>; <the CPU's clause>" ("# " before it in notebooks/src)
TIME_LINE = re.compile(r"^(?P<prefix>(?:# )?)\*\*Time:\*\* (?P<gpu>[^;\n]+); (?P<cpu>[^\n]+)$", re.M)
TIMES_FILE = SOURCES_DIR.parent.parent / "docs" / "notebook-times.csv"
_COLUMNS = ("machine", "bf16_units", "day", "note")  # then one column per notebook, its seconds ("" = not measured)
_NO_UNITS = "none"  # the bf16_units cell of a CPU without bf16 matrix instructions


@dataclass
class MachineTimes:
    """One row of docs/notebook-times.csv: a machine, the day it ran the notebooks, their seconds by stem."""

    machine: str  # as `describe_cpu` names it: "a 2-core AMD EPYC"
    bf16_units: tuple[str, ...]  # `helpers.env.cpu_bf16_units()` on it: () for none
    day: str  # ISO date of the run
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""  # how the figures were obtained, where that is not a plain run on an idle machine

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        """Two machines are one when the name and the bf16 units agree (the name alone may not say the model)."""
        return self.machine, self.bf16_units

    def describe(self) -> str:
        """ "a 2-core AMD EPYC with AVX512-BF16", "a 2-core AMD EPYC with no bf16 units"."""
        return f"{self.machine} with {' + '.join(self.bf16_units) or 'no bf16 units'}"


def describe_cpu(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """This machine as a Time line names it: "a 2-core Intel(R) Xeon(R) Processor"."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    names = [line.partition(":")[2].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return f"a {cores or os.cpu_count()}-core {names[0] if names else 'CPU'}"


def read_times(path: Path = TIMES_FILE) -> list[MachineTimes]:
    """The machines measured so far, one per row of `path` (none when it does not exist yet)."""
    if not Path(path).exists():
        return []
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            units = row["bf16_units"].split()
            rows.append(
                MachineTimes(
                    row["machine"],
                    () if units == [_NO_UNITS] else tuple(units),
                    row["day"],
                    {stem: float(s) for stem, s in row.items() if stem not in _COLUMNS and s},
                    row.get("note") or "",
                )
            )
    return rows


def write_times(rows: list[MachineTimes], path: Path = TIMES_FILE) -> None:
    """Write the rows back, one column per notebook any of them measured, in course order."""
    stems = sorted({stem for row in rows for stem in row.seconds})
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow([*_COLUMNS, *stems])
        for r in rows:
            cells = [f"{r.seconds[s]:.0f}" if s in r.seconds else "" for s in stems]
            out.writerow([r.machine, " ".join(r.bf16_units) or _NO_UNITS, r.day, r.note, *cells])


def cpu_clause(stem: str, rows: list[MachineTimes]) -> str | None:
    """The CPU half of `stem`'s Time line from every machine that measured it; None if none did.

    One machine: "14 s on a CPU (measured on a 2-core AMD EPYC with AVX512-BF16, 2026-12-03)."
    Several: the range, and the machine at each end with its figure and day.
    """
    measured = sorted((r for r in rows if stem in r.seconds), key=lambda r: r.seconds[stem])
    if not measured:
        return None
    fast, slow = measured[0], measured[-1]
    low, high = round(fast.seconds[stem]), round(slow.seconds[stem])
    if len(measured) == 1:
        return f"{low} s on a CPU (measured on {fast.describe()}, {fast.day})."
    span = f"{low}" if low == high else f"{low}-{high}"
    return (
        f"{span} s on a CPU (measured on {len(measured)} machines: {low} s on {fast.describe()}, {fast.day}; "
        f"{high} s on {slow.describe()}, {slow.day})."
    )


def _summary_seconds(summary: Path) -> dict[str, float]:
    """The seconds of each notebook that ran ok, from a runner summary that timed them as a student runs them."""
    runs = json.loads(Path(summary).read_text(encoding="utf-8"))
    fields = {"notebook", "status", "seconds"}
    if not isinstance(runs, list) or not all(isinstance(r, dict) and fields <= r.keys() for r in runs):
        raise ValueError(f"{summary} is not a summary.json that `python -m helpers run` wrote")
    mode = Path(summary).with_name("summary.md")
    if mode.exists() and re.search(r"Mode: smoke|\*\*Simulated", mode.read_text(encoding="utf-8")):
        raise ValueError(
            f"{summary} is from a smoke or simulated run: time the notebooks as a student runs them, "
            "`python -m helpers run --out DIR` on a CPU, and pass DIR/summary.json"
        )
    seconds = {r["notebook"]: r["seconds"] for r in runs if r["status"] == "ok"}
    if not seconds:
        raise ValueError(f"no notebook ran ok in {summary}: nothing to time; fix the failures it lists, then run again")
    return seconds


def stamp_times(
    summary: Path,
    folder: Path = SOURCES_DIR,
    machine: str | None = None,
    day: str | None = None,
    *,
    units: tuple[str, ...] | None = None,
    table: Path = TIMES_FILE,
) -> list[Path]:
    """Record a run's seconds as this machine's row of `table`, then rewrite every source's CPU clause
    from all the rows; return the files that changed.

    summary: the `summary.json` of `python -m helpers run` on a CPU, without --smoke (what a student
    without a GPU runs); only notebooks that ran ok count, and a smoke or simulated run is refused.
    machine, units, day: the machine it ran on, its bf16 units and the day (default: this one,
    `describe_cpu` and `helpers.env.cpu_bf16_units`, today). The row of the same machine and units
    is replaced for the notebooks this run timed and keeps the others (a run of one notebook leaves
    the rest as measured); any other machine's row is kept.
    """
    seconds = _summary_seconds(summary)
    units = cpu_bf16_units() if units is None else tuple(units)
    row = MachineTimes(machine or describe_cpu(), units, day or datetime.date.today().isoformat(), seconds)
    rows = read_times(table)
    earlier = next((r for r in rows if r.key == row.key), None)
    if earlier is None:
        rows.append(row)
    else:
        if set(earlier.seconds) <= set(seconds):  # every figure is this run's: the old note no longer applies
            earlier.note = ""
        earlier.seconds.update(seconds)
        earlier.day = row.day
    changed = stamp_sources(rows, folder)
    write_times(rows, table)
    return changed


def stamp_sources(rows: list[MachineTimes], folder: Path = SOURCES_DIR) -> list[Path]:
    """Rewrite the CPU clause of each source's **Time:** line from `rows` (`cpu_clause`); return what changed.

    A source no row has timed keeps its line."""
    changed = []
    for source in sources(folder):
        clause = cpu_clause(source.stem, rows)
        if clause is None:
            continue
        text = source.read_text(encoding="utf-8")
        found = TIME_LINE.search(text)
        if found is None:
            raise ValueError(f"{source} has no '# **Time:** <on a GPU>; <on a CPU>' line in its first cell")
        stamped = text[: found.start()] + f"{found['prefix']}**Time:** {found['gpu']}; {clause}" + text[found.end() :]
        if stamped != text:
            source.write_text(stamped, encoding="utf-8")
            changed.append(source)
    return changed
