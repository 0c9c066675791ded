"""Sharing what a run trained: push the adapter folder to a Hub repo, bounded in time, a failure said in words.

Taught in notebook 08 (capstone), after the adapter is saved and reloaded. `push_adapter` is the
two calls of huggingface_hub a student would write, `HfApi(token=...).create_repo(repo_id,
private=True, exist_ok=True)` then `.upload_folder(repo_id=..., folder_path=...)`, with what they
leave out:

- the token from `helpers.tokens.find_token` (the environment, `hf auth login`, Colab's or
  Kaggle's secrets), never printed; when there is none, where to add it on this platform;
- a total time bound on each call (`helpers.network.call_within`): `helpers.models.HUB_TIMEOUT_S`
  for the Hub to answer at all, `HUB_METADATA_TIMEOUT_S` to create the repo, `PUSH_TIMEOUT_S`
  for the upload; huggingface_hub's own calls carry no total timeout;
- one line that names the real cause of a failure: offline mode (HF_HUB_OFFLINE), a malformed
  repo id, no network, a token refused (401) or without write access (403), a timeout.

Importing this module is cheap: huggingface_hub loads when a push starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from helpers._util import error_line
from helpers.manifest import scrub_secrets
from helpers.models import HUB_METADATA_TIMEOUT_S, HUB_TIMEOUT_S, hub_endpoint, hub_reachable
from helpers.network import call_within
from helpers.tokens import HUB_TOKEN, FoundToken, find_token, where_to_add

PUSH_TIMEOUT_S = 600.0  # seconds for the whole upload: a 160 MB adapter (r=16 on a 7B) needs 0.27 MB/s
ADAPTER_CONFIG = "adapter_config.json"  # what peft's save_pretrained writes beside the weights

__all__ = ["PUSH_TIMEOUT_S", "push_adapter"]


def push_adapter(adapter_dir: str | os.PathLike, repo_id: str, *, private: bool = True) -> str | None:
    """Push a saved adapter folder to the Hub repo `repo_id` (made private if new); print one line saying what happened.

    Args:
        adapter_dir: the folder `model.save_pretrained(...)` wrote (adapter_config.json and the weights).
        repo_id: "your-username/a-name" (or an organisation's); "" pushes nothing and says how to.
        private: a new repo is private until you choose otherwise on huggingface.co.

    Returns:
        the repo's URL when pushed, else None (the printed line says why and what to do).

    Example:
        >>> push_adapter("runs/capstone/adapter", "you/qwen-course-adapter")  # doctest: +SKIP
        pushed the adapter to https://huggingface.co/you/qwen-course-adapter (private if new; token: HF_TOKEN from ...)
    """
    line, url = _push(Path(adapter_dir), (repo_id or "").strip(), private)
    print(scrub_secrets(line))  # no secret in the line, whatever a server's message quoted
    return url


def _push(folder: Path, repo_id: str, private: bool) -> tuple[str, str | None]:
    """(the line to print, the repo's URL or None), in the order a student would fix things."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    # 1. what the student gave: a repo id, well formed; a folder that holds an adapter
    if not repo_id:
        return (
            'not pushed: hub_repo is empty. To share the adapter, set hub_repo = "your-username/a-name" in the '
            f"parameters cell and give the notebook a token with the Write role. {where_to_add(HUB_TOKEN)}.",
            None,
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        return f"not pushed: {_bad_repo_id(repo_id, e)}", None
    if not (folder / ADAPTER_CONFIG).is_file():
        return f"not pushed: {folder} holds no {ADAPTER_CONFIG}; save the adapter there first (save_pretrained)", None
    # 2. a token, then a Hub that can be reached
    token = find_token(HUB_TOKEN)
    if not token:
        return f"not pushed to {repo_id}: {token.message}", None
    if _offline():
        return (
            f"not pushed to {repo_id}: HF_HUB_OFFLINE is set, so huggingface_hub makes no network call (token: "
            f"{token}); remove it from the environment, restart the kernel and run this cell again",
            None,
        )
    if not hub_reachable():
        return f"not pushed to {repo_id}: {_unreachable(f'no HTTP answer within {HUB_TIMEOUT_S:g} s', token)}", None
    # 3. the two calls, each bounded in total time
    api = HfApi(endpoint=hub_endpoint(), token=token.value)
    try:
        url = call_within(HUB_METADATA_TIMEOUT_S, api.create_repo, repo_id, private=private, exist_ok=True)
        call_within(PUSH_TIMEOUT_S, api.upload_folder, repo_id=repo_id, folder_path=str(folder), repo_type="model")
    except Exception as e:  # each failure named below; anything else is the network's
        return f"not pushed to {repo_id}: {_why_not(e, repo_id, token)}", None
    return f"pushed the adapter to {url} ({'private' if private else 'public'} if new; token: {token})", str(url)


def _offline() -> bool:
    """huggingface_hub's offline mode: read from HF_HUB_OFFLINE when it was imported, or set since."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _why_not(error: Exception, repo_id: str, token: FoundToken) -> str:
    """The cause of a failed create_repo / upload_folder, and the fix, in the student's values."""
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled

    namespace = repo_id.split("/")[0] if "/" in repo_id else "your account"
    if isinstance(error, TimeoutError):
        return (
            f"the Hub did not finish in time ({error}); the upload may still complete in the background: "
            f"look at huggingface.co/{repo_id}, or run this cell again"
        )
    if isinstance(error, OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set, so huggingface_hub makes no network call; remove it and restart the kernel"
    if isinstance(error, HFValidationError):
        return _bad_repo_id(repo_id, error)
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, HfHubHTTPError) and status == 401:
        return (
            f"the Hub refused the token ({token}): it is wrong or expired (401); make a new one with the Write "
            "role at huggingface.co/settings/tokens and put it where this one is"
        )
    if isinstance(error, HfHubHTTPError) and status == 403:
        return (
            f"the token ({token}) may not write to {repo_id} (403): give it the Write role at "
            f"huggingface.co/settings/tokens (a fine-grained token: write access to {namespace}'s repos), "
            f"or push under a namespace of yours"
        )
    if isinstance(error, HfHubHTTPError):
        return f"the Hub answered {status} ({error_line(error)})"
    return _unreachable(error_line(error), token)


def _bad_repo_id(repo_id: str, error: Exception) -> str:
    return (
        f'{repo_id!r} is not a Hub repo id ({error_line(error)}); write it as "your-username/a-name": '
        "letters, digits, '-', '_' and '.', 96 characters at most"
    )


def _unreachable(why: str, token: FoundToken) -> str:
    return (
        f"{hub_endpoint()} could not be reached ({why}; token: {token}); check the internet "
        "(Kaggle: Settings > Internet > On; Colab: Runtime > Reconnect) and run this cell again"
    )
