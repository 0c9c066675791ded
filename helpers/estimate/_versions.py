"""Which library release changed what a training step keeps: the estimator's facts keyed by versions.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy). The same job needs different
bytes under different releases of transformers, peft and bitsandbytes: where the logits are upcast
for the loss, whether a 4-bit linear keeps its input, what dtype the adapters are built in. Each
`Term` names the package, the releases it holds for (`since` included, `until` not), the `Harness`
facts it sets there and where in the library's source the change is. `harness_for` turns a mapping
of versions into those facts, `installed_versions` reads the installed ones; for the kit's pins
(requirements.txt) no term holds, so the facts are `Harness()`'s. Pure Python: no torch.

Releases compared for the terms: transformers' wheels from PyPI, the git history of peft and
bitsandbytes. The loss's boundaries were measured on the CPU allocator too (the peak of one forward
and backward with labels, each release's own modeling code): Llama at 4.45.2, 4.46.0, 4.48.3 and
4.49.0, GPT-2 under autocast at 4.48.2, 4.48.3 and 4.49.0.

| transformers | at the loss (Llama's `ForCausalLM.forward`)                                      |
|--------------|----------------------------------------------------------------------------------|
| 4.28 - 4.30  | 16-bit logits, a 16-bit shifted copy, cross_entropy's own fp32 cast under autocast |
| 4.31 - 4.45  | fp32 logits (`logits.float()` in the forward, 16-bit freed), an fp32 shifted copy  |
| 4.46 - 4.48  | 16-bit logits, `ForCausalLMLoss`'s fp32 upcast, an fp32 shifted copy             |
| 4.49 on      | 16-bit logits, the fp32 upcast; the labels are shifted, not the logits            |

Documented changes the estimator does not key to versions (each with its source):
- transformers 5.0.0 checkpoints non-reentrant unless told otherwise (PR #43203; 4.35 to 4.57 passed
  use_reentrant=True, PR #28538): under reentrant checkpointing the forward builds no graph, so
  `quant_keeps_input`'s inputs live only while their layer is recomputed. The kit passes
  use_reentrant=False itself (helpers.training, helpers.qlora).
- bitsandbytes' 8-bit matmul (MatMul8bitLt) keeps its input on the ctx whenever it needs a gradient,
  in every release to 0.50; before 0.45.0 (81e6345d, #1401) also its int8 transpose, and the input
  even when nothing needs a gradient. The estimator counts no kept input for int8 weights.
- peft's LoRA dropout of 0 is the identity in every release (nn.Identity since v0.3.0, 053573e0d;
  `lambda x: x` before): no copy, no mask.
- transformers' `num_logits_to_keep` / `logits_to_keep` (4.45, PR #31292) is 0 in training: every
  position's logits, as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from importlib import metadata

from helpers.estimate._job import Harness

__all__ = ["PACKAGES", "TERMS", "Term", "harness_for", "installed_versions"]

PACKAGES = ("transformers", "peft", "bitsandbytes")
# transformers' model_type of the modeling files that moved together, or the estimator's family name
# ("neox" is GPT-NeoX; "llama" reads as Llama, whose Mistral and Qwen2 cousins moved on their own)
_LLAMA = ("llama",)
_COPIES_OF_LLAMA = ("qwen2", "gemma", "gemma2", "phi3")
_NEOX = ("gpt_neox", "neox")
_FORWARD_UPCAST = {"logits_upcast": "forward", "logits_shift_copy": "fp32"}
_NO_UPCAST = {"logits_upcast": "none", "logits_shift_copy": "compute"}


# a PEP 440 version's release segment, after an optional epoch ("1!"); what follows it (".dev0", "rc1",
# "+cu128") is dropped. Parsed here rather than with `packaging`, which `import helpers` must not need:
# the install cell imports the kit before pip has installed anything (tests/test_install_cell.py)
RELEASE = re.compile(r"\s*v?(?:\d+!)?(\d+(?:\.\d+)*)")


def _release(package: str, version: str) -> tuple[int, ...]:
    """`version`'s release as numbers ("4.49.0.dev0" counts as 4.49.0, "2.0" as 2.0.0); an error says what parses."""
    found = RELEASE.match(version) if isinstance(version, str) else None
    if found is None:
        raise ValueError(f"{package} version {version!r} is not a version number: pass e.g. '4.46.0'")
    numbers = tuple(int(part) for part in found.group(1).split("."))
    return numbers + (0,) * (3 - len(numbers))


@dataclass(frozen=True)
class Term:
    """One change of the bill: `facts` (Harness fields) hold for `package` releases since <= v < until.

    since, until: release numbers ("4.46.0"); None leaves that side open. models: the transformers
    model_types (or estimator families) whose modeling code changed; () for every model. source:
    the release and the commit or pull request that made the change.
    """

    package: str
    since: str | None
    until: str | None
    facts: dict = field(hash=False)
    models: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self):
        unknown = set(self.facts) - {f.name for f in fields(Harness)}
        if unknown:
            raise ValueError(f"Term for {self.package} sets {sorted(unknown)}, which are not Harness facts")
        if self.since and self.until and _release(self.package, self.since) >= _release(self.package, self.until):
            raise ValueError(f"Term for {self.package}: since={self.since} is not before until={self.until}")

    def holds(self, version: str | None, model_type: str) -> bool:
        """True when this term applies to `version` of its package (None: not installed) and the model."""
        if version is None or (self.models and model_type not in self.models):
            return False
        v = _release(self.package, version)
        return (self.since is None or v >= _release(self.package, self.since)) and (
            self.until is None or v < _release(self.package, self.until)
        )


TERMS = (
    # 1. where a causal LM's logits become fp32 for the loss, and whether the loss copies them shifted
    Term(
        "transformers",
        None,
        "4.31.0",
        _NO_UPCAST,
        _LLAMA,
        "v4.30.2 LlamaForCausalLM.forward: CrossEntropyLoss on logits[..., :-1, :].contiguous(), no upcast",
    ),
    # the 16-bit copy: 4.46 keeps the model's 16-bit logits beside the loss's fp32 upcast (one more
    # 16-bit copy, per_device_batch x seq_len x vocab x 2 bytes; 8,192,000 measured at 2 x 64 x 32000)
    Term(
        "transformers",
        "4.31.0",
        "4.46.0",
        _FORWARD_UPCAST,
        _LLAMA,
        "v4.31.0 (Llama 2, PR #24891) added `logits = logits.float()` to LlamaForCausalLM.forward; "
        "v4.46.0 returns the 16-bit logits and calls self.loss_function (ForCausalLMLoss, PR #34191), "
        "which upcasts them (see also PRs #31292, #33902, #34147 and issue #30860)",
    ),
    Term(
        "transformers",
        None,
        "4.46.0",
        _FORWARD_UPCAST,
        _COPIES_OF_LLAMA,
        "v4.45.2 Qwen2/Gemma/Gemma2/Phi3ForCausalLM.forward upcast with logits.float(); v4.46.0 call "
        "self.loss_function (PR #34191)",
    ),
    Term(
        "transformers",
        None,
        "4.48.0",
        _FORWARD_UPCAST,
        ("mistral",),
        "v4.47.1 MistralForCausalLM.forward still upcasts under `if labels is not None`; v4.48.0 calls "
        "self.loss_function",
    ),
    Term(
        "transformers",
        None,
        "4.48.3",
        _NO_UPCAST,
        ("gpt2",),
        "v4.48.2 GPT2LMHeadModel.forward: CrossEntropyLoss on lm_logits[..., :-1, :].contiguous(), no "
        "upcast; v4.48.3 calls self.loss_function",
    ),
    Term(
        "transformers",
        None,
        "4.49.0",
        _NO_UPCAST,
        _NEOX,
        "v4.48.3 GPTNeoXForCausalLM.forward: CrossEntropyLoss on lm_logits[:, :-1, :].contiguous(), no "
        "upcast; v4.49.0 calls self.loss_function (likely the gpt_neox refactor, PR #35610)",
    ),
    # the shifted copy: ForCausalLMLoss copied the upcast logits shifted by one until 4.49, which pads
    # the labels instead (PR #35646): per_device_batch x (seq_len - 1) x vocab x 4 bytes fewer
    Term(
        "transformers",
        "4.46.0",
        "4.49.0",
        {"logits_shift_copy": "fp32"},
        _LLAMA + _COPIES_OF_LLAMA,
        "v4.48.3 loss/loss_utils.py ForCausalLMLoss: shift_logits = logits[..., :-1, :].contiguous() "
        "after logits.float(); v4.49.0 pads the labels (PR #35646)",
    ),
    Term("transformers", "4.48.0", "4.49.0", {"logits_shift_copy": "fp32"}, ("mistral",), "as above, from v4.48.0"),
    Term("transformers", "4.48.3", "4.49.0", {"logits_shift_copy": "fp32"}, ("gpt2",), "as above, from v4.48.3"),
    # 2. bitsandbytes' 4-bit matmul kept its input on the ctx from 4-bit's first release (0.39.0;
    # MatMul4Bit in 4ea489d3) through 0.43.1, whatever the checkpointing (non-reentrant does not drop
    # a ctx attribute; reentrant builds no graph in the forward)
    Term(
        "bitsandbytes",
        "0.39.0",
        "0.43.2",
        {"quant_keeps_input": True},
        (),
        "MatMul4Bit.forward: ctx.tensors = (A, B) to 0.43.1; 0.43.2 keeps (None, B): 9e753741 "
        "'fix QLoRA mem bug: delete useless buffered activation' (#1270)",
    ),
    # 3. peft built the adapters in the base layer's dtype until 0.12 casts 16-bit ones to fp32
    Term(
        "peft",
        None,
        "0.12.0",
        {"adapters_upcast": False},
        (),
        "v0.11.1 LoraLayer.update_layer: self.to(weight.device, dtype=weight.dtype); v0.12.0 casts "
        "fp16/bf16 adapters to fp32 (autocast_adapter_dtype): ae1ae20b7 (#1706)",
    ),
)


def installed_versions(packages=PACKAGES) -> dict[str, str | None]:
    """The installed version of each package, None for one that is not installed.

    Example:
        >>> installed_versions()  # doctest: +SKIP
        {'transformers': '5.23.0', 'peft': '0.21.2', 'bitsandbytes': '0.50.2'}
    """
    found = {}
    for name in packages:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def harness_for(
    versions: Mapping[str, str | None], base: Harness | None = None, *, model_type: str = "llama"
) -> Harness:
    """The harness facts that follow from library versions: `base`'s, with those the versions decide set.

    Args:
        versions: a package's version by its name ("transformers": "4.46.0"); None or a missing
            name counts as not installed (no term of that package holds). Pre-releases and dev
            builds count as their release.
        base: the facts to start from (Harness() when None); the terms that hold replace theirs.
        model_type: transformers' model_type ("llama", "mistral", "gpt2", "gpt_neox") or the
            estimator's family (Shape.family): the logits moved release by release, file by file.

    Returns:
        a Harness; `Harness()` itself for the kit's pins.

    Example:
        >>> harness_for({"transformers": "4.45.2"}).logits_upcast
        'forward'
    """
    if not isinstance(versions, Mapping):
        raise TypeError(f"versions={versions!r}: pass a mapping such as installed_versions() or {{'peft': '0.11.1'}}")
    base = Harness() if base is None else base
    facts = {}
    for term in TERMS:
        if term.holds(versions.get(term.package), model_type):
            facts.update(term.facts)
    return replace(base, **facts)
