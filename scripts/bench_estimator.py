"""The estimator against published GPU measurements: no GPU needed, it reads the published figures.

For each published run this prints the figure as published, what `helpers.estimate` predicts for
the same setup (in the quantity the source measured), and what accelerate's rule of thumb
(`accelerate estimate-memory`: "training using Adam" = 4 x the model's size in a dtype) would
say, each with its error. docs/estimator-accuracy.md holds the table, the sources and the
reasoning behind every setting below; keep the two in step.

Run from the repository root (pure Python, no torch, a few milliseconds):

    python scripts/bench_estimator.py              # the table
    python scripts/bench_estimator.py --markdown   # the same table for the doc
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers._util import MIB  # noqa: E402
from helpers.estimate import estimate_training_memory, shape_of  # noqa: E402

GB = 10**9

SOURCES = {
    "HF-V100": (
        "transformers docs, 'Efficient Training on a Single GPU' (v4.16-4.2x): bert-large-uncased, "
        "AutoModelForSequenceClassification, 512 random tokens, Trainer, Tesla V100 16 GB; "
        "'GPU memory occupied' read through NVML (MiB, CUDA context included). "
        "github.com/huggingface/transformers/blob/98513dfd0db6dab00d26c1ef3a0e5f7410ce2035/"
        "docs/source/en/perf_train_gpu_one.mdx (also docs/source/zh/perf_train_gpu_one.md, "
        "docs/source/en/model_memory_anatomy.md)"
    ),
    "litgpt-A100": (
        "litgpt tutorials/resource-tables.md (10/20/2023, litgpt 8641822, A100-SXM4-40GB, PyTorch 2.1.0, "
        "bitsandbytes 0.41.1, --precision bf16-true, Alpaca, longest Llama 2 example 1304 tokens); "
        "'Max GPU RAM' is litgpt's torch.cuda.max_memory_allocated() / 1e9. "
        "github.com/Lightning-AI/litgpt/blob/4839345a97a0a90bc5f2361664b04d665c9a0e89/tutorials/resource-tables.md"
    ),
    "torchtune": (
        "torchtune README (pre-release, early 2024, PyTorch 2.2) 'Finetuning resource requirements': "
        "Llama2-7B QLoRA, config llama2/7B_qlora_single_device, torch.cuda.max_memory_reserved() / 1e9, "
        "measured on an A100 with its memory capped; the same 9.29 GB in "
        "docs/source/tutorials/qlora_finetune.rst (github.com/pytorch/torchtune, commit 0e44fed1e168); "
        "config as shipped in torchtune 0.1.0 on PyPI"
    ),
}


@dataclass
class Case:
    name: str
    source: str
    measured: float  # in `unit`
    unit: str  # "MiB" (NVML) or "GB" (1e9 bytes)
    quantity: str  # what the source measured: "total" (NVML), "allocated", "reserved"
    model: object
    settings: dict
    accelerate_dtype: str  # the row of `accelerate estimate-memory` for this run
    note: str = ""
    in_median: bool = True
    estimate: object = field(default=None, repr=False)


# transformers 4.16 (Jan 2022) with PyTorch 1.10: the Trainer's default optimizer was its own
# AdamW (per-tensor loop, "adamw_hf"), its zero_grad left the gradients allocated as zeros
# (set_to_none=False), BERT ran eager attention, gradient checkpointing was reentrant; the doc
# measured the CUDA context alone at 1343 MB after torch.ones((1, 1)).to("cuda")
BERT = dict(seq_len=512, attn_impl="eager", optimizer="adamw_hf", set_to_none=False, cuda_context_bytes=1343 * MIB)
# litgpt (Oct 2023): Llama 2 with one fused q/k/v projection, LoRA r=8 on query and value with
# dropout 0.05, everything in bf16 (bf16-true), torch.optim.AdamW (foreach on CUDA), no
# checkpointing on one GPU; the first iteration forces the longest example (1304 tokens) into
# the micro-batch; bitsandbytes 0.41 kept each 4-bit layer's input for backward
LITGPT_LLAMA = replace(shape_of("Llama-2-7B"), qkv_fused=True)
LITGPT = dict(
    seq_len=1304, precision="bf16-true", lora_r=8, lora_targets=["q", "v"], lora_dropout=0.05, optimizer="adamw_foreach"
)
# torchtune 0.1: QLoRA (torchao NF4, double quantized) on q, k, v, o and the MLP, r=8, dropout
# 0.05, batch 2, Alpaca truncated to 512 tokens, bf16, activation checkpointing, torch AdamW
TORCHTUNE = dict(
    batch_size=2,
    seq_len=512,
    precision="bf16-true",
    method="qlora",
    lora_r=8,
    lora_targets="all-linear",
    lora_dropout=0.05,
    checkpointing=True,
    optimizer="adamw_foreach",
)

CASES = [
    Case(
        "bert-large b4 fp32",
        "HF-V100",
        14949,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=4, precision="fp32"),
        "float32",
    ),
    Case(
        "bert-large b1 x4 accumulation",
        "HF-V100",
        8681,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=1, grad_accum_steps=4, precision="fp32"),
        "float32",
    ),
    Case(
        "bert-large b1 x4 + checkpointing",
        "HF-V100",
        6775,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=1, grad_accum_steps=4, checkpointing=True, precision="fp32"),
        "float32",
    ),
    Case(
        "bert-large b4 fp16",
        "HF-V100",
        13939,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=4, precision="fp16"),
        "float16",
    ),
    Case(
        "bert-large b1 x4 + ckpt + fp16",
        "HF-V100",
        7275,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=1, grad_accum_steps=4, checkpointing=True, precision="fp16"),
        "float16",
    ),
    Case(
        "bert-large b4 8-bit Adam",
        "HF-V100",
        13085,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=4, precision="fp32", optimizer="adamw_8bit"),
        "float32",
    ),
    Case(
        "bert-large b1 x4 + ckpt + fp16 + 8-bit Adam",
        "HF-V100",
        5363,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=1, grad_accum_steps=4, checkpointing=True, precision="fp16", optimizer="adamw_8bit"),
        "float16",
    ),
    Case(
        "Llama-2-7B LoRA mb1",
        "litgpt-A100",
        21.30,
        "GB",
        "allocated",
        LITGPT_LLAMA,
        dict(LITGPT, batch_size=1, method="lora"),
        "float16",
    ),
    Case(
        "Llama-2-7B LoRA mb2",
        "litgpt-A100",
        29.07,
        "GB",
        "allocated",
        LITGPT_LLAMA,
        dict(LITGPT, batch_size=2, method="lora"),
        "float16",
    ),
    Case(
        "Llama-2-7B QLoRA bnb.nf4 mb1",
        "litgpt-A100",
        14.14,
        "GB",
        "allocated",
        LITGPT_LLAMA,
        dict(LITGPT, batch_size=1, method="qlora", double_quant=False, quant_keeps_input=True),
        "int4",
    ),
    Case(
        "Llama-2-7B QLoRA bnb.nf4-dq mb1",
        "litgpt-A100",
        13.84,
        "GB",
        "allocated",
        LITGPT_LLAMA,
        dict(LITGPT, batch_size=1, method="qlora", double_quant=True, quant_keeps_input=True),
        "int4",
    ),
    Case(
        "Llama-2-7B QLoRA b2",
        "torchtune",
        9.29,
        "GB",
        "reserved",
        "Llama-2-7B",
        TORCHTUNE,
        "int4",
        note="a process-lifetime peak: torchtune's own log shows 9.13 GB reserved right after model "
        "init, before any training step (4-bit quantization transients); we model the step",
    ),
]
# published out-of-memory runs: the estimate must exceed the card
OOM_CASES = [
    Case(
        "Llama-2-7B LoRA mb4 (OOM on 40 GB)",
        "litgpt-A100",
        40.0,
        "GB",
        "allocated",
        LITGPT_LLAMA,
        dict(LITGPT, batch_size=4, method="lora"),
        "float16",
    ),
]


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
    value = getattr(case.estimate, case.quantity)
    return value / (MIB if case.unit == "MiB" else GB)


def accelerate(case: Case) -> float:
    return accelerate_rule(case.model, case.accelerate_dtype) / (MIB if case.unit == "MiB" else GB)


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def medians(cases: list[Case]) -> tuple[float, float]:
    """Median absolute error of ours and of accelerate's rule over the cases in the median."""
    used = [c for c in cases if c.in_median]
    return (
        statistics.median(abs(error(ours(c), c.measured)) for c in used),
        statistics.median(abs(error(accelerate(c), c.measured)) for c in used),
    )


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
    args = parser.parse_args(argv)
    cases = evaluate()
    print(table(cases, markdown=args.markdown))
    ours_median, accelerate_median = medians(cases)
    print(
        f"\nmedian absolute error over {sum(c.in_median for c in cases)} cases: "
        f"ours {100 * ours_median:.1f}%, accelerate's rule {100 * accelerate_median:.1f}%"
    )
    for c in cases:
        if c.note:
            print(f"* {c.name}: {c.note}")
    for c in evaluate(OOM_CASES):
        verdict = "predicts the OOM" if ours(c) > c.measured else "MISSES the OOM"
        print(f"{c.name}: ours {_fmt(ours(c), c.unit)} allocated > {_fmt(c.measured, c.unit)} card: {verdict}")
    print("\nsources:")
    for key, text in SOURCES.items():
        print(f"  {key}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
