"""Drift: every library API the notebooks and helpers call still exists in the pinned versions.

Notebooks rot when a library renames a class, a function or a keyword. This test reads every
`helpers/**/*.py`, `notebooks/src/*.py` and `scripts/*.py` with `ast` (new modules and notebooks are
picked up by themselves), finds what they take from the pinned libraries, and checks each in the
installed versions (those of requirements.txt):

1. every imported name and every attribute chain rooted at one (`transformers.TrainingArguments`,
   `bnb_functional.quantize_4bit` after `import bitsandbytes.functional as bnb_functional`) resolves;
2. every call's keywords are parameters of the callee (`inspect.signature`), its positional
   arguments fit, and keys of a dict literal splatted into it (`**dict(r=8)`) count as keywords;
3. a method called on an object the same scope built from a library class (`args =
   TrainingArguments(...)`, then `args.to_dict()`) exists on that class;
4. every `on_*` hook a subclass of a library class defines (itself or through a mixin in the same
   file) exists on that class: a hook the library renamed is never called, silently.

A callee that takes `**kwargs` accepts any keyword: `from_pretrained` forwards them to the config
and the model. The exceptions are callees that swallow unknown keywords with only a warning, where
a typo silently gives the default (`bnb_4bit_quant_tyep="nf4"` quantizes to fp4): those are checked
against their named parameters (STRICT_KWARGS). Keywords built by the kit's own helpers
(`TrainingArguments(**precision_kwargs())`) are checked by calling the helper (KWARGS_HELPERS).

A failure reads: DRIFT DETECTED: transformers.TrainingArguments has no keyword 'gradient_checkpointin'
(used at helpers/training.py:42).
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.env import Gpu
from helpers.maintainer.notebooks import REPO_ROOT

# The pinned libraries whose API the kit calls (torch is the runtime's own, so not pinned here).
LIBRARIES = ("transformers", "peft", "bitsandbytes", "datasets", "accelerate", "huggingface_hub", "wandb")
# Callees whose **kwargs swallows unknown names with a warning at most: check their named parameters.
STRICT_KWARGS = ("transformers.BitsAndBytesConfig",)
# The kit's helpers whose result is splatted into a library call: (helper, callee, sample arguments).
GIB = 2**30
KWARGS_HELPERS = {
    "helpers.training.precision_kwargs": (
        "transformers.TrainingArguments",
        [
            ([],),  # no GPU
            ([Gpu(0, "Tesla T4", 15 * GIB, (7, 5))],),
            ([Gpu(0, "NVIDIA A100-SXM4-40GB", 40 * GIB, (8, 0))],),
        ],
    ),
}


def source_files(root: Path = REPO_ROOT) -> list[Path]:
    """What the notebooks and the kit run: the helpers package, the notebook sources, the scripts."""
    files = [p for p in root.glob("helpers/**/*.py") if "assets" not in p.parts]
    return sorted(files + list(root.glob("notebooks/src/*.py")) + list(root.glob("scripts/*.py")))


# --- the scan: what a source takes from the libraries -------------------------------------------


@dataclass
class Use:
    """One reference to a library object: an import, an attribute chain, or a call."""

    target: str  # dotted path: "transformers.TrainingArguments"
    where: str  # "helpers/training.py:42"
    call: bool = False
    keywords: tuple[str, ...] = ()
    positional: int | None = 0  # None: a *args splat, so the count is unknown
    partial: bool = False  # a **splat of unknown keys: required parameters may come through it
    method_of_instance: bool = False  # target is Class.method, called on an instance of Class
    splat_helpers: tuple[str, ...] = ()  # helpers.* functions whose result is splatted into the call
    hook: bool = False  # target is Class.on_something, a hook a subclass overrides
    problem: str = ""  # found while scanning (a star import)


# What a name is bound to in one scope: ("lib", "transformers.Trainer") for an import,
# ("instance", "transformers.Trainer") for `x = Trainer(...)`, ("dict", ("r", "lora_alpha")) for a
# dict literal, ("other", None) for a parameter or any other assignment (it hides outer bindings).
Scope = dict


def _imports_of(body: list[ast.stmt]) -> list[ast.stmt]:
    """The import statements of a scope, not those of functions or classes nested in it."""
    found, todo = [], list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def _dict_keys(node: ast.expr) -> tuple[str, ...] | None:
    """Keys of `dict(a=1)` or `{"a": 1}` when all are plain names; else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        keys = [k.arg for k in node.keywords]
        return tuple(keys) if None not in keys else None
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.keys):
        return tuple(k.value for k in node.keys)
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, filename: str, roots: tuple[str, ...]):
        self.filename, self.roots, self.uses = filename, roots, []
        self.scopes: list[Scope] = [{}]

    def visit_Module(self, node):
        for imp in _imports_of(node.body):
            self._bind_import(imp)
        # every class of the file by name, for the hooks a mixin brings to a library subclass
        self.classes = {c.name: c for c in ast.walk(node) if isinstance(c, ast.ClassDef)}
        self.generic_visit(node)

    def visit_ClassDef(self, node):
        library_bases = [hit[0] for b in node.bases if (hit := self._dotted(b)) and not hit[1]]
        if library_bases:
            mixins = [self.classes[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in self.classes]
            for cls in [node] + mixins:
                for item in cls.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("on_"):
                        for base in library_bases:
                            self.uses.append(Use(f"{base}.{item.name}", self._where(item), hook=True))
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        for d in node.decorator_list + node.args.defaults + node.args.kw_defaults:
            if d is not None:
                self.visit(d)
        # a function sees its parameters and imports, then the scopes around it
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
        self.scopes.append({p.arg: ("other", None) for p in params})
        for imp in _imports_of(node.body):
            self._bind_import(imp)
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _lookup(self, name: str, kind: str):
        """What `name` is bound to, if it is a binding of `kind` in the innermost scope that has it."""
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name][1] if scope[name][0] == kind else None
        return None

    def _where(self, node) -> str:
        return f"{self.filename}:{node.lineno}"

    def _bind_import(self, node):
        scope = self.scopes[-1]
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in self.roots:
                    # `import a.b` binds `a`; `import a.b as x` binds x to a.b
                    scope[a.asname or a.name.split(".")[0]] = ("lib", a.name if a.asname else a.name.split(".")[0])
        elif node.level == 0 and node.module and node.module.split(".")[0] in self.roots:
            for a in node.names:
                if a.name == "*":
                    self.uses.append(
                        Use(
                            node.module,
                            self._where(node),
                            problem=f"`from {node.module} import *` hides what is used: import the names",
                        )
                    )
                else:
                    scope[a.asname or a.name] = ("lib", f"{node.module}.{a.name}")

    def visit_Import(self, node):
        for a in node.names:
            if a.name.split(".")[0] in self.roots:
                self.uses.append(Use(a.name, self._where(node)))

    def visit_ImportFrom(self, node):
        if node.level == 0 and node.module and node.module.split(".")[0] in self.roots:
            for a in node.names:
                if a.name != "*":
                    self.uses.append(Use(f"{node.module}.{a.name}", self._where(node)))

    def _dotted(self, node) -> tuple[str, bool] | None:
        """The library path an expression names, and whether it goes through an instance."""
        if isinstance(node, ast.Name):
            if (path := self._lookup(node.id, "lib")) is not None:
                return path, False
            if (cls := self._lookup(node.id, "instance")) is not None:
                return cls, True
            return None
        if isinstance(node, ast.Attribute):
            base = self._dotted(node.value)
            if base and not (base[1] and isinstance(node.value, ast.Attribute)):
                return f"{base[0]}.{node.attr}", base[1]
        return None

    def visit_Attribute(self, node):
        hit = self._dotted(node)
        if hit and not hit[1]:
            self.uses.append(Use(hit[0], self._where(node)))
        elif not hit:
            self.generic_visit(node)

    def visit_Name(self, node):
        pass  # a bare imported name: its import line already records it

    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            return
        name, scope = node.targets[0].id, self.scopes[-1]
        if scope.get(name, ("",))[0] == "lib":
            return  # an import's name reassigned: rare, and the import still says what it was
        if (keys := _dict_keys(node.value)) is not None:
            scope[name] = ("dict", keys)
        elif isinstance(node.value, ast.Call) and (hit := self._dotted(node.value.func)) and not hit[1]:
            scope[name] = ("instance", hit[0])  # checked only if the path turns out to be a class
        else:
            scope[name] = ("other", None)

    def visit_Call(self, node):
        hit = self._dotted(node.func)
        if not hit or (hit[1] and not isinstance(node.func, ast.Attribute)):
            self.generic_visit(node)
            return
        keywords, partial, helpers_splat = [], False, []
        for kw in node.keywords:
            if kw.arg is not None:
                keywords.append(kw.arg)
            elif isinstance(kw.value, ast.Name) and (keys := self._lookup(kw.value.id, "dict")) is not None:
                keywords.extend(keys)
            elif (keys := _dict_keys(kw.value)) is not None:
                keywords.extend(keys)
            else:
                partial = True
                if isinstance(kw.value, ast.Call) and (h := self._dotted_helper(kw.value.func)):
                    helpers_splat.append(h)
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        self.uses.append(
            Use(
                hit[0],
                self._where(node),
                call=True,
                keywords=tuple(keywords),
                positional=None if starred else len(node.args),
                partial=partial or starred,
                method_of_instance=hit[1],
                splat_helpers=tuple(helpers_splat),
            )
        )
        for child in node.args + [kw.value for kw in node.keywords]:
            self.visit(child)  # the callee's chain is the use just recorded; its arguments may hold more

    def _dotted_helper(self, node) -> str | None:
        """`precision_kwargs` after `from helpers.training import precision_kwargs` -> its path."""
        path = self._lookup(node.id, "lib") if isinstance(node, ast.Name) else None
        return path if path and path.startswith("helpers.") else None


def scan_source(text: str, filename: str, roots: tuple[str, ...] = LIBRARIES) -> list[Use]:
    """Everything `text` takes from the libraries in `roots` (plus helpers.*, for splatted keywords)."""
    scanner = _Scanner(filename, roots + ("helpers",))
    scanner.visit(ast.parse(text, filename))
    return [u for u in scanner.uses if u.target.split(".")[0] in roots]


def scan(files: list[Path], root: Path = REPO_ROOT) -> list[Use]:
    uses = []
    for path in files:
        uses += scan_source(path.read_text(), str(path.relative_to(root)))
    return uses


# --- the check: does each use hold in the installed versions ------------------------------------


class _Missing(Exception):
    def __init__(self, owner: str, name: str, detail: str = ""):
        self.owner, self.name, self.detail = owner, name, detail


def resolve(path: str):
    """Import `path` ("transformers.utils.logging.disable_progress_bar") attribute by attribute."""
    parts = path.split(".")
    obj = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], 1):
        owner = ".".join(parts[:i])
        try:
            obj = getattr(obj, name)
        except AttributeError:
            try:  # a submodule its package does not import by itself
                obj = importlib.import_module(f"{owner}.{name}")
            except ModuleNotFoundError:
                raise _Missing(owner, name) from None
            except Exception as e:  # noqa: BLE001 - the message says which import broke and how
                raise _Missing(owner, name, f"{type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a lazy module failing to import the name
            raise _Missing(owner, name, f"{type(e).__name__}: {e}") from None
    return obj


def _signature(obj, *, drop_self: bool):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to check against
    if drop_self:
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
    if [p.kind for p in sig.parameters.values()] == [inspect.Parameter.VAR_KEYWORD]:
        return None  # `(**kwargs)` alone is a wrapper's signature (transformers' Auto*.from_config), not the callee's
    return sig


def check_use(use: Use, strict: tuple = ()) -> list[str]:
    """The drift in one use, as (problem) strings without the location; empty when it holds."""
    if use.problem:
        return [use.problem]
    target = use.target
    if use.hook:
        cls_path, hook = target.rsplit(".", 1)
        try:
            cls = resolve(cls_path)
        except _Missing:
            return []  # the base class itself is reported where it is imported
        if inspect.isclass(cls) and not hasattr(cls, hook):
            return [f"{cls_path} has no hook '{hook}': the subclass's method is never called"]
        return []
    if use.method_of_instance:
        cls_path, method = target.rsplit(".", 1)
        try:
            cls = resolve(cls_path)
        except _Missing:
            return []  # the class itself is reported by the use that built the instance
        if not inspect.isclass(cls):
            return []  # built by a function: its return type is unknown here
        if not hasattr(cls, method):
            return [f"{cls_path} has no method '{method}'"]
        static = inspect.getattr_static(cls, method, None)
        obj, drop_self = getattr(cls, method), not isinstance(static, (staticmethod, classmethod))
    else:
        try:
            obj = resolve(target)
        except _Missing as e:
            return [f"{e.owner} has no attribute '{e.name}'" + (f" ({e.detail})" if e.detail else "")]
        drop_self = False
    if not use.call:
        return []
    sig = _signature(obj, drop_self=drop_self)
    if sig is None:
        return []
    params = sig.parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values()) and obj not in strict
    named = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    found = [f"{target} has no keyword '{k}'" for k in use.keywords if k not in named and not var_kw]
    if use.positional is not None and not found:
        known = {k: None for k in use.keywords if k in named or var_kw}
        try:
            (sig.bind_partial if use.partial else sig.bind)(*[None] * use.positional, **known)
        except TypeError as e:
            found.append(f"{target}{sig} does not take this call ({e})")
    return found


def check(uses: list[Use]) -> list[str]:
    """DRIFT DETECTED lines, one per distinct problem, with every place it is used."""
    strict = tuple(resolve(p) for p in STRICT_KWARGS)
    places: dict[str, list[str]] = defaultdict(list)
    for use in uses:
        for problem in check_use(use, strict):
            if use.where not in places[problem]:
                places[problem].append(use.where)
    return [f"DRIFT DETECTED: {p} (used at {', '.join(w)})" for p, w in places.items()]


# --- the tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uses():
    return scan(source_files())


def test_the_scan_covers_every_module_and_notebook():
    files = {str(p.relative_to(REPO_ROOT)) for p in source_files()}
    assert {"helpers/models.py", "helpers/env.py", "notebooks/src/00_where_to_get_gpus.py"} <= files
    assert all(f"notebooks/src/{p.stem}.py" in files for p in (REPO_ROOT / "notebooks").glob("*.ipynb"))


def test_new_modules_and_notebooks_are_scanned_without_registering_them(tmp_path):
    for new in ("helpers/tracking.py", "helpers/quickcheck/bank.py", "notebooks/src/09_new.py", "scripts/x.py"):
        (tmp_path / new).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / new).write_text("from peft import LoraConfig\nLoraConfig(lora_alpah=1)\n")
    (tmp_path / "helpers/assets/data").mkdir(parents=True)
    (tmp_path / "helpers/assets/data/x.py").write_text("")  # shipped data, not code
    found = check(scan(source_files(tmp_path), tmp_path))
    assert found == [
        "DRIFT DETECTED: peft.LoraConfig has no keyword 'lora_alpah' (used at "
        "helpers/quickcheck/bank.py:2, helpers/tracking.py:2, notebooks/src/09_new.py:2, scripts/x.py:2)"
    ]


def test_the_scan_finds_the_calls_the_kit_makes(uses):
    # guards against a scan that silently finds nothing and so passes forever
    targets = {u.target for u in uses}
    assert {
        "transformers.AutoModelForCausalLM.from_pretrained",
        "datasets.load_dataset",
        "bitsandbytes.functional.quantize_4bit",
    } <= targets
    (nb_call,) = [
        u
        for u in uses
        if u.target == "bitsandbytes.functional.quantize_4bit" and u.where.startswith("notebooks/src/00")
    ]
    assert set(nb_call.keywords) == {"quant_type", "compress_statistics", "blocksize"} and nb_call.positional == 1


def test_no_drift_in_the_pinned_versions(uses):
    found = check(uses)
    assert not found, "\n".join(found)


def test_helpers_that_build_keywords_for_a_library_are_checked(uses):
    splatted = {h for u in uses for h in u.splat_helpers}
    unchecked = splatted - set(KWARGS_HELPERS)
    assert not unchecked, f"add {sorted(unchecked)} with sample arguments to KWARGS_HELPERS in {__file__}"
    for helper, (callee, samples) in KWARGS_HELPERS.items():
        fn, sig = resolve(helper), inspect.signature(resolve(callee))
        for args in samples:
            keywords = fn(*args)
            unknown = sorted(set(keywords) - set(sig.parameters))
            assert not unknown, f"DRIFT DETECTED: {callee} has no keyword {unknown} (built by {helper}{args})"


PLANTED = """\
import bitsandbytes.functional as F
from accelerate import notebook_launcher
from peft import LoraConfig as LC
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments
import transformers

args = TrainingArguments("out", gradient_checkpointin=True)
F.quantize_5bit(None)
notebook_launcher(print, num_proceses=2)
shape = dict(r=8, lora_alpah=16)
LC(**shape)
BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_tyep="nf4")
args.to_jsn()
F.dequantize_4bit(1, 2, 3, 4, 5, 6, 7, 8)


def later():
    from datasets import load_datasett
    return transformers.AutoTokenizr


class _Readout:
    def on_step_ends(self, args, state, control, **kwargs):
        pass


class Live(_Readout, transformers.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):  # right
        pass


AutoModelForCausalLM.from_pretrained("x", anything_goes=1)  # **kwargs forwarded to the config: fine
LC(r=8, lora_alpha=16, target_modules=["q_proj"])  # right
args.to_dict()  # right


def takes(args, F=None):
    args.anything_at_all()  # a parameter hides the module's `args`: nothing to check
    shape = {"lora_alpha": 16}
    return LC(**shape)  # right: this scope's dict, not the module's
"""


def test_planted_drift_is_caught_and_named_with_its_place():
    found = check(scan_source(PLANTED, "planted.py"))
    assert found == [
        "DRIFT DETECTED: transformers.TrainingArguments has no keyword 'gradient_checkpointin' (used at planted.py:7)",
        "DRIFT DETECTED: bitsandbytes.functional has no attribute 'quantize_5bit' (used at planted.py:8)",
        "DRIFT DETECTED: accelerate.notebook_launcher has no keyword 'num_proceses' (used at planted.py:9)",
        "DRIFT DETECTED: peft.LoraConfig has no keyword 'lora_alpah' (used at planted.py:11)",
        "DRIFT DETECTED: transformers.BitsAndBytesConfig has no keyword 'bnb_4bit_quant_tyep' (used at planted.py:12)",
        "DRIFT DETECTED: transformers.TrainingArguments has no method 'to_jsn' (used at planted.py:13)",
        found[6],  # the arity message quotes the signature; checked below
        "DRIFT DETECTED: datasets has no attribute 'load_datasett' (used at planted.py:18)",
        "DRIFT DETECTED: transformers has no attribute 'AutoTokenizr' (used at planted.py:19)",
        "DRIFT DETECTED: transformers.TrainerCallback has no hook 'on_step_ends': the subclass's method is "
        "never called (used at planted.py:23)",
    ], "\n".join(found)
    assert found[6].startswith("DRIFT DETECTED: bitsandbytes.functional.dequantize_4bit(A: torch.Tensor")
    assert found[6].endswith("does not take this call (too many positional arguments) (used at planted.py:14)")


def test_one_drift_used_in_two_places_is_reported_once_with_both():
    source = "from peft import LoraConfig\nLoraConfig(lora_alpah=1)\nLoraConfig(lora_alpah=2)\n"
    assert check(scan_source(source, "two.py")) == [
        "DRIFT DETECTED: peft.LoraConfig has no keyword 'lora_alpah' (used at two.py:2, two.py:3)"
    ]


def test_star_import_is_reported():
    (found,) = check(scan_source("from peft import *\n", "star.py"))
    assert found == "DRIFT DETECTED: `from peft import *` hides what is used: import the names (used at star.py:1)"


def test_names_that_shadow_nothing_and_other_libraries_are_ignored():
    source = (
        "import torch\nfrom helpers.models import load_model\nmodel, tok = load_model('embedded')\n"
        "model.anything(keyword=1)\ntorch.nn.Linear(1, 2, no_such=3)\n"
    )
    assert scan_source(source, "other.py") == []
