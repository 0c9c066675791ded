"""What the estimator reads, checked where it is read: hostile config fields, and jobs a model cannot run.

Every field of a config (a dict, a config.json, a transformers config, the catalog) is read into a
`Shape` through helpers/estimate/_fields.py: a value that cannot describe a model is a
`ModelConfigError` naming the field, the value, where it came from and what would work, never a
ZeroDivisionError or TypeError from deep in the walk, and never a negative bill that "fits". A seq_len
past a learned position table is refused; past a rotary model's trained context it is estimated and
said, wherever the verdict is shown.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.estimate import ModelConfigError, Shape, estimate_training_memory, shape_of
from helpers.job import JobSettingError
from helpers.plan import format_plan, plan

ROOT = Path(__file__).resolve().parents[1]
LLAMA = dict(
    model_type="llama",
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    intermediate_size=11008,
    vocab_size=32000,
)
BERT = dict(
    model_type="bert", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=99
)
JOB = dict(per_device_batch=1, seq_len=512)
# values no size can take, and why: each must be refused with the field, the value and a fix
HOSTILE = [0, -4, "4096", 4096.5, True, math.nan, math.inf, 2**63, [4096]]
SIZES = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
]
QUALITY = "the memory is as estimated, the model's quality there is not"


def estimate(model, **job):
    return estimate_training_memory(model, **{**JOB, **job})


def helpers_cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
@pytest.mark.parametrize("field", SIZES)
def test_a_size_that_is_not_a_whole_number_in_range_names_the_field_the_value_and_a_fix(field, value):
    with pytest.raises(ModelConfigError) as e:  # a ZeroDivisionError or TypeError would fail the test
        estimate({**LLAMA, field: value})
    said = str(e.value)
    assert said.startswith(f"{field}={value!r} in the config dict is "), said  # the field, its value, where
    assert f"pass {field}=" in said or f"pass e.g. {field}=" in said or f", e.g. {field}=" in said, said  # a fix


def test_the_messages_say_what_would_work():
    cases = {
        0: "num_attention_heads=0 in the config dict is out of range: pass a whole number from 1 to 16,384, "
        "e.g. num_attention_heads=32",
        "4096": "num_attention_heads='4096' in the config dict is not a whole number: "
        "pass num_attention_heads=4096 (a number, not text)",
        4096.5: "num_attention_heads=4096.5 in the config dict is not a whole number: pass e.g. num_attention_heads=32",
        True: "num_attention_heads=True in the config dict is not a whole number: pass e.g. num_attention_heads=32",
    }
    for value, message in cases.items():
        with pytest.raises(ModelConfigError) as e:
            shape_of({**LLAMA, "num_attention_heads": value})
        assert str(e.value) == message
    with pytest.raises(ModelConfigError, match=r"^num_hidden_layers=-4 in the config dict is out of range"):
        estimate({**LLAMA, "num_hidden_layers": -4})  # no longer a negative bill that "fits"
    with pytest.raises(ModelConfigError, match=r"^vocab_size=9223372036854775808 in .* from 1 to 16,777,216"):
        estimate({**LLAMA, "vocab_size": 2**63})


def test_a_missing_or_null_size_says_which_and_where():
    for config in ({k: v for k, v in LLAMA.items() if k != "hidden_size"}, {**LLAMA, "hidden_size": None}):
        with pytest.raises(ValueError, match=r"the llama config lacks 'hidden_size'.*; read from the config dict"):
            estimate(config)


def test_a_whole_float_is_a_whole_number():
    assert shape_of({**LLAMA, "hidden_size": 4096.0}) == shape_of(LLAMA)
    assert isinstance(shape_of({**LLAMA, "hidden_size": 4096.0}).hidden, int)


def test_heads_must_divide_what_they_split():
    with pytest.raises(ModelConfigError) as e:
        shape_of({**LLAMA, "num_attention_heads": 3})
    assert str(e.value) == (
        "num_attention_heads=3 does not divide hidden_size=4096 in the config dict: each head takes "
        "hidden_size / num_attention_heads dimensions; pass a divisor of 4096 such as num_attention_heads=4, "
        "or give head_dim"
    )
    with pytest.raises(ModelConfigError, match=r"num_key_value_heads=5 does not divide num_attention_heads=32 .*=4$"):
        shape_of({**LLAMA, "num_key_value_heads": 5})
    with pytest.raises(ModelConfigError, match=r"num_key_value_heads=64 does not divide num_attention_heads=32"):
        shape_of({**LLAMA, "num_key_value_heads": 64})
    with pytest.raises(ModelConfigError, match=r"n_head=5 does not divide n_embd=768 .* such as n_head=6"):
        shape_of(dict(model_type="gpt2", n_embd=768, n_layer=2, n_head=5, vocab_size=99, n_positions=64))
    # Gemma's heads are head_dim wide whatever the hidden size: no division asked
    assert shape_of({**LLAMA, "num_attention_heads": 3, "head_dim": 128}).head_dim == 128


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(attention_dropout=1.5), r"^attention_dropout=1.5 in the config dict is not a dropout probability: "),
        (dict(attention_dropout=-0.1), r"^attention_dropout=-0.1 .* pass a number from 0 up to 1"),
        (dict(attention_dropout="0.1"), r"^attention_dropout='0.1' .* e.g. attention_dropout=0.1$"),
        (dict(resid_pdrop=math.nan), r"^resid_pdrop=nan .* not a dropout probability"),
        (dict(partial_rotary_factor=0), r"^partial_rotary_factor=0 .* not a fraction of each head"),
        (dict(rope_parameters={"partial_rotary_factor": 2}), r"^rope_parameters\['partial_rotary_factor'\]=2 "),
        (dict(rope_scaling="yarn"), r"^rope_scaling='yarn' in the config dict is not a table: pass a dict"),
        (dict(tie_word_embeddings="false"), r"^tie_word_embeddings='false' .* not true or false: pass .*=False$"),
        (dict(hidden_act=3), r"^hidden_act=3 in the config dict is not a name: pass e.g. hidden_act='silu'$"),
        (dict(_attn_implementation=3), r"^_attn_implementation=3 .* not a name: pass 'sdpa' or 'eager'$"),
        (dict(model_type="gemma2", head_dim=128, attn_logit_softcapping=-1.0), r"not a soft-capping bound"),
    ],
)
def test_settings_a_config_gives_are_checked_too(change, message):
    with pytest.raises(ModelConfigError, match=message):
        estimate({**LLAMA, **change})


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_labels=0), r"^num_labels=0 in the config dict is out of range: pass a whole number from 1 .*=2$"),
        (dict(num_labels=2.5), r"^num_labels=2.5 .* not a whole number"),
        (dict(id2label=5), r"^id2label=5 .* not a table: pass e.g. id2label="),
        (dict(type_vocab_size=-1), r"^type_vocab_size=-1 .* out of range"),
        (dict(hidden_dropout_prob=1.0), r"^hidden_dropout_prob=1.0 .* not a dropout probability"),
        (dict(max_position_embeddings="512"), r"^max_position_embeddings='512' .* pass max_position_embeddings=512"),
    ],
)
def test_a_classifier_needs_labels_and_its_other_fields_sane(change, message):
    with pytest.raises(ModelConfigError, match=message):
        estimate({**BERT, **change}, seq_len=64)
    assert shape_of({**BERT, "id2label": {0: "a", 1: "b", 2: "c"}}).num_labels == 3


def test_the_error_names_the_file_it_came_from(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_attention_heads": 0}))
    for model in (str(tmp_path), str(tmp_path / "config.json")):
        with pytest.raises(ModelConfigError, match=rf"^num_attention_heads=0 in {tmp_path / 'config.json'} is out"):
            shape_of(model)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"config.json holds a JSON list, not a config .*download"):
        shape_of(str(tmp_path))
    with pytest.raises(ValueError, match=r"does not know model_type \['llama'\]"):
        shape_of({**LLAMA, "model_type": ["llama"]})  # not an unhashable-type TypeError


def test_a_transformers_config_changed_after_it_was_made_is_named():
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128)
    config.num_attention_heads = 0  # transformers itself would divide by it
    with pytest.raises(ModelConfigError, match=r"^num_attention_heads=0 in the LlamaConfig is out of range"):
        estimate(config)


def test_a_shape_built_by_hand_or_changed_is_checked():
    with pytest.raises(ModelConfigError, match=r"^layers=-4 in the Shape is out of range"):
        Shape("llama", 64, -4, 4, 4, 16, 128, 99)
    with pytest.raises(ModelConfigError, match=r"^heads=0 in the shape of GPT-2 is out of range"):
        dataclasses.replace(shape_of("GPT-2"), heads=0)
    with pytest.raises(ModelConfigError, match=r"^family='mamba' in the Shape: pass one of llama, "):
        Shape("mamba", 64, 2, 4, 4, 16, 128, 99)
    with pytest.raises(ModelConfigError, match=r"^attn_dropout=2 in the Shape is not a dropout probability"):
        Shape("llama", 64, 2, 4, 4, 16, 128, 99, attn_dropout=2)


# --- positions: a learned table refuses a longer sequence; rotary runs, and is said to be past its context


def test_a_learned_position_table_refuses_a_longer_sequence():
    with pytest.raises(JobSettingError) as e:
        estimate("GPT-2", seq_len=4096)
    assert str(e.value) == (
        "seq_len=4096 is past GPT-2's 1,024 learned positions: its position table has no row beyond them, so the "
        "model cannot take a longer sequence; pass seq_len <= 1024 (or pick a model with rotary positions)"
    )
    assert estimate("GPT-2", seq_len=1024).total > 0
    with pytest.raises(JobSettingError, match=r"seq_len=513 is past bert-large's 512 learned positions.*<= 512"):
        plan("bert-large", "T4", per_device_batch=1, seq_len=513)
    config = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=99, n_positions=128)
    with pytest.raises(JobSettingError, match=r"past the model's 128 learned positions"):
        estimate(config, seq_len=256)


def test_past_a_rotary_models_trained_context_the_memory_stands_and_it_is_said():
    past, within = estimate("Llama-2-7B", seq_len=16384), estimate("Llama-2-7B", seq_len=4096)
    note = f"seq_len 16,384 is past Llama-2-7B's trained context of 4,096 tokens: {QUALITY}"
    assert past.context_note == note and within.context_note == ""
    unknown = dataclasses.replace(shape_of("Llama-2-7B"), context=0)  # the same model, its context not known
    assert past.total == estimate(unknown, seq_len=16384).total, "the note changes no figure"
    assert past.verdict_line("A100-80GB").endswith(f". Note: {note}") and note not in within.verdict_line("T4")
    steps = plan("Llama-2-7B", "A100-80GB", per_device_batch=1, seq_len=16384)
    text = format_plan(steps, "A100-80GB")
    assert text.count(note) == 1 and text.splitlines()[-1] == f"* {note}"
    assert all(" yes* " in line or " no* " in line for line in text.splitlines()[2:-1])


def test_a_configs_context_and_rope_scaling_are_read():
    config = {**LLAMA, "max_position_embeddings": 4096, "_name_or_path": "meta-llama/Llama-2-7b-hf"}
    assert estimate(config, seq_len=8192).context_note == (
        "seq_len 8,192 is past meta-llama/Llama-2-7b-hf's trained context of 4,096 tokens "
        f"(no rope_scaling in its config): {QUALITY}"
    )
    scaled = {**LLAMA, "max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert estimate(scaled, seq_len=65536).context_note == (
        "seq_len 65,536 is past the model's max_position_embeddings of 32,768 tokens, which its config's "
        f"rope_scaling (yarn, factor 4) may stretch (see the model card): {QUALITY}"
    )
    assert estimate(scaled, seq_len=32768).context_note == "" and estimate(LLAMA, seq_len=65536).context_note == ""
    gemma3 = {**LLAMA, "model_type": "gemma3_text", "head_dim": 128, "max_position_embeddings": 32768}
    gemma3["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0}, "sliding_attention": {}}
    assert shape_of(gemma3).rope_scaling == "linear, factor 8"


# --- the command line: exit 2 with the message, no traceback; the note where the verdict is


def test_the_cli_refuses_gpt2_past_its_positions_without_a_traceback():
    done = helpers_cli("plan", "--model", "gpt2", "--seq-len", "4096", "--gpu", "T4")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: seq_len=4096 is past GPT-2's 1,024 learned positions" in done.stderr
    assert "pass seq_len <= 1024" in done.stderr and done.stdout == ""


def test_the_cli_refuses_a_hostile_config_json_without_a_traceback(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "num_attention_heads": 0}))
    done = helpers_cli("plan", "--model", str(tmp_path / "config.json"), "--seq-len", "512", "--gpu", "T4")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "ZeroDivisionError" not in done.stderr
    assert f"error: num_attention_heads=0 in {tmp_path / 'config.json'} is out of range" in done.stderr


def test_the_cli_says_a_rotary_job_is_past_the_models_context_in_the_verdict_and_the_ladder():
    done = helpers_cli("plan", "--model", "Llama-2-7B", "--seq-len", "16384", "--gpu", "A100-80GB")
    assert done.returncode == 0, done.stderr
    note = f"seq_len 16,384 is past Llama-2-7B's trained context of 4,096 tokens: {QUALITY}"
    verdict = next(line for line in done.stdout.splitlines() if line.startswith("  does not fit: "))
    assert verdict.endswith(f"Note: {note}") and done.stdout.rstrip().endswith(f"* {note}")
