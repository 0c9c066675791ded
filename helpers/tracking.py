"""Experiment tracking that never blocks a run: wandb online with a key, offline without, and a manifest.

Taught in notebook 06 (experiment tracking) and used by notebook 08 (capstone):

- `init_tracking(project, config)` starts a wandb run: online when a key is found (the
  WANDB_API_KEY variable, a Colab secret, a Kaggle secret or a `wandb login` on this machine) and
  api.wandb.ai answers, offline otherwise. It never prompts and never waits long: a missing key, a
  notebook without internet or a server that does not answer all end in an offline run that
  `wandb sync <folder>` uploads later (the exact command is printed).
- `ManifestCallback()` writes `run_manifest.json` into every checkpoint folder the Trainer saves:
  every training argument, the seed, the effective batch, model id and revision, the dataset
  fingerprint, package versions, the kit's commit, the card and the peak memory. The same manifest
  goes to the wandb run's config. `load_manifest(checkpoint)` reads it back.

No secret lands in a manifest, a log or a printed line: keys are passed to wandb in memory
(never through os.environ, never saved to ~/.netrc), nothing records the environment, and every
manifest is scrubbed of the values of secret-looking environment variables before it is written.

Importing this module is cheap: wandb, torch and transformers load when a function needs them.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from helpers._callbacks import lazy_callbacks
from helpers.env import can_connect

KEY_NAME = "WANDB_API_KEY"  # the name of the key everywhere: env variable, Colab secret, Kaggle secret
MANIFEST_NAME = "run_manifest.json"
MODES = ("auto", "online", "offline", "disabled")
HOST_TIMEOUT_S = 3.0  # seconds for a TCP connection to the wandb server before going offline
SECRET_TIMEOUT_S = 10.0  # seconds for a Colab / Kaggle secret store to answer
ONLINE_INIT_TIMEOUT_S = 30.0  # seconds wandb.init may take online before the run goes offline instead
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "datasets", "accelerate", "wandb")
KIT_DISTRIBUTION = "compute-realities-kit"

# environment variables whose values are secrets: their values are scrubbed from every manifest
_SECRET_NAME = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.I)
# manifest keys whose string values are secrets whatever they hold
_SECRET_FIELD = re.compile(r"(api_key|apikey|secret|password|passwd|hub_token|hf_token|auth_token|access_token)$", re.I)
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit hash, as the Hub cache names snapshots
_MIN_SECRET_LEN = 8  # shorter values ("1", "true") are flags, not secrets, and would scrub everything
_found_secrets: set[str] = set()  # keys read from Colab / Kaggle secret stores, to scrub them too

__all__ = [
    "MANIFEST_NAME",
    "ManifestCallback",
    "Tracking",
    "init_tracking",
    "load_manifest",
]


# ---------------------------------------------------------------------------------------------
# the wandb run


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
        if self.run is not None and not self._finished:
            self.run.finish()
            if self.mode == "offline":
                import wandb

                # offline, run.finish() returns before wandb's service has written the last records
                # (the summary); teardown waits for them, so the folder is complete when this returns
                wandb.teardown()
            self._finished = True
        _restore_environment(self._saved_env)
        if self.sync_command:
            print(f"wandb: offline run saved. Upload it later with:\n  {self.sync_command}")
        return self.sync_command


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
    `SECRET_TIMEOUT_S` just moves on), then a `wandb login` saved on this machine. Sets
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
            chosen, reason = "offline", f"wandb could not start online ({_scrub_text(_first_line(e))})"
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


def _restore_environment(saved: dict) -> None:
    global _mode_we_set
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _mode_we_set = None


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
    key, source, misses = _find_key()
    if source is None:
        where = "; ".join(misses)
        return ("offline", f"no W&B key found ({where}). Add a secret named {KEY_NAME} (Colab: the key icon "
                "in the left bar; Kaggle: Add-ons > Secrets) to go online", None, None)
    host, port = _server()
    if not can_connect(host, port, HOST_TIMEOUT_S):
        return ("offline", f"a W&B key was found ({source}) but {host}:{port} cannot be reached within "
                f"{HOST_TIMEOUT_S:g} s (Kaggle: Settings > Internet > On)", None, source)
    return "online", f"W&B key from {source}", key, source


def _start_run(project, config, name, mode, folder: Path, run_id, key):
    import wandb

    settings = wandb.Settings(
        init_timeout=ONLINE_INIT_TIMEOUT_S,  # online: give up after this many seconds; we retry offline
        silent=True,  # one line from us instead of wandb's banner
        **({"api_key": key} if key else {}),  # in memory only: not saved to ~/.netrc, not in os.environ
    )
    return wandb.init(project=project, config=config, name=name, mode=mode, dir=str(folder), id=run_id,
                      resume="allow" if run_id else None, reinit="finish_previous", settings=settings)


def _announce(tracking: Tracking) -> None:
    if tracking.mode == "online":
        print(f"wandb: online ({tracking.reason}), run {tracking.run.url}")
    elif tracking.mode == "offline":
        print(f"wandb: offline: {tracking.reason}.\n"
              f"  the run is saved in {tracking.run_dir}\n"
              f"  upload it later with: {tracking.sync_command}")
    else:
        print(f"wandb: disabled ({tracking.reason}); nothing is recorded")


def _find_key() -> tuple[str | None, str | None, list[str]]:
    """(key, where it came from, why each store had none). The key is returned, never printed."""
    misses = []
    if os.environ.get(KEY_NAME, "").strip():
        return None, f"the {KEY_NAME} environment variable", misses  # wandb reads it from there itself
    misses.append(f"no {KEY_NAME} variable")
    for source, read in (("Colab secrets", _colab_secret), ("Kaggle secrets", _kaggle_secret)):
        value, why = _ask_store(read)
        if value:
            _found_secrets.add(value)
            return value, source, misses
        if why:
            misses.append(f"{source}: {why}")
    if _netrc_has_key():
        return None, "a `wandb login` saved in ~/.netrc", misses
    return None, None, misses


def _colab_secret():
    from google.colab import userdata  # ImportError off Colab

    return userdata.get(KEY_NAME)  # raises SecretNotFoundError / NotebookAccessError when absent


def _kaggle_secret():
    from kaggle_secrets import UserSecretsClient  # ImportError off Kaggle

    return UserSecretsClient().get_secret(KEY_NAME)  # raises when the secret is not attached


def _ask_store(read) -> tuple[str | None, str | None]:
    """Call a secret store in a daemon thread: (value or None, why not or None when the store is absent)."""
    result: dict = {}

    def ask():
        try:
            result["value"] = read()
        except ImportError:
            result["absent"] = True
        except Exception as e:  # the stores raise their own error types for "no such secret"
            result["error"] = f"{type(e).__name__}"  # the type only: a message could quote the secret

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(SECRET_TIMEOUT_S)
    if thread.is_alive():
        return None, f"no answer within {SECRET_TIMEOUT_S:g} s"
    if result.get("absent"):
        return None, None  # not on that platform: nothing worth saying
    if "error" in result:
        return None, f"no {KEY_NAME} secret, or this notebook may not read it ({result['error']})"
    value = result.get("value")
    if not isinstance(value, str) or not value.strip():
        return None, f"the {KEY_NAME} secret is empty"
    return value.strip(), None


def _netrc_has_key() -> bool:
    import netrc

    host, _ = _server()
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def _server() -> tuple[str, int]:
    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    return url.hostname or "api.wandb.ai", url.port or (443 if url.scheme == "https" else 80)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


# ---------------------------------------------------------------------------------------------
# the run manifest


def load_manifest(checkpoint_dir: str | os.PathLike) -> dict:
    """Read the manifest `ManifestCallback` wrote into a checkpoint folder.

    Taught in notebook 06 ("the config of the best checkpoint, read back from its manifest").

    Args:
        checkpoint_dir: a checkpoint folder ("out/checkpoint-40"), or the manifest file itself.

    Returns:
        the manifest as a dict: "training" (every argument, seed, effective batch), "model",
        "data", "packages", "kit", "machine", "memory", "metrics", "tracking".

    Example:
        >>> manifest = load_manifest(trainer.state.best_model_checkpoint)  # doctest: +SKIP
        >>> manifest["training"]["args"]["learning_rate"]  # doctest: +SKIP
    """
    path = Path(checkpoint_dir)
    path = path if path.suffix == ".json" else path / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"No manifest at {path}. It is written by ManifestCallback when the Trainer saves a checkpoint: "
            "pass callbacks=[ManifestCallback()] to the Trainer, and check the folder name "
            f"(folders there: {_listing(path.parent)})."
        )
    return json.loads(path.read_text())


def _listing(folder: Path) -> str:
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return "the folder does not exist"
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") if names else "none"


class _ManifestWriter:
    """Write `run_manifest.json` into every checkpoint the Trainer saves, and log it to wandb.

    The manifest holds every training argument, the seed, the effective batch
    (per_device_batch x grad_accum_steps x num_devices), the model id and revision, the
    dataset fingerprint, package versions, the kit's commit, the card (helpers.env.describe)
    and the peak memory so far. Read it back with `load_manifest`. Taught in notebook 06.

    Args:
        model_id: the id to record; default: the model's own (`config._name_or_path`,
            "embedded" for the kit's tiny model).
        revision: the branch, tag or commit passed to `load_model` / `load_qlora`; the
            commit it points to is read from the local Hub cache (no network).
        dataset: the training dataset whose fingerprint to record; default: the one the
            Trainer's dataloader holds.
        extra: anything else to keep with each checkpoint (JSON-safe values).

    Example:
        >>> trainer = Trainer(model, args, train_dataset=train,
        ...                   callbacks=[ManifestCallback(dataset=train)])  # doctest: +SKIP
    """

    def __init__(self, *, model_id: str | None = None, revision: str | None = None, dataset=None,
                 extra: dict | None = None):
        self.model_id, self.revision, self.dataset, self.extra = model_id, revision, dataset, dict(extra or {})
        self.last_manifest: dict | None = None  # the latest manifest written, for a notebook to show
        self._static: dict | None = None  # the parts that do not change during a run

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._static = None
        if state.is_world_process_zero:
            manifest = self._manifest(args, state, model, train_dataloader)
            _log_to_wandb(config={"manifest": manifest})

    def on_save(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"  # the Trainer's own naming
        if not folder.is_dir():  # a save that wrote somewhere else (hyperparameter search): say so
            print(f"ManifestCallback: no checkpoint folder {folder}; manifest not written")
            return
        manifest = self._manifest(args, state, model, train_dataloader)
        manifest["checkpoint"] = folder.name
        _write_json(folder / MANIFEST_NAME, manifest)
        self.last_manifest = manifest

    def on_train_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if state.is_world_process_zero:
            manifest = self._manifest(args, state, model, train_dataloader)
            _log_to_wandb(summary={"peak_memory_bytes": manifest["memory"]["peak_bytes"],
                                   "effective_batch": manifest["training"]["effective_batch"]})

    def _manifest(self, args, state, model, train_dataloader) -> dict:
        if self._static is None:
            dataset = self.dataset if self.dataset is not None else getattr(train_dataloader, "dataset", None)
            self._static = {
                "model": _model_section(model, self.model_id, self.revision),
                "data": _data_section(dataset),
                "packages": _package_versions(),
                "kit": _kit_version(),
                "machine": _machine_section(),
            }
        manifest = {
            "manifest_version": 1,
            "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "step": state.global_step,
            "epoch": state.epoch,
            "training": _training_section(args),
            **self._static,
            "metrics": _metrics_section(state),
            "memory": _peak_memory(),
            "tracking": _tracking_section(),
            "extra": self.extra,
        }
        return _scrub(json.loads(json.dumps(manifest, default=_json_default)))  # JSON-safe, then no secrets


# ManifestCallback subclasses TrainerCallback: built, importing transformers, on first use
__getattr__, __dir__ = lazy_callbacks(globals(), ManifestCallback=_ManifestWriter)


def _training_section(args) -> dict:
    from helpers.training import effective_batch_size

    per_device_batch = int(args.per_device_train_batch_size)
    grad_accum_steps = int(args.gradient_accumulation_steps)
    effective_batch = effective_batch_size(args)  # the Trainer's own device count (DDP and DataParallel)
    return {
        "seed": args.seed,
        "per_device_batch": per_device_batch,
        "grad_accum_steps": grad_accum_steps,
        "num_devices": effective_batch // (per_device_batch * grad_accum_steps),
        "effective_batch": effective_batch,
        "args": args.to_dict(),  # every TrainingArguments field; *_token fields come back redacted
    }


def _model_section(model, model_id: str | None, revision: str | None) -> dict:
    if model is None:
        return {"id": model_id, "revision": revision}
    from helpers.models import EMBEDDED_ID, is_embedded

    config = getattr(model, "config", None)
    embedded = config is not None and is_embedded(model)
    name_or_path = getattr(config, "_name_or_path", None)
    section = {
        "id": model_id or (EMBEDDED_ID if embedded else name_or_path),
        "revision": revision,  # as asked for; None: the default branch
        "commit": None if embedded else _hub_commit(name_or_path, revision),  # what it pointed to
        "embedded": embedded,
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    quantization = getattr(config, "quantization_config", None)
    if quantization is not None:
        section["quantization"] = quantization if isinstance(quantization, dict) else quantization.to_dict()
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        section["adapters"] = {name: cfg.to_dict() for name, cfg in peft_config.items()}
    return section


def _hub_commit(name_or_path: str | None, revision: str | None, cache_dir=None) -> str | None:
    """The commit a Hub model's files came from, read from the local Hub cache (never the network).

    transformers 5 resolves the revision to a commit when it loads but does not keep it on the
    model; the cache keeps it: refs/<revision> names the commit, snapshots/<commit>/ holds the files.
    None for a local folder that is not a cache snapshot, or a model that is not in the cache.
    """
    if not name_or_path:
        return None
    path = Path(name_or_path)
    if path.is_dir():  # loaded from a folder: a cache snapshot is named by its commit
        return path.name if path.parent.name == "snapshots" and _COMMIT.fullmatch(path.name) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name_or_path, "config.json", revision=revision, cache_dir=cache_dir)
    except Exception:  # not a valid repo id, or an unreadable cache: the commit stays unknown
        return None
    commit = Path(found).parent.name if isinstance(found, str) else ""
    return commit if _COMMIT.fullmatch(commit) else None


def _data_section(dataset) -> dict:
    if dataset is None:
        return {"fingerprint": None}
    return {
        "fingerprint": getattr(dataset, "_fingerprint", None),  # datasets' hash of the data and its transforms
        "num_rows": len(dataset) if hasattr(dataset, "__len__") else None,
        "type": type(dataset).__name__,
    }


def _metrics_section(state) -> dict:
    history = state.log_history or []
    last_train = next((h for h in reversed(history) if "loss" in h), None)
    last_eval = next((h for h in reversed(history) if any(k.startswith("eval_") for k in h)), None)
    return {"last_train_log": last_train, "last_eval_log": last_eval,
            "best_metric": state.best_metric, "best_model_checkpoint": state.best_model_checkpoint}


def _peak_memory() -> dict:
    """Peak memory of this process so far: torch's allocator on a GPU, the peak RSS on CPU (bytes)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"peak_bytes": int(torch.cuda.max_memory_allocated()), "measured_by": "torch.cuda.max_memory_allocated"}
    try:
        import resource
    except ImportError:  # Windows
        return {"peak_bytes": None, "measured_by": "unavailable on this platform"}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return {"peak_bytes": int(peak if sys.platform == "darwin" else peak * 1024), "measured_by": "process peak RSS"}


def _tracking_section() -> dict | None:
    wandb = sys.modules.get("wandb")
    run = getattr(wandb, "run", None) if wandb else None
    if run is None:
        return None
    return {"project": run.project, "run_id": run.id, "name": run.name,
            "mode": "offline" if run.offline else "online", "url": None if run.offline else run.url}


def _machine_section() -> dict:
    from dataclasses import asdict

    from helpers.env import describe

    machine = describe()
    return {**asdict(machine), "precision": asdict(machine.precision), "python": sys.version.split()[0]}


def _package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


@lru_cache(maxsize=1)
def _kit_version() -> dict:
    """The kit's version and commit: from its git checkout, else from pip's record of a git+https install."""
    from helpers import __version__

    root = Path(__file__).resolve().parent.parent
    info = {"version": __version__, "commit": None, "dirty": None}
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if Path(top).resolve() == root:  # the kit's own repository, not some folder it was installed under
            info["commit"] = _git(root, "rev-parse", "HEAD")
            info["dirty"] = bool(_git(root, "status", "--porcelain", "--untracked-files=no"))
            return info
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import distribution

        direct = json.loads(distribution(KIT_DISTRIBUTION).read_text("direct_url.json") or "{}")
        info["commit"] = direct.get("vcs_info", {}).get("commit_id")
    except Exception:  # not installed as a distribution, or no record: the commit stays unknown
        pass
    return info


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=True)
    return done.stdout.strip()


def _log_to_wandb(config: dict | None = None, summary: dict | None = None) -> None:
    wandb = sys.modules.get("wandb")  # only when the notebook uses wandb: never import it for this
    run = getattr(wandb, "run", None) if wandb else None
    if run is None:
        return
    if config:
        run.config.update(config, allow_val_change=True)
    if summary:
        run.summary.update(summary)


def _json_default(obj):
    if isinstance(obj, (set, frozenset)):  # peft keeps target_modules as a set: sorted, so manifests compare
        return sorted(obj, key=str)
    return str(obj)  # dtypes, paths, enums


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    tmp.replace(path)  # atomic: a kill mid-write never leaves half a manifest


def _secret_values() -> list[str]:
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    values |= _found_secrets
    return sorted(values, key=len, reverse=True)  # longest first: a secret containing another is scrubbed whole


def _scrub_text(text: str, secrets: list[str] | None = None) -> str:
    for secret in _secret_values() if secrets is None else secrets:
        text = text.replace(secret, "<redacted>")
    return text


def _scrub(obj, secrets: list[str] | None = None, key: str = ""):
    """A copy of a JSON-like object with secret values and secret-named fields replaced by "<redacted>"."""
    secrets = _secret_values() if secrets is None else secrets
    if isinstance(obj, dict):
        return {k: _scrub(v, secrets, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v, secrets, key) for v in obj]
    if isinstance(obj, str):
        if _SECRET_FIELD.search(key) and obj and not (obj.startswith("<") and obj.endswith(">")):
            return "<redacted>"
        return _scrub_text(obj, secrets)
    return obj
