"""The models `python -m helpers gpu-proof` trains: built from catalog shapes, saved, loaded in 4 bits.

Shared by the estimator, headline, out-of-memory and timing sections: a transformers config from
a catalog model's shape (nothing downloaded), a model with random weights built on the device, the
7B saved once and reloaded as QLoRA the way `helpers.qlora.load_qlora` loads it, LoRA adapters,
checkpointing on and off, a few optimizer steps, and the estimator's figure for the same job.
Functions here call one another through this module's globals, so a test's fake of one (say
`_models.train_steps`) is what every section gets.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from helpers.maintainer.gpu_proof import _cuda
from helpers.maintainer.gpu_proof._proof import Proof

__all__ = [
    "LORA_R",
    "build",
    "config",
    "config_of",
    "estimate",
    "load_qlora",
    "model",
    "saved",
    "set_checkpointing",
    "stand_in_precision",
    "train_steps",
    "with_lora",
]

LORA_R = 16


def config(model_name: str):
    """A transformers config for a catalog model, from the catalog's shape (no download)."""
    from helpers.catalog import find

    return config_of(model_name, find("models", model_name)[1]["shape"])


def config_of(model_name: str, shape: dict):
    """A transformers config of the family `shape` names (qwen2 when it has a qkv bias), with its sizes."""
    from transformers import AutoConfig

    model_type = {"llama": "llama", "gemma": "gemma", "phi3": "phi3"}[shape["family"]]
    if shape.get("qkv_bias"):
        model_type = "qwen2"
    if model_name.startswith("Mistral"):
        model_type = "mistral"
    return AutoConfig.for_model(
        model_type,
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=shape["intermediate"],
        vocab_size=shape["vocab"],
        tie_word_embeddings=shape.get("tied", False),
        max_position_embeddings=4096,
        use_cache=False,
    )


def stand_in_precision(card: str) -> str:
    """The precision the notebooks choose on the catalog card `card`: fp16 on a T4, which has no bf16."""
    from helpers.catalog import card_capability, gpu_bytes
    from helpers.env import Gpu, choose_precision

    return choose_precision([Gpu(0, card, gpu_bytes(card), card_capability(card))]).name


def model(proof: Proof, model_name: str, method: str, precision: str):
    """Full: fp32 master weights built on the device. LoRA: the base in the compute dtype, as the estimator's
    "lora" stores it. QLoRA: the saved bf16 model loaded in 4 bits."""
    if method == "qlora":
        return load_qlora(saved(proof, model_name), precision, proof.device)
    built = build(config(model_name), "fp32" if method == "full" else precision, proof.device)
    return with_lora(built) if method == "lora" else built


def build(config, precision: str, device: str = "cuda"):
    """A model with random weights, made directly on `device` in `precision`'s dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from helpers._util import torch_dtype

    with torch.device(device):
        built = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(precision))
    built.config.use_cache = False
    return built


def saved(proof: Proof, model_name: str) -> Path:
    """The model with random bf16 weights, as a Hub checkpoint ships it: built and saved once per run."""
    folder = proof.scratch / model_name
    if not folder.is_dir():
        built = build(config(model_name), "bf16", proof.device)
        partial = folder.parent / f"{folder.name}.partial"
        built.save_pretrained(partial)
        partial.rename(folder)  # a save cut short is never taken for a whole one
        built = None
        _cuda.release()
    return folder


def load_qlora(folder: Path, precision: str, device: str = "cuda"):
    """Load as `helpers.qlora.load_qlora` does: NF4, double quantization, peft's k-bit preparation, LoRA."""
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from helpers._util import torch_dtype
    from helpers.qlora import disable_cpu_repacking

    compute = torch_dtype(precision)
    quant = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    device_map = {"": 0} if device == "cuda" else None  # as load_qlora: the whole model on the card
    loaded = AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=quant, dtype=compute, device_map=device_map
    )
    disable_cpu_repacking(loaded)  # nothing on a GPU; on CPU, keeps the LoRA gradients right
    loaded = prepare_model_for_kbit_training(loaded, use_gradient_checkpointing=False)
    loaded.config.use_cache = False
    return with_lora(loaded)


def with_lora(base):
    """`base` with rank-LORA_R adapters on every linear layer, no dropout (as the estimator is asked)."""
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=LORA_R, lora_alpha=2 * LORA_R, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM"
    )
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", r".*is_gradient_checkpointing.*", FutureWarning)
        return get_peft_model(base, adapter)


def set_checkpointing(trained, on: bool) -> None:
    """Non-reentrant checkpointing on every layer, as notebooks 01 and 03 switch it (the embeddings' output
    then requires grad, which the estimator counts); off again removes that hook as well."""
    if on:
        trained.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        trained.activation_checkpointing_disable()
        trained.disable_input_require_grads()  # transformers leaves it on a model peft wrapped


def train_steps(
    trained, precision: str, seq_len: int, *, steps=2, per_device_batch=1, grad_accum_steps=1, device="cuda"
):
    """`steps` optimizer steps of fused AdamW (the Trainer's default) under autocast, on random tokens."""
    import torch

    from helpers._util import torch_dtype

    half = precision in ("bf16", "fp16")
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-5, fused=True)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")
    trained.train()
    for _ in range(steps):
        for _ in range(grad_accum_steps):
            ids = torch.randint(0, trained.config.vocab_size, (per_device_batch, seq_len), device=device)
            with torch.autocast(device, dtype=torch_dtype(precision) if half else torch.bfloat16, enabled=half):
                loss = trained(input_ids=ids, labels=ids).loss / grad_accum_steps
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def estimate(config, precision, seq_len, method, checkpointing, device, attn_impl=None):
    """The estimator's figure for one sequence, with the LoRA settings the models here are built with."""
    from helpers.estimate import estimate_training_memory

    return estimate_training_memory(
        config,  # the catalog model's shape: the tests check that config and catalog name agree
        per_device_batch=1,
        seq_len=seq_len,
        precision=precision,
        method=method,
        lora_r=LORA_R,
        lora_dropout=0.0,
        checkpointing=checkpointing,
        device=device,
        attn_impl=attn_impl,
    )
