"""The secrets handed to this session at run time (read from a secret store, not from a variable), to scrub them.

Private to the package: `helpers.tokens.find_token` registers each value it finds;
`helpers.manifest.scrub_secrets` (taught in notebook 06) replaces them, with the secret-named
environment variables' values, in every manifest and message. A module of its own so that the
lookup does not import the manifest's writer (and the trainer's modules behind it).
"""

from __future__ import annotations

__all__ = ["register_secret", "registered_secrets"]

_registered: set[str] = set()  # values read from Colab / Kaggle secret stores, a login file, ~/.netrc


def register_secret(value: str) -> None:
    """Scrub `value` from every manifest and message from now on.

    For a secret that is not in an environment variable (those are found by name): a key read
    from Colab's or Kaggle's secret store, which `helpers.tokens.find_token` registers.
    """
    if value:
        _registered.add(value)


def registered_secrets() -> frozenset[str]:
    """Every value `register_secret` was given in this process."""
    return frozenset(_registered)
