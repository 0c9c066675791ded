"""The shipped catalogs of models and cards, and one way to look a name up in them.

Used by the estimator (notebook 01), `plan` (notebooks 01, 05, `python -m helpers plan`), the
planner (01, 08), the training audit (notebooks 02-04) and the simulated cards (`helpers.simulate`).
The catalogs are JSON under helpers/assets/catalog: "models" (architecture shapes of real models,
with their Hub ids, and the variants that share a model's shapes) and "gpus" (cards: memory,
compute capability, where students find them and, for a card the kit simulates, its `device_name`
as the driver reports it). A model's name resolves here, once for the whole kit (`resolve_model`):
the names students type ("Llama-3-8B", "Meta-Llama-3-8B-Instruct", "qwen2.5-7b-instruct") find the
entry with the same shapes, and say what else differs. Pure Python: no torch, no network.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from helpers._util import GIB

__all__ = [
    "CATALOG_DIR",
    "VARIANT_WORDS",
    "ModelMatch",
    "card_capability",
    "describe_card",
    "find",
    "gpu_bytes",
    "load_catalog",
    "model_key",
    "model_notes",
    "nearest_models",
    "resolve_model",
]

CATALOG_DIR = Path(__file__).parent / "assets" / "catalog"
_KINDS = {"models": "model", "gpus": "GPU"}


@cache
def _read(kind: str) -> dict:
    return json.loads((CATALOG_DIR / f"{kind}.json").read_text())


def load_catalog(kind: str) -> dict:
    """A shipped catalog as a dict keyed by name: kind is "models" or "gpus"."""
    if kind not in _KINDS:
        raise ValueError(f"no catalog named {kind!r}: the kit ships {', '.join(_KINDS)}")
    return json.loads(json.dumps(_read(kind)))  # a copy: callers may change theirs


def find(kind: str, name: str, *, otherwise: str = "") -> tuple[str, dict]:
    """Look `name` up in a catalog, ignoring case; return (the catalog's spelling, its entry).

    Args:
        kind: "models" or "gpus".
        name: what the caller typed, e.g. "t4" or "Mistral-7B"; a model's Hub id
            ("mistralai/Mistral-7B-v0.1") names its entry too, so it needs no network.
        otherwise: the caller's other ways in, appended to the error, e.g.
            "Or pass its memory in GiB, e.g. 15.0".

    Example:
        >>> find("gpus", "t4")[0]
        'T4'
    """
    entries = _read(kind) if kind in _KINDS else load_catalog(kind)
    names = {k.lower(): k for k in entries}
    names.update({e["hub_id"].lower(): k for k, e in entries.items() if isinstance(e, dict) and e.get("hub_id")})
    match = names.get(str(name).strip().lower())
    if match is None:
        message = f"unknown {_KINDS[kind]} {name!r}: the catalog has {', '.join(entries)}"
        raise ValueError(message + (f". {otherwise}" if otherwise else ""))
    return match, json.loads(json.dumps(entries[match]))


# words in a model's name that leave its shapes alone: instruct and chat tunes ("-Instruct", Gemma's
# "-it"), base checkpoints ("-Base", "-pt"), converted or re-uploaded copies ("-hf", "meta-" before
# Llama, unsloth's pre-quantized "-bnb-4bit")
VARIANT_WORDS = frozenset({"meta", "hf", "instruct", "it", "chat", "base", "pt", "bnb", "4bit", "unsloth"})


def model_key(text: str) -> str:
    """A model's name reduced to what decides its shapes: no organization, no case, no variant words.

    Example:
        >>> model_key("meta-llama/Meta-Llama-3-8B-Instruct"), model_key("Llama3-8B")
        ('llama-3-8b', 'llama-3-8b')
    """
    base = str(text).strip().lower().rsplit("/", 1)[-1]
    base = re.sub(r"(?<=[a-z])(?=\d)", "-", base)  # "llama3" is "llama-3"; "8b" and "4bit" stay whole
    return "-".join(t for t in re.split(r"[-_\s]+", base) if t and t not in VARIANT_WORDS)


@dataclass(frozen=True)
class ModelMatch:
    """What a model's name resolved to: the catalog entry whose shapes the estimator reads."""

    asked: str  # the name as typed
    name: str  # the catalog entry
    entry: dict  # its entry, with the variant's own shape (a larger vocabulary) applied
    variant: str = ""  # the variant of that entry the name is, if the catalog lists one
    note: str = ""  # what the student should know: "" for the entry's own name or Hub id

    @property
    def context(self) -> int | None:
        """The longest sequence the model was trained for, in tokens, where the catalog says."""
        return self.entry["variants"][self.variant]["context"] if self.variant else self.entry.get("context")


@cache
def _keys() -> dict[str, tuple[str, str]]:
    """Every catalog name, Hub id and variant, by model_key: (the entry, the variant or "")."""
    keys: dict[str, tuple[str, str]] = {}
    for name, entry in _read("models").items():
        for text in (name, entry.get("hub_id", "")):
            keys.setdefault(model_key(text), (name, ""))
        for variant, v in entry.get("variants", {}).items():
            for text in (variant, v["hub_id"]):
                keys.setdefault(model_key(text), (name, variant))
    return keys


def resolve_model(name: str) -> ModelMatch:
    """The catalog entry a model's name stands for: its own name or Hub id, a variant, or the same name
    with variant words (VARIANT_WORDS) in it, in any case; an unknown name gets the nearest ones.

    Example:
        >>> m = resolve_model("Meta-Llama-3-8B-Instruct")
        >>> m.name, m.variant
        ('Llama-3.1-8B', 'Llama-3-8B')
    """
    asked, entries = str(name).strip(), _read("models")
    exact = {k.lower(): k for k in entries} | {e["hub_id"].lower(): k for k, e in entries.items()}
    if asked.lower() in exact:
        return ModelMatch(asked, exact[asked.lower()], json.loads(json.dumps(entries[exact[asked.lower()]])))
    found = _keys().get(model_key(asked))
    if found is None:
        nearest = nearest_models(asked)
        listed = f"the nearest are {', '.join(nearest)}" if nearest else f"it has {', '.join(entries)}"
        raise ValueError(f"unknown model {asked!r}: the catalog has no such name; {listed}")
    entry_name, variant = found
    entry = json.loads(json.dumps(entries[entry_name]))
    if not variant:
        note = (
            f"{asked} is read as the catalog's {entry_name} ({entry['hub_id']}): the same shapes, so the same "
            "memory (an instruct, chat or base variant, or a re-upload: other weights)"
        )
        return ModelMatch(asked, entry_name, entry, note=note)
    v = entry["variants"][variant]
    entry["shape"].update(v.get("shape", {}))
    return ModelMatch(asked, entry_name, entry, variant, _variant_note(asked, entry_name, variant))


def _variant_note(asked: str, name: str, variant: str) -> str:
    """What a variant shares with its catalog entry and what it does not, in the catalog's figures."""
    entry = _read("models")[name]
    v = entry["variants"][variant]
    own = f"{variant} ({v['hub_id']})"
    own = own if asked.lower() == variant.lower() else f"{asked} is read as {own}, which"
    shape = [f"{_SHAPE_WORDS.get(k, k)} {n:,} ({name}: {entry['shape'][k]:,})" for k, n in v.get("shape", {}).items()]
    differs = [f"context {v['context']:,} tokens ({name}: {entry['context']:,})"] * (v["context"] != entry["context"])
    differs += [v["differs"]] if v.get("differs") else []
    return (
        f"{own} has the shapes of the catalog's {name}"
        + (f" except its {', '.join(shape)}" if shape else "")
        + (f"; it differs in: {'; '.join(differs)}" if differs else "")
        + (f"; the estimate counts its own {_SHAPE_WORDS.get(next(iter(v['shape'])), 'shapes')}" if shape else "")
        + ("" if shape else "; the same memory at a given seq_len")
    )


_SHAPE_WORDS = {"vocab": "vocabulary", "layers": "layer count", "hidden": "hidden size"}


def model_notes(model) -> list[str]:
    """What a plan should say about the model it was asked for: the catalog entry a name was read as
    (`resolve_model`), with how it differs. Empty for a config or a name the catalog does not know. A
    seq_len past the model's trained context is the estimate's own note (`Estimate.context_note`).

    Example:
        >>> model_notes("Llama-3-8B")[0][:71]
        "Llama-3-8B (meta-llama/Meta-Llama-3-8B) has the shapes of the catalog's"
    """
    try:
        match = resolve_model(model) if isinstance(model, str) else None
    except ValueError:
        return []
    return [match.note] if match is not None and match.note else []


def nearest_models(name: str, n: int = 3) -> list[str]:
    """The catalog's model and variant names closest to `name` (difflib, on `model_key`), closest first.

    Example:
        >>> nearest_models("Mistral-9B")
        ['Mistral-7B', 'Mistral-Nemo-12B', 'Mistral-7B-v0.3']
    """
    keys = _keys()
    close = difflib.get_close_matches(model_key(name), list(keys), n=2 * n, cutoff=0.5)
    return list(dict.fromkeys(keys[k][1] or keys[k][0] for k in close))[:n]


def gpu_bytes(gpu) -> int:
    """Memory of a card in bytes: a catalog name ("T4", "A100-40GB"), GiB as a float, or bytes as an int."""
    if isinstance(gpu, str):
        return int(find("gpus", gpu, otherwise="Or pass its memory in GiB, e.g. 15.0")[1]["memory_gib"] * GIB)
    if isinstance(gpu, float) and math.isfinite(gpu) and gpu > 0:
        return int(gpu * GIB)
    if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu > 0:
        return gpu
    raise ValueError(
        f"gpu must be a catalog name such as 'T4', GiB as a positive float (15.0) or bytes as a "
        f"positive int; got {gpu!r}"
    )


def card_capability(gpu) -> tuple[int, int] | None:
    """The compute capability of a catalog card, or None when `gpu` is a bare size."""
    if not isinstance(gpu, str):
        return None
    return tuple(find("gpus", gpu)[1]["capability"])


def describe_card(gpu) -> str:
    """The card and the memory a plan holds it to, saying which figure that is.

    A T4 is 15,360 MiB to nvidia-smi but 14.75 GiB to PyTorch, and only the second can be used.

    Example:
        >>> describe_card("T4")
        'T4 (14.75 GiB as PyTorch reports it; nvidia-smi shows 15,360 MiB)'
    """
    if not isinstance(gpu, str):
        return f"{gpu_bytes(gpu) / GIB:.2f} GiB"
    name, entry = find("gpus", gpu)
    if entry.get("memory_source") == "pytorch":
        smi = entry["nvidia_smi_mib"]
        return f"{name} ({entry['memory_gib']:.2f} GiB as PyTorch reports it; nvidia-smi shows {smi:,} MiB)"
    return f"{name} ({entry['memory_gib']:.2f} GiB as nvidia-smi reports it; PyTorch sees a little less)"
