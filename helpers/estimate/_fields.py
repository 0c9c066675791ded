"""A model's config as the estimator reads it, field by field, each checked where it is read.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; `python -m helpers plan --model`).
`_shapes` reads every field of a config through `ConfigFields`, and every `Shape` (the catalog's, or one
built by hand) is checked by `check_shape`: a size is a whole number in a sane range (not text, not
True, not 4096.5, not NaN, not 2**63), a dropout is a probability, the heads divide what they split.
So a config with 0 heads, a hidden size written as text or -4 layers stops here, with an error that
names the field, the value, where it came from and what would work, instead of a ZeroDivisionError
deep in the walk or a negative bill that "fits". Pure Python: no torch.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["ModelConfigError", "ConfigFields", "check_heads", "check_shape", "whole_number"]


class ModelConfigError(ValueError):
    """A model's config gives a field the estimator cannot use; the message names the field, its value,
    where it came from and what would work."""


# a size's largest sane value and an example, by the config's name for it: far above any released
# model (Llama 3.1 405B: hidden 16,384, 126 layers; Gemma 3: a 262,144-token vocabulary), far below
# what would make the bill meaningless
SIZES = {
    "hidden_size": (2**20, 4096),
    "num_hidden_layers": (2**14, 32),
    "num_attention_heads": (2**14, 32),
    "num_key_value_heads": (2**14, 8),
    "head_dim": (2**16, 128),
    "intermediate_size": (2**22, 11008),
    "vocab_size": (2**24, 32000),
    "max_position_embeddings": (2**30, 4096),
    "n_embd": (2**20, 768),
    "n_layer": (2**14, 12),
    "n_head": (2**14, 12),
    "n_inner": (2**22, 3072),
    "n_positions": (2**30, 1024),
    "type_vocab_size": (2**16, 2),
    "num_labels": (2**20, 2),
}
# the same sizes as a Shape names them; (least, most, example): 0 means "none" where a Shape allows it
_SHAPE_SIZES = {
    "hidden": (1, *SIZES["hidden_size"]),
    "layers": (1, *SIZES["num_hidden_layers"]),
    "heads": (1, *SIZES["num_attention_heads"]),
    "kv_heads": (1, *SIZES["num_key_value_heads"]),
    "head_dim": (1, *SIZES["head_dim"]),
    "intermediate": (1, *SIZES["intermediate_size"]),
    "vocab": (1, *SIZES["vocab_size"]),
    "max_positions": (0, *SIZES["n_positions"]),  # 0: rotary, no learned table
    "num_labels": (0, *SIZES["num_labels"]),  # 0: an LM head
    "type_vocab": (0, *SIZES["type_vocab_size"]),
    "context": (0, *SIZES["max_position_embeddings"]),  # 0: not known
}


def whole_number(value, name: str, source: str, least: int = 1, most: int | None = None, example=None) -> int:
    """`value` as an int when it is a whole number from `least` to `most` (4096.0 is 4096), else ModelConfigError."""
    most, example = (most, example) if most is not None else SIZES[name]
    if isinstance(value, float) and value.is_integer():  # JSON may write a size as 4096.0
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        text = isinstance(value, str) and value.strip().isdigit()
        fix = f"{name}={int(value)} (a number, not text)" if text else f"e.g. {name}={example}"
        raise ModelConfigError(f"{name}={value!r} in {source} is not a whole number: pass {fix}")
    if not least <= value <= most:
        raise ModelConfigError(
            f"{name}={value!r} in {source} is out of range: pass a whole number from {least} to {most:,}, "
            f"e.g. {name}={example}"
        )
    return int(value)


def _number(value, name: str, source: str, inside, span: str, what: str, example):
    """A finite real number for which `inside(value)` holds (`span` says where that is), else ModelConfigError."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not (real and inside(value)):
        raise ModelConfigError(
            f"{name}={value!r} in {source} is not {what}: pass a number {span}, e.g. {name}={example}"
        )
    return value


def _probability(value, name: str, source: str):
    span, what = "from 0 up to 1 (1 excluded)", "a dropout probability"
    return _number(value, name, source, lambda p: 0 <= p < 1, span, what, 0.1)


def _fraction(value, name: str, source: str):
    span, what = "above 0, up to 1", "a fraction of each head"
    return _number(value, name, source, lambda p: 0 < p <= 1, span, what, 0.25)


def _cap(value, name: str, source: str):
    return _number(value, name, source, lambda c: c >= 0, "from 0 up (0: none)", "a soft-capping bound", 30.0)


def _nearest_divisor(n: int, near: int) -> int:
    """The divisor of `n` closest to `near` (the larger on a tie)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - near), -d))


def check_heads(dims: dict, names: tuple[str, str, str], source: str, head_dim_given: bool) -> None:
    """The heads split the hidden size (unless head_dim says their width) and the key/value heads split the heads.

    `names`: the source's names for the hidden size, the heads and the key/value heads."""
    hidden, heads, kv = dims["hidden"], dims["heads"], dims["kv_heads"]
    hidden_name, heads_name, kv_name = names
    if not head_dim_given and hidden % heads:
        raise ModelConfigError(
            f"{heads_name}={heads} does not divide {hidden_name}={hidden} in {source}: each head takes "
            f"{hidden_name} / {heads_name} dimensions; pass a divisor of {hidden} such as "
            f"{heads_name}={_nearest_divisor(hidden, heads)}, or give head_dim"
        )
    if heads % kv:
        raise ModelConfigError(
            f"{kv_name}={kv} does not divide {heads_name}={heads} in {source}: each key/value head "
            f"serves a whole number of query heads; pass a divisor of {heads} such as "
            f"{kv_name}={_nearest_divisor(heads, kv)}"
        )


class ConfigFields:
    """A config dict's fields, each read checked: `source` is where it came from, as an error says it."""

    def __init__(self, config: dict, source: str):
        self.config, self.source = config, source

    def size(self, key: str, default=None):
        """A whole-number size (SIZES); `default` when the config leaves it out or null."""
        value = self.config.get(key)
        return default if value is None else whole_number(value, key, self.source)

    def dropout(self, key: str, default: float = 0.0):
        value = self.config.get(key)
        return default if value is None else _probability(value, key, self.source)

    def cap(self, key: str):
        value = self.config.get(key)
        return 0.0 if value is None else _cap(value, key, self.source)

    def fraction(self, key: str, default: float):
        """The share of each head rotary rotates: the config's `key`, else its rope table's, else `default`."""
        if self.config.get(key) is not None:
            return _fraction(self.config[key], key, self.source)
        table_name, table = self.rope()
        value = table.get("partial_rotary_factor")
        return default if value is None else _fraction(value, f"{table_name}['partial_rotary_factor']", self.source)

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelConfigError(f"{key}={value!r} in {self.source} is not true or false: pass {key}={default}")
        return value

    def text(self, *keys: str, default: str) -> str:
        """The first of `keys` the config gives (an activation's name), else `default`."""
        for key in keys:
            value = self.config.get(key)
            if value is None or value == "":
                continue
            if not isinstance(value, str):
                raise ModelConfigError(f"{key}={value!r} in {self.source} is not a name: pass e.g. {key}={default!r}")
            return value
        return default

    def rope(self) -> tuple[str, dict]:
        """The rotary settings' table (transformers 5: rope_parameters; before: rope_scaling) and its name."""
        for key in ("rope_parameters", "rope_scaling"):
            value = self.config.get(key)
            if value is None or value == {}:
                continue
            if not isinstance(value, dict):
                raise ModelConfigError(
                    f"{key}={value!r} in {self.source} is not a table: pass a dict such as "
                    f"{key}={{'rope_type': 'default', 'rope_theta': 10000.0}}, or leave it out"
                )
            return key, value
        return "rope_parameters", {}

    def rope_scaling(self) -> str:
        """The RoPE scaling the config asks for, in words ("yarn, factor 4"); "" when it asks for none."""
        _, table = self.rope()
        tables = [t for t in table.values() if isinstance(t, dict)] or [table]  # Gemma 3: one per attention type
        for t in tables:
            kind = t.get("rope_type") or t.get("type") or "default"
            if kind != "default":
                factor = t.get("factor")
                real = isinstance(factor, numbers.Real) and not isinstance(factor, bool)
                return f"{kind}, factor {factor:g}" if real else str(kind)
        return ""


def check_shape(values: dict, source: str, families: tuple[str, ...]) -> None:
    """A Shape's own fields (the catalog's, or one built by hand): the family, sizes, probabilities, fractions."""
    if values["family"] not in families:
        raise ModelConfigError(f"family={values['family']!r} in {source}: pass one of {', '.join(families)}")
    for name, (least, most, example) in _SHAPE_SIZES.items():
        whole_number(values[name], name, source, least, most, example)
    check_heads(values, ("hidden", "heads", "kv_heads"), source, head_dim_given=True)
    for name in ("attn_dropout", "resid_dropout", "embed_dropout"):
        _probability(values[name], name, source)
    _fraction(values["rotary_fraction"], "rotary_fraction", source)
    for name in ("attn_softcap", "logit_softcap"):
        _cap(values[name], name, source)
    if values["head"] not in ("lm", "classifier"):
        raise ModelConfigError(f"head={values['head']!r} in {source}: pass head='lm' or head='classifier'")
