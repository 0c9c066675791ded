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


# ---------------------------------------------------------------------------------------------
# notebook 08's chat format: the loss on the answers only


def test_a_conversation_trains_on_its_answer_and_the_turns_end_only(tokenizer):
    from helpers.data import IGNORE_INDEX, chat_features, chat_prompt

    row = load_course_data()[0]
    features = chat_features(tokenizer, row["instruction"], row["response"], seq_len=512)
    prompt = tokenizer(chat_prompt(tokenizer, row["instruction"]), add_special_tokens=False)["input_ids"]
    ids, labels = features["input_ids"], features["labels"]
    assert len(ids) == len(labels) == len(features["attention_mask"]) and ids[: len(prompt)] == prompt
    assert labels[: len(prompt)] == [IGNORE_INDEX] * len(prompt), "every prompt token masked"
    assert labels[len(prompt) :] == ids[len(prompt) :], "every answer token kept"
    assert tokenizer.decode(labels[len(prompt) :]) == row["response"] + tokenizer.eos_token
    whole = tokenizer.apply_chat_template(
        [{"role": "user", "content": row["instruction"]}, {"role": "assistant", "content": row["response"]}],
        tokenize=False,
    )
    assert tokenizer.decode(ids) == whole


def test_the_loss_counts_the_answer_tokens_alone(tokenizer):
    """The Trainer's loss on a masked example equals cross-entropy over its answer tokens, computed by hand."""
    from helpers.data import chat_features

    model, _ = load_model("embedded")
    row = load_course_data()[1]
    f = chat_features(tokenizer, row["instruction"], row["response"], seq_len=512)
    ids, labels = torch.tensor([f["input_ids"]]), torch.tensor([f["labels"]])
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss
        logits = model(input_ids=ids).logits[0, :-1]
    start = sum(label == -100 for label in f["labels"])
    by_hand = torch.nn.functional.cross_entropy(logits[start - 1 :], ids[0, start:])
    assert torch.allclose(loss, by_hand, rtol=1e-5), (loss.item(), by_hand.item())


def test_a_prompt_that_fills_seq_len_drops_its_example_saying_so(tokenizer, capsys):
    from datasets import Dataset

    from helpers.data import chat_dataset

    rows = Dataset.from_list(
        [{"instruction": "word " * 300, "response": "yes"}, {"instruction": "hi", "response": "yo"}]
    )
    kept = chat_dataset(rows, tokenizer, seq_len=64)
    assert len(kept) == 1 and "1 of 2 examples dropped: their prompt fills all of seq_len=64" in capsys.readouterr().out
    assert all(len(ids) <= 64 for ids in chat_dataset(rows.select([1]), tokenizer, seq_len=64)["input_ids"])


def test_a_tokenizer_without_a_chat_template_or_with_one_that_moves_the_prompt_is_refused():
    from helpers.data import chat_features

    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="has no chat template.*set tokenizer.chat_template"):
        chat_features(tokenizer, "q", "a", seq_len=64)
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    )
    with pytest.raises(ValueError, match="does not start with its own generation prompt"):
        chat_features(tokenizer, "q", "a", seq_len=64)
