"""scripts/bench_estimator.py as a module, for the tests that hold its figures (it is a script, not a package)."""

import functools
import importlib.util
import sys
from pathlib import Path

PATH = Path(__file__).resolve().parent.parent / "scripts" / "bench_estimator.py"


@functools.cache
def bench_estimator():
    """The benchmark script, imported once per session."""
    spec = importlib.util.spec_from_file_location("bench_estimator", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
