"""Whether a checkpoint is saved pre-quantized, and in which format, read from its config.json alone.

Private to `helpers.qlora` (notebook 05's `load_qlora`, notebook 08's `save_quantized`): a
bitsandbytes 4-bit checkpoint is loaded as saved; an 8-bit, GPTQ or AWQ one is refused here,
before any weights are fetched, not after a 5 GB download.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

__all__ = ["saved_4bit"]


def saved_4bit(source, *, revision: str | None, offline: bool) -> str:
    """The bitsandbytes 4-bit format `source` is saved in ("nf4, double quantization"); "" if not pre-quantized.

    Reads config.json alone, before any weights are fetched: an 8-bit, GPTQ or AWQ checkpoint is
    refused here, not after a 5 GB download.
    """
    path = Path(source) / "config.json" if Path(source).is_dir() else _hub_config(str(source), revision, offline)
    exists = path is not None and Path(path).is_file()  # no config.json: an adapter folder; the load says what to do
    saved = json.loads(Path(path).read_text(encoding="utf-8")).get("quantization_config") if exists else None
    if not saved:
        return ""
    # configs written before transformers 4.30 name no quant_method
    method = saved.get("quant_method") or ("bitsandbytes" if {"load_in_4bit", "load_in_8bit"} & set(saved) else None)
    if method == "bitsandbytes" and saved.get("load_in_4bit"):
        double = "double quantization" if saved.get("bnb_4bit_use_double_quant") else "no double quantization"
        return f"{saved.get('bnb_4bit_quant_type', 'fp4')}, {double}"
    names = {"bitsandbytes": "8-bit bitsandbytes (LLM.int8)", "gptq": "GPTQ", "awq": "AWQ", None: "an unnamed format"}
    what = names.get(method, method)
    bits = f", bits={saved['bits']}" if "bits" in saved else ""
    raise ValueError(
        f"{str(source)!r} is saved pre-quantized in {what} (its config.json: quant_method={method!r}{bits}); "
        "load_qlora trains on a bitsandbytes 4-bit base and cannot make one from these weights. Pass the bf16/fp16 "
        "model it was made from (e.g. 'Qwen/Qwen2.5-7B', quantized to NF4 while loading), or a bitsandbytes 4-bit "
        "checkpoint (e.g. 'unsloth/Qwen2.5-7B-bnb-4bit', or a folder save_quantized wrote)."
    )


def _hub_config(model_id: str, revision: str | None, offline: bool) -> str | None:
    """The Hub model's config.json on disk: fetched when online (bounded), else the Hub cache's; None if neither."""
    from huggingface_hub import get_token, hf_hub_download, try_to_load_from_cache

    from helpers import models  # at call time: the bounds and call_within as the caller set them

    if not offline:  # the first file `_fetch` downloads anyway, bounded as its file list is
        fetch = dict(revision=revision, endpoint=models.hub_endpoint(), token=get_token())
        # no answer, no such model: the cache's copy, or none; the load's own fetch then falls back or says why
        with contextlib.suppress(Exception):
            return models.call_within(models.HUB_METADATA_TIMEOUT_S, hf_hub_download, model_id, "config.json", **fetch)
    try:
        path = try_to_load_from_cache(model_id, "config.json", revision=revision)
    except ValueError:  # not a valid repo id: the load names it
        return None
    return path if isinstance(path, str) else None
