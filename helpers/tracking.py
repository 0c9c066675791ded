"""Experiment tracking that never blocks a run: wandb online with a key, offline without, never a prompt.

Taught in notebook 06 (experiment tracking) and used by notebook 08 (capstone):
`init_tracking(project, config)` starts a wandb run: online when a key is found (the
WANDB_API_KEY variable, a Colab secret, a Kaggle secret or a `wandb login` on this machine:
`helpers.tokens.find_token`) and api.wandb.ai answers, offline otherwise. It never prompts and
never waits long: a missing key, a notebook without internet or a server that does not answer
all end in an offline run that `wandb sync <folder>` uploads later (the exact command is
printed). The settings behind each checkpoint go into its run manifest (`helpers.manifest`),
which also lands in the run's config. Every wait on the network has a total bound:
`helpers.tokens.SECRET_TIMEOUT_S` per secret store, `HOST_TIMEOUT_S` for the server's first
answer (a server that accepts and never answers counts as unreachable), `ONLINE_INIT_TIMEOUT_S`
for wandb.init online (then offline), `FINISH_TIMEOUT_S` for the last upload.

No secret lands in a log or a printed line: keys are passed to wandb in memory (never through
os.environ, never saved to ~/.netrc), and the key found is registered with
`helpers.manifest.register_secret` (by `helpers.tokens`) so that no manifest or message carries
it either.

Importing this module is cheap: wandb loads when a function needs it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from helpers._util import error_line, restore_environ
from helpers.manifest import scrub_secrets
from helpers.network import call_within, http_answers
from helpers.tokens import WANDB_KEY, find_token, wandb_base_url, where_to_add

KEY_NAME = WANDB_KEY  # the name of the key everywhere: env variable, Colab secret, Kaggle secret
MODES = ("auto", "online", "offline", "disabled")
HOST_TIMEOUT_S = 3.0  # seconds for the wandb server to answer at all (an HTTP reply) before going offline
ONLINE_INIT_TIMEOUT_S = 30.0  # seconds wandb.init may take online before the run goes offline instead
FINISH_TIMEOUT_S = 120.0  # seconds an online run.finish() may take to upload its last records

__all__ = ["Tracking", "init_tracking"]


@dataclass
class Tracking:
    """The tracking run `init_tracking` started, and how to upload it later when it is offline."""

    project: str
    mode: str  # "online", "offline" or "disabled"
    reason: str  # why this mode, in words a student can act on
    key_source: str | None  # where the key came from ("Colab secrets", ...); never the key
    run: object | None = field(default=None, repr=False)  # the wandb Run
    run_dir: Path | None = None  # the local folder holding everything the run records (what `wandb sync` uploads)
    _finished: bool = field(default=False, repr=False)
    _saved_env: dict = field(default_factory=dict, repr=False)  # the WANDB_* values before init_tracking

    @property
    def report_to(self) -> str:
        """The TrainingArguments `report_to` value: "wandb", or "none" when tracking is disabled."""
        return "none" if self.mode == "disabled" or self.run is None else "wandb"

    @property
    def sync_command(self) -> str | None:
        """The shell command that uploads this offline run once a key and internet are available."""
        if self.mode != "offline" or self.run_dir is None:
            return None
        return f"wandb sync {shlex.quote(str(self.run_dir))}"

    def finish(self) -> str | None:
        """Close the run (flushes its files) and print how to upload it if it is offline.

        Returns:
            the `wandb sync` command for an offline run, else None.
        """
        global _mode_we_set
        if self.run is not None and not self._finished:
            if self.mode == "online":
                self._finish_online()
            else:
                self.run.finish()
            if self.mode == "offline":
                import wandb

                # offline, run.finish() returns before wandb's service has written the last records
                # (the summary); teardown waits for them, so the folder is complete when this returns
                wandb.teardown()
            self._finished = True
        restore_environ(self._saved_env)
        _mode_we_set = None  # the WANDB_MODE in the environment is the user's again
        if self.sync_command:
            print(f"wandb: offline run saved; upload it later with: {self.sync_command}")
        return self.sync_command

    def _finish_online(self) -> None:
        """run.finish() waits for the server to take the last records: `FINISH_TIMEOUT_S` at most."""
        try:
            call_within(FINISH_TIMEOUT_S, self.run.finish)
        except TimeoutError:
            where = shlex.quote(str(self.run_dir)) if self.run_dir else "<the run's folder under wandb/>"
            print(
                f"wandb: the server did not take the run's last records within {FINISH_TIMEOUT_S:g} s; "
                f"everything is saved locally. Upload it later with:\n  wandb sync {where}"
            )


def init_tracking(
    project: str,
    config: dict | None = None,
    *,
    name: str | None = None,
    mode: str = "auto",
    dir: str | os.PathLike | None = None,
    run_id: str | None = None,
) -> Tracking:
    """Start a wandb run that never prompts: online when a key is found and the server answers, else offline.

    The key is looked for, in order, in the WANDB_API_KEY variable, Colab secrets and Kaggle
    secrets (each guarded: an absent store, an absent secret or a store that does not answer in
    `helpers.tokens.SECRET_TIMEOUT_S` just moves on), then a `wandb login` saved on this machine
    (`helpers.tokens.find_token`). Sets
    WANDB_MODE, WANDB_PROJECT, WANDB_SILENT and WANDB_DIR for this process so that a run the
    Trainer starts by itself follows the same rules. Taught in notebook 06.

    Args:
        project: the wandb project, e.g. "kit-06-tracking".
        config: hyperparameters to store with the run (the Trainer adds its arguments).
        name: the run's display name; default: wandb picks one.
        mode: "auto" (online if possible; honours WANDB_MODE when set), "online" (online if
            possible, ignoring WANDB_MODE; never prompts either), "offline" or "disabled".
        dir: where wandb writes (a `wandb/` folder is made inside); default WANDB_DIR, else the
            current folder. On Colab, a Drive folder survives a disconnect.
        run_id: continue this run (e.g. read from a checkpoint's manifest after a disconnect).

    Returns:
        a `Tracking`: `.report_to` for TrainingArguments, `.finish()`, `.sync_command`.

    Example:
        >>> tracking = init_tracking("kit-06", {"lr": 2e-4, "seed": 42})  # doctest: +SKIP
        wandb: offline: no W&B key found (no WANDB_API_KEY variable; Colab secrets: ...). ...
          the run is saved in /content/wandb/offline-run-20250101_120000-abc123
          upload it later with: wandb sync /content/wandb/offline-run-20250101_120000-abc123
        >>> args = TrainingArguments("out", report_to=tracking.report_to)  # doctest: +SKIP
        >>> Trainer(model, args, train_dataset=train).train()  # doctest: +SKIP
        >>> tracking.finish()  # doctest: +SKIP
    """
    if not isinstance(project, str) or not project.strip():
        raise ValueError(f"project must be a non-empty string such as 'kit-06-tracking', got {project!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    folder = Path(dir or os.environ.get("WANDB_DIR") or ".").expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)

    global _mode_we_set
    chosen, reason, key, key_source = _choose_mode(mode)
    saved_env = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_SILENT", "WANDB_DIR")}
    os.environ.update(WANDB_MODE=chosen, WANDB_PROJECT=project, WANDB_SILENT="true", WANDB_DIR=str(folder))
    _mode_we_set = chosen
    run = None
    if chosen == "online":
        try:
            run = _start_run(project, config, name, chosen, folder, run_id, key)
        except Exception as e:  # any failure online (auth, timeout, server error) must not stop the course
            chosen, reason = "offline", f"wandb could not start online ({scrub_secrets(error_line(e))})"
            os.environ["WANDB_MODE"] = _mode_we_set = chosen
    if run is None and chosen != "disabled":
        run = _start_run(project, config, name, chosen, folder, run_id, None)
    run_dir = Path(run.sync_dir) if run is not None and chosen != "disabled" else None
    tracking = Tracking(project, chosen, reason, key_source, run, run_dir, _saved_env=saved_env)
    _announce(tracking)
    return tracking


# the WANDB_MODE an unfinished init_tracking call wrote into the environment, so a later call
# does not mistake it for the user's choice (finish() puts the user's values back)
_mode_we_set: str | None = None


def _choose_mode(mode: str) -> tuple[str, str, str | None, str | None]:
    """(mode, reason, key to pass or None, where the key came from)."""
    if mode in ("offline", "disabled"):
        return mode, f"mode={mode!r} was asked for", None, None
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if env_mode == _mode_we_set:  # our own earlier choice (maybe a network blip), not the user's
        env_mode = ""
    if mode == "auto" and env_mode in ("offline", "dryrun", "disabled"):
        chosen = "disabled" if env_mode == "disabled" else "offline"
        return chosen, f"WANDB_MODE={env_mode} is set in the environment", None, None
    found = find_token(KEY_NAME)
    key, source = found.value, found.source
    if key is None:
        where, add = "; ".join(found.misses), where_to_add(KEY_NAME, found.platform)
        return "offline", f"no W&B key found ({where}). {add} to go online", None, None
    host, port = _server()
    if not http_answers(wandb_base_url(), HOST_TIMEOUT_S):
        return (
            "offline",
            f"a W&B key was found ({source}) but {host}:{port} cannot be reached (no answer within "
            f"{HOST_TIMEOUT_S:g} s; Kaggle: Settings > Internet > On)",
            None,
            source,
        )
    return "online", f"W&B key from {source}", key, source


def _start_run(project, config, name, mode, folder: Path, run_id, key):
    import wandb

    settings = wandb.Settings(
        init_timeout=ONLINE_INIT_TIMEOUT_S,  # online: give up after this many seconds; we retry offline
        silent=True,  # one line from us instead of wandb's banner
        **({"api_key": key} if key else {}),  # in memory only: not saved to ~/.netrc, not in os.environ
    )
    return wandb.init(
        project=project,
        config=config,
        name=name,
        mode=mode,
        dir=str(folder),
        id=run_id,
        resume="allow" if run_id else None,
        reinit="finish_previous",
        settings=settings,
    )


# the reasons this process has printed in full: a notebook that tracks one run per seed says why it
# is offline once, then one line a run (its finish() prints the upload command)
_explained: set[str] = set()


def _announce(tracking: Tracking) -> None:
    if tracking.mode == "online":
        print(f"wandb: online ({tracking.reason}), run {tracking.run.url}")
    elif tracking.mode == "offline":
        why = f": {tracking.reason}" if tracking.reason not in _explained else " (why: above)"
        print(f"wandb: offline{why}.\n  the run is saved in {tracking.run_dir}")
        _explained.add(tracking.reason)
    else:
        print(f"wandb: disabled ({tracking.reason}); nothing is recorded")


def _server() -> tuple[str, int]:
    url = urlparse(wandb_base_url())
    return url.hostname or "api.wandb.ai", url.port or (443 if url.scheme == "https" else 80)
