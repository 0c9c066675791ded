"""Calls that can hang on the network, bounded in total time; whether a server answers.

Used wherever the kit goes online: the Hub (`helpers.models`, each notebook's model load), wandb
(`helpers.tracking`, notebook 06), the adapter's push (`helpers.share`, notebook 08), and the secrets' lookups
(`helpers.tokens`). A socket timeout bounds one wait, not a whole call: a DNS lookup ignores it, and a server
that sends a byte now and then starts it again with each one. So every call that leaves the machine runs
through `call_within`, which gives up after its total time.
"""

from __future__ import annotations

import threading

__all__ = ["call_within", "http_answers"]


def call_within(timeout: float, fn, *args, **kwargs):
    """Call `fn(*args, **kwargs)` and wait `timeout` seconds at most, in total: its result or its exception.

    In a daemon thread, so neither a DNS lookup (deaf to socket timeouts) nor a server that accepts
    and never answers can hold the caller: TimeoutError after `timeout` s (the thread ends alone).

    Example:
        >>> call_within(5.0, lambda: 42)
        42
    """
    if not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
    box: dict = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller below, in its own thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"call_within({getattr(fn, '__name__', fn)})")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', 'the call')} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def http_answers(url: str, timeout: float) -> bool:
    """True when the server at `url` sends an HTTP reply (any status) within `timeout` seconds in total.

    DNS, connection, TLS and the reply's status line all count against `timeout`, so an endpoint
    that accepts and never answers (a captive portal, a firewall) is False after `timeout` seconds.
    """
    import http.client
    import urllib.request

    def ask() -> bool:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
        except urllib.request.HTTPError:  # 401, 404, 500: the server answered
            pass
        return True

    try:
        return call_within(timeout, ask)
    except (OSError, ValueError, http.client.HTTPException):  # no connection or reply in time, not HTTP, a bad URL
        return False
