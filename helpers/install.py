"""After the install cell's pip: keep the runtime's other libraries working, and say what changed.

Run by the install cell of every notebook (`helpers.maintainer.notebooks.INSTALL_TEMPLATE`) right
after pip installed the kit; not taught in a notebook. Colab and Kaggle ship hundreds of libraries,
and pip checks only what it installs: the kit's pins bring huggingface-hub 2.x, which Colab's
gradio and diffusers refuse (`huggingface-hub<2.0`), and pip says so in a warning nobody reads.
`keep_runtime_working` finds every requirement of a library pip did not touch that the install
broke, asks pip once more for versions that satisfy both (hub 1.x also serves the kit), and prints
what changed and what, if anything, stays broken, with the command that restores it.

Some libraries refuse another one at run time rather than in their metadata, which pip cannot
see: peft 0.21 raises ImportError in `get_peft_model` wherever a torchao older than 0.16 is
installed, and both runtimes ship 0.10.0. `RUN_TIME_FLOORS` lists them; an installed one below
its floor is upgraded to that floor in the same pip call. One that pip cannot raise (a constraint, a
runtime's cap) stops the cell with the cause and the command to run: "Installed." would be false, and
the notebook would stop later on the library's ImportError.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import subprocess
from dataclasses import dataclass, field

from helpers._requirements import canonical_name

__all__ = ["RUN_TIME_FLOORS", "Broken", "Report", "broken_requirements", "keep_runtime_working", "versions"]

# name -> (oldest version the kit's libraries accept where it is installed, who refuses older ones);
# tests/test_install.py checks the floor against the pinned library's own check
RUN_TIME_FLOORS = {"torchao": ("0.16.0", "peft")}


@dataclass(frozen=True)
class Broken:
    """One requirement of an untouched library that the current versions do not meet."""

    dependent: str  # "gradio 6.24.0"
    requirement: str  # "huggingface-hub<2.0,>=0.33.5"
    found: str | None  # the version installed now ("2.4.0"), None where it is gone

    def __str__(self) -> str:
        return f"{self.dependent} needs {self.requirement} (now {self.found or 'not installed'})"


@dataclass
class Report:
    """What the install changed in the runtime: versions before -> after, what was mended, what stays broken."""

    changed: list[str] = field(default_factory=list)  # "huggingface-hub 1.27.0 -> 1.44.0"
    mended: list[Broken] = field(default_factory=list)
    broken: list[Broken] = field(default_factory=list)
    pip_error: str = ""  # the end of pip's output where the mending call failed


def versions() -> dict[str, str]:
    """{canonical name: version} of every installed distribution (the first one found, as imports do)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical_name(name), dist.version)
    return found


def broken_requirements(before: dict[str, str]) -> list[Broken]:
    """Requirements that libraries the install left alone had met in `before` and no longer meet.

    A library the install upgraded is pip's to satisfy, and one already broken before is not the
    install's doing: neither is listed.
    """
    before, now = {canonical_name(name): version for name, version in before.items()}, versions()
    changed = {name for name, old in before.items() if now.get(name) != old}
    if not changed:  # nothing to read (and packaging may not be importable where pip installed nothing)
        return []
    try:
        from packaging.requirements import InvalidRequirement, Requirement  # transformers needs it: installed
    except ImportError:  # a bare venv (the install cell's tests): pip's own copy
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

    found, seen = [], set()
    for dist in metadata.distributions():
        name = canonical_name(dist.metadata["Name"] or "")
        if not name or name in seen or before.get(name) != dist.version:
            continue
        seen.add(name)
        for text in dist.requires or []:
            if canonical_name(re.match(r"[A-Za-z0-9._-]*", text).group(0)) not in changed:
                continue  # a requirement on something the install left alone still holds
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            old, new = before[canonical_name(req.name)], now.get(canonical_name(req.name))
            if req.specifier.contains(old, prereleases=True) and not (
                new is not None and req.specifier.contains(new, prereleases=True)
            ):
                found.append(Broken(f"{dist.metadata['Name']} {dist.version}", f"{req.name}{req.specifier}", new))
    return found


def _below_floor(now: dict[str, str]) -> list[str]:
    present = [name for name in RUN_TIME_FLOORS if name in now]
    if not present:
        return []
    try:
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.version import Version

    return [name for name in present if Version(now[name]) < Version(RUN_TIME_FLOORS[name][0])]


def keep_runtime_working(before: dict[str, str], pip: list[str], *, kit: str = "compute-realities-kit") -> Report:
    """Mend what the kit's install broke in the runtime's other libraries; print what changed.

    Args:
        before: `versions()` taken before pip installed the kit.
        pip: the cell's pip command up to its requirements (`[python, "-m", "pip", "install", "-c", pins, ...]`).
        kit: the kit's distribution name, named again so pip keeps the kit's own needs in view.

    Returns:
        the `Report`, also printed: a line of what changed, then what stays broken and how to restore it.
    """
    report, before = Report(), {canonical_name(name): version for name, version in before.items()}
    low = _below_floor(versions())
    if low:  # a call of its own, so a cap pip cannot meet below does not keep these back
        _pip(report, pip, [kit] + [f"{name}=={RUN_TIME_FLOORS[name][0]}" for name in low])
        _floors_met(report, low)
    broken = broken_requirements(before)
    if broken:
        # the dependents at their own versions and their broken requirements, beside the kit: pip
        # then finds versions that serve all of them (huggingface-hub 1.x serves gradio and the kit)
        dependents = sorted({b.dependent.replace(" ", "==") for b in broken})
        _pip(report, pip, [kit, *dependents, *(b.requirement for b in broken)])
        still = set(broken_requirements(before))
        report.mended = [b for b in broken if b not in still]
        report.broken = sorted(still, key=str)
    now = versions()
    report.changed = [
        f"{name} {old} -> {now.get(name, 'removed')}" for name, old in before.items() if now.get(name) != old
    ]
    _say(report)
    return report


def _floors_met(report: Report, low: list[str]) -> None:
    """RuntimeError naming each library still below its run-time floor, who refuses it, and the command."""
    now = versions()
    still = [name for name in _below_floor(now) if name in low]
    if still:
        said = "; ".join(
            f"{name} {now[name]} is below {RUN_TIME_FLOORS[name][0]}, which {RUN_TIME_FLOORS[name][1]} refuses at "
            "run time (ImportError)"
            for name in still
        )
        command = " ".join(f"{name}=={RUN_TIME_FLOORS[name][0]}" for name in still)
        raise RuntimeError(
            f"The kit is installed, but pip could not upgrade what it needs at run time: {said}. Run "
            f"`!pip install {command}` in a new cell, then this cell again. pip said:\n{report.pip_error[-1500:]}"
        )


def _pip(report: Report, pip: list[str], targets: list[str]) -> None:
    done = subprocess.run([*pip, *targets], capture_output=True, text=True)
    if done.returncode != 0:
        report.pip_error += (done.stdout + done.stderr)[-2000:]


def _say(report: Report) -> None:
    if report.changed:
        print(f"pip changed {len(report.changed)} of this runtime's libraries: {', '.join(report.changed)}")
    if report.mended:
        print("Kept working (pip chose versions that serve them too):", ", ".join(b.dependent for b in report.mended))
    if report.broken:
        print("Still broken by the kit's pins (the course does not use them):", *map(str, report.broken), sep="\n  ")
        restore = " ".join(sorted({b.dependent.replace(" ", "==") for b in report.broken}))
        print(f"After the course, `pip install {restore}` restores them (and replaces the kit's libraries).")
    if report.pip_error:
        print("pip could not serve both; what it said:", report.pip_error, sep="\n")
