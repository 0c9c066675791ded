"""Finding a credential in the student's session: the environment, a saved login, Colab's or Kaggle's secrets.

Taught in notebook 08 (the Hub token that pushes the adapter) and used by notebook 06 (the W&B key,
through `helpers.tracking`). `find_token(name)` looks for one secret, in this order:

1. the environment: the variable `name` (for the Hub also HUGGING_FACE_HUB_TOKEN, its older name);
2. for the Hub, `huggingface_hub.get_token()`: the login `hf auth login` saved on this machine and,
   on Colab, Colab's HF_TOKEN secret (it never prompts on the command line; on Colab the page may
   ask the student to let the notebook read the secret);
3. Colab's secrets, `google.colab.userdata.get(name)`; not asked on Kaggle, whose image is built on
   Colab's and may hold Colab's package, but not Colab's page that answers it;
4. Kaggle's secrets, `kaggle_secrets.UserSecretsClient().get_secret(name)`;
5. for W&B, the `wandb login` saved in ~/.netrc.

Each store is asked in a daemon thread that may take `SECRET_TIMEOUT_S` at most
(`helpers.network.call_within`), and of a store's error only its type is kept: its message could quote
the secret. A value found is registered for `helpers.manifest.scrub_secrets`, so no manifest and
no message the kit prints carries it, and `FoundToken` never shows it. A token not found comes with
why each store had none and where to add it on the platform the student is on
(`helpers.env.detect_platform`): Colab's key icon, Kaggle's Add-ons > Secrets, or a login elsewhere.

Importing this module is cheap: huggingface_hub loads when the Hub's token is looked for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

from helpers._secrets import register_secret
from helpers.env import detect_platform
from helpers.network import call_within

HUB_TOKEN = "HF_TOKEN"  # the Hub's token: env variable, Colab secret, Kaggle secret
WANDB_KEY = "WANDB_API_KEY"  # W&B's key, under the same name everywhere
SECRET_TIMEOUT_S = 10.0  # seconds one store may take to answer (Colab's own request gives up after 10 s)

__all__ = [
    "HUB_TOKEN",
    "SECRET_TIMEOUT_S",
    "WANDB_KEY",
    "FoundToken",
    "find_token",
    "hub_token",
    "wandb_base_url",
    "where_to_add",
]

# the older names huggingface_hub still reads, after the first
_ALIASES = {HUB_TOKEN: ("HUGGING_FACE_HUB_TOKEN",)}
# for the message that says where to add a secret: what it is, where one is made, the login command
_KNOWN = {
    HUB_TOKEN: ("a Hugging Face token", "huggingface.co/settings/tokens", "hf auth login"),
    WANDB_KEY: ("your W&B API key", "wandb.ai/authorize", "wandb login"),
}
# what a store's error type means (its message is never kept: it could quote the secret)
_ERRORS = {
    "SecretNotFoundError": "no {name} secret",  # Colab: none of that name
    "NotebookAccessError": "{name} is there, but its Notebook access is off",  # Colab: this notebook may not read it
    "TimeoutException": "Colab did not answer (its secrets are read from Colab's own page only)",
    "BackendError": "no {name} secret attached to this notebook",  # Kaggle: not added, or not ticked here
}
_NO_ANSWER = "no answer within"


@dataclass(frozen=True, repr=False)
class FoundToken:
    """A secret `find_token` looked for: its value (None when none was found), where from, why each store had none.

    `repr` and `str` never show the value: `print(found)` says where it came from, or why there is
    none and where to add it on this platform.
    """

    name: str
    value: str | None
    source: str | None  # "Colab secrets", "the HF_TOKEN environment variable", ...; None when not found
    misses: tuple[str, ...] = ()  # why each store asked before had none, in words
    platform: str = "local"  # "colab", "kaggle" or "local": where the student is, for `where_to_add`

    def __bool__(self) -> bool:
        return self.value is not None

    def __repr__(self) -> str:
        value = "<hidden>" if self.value is not None else None
        return f"FoundToken(name={self.name!r}, source={self.source!r}, value={value}, misses={list(self.misses)!r})"

    def __str__(self) -> str:
        return self.message

    @property
    def message(self) -> str:
        """One line for the student: where the secret came from, or why none was found and where to add it."""
        if self.value is not None:
            return f"{self.name} from {self.source}"
        return f"no {self.name} found ({'; '.join(self.misses)}). {where_to_add(self.name, self.platform)}."


def find_token(name: str) -> FoundToken:
    """Look for the secret `name` in the environment, a saved login, Colab's and Kaggle's secrets; never prompt.

    Args:
        name: the secret's name, the same everywhere: "HF_TOKEN" (the Hub) or "WANDB_API_KEY" (W&B);
            any other name is looked for in the environment and the two secret stores.

    Returns:
        a `FoundToken`: `.value` (None when none was found), `.source`, `.misses`, `.message`.

    Example:
        >>> found = find_token("HF_TOKEN")  # doctest: +SKIP
        >>> print(found)  # doctest: +SKIP
        HF_TOKEN from Colab secrets
        >>> found  # doctest: +SKIP
        FoundToken(name='HF_TOKEN', source='Colab secrets', value=<hidden>, misses=['no HF_TOKEN or ...'])
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"name must be a secret's name without spaces, such as 'HF_TOKEN'; got {name!r}")
    platform = detect_platform()  # before a store imports google.colab, which detect_platform counts
    value, source, misses = _from_environment(name)
    vault_busy = False  # huggingface_hub gave up waiting on Colab's vault, which may still be answering it
    for store in [] if value else _stores(name, platform):
        if store.where == "Colab secrets" and vault_busy:
            misses.append("Colab secrets: not asked again while huggingface_hub waits for them")
            continue  # a second request to Colab's vault while the first is open could deadlock both
        found, why = _ask(store, name)
        if found:
            hub = store.where == "huggingface_hub"
            value, source = found, _hub_login_source(found, platform) if hub else store.source
            break
        if why:
            misses.append(f"{store.where}: {why}")
        vault_busy |= store.where == "huggingface_hub" and platform == "colab" and _NO_ANSWER in (why or "")
    if value:
        register_secret(value)  # masked in every manifest and message from now on
    return FoundToken(name, value, source, tuple(misses), platform)


def hub_token() -> str | None:
    """The student's Hugging Face token for `token=` in huggingface_hub's calls, or None (anonymous: public repos).

    The lookup of `find_token("HF_TOKEN")`, silent. Gated models (Llama, Gemma) and pushing need it.
    """
    return find_token(HUB_TOKEN).value


def where_to_add(name: str, platform: str | None = None) -> str:
    """Where the student adds the secret `name` on `platform` ("colab", "kaggle", "local"; default: this one)."""
    what, url, login = _KNOWN.get(name, (f"the value of {name}", "", ""))
    made = f"{what} from {url}" if url else what
    platform = platform or detect_platform()
    if platform == "colab":
        return (
            f"On Colab: click the key icon in the left bar, add a secret named {name} ({made}) "
            'and turn its "Notebook access" on; then run this cell again'
        )
    if platform == "kaggle":
        return (
            f"On Kaggle: Add-ons > Secrets, add a secret labelled {name} ({made}) and tick it to attach it "
            "to this notebook; then run this cell again"
        )
    hub_cli = " (older huggingface_hub: `huggingface-cli login`)" if name == HUB_TOKEN else ""
    login = f"run `{login}` in a terminal{hub_cli}, or " if login else ""
    return f"Here: {login}start Jupyter with the {name} environment variable set ({made})"


def wandb_base_url() -> str:
    """The W&B server a key is for: $WANDB_BASE_URL (a local server), else https://api.wandb.ai."""
    return os.environ.get("WANDB_BASE_URL", "").rstrip("/") or "https://api.wandb.ai"


def _from_environment(name: str) -> tuple[str | None, str | None, list[str]]:
    names = (name, *_ALIASES.get(name, ()))
    for variable in names:
        if os.environ.get(variable, "").strip():
            return os.environ[variable].strip(), f"the {variable} environment variable", []
    return None, None, [f"no {' or '.join(names)} variable"]


class _Store(NamedTuple):
    where: str  # the store, as the misses name it
    source: str  # where a value came from, in words (huggingface_hub's: `_hub_login_source`)
    read: Callable[[], str | None]  # raises ImportError where the store does not exist
    none: str  # what to say when the store answers without a value


def _stores(name: str, platform: str) -> list[_Store]:
    """The stores after the environment, in the order they are asked."""
    stores = []
    if name == HUB_TOKEN:
        # imported here, outside the store's time bound: the bound is for the lookup, not for loading the library
        from huggingface_hub import get_token  # the login file; on Colab (not Colab Enterprise) its HF_TOKEN secret

        none = "no `hf auth login` saved on this machine"
        stores.append(_Store("huggingface_hub", "huggingface_hub.get_token()", get_token, none))
    empty = f"the {name} secret is empty"
    if platform != "kaggle":
        stores.append(_Store("Colab secrets", "Colab secrets", lambda: _colab_secret(name), empty))
    stores.append(_Store("Kaggle secrets", "Kaggle secrets", lambda: _kaggle_secret(name), empty))
    if name == WANDB_KEY:
        netrc = "a `wandb login` saved in ~/.netrc"
        stores.append(_Store("~/.netrc", netrc, _wandb_netrc, "no `wandb login` saved there"))
    return stores


def _ask(store: _Store, name: str) -> tuple[str | None, str | None]:
    """Ask one store within `SECRET_TIMEOUT_S`: (value, None), or (None, why not; None where there is no such store)."""
    try:
        value = call_within(SECRET_TIMEOUT_S, store.read)
    except TimeoutError:
        return None, f"{_NO_ANSWER} {SECRET_TIMEOUT_S:g} s"
    except ImportError:
        return None, None  # not on that platform: nothing worth saying
    except Exception as e:  # the stores raise their own error types for "no such secret"
        kind = type(e).__name__  # the type only: a message could quote the secret
        meaning = _ERRORS.get(kind, "no {name} secret, or this notebook may not read it")
        return None, f"{meaning.format(name=name)} ({kind})"
    if not isinstance(value, str) or not value.strip():
        return None, store.none
    return value.strip(), None


def _hub_login_source(value: str, platform: str) -> str:
    """Where huggingface_hub's token came from: the login file, else Colab's secret (or a CI login)."""
    from huggingface_hub import constants

    try:
        saved = Path(constants.HF_TOKEN_PATH).read_text(encoding="utf-8").strip()
    except OSError:
        saved = None
    if saved == value:
        return "the `hf auth login` saved on this machine"
    return "Colab secrets (read by huggingface_hub)" if platform == "colab" else "huggingface_hub.get_token()"


def _colab_secret(name: str):
    from google.colab import userdata  # ImportError off Colab

    return userdata.get(name)  # raises SecretNotFoundError / NotebookAccessError when absent or not allowed


def _kaggle_secret(name: str):
    from kaggle_secrets import UserSecretsClient  # ImportError off Kaggle

    return UserSecretsClient().get_secret(name)  # raises when the secret is not attached to this notebook


def _wandb_netrc() -> str | None:
    """The key a `wandb login` saved in ~/.netrc for this W&B server, or None."""
    import netrc

    host = urlparse(wandb_base_url()).hostname or "api.wandb.ai"
    try:
        entry = netrc.netrc().authenticators(host)
    except FileNotFoundError:
        return None
    return entry[2] if entry else None
