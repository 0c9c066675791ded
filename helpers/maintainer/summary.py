"""The report of `python -m helpers run`: a line per notebook as it ends, then summary.md and summary.json.

`format_line` is what the command prints for each notebook (status, seconds, its first figures);
`write_summary` writes `<out>/summary.json` (every `Outcome` as it is) and `<out>/summary.md` (a
table of figures, then each failure in a code block), whatever stopped the run.
`helpers.maintainer.times` reads summary.json back for each notebook's **Time:** line.

Every cell of the table goes through `md_cell` (the kit's one escaping of Markdown table cells): a
notebook named `a|b.ipynb`, a figure's key or value with a "|", a backtick or a newline stays in its
cell, and its row keeps four cells.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

from helpers.maintainer.execution import Outcome
from helpers.quickcheck.escaping import md_cell, md_text

__all__ = ["format_line", "write_summary"]


def format_line(o: Outcome, max_figures: int = 5) -> str:
    """One line per notebook: status, seconds and its first recorded figures."""
    figures = "  ".join(f"{k}={_short(v)}" for k, v in list(o.results.items())[:max_figures])
    return f"{o.status:6} {o.notebook:34} {o.seconds:6.1f} s  {figures}".rstrip()


def _short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 24 else text[:21] + "..."


def write_summary(outcomes: list[Outcome], out: Path, *, smoke: bool, simulate: str | None = None) -> Path:
    """Write summary.json and summary.md under `out`; return the markdown path."""
    (out / "summary.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    mode = (
        "smoke (embedded tiny model)." if smoke else "full (falls back to the embedded model without a GPU or the Hub)."
    )
    lines = ["# Notebook run summary", "", f"Mode: {mode}"]
    if simulate:
        lines += ["", f"**Simulated {simulate} on a CPU**: no figure below is a GPU measurement (`helpers.simulate`)."]
    lines += [
        "",
        "| notebook | status | seconds | figures |",
        "|---|---|---:|---|",
    ]
    for o in outcomes:
        figures = ", ".join(f"{md_cell(k, 100, code=True)} = {md_cell(_short(v))}" for k, v in o.results.items())
        lines.append(f"| {md_cell(o.notebook)} | {md_cell(o.status)} | {o.seconds:.1f} | {figures} |")
    failures = [o for o in outcomes if o.error]
    if failures:
        lines += ["", "## Failures", ""] + [_fenced(o.error) for o in failures]
    noted = [o for o in outcomes if o.notes]
    if noted:
        lines += ["", "## Notes", ""] + [f"- {md_text(o.notebook)}: {md_text(n, 600)}" for o in noted for n in o.notes]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fenced(text: str) -> str:
    """`text` as a Markdown code block whose fence is longer than any run of backticks in it, which cannot end it."""
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}"
