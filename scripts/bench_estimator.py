"""The estimator against published GPU measurements: no GPU needed, it reads the published figures.

For each published run this prints the figure as published, what `helpers.estimate` predicts for
the same setup (in the quantity the source measured), and what accelerate's rule of thumb
(`accelerate estimate-memory`: "training using Adam" = 4 x the model's size in a dtype) would
say, each with its error. docs/estimator-accuracy.md holds the table, the sources and the
reasoning behind every setting below; keep the two in step.

Run from the repository root (pure Python, no torch, a few milliseconds):

    python scripts/bench_estimator.py              # the table
    python scripts/bench_estimator.py --markdown   # the same table for the doc
    python scripts/bench_estimator.py --allocator  # and a training step's peak on CPU, torch's allocator
                                                   # against the estimator (torch, transformers, peft)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]  # helpers, scripts

import published_loops  # noqa: E402  (scripts/published_loops.py: the rows of hand-written loops)

from helpers._util import MIB  # noqa: E402
from helpers.estimate import Harness, estimate_training_memory, shape_of  # noqa: E402

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
    "litgpt-hub": (
        "litgpt config_hub/finetune/README.md at Lightning-AI/litgpt@00af8b0d (2024-09-27; rows added from "
        "4a9b7e62, 2024-03-14, on), settings from config_hub/finetune/<model>/{lora,qlora}.yaml at that commit; "
        "A10G 24 GB, bitsandbytes 0.41.0 (the Llama-2-7B QLoRA row) or 0.42.0, Lightning's bitsandbytes "
        "plugin, bf16-true, Alpaca2k max_seq_length 512, no checkpointing; "
        "'Peak memory' is torch.cuda.max_memory_allocated()/1e9 printed after fit (litgpt/finetune/lora.py), "
        "whole run"
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
LITGPT_LLAMA13 = replace(shape_of("Llama-2-13B"), qkv_fused=True)
# StableLM-Alpha 3B, not in the catalog (a 2023 model): GPT-NeoX's architecture, its config.json on
# the Hub (huggingface.co/stabilityai/stablelm-base-alpha-3b), which litgpt's Config defaults match
STABLELM = shape_of(
    {
        "model_type": "gpt_neox",
        "hidden_size": 4096,
        "intermediate_size": 16384,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "rotary_pct": 0.25,
        "vocab_size": 50688,
        "use_parallel_residual": True,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "hidden_act": "gelu",
    }
)
LITGPT_STABLELM = replace(STABLELM, qkv_fused=True)
# litgpt's --quantize bnb.*: Lightning's BitsandbytesPrecision builds every nn.Linear as a 4-bit one,
# the LM head included, and quantizes each weight from `weight.to(torch.half)` whatever the compute
# dtype (lightning/fabric/plugins/precision/bitsandbytes.py, _Linear4bit.quantize), so bitsandbytes
# dequantizes to fp16 and then casts to bf16; bitsandbytes 0.41-0.42's MatMul4Bit kept each 4-bit
# layer's input for backward (ctx.tensors = (A, B); 0.43.2 keeps (None, B))
LIGHTNING_BNB = dict(quant_keeps_input=True, quantize_head=True, quant_dtype="fp16")
# litgpt's LoRA scripts run the head on 128-position chunks and the cross-entropy chunk by chunk,
# but Fabric casts the model's outputs to fp32 (_FabricModule.forward -> convert_output) and the
# loop holds them through the backward: fp32 logits whole, the loss's gradients one chunk at a time
LITGPT_LOSS = dict(loss_chunk=128)
LITGPT = dict(
    seq_len=1304,
    precision="bf16-true",
    lora_r=8,
    lora_targets=["q", "v"],
    lora_dropout=0.05,
    optimizer="adamw_foreach",
    **LITGPT_LOSS,
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


def _a100(name: str, model, measured: float, settings: dict, dtype: str) -> Case:
    """One row of litgpt's 2023 tables: max_memory_allocated in GB on the 40 GB A100."""
    return Case(name, "litgpt-A100", measured, "GB", "allocated", model, settings, dtype)


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
        "bert-large b4 Adafactor",
        "HF-V100",
        12295,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=4, precision="fp32", optimizer="adafactor"),
        "float32",
    ),
    Case(
        "bert-large b1 x4 + ckpt + fp16 + Adafactor",
        "HF-V100",
        4847,
        "MiB",
        "total",
        "bert-large",
        dict(BERT, batch_size=1, grad_accum_steps=4, checkpointing=True, precision="fp16", optimizer="adafactor"),
        "float16",
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
    _a100("Llama-2-7B LoRA mb1", LITGPT_LLAMA, 21.30, dict(LITGPT, batch_size=1, method="lora"), "float16"),
    _a100("Llama-2-7B LoRA mb2", LITGPT_LLAMA, 29.07, dict(LITGPT, batch_size=2, method="lora"), "float16"),
    _a100(
        "Llama-2-7B QLoRA bnb.nf4 mb1",
        LITGPT_LLAMA,
        14.14,
        dict(LITGPT, **LIGHTNING_BNB, batch_size=1, method="qlora", double_quant=False),
        "int4",
    ),
    _a100(
        "Llama-2-7B QLoRA bnb.nf4-dq mb1",
        LITGPT_LLAMA,
        13.84,
        dict(LITGPT, **LIGHTNING_BNB, batch_size=1, method="qlora", double_quant=True),
        "int4",
    ),
    *[
        _a100(f"StableLM-3B {name}", LITGPT_STABLELM, measured, settings, dtype)
        for name, measured, settings, dtype in (
            # its longest Alpaca example is 1034 tokens with StableLM's tokenizer (the page says so)
            ("LoRA mb1", 9.69, dict(LITGPT, seq_len=1034, batch_size=1, method="lora"), "float16"),
            ("LoRA mb2", 12.10, dict(LITGPT, seq_len=1034, batch_size=2, method="lora"), "float16"),
            ("LoRA mb4", 16.92, dict(LITGPT, seq_len=1034, batch_size=4, method="lora"), "float16"),
            (
                "QLoRA bnb.nf4 mb1",
                6.35,
                dict(LITGPT, **LIGHTNING_BNB, seq_len=1034, batch_size=1, method="qlora", double_quant=False),
                "int4",
            ),
            (
                "QLoRA bnb.nf4-dq mb1",
                6.19,
                dict(LITGPT, **LIGHTNING_BNB, seq_len=1034, batch_size=1, method="qlora", double_quant=True),
                "int4",
            ),
            # tutorials/finetune_lora.md (litgpt@00af8b0d) lists the three rows above once more and
            # the default bf16-mixed precision: fp32 weights under autocast
            (
                "LoRA bf16-mixed mb1",
                26.92,
                dict(LITGPT, seq_len=1034, batch_size=1, method="lora", precision="bf16", weights="fp32"),
                "float32",
            ),
        )
    ],
    _a100("Llama-2-13B LoRA mb1", LITGPT_LLAMA13, 38.12, dict(LITGPT, batch_size=1, method="lora"), "float16"),
    _a100(
        "Llama-2-13B QLoRA bnb.nf4 mb1",
        LITGPT_LLAMA13,
        23.14,
        dict(LITGPT, **LIGHTNING_BNB, batch_size=1, method="qlora", double_quant=False),
        "int4",
    ),
    _a100(
        "Llama-2-13B QLoRA bnb.nf4-dq mb1",
        LITGPT_LLAMA13,
        22.55,
        dict(LITGPT, **LIGHTNING_BNB, batch_size=1, method="qlora", double_quant=True),
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
        "init, before any training step: the caching allocator keeps its 4-bit quantization transients "
        "reserved; the estimator models allocated bytes at loading and at the step, not that; out of the median",
        in_median=False,
    ),
]
# litgpt's config hub (A10G 24 GB, 2024): LoRA and QLoRA side by side, same harness and data
# (Alpaca2k, sequences padded to 512 tokens), bf16-true, no checkpointing, LoRA dropout 0.05; QLoRA
# with bnb.nf4 (no double quantization) through bitsandbytes 0.41-0.42 and Lightning's plugin
# (LIGHTNING_BNB). The figure is max_memory_allocated over the whole run (loading included, no
# reset). Fabric casts the chunked logits to fp32 after the forward, so the loss is transformers'
# (fp32 logits and log-probs). Not modeled, and it lowers the measured figure: the QLoRA optimizer
# is bitsandbytes' paged 32-bit AdamW (its states of 100,000 elements or more live outside
# max_memory_allocated).
# Its loop (litgpt/finetune/lora.py, fit) keeps `logits` from one iteration to the next: the previous
# micro-batch's fp32 logits and graph, with the inputs bitsandbytes kept on each 4-bit layer's ctx,
# live through the next forward. Batches come in random order, padded to their longest sample, and
# the peak is over the whole run, so two full-length micro-batches in a row set it
# (loop="litgpt"). The 2023 tables above run their longest batch first, before any other
# graph exists (finetune/lora.py at 8641822: get_batch(..., longest_seq_ix if iter_num == 0)), and
# the random Alpaca batches after it are far shorter: no such moment there.
HUB = dict(
    seq_len=512,
    precision="bf16-true",
    lora_dropout=0.05,
    optimizer="adamw_foreach",
    loop="litgpt",
    **LITGPT_LOSS,
)
HUB_QLORA = dict(HUB, **LIGHTNING_BNB, method="qlora", double_quant=False)
HUB_QV = dict(lora_targets=["q", "v"], lora_r=32)
HUB_ALL = ["q", "k", "v", "o", "gate", "up", "down", "lm_head"]


def _litgpt(name: str, **shape):
    """litgpt's GPT at 00af8b0d: one fused q/k/v projection and its own LM head for every model
    (its Config had no tie_embeddings yet: Llama 3.2's tied head is loaded as a second copy)."""
    return replace(shape_of(name), qkv_fused=True, tied=False, **shape)


def _hub(name: str, model, measured: float, settings: dict, dtype: str, global_batch: int = 8) -> Case:
    """One row of the table; the yaml's global_batch_size / micro_batch_size micro-batches a step."""
    model = _litgpt(model) if isinstance(model, str) else model
    settings = dict(settings, grad_accum_steps=global_batch // settings["batch_size"])
    return Case(name, "litgpt-hub", measured, "GB", "peak_allocated", model, settings, dtype)


# Gemma 2 in litgpt soft-caps the attention scores, so it computes attention by hand (eager)
LITGPT_GEMMA2 = _litgpt("Gemma-2-2B", attn_impl="eager")
LITGPT_GEMMA2_9B = _litgpt("Gemma-2-9B", attn_impl="eager")
CASES += [
    _hub(
        "Llama-2-7B LoRA r32 q,v mb2", "Llama-2-7B", 19.77, dict(HUB, **HUB_QV, batch_size=2, method="lora"), "float16"
    ),
    _hub("Llama-2-7B QLoRA r32 q,v mb2", "Llama-2-7B", 13.68, dict(HUB_QLORA, **HUB_QV, batch_size=2), "int4"),
    _hub(
        "Mistral-7B LoRA r32 q,v mb2", "Mistral-7B", 20.66, dict(HUB, **HUB_QV, batch_size=2, method="lora"), "float16"
    ),
    _hub("Mistral-7B QLoRA r32 q,v mb2", "Mistral-7B", 14.29, dict(HUB_QLORA, **HUB_QV, batch_size=2), "int4"),
    _hub(
        "Llama-3.1-8B LoRA r32 q,v mb1",
        "Llama-3.1-8B",
        19.73,
        dict(HUB, **HUB_QV, batch_size=1, method="lora"),
        "float16",
    ),
    _hub("Llama-3.1-8B QLoRA r32 q,v mb2", "Llama-3.1-8B", 17.41, dict(HUB_QLORA, **HUB_QV, batch_size=2), "int4"),
    _hub(
        "Llama-3.2-1B LoRA r32 q,v mb1",
        "Llama-3.2-1B",
        4.49,
        dict(HUB, **HUB_QV, batch_size=1, method="lora"),
        "float16",
    ),
    _hub("Llama-3.2-1B QLoRA r32 q,v mb2", "Llama-3.2-1B", 5.53, dict(HUB_QLORA, **HUB_QV, batch_size=2), "int4"),
    _hub(
        "StableLM-3B LoRA r32 q,v mb1",
        replace(LITGPT_STABLELM, tied=False),
        8.58,
        dict(HUB, **HUB_QV, batch_size=1, method="lora"),
        "float16",
    ),
    _hub("StableLM-3B QLoRA r32 q,v mb1", LITGPT_STABLELM, 5.24, dict(HUB_QLORA, **HUB_QV, batch_size=1), "int4"),
    _hub(
        "Llama-3.2-3B LoRA r32 q,v mb1",
        "Llama-3.2-3B",
        9.67,
        dict(HUB, **HUB_QV, batch_size=1, method="lora"),
        "float16",
    ),
    _hub("Llama-3.2-3B QLoRA r32 q,v mb2", "Llama-3.2-3B", 10.30, dict(HUB_QLORA, **HUB_QV, batch_size=2), "int4"),
    # a full fine-tune: torch's AdamW (foreach) on bf16 weights, 8 micro-batches of 4 a step;
    # finetune/full.py runs the head whole and reshapes the sliced fp32 logits (a copy) before its
    # chunked cross-entropy: the fp32 logits twice at the end of the forward, as transformers' loss
    _hub(
        "TinyLlama full mb4",
        "TinyLlama-1.1B",
        14.10,
        dict(HUB, batch_size=4, method="full", lora_dropout=0.0, loss_chunk=0),
        "float16",
        global_batch=32,
    ),
    _hub(
        "TinyLlama LoRA r32 all+head mb8",
        "TinyLlama-1.1B",
        13.50,
        dict(HUB, lora_targets=HUB_ALL, lora_r=32, batch_size=8, method="lora"),
        "float16",
    ),
    _hub(
        "TinyLlama QLoRA r32 all+head mb8",
        "TinyLlama-1.1B",
        16.24,
        dict(HUB_QLORA, lora_targets=HUB_ALL, lora_r=32, batch_size=8),
        "int4",
    ),
    _hub(
        "Phi-3-mini LoRA r8 all+head mb4",
        "Phi-3-mini",
        19.75,
        dict(HUB, lora_targets=HUB_ALL, lora_r=8, batch_size=4, method="lora"),
        "float16",
    ),
    _hub(
        "Phi-3-mini QLoRA r8 all+head mb4",
        "Phi-3-mini",
        19.13,
        dict(HUB_QLORA, lora_targets=HUB_ALL, lora_r=8, batch_size=4),
        "int4",
    ),
    _hub(
        "Gemma-2-2B LoRA r8 all+head mb2",
        LITGPT_GEMMA2,
        14.31,
        dict(HUB, lora_targets=HUB_ALL, lora_r=8, lora_dropout=0.1, batch_size=2, method="lora"),
        "float16",
        global_batch=6,
    ),
    _hub(
        "Gemma-2-9B QLoRA r16 all+head mb1",
        LITGPT_GEMMA2_9B,
        20.92,
        dict(HUB_QLORA, lora_targets=HUB_ALL, lora_r=16, lora_dropout=0.1, batch_size=1),
        "int4",
        global_batch=6,
    ),
    _hub(
        "Gemma-2-2B QLoRA r16 all+head mb2",
        LITGPT_GEMMA2,
        13.52,
        dict(HUB_QLORA, lora_targets=HUB_ALL, lora_r=16, lora_dropout=0.1, batch_size=2),
        "int4",
        global_batch=6,
    ),
]
# published out-of-memory runs: the estimate must exceed the card
OOM_CASES = [
    _a100(
        "Llama-2-7B LoRA mb4 (OOM on 40 GB)", LITGPT_LLAMA, 40.0, dict(LITGPT, batch_size=4, method="lora"), "float16"
    ),
    # tutorials/finetune_lora.md (litgpt@00af8b0d) lists the same runs (21.30, 14.14, 13.84 GB) and
    # one more: the default bf16-mixed precision, fp32 weights under autocast, out of memory
    _a100(
        "Llama-2-7B LoRA bf16-mixed mb1 (OOM on 40 GB)",
        LITGPT_LLAMA,
        40.0,
        dict(LITGPT, batch_size=1, method="lora", precision="bf16", weights="fp32"),
        "float32",
    ),
    # litgpt's config hub: Gemma 2 9B LoRA (r 16 on every linear and the head) ran out of memory on the
    # 24 GB A10G, where its QLoRA row above fits
    _hub(
        "Gemma-2-9B LoRA r16 all+head mb1 (OOM on 24 GB)",
        LITGPT_GEMMA2_9B,
        24.0,
        dict(HUB, lora_targets=HUB_ALL, lora_r=16, lora_dropout=0.1, batch_size=1, method="lora"),
        "float16",
        global_batch=6,
    ),
    _a100(
        "Llama-2-13B LoRA mb2 (OOM on 40 GB)",
        LITGPT_LLAMA13,
        40.0,
        dict(LITGPT, batch_size=2, method="lora"),
        "float16",
    ),
]


def _loop_case(row, quantity: str) -> Case:
    """One published hand-written-loop row (scripts/published_loops.py) as a Case in `quantity`."""
    name, model, method, attention, batch, seq_len, r, _, allocated, reserved = row
    settings = dict(
        per_device_batch=batch,
        seq_len=seq_len,
        # fp16 weights with no autocast; a 4-bit model's k-bit preparation casts the embeddings and
        # norms to fp32, and bitsandbytes returns each output in its input's dtype: fp32 activations
        precision="fp32" if method == "qlora" else "fp16",
        method=method,
        lora_r=r,
        lora_targets=["q", "k", "v", "o"],
        checkpointing=True,
        optimizer="adamw_foreach",
        double_quant=False,
        loop="custom",
        attn_impl="eager" if attention == "eager" else "sdpa",
    )
    if attention == "sdpa*":  # the memory-efficient kernel pinned, the grouped heads repeated for it
        settings["sdpa_kernel"] = "efficient"
    measured = allocated if quantity == "allocated" else reserved
    label = f"{name} {model.split('/')[1]} {method} {attention} {batch}x{seq_len}"
    return Case(label, "fitcheck-T4", measured, "MiB", quantity, published_loops.MODELS[model], settings, "float16")


def _vramcalc_case(row) -> Case:
    """One row of vramcalc's validation table (scripts/published_loops.py) as a Case."""
    name, model, method, mode, attention, checkpointing, measured = row
    settings = dict(
        per_device_batch=1,
        seq_len=2048,
        method=method,
        # "pure": bf16 weights, no autocast (full fine-tuning keeps its AdamW states in bf16 too; peft's
        # adapters stay fp32); "amp": fp32 weights under bf16 autocast
        precision="bf16-true" if mode == "pure" and method == "full" else "bf16",
        weights="fp32" if mode == "amp" else "bf16",
        lora_r=16,
        lora_targets=["q", "k", "v", "o"],
        checkpointing=checkpointing,
        optimizer="adamw_foreach",
        loop="custom",  # `out` held through backward (deleted before the step, where the peak is not)
        attn_impl=attention,
        set_to_none=False,
    )
    if mode == "pure" and method == "full":
        del settings["weights"]
    shape = replace(shape_of(model), use_cache=False)  # the loop passes use_cache=False
    label = f"{name} {model} {method} {mode} {attention}{' ckpt' if checkpointing else ''}"
    return Case(label, "vramcalc-A6000", measured, "GB", "allocated", shape, settings, "float16")


LOOP_CASES = [_loop_case(row, quantity) for quantity in ("allocated", "reserved") for row in published_loops.ROWS]
LOOP_CASES += [_vramcalc_case(row) for row in published_loops.VRAMCALC_ROWS]
SOURCES["fitcheck-T4"] = published_loops.SOURCE
SOURCES["vramcalc-A6000"] = published_loops.VRAMCALC_SOURCE


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


def arguments(settings: dict) -> dict:
    """A case's settings as `estimate_training_memory` takes them: the harness facts in one `Harness`."""
    facts = {k: v for k, v in settings.items() if k in Harness.__dataclass_fields__}
    rest = {k: v for k, v in settings.items() if k not in facts}
    return dict(rest, harness=Harness(**facts)) if facts else rest


def evaluate(cases=None) -> list[Case]:
    """Estimate every case; each Case gets its Estimate."""
    cases = CASES if cases is None else cases
    for case in cases:
        case.estimate = estimate_training_memory(case.model, **arguments(case.settings))
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


def error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


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


# --- the CPU grid: the estimator against the bytes autograd saves, measured ---------------------
# A tiny random model of every family, built with the real transformers class (no download), in
# every setting the estimator takes; activations measured with saved-tensor hooks
# (helpers.saved_tensors.track_saved_tensors). Needs torch, transformers, peft, bitsandbytes.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4)
CPU_FAMILIES = {  # model_type -> what its tiny config changes
    "llama": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2),
    "qwen2": dict(num_key_value_heads=2),
    "qwen3": dict(num_key_value_heads=2, head_dim=16),
    "gemma": dict(num_key_value_heads=2, head_dim=16),
    "gemma2": dict(num_key_value_heads=2, head_dim=16),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16),
    "phi3": dict(num_key_value_heads=4, pad_token_id=0),  # Phi-3-mini: as many key/value heads as query heads
    "gpt_neox": {},
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "bert": dict(max_position_embeddings=256),
}
# where each family applies dropout (its config's names); "on" sets them all to 0.1
DROPOUT_KEYS = {
    "gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"),
    "bert": ("attention_probs_dropout_prob", "hidden_dropout_prob"),
    "phi3": ("attention_dropout", "resid_pdrop", "embd_pdrop"),
    "gpt_neox": ("attention_dropout", "hidden_dropout"),
}
QV_NAMES = {"phi3": ["qkv_proj"], "gpt_neox": ["query_key_value"], "gpt2": ["c_attn"], "bert": ["query", "value"]}
# precision mode -> (the model's dtype, autocast, estimator precision for full, for LoRA, LoRA's weights)
MODES = {
    "fp32": ("float32", False, "fp32", "fp32", "fp32"),
    "bf16 autocast": ("float32", True, "bf16", "bf16", "fp32"),
    "pure bf16": ("bfloat16", False, "bf16-true", "bf16", "bf16"),
}
CPU_SIZES = ((1, 32), (2, 64))  # (per_device_batch, seq_len)


def tiny_config(kind: str, dropout: bool):
    from transformers import AutoConfig

    values = dict(CPU_FAMILIES[kind]) if kind == "gpt2" else dict(TINY, **CPU_FAMILIES[kind])
    values.update({k: 0.1 if dropout else 0.0 for k in DROPOUT_KEYS.get(kind, ("attention_dropout",))})
    return AutoConfig.for_model(kind, **values)


def _build(kind: str, impl: str, dtype: str, dropout: bool, method: str, checkpointing: bool, tmp: Path):
    """The model to train (a peft model for LoRA and QLoRA), and the transformers model under it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BertForSequenceClassification

    torch.manual_seed(0)
    config = tiny_config(kind, dropout)
    cls = BertForSequenceClassification if kind == "bert" else AutoModelForCausalLM
    build = cls._from_config if kind == "bert" else cls.from_config
    model = build(config, attn_implementation=impl).to(getattr(torch, dtype))
    if method == "full":
        return model.train(), model
    targets = "all-linear" if dropout else QV_NAMES.get(kind, ["q_proj", "v_proj"])
    if method == "qlora":
        return _qlora(
            model,
            getattr(torch, dtype),
            tmp / kind,
            r=8,
            dropout=0.1 * dropout,
            targets=targets,
            checkpointing=checkpointing,
        )
    adapter = LoraConfig(
        r=8,
        target_modules=targets,
        lora_dropout=0.1 * dropout,
        fan_in_fan_out=kind == "gpt2",
        task_type="SEQ_CLS" if kind == "bert" else None,
    )
    return get_peft_model(model, adapter).train(), model


def _qlora(model, compute, folder: Path, *, r: int, dropout: float, targets, checkpointing: bool):
    """The course's QLoRA recipe on CPU: `model` saved to `folder` and loaded back in nf4 with double
    quantization, computing in `compute` (fp32 on CPU; bf16 for autocast, as on a card), then peft's
    k-bit preparation and LoRA (helpers.qlora). Returns the peft model, in training mode, and its base."""
    from transformers import BitsAndBytesConfig

    from helpers.qlora import add_adapter, disable_cpu_repacking

    model.save_pretrained(folder)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    impl = model.config._attn_implementation
    base = type(model).from_pretrained(folder, quantization_config=nf4, dtype=compute, attn_implementation=impl)
    disable_cpu_repacking(base)
    trained = add_adapter(base, r=r, alpha=2 * r, dropout=dropout, target_modules=targets, checkpointing=checkpointing)
    return trained.train(), base


def _measure(trained, model, batch: int, seq_len: int, autocast: bool, checkpointing: bool | None) -> int:
    """Bytes saved for backward by one forward (checkpointing None: as the model was built)."""
    import torch

    from helpers.saved_tensors import track_saved_tensors

    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing is not None:
        model.activation_checkpointing_disable()
        if hasattr(model, "_require_grads_hook"):  # checkpointing made the inputs require grad; undo it
            model.disable_input_require_grads()
    ids = torch.randint(3, model.config.vocab_size, (batch, seq_len))
    labels = torch.randint(0, 2, (batch,)) if model.config.model_type == "bert" else ids
    with track_saved_tensors(trained) as saved, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = trained(input_ids=ids, labels=labels).loss
    loss.backward()  # frees the graph
    trained.zero_grad(set_to_none=True)
    return saved.bytes


def cpu_grid(kinds=None, impls=("eager", "sdpa"), modes=None, methods=("full", "lora", "qlora"), sizes=CPU_SIZES):
    """Rows (settings, measured bytes, predicted bytes) over every family and setting asked for."""
    import itertools
    import tempfile
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()  # no progress bars or notices for 200 tiny models
    logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's deprecation notices, not ours
        for kind, impl, dropout, method, mode in itertools.product(
            kinds or CPU_FAMILIES, impls, (False, True), methods, modes or MODES
        ):
            dtype, autocast, full, lora, weights = MODES[mode]
            if (kind == "gemma2" and impl == "sdpa") or (
                method == "qlora" and (mode == "pure bf16" or kind in ("gpt2", "bert"))
            ):
                continue  # Gemma 2 has no sdpa path; QLoRA: peft's k-bit preparation keeps fp32 norms, on decoders
            if method == "qlora":  # the 4-bit base computes in bf16 under autocast
                dtype = "bfloat16" if autocast else "float32"
            built = None
            for checkpointing in (False, True):
                if built is None or method == "qlora":  # peft's k-bit preparation sets checkpointing itself
                    built = _build(kind, impl, dtype, dropout, method, checkpointing, Path(tmp))
                trained, model = built
                for batch, seq_len in sizes:
                    measured = _measure(
                        trained, model, batch, seq_len, autocast, None if method == "qlora" else checkpointing
                    )
                    predicted = estimate_training_memory(
                        model.config,
                        per_device_batch=batch,
                        seq_len=seq_len,
                        checkpointing=checkpointing,
                        precision=full if method == "full" else lora,
                        weights=None if method != "lora" else weights,
                        method=method,
                        lora_r=8,
                        lora_targets="all-linear" if dropout else QV_NAMES.get(kind, ["q_proj", "v_proj"]),
                        lora_dropout=0.1 if dropout and method != "full" else 0.0,
                        device="cpu",
                    ).activations
                    settings = (
                        kind,
                        impl,
                        "dropout" if dropout else "-",
                        method,
                        mode,
                        "ckpt" if checkpointing else "-",
                    )
                    rows.append((settings + (batch, seq_len), measured, predicted))
    return rows


def print_grid(rows) -> None:
    """Median and worst error of the CPU grid, overall and by family and method."""
    errors = [(r[0], error(r[2], r[1])) for r in rows]
    print(f"\nCPU grid: {len(rows)} configurations, activations against saved-tensor bytes")
    for label, index in (("family", 0), ("method", 3)):
        for key in dict.fromkeys(s[index] for s, _ in errors):
            mine = [abs(e) for s, e in errors if s[index] == key]
            median, most = 100 * statistics.median(mine), 100 * max(mine)
            print(f"  {label} {key:12} n={len(mine):3}  median {median:.2f}%  worst {most:.2f}%")
    worst = max(errors, key=lambda r: abs(r[1]))
    print(
        f"  all: median {100 * statistics.median(abs(e) for _, e in errors):.2f}%, worst {100 * abs(worst[1]):.2f}% "
        f"({' '.join(map(str, worst[0]))})"
    )


# --- the allocator check: the whole step's peak against what torch's CPU allocator hands out -----
# Saved-tensor hooks miss what is not saved: transients (a dequantized 4-bit weight, the loss's
# backward), tensors kept on an autograd ctx, the moment inside backward when the most is alive.
# helpers/_allocator.py reads every allocation and free from torch's profiler. Two shapes of a tiny
# random Llama (2 layers, 8 heads, 4 key/value heads, untied head, sdpa): one where the logits and
# the loss set the peak, as in small LMs; one where the weights are wide beside the vocabulary and
# the tokens few, as in a 7B at a short sequence, so that a layer's backward sets it.
ALLOCATOR_SHAPES = {  # name -> (the config's sizes, (per_device_batch, seq_len))
    "vocab-bound": (dict(hidden_size=256, intermediate_size=704, vocab_size=2048), (2, 128)),
    "weight-bound": (dict(hidden_size=512, intermediate_size=1536, vocab_size=1024), (2, 64)),
}
# (method, estimator precision): fp32 throughout, or a 4-bit base computing in bf16 under autocast
ALLOCATOR_RUNS = (("full", "fp32"), ("lora", "fp32"), ("qlora", "fp32"), ("qlora", "bf16"))
ALLOCATOR_LORA_R = 16  # all-linear adapters, no dropout (peft's default)
ALLOCATOR_LOOPS = ("trainer", "custom")  # what the loop keeps of the output (estimate_training_memory's `loop`)


def _allocator_model(sizes: dict, method: str, precision: str, checkpointing: bool, tmp: Path):
    """The model a step trains, and the transformers model under it, for one allocator run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, **sizes)
    config.tie_word_embeddings = False
    model = LlamaForCausalLM(config)
    if method == "qlora":  # saved in bf16, as checkpoints ship; loaded in the compute dtype
        compute = torch.bfloat16 if precision == "bf16" else torch.float32
        return _qlora(
            model.to(torch.bfloat16),
            compute,
            tmp / f"{sizes['hidden_size']}-{precision}",
            r=ALLOCATOR_LORA_R,
            dropout=0.0,
            targets="all-linear",
            checkpointing=checkpointing,
        )
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if method == "full":
        return model.train(), model
    adapter = LoraConfig(r=ALLOCATOR_LORA_R, lora_alpha=2 * ALLOCATOR_LORA_R, target_modules="all-linear")
    return get_peft_model(model, adapter).train(), model


def measure_step(trained, batch: int, seq_len: int, autocast: bool, loop: str = "trainer", reserved: bool = False):
    """Peak bytes of one training step (forward, backward, fused AdamW's step, gradients set to None)
    above the resident weights: the allocator's peak above the step's start, plus the optimizer
    states already there. A first step creates the states and any lazy buffer; the next two are measured.

    loop: "trainer" lets the output go before the optimizer's step, as the Trainer does; "custom"
    is the Hugging Face course's loop, `outputs = model(**batch); outputs.loss.backward()`: the name
    holds the output through backward and the step, and the previous one through the next forward."""
    import torch

    from helpers._allocator import track_allocations

    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(3, trained.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    held = []  # the loop's `outputs` variable, bound again when the next forward returns

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outputs = trained(input_ids=ids, labels=ids)
        held[:] = [outputs] if loop == "custom" else []
        loss = outputs.loss
        del outputs  # the Trainer's compute_loss returns the loss alone: the output goes before backward
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    held.clear()  # what the first step left is freed before the block: the block sees all it holds
    states = sum(t.nbytes for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
    with track_allocations() as allocated:
        step()  # a custom loop's first step binds its output; the second runs its forward beside it
        step()
    held.clear()
    if reserved:  # and what torch.cuda's caching allocator would reserve above the step's start, plus the states
        return allocated.peak + states, allocated.reserved + states
    return allocated.peak + states


def allocator_grid(shapes=None, runs=ALLOCATOR_RUNS, loops=ALLOCATOR_LOOPS) -> list:
    """Rows ((shape, method, precision, checkpointing, loop), measured, predicted): step bytes above the weights."""
    import itertools
    import tempfile
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's deprecation notices, not ours
        for name in shapes or ALLOCATOR_SHAPES:
            sizes, (batch, seq_len) = ALLOCATOR_SHAPES[name]
            for (method, precision), checkpointing, loop in itertools.product(runs, (False, True), loops):
                trained, model = _allocator_model(sizes, method, precision, checkpointing, Path(tmp))
                measured = measure_step(trained, batch, seq_len, autocast=precision != "fp32", loop=loop)
                e = estimate_training_memory(
                    model.config,
                    per_device_batch=batch,
                    seq_len=seq_len,
                    precision=precision,
                    method=method,
                    lora_r=ALLOCATOR_LORA_R,
                    checkpointing=checkpointing,
                    optimizer="adamw",  # fused: its step builds nothing
                    loop=loop,
                    device="cpu",
                )
                rows.append(((name, method, precision, checkpointing, loop), measured, e.allocated - e.weights))
    return rows


def print_allocator(rows) -> None:
    """The step peak above the weights: torch's CPU allocator against the estimator."""
    print("\nstep peak above the weights (forward, backward, fused AdamW step), CPU allocator vs estimator")
    print(
        f"{'shape':13} {'method':6} {'precision':13} {'ckpt':5} {'loop':8} {'measured MiB':>12} {'estimate MiB':>12} "
        f"{'error':>7}"
    )
    for (name, method, precision, checkpointing, loop), measured, predicted in rows:
        label = "bf16 autocast" if precision == "bf16" else precision
        print(
            f"{name:13} {method:6} {label:13} {'on' if checkpointing else 'off':5} {loop:8} {measured / MIB:12.3f} "
            f"{predicted / MIB:12.3f} {100 * error(predicted, measured):+6.1f}%"
        )


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
    for key, text in SOURCES.items():
        print(f"  {key}: {text}")
    if args.cpu:
        print_grid(cpu_grid())
    if args.allocator:
        print_allocator(allocator_grid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
