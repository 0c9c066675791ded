"""The report of `python -m helpers gpu-proof`: DIR/gpu-proof.json and the markdown a reviewer reads.

Both files are rewritten before each section starts (that section marked "in progress", so a run
killed mid-section says where it died) and after it ends. The header names the card, CUDA, Python,
the pinned versions and the kit's commit (`kit_commit`: git's HEAD of the kit's checkout, else
$KIT_COMMIT, else "unknown"; `dirty` when tracked files differ from it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

__all__ = ["IN_PROGRESS", "kit_commit", "markdown", "write"]

IN_PROGRESS = "in progress"  # a section's status while it runs
HIDDEN = ("rows", "status", "seconds", "started", "error", "traceback")  # shown otherwise, or not at all


def kit_commit(root: Path | None = None) -> dict:
    """{"commit": SHA, "dirty": bool} for the git checkout at `root` (the kit's, by default).

    Where `root` is not the top of a git checkout (a copy, an installed package), the commit is
    $KIT_COMMIT if set, else "unknown", and `dirty` is None: nobody can tell. Never raises.
    """
    from helpers.maintainer.notebooks import REPO_ROOT

    root = Path(root or REPO_ROOT).resolve()
    found = (_git(root, "rev-parse", "--show-toplevel", "HEAD") or "").splitlines()
    if len(found) == 2 and Path(found[0]).resolve() == root:  # not a checkout that merely holds the kit
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
        return {"commit": found[1], "dirty": None if status is None else bool(status.strip())}
    return {"commit": os.environ.get("KIT_COMMIT", "").strip() or "unknown", "dirty": None}


def _git(root: Path, *args: str) -> str | None:
    """git's output in `root`, or None when git is missing, fails or hangs (the report goes on without it)."""
    # --no-optional-locks: `status` must not take the index lock someone editing the checkout may need
    command = ["git", "--no-optional-locks", "-C", str(root), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def write(out: Path, report: dict) -> None:
    """Write DIR/gpu-proof.json and DIR/gpu-proof.md from `report` as it stands."""
    (out / "gpu-proof.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "gpu-proof.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The report as markdown: the machine, then each section's heading, table and figures."""
    lines = _header(report["machine"])
    for name, section in report["sections"].items():
        lines += _section(name, section)
    return "\n".join(lines) + "\n"


def _header(m: dict) -> list[str]:
    dirty = " (with uncommitted changes)" if m.get("dirty") else ""
    return [
        "# GPU proof",
        "",
        f"Card: {m['card']} ({m['total_gib']} GiB, compute capability {m['capability']}), CUDA {m['cuda']}, "
        f"Python {m['python']}; {m['date']}. Kit commit {m.get('commit', 'unknown')}{dirty}. "
        "Written by `python -m helpers gpu-proof`.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
    ]


def _section(name: str, section: dict) -> list[str]:
    """`## name (status, seconds)`, the error, the rows as a table, the other figures as a list."""
    seconds = f", {section['seconds']} s" if "seconds" in section else ""
    lines = ["", f"## {name} ({section['status']}{seconds})", ""]
    if section["status"] == IN_PROGRESS:
        lines.append(f"Started {section.get('started', '?')}; a report that ends here was cut short in this section.")
    if section["status"] != "ok" and "error" in section:
        lines.append(f"Failed: `{section['error']}`")
    rows = section.get("rows")
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r if k != "error"))
        keys += ["error"] if any(r.get("error") for r in rows) else []
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    lines += [f"- {k}: {v}" for k, v in section.items() if k not in HIDDEN]
    return lines
