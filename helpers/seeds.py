"""Seeds: repeat a run exactly, and see how much a result moves from one seed to the next.

Taught in notebook 06 (experiment tracking); every notebook that trains calls `seed_everything`.
`run_seeds` trains once per seed and reports the spread, `plot_seeds` draws it: a difference
between two settings smaller than a few standard deviations across seeds is not a difference.

Importing this module is cheap: numpy, torch and matplotlib load when a function needs them.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass

__all__ = ["SeedRuns", "plot_seeds", "run_seeds", "seed_everything"]


def seed_everything(seed: int, *, deterministic: bool = False) -> int:
    """Seed Python, NumPy and torch (CPU and every GPU) so a run can be repeated.

    The seeding is transformers' own `set_seed`, the one the Trainer calls with
    TrainingArguments(seed=...) when it starts: pass it the same number. With
    `deterministic=True` it is `enable_full_determinism` instead, which also makes torch use
    deterministic kernels (slower on a GPU; an operation without one raises), what a notebook
    asks for when it compares runs bit for bit. Also sets PYTHONHASHSEED for worker processes
    started later. Taught in notebook 06.

    Returns:
        the seed, so a notebook can record it.

    Example:
        >>> seed_everything(42)  # doctest: +SKIP
        42
    """
    from transformers import enable_full_determinism, set_seed

    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}; pass a whole number such as seed=42")
    if deterministic:
        enable_full_determinism(seed)
    else:
        set_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for worker processes started after this
    return seed


@dataclass
class SeedRuns:
    """One value per seed (a final loss, say) and their spread."""

    seeds: list[int]
    values: list[float]
    seconds: list[float]  # wall time of each run
    metric: str = "value"

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        """Sample standard deviation (n - 1); 0.0 for a single run."""
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    def __str__(self) -> str:
        rows = [
            f"seed {s:>6}: {self.metric} {v:.6f}  ({t:.1f} s)" for s, v, t in zip(self.seeds, self.values, self.seconds)
        ]
        rows.append(
            f"{len(self.values)} seeds: {self.metric} {self.mean:.6f} +- {self.std:.6f} (mean +- std), "
            f"range {min(self.values):.6f} .. {max(self.values):.6f}"
        )
        return "\n".join(rows)


def run_seeds(train_fn, seeds=(0, 1, 2), *, key: str | None = None, metric: str | None = None) -> SeedRuns:
    """Train once per seed and report the spread: how much of a difference is noise.

    Before each run, `seed_everything(seed)` seeds Python, NumPy and torch; `train_fn(seed)`
    should also pass the seed to TrainingArguments(seed=seed) and return one number (a final
    loss, an eval metric). A difference between two settings smaller than a few standard
    deviations across seeds is not a difference. Taught in notebook 06.

    Args:
        train_fn: called as `train_fn(seed)`; returns a number, or a dict of numbers (then `key`).
        seeds: the seeds to run, in order.
        key: which entry of a returned dict to use, e.g. "eval_loss" from `trainer.evaluate()`.
        metric: the name to print; default `key`, else "value".

    Returns:
        a `SeedRuns` with `.values` (per seed), `.mean`, `.std`; print it for a table.

    Example:
        >>> def train(seed):  # doctest: +SKIP
        ...     args = TrainingArguments("out", seed=seed, max_steps=50, report_to="none")
        ...     return Trainer(model_fn(), args, train_dataset=train_ds).train().training_loss
        >>> runs = run_seeds(train, seeds=[0, 1, 2])  # doctest: +SKIP
        >>> print(runs)  # doctest: +SKIP
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; pass at least two to see a spread, e.g. run_seeds(train, seeds=[0, 1, 2])")
    if not callable(train_fn):
        raise TypeError(f"train_fn must be a function of the seed, got {type(train_fn).__name__}")
    values, seconds = [], []
    for seed in seeds:
        seed_everything(seed)
        start = time.perf_counter()
        result = train_fn(seed)
        seconds.append(time.perf_counter() - start)
        values.append(_as_number(result, key, seed))
        print(f"seed {seed}: {metric or key or 'value'} {values[-1]:.6f} ({seconds[-1]:.1f} s)")
    return SeedRuns(seeds, values, seconds, metric or key or "value")


def _as_number(result, key: str | None, seed: int) -> float:
    if isinstance(result, dict):
        if key is None or key not in result:
            names = sorted(map(str, result))
            example = next((k for k in names if "loss" in k), names[0] if names else "eval_loss")
            raise ValueError(
                f"train_fn(seed={seed}) returned a dict with keys {names}; "
                f"pass key=... to pick one, e.g. run_seeds(train, seeds, key={example!r})"
            )
        result = result[key]
    elif key is not None:
        raise ValueError(
            f"key={key!r} was given but train_fn(seed={seed}) returned {type(result).__name__}, not a dict"
        )
    if hasattr(result, "item") and getattr(result, "ndim", 0) == 0:
        result = result.item()  # a 0-d tensor or numpy scalar
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        hint = " (e.g. `return trainer.train().training_loss`)" if type(result).__name__ == "TrainOutput" else ""
        raise TypeError(
            f"train_fn(seed={seed}) must return a number or a dict of numbers, got {type(result).__name__}{hint}"
        )
    value = float(result)
    if not math.isfinite(value):
        print(f"warning: seed {seed} gave {value}: that run diverged; the mean and std include it")
    return value


def plot_seeds(runs: SeedRuns, ax=None):
    """Draw each seed's value with the mean and a +-1 std band; returns the matplotlib Axes.

    Works with any backend (Agg included): it never calls `plt.show()`; in a notebook the figure
    shows when the cell ends. Taught in notebook 06.

    Example:
        >>> plot_seeds(run_seeds(train, seeds=[0, 1, 2]))  # doctest: +SKIP
    """
    if not isinstance(runs, SeedRuns):
        raise TypeError(f"plot_seeds needs the SeedRuns that run_seeds returns, got {type(runs).__name__}")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(5, 3))
    positions = list(range(len(runs.values)))
    ax.axhspan(runs.mean - runs.std, runs.mean + runs.std, color="tab:blue", alpha=0.15, label="mean +- 1 std")
    ax.axhline(runs.mean, color="tab:blue", lw=1)
    ax.plot(positions, runs.values, "o", color="tab:orange", label="one run per seed")
    ax.set_xticks(positions, [str(s) for s in runs.seeds])
    ax.set_xlabel("seed")
    ax.set_ylabel(runs.metric)
    ax.set_title(f"{runs.metric}: {runs.mean:.4f} +- {runs.std:.4f} over {len(runs.values)} seeds")
    ax.legend(loc="best", fontsize="small")
    return ax
