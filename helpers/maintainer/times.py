"""How long each notebook takes, as the runner measured it: the **Time:** line of every first cell.

Used by `python -m helpers notebooks --times SUMMARY.json` (maintainers, after `python -m helpers
run`), which rewrites the CPU half of each notebook's **Time:** line in notebooks/src from the
runner's summary, with the machine and the day, then rebuilds the notebooks. A student reads how
long the notebook took on a named machine, not a guess; the GPU half stays marked as an estimate
until a run on that card replaces it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from pathlib import Path

from helpers.maintainer.notebooks import SOURCES_DIR, sources

__all__ = ["TIME_LINE", "describe_cpu", "stamp_times"]

# the first cell's line: "**Time:** <the GPU's clause>; <the CPU's clause>" ("# " before it in notebooks/src)
TIME_LINE = re.compile(r"^(?P<prefix>(?:# )?)\*\*Time:\*\* (?P<gpu>[^;\n]+); (?P<cpu>[^\n]+)$", re.M)


def describe_cpu(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """This machine as a Time line names it: "a 2-core Intel(R) Xeon(R) Processor"."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    names = [line.partition(":")[2].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return f"a {cores or os.cpu_count()}-core {names[0] if names else 'CPU'}"


def stamp_times(
    summary: Path, folder: Path = SOURCES_DIR, machine: str | None = None, day: str | None = None
) -> list[Path]:
    """Rewrite the CPU clause of each source's **Time:** line from a runner summary; return what changed.

    summary: the `summary.json` of `python -m helpers run` on a CPU, without --smoke (what a student
    without a GPU runs). machine: the machine it ran on (default: this one, `describe_cpu`). Only
    notebooks that ran ok are stamped; a summary from a smoke or a simulated run is refused.
    """
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
    machine, day = machine or describe_cpu(), day or datetime.date.today().isoformat()
    changed = []
    for source in sources(folder):
        if source.stem not in seconds:
            continue
        text = source.read_text(encoding="utf-8")
        clause = f"{seconds[source.stem]:.0f} s on a CPU (measured on {machine}, {day})."
        found = TIME_LINE.search(text)
        if found is None:
            raise ValueError(f"{source} has no '# **Time:** <on a GPU>; <on a CPU>' line in its first cell")
        stamped = text[: found.start()] + f"{found['prefix']}**Time:** {found['gpu']}; {clause}" + text[found.end() :]
        if stamped != text:
            source.write_text(stamped, encoding="utf-8")
            changed.append(source)
    return changed
