"""The run manifest: every setting behind a checkpoint, written beside it, with no secret in it.

Taught in notebook 06 (experiment tracking: "the config of the best checkpoint, read back from its
manifest") and used in notebook 08 (surviving a disconnect: the manifest of the checkpoint a run
resumes from names the tracking run to continue):

- `ManifestCallback()` writes `run_manifest.json` into every checkpoint folder the Trainer saves:
  every training argument, the seed, the effective batch, model id and revision, the dataset
  fingerprint, package versions, the kit's commit, the card and the peak memory, and a SHA-256 of
  every file of the checkpoint, which `helpers.resume` verifies before resuming from it. The same
  manifest goes to the wandb run's config when there is one (`helpers.tracking.init_tracking`).
- `load_manifest(checkpoint)` reads it back.
- `scrub_secrets(obj)` is what keeps secrets out: every manifest is scrubbed of the values of
  secret-looking environment variables (and of keys `register_secret` was given) and of
  secret-named fields before it is written.

Importing this module is cheap: torch and transformers load when a function needs them; wandb is
never imported here (a run the notebook started is found in `sys.modules`).

Longer than 400 lines because the manifest's writer and the scrubbing that keeps secrets out of it
must change together: a new section is a new place a secret could land.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

from helpers._callbacks import lazy_callbacks
from helpers._checksums import file_checksums, rows_sha256
from helpers._secrets import register_secret, registered_secrets  # register_secret: re-exported

__all__ = [
    "MANIFEST_NAME",
    "ManifestCallback",  # noqa: F822 (built on first use by __getattr__ below)
    "load_manifest",
    "package_versions",
    "register_secret",
    "scrub_secrets",
]

MANIFEST_NAME = "run_manifest.json"
PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "datasets", "accelerate", "wandb")
KIT_DISTRIBUTION = "compute-realities-kit"

# environment variables whose values are secrets: their values are scrubbed from every manifest
_SECRET_NAME = re.compile(r"(TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_KEY|ACCESS_KEY)", re.I)
# manifest keys whose string values are secrets whatever they hold
_SECRET_FIELD = re.compile(r"(api_key|apikey|secret|password|passwd|hub_token|hf_token|auth_token|access_token)$", re.I)
_COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit hash, as the Hub cache names snapshots
_MIN_SECRET_LEN = 8  # shorter values ("1", "true") are flags, not secrets, and would scrub everything


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
    and the peak memory so far, and a SHA-256 of each of the checkpoint's files ("checksums"),
    which `helpers.resume.latest_valid_checkpoint` verifies (notebook 08). Read it back with
    `load_manifest`. Taught in notebook 06.

    Args:
        model_id: the id to record; default: the model's own (`config._name_or_path`,
            "embedded" for the kit's tiny model).
        revision: the branch, tag or commit passed to `load_model` / `load_qlora`; the
            commit it points to is read from the local Hub cache (no network).
        dataset: the training dataset whose fingerprint and SHA-256 of its rows to record; default:
            the one the Trainer's dataloader holds.
        seq_len: the tokens each example was cut to (`chat_dataset`'s seq_len), to record beside
            the data; `helpers.runs.choose_run_folder` compares it (notebook 08).
        extra: anything else to keep with each checkpoint (JSON-safe values).

    Example:
        >>> trainer = Trainer(model, args, train_dataset=train,
        ...                   callbacks=[ManifestCallback(dataset=train)])  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        model_id: str | None = None,
        revision: str | None = None,
        dataset=None,
        seq_len: int | None = None,
        extra: dict | None = None,
    ):
        self.model_id, self.revision, self.dataset, self.extra = model_id, revision, dataset, dict(extra or {})
        self.seq_len = seq_len
        self.last_manifest: dict | None = None  # the latest manifest written, for a notebook to show
        self._static: dict | None = None  # the parts that do not change during a run

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self._static = None
        if state.is_world_process_zero:
            manifest = self._manifest(args, state, model, train_dataloader)
            _log_to_wandb(config={"manifest": manifest})

    def on_save(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        # Every process saves its own RNG state (rng_state_<rank>.pth) before its on_save: once all
        # have reached this point, the checkpoint is whole and the main process can hash all of it.
        _wait_for_every_process()
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"  # the Trainer's own naming
        if not folder.is_dir():  # a save that wrote somewhere else (hyperparameter search): say so
            print(f"ManifestCallback: no checkpoint folder {folder}; manifest not written")
            return
        manifest = self._manifest(args, state, model, train_dataloader)
        manifest["checkpoint"] = folder.name
        # the Trainer has written every file by now (trainer_state.json last); after the scrub,
        # which must never touch a digest
        manifest["checksums"] = {"algorithm": "sha256", "files": file_checksums(folder, skip=(MANIFEST_NAME,))}
        _write_json(folder / MANIFEST_NAME, manifest)
        self.last_manifest = manifest

    def on_train_end(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if state.is_world_process_zero:
            manifest = self._manifest(args, state, model, train_dataloader)
            _log_to_wandb(
                summary={
                    "peak_memory_bytes": manifest["memory"]["peak_bytes"],
                    "effective_batch": manifest["training"]["effective_batch"],
                }
            )

    def _manifest(self, args, state, model, train_dataloader) -> dict:
        if self._static is None:
            dataset = self.dataset if self.dataset is not None else getattr(train_dataloader, "dataset", None)
            self._static = {
                "model": _model_section(model, self.model_id, self.revision),
                "data": _data_section(dataset, self.seq_len),
                "packages": package_versions(),
                "kit": _kit_version(),
                "machine": _machine_section(),
            }
        manifest = {
            "manifest_version": 1,
            "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "step": state.global_step,
            "epoch": state.epoch,
            "training": _training_section(args),
            **self._static,
            "metrics": _metrics_section(state),
            "memory": _peak_memory(),
            "tracking": _tracking_section(),
            "extra": self.extra,
        }
        return scrub_secrets(json.loads(json.dumps(manifest, default=_json_default)))  # JSON-safe, then no secrets


# ManifestCallback subclasses TrainerCallback: built, importing transformers, on first use
__getattr__, __dir__ = lazy_callbacks(globals(), ManifestCallback=_ManifestWriter)


def _wait_for_every_process() -> None:
    """A barrier across the data-parallel processes, when there are several (notebook 07, export 08)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


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


def _data_section(dataset, seq_len: int | None) -> dict:
    if dataset is None:
        return {"fingerprint": None, "seq_len": seq_len}
    return {
        "fingerprint": getattr(dataset, "_fingerprint", None),  # datasets' hash of the data and its transforms
        "sha256": rows_sha256(dataset),  # by content: the fingerprint changes with the file's date (helpers.runs)
        "num_rows": len(dataset) if hasattr(dataset, "__len__") else None,
        "type": type(dataset).__name__,
        "seq_len": seq_len,
    }


def _metrics_section(state) -> dict:
    history = state.log_history or []
    last_train = next((h for h in reversed(history) if "loss" in h), None)
    last_eval = next((h for h in reversed(history) if any(k.startswith("eval_") for k in h)), None)
    return {
        "last_train_log": last_train,
        "last_eval_log": last_eval,
        "best_metric": state.best_metric,
        "best_model_checkpoint": state.best_model_checkpoint,
    }


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
    return {
        "project": run.project,
        "run_id": run.id,
        "name": run.name,
        "mode": "offline" if run.offline else "online",
        "url": None if run.offline else run.url,
    }


def _machine_section() -> dict:
    from dataclasses import asdict

    from helpers.env import describe

    machine = describe()
    return {**asdict(machine), "precision": asdict(machine.precision), "python": sys.version.split()[0]}


def package_versions() -> dict:
    """Installed versions of the libraries the kit teaches (None where one is missing)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    if "torch" in sys.modules:  # torch's own label names its build: PyPI's CUDA wheel says 2.11.0, torch 2.11.0+cu130
        versions["torch"] = str(sys.modules["torch"].__version__)
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


# ---------------------------------------------------------------------------------------------
# keeping secrets out


def scrub_secrets(obj):
    """Return a copy of a string or JSON-like object with every secret replaced by "<redacted>".

    Secrets are the values of environment variables whose names look secret (HF_TOKEN,
    WANDB_API_KEY, ..._PASSWORD; 8 characters or more), the values given to `register_secret`,
    and any string under a secret-named key ("api_key", "hf_token", ...). Taught in notebook 06.

    Example:
        >>> os.environ["MY_SERVICE_TOKEN"] = "s3cr3t-value-123"
        >>> scrub_secrets({"note": "token s3cr3t-value-123", "api_key": "abc", "lr": 1e-3})
        {'note': 'token <redacted>', 'api_key': '<redacted>', 'lr': 0.001}
        >>> del os.environ["MY_SERVICE_TOKEN"]
    """
    return _scrub(obj, _secret_values())


def _secret_values() -> list[str]:
    values = {v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    values |= registered_secrets()
    return sorted(values, key=len, reverse=True)  # longest first: a secret containing another is scrubbed whole


def _scrub_text(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "<redacted>")
    return text


def _scrub(obj, secrets: list[str], key: str = ""):
    """A copy of a JSON-like object with secret values and secret-named fields replaced by "<redacted>"."""
    if isinstance(obj, dict):
        return {k: _scrub(v, secrets, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub(v, secrets, key) for v in obj]
    if isinstance(obj, str):
        if _SECRET_FIELD.search(key) and obj and not (obj.startswith("<") and obj.endswith(">")):
            return "<redacted>"
        return _scrub_text(obj, secrets)
    return obj
