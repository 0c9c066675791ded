"""Load the model a notebook asks for, or the embedded tiny model with a banner that says why.

Taught in notebook 00 and used by every notebook. The fallback is what lets the whole course run
headless in the tests and on a machine with no GPU or no internet: the notebook asks for a real
model (SmolLM2-135M, Qwen2.5-0.5B, a 7B) and gets the tiny one only when

- it asks for it (`smoke=True`, which `python -m helpers run --smoke` injects),
- the machine has no GPU and the model needs one (`needs_gpu=True`, the default for hub models),
- or the Hugging Face Hub cannot be reached and the model is not in the local cache.

`helpers.qlora.load_qlora` (notebook 05) chooses its model by the same rules.

Nothing here waits on the network for more than `HUB_TIMEOUT_S`.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from helpers._util import torch_dtype
from helpers.env import can_connect

__all__ = [
    "COURSE_MODELS",
    "EMBEDDED_DIR",
    "EMBEDDED_FILES",
    "EMBEDDED_ID",
    "HUB_TIMEOUT_S",
    "embedded_dir",
    "hub_reachable",
    "is_embedded",
    "load_model",
]

EMBEDDED_DIR = Path(__file__).parent / "assets" / "tiny-llama"
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
    source, offline = _choose(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    if dtype is None:
        dtype = _card_dtype(has_gpu) if source is not EMBEDDED_DIR else torch.float32
    model, tokenizer = _from_pretrained(source, dtype=dtype, revision=revision, local_only=offline)
    if has_gpu:
        model = model.to("cuda")
    return model, tokenizer


def _card_dtype(has_gpu: bool):
    """The card's training precision as a dtype: bf16 at compute capability >= 8.0, fp16 below (a T4), fp32 on CPU."""
    if not has_gpu:
        return torch_dtype("fp32")
    from helpers.env import choose_precision, detect_gpus

    return torch_dtype(choose_precision(detect_gpus()).name)


def _choose(model_id: str, *, smoke: bool, needs_gpu: bool, has_gpu: bool):
    """What to load, printing the banner when it is the embedded model instead: (folder or hub id, load offline)."""
    source, reason, offline = _resolve(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    if reason:
        _banner(model_id, reason)
    return source, offline


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
