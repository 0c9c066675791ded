"""The estimator's terms keyed by library versions (helpers/estimate/_versions.py, issue 36).

Each boundary is held just below and at the release that changed it: the estimate moves by exactly
the term, named by its tensors. The installed versions and the kit's pins (requirements.txt) give
today's estimate, unchanged. The transformers boundaries were measured on the CPU allocator with
each release's own modeling code (the figures in the comments); these tests only read the
estimator: pure Python, no model runs.
"""

import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

from helpers.estimate import Harness, estimate_training_memory, shape_of
from helpers.estimate._versions import PACKAGES, TERMS, Term, harness_for, installed_versions

ROOT = Path(__file__).resolve().parents[1]
B, S = 4, 4096  # the issue's example: batch 4 x 4,096 tokens with Llama 2's 32k vocabulary
N, ROWS = B * S, B * (S - 1)  # the positions; those a loss on the logits shifted by one reads
# jobs across the families, the loops and the precisions: none may move at the kit's versions
JOBS = [
    ("SmolLM2-135M", dict(per_device_batch=2, seq_len=512, method="lora")),
    ("SmolLM2-135M", dict(per_device_batch=2, seq_len=512, method="lora", loop="custom", precision="fp32")),
    ("Llama-2-7B", dict(per_device_batch=1, seq_len=1024, method="qlora", checkpointing=True)),
    ("Mistral-7B", dict(per_device_batch=1, seq_len=512, method="qlora", precision="bf16-true")),
    ("gpt2", dict(per_device_batch=4, seq_len=512, method="full", precision="fp16")),
    ("pythia-160m", dict(per_device_batch=2, seq_len=256, method="lora", loop="custom")),
    ("bert-large", dict(per_device_batch=4, seq_len=512, method="full", precision="fp32")),
]


def estimate(versions, model="Llama-2-7B", model_type="llama", **settings):
    """The estimate under `versions`: the issue's job (a QLoRA step, checkpointed, bf16) unless told."""
    job = dict(per_device_batch=B, seq_len=S, method="qlora", checkpointing=True) | settings
    return estimate_training_memory(model, harness=harness_for(versions, model_type=model_type), **job)


def pins() -> dict:
    """The versions requirements.txt forces on the students."""
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.txt").read_text(), re.M))


def test_installed_versions_reads_the_installed_packages_and_none_for_a_missing_one():
    found = installed_versions()
    assert list(found) == list(PACKAGES)
    assert found == {name: metadata.distribution(name).version for name in PACKAGES}
    assert installed_versions(("peft", "no-such-package-here")) == {
        "peft": metadata.version("peft"),
        "no-such-package-here": None,
    }


@pytest.mark.parametrize("versions", [pins, installed_versions], ids=["requirements.txt", "installed"])
def test_the_kits_versions_give_todays_estimate_unchanged(versions):
    kit = versions()
    assert set(PACKAGES) <= set(kit)
    for model_type in ("llama", "mistral", "qwen2", "gemma", "phi3", "gpt2", "gpt_neox", "neox", "bert"):
        assert harness_for(kit, model_type=model_type) == Harness()
    for model, job in JOBS:
        assert estimate_training_memory(model, harness=harness_for(kit), **job) == estimate_training_memory(
            model, **job
        )


def test_transformers_4_31_upcast_llamas_logits_in_the_forward():
    """Llama 2's release made the forward return fp32 logits: 4 bytes a logit for 2, and the loss's
    shifted copy in fp32 instead of 16 bits plus cross_entropy's own fp32 cast of it."""
    vocab = shape_of("Llama-2-7B").vocab
    before, at = estimate({"transformers": "4.30.2"}), estimate({"transformers": "4.31.0"})
    assert before.logits == (2 * N + 2 * ROWS + 4 * ROWS) * vocab
    assert at.logits == (4 * N + 4 * ROWS) * vocab


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma", "gemma2", "phi3"])
def test_transformers_4_46_keeps_one_more_16bit_copy_of_the_logits(model_type):
    """4.45 upcast the logits in the forward and let the 16-bit ones go; 4.46 returns the 16-bit logits
    and upcasts them in ForCausalLMLoss: both alive at the loss (measured: +8,192,000 bytes, 2 x 64 x
    32000 x 2, over one step of a tiny bf16 Llama, 4.45.2 -> 4.46.0). These modeling files moved
    together; Llama 2's shape stands in for each."""
    before, at = (estimate({"transformers": v}, model_type=model_type) for v in ("4.45.2", "4.46.0"))
    one_copy = B * S * shape_of("Llama-2-7B").vocab * 2  # 1.05 GB: the figure
    assert one_copy == 1_048_576_000
    assert at.logits - before.logits == one_copy and at.allocated - before.allocated == one_copy


def test_mistral_moved_to_the_shared_loss_two_releases_later():
    logits = {v: estimate({"transformers": v}, "Mistral-7B", "mistral").logits for v in ("4.45.2", "4.47.1", "4.48.0")}
    one_copy = B * S * shape_of("Mistral-7B").vocab * 2
    assert logits["4.47.1"] == logits["4.45.2"] and logits["4.48.0"] - logits["4.47.1"] == one_copy


def test_transformers_4_49_drops_the_shifted_fp32_copy():
    """Until 4.49 ForCausalLMLoss copied the upcast logits shifted by one (`.contiguous()`); 4.49 shifts
    the labels instead. The loss then reads every position, so the line becomes the start of the
    backward: its two fp32 gradients (measured: 4.48.3 -> 4.49.0 peaks 1776 -> 1536 x vocab bytes at
    2 x 64 tokens, (6n + 8(n - b)) -> 12n with the log-probs)."""
    vocab = shape_of("Llama-2-7B").vocab
    before, at = estimate({"transformers": "4.48.3"}), estimate({"transformers": "4.49.0"})
    shifted = 4 * ROWS * vocab  # per_device_batch x (seq_len - 1) x vocab in fp32
    assert before.logits - shifted == (2 + 4) * N * vocab  # without it: the 16-bit logits and their upcast
    assert at.logits == 2 * 4 * N * vocab  # the loss's gradient and log_softmax's, fp32, over every position
    assert estimate({"transformers": "4.46.0"}) == estimate({"transformers": "4.48.2"})


def test_gpt2_and_gpt_neox_ran_their_loss_on_16bit_logits():
    """No upcast before their move to ForCausalLMLoss (GPT-2 4.48.3, GPT-NeoX 4.49): a 16-bit shifted copy,
    and under autocast cross_entropy's own fp32 cast of it (measured: +260 x vocab bytes at 2 x 64 tokens,
    4.48.2 -> 4.48.3, GPT-2 under CPU autocast: 4n - 2(n - b))."""
    b, s = 2, 64
    n, rows, vocab = b * s, b * (s - 1), shape_of("gpt2").vocab
    job = dict(per_device_batch=b, seq_len=s, method="full", precision="bf16", checkpointing=False)
    before, at = (estimate({"transformers": v}, "gpt2", "gpt2", **job) for v in ("4.48.2", "4.48.3"))
    assert before.logits == (2 * n + 2 * rows + 4 * rows) * vocab  # logits, shifted copy, autocast's fp32 cast
    assert at.logits - before.logits == (4 * n - 2 * rows) * vocab  # the upcast of all of them, shifted in fp32
    assert estimate({"transformers": "4.49.0"}, "gpt2", "gpt2", **job).logits == 8 * n * vocab  # as Llama's
    true_half = estimate({"transformers": "4.48.2"}, "gpt2", "gpt2", **(job | {"precision": "bf16-true"}))
    assert true_half.logits == (2 * n + 2 * rows) * vocab  # no fp32 at all: the loss ran in 16 bits
    neox = dict(job, method="lora")
    before, at = (estimate({"transformers": v}, "pythia-160m", "gpt_neox", **neox) for v in ("4.48.3", "4.49.0"))
    vocab = shape_of("pythia-160m").vocab
    assert before.logits == (2 * n + 6 * rows) * vocab and at.logits == 8 * n * vocab


def test_a_loop_that_keeps_the_output_held_fp32_logits_while_the_forward_upcast_them():
    custom = dict(loop="custom", checkpointing=False, method="lora", per_device_batch=1, seq_len=512)
    before, at = (estimate({"transformers": v}, "SmolLM2-135M", **custom) for v in ("4.45.2", "4.49.0"))
    assert before.output_held - at.output_held == 2 * 512 * shape_of("SmolLM2-135M").vocab  # fp32, not bf16


def test_bitsandbytes_0_43_2_stops_keeping_each_4bit_linears_input():
    """MatMul4Bit kept `ctx.tensors = (A, B)` through 0.43.1; 0.43.2 keeps (None, B). A ctx attribute is
    no saved tensor: non-reentrant checkpointing keeps it too, one bf16 input per 4-bit linear."""
    s = shape_of("Llama-2-7B")
    qv = dict(lora_targets=["q", "v"])
    before, at = estimate({"bitsandbytes": "0.43.1"}, **qv), estimate({"bitsandbytes": "0.43.2"}, **qv)
    # q, k, v read one input, then o's, the MLP's (gate and up read one) and down's, in every layer
    kept = 2 * N * s.layers * (s.hidden + s.heads * s.head_dim + s.hidden + s.intermediate)
    assert before.activations - at.activations == kept == before.activation_parts["4-bit inputs (kept on ctx)"]
    assert "4-bit inputs (kept on ctx)" not in at.activation_parts
    assert estimate({"bitsandbytes": "0.38.0"}, **qv) == at  # before 4-bit existed there was nothing to keep


def test_peft_0_12_casts_adapters_on_a_16bit_base_to_fp32():
    """peft 0.11 built the adapters in the base weights' dtype; 0.12 casts 16-bit ones to fp32
    (autocast_adapter_dtype). A 4-bit base's adapters were fp32 in both."""
    lora = dict(method="lora", per_device_batch=1, seq_len=512, checkpointing=False)
    before, at = (estimate({"peft": v}, "SmolLM2-135M", **lora) for v in ("0.11.1", "0.12.0"))
    p = at.trainable
    assert (at.weights - before.weights, at.gradients - before.gradients) == (2 * p, 2 * p)
    assert at.optimizer - before.optimizer == 2 * 2 * p  # AdamW's two moments, in the adapters' dtype
    qlora = [estimate({"peft": v}, "SmolLM2-135M", **(lora | {"method": "qlora"})) for v in ("0.11.1", "0.12.0")]
    assert qlora[0].allocated == qlora[1].allocated


def test_a_published_runs_versions_give_its_harness():
    """litgpt-A100's QLoRA rows ran bitsandbytes 0.41.1: the fact the case sets by hand follows from it."""
    litgpt = Harness(quantize_head=True, quant_dtype="fp16")
    assert harness_for({"bitsandbytes": "0.41.1"}, litgpt) == Harness(
        quantize_head=True, quant_dtype="fp16", quant_keeps_input=True
    )
    assert harness_for({"bitsandbytes": "0.43.2"}, litgpt) == litgpt == harness_for({}, litgpt)
    assert harness_for({"transformers": "4.49.0.dev0"}) == Harness()  # a dev build counts as its release


def test_each_term_names_its_source_and_no_two_terms_disagree():
    def span(t: Term) -> tuple[Version, Version]:  # [since, until), open sides as far as they go
        return Version(t.since or "0"), Version(t.until or "9999")

    for t in TERMS:  # the release compared; the commit too where the library's git history was read
        assert t.package in PACKAGES and t.facts
        assert re.search(r"\d+\.\d+", t.source) or t.source.startswith("as above"), t
        assert t.package == "transformers" or re.search(r"\b[0-9a-f]{8,9}\b", t.source), t
    for i, a in enumerate(TERMS):
        for b in TERMS[i + 1 :]:
            same_models = not a.models or not b.models or set(a.models) & set(b.models)
            overlap = span(a)[0] < span(b)[1] and span(b)[0] < span(a)[1]
            if a.package == b.package and same_models and overlap:
                assert not set(a.facts) & set(b.facts), (a, b)


def test_errors_say_what_to_pass():
    with pytest.raises(TypeError, match="pass a mapping"):
        harness_for("5.23.0")
    with pytest.raises(ValueError, match="transformers version 'five' is not a version number"):
        harness_for({"transformers": "five"})
    with pytest.raises(ValueError, match="not Harness facts"):
        Term("peft", None, "0.12.0", {"adapter_dtype": "bf16"})
    with pytest.raises(ValueError, match="logits_upcast='head' is not one of"):
        estimate_training_memory("gpt2", per_device_batch=1, seq_len=8, harness=Harness(logits_upcast="head"))
    with pytest.raises(ValueError, match="drop one of them"):
        estimate_training_memory(
            "gpt2", per_device_batch=1, seq_len=8, harness=Harness(loss_chunk=4, logits_shift_copy="fp32")
        )
