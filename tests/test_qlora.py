"""helpers.qlora.load_qlora: 4-bit NF4 + LoRA, proved against the dequantized model's gradients.

Real bitsandbytes, peft and transformers on CPU. The reference is the same model with every 4-bit
linear replaced by an nn.Linear holding exactly the weight bitsandbytes dequantizes, carrying the
same LoRA adapter: QLoRA's claim is that training the adapter on the 4-bit base gives the
gradients of training it on that dequantized base.
"""

import bitsandbytes as bnb
import bitsandbytes.functional as bnbF
import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from helpers.data import load_course_data
from helpers.models import EMBEDDED_DIR, is_embedded
from helpers.qlora import disable_cpu_repacking, load_qlora, measure_footprint

# peft 0.21's get_peft_model reads transformers' deprecated `is_gradient_checkpointing` (the reference models here)
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
HAS_AVX512_BF16 = bnbF.has_avx512bf16()  # the test bitsandbytes itself uses to turn repacking on


def batch_of(tokenizer, rows=2, seq_len=32):
    data = load_course_data().select(range(rows))
    text = [f"{i}\n{r}" for i, r in zip(data["instruction"], data["response"])]
    batch = tokenizer(text, return_tensors="pt", padding="max_length", truncation=True, max_length=seq_len)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["input_ids"]}


def linear4bit_layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, bnb.nn.Linear4bit)}


def dequantized_reference(qmodel, source):
    """`source` in fp32 with each 4-bit linear of `qmodel` as an nn.Linear of its dequantized weight, same LoRA."""
    reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    for name, layer in linear4bit_layers(qmodel).items():
        # peft: base_model.model.<path>.base_layer -> <path> in the plain model
        path = name.removeprefix("base_model.model.").removesuffix(".base_layer")
        parent, child = path.rsplit(".", 1)
        assert layer.weight.quant_state.dtype == torch.float32  # the compute dtype on CPU
        linear = torch.nn.Linear(layer.in_features, layer.out_features, bias=False)
        linear.weight.data = bnbF.dequantize_4bit(layer.weight.data, layer.weight.quant_state).clone()
        setattr(reference.get_submodule(parent), child, linear)
    reference = get_peft_model(reference, LoraConfig(**qmodel.peft_config["default"].to_dict()))
    adapters = {n: p for n, p in qmodel.named_parameters() if p.requires_grad}
    copied = 0
    for name, param in reference.named_parameters():
        if param.requires_grad:
            param.data.copy_(adapters[name].data)
            copied += 1
    assert copied == len(adapters) > 0
    return reference


def lora_gradients(model, batch, *, eval_forward_first: bool):
    model.zero_grad(set_to_none=True)
    if eval_forward_first:  # what Trainer.evaluate() and generate() do between training steps
        model.eval()
        with torch.no_grad():
            model(**batch)
    model.train()
    model(**batch).loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def compare(grads, reference_grads):
    assert grads.keys() == reference_grads.keys()
    assert all(g.abs().sum() > 0 for g in reference_grads.values()), "every LoRA A and B gets a gradient"
    max_abs = max((grads[k] - reference_grads[k]).abs().max().item() for k in grads)
    max_rel = max(((grads[k] - reference_grads[k]).norm() / reference_grads[k].norm()).item() for k in grads)
    return max_abs, max_rel


def qlora_and_reference(source, **kwargs):
    model, tokenizer = load_qlora(source, dropout=0.0, needs_gpu=False, **kwargs)
    torch.manual_seed(0)
    with torch.no_grad():  # B starts at zero, which would make every A gradient zero: the test would be blind
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    return model, tokenizer, dequantized_reference(model, EMBEDDED_DIR if source == "embedded" else source)


@pytest.fixture(scope="module")
def embedded_qlora():
    return qlora_and_reference("embedded")


def test_embedded_model_loads_in_4bit_with_lora_ready_for_the_trainer(capsys):
    model, tokenizer = load_qlora("HuggingFaceTB/SmolLM2-135M", smoke=True)
    out = capsys.readouterr().out
    assert "USING THE EMBEDDED TINY MODEL" in out and "smoke=True" in out
    layers = linear4bit_layers(model)
    config = model.config
    assert len(layers) == 7 * config.num_hidden_layers  # q, k, v, o, gate, up, down; the head stays full
    for layer in layers.values():
        state = layer.weight.quant_state
        assert state.quant_type == "nf4" and state.nested  # double quantization: the scales are 8-bit too
        assert state.dtype == torch.float32  # compute dtype on CPU
        assert layer.support_avx512bf16_for_cpu is False  # the CPU workaround is in place
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert model.peft_config["default"].r == 16 and model.peft_config["default"].lora_alpha == 32
    assert model.get_base_model().is_activation_checkpointing and not model.config.use_cache
    assert is_embedded(model) and tokenizer.pad_token is not None
    assert "4-bit weights" in out and "trainable parameters" in out


def test_footprint_counts_every_byte_once(embedded_qlora):
    model, _, _ = embedded_qlora
    fp = measure_footprint(model)
    c = model.config
    kv = c.num_key_value_heads * c.head_dim  # grouped-query attention: k and v are narrower than q
    per_layer = c.hidden_size * (2 * c.hidden_size + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    assert fp.quantized_params == c.num_hidden_layers * per_layer  # q, k, v, o, gate, up, down
    assert fp.quantized_bytes >= fp.quantized_params // 2  # at least the 4-bit codes
    assert 4.1 < fp.bits_per_quantized_weight < 8  # codes + scales + codebooks, large on a tiny model
    norms = (2 * c.num_hidden_layers + 1) * c.hidden_size
    assert fp.other_params == c.vocab_size * c.hidden_size + norms  # tied embedding and head, counted once
    assert fp.trainable_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert fp.adapter_bytes == 4 * fp.trainable_params  # adapters train in fp32
    assert fp.fp32_bytes == 4 * sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(EMBEDDED_DIR).parameters())
    assert fp.total_bytes < fp.fp32_bytes
    print(
        f"\nembedded model: {fp.quantized_bytes} B quantized + {fp.other_bytes} B rest + {fp.adapter_bytes} B "
        f"adapters = {fp.total_bytes} B, vs {fp.fp32_bytes} B in fp32"
    )


@pytest.mark.parametrize("eval_forward_first", [False, True], ids=["train-only", "after-eval-forward"])
def test_lora_gradients_equal_the_dequantized_models(embedded_qlora, eval_forward_first):
    model, tokenizer, reference = embedded_qlora
    batch = batch_of(tokenizer)
    max_abs, max_rel = compare(
        lora_gradients(model, batch, eval_forward_first=eval_forward_first),
        lora_gradients(reference, batch, eval_forward_first=eval_forward_first),
    )
    print(f"\nmax |grad - reference grad| = {max_abs:.3g} (relative {max_rel:.3g})")
    assert max_abs <= 1e-6 and max_rel <= 1e-5  # fp32 on both sides: same dequantized weights, same math


# torch itself warns, once, that the repacked kernel has no autograd formula: the mechanism of the bug
@pytest.mark.filterwarnings("ignore:.*gemv_4bit.*autograd kernel was not registered:UserWarning")
@pytest.mark.skipif(
    not HAS_AVX512_BF16,
    reason="this CPU has no AVX512-BF16 (no avx512_bf16 in /proc/cpuinfo): "
    "bitsandbytes never repacks weights here, so the workaround has nothing to fix",
)
def test_without_the_workaround_an_eval_forward_breaks_the_gradients(tmp_path):
    # the embedded model's MLP width (176) is not a multiple of the 32-row blocks the repacking
    # needs, so there it crashes instead; real models (1536, 11008, ...) get silently wrong gradients
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((EMBEDDED_DIR / name).read_bytes())
    model, tokenizer, reference = qlora_and_reference(str(tmp_path))
    batch = batch_of(tokenizer)
    layers = linear4bit_layers(model).values()
    for layer in layers:  # undo the workaround: bitsandbytes' default on this CPU
        layer.support_avx512bf16_for_cpu = True
    max_abs, max_rel = compare(
        lora_gradients(model, batch, eval_forward_first=True), lora_gradients(reference, batch, eval_forward_first=True)
    )
    print(f"\nwithout the workaround: max |grad - reference grad| = {max_abs:.3g} (relative {max_rel:.3g})")
    assert all(getattr(layer.weight.quant_state, "packing_format_for_cpu", False) for layer in layers)
    assert max_rel > 0.5  # silently wrong: no error, no warning, a loss that still looks fine

    fixed, tokenizer, reference = qlora_and_reference(str(tmp_path))  # load_qlora applies it
    assert disable_cpu_repacking(fixed) == len(layers)
    max_abs, max_rel = compare(
        lora_gradients(fixed, batch, eval_forward_first=True), lora_gradients(reference, batch, eval_forward_first=True)
    )
    assert max_abs <= 1e-6


def test_trainer_trains_only_the_adapter(tmp_path):
    model, tokenizer = load_qlora("embedded", r=4, alpha=8)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapter_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    batch = batch_of(tokenizer, rows=8)
    rows = [{k: v[i] for k, v in batch.items()} for i in range(8)]
    args = TrainingArguments(
        str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=rows).train()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in base_before.items()), "the 4-bit base stays frozen"
    assert all(not torch.equal(after[n], p) for n, p in adapter_before.items()), "every adapter learned"


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(r=0), r"r is the LoRA rank.*got r=0"), (dict(dropout=1.5), r"dropout is a probability.*dropout=1.5")],
)
def test_bad_arguments_say_what_works(kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_qlora("embedded", **kwargs)
