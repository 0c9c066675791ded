"""The whole-run model against published whole runs: a run's peak over variable-length batches.

`helpers.estimate.estimate_run_memory` (notebook 03) replays a run's batches through the caching
allocator's rules. This holds it against runs published with their peak over the whole run
(scripts/bench/cases/peft-MetaMathQA.toml, torchtune-alpaca.toml: provenance and every setting's
reasoning are in the files), beside what one step at the longest length predicts (the estimate a
plan for a fixed-length step gives). Each row is in the fitted half or the held-out half, split in
the case files before any estimate was looked at; no constant of the estimator is fitted on
either half (the whole-run model adds none), and the two are reported apart.

What is assumed, because no source publishes it: the examples' length distribution. Where a source
gives the mean and the longest (PEFT: its published token total over its sample count, and the
truncation), the lengths are drawn from a log-normal of that mean, spread ASSUMED_SPREAD, cut at
the longest. Where it gives only the longest, the row is predicted as its longest batch alone and
says so. Runs are replayed for at most MOST_REPLAYED steps (a p99 is then over those steps).

    python scripts/bench_runs.py             # the table and both halves' medians and worst cases
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # helpers, scripts

from bench_cases import Case, error, load_source  # noqa: E402

from helpers.estimate import estimate_run_memory, estimate_training_memory  # noqa: E402

SOURCES = ("peft-MetaMathQA", "torchtune-alpaca")
UNITS = {"B": 1, "GB": 10**9, "GiB": 2**30, "MiB": 2**20}
ASSUMED_SPREAD = 0.5  # the log-normal's sigma: an assumption, not a published figure (module docstring)
MOST_REPLAYED = 500  # steps a run is replayed for: ~4 ms a step for a 3B in pure Python
SEED = 0


def lengths_of(run: dict) -> tuple[list[int] | None, str]:
    """The examples' lengths in the run's order, and how they were made; None when no distribution is known."""
    known, longest = run.get("lengths", {}), run["max_length"]
    if "mean" not in known:
        return None, "no lengths published: its longest batch alone"
    sigma = ASSUMED_SPREAD
    median = known["mean"] / math.exp(sigma**2 / 2)  # a log-normal's mean is its median times exp(sigma^2 / 2)
    draw = random.Random(SEED)
    count = min(run.get("samples", 20_000), MOST_REPLAYED * 8)
    lengths = [max(1, min(longest, round(draw.lognormvariate(math.log(median), sigma)))) for _ in range(count)]
    if run.get("bucket"):  # length-sorted buckets, longest first, in the data's order (PEFT's BucketIterator)
        size = run["bucket"]
        lengths = [n for i in range(0, count, size) for n in sorted(lengths[i : i + size], reverse=True)]
    return lengths, f"log-normal, mean {known['mean']:g}, sigma {sigma} (assumed), cut at {longest}"


def predict(case: Case) -> tuple[float, float, str]:
    """(the whole-run prediction, one step at the longest length's, how the lengths were made) in bytes."""
    run, settings = case.run, dict(case.settings)
    settings["seq_len"] = run["max_length"]
    one = estimate_training_memory(case.model, **settings)
    one_step = one.allocated if case.quantity == "run_allocated" else one.reserved
    if run["batching"] == "packed":
        return one_step, one_step, "packed: every batch at max_length"
    lengths, how = lengths_of(run)
    if lengths is None:
        return one_step, one_step, how
    whole = estimate_run_memory(
        case.model, lengths=lengths, batching=run["batching"], shuffle=not run.get("bucket"),
        steps=min(MOST_REPLAYED, -(-len(lengths) // settings.get("per_device_batch", 1))),
        expandable_segments=False, empty_cache_every=run.get("empty_cache_every"), seed=SEED, **settings,
    )  # fmt: skip
    if case.quantity == "run_allocated":
        return max(whole.allocated), one_step, how
    if case.quantity == "run_reserved_p99":
        after = sorted(whole.after)
        return after[min(len(after) - 1, math.ceil(0.99 * len(after)) - 1)], one_step, how
    return whole.peak_reserved, one_step, how


def evaluate() -> list[dict]:
    rows = []
    for source in SOURCES:
        for case in load_source(source).cases:
            measured = case.measured * UNITS[case.unit]
            whole, one, how = predict(case)
            rows.append(
                dict(
                    source=source, name=case.name, held_out=case.held_out, quantity=case.quantity, measured=measured,
                    whole=whole, one=one, how=how, note=case.note or ("no lengths published" if "alone" in how else ""),
                    in_median=case.in_median and not case.note and "alone" not in how,
                )
            )  # fmt: skip
    return rows


def summary(rows: list[dict], key: str) -> str:
    errors = [error(r[key], r["measured"]) for r in rows]
    if not errors:
        return "no rows"
    worst = min(errors)  # the lowest: an under-prediction says "fits" for a run that did not
    return (
        f"median |error| {statistics.median(abs(e) for e in errors):.1%}, lowest {worst:+.1%}, "
        f"highest {max(errors):+.1%} ({len(errors)} rows)"
    )


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    rows = evaluate()
    print(f"{'source':18} {'run':40} {'half':9} {'quantity':17} {'measured':>9} {'whole run':>17} {'one step':>17}")
    for r in rows:
        half = "held-out" if r["held_out"] else "fitted"
        cells = [f"{r[k] / 2**30:6.2f} ({error(r[k], r['measured']):+6.1%})" for k in ("whole", "one")]
        print(
            f"{r['source']:18} {r['name'][:40]:40} {half:9} {r['quantity']:17} {r['measured'] / 2**30:7.2f}G "
            f"{cells[0]:>17} {cells[1]:>17}" + ("" if r["in_median"] else f"  [{r['note'] or 'out of the median'}]")
        )
    print("\nGiB; errors signed (+ over the published figure). Lengths: " + "; ".join(sorted({r["how"] for r in rows})))
    print("\nwhat the run's history adds: the same PEFT job's p99, the cache emptied every 10 steps (2026) against")
    print("every step (2025; other torch and transformers releases too), measured and modelled, GiB:")
    p99 = {r["name"]: r for r in rows if r["quantity"] == "run_reserved_p99"}
    for name, late in p99.items():
        early = p99.get(name.replace("2026", "2025"))
        if name.startswith("2026") and early:
            measured = (late["measured"] - early["measured"]) / 2**30
            modelled = (late["whole"] - early["whole"]) / 2**30
            print(f"  {name[5:-4]:24} measured {measured:+5.2f}, modelled {modelled:+5.2f}")
    for half, held in (("fitted half", False), ("held-out half", True)):
        kept = [r for r in rows if r["held_out"] is held and r["in_median"]]
        print(f"\n{half}, rows without notes:")
        print(f"  whole run:             {summary(kept, 'whole')}")
        print(f"  one step at the longest: {summary(kept, 'one')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
