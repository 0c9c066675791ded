"""helpers.data's chat rows (notebook 08, the exported train.py): every row checked before any tokenizing, the
shapes users have (a Dataset, a list of dicts, a dict of lists; instruction/response or messages) giving the same
features, and no example without an answer token reaching the Trainer."""

import math
import re

import pytest
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

from helpers import data
from helpers.data import (
    IGNORE_INDEX,
    ChatDataError,
    SeqLenTooShort,
    chat_dataset,
    chat_features,
    chat_prompt,
    load_course_data,
)
from helpers.models import EMBEDDED_DIR, load_model

OK = {"instruction": "What is LoRA?", "response": "A low-rank adapter."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)


@pytest.fixture(scope="module")
def course_rows():
    return load_course_data().select(range(12))


def refusal(rows, tokenizer, seq_len=512):
    with pytest.raises(ChatDataError) as caught:
        chat_dataset(rows, tokenizer, seq_len)
    return str(caught.value)


# ---------------------------------------------------------------------------------------------
# 1. each hostile value: the row, the column, the value's type and repr, the fix


HOSTILE = [
    (None, "None"),
    (3.5, "a float: 3.5"),
    (42, "an int: 42"),
    ("", "an empty str"),
    ("   ", "only whitespace: '   '"),
    (["a", "b"], "a list: ['a', 'b']"),
    ({"text": "x"}, "a dict: {'text': 'x'}"),
]


@pytest.mark.parametrize("column", ["instruction", "response"])
@pytest.mark.parametrize(("value", "shown"), HOSTILE)
def test_a_hostile_value_names_its_row_column_type_and_fix(tokenizer, column, value, shown):
    message = refusal([OK, {**OK, column: value}, OK], tokenizer)
    assert message.startswith(f"rows[1][{column!r}] is {shown}; each row needs 'instruction'"), message
    assert message.endswith("Fix row 1 or leave it out: rows = [r for i, r in enumerate(rows) if i not in {1}]")


def test_a_long_value_is_shortened(tokenizer):
    message = refusal([{**OK, "response": ["word"] * 100}], tokenizer)
    assert "is a list: ['word', 'word'," in message and "..." in message and message.count("word") < 20


def test_a_missing_column_names_the_keys_the_row_has(tokenizer):
    message = refusal([OK, {"instruction": "q"}], tokenizer)
    assert message.startswith("rows[1] has no 'response' (its keys: ['instruction'])"), message


def test_every_bad_row_is_counted_and_the_fix_uses_the_callers_own_container(tokenizer):
    bad = Dataset.from_list([OK, {**OK, "response": None}, OK, {**OK, "instruction": None}])
    message = refusal(bad, tokenizer)
    assert message.startswith("rows[1]['response'] is None;")
    assert "2 of 4 rows have such a problem (rows 1, 3)" in message
    assert message.endswith("rows = rows.select([i for i in range(len(rows)) if i not in {1, 3}])")
    # the fix it prints works
    fixed = {"rows": bad}
    exec(message.split("leave them out: ")[1], fixed)
    assert len(chat_dataset(fixed["rows"], tokenizer, 512)) == 2

    many = [{**OK, "response": None}] * 30
    message = refusal(many, tokenizer)
    assert "30 of 30 rows have such a problem (rows 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...)" in message
    assert message.endswith("rows = [r for r in rows if ok(r)]")


def test_a_dict_of_columns_names_the_value_as_the_caller_writes_it(tokenizer):
    message = refusal({"instruction": ["q", "q"], "response": ["a", None]}, tokenizer)
    assert message.startswith("rows['response'][1] is None;"), message


def test_rows_are_checked_before_any_tokenizing(tokenizer, monkeypatch):
    def tokenizing(*args):
        raise AssertionError("tokenized before every row was checked")

    monkeypatch.setattr(data, "_features", tokenizing)
    with pytest.raises(ChatDataError, match=r"rows\[40\]\['response'\] is None"):
        chat_dataset([OK] * 40 + [{**OK, "response": None}], tokenizer, 512)


# ---------------------------------------------------------------------------------------------
# 2. messages rows: roles in order, each content text


@pytest.mark.parametrize(
    ("turns", "start"),
    [
        ([assistant("a"), user("q")], "rows[0]['messages'][0]['role'] is 'assistant' where 'user' must come"),
        ([user("q"), user("q2"), assistant("a")], "rows[0]['messages'][1]['role'] is 'user' where 'assistant'"),
        ([user("q"), {"role": "tool", "content": "x"}], "rows[0]['messages'][1]['role'] is 'tool' where 'assistant'"),
        ([user("q"), assistant("a"), {"role": "system", "content": "s"}], "rows[0]['messages'][2]['role'] is 'system'"),
        ([user("q"), assistant("a"), user("q2")], "rows[0]['messages'] ends with a 'user' turn, with no assistant"),
        ([user("q"), assistant(None)], "rows[0]['messages'][1]['content'] is None;"),
        ([user(""), assistant("a")], "rows[0]['messages'][0]['content'] is an empty str;"),
        ([user("q"), assistant(7)], "rows[0]['messages'][1]['content'] is an int: 7;"),
        (
            [user("q"), {"role": "assistant"}],
            "rows[0]['messages'][1] is not a {'role', 'content'} turn (keys ['role'])",
        ),
        ([{"from": "human", "value": "q"}], "rows[0]['messages'][0] is not a {'role', 'content'} turn (keys ['from',"),
        ("hello", "rows[0]['messages'] is a str: 'hello', where a list of turns is needed"),
        ([], "rows[0]['messages'] is an empty list, where a list of turns is needed"),
    ],
)
def test_messages_out_of_order_or_without_text_are_refused_by_row(tokenizer, turns, start):
    message = refusal([{"messages": turns}], tokenizer)
    assert message.startswith(start), message
    assert "each row's 'messages' go: system turns if any, then 'user' and 'assistant' in turn" in message


def test_system_turns_are_refused_where_the_template_has_no_place_for_them():
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)
    rows = [
        {"messages": [user("q"), assistant("a")]},
        {"messages": [{"role": "system", "content": "Be brief."}, user("q"), assistant("a")]},
    ]
    assert len(chat_dataset(rows, tokenizer, 512)) == 2  # the embedded template renders system turns
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "{%- for",
        "{%- if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{%- endif %}{%- for",
        1,
    )
    with pytest.raises(
        ChatDataError,
        match=r"rows\[1\]\['messages'\]\[0\] is a system turn, .*System role not "
        r"supported.*first user turn, or drop the system turns",
    ):
        chat_dataset(rows, tokenizer, 512)
    assert len(chat_dataset(rows[:1], tokenizer, 512)) == 1, "without system turns the template still serves"


# ---------------------------------------------------------------------------------------------
# 3. the container: what is accepted, and what a wrong one is told


def test_neither_shape_names_the_columns_there_are_and_the_rename(tokenizer):
    message = refusal(Dataset.from_list([{"question": "q", "answer": "a", "id": 1}]), tokenizer)
    assert message == (
        "rows has columns ['question', 'answer', 'id'], and chat_dataset needs 'instruction' and 'response' (a "
        "question and its answer a row) or 'messages' (a list of {'role': ..., 'content': ...} turns); rename "
        "yours, e.g. rows = rows.rename_columns({'question': 'instruction', 'answer': 'response'})"
    )
    assert refusal([{"text": "q"}], tokenizer).startswith("rows has columns ['text'], and chat_dataset needs")


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (Dataset.from_list([]), "rows is empty (0 rows): nothing to train on"),
        ([], "rows is empty (0 rows): nothing to train on"),
        (Dataset.from_dict({"instruction": [], "response": []}), "rows is empty (0 rows, columns ['instruction', "),
        ("hello", "rows is a str; chat_dataset takes a datasets.Dataset (one split), a list of dicts or a dict of"),
        (["a", "b"], "rows[0] is a str: 'a'; each row of a list should be a dict such as"),
        ({"instruction": ["q", "q"], "response": ["a"]}, "a dict of rows should hold columns, lists of one length"),
        ({"instruction": "q", "response": "a"}, "a dict of rows should hold columns, lists of one length each; rows"),
        (DatasetDict(train=Dataset.from_list([OK])), "rows is a DatasetDict of splits ['train']: pass one split, e.g."),
        ([{**OK, "messages": [user("q"), assistant("a")]}], "rows has both 'instruction'/'response' and 'messages'"),
    ],
)
def test_a_wrong_container_says_what_is_taken(tokenizer, rows, message):
    assert refusal(rows, tokenizer).startswith(message)


def test_a_list_a_dict_of_lists_and_messages_give_the_features_of_the_dataset(tokenizer, course_rows):
    expected = chat_dataset(course_rows, tokenizer, 128).to_list()
    assert expected == [chat_features(tokenizer, r["instruction"], r["response"], 128) for r in course_rows]
    as_list = [{"instruction": r["instruction"], "response": r["response"]} for r in course_rows]
    as_columns = {"instruction": course_rows["instruction"], "response": list(course_rows["response"])}
    as_messages = [{"messages": [user(r["instruction"]), assistant(r["response"])]} for r in course_rows]
    for rows in (as_list, as_columns, as_messages, Dataset.from_list(as_messages)):
        assert chat_dataset(rows, tokenizer, 128).to_list() == expected


def test_every_assistant_turn_trains_and_every_other_turn_is_masked(tokenizer):
    turns = [{"role": "system", "content": "Be brief."}, user("q1"), assistant("a1"), user("q2"), assistant("a2")]
    (example,) = chat_dataset([{"messages": turns}], tokenizer, 512)
    ids, labels = example["input_ids"], example["labels"]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(turns, tokenize=False)
    trained = [i for i, label in zip(ids, labels) if label != IGNORE_INDEX]
    assert tokenizer.decode(trained) == "a1<|eos|>a2<|eos|>"
    assert all(label in (IGNORE_INDEX, i) for i, label in zip(ids, labels))
    # the second prompt is masked where it stands: what the model is asked after the first answer
    second_prompt = tokenizer.apply_chat_template(turns[:4], tokenize=False, add_generation_prompt=True)
    start = len(tokenizer(second_prompt, add_special_tokens=False)["input_ids"])
    assert labels[start - 1] == IGNORE_INDEX and labels[start] != IGNORE_INDEX


def test_a_template_that_rewrites_earlier_turns_cannot_cut_the_answers_apart():
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED_DIR, local_files_only=True)
    # like templates that drop earlier answers' reasoning: the last turn is rendered apart from the others
    tokenizer.chat_template = (
        "{%- for m in messages %}{{ m['role'] }}:{{ m['content'] if loop.last or m['role'] != 'assistant' else '' }}"
        "\n{%- endfor %}{%- if add_generation_prompt %}assistant:{%- endif %}"
    )
    rows = [{"messages": [user("q1"), assistant("a1"), user("q2"), assistant("a2")]}]
    with pytest.raises(ValueError, match="renders the earlier turns differently once another follows"):
        chat_dataset(rows, tokenizer, 512)


# ---------------------------------------------------------------------------------------------
# 4. no example and no batch without an answer token


def prompt_tokens(tokenizer, instruction):
    return len(tokenizer(chat_prompt(tokenizer, instruction), add_special_tokens=False)["input_ids"])


def test_when_every_prompt_fills_seq_len_the_error_names_the_shortest(tokenizer, course_rows, capsys):
    prompts = [prompt_tokens(tokenizer, r["instruction"]) for r in course_rows]
    shortest, longest = min(prompts), max(prompts)
    with pytest.raises(SeqLenTooShort) as caught:
        chat_dataset(course_rows, tokenizer, shortest)
    error = caught.value
    assert isinstance(error, ValueError) and (error.seq_len, error.shortest_prompt, error.longest_prompt) == (
        shortest,
        shortest,
        longest,
    )
    assert str(error) == (
        f"all 12 examples would be dropped: the shortest prompt is {shortest} tokens, so seq_len={shortest} leaves "
        f"no answer token to train on in any; use a seq_len above {shortest} (above {longest}, the longest prompt, "
        "keeps every row)"
    )
    # one token more keeps the rows with the shortest prompt, one answer token each, and says how many went
    kept = chat_dataset(course_rows, tokenizer, shortest + 1)
    assert len(kept) == prompts.count(shortest)
    assert all(sum(label != IGNORE_INDEX for label in labels) == 1 for labels in kept["labels"])
    dropped = len(prompts) - prompts.count(shortest)
    assert (
        f"{dropped} of 12 examples dropped: their prompt fills all of seq_len={shortest + 1}" in capsys.readouterr().out
    )
    assert len(chat_dataset(course_rows, tokenizer, longest + 1)) == 12


@pytest.mark.parametrize("seq_len", [1, 8, 24, 40, 64, 96])
def test_no_example_at_any_seq_len_has_no_answer_token(tokenizer, course_rows, seq_len):
    try:
        examples = chat_dataset(course_rows, tokenizer, seq_len)
    except SeqLenTooShort as e:
        assert seq_len <= e.shortest_prompt
        return
    for labels in examples["labels"]:
        assert len(labels) <= seq_len and any(label != IGNORE_INDEX for label in labels[1:])  # position 0 never counts


def test_chat_features_called_directly_refuses_what_chat_dataset_would_drop(tokenizer):
    shortest = prompt_tokens(tokenizer, OK["instruction"])
    with pytest.raises(
        SeqLenTooShort, match=f"the prompt is {shortest} tokens, so seq_len={shortest} leaves no answer"
    ):
        chat_features(tokenizer, OK["instruction"], OK["response"], shortest)
    assert len(chat_features(tokenizer, OK["instruction"], OK["response"], shortest + 1)["labels"]) == shortest + 1
    for value, shown in HOSTILE:
        with pytest.raises(ChatDataError, match=re.escape(f"response is {shown}; it should be a str with some text")):
            chat_features(tokenizer, OK["instruction"], value, 64)
        with pytest.raises(ChatDataError, match=re.escape(f"instruction is {shown}; it should be a str")):
            chat_prompt(tokenizer, value)


def test_every_logged_loss_and_grad_norm_is_nonzero_when_answers_are_cut(tokenizer, course_rows, tmp_path):
    """The symptom this guards against: a batch with no answer token logs loss 0 and grad norm 0."""
    model, _ = load_model("embedded")
    prompts = sorted(prompt_tokens(tokenizer, r["instruction"]) for r in course_rows)
    train = chat_dataset(course_rows, tokenizer, prompts[len(prompts) // 2] + 1)  # about half the rows cut entirely
    args = TrainingArguments(
        str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=DataCollatorForSeq2Seq(tokenizer))
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 4
    assert all(entry["loss"] > 0 and entry["grad_norm"] > 0 and math.isfinite(entry["loss"]) for entry in logged)
