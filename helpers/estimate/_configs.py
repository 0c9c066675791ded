"""Where a model's config comes from: a path to a config.json (or its folder), a Hub id, a dict or a config.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; `python -m helpers plan
--model`). `_shapes` reads what this returns into a `Shape`. The network only for a Hub id, and
only for its config.json, in bounded time; offline, the error says where else to get it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["CONFIG_TIMEOUT_S", "WAYS_IN", "config_dict", "hub_page_id", "looks_like_hub_id", "looks_like_path"]

CONFIG_TIMEOUT_S = 20.0  # seconds for a Hub config.json (a few KB) once the Hub has answered
_HUB_PAGE = re.compile(r"(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/([^/\s]+/[^/\s?#]+)")
WAYS_IN = (
    "Pass a catalog name, a path to a model's config.json (or its folder), a Hub id such as "
    "'Qwen/Qwen3-0.6B' (needs the Hub), a config dict or a transformers config."
)


def hub_page_id(text: str) -> str:
    """The Hub id in a model page's address (huggingface.co/Qwen/Qwen3-14B/tree/main), or the text as given."""
    page = _HUB_PAGE.match(text)
    return page.group(1) if page else text


def config_dict(model) -> dict:
    """A model's config as a dict: from a path to a config.json or its folder, a Hub id, a dict or a config."""
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser()
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return read_json(path)
        if isinstance(model, str) and looks_like_hub_id(model):
            return hub_config(model)
        raise ValueError(f"no config.json at {str(path)!r}. {WAYS_IN}")
    if hasattr(model, "to_dict"):
        return model.to_dict()
    if isinstance(model, dict):
        return dict(model)
    raise ValueError(f"cannot read a model from a {type(model).__name__}. {WAYS_IN}")


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable config.json ({e}): download it again from the model's page") from e


def looks_like_path(text: str) -> bool:
    return text.endswith(".json") or text.startswith((".", "/", "~")) or Path(text).expanduser().exists()


def looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.endswith(".json") and " " not in text


def hub_config(hub_id: str) -> dict:
    """Fetch only config.json from the Hub, in bounded time; offline, say where else to get it."""
    import urllib.error
    import urllib.request

    from helpers.env import call_within
    from helpers.models import hub_endpoint, hub_reachable

    url = f"{hub_endpoint()}/{hub_id}/resolve/main/config.json"
    local = (
        f"download {url} on a machine with internet and pass its path in place of {hub_id!r} "
        "(the command line: --model ./config.json; a notebook: planner('./config.json', ...))"
    )
    if not hub_reachable():
        raise ValueError(f"{hub_id!r} is not in the catalog and the Hugging Face Hub does not answer: {local}")

    def fetch() -> dict:
        with urllib.request.urlopen(url, timeout=CONFIG_TIMEOUT_S) as reply:
            return json.loads(reply.read())

    try:
        return call_within(CONFIG_TIMEOUT_S, fetch)
    except urllib.error.HTTPError as e:
        why = (
            "gated: accept its licence on its page, then"
            if e.code in (401, 403)
            else f"HTTP {e.code}: check the id, or"
        )
        raise ValueError(f"the Hub has no readable config.json for {hub_id!r} ({why}) {local}") from None
    except (OSError, TimeoutError, json.JSONDecodeError) as e:
        raise ValueError(f"could not fetch {hub_id!r}'s config.json ({e}): {local}") from None
