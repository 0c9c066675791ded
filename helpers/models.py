"""Load the model a notebook asks for, or the embedded tiny model with a banner that says why.

Taught in notebook 00 and used by every notebook. The fallback is what lets the whole course run
headless in the tests and on a machine with no GPU or no internet: the notebook asks for a real
model (SmolLM2-135M, Qwen2.5-0.5B, a 7B) and gets the tiny one only when

- it asks for it (`smoke=True`, which `python -m helpers run --smoke` injects),
- the machine has no GPU and the model needs one (`needs_gpu=True`, the default for hub models),
- or the Hugging Face Hub cannot be reached and the model is not in the local cache.

`load_qlora` (taught in notebook 05) loads the same way, in 4-bit NF4, with a LoRA adapter on top.

Nothing here waits on the network for more than `HUB_TIMEOUT_S`.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from helpers.env import can_connect

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_DIR = ASSETS / "tiny-llama"
EMBEDDED_ID = "embedded"  # the name notebooks and the runner use for the tiny model
EMBEDDED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
HUB_TIMEOUT_S = 3.0

# The models the notebooks name. Offline, these fall back to the embedded model; any other id
# that is neither cached nor a local folder is an error, since it is more likely a typo.
COURSE_MODELS = (
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-360M",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-7B",
    "mistralai/Mistral-7B-v0.1",
    "meta-llama/Llama-2-7b-hf",
)


def hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """True when a TCP connection to the Hub opens within `timeout` seconds.

    Honours HF_HUB_OFFLINE and HF_ENDPOINT; never waits longer than `timeout` (helpers.env.can_connect).
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    return can_connect(host, port, timeout)


def embedded_dir() -> Path:
    """The folder of the embedded tiny model, checked complete."""
    missing = [f for f in EMBEDDED_FILES if not (EMBEDDED_DIR / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"The embedded tiny model in {EMBEDDED_DIR} is missing {', '.join(missing)}. "
            "Reinstall the kit (pip install -e . from the repository) or rebuild it with "
            "`python scripts/build_tiny_model.py`."
        )
    return EMBEDDED_DIR


def is_embedded(model) -> bool:
    """True when `model` is the embedded tiny model (so a notebook can say what it measured)."""
    return Path(getattr(model.config, "_name_or_path", "") or ".").resolve() == EMBEDDED_DIR.resolve()


def load_model(
    model_id: str = EMBEDDED_ID,
    *,
    smoke: bool = False,
    needs_gpu: bool = True,
    dtype=None,
    revision: str | None = None,
):
    """Load a causal LM and its tokenizer: the one asked for, or the embedded tiny model.

    Args:
        model_id: a Hub id ("HuggingFaceTB/SmolLM2-135M"), a local folder, or "embedded".
        smoke: use the embedded model whatever else is true (headless tests, quick runs).
        needs_gpu: a CPU-only machine gets the embedded model instead of a slow or impossible
            load. Pass False to load a small hub model on CPU anyway.
        dtype: torch dtype of the weights; default float32 for the embedded model and on CPU,
            the card's training precision (bf16 or fp16) on a GPU.
        revision: a Hub branch, tag or commit to pin (recorded by the run manifest).

    Returns:
        (model, tokenizer), the model on the GPU when there is one.

    Example:
        >>> model, tokenizer = load_model("HuggingFaceTB/SmolLM2-135M", smoke=True)  # doctest: +SKIP
    """
    import torch

    has_gpu = torch.cuda.is_available()
    source, reason, offline = _resolve(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    if reason:
        _banner(model_id, reason)
    if dtype is None:
        dtype = torch.float32
        if has_gpu and source is not EMBEDDED_DIR:
            from helpers.env import choose_precision, detect_gpus

            dtype = torch.bfloat16 if choose_precision(detect_gpus()).name == "bf16" else torch.float16
    model, tokenizer = _from_pretrained(source, dtype=dtype, revision=revision, local_only=offline)
    if has_gpu:
        model = model.to("cuda")
    return model, tokenizer


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
       capability >= 8.0, fp16 on a T4, fp32 on CPU;
    3. peft's k-bit preparation freezes the base, keeps norms and embeddings in fp32 and turns on
       non-reentrant gradient checkpointing (no `enable_input_require_grads` hack needed);
    4. a LoRA adapter (rank `r`, scale `alpha / r`) goes on `target_modules`;
    5. the trainable parameters and the measured footprint (`measure_footprint`) are printed.

    On CPU the bitsandbytes AVX512-BF16 repacking is switched off (`disable_cpu_repacking`): left
    on, one eval-mode forward makes every later LoRA gradient wrong.

    Checkpointing is on in the model itself (`model.is_activation_checkpointing`). Pass
    `activation_checkpointing=True` to TrainingArguments as well: it changes nothing in memory,
    but the run's manifest and `audit` read the setting from there.

    Args:
        model_id: a Hub id ("Qwen/Qwen2.5-0.5B"), a local folder, or "embedded".
        r: LoRA rank, the inner size of each adapter's two matrices (16 is the QLoRA default).
        alpha: LoRA scale numerator; the update is scaled by alpha / r (32 / 16 = 2).
        dropout: dropout on the adapter's input (0.05, as the QLoRA paper uses for models up to
            13B; 0.0 to compare gradients exactly).
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
    # bitsandbytes logs at import, on AVX512-BF16 CPUs, that an optional Hub kernel is absent;
    # its built-in CPU path runs instead, and the message would only confuse a student
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    try:
        import bitsandbytes  # noqa: F401
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig
    except ImportError as e:
        raise ImportError(
            f"QLoRA needs bitsandbytes and peft ({e}). Run the notebook's install cell, or "
            "`pip install -r requirements.txt` (bitsandbytes==0.50.2, peft==0.21.2)."
        ) from e

    has_gpu = torch.cuda.is_available()
    source, reason, offline = _resolve(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    if reason:
        _banner(model_id, reason)
    compute_dtype = _compute_dtype(has_gpu)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,  # the fp32 block scales quantized to 8-bit: ~0.37 bits/weight saved
        bnb_4bit_compute_dtype=compute_dtype,
    )
    # one whole copy per process: each data-parallel process (notebook 07) on its own card
    device_map = {"": int(os.environ.get("LOCAL_RANK", 0))} if has_gpu else None
    model, tokenizer = _from_pretrained(source, dtype=compute_dtype, revision=revision, local_only=offline,
                                        quantization_config=quantization, device_map=device_map)
    disable_cpu_repacking(model)
    adapter = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules,
                         bias="none", task_type="CAUSAL_LM")
    with warnings.catch_warnings():  # peft calls transformers' old checkpointing names; not the student's doing
        warnings.filterwarnings("ignore", r".*(gradient_checkpointing_enable|is_gradient_checkpointing).*",
                                FutureWarning)
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
        if checkpointing:
            model.config.use_cache = False  # a cache is useless in training and conflicts with checkpointing
        model = get_peft_model(model, adapter)
    print(measure_footprint(model))
    return model, tokenizer


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


@dataclass(frozen=True)
class Footprint:
    """What a 4-bit model with adapters holds in memory, measured tensor by tensor (bytes)."""

    quantized_bytes: int  # 4-bit weights and their quantization states (scales, codebooks)
    other_bytes: int  # the rest of the frozen base: embeddings, norms, output head, buffers
    adapter_bytes: int  # the trainable LoRA matrices
    quantized_params: int  # how many weights were quantized (their original count)
    other_params: int  # frozen parameters kept in full precision (tied ones once)
    trainable_params: int  # the adapters'

    @property
    def total_bytes(self) -> int:
        return self.quantized_bytes + self.other_bytes + self.adapter_bytes

    @property
    def bits_per_quantized_weight(self) -> float:
        """4 bits of NF4 code plus the scales' share (about 4.13 on a large model with double quantization)."""
        return 8 * self.quantized_bytes / max(self.quantized_params, 1)

    @property
    def fp32_bytes(self) -> int:
        """The same base model, without adapters, in fp32: what the 4-bit footprint is compared to."""
        return 4 * (self.quantized_params + self.other_params)

    def __str__(self) -> str:
        mib = 2**20
        total_params = self.quantized_params + self.other_params + self.trainable_params
        return "\n".join([
            f"4-bit weights   : {self.quantized_bytes / mib:8.2f} MiB  {self.quantized_params:,} weights in NF4, "
            f"{self.bits_per_quantized_weight:.2f} bits each with their scales",
            f"rest of the base: {self.other_bytes / mib:8.2f} MiB  embeddings, norms, output head (not quantized)",
            f"LoRA adapters   : {self.adapter_bytes / mib:8.2f} MiB  {self.trainable_params:,} trainable parameters "
            f"({100 * self.trainable_params / max(total_params, 1):.2f}% of {total_params:,})",
            f"total           : {self.total_bytes / mib:8.2f} MiB  vs {self.fp32_bytes / mib:.2f} MiB for the base "
            f"model in fp32 ({self.fp32_bytes / max(self.total_bytes, 1):.1f}x smaller)",
        ])


def measure_footprint(model) -> Footprint:
    """Measure a 4-bit model's memory: the quantized weights (with their quantization states) and the rest.

    Counts every tensor's storage once (tied embeddings, shared codebooks), on whatever device
    the model is, so the figure is exact on CPU and GPU alike. Taught in notebook 05.

    Returns:
        a `Footprint`; print it for a table, or read its fields (bytes) to `record` them.

    Example:
        >>> fp = measure_footprint(model)  # doctest: +SKIP
        >>> record("qlora_total_mib", fp.total_bytes / 2**20)  # doctest: +SKIP
    """
    import bitsandbytes as bnb

    seen: set[tuple[str, int]] = set()

    def nbytes(tensor) -> int:  # each storage once, whatever views point at it
        storage = tensor.untyped_storage()
        key = (str(tensor.device), storage.data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()

    quantized_bytes = quantized_params = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            quantized_bytes += nbytes(module.weight) + sum(nbytes(t) for t in _state_tensors(state))
            quantized_params += int(state.shape[0]) * int(state.shape[1])  # (out, in) before packing
    adapter_bytes = other_bytes = other_params = trainable_params = 0
    for name, param in model.named_parameters():  # tied parameters come once
        if isinstance(param, bnb.nn.Params4bit):
            continue
        if "lora_" in name:  # by name: a 4-bit model without an adapter may have trainable norms
            trainable_params += param.numel()
            adapter_bytes += nbytes(param)
        else:
            other_params += param.numel()
            other_bytes += nbytes(param)
    other_bytes += sum(nbytes(b) for b in model.buffers())  # rotary tables and the like
    return Footprint(quantized_bytes, other_bytes, adapter_bytes, quantized_params, other_params, trainable_params)


def _state_tensors(state):
    """The tensors of a bitsandbytes QuantState, nested state (double quantization) included."""
    for name in ("absmax", "code", "offset"):
        if getattr(state, name, None) is not None:
            yield getattr(state, name)
    if getattr(state, "state2", None) is not None:
        yield from _state_tensors(state.state2)


def _compute_dtype(has_gpu: bool):
    """bf16 at compute capability >= 8.0, fp16 below (a T4), fp32 on CPU."""
    import torch

    if not has_gpu:
        return torch.float32
    from helpers.env import choose_precision, detect_gpus

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(choose_precision(detect_gpus()).name, torch.float32)


def _resolve(model_id: str, *, smoke: bool, needs_gpu: bool, has_gpu: bool):
    """Decide what to load: (a folder or hub id, the fallback reason or "", load without the Hub)."""
    if not isinstance(model_id, str) or not model_id.strip():
        raise ValueError(f"model_id must be a Hub id, a folder or {EMBEDDED_ID!r}; got {model_id!r}")
    if model_id == EMBEDDED_ID:
        return embedded_dir(), "", True
    if smoke:
        return embedded_dir(), "smoke run: the embedded tiny model was asked for (smoke=True)", True
    if Path(model_id).is_dir():
        return model_id, "", True
    if needs_gpu and not has_gpu:
        return embedded_dir(), "no GPU on this machine, and this model needs one for the notebook to run in time", True
    if hub_reachable():
        return model_id, "", False
    if _in_cache(model_id):
        return model_id, "", True
    if model_id in COURSE_MODELS:
        return embedded_dir(), "the Hugging Face Hub cannot be reached and the model is not in the local cache", True
    raise ValueError(
        f"Unknown model id {model_id!r}: the Hugging Face Hub cannot be reached, it is not in the local "
        f"cache and not a local folder. Check the spelling (the course uses {', '.join(COURSE_MODELS[:3])}, ...), "
        "connect to the internet (Kaggle: Settings > Internet > On), or pass smoke=True to use the "
        "embedded tiny model."
    )


def _in_cache(model_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except ValueError:  # not a valid repo id at all
        return False


def _from_pretrained(source, *, dtype, revision, local_only: bool, **model_kwargs):
    """Load tokenizer and model; `model_kwargs` go to the model only (quantization_config, device_map)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs = dict(revision=revision, local_files_only=local_only)
    # a progress bar over the embedded model's few tiny tensors is noise in every notebook
    quiet = source == EMBEDDED_DIR and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **model_kwargs)
    except OSError as e:
        raise ValueError(
            f"Could not load {str(source)!r}: {e}\nCheck the model id on huggingface.co (gated models such "
            "as Llama need `hf auth login` after accepting the licence), or pass smoke=True."
        ) from e
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    if tokenizer.pad_token is None:  # many base models ship without one; the Trainer needs it
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _banner(model_id: str, reason: str) -> None:
    rule = "=" * 78
    print(
        f"{rule}\n USING THE EMBEDDED TINY MODEL instead of {model_id}\n why: {reason}\n"
        " what it means: every step runs and every figure is measured, but on a tiny model;\n"
        " run on a GPU with internet for the real numbers.\n"
        f"{rule}"
    )
