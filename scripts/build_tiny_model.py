"""Rebuild the embedded tiny model in helpers/assets/tiny-llama, bit for bit.

    python scripts/build_tiny_model.py            # rewrite the shipped copy
    python scripts/build_tiny_model.py --out DIR  # build elsewhere (the tests compare the two)

What it makes: a byte-level BPE tokenizer trained on the kit's own course dataset, and a
Llama-architecture causal LM with the same building blocks as the real models the notebooks use
(RMSNorm, rotary positions, grouped-query attention, gated SiLU MLP, tied embeddings), small
enough to ship in the repository (about 1.3 MB) and to train on two CPU cores in seconds.
The weights are a seeded random init: the notebooks measure memory and watch the loss fall,
neither of which needs a pretrained model. Same torch version in, same bytes out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def corpus(path: Path = DATASET) -> list[str]:
    """Every instruction and response of the course dataset, in file order."""
    texts = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            texts += [row["instruction"], row["response"]]
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
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos, model_max_length=512
    )


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"folder to write (default {DEFAULT_OUT})")
    out = parser.parse_args(argv).out
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {n_params:,} parameters, vocabulary {len(tokenizer)}, {size / 1e6:.2f} MB on disk")


if __name__ == "__main__":
    main()
