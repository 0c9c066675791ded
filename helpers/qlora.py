"""QLoRA in one call: a causal LM frozen in 4-bit NF4 with a LoRA adapter on top, ready for the Trainer.

Taught in notebook 05 (QLoRA) and used by notebook 08 (capstone):

- `load_qlora(model_id)` chooses the model as `helpers.models.load_model` does (the embedded tiny
  model, with its banner, for a smoke run, a machine without a GPU or without the Hub), loads it in
  4-bit NF4 (quantized while loading, or a bitsandbytes 4-bit checkpoint as saved) and puts a LoRA
  adapter on it, ready for the Trainer; given a trained adapter's folder (a run's final/), it loads
  that adapter's base the same way and the trained adapter on it, to evaluate or train on;
- `save_quantized(model_id, out)` quantizes a model to 4-bit NF4 once and saves that copy (a 7B:
  about 5.5 GB instead of 15.2 GB in bf16), for `load_qlora(out)` to load as saved;
- `disable_cpu_repacking(model)` is the CPU workaround `load_qlora` applies, for a 4-bit model
  loaded another way;
- `add_adapter(model, ...)` is `load_qlora`'s last step alone: peft's k-bit preparation and a LoRA
  adapter on a 4-bit model.

What the loaded model holds is measured by `helpers.footprint.measure_footprint` (`load_qlora`
prints it); whether a checkpoint is saved pre-quantized is read from its config.json by
`helpers._prequantized`.

Importing this module is cheap: torch, bitsandbytes, peft and transformers load when a function needs them.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from helpers._prequantized import saved_4bit
from helpers._util import MIB, quiet_libraries
from helpers.footprint import measure_footprint
from helpers.models import EMBEDDED_DIR, EMBEDDED_ID, card_dtype, choose_source, is_embedded, load_pretrained

__all__ = ["add_adapter", "disable_cpu_repacking", "load_qlora", "save_quantized"]


def load_qlora(
    model_id: str = EMBEDDED_ID,
    *,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.05,
    target_modules: str | list[str] = "all-linear",
    checkpointing: bool = True,
    smoke: bool = False,
    needs_gpu: bool = True,
    revision: str | None = None,
):
    """Load a causal LM in 4-bit NF4 with a LoRA adapter, ready for the Trainer: QLoRA in one call.

    Taught in notebook 05 (QLoRA) and used by notebook 08. The steps:

    1. the model is chosen as `load_model` chooses it (smoke / no GPU / no Hub: the embedded
       tiny model, with the banner);
    2. every linear layer but the output head is quantized to 4-bit NF4 with double quantization
       (the per-block scales quantized again), computing in the card's precision: bf16 at compute
       capability >= 8.0, fp16 on a T4, fp32 on CPU. A checkpoint saved in bitsandbytes 4-bit
       (`save_quantized`, or a Hub repository such as "unsloth/Qwen2.5-7B-bnb-4bit") is loaded as
       saved instead, nothing quantized, and set to compute in the card's precision; any other
       pre-quantized checkpoint (8-bit, GPTQ, AWQ) is refused;
    3. peft's k-bit preparation freezes the base, keeps norms and embeddings in fp32 and turns on
       non-reentrant gradient checkpointing (no `enable_input_require_grads` hack needed);
    4. a LoRA adapter (rank `r`, scale `alpha / r`) goes on `target_modules`;
    5. the trainable parameters and the measured footprint (`measure_footprint`) are printed.

    On CPU the bitsandbytes AVX512-BF16 repacking is switched off (`disable_cpu_repacking`): left
    on, one eval-mode forward makes every later LoRA gradient wrong.

    A folder holding a trained adapter (adapter_config.json: a run's final/, `save_pretrained`'s output)
    loads as that adapter on its base (adapter_config.json's base_model_name_or_path, chosen and quantized
    as above): trainable, with its own rank and targets, so `r`, `alpha`, `dropout` and `target_modules`
    are not used. Never a fresh adapter on top of a trained one.

    Checkpointing is on in the model itself (`model.is_activation_checkpointing`). Pass
    `activation_checkpointing=True` to TrainingArguments as well: it changes nothing in memory,
    but the run's manifest and `audit` read the setting from there.

    Args:
        model_id: a Hub id ("Qwen/Qwen2.5-0.5B"), a local folder (one `save_quantized` wrote, say),
            or "embedded".
        r: LoRA rank, the inner size of each adapter's two matrices (16, a common start; the
            QLoRA paper used 64).
        alpha: LoRA scale numerator; the update is scaled by alpha / r (32 / 16 = 2; the paper's
            16 / 64 = 0.25).
        dropout: dropout on the adapter's input (0.05 here; the QLoRA paper used 0.1 for models
            up to 13B and 0.05 for 33B and 65B, Dettmers et al. 2023, arXiv:2305.14314,
            appendix B; 0.0 to compare gradients exactly).
        target_modules: "all-linear" (every linear but the head, as in the QLoRA paper) or
            names such as ["q_proj", "v_proj"].
        checkpointing: recompute each layer's activations in backward instead of keeping them.
        smoke, needs_gpu, revision: as in `load_model`.

    Returns:
        (model, tokenizer): a peft model whose only trainable parameters are the adapter's.

    Example:
        >>> model, tokenizer = load_qlora("Qwen/Qwen2.5-0.5B", r=16, alpha=32)  # doctest: +SKIP
        >>> trainer = Trainer(model=model, args=args, train_dataset=train)  # doctest: +SKIP
    """
    import torch

    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise ValueError(f"r is the LoRA rank, a positive int such as 8, 16 or 64; got r={r!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout is a probability in [0, 1); got dropout={dropout!r} (0.05 is usual)")
    _import_qlora_libraries()
    has_gpu = torch.cuda.is_available()
    trained, base_id = _trained_adapter(model_id)
    # 1. the model, chosen as load_model chooses it (a trained adapter's: its base)
    source, offline = choose_source(base_id or model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    # 2. every linear but the head in 4-bit NF4
    model, tokenizer = _load_4bit(source, has_gpu=has_gpu, revision=revision, offline=offline)
    disable_cpu_repacking(model)
    # 3. and 4. the frozen base prepared for training, the adapter on top (the trained one, if given)
    if trained:
        model = _trained_on(model, trained, base_id, checkpointing)
    else:
        model = add_adapter(
            model, r=r, alpha=alpha, dropout=dropout, target_modules=target_modules, checkpointing=checkpointing
        )
    # 5. what it all holds
    print(measure_footprint(model))
    return model, tokenizer


def _import_qlora_libraries() -> None:
    """Import bitsandbytes and peft, or say how to install them."""
    # bitsandbytes logs at import, on AVX512-BF16 CPUs, that an optional Hub kernel is absent;
    # its built-in CPU path runs instead, and the message would only confuse a student
    quiet_libraries()
    try:
        import bitsandbytes  # noqa: F401
        import peft  # noqa: F401
    except ImportError as e:
        raise ImportError(
            f"QLoRA needs bitsandbytes and peft ({e}). Run the notebook's install cell, or "
            "`pip install -r requirements.txt` (bitsandbytes==0.50.2, peft==0.21.2)."
        ) from e


def _load_4bit(source, *, has_gpu: bool, revision: str | None, offline: bool):
    """Load `source` with every linear but the head in 4-bit (quantized now, or as saved), in the card's dtype."""
    from transformers import BitsAndBytesConfig

    compute_dtype = card_dtype()
    saved = saved_4bit(source, revision=revision, offline=offline)  # raises for 8-bit, GPTQ, AWQ ...
    quantization = {}  # a pre-quantized checkpoint: its own config wins, and transformers warns at any other
    if not saved:
        quantization["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,  # the fp32 block scales quantized to 8-bit: ~0.37 bits/weight saved
            bnb_4bit_compute_dtype=compute_dtype,
        )
    # one whole copy per process: each data-parallel process (notebook 07) on its own card
    device_map = {"": int(os.environ.get("LOCAL_RANK", 0))} if has_gpu else None
    model, tokenizer = load_pretrained(
        source, dtype=compute_dtype, revision=revision, local_only=offline, device_map=device_map, **quantization
    )
    if saved and not getattr(model, "is_loaded_in_4bit", False):
        # the Hub failed after config.json and the fallback (the embedded model, its banner says why) is not 4-bit
        return _load_4bit(model.config._name_or_path, has_gpu=has_gpu, revision=revision, offline=True)
    compute = str(compute_dtype).removeprefix("torch.")
    if saved:
        print(f"pre-quantized 4-bit checkpoint ({saved}): loaded as saved, nothing quantized while loading")
    else:
        print(
            f"quantized to 4-bit NF4 while loading (double quantization), computing in {compute}, the card's precision"
        )
    _compute_in(model, compute_dtype)
    return model, tokenizer


def _compute_in(model, dtype) -> None:
    """Make every 4-bit linear compute in `dtype`, and `model.config.quantization_config` (what notebooks print) say so.

    A checkpoint keeps the compute dtype it was saved with: bf16 would then run on a T4, which has
    none. `quant_state.dtype` (the weights' dtype when quantized) stays: bitsandbytes casts the
    dequantized weight to the compute dtype before each matmul.
    """
    import bitsandbytes as bnb

    name = str(dtype).removeprefix("torch.")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    saved = ", ".join(sorted({str(layer.compute_dtype).removeprefix("torch.") for layer in layers} - {name}))
    for layer in layers:
        layer.compute_dtype = dtype
        layer.compute_type_is_set = True  # else the first input's dtype would choose
    if getattr(model.config, "quantization_config", None) is not None:
        model.config.quantization_config.bnb_4bit_compute_dtype = dtype
    if saved:
        print(f"compute dtype set to {name}, the card's precision, in the {len(layers)} 4-bit layers (saved: {saved})")


def add_adapter(model, *, r: int, alpha: int, dropout: float, target_modules, checkpointing: bool):
    """Freeze the 4-bit base for training (peft's k-bit preparation) and put a LoRA adapter on it."""
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, bias="none", task_type="CAUSAL_LM"
    )
    return _prepared(model, checkpointing, lambda m: get_peft_model(m, adapter))


def _prepared(model, checkpointing: bool, adapt):
    """peft's k-bit preparation of `model` (frozen base, fp32 norms, checkpointing), then `adapt(model)`."""
    from peft import prepare_model_for_kbit_training

    with warnings.catch_warnings():  # peft calls transformers' old checkpointing names; not the student's doing
        warnings.filterwarnings(
            "ignore", r".*(gradient_checkpointing_enable|is_gradient_checkpointing).*", FutureWarning
        )
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
        if checkpointing:
            model.config.use_cache = False  # a cache is useless in training and conflicts with checkpointing
        return adapt(model)


def _trained_adapter(model_id) -> tuple[Path | None, str | None]:
    """(the folder, its base model) when `model_id` is a folder holding a trained adapter; (None, None) otherwise."""
    import json

    folder = Path(model_id) if isinstance(model_id, str) and model_id.strip() else None
    if folder is None or not (folder / "adapter_config.json").is_file():
        return None, None
    try:
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{folder / 'adapter_config.json'} cannot be read ({type(e).__name__}): save it again") from e
    if not isinstance(base, str) or not base.strip():
        raise ValueError(
            f"{folder / 'adapter_config.json'} names no base model (base_model_name_or_path): set it to the model "
            'the adapter was trained on, e.g. "Qwen/Qwen2.5-7B"'
        )
    # the embedded model, trained on from another clone or machine: its folder by name
    if not Path(base).is_dir() and Path(base).parts[-3:] == EMBEDDED_DIR.parts[-3:]:
        base = EMBEDDED_ID
    return folder, base


def _trained_on(model, folder: Path, base_id: str, checkpointing: bool):
    """The trained adapter in `folder` on `model` (its base, loaded in 4-bit), trainable; refused on another model."""
    from peft import PeftModel

    if is_embedded(model) and not (base_id == EMBEDDED_ID or Path(base_id).resolve() == EMBEDDED_DIR.resolve()):
        raise ValueError(
            f"the adapter in {folder} was trained on {base_id}, and the embedded tiny model was loaded in its place "
            f"(the banner above says why), so it cannot go on it: load it where {base_id} can be loaded"
        )
    model = _prepared(model, checkpointing, lambda m: PeftModel.from_pretrained(m, str(folder), is_trainable=True))
    config = model.peft_config["default"]
    print(f"the trained adapter in {folder} (rank {config.r}, alpha {config.lora_alpha}) on {base_id}")
    return model


def save_quantized(model_id: str, out, *, smoke: bool = False, revision: str | None = None) -> Path:
    """Quantize a model to 4-bit NF4 once and save that copy (safetensors, with its tokenizer) into `out`.

    Taught in notebook 08 (capstone). The model is chosen and quantized as `load_qlora` does it
    (double quantization, the card's compute precision; on a machine without a GPU, the embedded
    tiny model with its banner), without the adapter. A 7B is then about 5.5 GB on disk instead of
    15.2 GB in bf16: keep it (on Drive, say) and `load_qlora(out)` loads it as saved.

    Args:
        model_id: a Hub id ("Qwen/Qwen2.5-7B"), a local folder, or "embedded".
        out: the folder to write: new, or empty.
        smoke, revision: as in `load_qlora`.

    Returns:
        the folder, as a Path.

    Example:
        >>> folder = save_quantized("Qwen/Qwen2.5-7B", "/content/drive/MyDrive/qwen7b-nf4")  # doctest: +SKIP
        >>> model, tokenizer = load_qlora(str(folder))  # doctest: +SKIP
    """
    import torch

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(
            f"{str(out)!r} exists and is not an empty folder: save_quantized writes a fresh copy and would mix its "
            f"files with what is there. Pass a new folder (e.g. {str(out) + '-nf4'!r}), or empty this one first."
        )
    _import_qlora_libraries()
    has_gpu = torch.cuda.is_available()
    source, offline = choose_source(model_id, smoke=smoke, needs_gpu=True, has_gpu=has_gpu)
    model, tokenizer = _load_4bit(source, has_gpu=has_gpu, revision=revision, offline=offline)
    model.save_pretrained(out)  # safetensors: the packed 4-bit weights and their quantization states
    tokenizer.save_pretrained(out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"saved the 4-bit copy in {out}: {size / MIB:,.2f} MiB on disk; load it with load_qlora({str(out)!r})")
    return out


def disable_cpu_repacking(model) -> int:
    """Switch off bitsandbytes' AVX512-BF16 weight repacking on every 4-bit linear; return how many.

    On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a 4-bit weight into an inference-only
    layout the first time the layer runs in eval mode without gradients (an evaluation, a
    `generate`). Training mode then reads the repacked weight and the LoRA gradients come out
    silently wrong (about 100% relative error). Without the flag the layer keeps the standard
    layout; nothing changes on a GPU. `load_qlora` calls this; call it yourself on a 4-bit model
    you load another way. Taught in notebook 05.

    Example:
        >>> disable_cpu_repacking(model)  # doctest: +SKIP
        28
    """
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
