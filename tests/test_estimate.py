"""The estimator against measurement: exact bytes on CPU for four architecture families.

Activations are measured with saved-tensor hooks (helpers.memory.track_saved_tensors), the
definition the estimator predicts; weights, gradients and optimizer states by summing the bytes
of the real tensors after a real AdamW step.
"""

import itertools
import statistics
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GemmaConfig, GPT2Config, LlamaConfig, Qwen2Config

from helpers import estimate as est
from helpers.estimate import estimate_training_memory, format_plan, plan, shape_of
from helpers.memory import track_saved_tensors

FAMILIES = {
    "llama": lambda: LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2),
    "qwen2": lambda: Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4),
    "gemma": lambda: GemmaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "gpt2": lambda: GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=256),  # dropout 0.1
}
SIZES = [(1, 16), (2, 64), (4, 128)]  # (batch, seq_len)


def build(family, impl):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(FAMILIES[family](), attn_implementation=impl)
    return model.train()


def measured_activations(model, batch, seq_len, autocast, checkpointing):
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()
    ids = torch.randint(3, model.config.vocab_size, (batch, seq_len))
    with track_saved_tensors(model) as saved, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(input_ids=ids, labels=ids)
    return saved.bytes


@pytest.fixture(scope="module")
def activation_errors():
    """Relative error of predicted activations over 96 configurations (about 6 s on 2 cores)."""
    rows = []
    for family, impl in itertools.product(FAMILIES, ("eager", "sdpa")):
        model = build(family, impl)
        for (b, t), autocast, ckpt in itertools.product(SIZES, (False, True), (False, True)):
            measured = measured_activations(model, b, t, autocast, ckpt)
            predicted = estimate_training_memory(model.config, batch_size=b, seq_len=t, checkpointing=ckpt,
                                                 precision="bf16" if autocast else "fp32", device="cpu").activations
            rows.append(((family, impl, b, t, autocast, ckpt), (predicted - measured) / measured))
    return rows


def test_activations_within_5_percent_median_and_10_worst(activation_errors):
    errors = [abs(e) for _, e in activation_errors]
    worst = max(activation_errors, key=lambda r: abs(r[1]))
    assert len(errors) == 96
    assert statistics.median(errors) < 0.05
    assert max(errors) < 0.10, f"worst case {worst[0]}: {worst[1]:+.1%}"


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_predicted_within_5_percent_everywhere(activation_errors, family):
    errors = {cfg: e for cfg, e in activation_errors if cfg[0] == family}
    bad = {cfg: f"{e:+.1%}" for cfg, e in errors.items() if abs(e) >= 0.05}
    assert not bad, bad


def test_checkpointing_and_bf16_move_activations_the_way_the_lesson_says():
    e = est.estimate_training_memory("SmolLM2-135M", batch_size=4, seq_len=512, precision="fp32", device="cuda")
    bf16 = est.estimate_training_memory("SmolLM2-135M", batch_size=4, seq_len=512, precision="bf16")
    ckpt = est.estimate_training_memory("SmolLM2-135M", batch_size=4, seq_len=512, precision="bf16", checkpointing=True)
    assert ckpt.activations < bf16.activations / 3 and bf16.activations < e.activations
    assert ckpt.recompute > 0 and bf16.recompute == 0  # one layer is rebuilt during backward


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_gradients_and_adamw_states_are_exact(family):
    model = build(family, "sdpa")
    e = estimate_training_memory(model.config, batch_size=2, seq_len=16, precision="fp32", device="cpu")
    ids = torch.randint(3, 512, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt = torch.optim.AdamW(model.parameters())
    opt.step()
    assert e.parameters == sum(p.numel() for p in model.parameters())
    assert e.weights == sum(p.nbytes for p in model.parameters())
    assert e.gradients == sum(p.grad.nbytes for p in model.parameters())
    moments = sum(s[k].nbytes for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
    assert e.optimizer == moments  # plus a 4-byte step counter per tensor, which it leaves out


@pytest.mark.parametrize("name", sorted(est.load_catalog("models")))
def test_catalog_parameter_counts_match_transformers(name):
    """Build each catalog model on the meta device (no memory, no download) and count."""
    shape = shape_of(name)
    if shape.family == "gpt2":
        config = GPT2Config(vocab_size=shape.vocab, n_embd=shape.hidden, n_layer=shape.layers, n_head=shape.heads,
                            n_positions=shape.max_positions)
    else:
        from transformers import AutoConfig

        kind = {"llama": "qwen2" if shape.qkv_bias else "llama", "gemma": "gemma2", "phi3": "phi3"}[shape.family]
        config = AutoConfig.for_model(kind, vocab_size=shape.vocab, hidden_size=shape.hidden,
                                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                                      num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim,
                                      intermediate_size=shape.intermediate, tie_word_embeddings=shape.tied)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())
    extra = 2 * shape.layers * shape.hidden if shape.family == "gemma" else 0  # Gemma-2's post-norms
    assert shape.parameters + extra == real


def test_lora_trainable_parameters_match_peft():
    from peft import LoraConfig, get_peft_model

    model = build("llama", "sdpa")
    peft_model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    e = estimate_training_memory(model.config, batch_size=1, seq_len=8, method="lora", lora_r=8, precision="fp32",
                                 weights="fp32", device="cpu")
    assert e.trainable == trainable


def test_config_settings_are_honoured():
    eager, sdpa = build("llama", "eager"), build("llama", "sdpa")
    args = dict(batch_size=2, seq_len=64, precision="fp32", device="cpu")
    assert shape_of(eager.config).attn_impl == "eager" and shape_of(sdpa.config).attn_impl == "sdpa"
    assert estimate_training_memory(eager.config, **args).activations > estimate_training_memory(sdpa.config, **args).activations
    no_dropout = GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    assert shape_of(no_dropout).attn_dropout == 0 and shape_of(FAMILIES["gpt2"]()).attn_dropout == 0.1
    tied = LlamaConfig(**{**FAMILIES["llama"]().to_dict(), "tie_word_embeddings": True})
    assert shape_of(FAMILIES["llama"]()).parameters - shape_of(tied).parameters == 512 * 64  # the head


def test_qlora_7b_fits_a_t4_and_full_fine_tuning_does_not():
    qlora = estimate_training_memory("Mistral-7B", batch_size=1, seq_len=512, method="qlora", precision="fp16",
                                     checkpointing=True)
    full = estimate_training_memory("Mistral-7B", batch_size=1, seq_len=512, precision="fp16", checkpointing=True)
    assert qlora.fits("T4") and not full.fits("T4")
    assert 3.5 < qlora.weights / 2**30 < 5  # 4-bit linears plus fp32 embeddings and head, GiB
    assert qlora.total == qlora.allocated + qlora.cuda_context + qlora.allocator_slack
    assert qlora["weights"] == qlora.as_dict()["weights"]


def test_plan_reaches_qlora_for_a_7b_on_a_t4():
    steps = plan("Mistral-7B", "T4", batch_size=4, seq_len=512)
    assert steps[0].technique == "as asked" and not steps[0].fits
    assert steps[-1].technique == "QLoRA" and steps[-1].fits
    totals = [s.estimate.total for s in steps]
    assert totals == sorted(totals, reverse=True), "every step lowers the predicted memory"
    assert steps[0].estimate.settings["precision"] == "fp16", "a T4 plans in fp16"
    text = format_plan(steps, "T4")
    assert "QLoRA" in text and "yes" in text


def test_plan_that_cannot_fit_says_what_to_do():
    steps = plan("Llama-3.1-8B", 4.0, batch_size=1, seq_len=4096)
    assert not steps[-1].fits
    assert "Nothing fits" in format_plan(steps, 4.0)


def test_plan_stops_as_soon_as_it_fits():
    steps = plan("SmolLM2-135M", "A100-80GB", batch_size=8, seq_len=512, precision="fp32")
    assert [s.technique for s in steps] == ["as asked"] and steps[0].fits


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="Mistral-8B"), "Unknown model 'Mistral-8B'; the catalog has"),
        (dict(precision="fp8"), "precision='fp8' is not one of"),
        (dict(method="qlora", weights="bf16"), "method='qlora' stores weights in nf4"),
        (dict(weights="nf4"), "cannot be trained in full"),
        (dict(batch_size=0), "batch_size must be a positive int"),
        (dict(lora_targets=["q", "attn"], method="lora"), "Unknown LoRA targets"),
    ],
)
def test_bad_input_names_the_fix(kwargs, message):
    args = dict(model="Mistral-7B", batch_size=1, seq_len=128) | kwargs
    with pytest.raises(ValueError, match=message):
        estimate_training_memory(args.pop("model"), **args)


def test_unknown_gpu_lists_the_catalog():
    with pytest.raises(ValueError, match=r"Unknown GPU 'T5'; the catalog has T4"):
        est.gpu_bytes("T5")


def test_estimator_never_imports_torch():
    """Planning works in a fresh process without torch: that is what makes it answer in milliseconds."""
    code = ("import sys, helpers.estimate as e; e.plan('Mistral-7B', 'T4', batch_size=1, seq_len=512); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
