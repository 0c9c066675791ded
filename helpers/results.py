"""`record()`: the figures a notebook measured, saved where the runner and the tests read them.

Every notebook calls it for each number it shows; `python -m helpers run` prints them and the
tests check their direction (checkpointing saves memory, and so on).

Where results go:
- under the runner, `HELPERS_RESULTS_DIR` and `HELPERS_NOTEBOOK` (set per notebook) decide:
  `<out>/results/<notebook>.json`;
- in Jupyter, `build/results/<notebook>.json` next to the notebook, the stem taken from the
  session path Jupyter exposes, else "notebook".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["load_results", "record", "results_path"]


def results_path() -> Path:
    """The JSON file `record()` writes to in this process."""
    folder = Path(os.environ.get("HELPERS_RESULTS_DIR", "build/results"))
    return folder / f"{_notebook_stem()}.json"


def _notebook_stem() -> str:
    if os.environ.get("HELPERS_NOTEBOOK"):
        return os.environ["HELPERS_NOTEBOOK"]
    try:  # JupyterLab and Notebook 7 put the notebook's path in the kernel's namespace
        from IPython import get_ipython

        session = get_ipython().user_ns.get("__session__", "")
    except (ImportError, AttributeError):
        session = ""
    return Path(session).stem if session else "notebook"


def record(key: str, value) -> None:
    """Save one measured figure under `key` (the cell that measured it prints it).

    Args:
        key: a short snake_case name with its unit, e.g. "weights_mb" or "step_seconds".
        value: a number, string, bool, None, or a list/dict of those.

    Example:
        >>> record("weights_mb", 1.26)  # doctest: +SKIP
    """
    if not isinstance(key, str) or not key:
        raise TypeError(f"record() needs a non-empty string key, got {key!r}")
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as e:
        hint = " (convert it with float(...) or .item())" if hasattr(value, "item") else ""
        raise TypeError(
            f"record({key!r}, ...) got {type(value).__name__} {value!r:.80}, which JSON cannot hold "
            f"without loss{hint}: {e}"
        ) from None
    path = results_path()
    data = load_results(path)
    data[key] = json.loads(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)  # atomic: a crash mid-write never leaves half a file


def load_results(path: str | os.PathLike) -> dict:
    """Read a results file; an absent file is an empty dict."""
    path = Path(path)
    if not path.exists():
        return {}
    return json.loads(path.read_text())
