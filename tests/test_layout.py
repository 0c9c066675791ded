"""The package's layout: modules by concept, no import cycle, a declared public API, short units.

These read the package's source with `ast` (nothing is imported to find imports), so an import
hidden inside a function counts as much as one at the top of a module.
"""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "helpers.quickcheck"
PACKAGE_DIR = ROOT / "helpers" / "quickcheck"
MODULES = sorted(p.stem for p in PACKAGE_DIR.glob("*.py"))
# every module of the package, as a dotted name: helpers.env, helpers.quickcheck.bank, ...
ALL_MODULES = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (ROOT / "helpers").rglob("*.py")
)
MAX_MODULE_LINES = 400
LONG_MODULE_REASON = "Longer than 400 lines because"  # what a longer module's docstring must explain
MAX_FUNCTION_LINES = 60  # statements, not counting the signature and the docstring


def path_of(module):
    """helpers.quickcheck.bank -> helpers/quickcheck/bank.py (a bare name is in helpers/quickcheck)."""
    if not module.startswith("helpers"):
        return PACKAGE_DIR / f"{module}.py"
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__init__.py"


def tree(module):
    return ast.parse(path_of(module).read_text(encoding="utf-8"))


def package_imports(module):
    """The helpers modules `module` imports anywhere in its source, as dotted names."""
    found = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from helpers.maintainer import runner` imports the module helpers.maintainer.runner
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in ALL_MODULES else node.module
                for a in node.names
            ]
        else:
            continue
        found |= {n for n in names if n in ALL_MODULES and n != "helpers"}
    return found - {module}


def imported_modules(module):
    """The package's modules that `module` imports anywhere in its source (top level or in a function)."""
    found = set()
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from .bank import y
                base = ".".join([PACKAGE, base]) if base else PACKAGE
            # `from helpers.quickcheck import reading` imports the module reading, not the package
            names = [
                f"{base}.{alias.name}" if base == PACKAGE and alias.name in MODULES else base for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name == PACKAGE:
                found.add("__init__")
            elif name.startswith(PACKAGE + "."):
                found.add(name[len(PACKAGE) + 1 :].split(".")[0])
    return found - {module}


def import_cycle(graph):
    """One cycle in `graph` as a list of modules (first == last), or [] when there is none."""
    done, path = set(), []

    def visit(module):
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return []
        path.append(module)
        for other in sorted(graph[module]):
            cycle = visit(other)
            if cycle:
                return cycle
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        cycle = visit(module)
        if cycle:
            return cycle
    return []


def public_api(module):
    """The functions and classes a module defines at its top level whose names do not start with _."""
    return {
        n.name
        for n in tree(module).body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_")
    }


def public_names(module):
    """The names a module defines at its top level (not those it imports) that do not start with _."""
    names = []
    for node in tree(module).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                names += [e.id for e in elts if isinstance(e, ast.Name)]
    return {n for n in names if not n.startswith("_")}


def test_no_module_imports_one_that_imports_it_back():
    graph = {m: imported_modules(m) for m in MODULES}
    assert graph["judging"] >= {"bank", "sealing"} and graph["sealing"] >= {"bank"}  # the scan sees imports
    cycle = import_cycle(graph)
    assert not cycle, "import cycle in helpers/quickcheck: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    assert import_cycle({"bank": {"judging"}, "judging": {"bank"}}) == ["bank", "judging", "bank"]
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_anywhere_in_the_package():
    graph = {m: package_imports(m) for m in ALL_MODULES}
    assert "helpers.estimate" in graph["helpers.plan"]  # the scan sees imports
    cycle = import_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


PUBLIC_MODULES = [m for m in ALL_MODULES if not any(part.startswith("_") for part in m.split("."))]


@pytest.mark.parametrize("module", [m for m in PUBLIC_MODULES if m not in ("helpers", "helpers.maintainer")])
def test_every_module_declares_its_public_names(module):
    """`__all__` lists every public function and class; lazily built ones (a module `__getattr__`) count too."""
    imported = importlib.import_module(module)
    declared = getattr(imported, "__all__", None)
    assert declared is not None, f"{module} has no __all__: list its public names, prefix the rest with _"
    assert all(n in dir(imported) for n in declared), f"{module}.__all__ lists a name it does not have"
    assert public_api(module) <= set(declared), (
        f"{module}: public but not in __all__: {sorted(public_api(module) - set(declared))}; "
        "add them or prefix them with _"
    )


@pytest.mark.parametrize("module", MODULES)
def test_all_declares_exactly_the_public_names(module):
    declared = importlib.import_module(f"{PACKAGE}.{module}" if module != "__init__" else PACKAGE).__all__
    assert len(declared) == len(set(declared)), f"{module}.__all__ lists a name twice"
    if module == "__init__":
        assert set(declared) == {"ask", "check"}  # re-exported for the notebooks
    else:
        assert set(declared) == public_names(module), (
            f"{module}.__all__ should list exactly its public names; make helpers private with a leading _"
        )


def test_checks_exposes_check_and_ask_only():
    assert public_names("checks") == {"ask", "check"}


@pytest.mark.parametrize("module", MODULES)
def test_each_module_says_which_notebook_or_command_uses_it(module):
    doc = ast.get_docstring(tree(module)) or ""
    assert "notebook" in doc or "python -m helpers" in doc, f"{module}'s docstring should say who uses it"


def body_lines(function) -> int:
    """Lines of a function's statements, without its signature and docstring."""
    body = function.body[1:] if ast.get_docstring(function) is not None else function.body
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


@pytest.mark.parametrize("module", ALL_MODULES)
def test_modules_and_functions_stay_short(module):
    source = path_of(module).read_text(encoding="utf-8")
    lines = source.count("\n")
    reason = LONG_MODULE_REASON in (ast.get_docstring(ast.parse(source)) or "")
    assert lines <= MAX_MODULE_LINES or reason, (
        f"{module} has {lines} lines: split it by concept, or say in its docstring '{LONG_MODULE_REASON} ...'"
    )
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    long = [(f.name, body_lines(f)) for f in functions if body_lines(f) > MAX_FUNCTION_LINES]
    assert not long, f"{module}: functions over {MAX_FUNCTION_LINES} lines: {long}"


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_module_says_which_notebook_or_command_uses_it(module):
    doc = ast.get_docstring(tree(module)) or ""
    assert "notebook" in doc.lower() or "python -m helpers" in doc, f"{module}'s docstring should say who uses it"


def private_imports(module):
    """(line, what) for each name that `module` takes from another module although it starts with `_`.

    A private name belongs to its module; a private module (helpers/_util.py, gpu_proof/_cuda.py)
    belongs to its package, so a module may import a private submodule of its own package. An
    attribute read through an imported module (`models._endpoint()`) counts as an import."""
    package = module.rsplit(".", 1)[0] if path_of(module).name != "__init__.py" else module
    found, modules = [], {}
    for node in ast.walk(tree(module)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
            for alias in node.names:
                name, dotted = alias.name, f"{node.module}.{alias.name}"
                if dotted in ALL_MODULES:
                    modules[alias.asname or name] = dotted
                private = name.startswith("_") and not name.startswith("__")  # dunders (__version__) are public
                if private and not (dotted in ALL_MODULES and node.module == package):
                    found.append((node.lineno, f"from {node.module} import {name}"))
        elif isinstance(node, ast.Import):
            modules.update({a.asname: a.name for a in node.names if a.asname and a.name in ALL_MODULES})
    for node in ast.walk(tree(module)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and f"{modules[node.value.id]}.{node.attr}" not in ALL_MODULES
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr} (a private name of {modules[node.value.id]})"))
    return found


def test_the_private_import_scan_sees_names_and_attributes(tmp_path, monkeypatch):
    assert private_imports("helpers.memory") == []  # `from helpers import _probes`: its own package's module
    assert private_imports("helpers.maintainer.gpu_proof.headline") == []  # gpu_proof's own _cuda, _models
    source = "from helpers.models import _banner\nfrom helpers import models\nmodels._resolve('x')\n"
    monkeypatch.setattr(ast, "parse", lambda text, *a, **k: compile(source, "x", "exec", ast.PyCF_ONLY_AST))
    assert [line for line, _ in private_imports("helpers.plan")] == [1, 3]


@pytest.mark.parametrize("module", ALL_MODULES)
def test_no_module_imports_another_modules_private_names(module):
    found = private_imports(module)
    assert not found, (
        f"{module} reaches into another module's private names: {found}; make the name public in its "
        "module (and __all__), or move it to a private module of the package both can import"
    )
