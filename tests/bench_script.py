"""The benchmark scripts as modules, for the tests that hold their figures (scripts/ is not a package)."""

import functools
import importlib
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@functools.cache
def script(name: str):
    """scripts/<name>.py, imported once per session, beside the scripts it imports (bench_cases, bench_cpu)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(name)


def bench_estimator():
    """scripts/bench_estimator.py: the published cases, estimated and scored."""
    return script("bench_estimator")


def bench_cpu():
    """scripts/bench_cpu.py: the CPU grid against saved-tensor bytes and the allocator check."""
    return script("bench_cpu")
