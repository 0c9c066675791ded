"""Which model the estimator is asked about, read into a `Shape`: its sizes and what its layers do.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; `python -m helpers plan`),
which exports `shape_of`. Each architecture family transformers names in `model_type` is read
into a `Shape` here: what the per-layer walk (`_activations`) needs to know about it.
tests/test_estimate_families.py builds a tiny random model of each family with the real
transformers class and holds the walk to the bytes it saves. Every field is read checked
(`_fields`): a config that cannot describe a model is refused here, naming the field and the fix.
Pure Python: no torch; the network only for a Hub id, and only for its config.json.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from helpers.catalog import resolve_model
from helpers.estimate._configs import (
    WAYS_IN,
    config_dict,
    config_source,
    hub_page_id,
    looks_like_hub_id,
    looks_like_path,
)
from helpers.estimate._fields import ConfigFields, ModelConfigError, check_heads, check_shape

__all__ = [
    "HEAD_TARGET",
    "LINEAR_TARGETS",
    "MODEL_TYPES",
    "PEFT_NAMES",
    "Shape",
    "adapter_shapes",
    "adapts_head",
    "lora_parameters",
    "shape_of",
]

# model_type -> the estimator's family; the Llama family's walk also fits Mistral and Qwen
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gemma3": "gemma",  # the multimodal config: its text_config is the language model
    "phi3": "phi3",
    "gpt_neox": "neox",
    "gpt2": "gpt2",
    "bert": "bert",
}
# what a config must name, whatever its defaults (GPT-2 spells its own)
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_GPT2_REQUIRED = ("n_embd", "n_layer", "n_head", "vocab_size", "n_positions")
LINEAR_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Shape:
    """The architecture facts the estimator needs, read from a config or the catalog."""

    family: str  # "llama" (also Mistral, Qwen2/3, SmolLM2), "gemma" (1, 2, 3), "phi3", "gpt2", "neox", "bert"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    act: str = "silu"
    tied: bool = False
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0  # GPT-2 and BERT drop after attention, after the MLP and after embeddings
    attn_impl: str = "sdpa"  # "eager", "sdpa" or "flash_attention_2"
    qkv_bias: bool = False
    max_positions: int = 0  # learned position table size (GPT-2, BERT; no seq_len past it); 0 with rotary
    head: str = "lm"  # "lm": logits over the vocabulary; "classifier": num_labels logits per sequence
    num_labels: int = 0  # classifier outputs
    type_vocab: int = 0  # BERT's token-type (segment) embeddings
    qkv_fused: bool = False  # one fused q/k/v projection (litgpt's GPT; always for Phi-3, GPT-2, GPT-NeoX)
    embed_dropout: float = 0.0  # dropout on the embeddings' output (GPT-2, BERT, Phi-3, GPT-NeoX)
    qk_norm: bool = False  # an RMSNorm over each head's query and key (Qwen3, Gemma 3)
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 2, Gemma 3)
    attn_softcap: float = 0.0  # tanh soft-capping of the attention scores (Gemma 2, eager only)
    logit_softcap: float = 0.0  # tanh soft-capping of the logits (Gemma 2)
    rotary_fraction: float = 1.0  # share of each head's dimensions rotated (GPT-NeoX: 0.25)
    parallel_residual: bool = False  # attention and MLP read the same input (GPT-NeoX, Pythia)
    # the forward returns a key/value cache (the config's use_cache; BERT has none): a setting of the
    # run, not of the architecture, so two shapes that differ only here are the same model
    use_cache: bool = field(default=True, compare=False)
    # what an estimate says about the model beside its bytes, so not compared either: the name it was read
    # as (a catalog name, a Hub id, the config's _name_or_path; "" when none), the positions a rotary model
    # was trained on (max_position_embeddings, the catalog's context; 0: not known) and the RoPE scaling
    # its config asks for ("yarn, factor 4"; "": none; None: not read from a config)
    name: str = field(default="", compare=False)
    context: int = field(default=0, compare=False)
    rope_scaling: str | None = field(default=None, compare=False)

    def __post_init__(self):
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        source = f"the shape of {self.name}" if self.name else "the Shape"
        check_shape(values, source, families=tuple(dict.fromkeys(MODEL_TYPES.values())))

    @property
    def gated(self) -> bool:
        return self.family in ("llama", "gemma", "phi3")

    @property
    def layernorm(self) -> bool:
        return self.family in ("gpt2", "bert", "neox")

    @property
    def rotary(self) -> bool:
        return self.family not in ("gpt2", "bert")

    @property
    def fused_qkv(self) -> bool:
        return self.qkv_fused or self.family in ("phi3", "gpt2", "neox")

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear in one layer, by LoRA target name."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        shapes = {"q": (self.hidden, q), "k": (self.hidden, kv), "v": (self.hidden, kv), "o": (q, self.hidden)}
        shapes.update({"gate": (self.hidden, self.intermediate)} if self.gated else {})
        shapes.update({"up": (self.hidden, self.intermediate), "down": (self.intermediate, self.hidden)})
        return shapes

    def parameter_counts(self) -> dict[str, int]:
        """Parameters by where they live: quantizable linears, embeddings and head, norms and biases."""
        h, i = self.hidden, self.intermediate
        linear = self.layers * sum(a * b for a, b in self.linear_shapes().values())
        embed = self.vocab * h + self.max_positions * h + self.type_vocab * h
        if self.head == "classifier":  # BERT pools the first token through a dense layer first
            head = (h * h if self.family == "bert" else 0) + h * self.num_labels
        else:
            head = 0 if self.tied else self.vocab * h
        norm_width = 2 * h if self.layernorm else h  # weight (+ bias)
        other = ((4 if self.sandwich_norms else 2) * self.layers + 1) * norm_width
        if self.qk_norm:
            other += self.layers * 2 * self.head_dim
        if self.qkv_bias:
            other += self.layers * (self.heads + 2 * self.kv_heads) * self.head_dim
        if self.family in ("gpt2", "neox"):  # every linear has a bias
            other += self.layers * (3 * h + h + i + h)
        if self.family == "bert":  # every other linear has a bias too, and so do the pooler and the classifier
            other += self.layers * (h + i + h) + (h + self.num_labels if self.head == "classifier" else 0)
        return {"linear": linear, "embeddings": embed, "head": head, "other": other}

    @property
    def parameters(self) -> int:
        return sum(self.parameter_counts().values())


# peft's module names (target_modules) for the estimator's targets, by family; names not listed
# here are the Llama family's: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
PEFT_NAMES = {
    "phi3": {"qkv_proj": ("q", "k", "v"), "o_proj": ("o",), "gate_up_proj": ("gate", "up"), "down_proj": ("down",)},
    "neox": {"query_key_value": ("q", "k", "v"), "dense": ("o",), "dense_h_to_4h": ("up",), "dense_4h_to_h": ("down",)},
    "gpt2": {"c_attn": ("q", "k", "v"), "c_proj": ("o", "down"), "c_fc": ("up",)},
    "bert": {"query": ("q",), "key": ("k",), "value": ("v",), "dense": ("o", "up", "down")},
}
HEAD_TARGET = "lm_head"  # peft adapts the LM head only when named; "all-linear" leaves it out


def _lora_targets(shape: Shape, targets) -> tuple[str, ...]:
    """The estimator's names ("q", ...) for `targets`: "all-linear", its own names or peft's module names."""
    if targets == "all-linear":
        return tuple(t for t in LINEAR_TARGETS if t in shape.linear_shapes())
    if isinstance(targets, str):  # one module name, as peft also takes it
        targets = [targets]
    llama = {f"{t}_proj": (t,) for t in LINEAR_TARGETS}
    names = PEFT_NAMES.get(shape.family, llama)
    chosen, unknown = [], []
    for t in targets:
        if t == HEAD_TARGET:
            continue
        found = (t,) if t in LINEAR_TARGETS else names.get(t)
        (chosen.extend(found) if found else unknown.append(t))
    if unknown:
        raise ValueError(
            f"Unknown LoRA targets {unknown} for a {shape.family} model; use 'all-linear', peft's module names "
            f"({', '.join(names)}, {HEAD_TARGET}) or the estimator's {LINEAR_TARGETS}"
        )
    return tuple(t for t in dict.fromkeys(chosen) if t in shape.linear_shapes())


def adapts_head(targets) -> bool:
    """Whether LoRA goes on the LM head too (peft: target_modules naming lm_head)."""
    return targets != "all-linear" and HEAD_TARGET in ([targets] if isinstance(targets, str) else list(targets))


def adapter_shapes(shape: Shape, targets) -> dict[str, tuple[int, int]]:
    """(in, out) of each adapted module in one layer: fused projections carry one adapter."""
    linears, chosen = shape.linear_shapes(), set(_lora_targets(shape, targets))
    adapters = {t: linears[t] for t in chosen}
    if shape.fused_qkv and chosen & {"q", "k", "v"}:  # GPT-2's c_attn, Phi-3's qkv_proj
        for t in ("q", "k", "v"):
            adapters.pop(t, None)
        adapters["qkv"] = (shape.hidden, linears["q"][1] + 2 * linears["k"][1])
    if shape.family == "phi3" and chosen & {"gate", "up"}:  # Phi-3's gate_up_proj
        adapters.pop("gate", None)
        adapters["up"] = (shape.hidden, 2 * shape.intermediate)
    return adapters


def lora_parameters(shape: Shape, r: int, targets) -> int:
    """Trainable parameters of a LoRA run: the adapters, and a classifier head trained in full.

    A classification head is new, so it is trained whole (peft's task_type="SEQ_CLS" puts it in
    modules_to_save); with "all-linear", peft also adapts BERT's pooler."""
    count = shape.layers * sum(r * (i + o) for i, o in adapter_shapes(shape, targets).values())
    if adapts_head(targets) and shape.head == "lm":
        count += r * (shape.hidden + shape.vocab)
    if shape.head == "classifier":
        count += shape.hidden * shape.num_labels + (shape.num_labels if shape.family == "bert" else 0)
        if shape.family == "bert" and targets == "all-linear":
            count += r * 2 * shape.hidden
    return count


def shape_of(model) -> Shape:
    """Read a Shape from a catalog name, a config.json (or its folder), a Hub id, a dict or a config.

    Example:
        >>> shape_of("Mistral-7B").kv_heads
        8
    """
    if isinstance(model, Shape):
        return model
    if isinstance(model, str):
        model = hub_page_id(model.strip())
        try:
            match = resolve_model(model)  # a catalog name, its Hub id, or a variant of the same shapes
        except ValueError as unknown:
            if not (looks_like_path(model) or looks_like_hub_id(model)):
                raise ValueError(f"{unknown}. {WAYS_IN}") from None
        else:
            if not (match.note and looks_like_path(model)):  # a folder named like a variant is read as the folder
                name = match.variant or match.name
                try:
                    return Shape(**match.entry["shape"], name=name, context=match.context or 0)
                except ModelConfigError as e:  # a kit bug: say where
                    raise ModelConfigError(f"{e} (the catalog's entry: helpers/assets/catalog/models.json)") from None
    config, source = config_dict(model), config_source(model)
    impl = getattr(model, "_attn_implementation", None) or config.get("_attn_implementation")
    if impl is not None and not isinstance(impl, str):
        raise ModelConfigError(f"_attn_implementation={impl!r} in {source} is not a name: pass 'sdpa' or 'eager'")
    shape = _shape_from_config(config, impl, source)
    if isinstance(model, str) and looks_like_hub_id(model) and not looks_like_path(model):
        return replace(shape, name=model)  # the Hub id, not the folder it was saved from (_name_or_path)
    named = config.get("_name_or_path")
    return replace(shape, name=named.strip()) if isinstance(named, str) and named.strip() else shape


def _shape_from_config(c: dict, impl: str | None, source: str) -> Shape:
    kind = c.get("model_type", "")
    if kind == "gemma3" and "text_config" in c:  # the multimodal Gemma 3: the estimator reads its language model
        if not isinstance(c["text_config"], dict):
            raise ModelConfigError(f"text_config in {source} is not a table: pass the model's whole config.json")
        c = {"model_type": "gemma3_text", **c["text_config"]}
        kind = "gemma3_text"
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(
            f"The estimator does not know model_type {kind!r} yet; it knows {', '.join(sorted(MODEL_TYPES))}. "
            "Pick the closest catalog model instead."
        )
    family = MODEL_TYPES[kind]
    missing = [k for k in (_GPT2_REQUIRED if family == "gpt2" else _REQUIRED) if c.get(k) is None]
    if missing:
        raise ValueError(
            f"the {kind} config lacks {', '.join(repr(k) for k in missing)}: pass the model's whole config.json "
            f"(or add {missing[0]!r} to the dict); read from {source}"
        )
    # Gemma 2 has no sdpa path in transformers (its scores are soft-capped): eager unless asked
    impl = impl or ("eager" if kind == "gemma2" else "sdpa")
    return {"gpt2": _gpt2, "bert": _bert, "neox": _neox}.get(family, _decoder)(ConfigFields(c, source), impl, kind)


def _dims(f: ConfigFields, keys=("hidden_size", "num_hidden_layers", "num_attention_heads")) -> dict:
    """The sizes every family has, read from a config (GPT-2 spells them its own way), each checked."""
    h, layers, heads = (f.size(k) for k in keys)
    dims = dict(hidden=h, layers=layers, heads=heads, kv_heads=f.size("num_key_value_heads", heads))
    check_heads(dims, (keys[0], keys[2], "num_key_value_heads"), f.source, f.config.get("head_dim") is not None)
    return dims | dict(head_dim=f.size("head_dim", h // heads))


def _rotary(f: ConfigFields) -> dict:
    """A rotary model's trained context and the RoPE scaling its config asks for (`_breakdown.past_context`)."""
    return dict(context=f.size("max_position_embeddings", 0), rope_scaling=f.rope_scaling())


def _gpt2(f: ConfigFields, impl: str, kind: str) -> Shape:
    dims = _dims(f, ("n_embd", "n_layer", "n_head"))
    return Shape(
        "gpt2",
        **dims,
        intermediate=f.size("n_inner", 4 * dims["hidden"]),
        vocab=f.size("vocab_size"),
        act=f.text("activation_function", default="gelu_new"),
        tied=f.flag("tie_word_embeddings", True),
        attn_dropout=f.dropout("attn_pdrop", 0.1),
        resid_dropout=f.dropout("resid_pdrop", 0.1),
        embed_dropout=f.dropout("embd_pdrop", 0.1),
        attn_impl=impl,
        use_cache=f.flag("use_cache", True),
        max_positions=f.size("n_positions"),
    )


def _bert(f: ConfigFields, impl: str, kind: str) -> Shape:
    """An encoder trained with a classification head (BertForSequenceClassification)."""
    dropout, labels = f.dropout("hidden_dropout_prob", 0.1), f.config.get("id2label") or {}
    if not isinstance(labels, dict | list):
        raise ModelConfigError(
            f"id2label={labels!r} in {f.source} is not a table: pass e.g. id2label={{0: 'no', 1: 'yes'}}"
        )
    return Shape(
        "bert",
        **_dims(f),
        intermediate=f.size("intermediate_size"),
        vocab=f.size("vocab_size"),
        act=f.text("hidden_act", default="gelu"),
        attn_dropout=f.dropout("attention_probs_dropout_prob", 0.1),
        resid_dropout=dropout,
        embed_dropout=dropout,
        attn_impl=impl,
        use_cache=False,
        qkv_bias=True,
        max_positions=f.size("max_position_embeddings", 512),
        head="classifier",
        num_labels=f.size("num_labels", len(labels) or 2),
        type_vocab=f.size("type_vocab_size", 2),
    )


def _neox(f: ConfigFields, impl: str, kind: str) -> Shape:
    """GPT-NeoX (Pythia): LayerNorm, one fused q/k/v with biases, partial rotary, parallel residual."""
    dropout = f.dropout("hidden_dropout", 0.0)
    return Shape(
        "neox",
        **_dims(f),
        intermediate=f.size("intermediate_size"),
        vocab=f.size("vocab_size"),
        act=f.text("hidden_act", default="gelu"),
        tied=f.flag("tie_word_embeddings", False),
        attn_dropout=f.dropout("attention_dropout", 0.0),
        resid_dropout=dropout,
        embed_dropout=dropout,
        attn_impl=impl,
        use_cache=f.flag("use_cache", True),
        rotary_fraction=f.fraction("rotary_pct", 0.25),
        parallel_residual=f.flag("use_parallel_residual", True),
        **_rotary(f),
    )


def _decoder(f: ConfigFields, impl: str, kind: str) -> Shape:
    """Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3: RMSNorm, rotary, a gated MLP."""
    sandwich = kind in ("gemma2", "gemma3_text")
    return Shape(
        MODEL_TYPES[kind],
        **_dims(f),
        intermediate=f.size("intermediate_size"),
        vocab=f.size("vocab_size"),
        act=f.text("hidden_act", "hidden_activation", default="silu"),
        tied=f.flag("tie_word_embeddings", kind.startswith("gemma")),
        attn_dropout=f.dropout("attention_dropout"),
        # Phi-3 drops after attention and after the MLP (its embd_pdrop is no longer applied in transformers 5)
        resid_dropout=f.dropout("resid_pdrop"),
        attn_impl=impl,
        use_cache=f.flag("use_cache", True),
        qkv_bias=kind == "qwen2" or f.flag("attention_bias", False),
        qk_norm=kind in ("qwen3", "gemma3_text"),
        sandwich_norms=sandwich,
        attn_softcap=f.cap("attn_logit_softcapping") if sandwich else 0.0,
        logit_softcap=f.cap("final_logit_softcapping") if sandwich else 0.0,
        rotary_fraction=f.fraction("partial_rotary_factor", 1.0),
        **_rotary(f),
    )
