"""Where a model's config comes from: a path to a config.json (or its folder), a Hub id, a dict or a config.

Private to `helpers.estimate` (taught in notebook 01, memory anatomy; `python -m helpers plan
--model`). `_shapes` reads what this returns into a `Shape`. The network only for a Hub id, and
only for its config.json: through huggingface_hub (its cache, the student's token from
`helpers.tokens`), bounded in time as `helpers.models` bounds every Hub call, once a session per
model; offline, the error says where else to get it.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

__all__ = [
    "WAYS_IN",
    "config_dict",
    "config_source",
    "hub_config",
    "hub_page_id",
    "looks_like_hub_id",
    "looks_like_path",
]

_FETCHED: dict[tuple[str, str], dict] = {}  # (endpoint, Hub id) -> its config.json: one download a session
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


def config_source(model) -> str:
    """Where `config_dict(model)` read the config from, as an error names it: the file, the Hub id's
    config.json, the config dict or the transformers config."""
    if isinstance(model, (str, Path)):
        path = Path(model).expanduser()
        path = path / "config.json" if path.is_dir() else path
        return str(path) if path.is_file() else f"the config.json of {str(model)!r}"
    return "the config dict" if isinstance(model, dict) else f"the {type(model).__name__}"


def read_json(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable config.json ({e}): download it again from the model's page") from e
    if not isinstance(config, dict):
        raise ValueError(
            f"{path} holds a JSON {type(config).__name__}, not a config (an object of fields such as "
            '"model_type"): download the model\'s config.json again from its page'
        )
    return config


def looks_like_path(text: str) -> bool:
    return text.endswith(".json") or text.startswith((".", "/", "~")) or Path(text).expanduser().exists()


def looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.endswith(".json") and " " not in text


def hub_config(hub_id: str) -> dict:
    """A Hub model's config.json, through huggingface_hub with the student's token: fetched once a session
    per model (then from memory, so a planner's slider never asks again), from the Hub cache when the
    Hub does not answer, in bounded time; an error names the cause (gated, not found, offline) and the fix."""
    from helpers.models import hub_endpoint

    key = (hub_endpoint(), hub_id)
    if key not in _FETCHED:
        _FETCHED[key] = read_json(Path(_download(hub_id)))
    return copy.deepcopy(_FETCHED[key])


def _download(hub_id: str) -> str:
    """The path of `hub_id`'s config.json in the Hub cache: downloaded when the Hub answers, else the cached copy."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    from helpers import models  # at call time: the bounds as the caller set them
    from helpers.network import call_within
    from helpers.tokens import hub_token

    url = f"{models.hub_endpoint()}/{hub_id}/resolve/main/config.json"
    local = (
        f"download {url} on a machine with internet and pass its path in place of {hub_id!r} "
        "(the command line: --model ./config.json; a notebook: planner('./config.json', ...))"
    )
    if not models.hub_reachable():
        try:
            cached = try_to_load_from_cache(hub_id, "config.json")
        except ValueError:  # not a repository id huggingface_hub accepts
            cached = None
        if isinstance(cached, str):
            return cached
        raise ValueError(f"{hub_id!r} is not in the catalog and the Hugging Face Hub does not answer: {local}")
    token = hub_token()  # the environment, huggingface_hub's login or Colab secret, Kaggle's secrets
    fetch = dict(endpoint=models.hub_endpoint(), token=token)
    try:
        return call_within(models.HUB_METADATA_TIMEOUT_S, hf_hub_download, hub_id, "config.json", **fetch)
    except TimeoutError:
        bound = models.HUB_METADATA_TIMEOUT_S
        why = f"the Hub did not send it within {bound:g} s (raise helpers.models.HUB_METADATA_TIMEOUT_S)"
    except Exception as e:  # huggingface_hub's errors, and its HTTP client's, which differ across versions
        why = _why(e, hub_id, token is not None)
    raise ValueError(f"could not read the config.json of {hub_id!r}: {why}. Or {local}") from None


def _why(error: Exception, hub_id: str, token: bool) -> str:
    """What a failed config.json download means for the student, from huggingface_hub's error."""
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError, RepositoryNotFoundError

    from helpers.catalog import nearest_models
    from helpers.models import hub_endpoint
    from helpers.tokens import HUB_TOKEN, where_to_add

    page = f"{hub_endpoint()}/{hub_id}"
    status = getattr(getattr(error, "response", None), "status_code", None)
    set_token = f"set HF_TOKEN to a read token of the account that accepted it. {where_to_add(HUB_TOKEN)}"
    if isinstance(error, GatedRepoError) or (status == 403 and isinstance(error, HfHubHTTPError)):
        sent = "the token sent has no access to it yet" if token else "no Hugging Face token was found"
        return f"it is gated and {sent}: accept the licence on {page}, then {set_token}"
    if isinstance(error, RepositoryNotFoundError):
        nearest = ", ".join(nearest_models(hub_id))
        hint = f"check the id (the catalog's nearest: {nearest})" if nearest else "check the id"
        private = "" if token else f"; if it is private or gated, accept its licence on {page} and {set_token}"
        return f"the Hub has no model {hub_id!r} this session can see: {hint}{private}"
    if isinstance(error, RemoteEntryNotFoundError):
        return "the repository has no config.json at its top: it is not a transformers model, or not this one"
    if isinstance(error, HfHubHTTPError):
        return f"the Hub answered HTTP {status}: try again in a minute"
    lines = str(error).strip().splitlines()
    return f"the Hugging Face Hub could not be reached ({type(error).__name__}: {lines[0][:200] if lines else ''})"
