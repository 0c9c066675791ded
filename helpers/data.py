"""The course dataset that ships with the kit, and the course's way of cutting it into training sequences.

Written for the kit (helpers/assets/data/course.jsonl, one JSON object a line with "topic",
"instruction" and "response"), so every notebook can train offline. Loaded in notebook 00 and
used by every notebook that trains:

- `load_course_data()` reads the rows;
- `pack_course_data(tokenizer, seq_len)` tokenizes them and cuts them into sequences of `seq_len`
  tokens, ready for the Trainer: the recipe notebook 02 writes out line by line, which notebooks
  03 to 07 call in one line;
- `chat_dataset(rows, tokenizer, seq_len)` puts each row in the model's chat format, one
  conversation a row, with the loss on the answer only (`chat_features` for one row,
  `chat_prompt` for the question alone): notebook 08's fine-tune.
"""

from __future__ import annotations

from pathlib import Path

from helpers import _chat_rows
from helpers._chat_rows import ChatDataError, SeqLenTooShort

__all__ = [
    "ChatDataError",
    "SeqLenTooShort",
    "DATASET_PATH",
    "IGNORE_INDEX",
    "chat_dataset",
    "chat_features",
    "chat_prompt",
    "load_course_data",
    "pack_course_data",
]

DATASET_PATH = Path(__file__).parent / "assets" / "data" / "course.jsonl"
IGNORE_INDEX = -100  # a label the loss skips: the ignore_index of PyTorch's cross_entropy, which transformers uses


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


def chat_prompt(tokenizer, instruction: str) -> str:
    """`instruction` as a user turn in the model's chat format, ending where the assistant's answer begins.

    What the model is asked at generation time, and what `chat_features` masks out of the loss.
    Taught in notebook 08. ChatDataError unless `instruction` is a str with some text in it.
    """
    _check_chat_template(tokenizer)
    _chat_rows.check_text("instruction", instruction)
    return _render(tokenizer, [{"role": "user", "content": instruction}], add_generation_prompt=True)


def chat_features(tokenizer, instruction: str, response: str, seq_len: int) -> dict[str, list[int]]:
    """One conversation (the instruction, then `response` as the answer) tokenized, its loss on the answer only.

    Taught in notebook 08:

    1. the tokenizer's chat template renders the whole conversation, and the prompt alone
       (`chat_prompt`); the prompt must be where the conversation starts;
    2. the prompt and the rest (the answer and the tokens that close its turn) are tokenized
       apart, so the prompt's tokens are exactly those the model sees when asked at generation time;
    3. labels are the input ids with every prompt token set to `IGNORE_INDEX` (-100): the loss
       counts the answer's tokens alone. Cut to `seq_len` tokens.

    Returns:
        {"input_ids", "attention_mask", "labels"}, lists of the same length (at most `seq_len`).

    Raises:
        ChatDataError: `instruction` or `response` is not a str with some text in it.
        SeqLenTooShort: the prompt fills `seq_len`, leaving no answer token (its loss would be 0 / 0).
    """
    _check_seq_len(seq_len)
    _check_chat_template(tokenizer)
    _chat_rows.check_text("instruction", instruction)
    _chat_rows.check_text("response", response)
    turns = [{"role": "user", "content": instruction}, {"role": "assistant", "content": response}]
    features, prompt_len = _features(tokenizer, turns, seq_len)
    if not _trains(features):
        raise SeqLenTooShort(
            f"the prompt is {prompt_len} tokens, so seq_len={seq_len} leaves no answer token to train on; use a "
            f"seq_len above {prompt_len}",
            seq_len,
            prompt_len,
            prompt_len,
        )
    return features


def chat_dataset(rows, tokenizer, seq_len: int):
    """`rows` as `chat_features` conversations, the loss on the answers only, ready for the Trainer.

    Taught in notebook 08. `rows` is a `datasets.Dataset`, a list of dicts or a dict of lists, with
    "instruction" and "response" columns or a "messages" column ([{"role", "content"}, ...]: system
    turns first if any, then user and assistant in turn; the loss counts every assistant turn).
    Every row is checked before any tokenizing: a value that is not text (None, a number, an empty
    or blank str), a missing column or turns out of order raise ChatDataError naming the row.

    A row whose prompt fills all of `seq_len` has no answer token left to learn from (its loss would
    be 0 / 0): it is dropped, and a line says how many were; when every row would be, SeqLenTooShort
    says so (its `shortest_prompt`: seq_len must be above it). Pad the batches with
    `transformers.DataCollatorForSeq2Seq(tokenizer)`: it pads the labels with -100.

    Example:
        >>> train = chat_dataset(load_course_data(), tokenizer, seq_len=512)  # doctest: +SKIP
        >>> turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
        >>> train = chat_dataset([{"messages": turns}], tokenizer, seq_len=512)  # doctest: +SKIP
    """
    from datasets import Dataset

    _check_seq_len(seq_len)
    _check_chat_template(tokenizer)
    conversations = _chat_rows.read_conversations(rows, tokenizer)  # every row checked, nothing tokenized yet
    built = [_features(tokenizer, turns, seq_len) for turns in conversations]
    kept = [features for features, _ in built if _trains(features)]
    prompts = [prompt_len for _, prompt_len in built]
    if not kept:
        raise SeqLenTooShort(
            f"all {len(built)} examples would be dropped: the shortest prompt is {min(prompts)} tokens, so "
            f"seq_len={seq_len} leaves no answer token to train on in any; use a seq_len above {min(prompts)} "
            f"(above {max(prompts)}, the longest prompt, keeps every row)",
            seq_len,
            min(prompts),
            max(prompts),
        )
    if len(kept) < len(built):
        print(
            f"{len(built) - len(kept)} of {len(built)} examples dropped: their prompt fills all of "
            f"seq_len={seq_len}, leaving no answer token to train on (a larger seq_len keeps them: the longest "
            f"prompt is {max(prompts)} tokens)"
        )
    return Dataset.from_list(kept)


def _features(tokenizer, turns, seq_len):
    """(features of one checked conversation, the prompt's tokens before its first answer token).

    Each assistant turn's text is what rendering the conversation up to it adds after the prompt that
    opens it (add_generation_prompt=True); the rest is prompt. Each piece is tokenized apart.
    """
    ids, labels, done, first_prompt = [], [], "", None
    for i, turn in enumerate(turns):
        if turn["role"] != "assistant":
            continue
        prompt = _render(tokenizer, turns[:i], add_generation_prompt=True)
        whole = _render(tokenizer, turns[: i + 1])
        _check_prefixes(tokenizer, done, prompt, whole)
        asked = tokenizer(prompt[len(done) :], add_special_tokens=False)["input_ids"]
        answer = tokenizer(whole[len(prompt) :], add_special_tokens=False)["input_ids"]
        ids += asked + answer
        labels += [IGNORE_INDEX] * len(asked) + answer
        first_prompt = len(asked) if first_prompt is None else first_prompt
        done = whole
    ids, labels = ids[:seq_len], labels[:seq_len]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}, first_prompt


def _trains(features) -> bool:
    # the model predicts token t from those before it, so a label at position 0 never counts
    return any(label != IGNORE_INDEX for label in features["labels"][1:])


def _check_prefixes(tokenizer, done, prompt, whole):
    if not whole.startswith(prompt):
        raise ValueError(
            f"{_name(tokenizer)}'s chat template renders a conversation that does not start with its own generation "
            f"prompt ({prompt[-40:]!r} is not where {whole[:80]!r}... begins), so the prompt cannot be masked off the "
            "answer: use a template whose add_generation_prompt=True output opens the assistant's turn"
        )
    if not prompt.startswith(done):
        raise ValueError(
            f"{_name(tokenizer)}'s chat template renders the earlier turns differently once another follows "
            f"({done[-40:]!r} is not where {prompt[:80]!r}... begins), so the answers cannot be cut apart: give "
            "one user turn and its answer a row (split each conversation at its assistant turns)"
        )


def _render(tokenizer, turns, add_generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=add_generation_prompt)


def _check_seq_len(seq_len) -> None:
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(f"seq_len is the number of tokens per example, a positive int such as 512; got {seq_len!r}")


def _check_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{_name(tokenizer)} has no chat template, so a conversation has no format to be put in: set "
            "tokenizer.chat_template, e.g. to the instruct model's (AutoTokenizer.from_pretrained("
            "'Qwen/Qwen2.5-7B-Instruct').chat_template for a Qwen2.5 base model)"
        )


def _name(tokenizer) -> str:
    return f"the tokenizer of {getattr(tokenizer, 'name_or_path', '') or 'this model'!r}"
