"""The course dataset that ships with the kit, and the course's way of cutting it into training sequences.

Written for the kit (helpers/assets/data/course.jsonl, one JSON object a line with "topic",
"instruction" and "response"), so every notebook can train offline. Loaded in notebook 00 and
used by every notebook that trains:

- `load_course_data()` reads the rows;
- `pack_course_data(tokenizer, seq_len)` tokenizes them and cuts them into sequences of `seq_len`
  tokens, ready for the Trainer: the recipe notebook 02 writes out line by line, which notebooks
  03 to 07 call in one line.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATASET_PATH", "load_course_data", "pack_course_data"]

DATASET_PATH = Path(__file__).parent / "assets" / "data" / "course.jsonl"


def load_course_data():
    """Load the course dataset as a `datasets.Dataset` through `load_dataset("json", ...)`.

    Example:
        >>> ds = load_course_data()  # doctest: +SKIP
        >>> ds[0]["instruction"]  # doctest: +SKIP
    """
    from datasets import load_dataset

    if not DATASET_PATH.is_file():
        raise FileNotFoundError(
            f"The course dataset {DATASET_PATH} is missing. Reinstall the kit "
            "(pip install -e . from the repository, or the notebook's install cell)."
        )
    return load_dataset("json", data_files=str(DATASET_PATH), split="train")


def pack_course_data(tokenizer, seq_len: int):
    """Tokenize the course dataset and cut it into sequences of `seq_len` tokens, ready for the Trainer.

    Taught in notebook 02, which writes the recipe out; notebooks 03 to 07 call this instead:

    1. each row becomes `instruction + "\\n" + response`, tokenized, then the end-of-text token;
    2. the rows are joined into one stream of tokens (packing: no padding, every token trains);
    3. the stream is cut into blocks of `seq_len` tokens; the last, shorter piece is dropped.

    The labels are the input ids themselves: the model shifts them by one inside its loss.

    Args:
        tokenizer: the model's tokenizer (it needs an end-of-text token).
        seq_len: tokens per sequence, e.g. 256.

    Returns:
        a `datasets.Dataset` with "input_ids" and "labels", one block of `seq_len` tokens a row, in
        torch format: `data[:4]["input_ids"]` is a (4, seq_len) tensor, and the whole of it goes
        to `Trainer(train_dataset=...)` as it is.

    Example:
        >>> train_data = pack_course_data(tokenizer, seq_len=256)  # doctest: +SKIP
        >>> train_data[:4]["input_ids"].shape  # doctest: +SKIP
        torch.Size([4, 256])
        >>> Trainer(model=model, args=args, train_dataset=train_data).train()  # doctest: +SKIP
    """
    from datasets import Dataset

    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(f"seq_len is the number of tokens per sequence, a positive int such as 256; got {seq_len!r}")
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"{type(tokenizer).__name__} has no end-of-text token to put between the rows: set "
            "tokenizer.eos_token first (the model card names it)"
        )
    rows = load_course_data()
    texts = [r["instruction"] + "\n" + r["response"] for r in rows]
    # 1. and 2. one stream: every row's tokens, each followed by the end-of-text token
    stream = [t for ids in tokenizer(texts)["input_ids"] for t in ids + [tokenizer.eos_token_id]]
    # 3. whole blocks of seq_len tokens
    n_blocks = len(stream) // seq_len
    if n_blocks == 0:
        raise ValueError(
            f"the course dataset is {len(stream):,} tokens with this tokenizer, less than one sequence "
            f"of seq_len={seq_len:,}; use a seq_len of at most {len(stream):,}"
        )
    blocks = [stream[i * seq_len : (i + 1) * seq_len] for i in range(n_blocks)]
    return Dataset.from_dict({"input_ids": blocks, "labels": blocks}).with_format("torch")
