"""The published runs scripts/bench_estimator.py holds the estimator against, read from data files.

One file a source, scripts/bench/cases/<source>.toml: its provenance (where the figures were
published, at which commit, on which card, what was measured) beside its rows, and each row's
notes as comments beside it. scripts/bench/README.md describes the keys; in short, a row's
settings are the file's `defaults`, then the `presets` the row names `with`, then its own, each
merged over the one before; a `harness` table among them becomes a helpers.estimate.Harness.

    load_source("litgpt-A100").cases[0].measured   # 21.3 (GB allocated: Llama-2-7B LoRA, micro-batch 1)
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from helpers.estimate import Harness, shape_of

FOLDER = Path(__file__).resolve().parent / "bench"
REQUIRED = {"name", "measured", "model", "unit", "quantity", "accelerate_dtype"}  # from the row, a preset or defaults
OPTIONAL = {"with", "shape", "settings", "note", "in_median", "run", "held_out", "stat"}


@dataclass
class Case:
    name: str
    source: str
    measured: float  # in `unit`
    unit: str  # "MiB" (NVML) or "GB" (1e9 bytes)
    quantity: str  # what the source measured: "total" (NVML), "allocated", "reserved", "peak_allocated"
    model: object  # a catalog name, a config dict or a helpers.estimate Shape
    settings: dict  # estimate_training_memory's keywords
    accelerate_dtype: str  # the row of `accelerate estimate-memory` for this run
    note: str = ""
    in_median: bool = True
    estimate: object = field(default=None, repr=False)
    run: dict = field(default_factory=dict)  # a whole run's data: batching, max_length, lengths (scripts/bench_runs.py)
    held_out: bool = False  # in the half no constant was fitted on (whole runs: scripts/bench_runs.py)


@dataclass
class Source:
    name: str
    provenance: str  # what scripts/bench_estimator.py prints under "sources:"
    cases: list[Case]  # the runs, in the file's order (a table's: every row once per measured quantity)
    oom: list[Case]  # runs published as out of memory: `measured` is the card's memory
    rows: list[dict]  # a table's rows as published, each a dict by column (empty without a table)


def merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`; a table in both is merged the same way (settings, shape, harness)."""
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = merge(base[key], value) if both else value
    return merged


def load_source(name: str) -> Source:
    """Read scripts/bench/cases/<name>.toml into its Cases."""
    path = FOLDER / "cases" / f"{name}.toml"
    with path.open("rb") as f:
        data = tomllib.load(f)
    table = data.get("table", {})
    rows = [dict(zip(table["columns"], values)) for values in table.get("rows", [])]
    # a table's row is a case once per measured column: every row's first quantity, then the next
    tabled = [
        {k: row[k] for k in ("name", "model", "with") if k in row}
        | dict(settings={k: row[k] for k in table["settings"]}, measured=row[quantity], quantity=quantity)
        for quantity in table.get("measured", [])
        for row in rows
    ]
    cases = [case_of(row, name, data) for row in data.get("case", []) + tabled]
    return Source(name, data["provenance"], cases, [case_of(row, name, data) for row in data.get("oom", [])], rows)


def case_of(row: dict, source: str, data: dict) -> Case:
    """One row of a case file as a Case: its defaults, its presets, then its own keys."""
    presets = [row["with"]] if isinstance(row.get("with"), str) else row.get("with", [])
    unknown = [p for p in presets if p not in data.get("presets", {})]
    for preset in reversed(presets):  # the row's own keys win, then the presets it names last
        row = merge(data["presets"].get(preset, {}), row)
    row = merge(data.get("defaults", {}), row)
    missing, extra = sorted(REQUIRED - set(row)), sorted(set(row) - REQUIRED - OPTIONAL)
    if unknown or missing or extra:
        raise ValueError(
            f"{source}.toml, case {row.get('name')!r}: unknown presets {unknown}, missing {missing}, unknown keys "
            f"{extra}; `with` names tables of [presets], a case needs {', '.join(sorted(REQUIRED))} and may "
            f"have {', '.join(sorted(OPTIONAL))} (scripts/bench/README.md)"
        )
    return Case(
        row["name"],
        source,
        row["measured"],
        row["unit"],
        row["quantity"],
        model_of(row["model"], row.get("shape"), data.get("models", {})),
        settings_of(row.get("settings", {})),
        row["accelerate_dtype"],
        row.get("note", ""),
        row.get("in_median", True),
        run=row.get("run", {}),
        held_out=row.get("held_out", False),
    )


def model_of(name: str, shape: dict | None, aliases: dict):
    """The model a row names: the file's alias for it, a config in scripts/bench/models.toml, or a catalog
    name; with `shape`, the estimator's Shape of it with those fields changed (litgpt's fused q/k/v)."""
    name = aliases.get(name, name)
    model = configs().get(name, name)
    return replace(shape_of(model), **shape) if shape else model


@functools.cache
def configs() -> dict:
    """scripts/bench/models.toml: the config.json of each model outside the catalog, by name."""
    with (FOLDER / "models.toml").open("rb") as f:
        return tomllib.load(f)


def settings_of(settings: dict) -> dict:
    """A row's settings as estimate_training_memory takes them: its `harness` facts as one Harness."""
    if "harness" not in settings:
        return dict(settings)
    return dict(settings, harness=Harness(**settings["harness"]))


def error(predicted: float, measured: float) -> float:
    """The signed relative error of a prediction: +0.05 is 5 % over the measured figure."""
    return (predicted - measured) / measured
