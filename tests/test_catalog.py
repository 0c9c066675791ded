"""helpers.catalog: the names students type find the catalog entry with the same shapes, and say what else differs."""

import pytest

from helpers.catalog import load_catalog, model_key, model_notes, nearest_models, resolve_model
from helpers.estimate import shape_of


@pytest.mark.parametrize(
    ("asked", "name", "variant"),
    [
        ("Llama-3-8B", "Llama-3.1-8B", "Llama-3-8B"),
        ("Meta-Llama-3-8B-Instruct", "Llama-3.1-8B", "Llama-3-8B"),
        ("meta-llama/Meta-Llama-3-8B", "Llama-3.1-8B", "Llama-3-8B"),
        ("llama3-8b", "Llama-3.1-8B", "Llama-3-8B"),
        ("meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B", ""),
        ("Qwen2.5-7B-Instruct", "Qwen2.5-7B", ""),
        ("unsloth/Qwen2.5-7B-bnb-4bit", "Qwen2.5-7B", ""),
        ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B", ""),
        ("google/gemma-2-2b-it", "Gemma-2-2B", ""),
        ("Mistral-7B-Instruct-v0.3", "Mistral-7B-v0.3", ""),
        ("mistralai/Mistral-7B-Instruct-v0.2", "Mistral-7B", "Mistral-7B-v0.2"),
        ("Qwen3-8B-Base", "Qwen3-8B", ""),
    ],
)
def test_base_and_instruct_names_resolve_to_the_entry_with_the_same_shapes(asked, name, variant):
    match = resolve_model(asked)
    assert (match.name, match.variant) == (name, variant)
    assert shape_of(asked) == shape_of(name), "the same shapes: the same estimate"
    assert match.note.startswith(asked) and name in match.note, "the student is told what the name was read as"


def test_a_variant_says_what_differs_from_its_entry_and_counts_its_own_vocabulary():
    llama3 = resolve_model("Llama-3-8B").note
    assert "has the shapes of the catalog's Llama-3.1-8B" in llama3
    assert "context 8,192 tokens (Llama-3.1-8B: 131,072)" in llama3 and "no RoPE scaling" in llama3
    code = resolve_model("codellama/CodeLlama-7b-Instruct-hf")
    assert "except its vocabulary 32,016 (Llama-2-7B: 32,000)" in code.note
    vocab = shape_of("CodeLlama-7B").vocab - shape_of("Llama-2-7B").vocab
    assert vocab == 16 and shape_of("CodeLlama-7B").parameters - shape_of("Llama-2-7B").parameters == 2 * 16 * 4096


def test_every_name_and_hub_id_in_the_catalog_resolves_to_itself():
    """No two entries share a key: each name, Hub id and variant finds its own."""
    for name, entry in load_catalog("models").items():
        for text in (name, entry["hub_id"].upper()):
            assert (resolve_model(text).name, resolve_model(text).note) == (name, ""), text
        for variant, v in entry.get("variants", {}).items():
            for text in (variant, v["hub_id"]):
                assert (resolve_model(text).name, resolve_model(text).variant) == (name, variant), text


def test_an_unknown_name_gets_the_nearest_catalog_names():
    assert nearest_models("Mistral-9B")[0] == "Mistral-7B" and "Llama-3.1-8B" in nearest_models("Llama-3.2-8B")
    with pytest.raises(ValueError, match=r"unknown model 'Llama-4-8B': .*the nearest are Llama-3-8B, Llama-3.1-8B"):
        resolve_model("Llama-4-8B")
    assert model_key("Meta-Llama-3.1-8B-Instruct") == model_key("llama_3.1_8b") == "llama-3.1-8b"


def test_a_seq_len_beyond_a_variants_context_is_said_once_by_the_estimate():
    from helpers.estimate import estimate_training_memory

    assert estimate_training_memory("Llama-3.1-8B", per_device_batch=1, seq_len=16384).context_note == ""
    variant = estimate_training_memory("Meta-Llama-3-8B-Instruct", per_device_batch=1, seq_len=16384)
    assert variant.context_note.startswith("seq_len 16,384 is past Llama-3-8B's trained context of 8,192 tokens")
    assert len(model_notes("Meta-Llama-3-8B-Instruct")) == 1, "the variant's differences; the context is the estimate's"
    assert model_notes("Qwen/Qwen3-32B") == [] and model_notes({"model_type": "llama"}) == []
