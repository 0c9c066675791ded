"""Which run folder a job trains in: its own run's, to go on with it, or a new one when a setting changed.

Taught in notebook 08 (capstone: "Which run this is"). A run folder holds one run, the checkpoints of
one set of settings. Resuming a checkpoint with other settings does not give the run those settings
ask for: a run told `max_steps = 8` that finds the checkpoint a 12-step run ended with reports it
finished ("nothing left to train"), and a new learning rate would go on from weights trained at the
old one. On Colab the folder is on Drive, so an old run answers every later session. So before
resuming, the settings that decide the result are compared with those the newest checkpoint's
manifest records (`helpers.manifest.ManifestCallback` writes it into every checkpoint):

    output_dir = choose_run_folder(runs / "capstone", model, train, model_id=..., seq_len=..., ...)

1. `runs/capstone` holds no checkpoint: the run starts there.
2. its manifest records the same settings: the same run, resumed there (or, finished, reused).
3. a setting differs: it says which (old -> new) and tries the folders beside it, `capstone-2`,
   `capstone-3`, ... the same way: a run changed back finds its folder again, a new run takes the
   first name with no checkpoint in it.

The choice reads only what is on disk, so the same settings find the same folder every time: a rerun
after a disconnect, or a Slurm requeue of the exported train.py, goes on with the run it was in.

Before a run trains in a folder, `helpers.run_folder.check_run_folder` checks it can be written and
holds nothing of the user's that the Trainer's checkpoint rotation would delete.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from helpers._checksums import rows_sha256
from helpers.manifest import MANIFEST_NAME, load_manifest
from helpers.resume import list_checkpoints
from helpers.run_folder import check_run_folder

__all__ = ["RESULT_SETTINGS", "choose_run_folder", "recorded_settings"]

# The settings that decide what a run trains to, each with where a run_manifest.json keeps it. Another
# value of any one is another run: the same steps would give other weights.
RESULT_SETTINGS = {
    "model_id": ("model", "id"),  # the base model the adapter is trained on
    "lora_r": ("model", "adapters", "default", "r"),  # the adapter's rank: its shape
    "lora_alpha": ("model", "adapters", "default", "lora_alpha"),  # the adapter's scale: its update's size
    # the rows as tokenized, by content: other examples, another tokenizer or chat format, or a cut
    "data": ("data", "sha256"),
    "seq_len": ("data", "seq_len"),  # the cut itself, named, though one that cuts no example trains the same
    "learning_rate": ("training", "args", "learning_rate"),
    # a run's length sets its schedule (the learning rate decays to 0 at the last step), so a longer or
    # shorter run is another run, trained from step 0; going on past a finished run's end is not that run
    "max_steps": ("training", "args", "max_steps"),
    "num_train_epochs": ("training", "args", "num_train_epochs"),
    "per_device_batch": ("training", "per_device_batch"),  # with grad_accum_steps: the batch each step averages
    "grad_accum_steps": ("training", "grad_accum_steps"),
    "seed": ("training", "seed"),  # the adapter's initial weights, the data order, dropout
}
# Not counted, because they change what is logged, saved or shown, not the weights: logging_steps,
# save_steps, save_total_limit, report_to (tracking), output_dir and run_name, disable_tqdm,
# dataloader_pin_memory, and notebook 08's demonstration (disconnect_after_step, max_new_tokens). Nor the
# number of devices: a requeue onto other nodes is the same job, and its effective batch is printed.
_NOT_RECORDED = object()  # a setting an older manifest does not record: it cannot be compared


def recorded_settings(manifest: dict) -> dict:
    """The `RESULT_SETTINGS` a run manifest records, by name; those it does not record are left out.

    Example:
        >>> recorded_settings(load_manifest("runs/capstone/checkpoint-12"))["learning_rate"]  # doctest: +SKIP
        0.01
    """
    found = {}
    for name, path in RESULT_SETTINGS.items():
        value = manifest
        for key in path:
            value = value.get(key, _NOT_RECORDED) if isinstance(value, dict) else _NOT_RECORDED
        if value is not _NOT_RECORDED and value is not None:
            found[name] = value
    return found


def choose_run_folder(
    base: str | os.PathLike,
    model,
    dataset,
    *,
    model_id: str,
    seq_len: int,
    learning_rate: float,
    max_steps: int,
    num_train_epochs: float,
    per_device_batch: int,
    grad_accum_steps: int,
    seed: int,
) -> Path:
    """The folder this run trains in: `base` or a folder beside it (`base-2`, ...), as the module says.

    Prints one line for each folder that holds a run with other settings, naming each setting that
    differs (old -> new), and one line saying which folder this run trains in and why. Nothing is
    created, moved or deleted. Taught in notebook 08.

    Args:
        base: the run's folder by name (runs/capstone).
        model: the model to train; its LoRA adapter ("default", as `load_qlora` names it) gives r and alpha.
        dataset: the training rows, hashed by content (helpers._checksums.rows_sha256).
        model_id, seq_len, learning_rate, max_steps, num_train_epochs, per_device_batch, grad_accum_steps,
            seed: the values the run trains with, as the Trainer and `ManifestCallback` get them.

    Returns:
        the folder, for `TrainingArguments(output_dir=...)` and `latest_valid_checkpoint`.

    Example:
        >>> choose_run_folder("runs/capstone", model, train, model_id="embedded", seq_len=512, learning_rate=2e-4,
        ...                   max_steps=8, num_train_epochs=3, per_device_batch=1, grad_accum_steps=16,
        ...                   seed=42)  # doctest: +SKIP
        capstone holds a run with other settings: max_steps -1 -> 8
        this run trains in runs/capstone-2: a new run (no checkpoint there yet)
    """
    lora = getattr(model, "peft_config", {}).get("default")
    settings = {
        "model_id": model_id,
        "lora_r": getattr(lora, "r", None),
        "lora_alpha": getattr(lora, "lora_alpha", None),
        "data": rows_sha256(dataset),
        "seq_len": seq_len,
        "learning_rate": learning_rate,
        "max_steps": max_steps,
        "num_train_epochs": num_train_epochs,
        "per_device_batch": per_device_batch,
        "grad_accum_steps": grad_accum_steps,
        "seed": seed,
    }
    base = Path(base)
    check_run_folder(base)
    for folder in _run_folders(base):
        recorded = _newest_manifest_settings(folder)
        if recorded is None:
            print(
                f"this run trains in {folder}: its checkpoints have no readable {MANIFEST_NAME}, so their settings "
                "cannot be compared; it resumes there as before"
            )
            return folder
        changed = [_change(name, old, settings[name]) for name, old in recorded.items() if old != settings[name]]
        if not changed:
            unknown = sorted(set(settings) - set(recorded))
            aside = f" ({', '.join(unknown)}: not in its manifest, not compared)" if unknown else ""
            print(f"this run trains in {folder}: the same settings as its checkpoints{aside}")
            return folder
        print(f"{folder.name} holds a run with other settings: {'; '.join(changed)}")
    new = next(folder for folder in _candidates(base) if not list_checkpoints(folder))
    check_run_folder(new)
    print(f"this run trains in {new}: a new run (no checkpoint there yet)")
    return new


def _change(name: str, old, new) -> str:
    """ "learning_rate 0.01 -> 0.0002"; the data by the first 12 hex digits of its SHA-256."""
    if name == "data":
        old, new = (f"{v[:12]}..." if isinstance(v, str) else v for v in (old, new))
        return f"data (the tokenized rows' SHA-256) {old} -> {new}"
    return f"{name} {old!r} -> {new!r}"


def _run_folders(base: Path) -> list[Path]:
    """`base` and the folders named `base-N` beside it that hold checkpoints, in the order of N."""
    if not base.parent.is_dir():
        return []
    pattern = re.compile(re.escape(base.name) + r"-(\d+)")
    numbered = sorted(
        (int(m.group(1)), p) for p in base.parent.iterdir() if p.is_dir() and (m := pattern.fullmatch(p.name))
    )
    return [folder for folder in [base, *(p for _, p in numbered)] if list_checkpoints(folder)]


def _candidates(base: Path):
    """base, base-2, base-3, ...: the names a run folder can take."""
    yield base
    n = 2
    while True:
        yield base.with_name(f"{base.name}-{n}")
        n += 1


def _newest_manifest_settings(folder: Path) -> dict | None:
    """The settings the newest checkpoint with a readable manifest records; None when none has one."""
    for checkpoint in list_checkpoints(folder):
        try:
            manifest = load_manifest(checkpoint)
        except (OSError, ValueError):  # missing, cut off or not JSON: try the checkpoint before it
            continue
        if isinstance(manifest, dict):
            return recorded_settings(manifest)
    return None
