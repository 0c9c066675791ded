"""helpers.data: the shipped course dataset, and pack_course_data proved equal to the recipe written out."""

import math

import pytest
import torch
from transformers import AutoTokenizer, Trainer, TrainingArguments, default_data_collator

from helpers import data
from helpers.data import DATASET_PATH, load_course_data, pack_course_data
from helpers.models import EMBEDDED_DIR, load_model


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)


def test_course_dataset_loads_through_datasets():
    rows = load_course_data()
    assert rows.num_rows >= 300
    assert rows.column_names == ["topic", "instruction", "response"]
    instructions = [i.strip().lower() for i in rows["instruction"]]
    assert len(set(instructions)) == len(instructions), "every instruction is distinct"
    assert all(r.strip() for r in rows["response"])


def test_missing_dataset_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(data, "DATASET_PATH", tmp_path / "course.jsonl")
    with pytest.raises(FileNotFoundError, match="course.jsonl is missing. Reinstall the kit"):
        data.load_course_data()


def test_dataset_path_is_package_data():
    assert DATASET_PATH.is_file() and DATASET_PATH.parent.parent == EMBEDDED_DIR.parent


@pytest.mark.parametrize("seq_len", [32, 256, 512])
def test_packed_sequences_equal_the_recipe_written_out(tokenizer, seq_len):
    # the reference: notebook 02's lines, as a student types them
    rows = load_course_data()
    ids = [
        t
        for r in tokenizer([r["instruction"] + "\n" + r["response"] for r in rows])["input_ids"]
        for t in r + [tokenizer.eos_token_id]
    ]
    blocks = torch.tensor(ids[: (len(ids) // seq_len) * seq_len]).view(-1, seq_len)

    packed = pack_course_data(tokenizer, seq_len)
    assert packed.column_names == ["input_ids", "labels"]
    assert len(packed) == len(ids) // seq_len and len(ids) - len(packed) * seq_len < seq_len  # only a tail dropped
    assert torch.equal(packed[:]["input_ids"], blocks)
    assert torch.equal(packed[:]["labels"], blocks), "labels are the inputs; the model shifts them itself"
    assert packed[:4]["input_ids"].shape == (4, seq_len) and packed[0]["input_ids"].dtype == torch.int64


def test_rows_are_joined_by_the_end_of_text_token(tokenizer):
    rows = load_course_data()
    stream = pack_course_data(tokenizer, 64)[:]["input_ids"].flatten().tolist()
    first_end = stream.index(tokenizer.eos_token_id)
    assert tokenizer.decode(stream[:first_end]) == rows[0]["instruction"] + "\n" + rows[0]["response"]
    second_end = stream.index(tokenizer.eos_token_id, first_end + 1)
    assert tokenizer.decode(stream[first_end + 1 : second_end]) == rows[1]["instruction"] + "\n" + rows[1]["response"]
    assert tokenizer.pad_token_id not in stream, "packed: no padding anywhere"


def test_packed_data_goes_to_the_trainer_as_it_is(tmp_path):
    model, tokenizer = load_model("embedded")
    train_data = pack_course_data(tokenizer, 32)
    batch = default_data_collator([train_data[0], train_data[1]])
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 32)
    args = TrainingArguments(
        str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    result = Trainer(model=model, args=args, train_dataset=train_data).train()
    assert result.global_step == 2 and math.isfinite(result.training_loss)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "256"])
def test_a_bad_seq_len_says_what_works(tokenizer, bad):
    with pytest.raises(ValueError, match=r"seq_len is the number of tokens per sequence, a positive int"):
        pack_course_data(tokenizer, bad)


def test_a_seq_len_longer_than_the_dataset_says_how_long_it_is(tokenizer):
    with pytest.raises(ValueError, match=r"is [\d,]+ tokens .* seq_len=10,000,000; use a seq_len of at most [\d,]+"):
        pack_course_data(tokenizer, 10_000_000)


def test_a_tokenizer_without_an_end_of_text_token_is_refused():
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="no end-of-text token.*tokenizer.eos_token"):
        pack_course_data(tokenizer, 32)
