"""The estimator against published GPU measurements: no GPU needed, it reads the published figures.

For each published run this prints the figure as published, what `helpers.estimate` predicts for
the same setup (in the quantity the source measured), and what accelerate's rule of thumb
(`accelerate estimate-memory`: "training using Adam" = 4 x the model's size in a dtype) would
say, each with its error. The runs are data: one file a source, scripts/bench/cases/<source>.toml,
its provenance beside its rows and the reasoning behind every setting as comments (read by
scripts/bench_cases.py; scripts/bench/README.md describes the keys). docs/estimator-accuracy.md
holds the table and the sources; keep the two in step.

Run from the repository root (pure Python, no torch, a few milliseconds):

    python scripts/bench_estimator.py              # the table
    python scripts/bench_estimator.py --markdown   # the same table for the doc
    python scripts/bench_estimator.py --cpu        # and the CPU grid against saved-tensor bytes (minutes;
                                                   # scripts/bench_cpu.py: torch, transformers, peft)
    python scripts/bench_estimator.py --allocator  # and a training step's peak on CPU, torch's allocator
                                                   # against the estimator (scripts/bench_cpu.py)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # helpers, scripts

import bench_cpu  # noqa: E402  (the CPU checks: torch imported only when they run)
from bench_cases import Case, error, load_source  # noqa: E402

from helpers._util import MIB  # noqa: E402
from helpers.estimate import estimate_training_memory, shape_of  # noqa: E402

GB = 10**9

# the case files, in the order "sources:" lists them (docs/estimator-accuracy.md's sections)
SOURCES = {
    name: load_source(name)
    for name in ("HF-V100", "litgpt-A100", "litgpt-hub", "torchtune", "fitcheck-T4", "vramcalc-A6000")
}
# the first table, in the order the doc's table keeps: the Trainer, litgpt's 2023 tables, torchtune, litgpt's hub
CASES = [case for name in ("HF-V100", "litgpt-A100", "torchtune", "litgpt-hub") for case in SOURCES[name].cases]
# the published runs of hand-written loops: every fitcheck row allocated, then reserved, then vramcalc's
LOOP_CASES = [case for name in ("fitcheck-T4", "vramcalc-A6000") for case in SOURCES[name].cases]
# the published out-of-memory runs (the estimate must exceed the card), the smallest model first
OOM_CASES = sorted(
    (case for source in SOURCES.values() for case in source.oom), key=lambda c: shape_of(c.model).parameters
)


def loop_summary(cases: list[Case], source: str = "fitcheck-T4") -> dict[str, dict[str, float]]:
    """Per quantity (and QLoRA's allocated apart): the median absolute error, the worst under-estimate,
    and how many cases the estimate is more than 10 % and 20 % below."""
    summary, cases = {}, [c for c in cases if c.source == source]
    for label, chosen in (
        ("allocated", [c for c in cases if c.quantity == "allocated"]),
        ("allocated, QLoRA", [c for c in cases if c.quantity == "allocated" and c.settings["method"] == "qlora"]),
        ("reserved", [c for c in cases if c.quantity == "reserved"]),
    ):
        errors = [error(ours(c), c.measured) for c in chosen]
        if not errors:
            continue
        summary[label] = dict(
            cases=len(errors),
            median=statistics.median(map(abs, errors)),
            worst_low=min(errors),
            over_10_low=sum(e < -0.10 for e in errors),
            over_20_low=sum(e < -0.20 for e in errors),
        )
    return summary


def accelerate_rule(model, dtype: str) -> int:
    """What `accelerate estimate-memory` reports as "Training using Adam", in bytes.

    accelerate builds the model with AutoModel (no LM or classification head) on the meta device,
    sums its parameters in fp32, scales to the dtype (float16 / 2, int8 / 4, int4 / 8) and
    multiplies by 4: weights, gradients and two Adam states, no activations. Source:
    huggingface/accelerate src/accelerate/commands/estimate.py, `gather_data`
    (`dtype_training_size = dtype_total_size * 4`). Buffers (a few KB here) are left out.
    """
    shape = shape_of(model)
    counts = shape.parameter_counts()
    base = shape.parameters - counts["head"]
    if shape.head == "classifier":  # BertModel keeps its pooler and loses only the classifier
        base += shape.hidden * shape.hidden if shape.family == "bert" else 0
        base -= shape.num_labels if shape.family == "bert" else 0  # the classifier's bias
    per_param = {"float32": 4, "float16": 2, "int8": 1, "int4": 0.5}[dtype]
    return int(4 * base * per_param)


def evaluate(cases=None) -> list[Case]:
    """Estimate every case; each Case gets its Estimate."""
    cases = CASES if cases is None else cases
    for case in cases:
        case.estimate = estimate_training_memory(case.model, **case.settings)
    return cases


def ours(case: Case) -> float:
    """The estimate in the quantity and unit the source measured."""
    if case.quantity == "peak_allocated":  # the whole run: the step or the loading, whichever is higher
        value = max(case.estimate.allocated, case.estimate.load_peak)
    else:
        value = getattr(case.estimate, case.quantity)
    return value / (MIB if case.unit == "MiB" else GB)


def accelerate(case: Case) -> float:
    return accelerate_rule(case.model, case.accelerate_dtype) / (MIB if case.unit == "MiB" else GB)


def medians(cases: list[Case]) -> tuple[float, float]:
    """Median absolute error of ours and of accelerate's rule over the cases in the median."""
    used = [c for c in cases if c.in_median]
    return (
        statistics.median(abs(error(ours(c), c.measured)) for c in used),
        statistics.median(abs(error(accelerate(c), c.measured)) for c in used),
    )


def by_method(cases: list[Case]) -> dict[str, tuple[float, float, int]]:
    """Per method: median absolute error, the worst signed error, and the count, over the cases in the median."""
    found = {}
    for method in ("full", "lora", "qlora"):
        errors = [
            error(ours(c), c.measured) for c in cases if c.in_median and c.settings.get("method", "full") == method
        ]
        if errors:
            found[method] = (statistics.median(map(abs, errors)), max(errors, key=abs), len(errors))
    return found


def _fmt(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if unit == "MiB" else f"{value:.2f} {unit}"


def table(cases: list[Case], markdown: bool = False) -> str:
    head = ["case", "source", "measured", "ours", "error", "accelerate's rule", "its error"]
    rows = []
    for c in cases:
        o, a = ours(c), accelerate(c)
        rows.append(
            [
                c.name + (" *" if c.note else ""),
                f"{c.source} ({c.quantity})",
                _fmt(c.measured, c.unit),
                _fmt(o, c.unit),
                f"{100 * error(o, c.measured):+.1f}%",
                _fmt(a, c.unit),
                f"{100 * error(a, c.measured):+.1f}%",
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---"] + ["---:"] * (len(head) - 2)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (for the doc)")
    parser.add_argument("--cpu", action="store_true", help="also the CPU grid against saved-tensor bytes (minutes)")
    parser.add_argument(
        "--allocator", action="store_true", help="also the step peak against torch's CPU allocator (half a minute)"
    )
    args = parser.parse_args(argv)
    cases = evaluate()
    print(table(cases, markdown=args.markdown))
    ours_median, accelerate_median = medians(cases)
    print(
        f"\nmedian absolute error over {sum(c.in_median for c in cases)} cases: "
        f"ours {100 * ours_median:.1f}%, accelerate's rule {100 * accelerate_median:.1f}%"
    )
    for method, (median, worst, n) in by_method(cases).items():
        print(f"  {method:5} {n:2} cases: median {100 * median:.1f}%, worst {100 * worst:+.1f}%")
    for c in cases:
        if c.note:
            print(f"* {c.name}: {c.note}")
    print("\npublished hand-written loops (fitcheck: Tesla T4, allocated and reserved; vramcalc: RTX A6000):")
    loops = evaluate(LOOP_CASES)
    print(table(loops, markdown=args.markdown))
    summaries = {
        (source, label): row
        for source in ("fitcheck-T4", "vramcalc-A6000")
        for label, row in loop_summary(loops, source).items()
    }
    for (source, label), row in summaries.items():
        print(f"  {source:15}", end="")
        print(
            f"  {label:17} {row['cases']:2} cases: median {100 * row['median']:.1f}%, "
            f"worst {100 * row['worst_low']:+.1f}%, {row['over_10_low']} more than 10 % low, "
            f"{row['over_20_low']} more than 20 % low"
        )
    for c in evaluate(OOM_CASES):
        verdict = "predicts the OOM" if ours(c) > c.measured else "MISSES the OOM"
        print(f"{c.name}: ours {_fmt(ours(c), c.unit)} allocated > {_fmt(c.measured, c.unit)} card: {verdict}")
    print("\nsources:")
    for name, source in SOURCES.items():
        print(f"  {name}: {source.provenance}")
    if args.cpu:
        bench_cpu.print_grid(bench_cpu.cpu_grid())
    if args.allocator:
        bench_cpu.print_allocator(bench_cpu.allocator_grid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
