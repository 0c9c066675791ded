"""Does a checkpoint fit the model it will be loaded into: tensor names and shapes, adapter settings.

Private to the package: `helpers.resume` runs it for `check_checkpoint(..., model=...)` and
`latest_valid_checkpoint(..., model=...)` (taught in notebook 08; the exported train.py of
`python -m helpers export 08` passes its model). The Trainer finds out only when it loads the
weights, with a size-mismatch traceback, or not at all (a tensor it does not know is left out with
a warning, the same shapes under another base model or LoRA alpha load without a word). Here the
shapes come from the files' headers, no tensor data is read: a 7B checkpoint costs one header read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path, PurePosixPath

from helpers.manifest import MANIFEST_NAME

__all__ = ["check_fit"]

ADAPTER_CONFIG = "adapter_config.json"
# the adapter settings that change what the saved tensors mean, even at the same shapes (r, for its
# plain message). Not target_modules: peft writes the same modules as short names or as full paths, and
# the saved tensors' names say exactly which modules carry an adapter.
ADAPTER_SETTINGS = ("peft_type", "base_model_name_or_path", "r", "lora_alpha", "use_dora", "use_rslora")


def check_fit(folder: Path, model, files: list[str]) -> list[str]:
    """What in the checkpoint was saved from another model or adapter than `model`: adapter settings, then
    the tensors in its weight `files` (names in `folder`, whole: `helpers.resume` checked their structure)."""
    adapter = model.active_adapter if getattr(model, "peft_config", None) else None
    problems = _adapter_settings(folder, model.peft_config[adapter]) if adapter else []
    expected, tied = _model_shapes(model, adapter)
    saved = {key: shape for name in files for key, shape in _saved_shapes(folder / name).items()}
    where, origin = " and ".join(files), _origin(folder, model)
    differ = sorted(key for key in expected.keys() & saved.keys() if expected[key] != saved[key])
    if differ:
        key = differ[0]
        problems.append(
            f"{where} holds {len(differ)} tensor(s) of another shape than this model's: {key} is "
            f"{saved[key]} in the checkpoint, {expected[key]} in this model{origin}"
        )
    # a tied weight (the head sharing the embeddings) is saved once, under one of its names
    missing = sorted(key for key in expected.keys() - saved.keys() if not tied.get(key, set()) & saved.keys())
    if missing:
        problems.append(f"{where} lacks {len(missing)} tensor(s) this model has, e.g. {missing[0]}{origin}")
    extra = sorted(saved.keys() - expected.keys())
    if extra:
        problems.append(f"{where} holds {len(extra)} tensor(s) this model does not have, e.g. {extra[0]}{origin}")
    return problems


def _adapter_settings(folder: Path, config) -> list[str]:
    """Where the saved adapter's settings differ from the model's adapter. The Trainer loads the saved tensors
    into the model's adapter as it is, so an adapter trained at another alpha (a scale) or on another base
    model would go on as something else without a word."""
    path = folder / ADAPTER_CONFIG
    if not path.is_file():  # not needed to resume (the model's adapter exists already), so nothing to compare
        return []
    try:
        saved = json.loads(path.read_text())
    except ValueError as e:  # bad JSON or not UTF-8
        return [f"{ADAPTER_CONFIG} does not parse ({type(e).__name__}), so the adapter's settings cannot be compared"]
    if not isinstance(saved, dict):
        return [f"{ADAPTER_CONFIG} is a JSON {type(saved).__name__}, not an adapter's settings"]
    ours = config.to_dict()
    return [
        f"{ADAPTER_CONFIG} has {key} = {_setting(saved[key])!r}, this model's adapter {_setting(ours.get(key))!r}"
        for key in ADAPTER_SETTINGS
        if key in saved and _compared(key, saved[key]) != _compared(key, ours.get(key))
    ]


def _setting(value):
    """An adapter setting as JSON holds it: peft keeps peft_type as an enum."""
    return getattr(value, "value", value)


def _compared(key: str, value):
    """What must match: the base model by its name alone (the last part of its Hub id or path, any case), as
    the same model sits in another folder on another machine, in a checkout or in site-packages."""
    value = _setting(value)
    if key == "base_model_name_or_path" and isinstance(value, str):
        return PurePosixPath(value.replace("\\", "/").rstrip("/")).name.casefold()
    return value


def _model_shapes(model, adapter: str | None) -> tuple[dict[str, tuple], dict[str, set[str]]]:
    """({tensor name: shape} as the Trainer saves this model, {name: the other names of its tied tensor})."""
    if adapter:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model, adapter_name=adapter)
        return {key: tuple(value.shape) for key, value in state.items()}, {}
    state = model.state_dict()
    by_storage: dict[int, set[str]] = {}
    for key, value in state.items():
        by_storage.setdefault(value.data_ptr(), set()).add(key)
    tied = {key: names - {key} for names in by_storage.values() if len(names) > 1 for key in names}
    return {key: tuple(value.shape) for key, value in state.items()}, tied


def _saved_shapes(path: Path) -> dict[str, tuple]:
    """{tensor name: shape} of a weights file, from its header (safetensors) or as meta tensors (.bin): no data read."""
    if path.name.endswith(".index.json"):
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        return {key: shape for shard in shards for key, shape in _saved_shapes(path.parent / shard).items()}
    if path.suffix == ".safetensors":
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        return {key: tuple(tensor["shape"]) for key, tensor in header.items() if key != "__metadata__"}
    import torch

    return {key: tuple(value.shape) for key, value in torch.load(path, map_location="meta", weights_only=True).items()}


def _origin(folder: Path, model) -> str:
    """The model the checkpoint's manifest names when it is another: " (saved from model 'X', this run's is 'Y')"."""
    from helpers.models import EMBEDDED_ID, is_embedded

    ours = EMBEDDED_ID if is_embedded(model) else getattr(model.config, "_name_or_path", None)
    try:
        saved = json.loads((folder / MANIFEST_NAME).read_text())["model"]["id"]
    except (OSError, ValueError, KeyError, TypeError):  # no manifest, or one that cannot say
        return ""
    return f" (saved from model {saved!r}, this run's is {ours!r})" if saved != ours else ""
