"""Rebuild the embedded tiny model in helpers/assets/tiny-llama, bit for bit.

    python scripts/build_tiny_model.py            # rewrite the shipped copy
    python scripts/build_tiny_model.py --out DIR  # build elsewhere (the tests compare the two)

What it makes: a byte-level BPE tokenizer trained on the kit's own course dataset, and a
Llama-architecture causal LM with the same building blocks as the real models the notebooks use
(RMSNorm, rotary positions, grouped-query attention, gated SiLU MLP, tied embeddings), small
enough to ship in the repository (about 1.3 MB of fp32 safetensors) and to train on two CPU cores
in seconds.

The weights are pre-trained here, on the course dataset's responses only, as plain text (each
followed by the end-of-text token): 600 AdamW steps of 16 x 64 tokens, about 28 passes over the
21,731 response tokens. That takes the loss on the responses from chance, ln(2048) = 7.62, to
about 1.0, while the notebooks' fine-tuning format, `instruction + "\n" + response`, stays new to
the model (about 5.2 on it), so a fine-tune visibly lowers the loss. Deterministic: a fixed seed,
one CPU thread, batches drawn from a seeded generator. Same torch version and CPU in, same bytes
out; another CPU's kernels (AVX512-BF16, AMX) round differently in the last bits, so a rebuild
there matches the shipped model to a tolerance, not bit for bit (tests/test_models.py says which).
The rebuild takes 1 to 1.5 minutes on one core (60 s and 89 s measured on a shared 2-core machine,
Dec 2026, torch 2.13 CPU); it prints the loss before and after. `--losses FILE` writes every step's
loss: tests/data/tiny_model_losses.json is the shipped model's, the curve a rebuild is held to.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_args.py, also when loaded by path

from _args import output_file, output_folder, whole_number  # noqa: E402

DATASET = ROOT / "helpers" / "assets" / "data" / "course.jsonl"
DEFAULT_OUT = ROOT / "helpers" / "assets" / "tiny-llama"

SEED = 0
VOCAB_SIZE = 2048  # 256 byte symbols + 3 special tokens + merges learned from the dataset
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>"]
MODEL_SHAPE = dict(
    hidden_size=64,
    intermediate_size=176,  # gated MLP: gate, up (64 -> 176) and down (176 -> 64)
    num_hidden_layers=4,  # enough layers for gradient checkpointing to have something to save
    num_attention_heads=4,  # head dim 16
    num_key_value_heads=2,  # grouped-query attention, as in Llama 3, Qwen2.5 and SmolLM2
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
# the chat format the notebooks fine-tune in (notebook 08): ChatML's shape with the tiny model's own special
# tokens, "<|bos|>ROLE\nTEXT<|eos|>" a turn; the generation prompt opens the assistant's turn
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|bos|>' + message['role'] + '\\n' + message['content'] + '<|eos|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|bos|>assistant\\n' }}{%- endif %}"
)
# pre-training: about 28 passes over the responses (600 x 16 x 64 = 614,400 tokens seen)
PRETRAIN = dict(steps=600, batch_size=16, seq_len=64, peak_lr=5e-3, warmup_steps=20)


def corpus(path: Path = DATASET, fields: tuple[str, ...] = ("instruction", "response")) -> list[str]:
    """The given fields of every row of the course dataset, in file order."""
    texts = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            texts += [row[name] for name in fields]
    return texts


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any text encodes, no unknown token
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    pad, bos, eos = SPECIAL_TOKENS
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos, model_max_length=512
    )
    tokenizer.chat_template = CHAT_TEMPLATE  # saved as chat_template.jinja; the weights never saw it
    return tokenizer


def build_model(tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **MODEL_SHAPE,
    )
    torch.manual_seed(SEED)
    return LlamaForCausalLM(config)


def token_blocks(tokenizer, texts: list[str], seq_len: int):
    """`texts` tokenized, each followed by the end-of-text token, as one stream cut into (n_blocks, seq_len)."""
    import torch

    stream = [t for ids in tokenizer(texts)["input_ids"] for t in ids + [tokenizer.eos_token_id]]
    n_blocks = len(stream) // seq_len  # the last, shorter piece dropped
    return torch.tensor(stream[: n_blocks * seq_len]).view(n_blocks, seq_len)


def pretrain(model, tokenizer, *, steps, batch_size, seq_len, peak_lr, warmup_steps) -> list[float]:
    """Train `model` on the responses as plain text, in place; return the loss of every step.

    1. every response, tokenized, then the end-of-text token, joined into one stream;
    2. the stream cut into blocks of `seq_len` tokens (the last, shorter piece dropped);
    3. each step a random batch of blocks, AdamW, linear warm-up then cosine decay to zero.
    """
    import torch

    torch.set_num_threads(1)  # the same reductions in every run: the same bytes
    blocks = token_blocks(tokenizer, corpus(fields=("response",)), seq_len)  # (n_blocks, seq_len)
    n_blocks = len(blocks)
    batches = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    model.train()
    losses = []
    for _ in range(steps):
        x = blocks[torch.randint(0, n_blocks, (batch_size,), generator=batches)]  # (batch_size, seq_len)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    model.eval()
    return losses


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=output_folder("--out", "build/tiny-llama"),
        default=DEFAULT_OUT,
        help=f"folder to write (default {DEFAULT_OUT})",
    )
    parser.add_argument(
        "--steps",
        type=whole_number("--steps", 1, 1_000_000, str(PRETRAIN["steps"])),
        default=PRETRAIN["steps"],
        help="pre-training steps (the shipped model: the default)",
    )
    parser.add_argument(
        "--losses",
        type=output_file("--losses", "build/losses.json"),
        help="also write every step's loss to this JSON file",
    )
    args = parser.parse_args(argv)
    out = args.out
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    start = time.perf_counter()
    losses = pretrain(model, tokenizer, **{**PRETRAIN, "steps": args.steps})
    if args.losses:
        args.losses.write_text(json.dumps(losses))
    print(
        f"pre-trained {len(losses)} steps in {time.perf_counter() - start:.0f} s: loss {losses[0]:.2f} -> "
        f"{sum(losses[-20:]) / 20:.2f} (mean of the last 20 steps; chance is ln {len(tokenizer)} = "
        f"{math.log(len(tokenizer)):.2f})"
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n_params:,} parameters, vocabulary {len(tokenizer)}, {size / 1e6:.2f} MB on disk")


if __name__ == "__main__":
    main()
