"""The estimator against the real model's allocations at 7B-8B sizes, on fake tensors: no GPU, no memory used.

For each catalog model, run and checkpointing setting, helpers/maintainer/fake_trace.py trains the
real transformers model (peft's LoRA, torch's fused AdamW, transformers' checkpointing) for two
steps on fake tensors and records every allocation and free; this prints its peak beside the
estimator's `allocated` for the same job (device="cpu": the CPU's SDPA kernel), the error, and what
torch.cuda's caching allocator would reserve replayed on the same trace (helpers/_caching_allocator.py),
default and with expandable segments. tests/test_fake_trace.py asserts a subset;
docs/estimator-accuracy.md ("A full-size cross-check without a GPU") holds the table.

Run from the repository root (torch, transformers, peft; about 2 minutes on 2 cores):

    python scripts/bench_fake.py                    # the table: 4 models x 3 runs x checkpointing off and on
    python scripts/bench_fake.py --markdown         # the same table for the doc
    python scripts/bench_fake.py --layers 2         # 2 decoder layers at full width and vocabulary (20 s)
    python scripts/bench_fake.py --models Mistral-7B --seq-len 2048
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # helpers, scripts

from _args import whole_number  # noqa: E402

from helpers._util import GIB  # noqa: E402
from helpers.estimate import estimate_training_memory  # noqa: E402

# the catalog's 7B-8B models: heads (Llama-2-7B: 32 key/value heads; the others 8 or 4), vocabularies
# (32,000 to 152,064) and Qwen's q/k/v biases
MODELS = ("Llama-2-7B", "Mistral-7B", "Llama-3.1-8B", "Qwen2.5-7B")
# run label -> the job's settings beside the model and checkpointing: full fine-tuning with every weight in
# bf16 (no fp32 master copy), the Trainer's bf16=True on fp32 weights (autocast), and LoRA (r 16 on every
# linear, fp32 adapters) on a bf16 base; fused AdamW (TrainingArguments' default optim) throughout
RUNS = {
    "full, pure bf16": dict(method="full", precision="bf16-true"),
    "full, bf16 autocast": dict(method="full", precision="bf16", weights="fp32"),
    "LoRA r16, bf16 base": dict(method="lora", precision="bf16", weights="bf16", lora_r=16),
}
OPTIMIZER = "adamw_torch_fused"
SEQ_LEN = 1024  # one sequence of 1,024 tokens a step
STEPS = 2  # the first step creates AdamW's states after backward; from the second they are there throughout


@dataclass
class Row:
    model: str
    run: str
    checkpointing: bool
    weights: int  # bytes the trace counted before the first step
    step_peaks: list[int]  # the tracker's peak in each step, weights included
    estimate: object  # the estimator's Estimate for the same job
    reserved: int  # the caching allocator replayed on the trace, default segments
    expandable: int  # the same with expandable segments
    seconds: float  # the trace's steps

    @property
    def peak(self) -> int:
        return max(self.step_peaks)

    @property
    def allocated(self) -> int:
        return self.estimate.allocated

    @property
    def error(self) -> float:
        """The estimate's signed error against the tracker's peak: +0.01 is 1 % over."""
        return (self.allocated - self.peak) / self.peak

    @property
    def error_above_weights(self) -> float:
        """The same, of the step's bytes above the weights (gradients, states, activations, transients)."""
        return (self.allocated - self.peak) / (self.peak - self.weights)


def cross_check(model: str, run: str, checkpointing: bool, layers=None, seq_len=SEQ_LEN, steps=STEPS) -> Row:
    """Trace `steps` training steps of `model` in `run` and estimate the same job."""
    from helpers.maintainer.fake_trace import trace_training

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's notices, not ours
        traced = trace_training(
            model,
            lengths=[seq_len] * steps,
            layers=layers,
            checkpointing=checkpointing,
            optimizer=OPTIMIZER,
            **RUNS[run],
        )
    e = estimate_training_memory(traced.config, traced.job, device="cpu")
    return Row(
        model,
        run,
        checkpointing,
        traced.weights,
        traced.step_peaks,
        e,
        traced.reserved(),
        traced.reserved(expandable=True),
        traced.seconds,
    )


def table(rows: list[Row], markdown: bool = False) -> str:
    head = (
        "model",
        "run",
        "ckpt",
        "weights GiB",
        "tracked peak GiB (step 1, 2)",
        "estimate GiB",
        "error",
        "above weights",
        "reserved GiB",
        "expandable GiB",
    )
    lines = []
    for r in rows:
        steps = ", ".join(f"{p / GIB:.3f}" for p in r.step_peaks)
        lines.append(
            (
                r.model,
                r.run,
                "on" if r.checkpointing else "off",
                f"{r.weights / GIB:.2f}",
                steps,
                f"{r.allocated / GIB:.3f}",
                f"{100 * r.error:+.2f}%",
                f"{100 * r.error_above_weights:+.2f}%",
                f"{r.reserved / GIB:.2f}",
                f"{r.expandable / GIB:.2f}",
            )
        )
    if markdown:
        rule = "|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|"
        return "\n".join(["| " + " | ".join(head) + " |", rule] + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(str(x)) for x in column) for column in zip(head, *lines)]
    return "\n".join("  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [head, *lines])


def catalog_model(text: str) -> str:
    """An argparse type: a catalog model's name (the error names the nearest ones)."""
    from helpers.catalog import resolve_model

    try:
        resolve_model(text)  # a variant (CodeLlama-7B) keeps its own name and shapes
        return text
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}: pass e.g. --models Mistral-7B") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (for the doc)")
    parser.add_argument(
        "--models",
        nargs="+",
        type=catalog_model,
        default=MODELS,
        metavar="NAME",
        help="catalog models (default: %(default)s)",
    )
    parser.add_argument(
        "--layers", type=whole_number("--layers", 1, 1024, "2"), help="decoder layers (default: the model's)"
    )
    parser.add_argument(
        "--seq-len", type=whole_number("--seq-len", 1, 2**17, "2048"), default=SEQ_LEN, help="tokens a step"
    )
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        for run in RUNS:
            for checkpointing in (False, True):
                rows.append(cross_check(model, run, checkpointing, layers=args.layers, seq_len=args.seq_len))
                r = rows[-1]
                print(
                    f"  {model} / {run} / checkpointing {'on' if checkpointing else 'off'}: {r.seconds:.1f} s",
                    file=sys.stderr,
                )
    print(f"\n{STEPS} steps of 1 x {args.seq_len} tokens, fused AdamW, device='cpu' (SDPA's CPU kernel), fake tensors")
    print(table(rows, markdown=args.markdown))
    worst = max(rows, key=lambda r: abs(r.error))
    print(f"\nworst error {100 * worst.error:+.2f}% ({worst.model}, {worst.run}, checkpointing {worst.checkpointing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
