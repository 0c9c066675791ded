"""Load the model a notebook asks for, or the embedded tiny model with a banner that says why.

Taught in notebook 00 and used by every notebook. The fallback is what lets the whole course run
headless in the tests and on a machine with no GPU or no internet: the notebook asks for a real
model (SmolLM2-135M, Qwen2.5-0.5B, a 7B) and gets the tiny one only when

- it asks for it (`smoke=True`, which `python -m helpers run --smoke` injects),
- the machine has no GPU and the model needs one (`needs_gpu=True`, the default for hub models),
- or the Hugging Face Hub cannot be reached and the model is not in the local cache.

`helpers.qlora.load_qlora` (notebook 05) chooses its model by the same rules. `load_tokenizer` loads
the tokenizer alone, by the same rules, so a job can check its data before a 7B's weights are read.

Every network call here is bounded in total time (`helpers.network.call_within`): `HUB_TIMEOUT_S` for
the check that the Hub answers at all, `HUB_METADATA_TIMEOUT_S` for the model's file list,
`HUB_DOWNLOAD_TIMEOUT_S` for its files. The files are fetched into the Hub cache first, then loaded
with no network; a Hub that stops answering midway leaves the cached copy, the embedded model (for
a course model) or an error that names the constant to raise, never a hang.
"""

from __future__ import annotations

import os
from pathlib import Path

from helpers._util import error_line, torch_dtype
from helpers.network import call_within, http_answers

__all__ = [
    "COURSE_MODELS",
    "EMBEDDED_DIR",
    "EMBEDDED_FILES",
    "EMBEDDED_ID",
    "HUB_DOWNLOAD_TIMEOUT_S",
    "HUB_METADATA_TIMEOUT_S",
    "HUB_TIMEOUT_S",
    "card_dtype",
    "choose_source",
    "embedded_dir",
    "hub_endpoint",
    "hub_reachable",
    "is_embedded",
    "load_model",
    "load_pretrained",
    "load_tokenizer",
]

EMBEDDED_DIR = Path(__file__).parent / "assets" / "tiny-llama"
EMBEDDED_ID = "embedded"  # the name notebooks and the runner use for the tiny model
EMBEDDED_FILES = (
    "chat_template.jinja",  # its chat format (notebook 08)
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
HUB_TIMEOUT_S = 5.0  # seconds for the Hub to answer at all (DNS, TLS and an HTTP reply), else offline
HUB_METADATA_TIMEOUT_S = 30.0  # seconds for the model's file list
HUB_DOWNLOAD_TIMEOUT_S = 3600.0  # seconds for all its files: a 7B in bf16 (15 GB) needs 4.2 MB/s
LOAD_HINT = (
    "Check the model id on huggingface.co (gated models such as Llama need `hf auth login` after "
    "accepting the licence), or pass smoke=True."
)
# what from_pretrained reads from a model repository's top level, besides the weights
HUB_FILE_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".tiktoken")

# The models the notebooks name. Offline, these fall back to the embedded model; any other id
# that is neither cached nor a local folder is an error, since it is more likely a typo.
COURSE_MODELS = (
    "HuggingFaceTB/SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-360M",
    "Qwen/Qwen2.5-0.5B",
    "Qwen/Qwen2.5-7B",
    "unsloth/Qwen2.5-7B-bnb-4bit",  # the same 7B saved in 4-bit NF4 (notebook 08's default)
    "mistralai/Mistral-7B-v0.1",
    "meta-llama/Llama-2-7b-hf",
)


def hub_reachable(timeout: float | None = None) -> bool:
    """True when the Hub sends an HTTP reply within `timeout` seconds in total (default: HUB_TIMEOUT_S, read now,
    so a notebook that sets `models.HUB_TIMEOUT_S` is heard).

    An answer, not only a connection: an endpoint that accepts and never answers is unreachable.
    Honours HF_HUB_OFFLINE and HF_ENDPOINT (`helpers.network.http_answers`).
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    return http_answers(hub_endpoint(), HUB_TIMEOUT_S if timeout is None else timeout)


def hub_endpoint() -> str:
    """The Hub's address: $HF_ENDPOINT (a mirror) when set, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


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
        dtype: torch dtype of the weights; default torch.float32 on every machine, which is what
            training these weights needs: the Trainer's fp16 / bf16 switches compute in half
            precision from fp32 master weights, while weights loaded in fp16 and stepped by AdamW
            end in NaN. Pass torch.bfloat16 / torch.float16 for a frozen base or inference.
        revision: a Hub branch, tag or commit to pin (recorded by the run manifest).

    Returns:
        (model, tokenizer), the model on the GPU when there is one.

    Example:
        >>> model, tokenizer = load_model("HuggingFaceTB/SmolLM2-135M", smoke=True)  # doctest: +SKIP
    """
    import torch

    has_gpu = torch.cuda.is_available()
    source, offline = choose_source(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=has_gpu)
    if dtype is None:
        dtype = torch.float32  # never a card's half precision unasked: see the docstring
    model, tokenizer = load_pretrained(source, dtype=dtype, revision=revision, local_only=offline)
    if has_gpu:
        model = model.to("cuda")
    return model, tokenizer


def load_tokenizer(model_id: str = EMBEDDED_ID, *, smoke: bool = False, needs_gpu: bool = True, revision=None):
    """The tokenizer `load_model(model_id, ...)` would load, with no weights fetched or read: (tokenizer, source).

    `source` is what the choice fell on (a folder, or the Hub id now in the cache): pass it to
    `load_model` / `load_qlora` next, and the model is the one this tokenizer belongs to, with no second
    banner. The exported train.py checks its data with it before the model loads.

    Example:
        >>> tokenizer, source = load_tokenizer("Qwen/Qwen2.5-7B")  # doctest: +SKIP
        >>> model, _ = load_qlora(str(source))  # doctest: +SKIP
    """
    import torch

    source, offline = choose_source(model_id, smoke=smoke, needs_gpu=needs_gpu, has_gpu=torch.cuda.is_available())
    why = "" if offline else _fetch(source, revision, weights=False)
    if why and _in_cache(source):
        print(f"{why}; using the copy of {source} in the local Hub cache instead")
    elif why:
        source = _fall_back(source, why)
    try:
        return _tokenizer(source, revision), source
    except OSError as e:
        raise ValueError(f"Could not load the tokenizer of {str(source)!r}: {e}\n{LOAD_HINT}") from e


def card_dtype():
    """The card's compute precision as a dtype: bf16 at compute capability >= 8.0, fp16 below (a T4), fp32 on CPU.

    For what a card computes in (a 4-bit model's compute dtype), never for trainable weights:
    those stay fp32 (pure fp16 AdamW ends in NaN). Follows a simulated card (`helpers.simulate`).
    """
    from helpers.env import choose_precision, detect_gpus

    return torch_dtype(choose_precision(detect_gpus()).name)


def choose_source(model_id: str, *, smoke: bool, needs_gpu: bool, has_gpu: bool):
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
        return embedded_dir(), "a quick run: the embedded tiny model was asked for (smoke=True)", True
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


def _fetch(model_id: str, revision: str | None, *, weights: bool = True) -> str:
    """Download the files from_pretrained reads into the Hub cache (without the weights: config and
    tokenizer alone): "" when done, else why not.

    Each step is bounded in total time: 1. the file list (`HUB_METADATA_TIMEOUT_S`); 2. the config,
    tokenizer and weights files (`HUB_DOWNLOAD_TIMEOUT_S` for all). The library's own calls carry no
    total timeout: a server that accepts and never answers held `from_pretrained` for good.
    Raises ValueError when the Hub answers that there is no such model (or not without a token).
    """
    from huggingface_hub import HfApi, get_token, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    endpoint, token = hub_endpoint(), get_token()  # the token here: a Colab secret may ask the user

    def download_all(files):
        for name in files:
            hf_hub_download(model_id, name, revision=revision, endpoint=endpoint, token=token)

    try:
        api = HfApi(endpoint=endpoint, token=token)
        info = call_within(HUB_METADATA_TIMEOUT_S, api.model_info, model_id, revision=revision)
        files = _files_to_fetch([s.rfilename for s in info.siblings or ()], weights=weights)
        call_within(HUB_DOWNLOAD_TIMEOUT_S, download_all, files)
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status is not None and status < 500 and status != 429:  # it answered: no such model, or a token needed
            raise ValueError(f"Could not load {model_id!r}: {error_line(e)}\n{LOAD_HINT}") from e
        return f"the Hugging Face Hub failed ({error_line(e)})"
    except TimeoutError as e:
        return f"the Hugging Face Hub stopped answering: {e}"
    except Exception as e:  # the HTTP client's own connection errors differ across its versions
        return f"the Hugging Face Hub could not be reached ({error_line(e)})"
    return ""


def _files_to_fetch(names: list[str], *, weights: bool = True) -> list[str]:
    """The repository's top-level config and tokenizer files and one copy of the weights (safetensors first)."""
    top = [n for n in names if "/" not in n]
    if not weights:
        return [n for n in top if n.endswith(HUB_FILE_SUFFIXES)]
    # "consolidated" safetensors are a second copy of the weights, in Mistral's own layout
    weights = [n for n in top if n.endswith(".safetensors") and not n.startswith("consolidated")]
    weights = weights or [n for n in top if n.startswith("pytorch_model") and n.endswith(".bin")]
    return [n for n in top if n.endswith(HUB_FILE_SUFFIXES)] + weights


def _fall_back(model_id: str, why: str) -> Path:
    """The embedded model, with the banner, for a course model the Hub did not deliver; an error otherwise."""
    if model_id in COURSE_MODELS:
        _banner(model_id, why)
        return embedded_dir()
    raise ValueError(
        f"Could not download {model_id!r}: {why}. Check the connection (Kaggle: Settings > Internet > On); on a "
        f"slow link raise helpers.models.HUB_DOWNLOAD_TIMEOUT_S (now {HUB_DOWNLOAD_TIMEOUT_S:g} s) or "
        "HUB_METADATA_TIMEOUT_S; or pass smoke=True to use the embedded tiny model."
    )


def load_pretrained(source, *, dtype, revision, local_only: bool, **model_kwargs):
    """Load tokenizer and model; `model_kwargs` go to the model only (quantization_config, device_map).

    A Hub model (`local_only=False`) is fetched into the cache first (`_fetch`, bounded in time),
    then loaded from there with no network. When the fetch fails: the copy in the cache if it is
    whole, else the embedded model for a course model, else an error that says why.
    """
    why = "" if local_only else _fetch(source, revision)
    if why and _in_cache(source):
        print(f"{why}; loading the copy of {source} in the local Hub cache instead")
    elif why:
        source = _fall_back(source, why)
    try:
        return _load_local(source, dtype=dtype, revision=revision, **model_kwargs)
    except OSError as e:
        if why and source != EMBEDDED_DIR:  # the cached copy is not whole
            return _load_local(_fall_back(source, why), dtype=dtype, revision=revision, **model_kwargs)
        raise ValueError(f"Could not load {str(source)!r}: {e}\n{LOAD_HINT}") from e


def _load_local(source, *, dtype, revision, **model_kwargs):
    """from_pretrained on files already on disk (a folder, or the Hub cache): no network at all."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    kwargs = dict(revision=revision, local_files_only=True)
    # transformers asks the Hub for an adapter_config.json even with local_files_only (and never
    # gives up on a server that does not answer) unless the adapter lookup is told so as well
    adapter = {"adapter_kwargs": {"local_files_only": True}}
    # a progress bar over the embedded model's few tiny tensors is noise in every notebook
    quiet = Path(source).resolve() == EMBEDDED_DIR.resolve() and hf_logging.is_progress_bar_enabled()
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = _tokenizer(source, revision)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs, **adapter, **model_kwargs)
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    return model, tokenizer


def _tokenizer(source, revision):
    """The tokenizer from files on disk, with a pad token (many base models ship without one; the Trainer needs it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _banner(model_id: str, reason: str) -> None:
    rule = "=" * 78
    print(
        f"{rule}\n USING THE EMBEDDED TINY MODEL instead of {model_id}\n why: {reason}\n"
        " what it means: every step runs and every figure is measured, but on a tiny model;\n"
        " run on a GPU with internet for the real numbers.\n"
        f"{rule}"
    )
