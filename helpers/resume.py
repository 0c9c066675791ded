"""Resume after a disconnect: find the newest whole checkpoint, and say why the others are not.

Taught in notebook 08 (capstone: surviving a disconnect). This is about the checkpoint folders the
Trainer saves, not gradient checkpointing (notebook 03). A free Colab session can end at any
moment, and a process killed while the Trainer writes `checkpoint-N` leaves a folder with a
truncated weight file or no `trainer_state.json`. `Trainer.train(resume_from_checkpoint=True)`
takes the highest-numbered folder whatever its state and stops on it with an error such as
safetensors' "incomplete metadata, file not fully covered"; this module checks each folder, newest
first, and hands back the newest one that is whole:

    trainer.train(resume_from_checkpoint=latest_valid_checkpoint(args.output_dir))

None (no checkpoint saved yet) makes the Trainer start from scratch, so the same line works for
the first run and for every resume. Checkpoints that are all rejected raise `CheckpointsRejected`
instead: starting from scratch in their folder would train over them, and `save_total_limit` would
delete them, when a reason such as a cut-off manifest beside intact weights is a repair away.

What is checked:

1. the content: a checkpoint saved with `helpers.manifest.ManifestCallback` carries a SHA-256 of
   every file in its run_manifest.json, and each file must still match it. This catches what no
   structural check can: a file zeroed, overwritten or badly copied at its own size, which would
   otherwise resume from damaged weights or optimizer state without a word. It costs one read of
   the checkpoint (about 1 GB/s; a 7B LoRA checkpoint, half a GB, in under a second).
2. the structure, always, without loading any tensor: `trainer_state.json` parses and names the
   folder's step; every weight file (safetensors, sharded or not, full model or adapter) has a
   header that parses and exactly the bytes that header promises; the optimizer, scheduler and RNG
   files are complete zip archives, as torch writes them. A checkpoint without checksums gets
   these checks alone, and `latest_valid_checkpoint` says so.
3. the fit, when given the `model` it will be loaded into: the names and shapes of the saved
   tensors (read from the files' headers) against the model's own, and a LoRA adapter's settings
   (base model, r, alpha, target modules) against the model's adapter. A checkpoint of another
   model, such as notebook 08's 7B under the same run name as a 0.5B, is skipped with both shapes
   named, where the Trainer would stop on a size-mismatch traceback.

A malformed file of any kind is a reason to skip its checkpoint, never an exception. The layout
checked is the Trainer's own on one GPU or with data parallel (DDP); DeepSpeed and FSDP write
theirs differently and are not recognised.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from helpers._checkpoint_files import check_torch_file, check_weights
from helpers._checkpoint_fit import check_fit
from helpers._checksums import sha256_file
from helpers.manifest import MANIFEST_NAME
from helpers.run_folder import CHECKPOINT_RE

TRAINER_STATE = "trainer_state.json"
# any one of these holds the weights: a full model, a peft adapter, or a sharded model's index
WEIGHT_FILES = (
    "model.safetensors",
    "adapter_model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_model.bin",
)
RESUME_FILES = ("optimizer.pt", "scheduler.pt")  # needed to go on with the same optimizer state
# trainer_state.json's fields that a resume reads -> the JSON types it can use; the first two are required
NUMBER = (int, float)
STATE_TYPES = {
    "global_step": int,
    "max_steps": int,
    "epoch": NUMBER,
    "log_history": list,
    "logging_steps": NUMBER,
    "eval_steps": NUMBER,
    "save_steps": NUMBER,
    "train_batch_size": (int, type(None)),
    "best_metric": (*NUMBER, type(None)),
    "best_model_checkpoint": (str, type(None)),
    "stateful_callbacks": dict,
}
REQUIRED_STATE = ("global_step", "max_steps")

__all__ = ["CheckpointsRejected", "check_checkpoint", "latest_valid_checkpoint", "list_checkpoints"]


class CheckpointsRejected(RuntimeError):
    """Every checkpoint under an output folder was rejected: nothing to resume from, and nothing to train over.

    `rejected` maps each checkpoint folder, newest first, to its problems. Taught in notebook 08.
    """

    def __init__(self, output_dir: str | os.PathLike, rejected: dict[Path, list[str]]):
        self.output_dir, self.rejected = Path(output_dir), rejected
        reasons = "\n".join(f"  {folder.name}: {'; '.join(problems)}" for folder, problems in rejected.items())
        here, aside = (shlex.quote(str(self.output_dir) + suffix) for suffix in ("", ".rejected"))
        super().__init__(
            f"no checkpoint in {self.output_dir} can be resumed, so none was loaded and none deleted:\n{reasons}\n"
            "To resume, repair the newest as its reason says and start again. To start afresh, train into "
            f"another folder, or move this one aside first (mv {here} {aside})"
        )


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The Trainer's checkpoint folders under `output_dir`, newest (highest step) first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def check_checkpoint(folder: str | os.PathLike, *, for_resume: bool = True, model=None) -> list[str]:
    """List what makes a checkpoint folder unusable; an empty list means it is whole.

    Never raises for a malformed checkpoint: whatever cannot be read is one of the problems.

    Args:
        folder: a `checkpoint-N` folder the Trainer wrote (or `save_pretrained`'s folder, such as a run's
            final/ adapter: whole when its weights are, for loading; never one to resume).
        for_resume: also require the optimizer and scheduler states (needed to resume training;
            not needed to load the weights for evaluation).
        model: the model the checkpoint is for (a peft model or a plain one): its tensors' names
            and shapes, and its adapter's settings, must be the checkpoint's. None: not checked.

    Returns:
        one sentence per problem, e.g. "model.safetensors is truncated: 4,096 of 1,267,832 bytes".

    Example:
        >>> check_checkpoint("out/checkpoint-40")  # doctest: +SKIP
        []
    """
    return _inspect(Path(folder), for_resume, model)[0]


def latest_valid_checkpoint(output_dir: str | os.PathLike, *, for_resume: bool = True, model=None) -> str | None:
    """The newest checkpoint under `output_dir` that is whole, or None when none was saved yet.

    Prints one line for each newer folder it skips, naming the folder and what is wrong, and one
    line saying which checkpoint it picked and how it was verified (or that training starts from
    scratch). Taught in notebook 08.

    Args:
        output_dir: the Trainer's `output_dir`.
        for_resume: require the optimizer and scheduler states too (see `check_checkpoint`).
        model: the model to resume into; a checkpoint saved from another is skipped (see `check_checkpoint`).

    Returns:
        the folder as a string, ready for `trainer.train(resume_from_checkpoint=...)`, or None.

    Raises:
        CheckpointsRejected: there are checkpoints and every one is rejected; its message names
            each with its problems. Nothing is deleted or moved.

    Example:
        >>> trainer.train(resume_from_checkpoint=latest_valid_checkpoint(args.output_dir))  # doctest: +SKIP
        skipping out/checkpoint-60: optimizer.pt does not match the SHA-256 recorded when it was saved ...
        resuming from out/checkpoint-40 (step 40): 9 files match the SHA-256 checksums in its run_manifest.json
    """
    rejected = {}
    for folder in list_checkpoints(output_dir):
        problems, verified = _inspect(folder, for_resume, model)
        if not problems:
            for skipped, why in rejected.items():
                print(f"skipping {skipped}: {'; '.join(why)}")
            print(f"resuming from {folder} (step {CHECKPOINT_RE.match(folder.name).group(1)}): {verified}")
            return str(folder)
        rejected[folder] = problems
    if rejected:
        raise CheckpointsRejected(output_dir, rejected)
    print(f"no usable checkpoint in {output_dir} (none saved yet): training starts from scratch")
    return None


def _inspect(folder: Path, for_resume: bool, model=None) -> tuple[list[str], str]:
    """(the problems, how the content was verified); never raises."""
    if not folder.is_dir():
        return [f"{folder} is not a folder"], ""
    try:
        found = _structure(folder, for_resume)
        if model is not None and not any(name in ("", *WEIGHT_FILES) for name, _ in found):
            found += _guarded(
                "", check_fit, folder, model, [n for n in WEIGHT_FILES if (folder / n).is_file()]
            )  # "": a fit problem hides no checksum problem
        checksums, verified = _recorded_checksums(folder)
        if isinstance(checksums, str):  # a manifest that cannot be trusted
            return [p for _, p in found] + [checksums], ""
        named = {name for name, _ in found}  # a file with a structural problem is reported once
        found += [p for p in _compare(folder, checksums, for_resume) if p[0] not in named]
    except Exception as e:  # the last net: a checkpoint that cannot be checked is not used
        return [f"{folder.name} could not be checked ({type(e).__name__}: {e})"], ""
    return [problem for _, problem in found], verified


def _structure(folder: Path, for_resume: bool) -> list[tuple[str, str]]:
    """(file, problem) for each structural problem: state, weights, optimizer, scheduler, RNG, scaler."""
    saved = _saved_model(folder)
    if saved and for_resume:  # whole, but of another kind: not "cut off"
        return [("", f"{folder.name} is {saved}, not a Trainer checkpoint: it loads, it does not resume")]
    found = [] if saved else _guarded(TRAINER_STATE, _check_state, folder)
    weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        found.append(("", f"no weights file (one of {', '.join(WEIGHT_FILES)})"))
    for name in weights:
        found += _guarded(name, check_weights, folder / name)
    if for_resume:
        for name in RESUME_FILES:
            if not (folder / name).is_file():
                found.append((name, f"no {name} (saved with save_only_model=True? then it can be loaded, not resumed)"))
            else:
                found += _guarded(name, check_torch_file, folder / name)
    # optional (RNG states per process, the fp16 loss scaler), but a partial one breaks the resume
    for path in sorted(folder.glob("rng_state*.pth")) + sorted(folder.glob("scaler.pt")):
        found += _guarded(path.name, check_torch_file, path)
    return found


def _saved_model(folder: Path) -> str:
    """What a folder with no trainer_state.json but a model's or an adapter's config is ("" for anything else):
    `save_pretrained`'s output (the run's final/), which has no optimizer state to resume from."""
    if (folder / TRAINER_STATE).exists() or CHECKPOINT_RE.match(folder.name) or (folder / "optimizer.pt").exists():
        return ""  # the Trainer's, cut off before its state (written last)
    if (folder / "adapter_config.json").is_file():
        return f"a saved adapter (adapter_config.json; load it with helpers.qlora.load_qlora({str(folder)!r}))"
    return "a saved model (save_pretrained's config.json)" if (folder / "config.json").is_file() else ""


def _guarded(name: str, check, *args) -> list[tuple[str, str]]:
    """Run one check; its problems as (file, problem), and anything it raises as one more problem."""
    try:
        return [(name, problem) for problem in check(*args)]
    except Exception as e:  # a malformed file is a reason to skip the checkpoint, never a crash
        return [(name, f"{name or 'a file'} is malformed ({type(e).__name__}: {e})")]


def _recorded_checksums(folder: Path) -> tuple[dict | str, str]:
    """({file: {"bytes", "sha256"}} from the manifest, or a problem sentence; how the check is described)."""
    path = folder / MANIFEST_NAME
    structure_only = "structure checked only"
    if not path.is_file():
        return {}, f"{structure_only}: no {MANIFEST_NAME} with checksums (saved without ManifestCallback)"
    fix = f"delete {MANIFEST_NAME} to resume on the structural checks alone"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        return f"{MANIFEST_NAME} does not parse ({type(e).__name__}), so the checksums cannot be verified ({fix})", ""
    checksums = manifest.get("checksums") if isinstance(manifest, dict) else None
    if checksums is None:
        return {}, f"{structure_only}: its {MANIFEST_NAME} has no checksums (written by an older kit)"
    files = checksums.get("files") if isinstance(checksums, dict) else None
    well_formed = isinstance(files, dict) and all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
        for e in files.values()
    )
    if checksums.get("algorithm") != "sha256" or not well_formed:
        return f"the checksums in {MANIFEST_NAME} are malformed, so the files cannot be verified ({fix})", ""
    return files, f"its {len(files)} files match the SHA-256 checksums in its {MANIFEST_NAME}"


def _compare(folder: Path, checksums: dict, for_resume: bool) -> list[tuple[str, str]]:
    """(file, problem) for each recorded file that is missing or whose content changed since it was saved."""
    found = []
    for name, entry in checksums.items():
        if not for_resume and _resume_only(name):
            continue
        path = folder / name
        if not path.is_file():
            found.append((name, f"{name} is missing (it was there when the checkpoint was saved)"))
        elif path.stat().st_size != entry["bytes"]:
            found.append((name, f"{name} has {path.stat().st_size:,} bytes, {entry['bytes']:,} when it was saved"))
        elif sha256_file(path) != entry["sha256"]:
            found.append(
                (
                    name,
                    f"{name} does not match the SHA-256 recorded when it was saved (its content changed since: "
                    "zeroed, overwritten or a bad copy)",
                )
            )
    return found


def _resume_only(name: str) -> bool:
    """Files needed to go on training, not to load the weights."""
    return name in RESUME_FILES or name == "scaler.pt" or (name.startswith("rng_state") and name.endswith(".pth"))


def _check_state(folder: Path) -> list[str]:
    path = folder / TRAINER_STATE
    if not path.is_file():
        return [f"no {TRAINER_STATE} (the save was cut off: the Trainer writes it last)"]
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return [f"{TRAINER_STATE} does not parse ({e.__class__.__name__}: {e})"]
    if not isinstance(state, dict):
        return [f"{TRAINER_STATE} is a JSON {type(state).__name__}, not the Trainer's table of its state"]
    problems = [
        f"{TRAINER_STATE} has no {key} (the Trainer always writes it)" for key in REQUIRED_STATE if key not in state
    ]
    for key, kinds in STATE_TYPES.items():
        value = state.get(key)
        if key in state and (isinstance(value, bool) or not isinstance(value, kinds)):
            names = " or ".join(
                "null" if k is type(None) else k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,))
            )
            problems.append(f"{TRAINER_STATE} has {key} = {value!r}, where the Trainer writes {names}")
    unknown = sorted(set(state) - _trainer_state_fields())
    if unknown:
        problems.append(
            f"{TRAINER_STATE} has fields this transformers' TrainerState cannot load ({', '.join(unknown)}): "
            "written by another version?"
        )
    if problems:
        return problems
    step = int(CHECKPOINT_RE.match(folder.name).group(1)) if CHECKPOINT_RE.match(folder.name) else None
    if step is not None and state["global_step"] != step:
        return [f"{TRAINER_STATE} says step {state['global_step']} but the folder is {folder.name}"]
    if state["max_steps"] < 1 or state["global_step"] < 0:
        return [f"{TRAINER_STATE} says step {state['global_step']} of {state['max_steps']}: not a run's position"]
    return []


def _trainer_state_fields() -> set[str]:
    """The fields `TrainerState(**json)` accepts: any other key makes the Trainer's resume raise a TypeError."""
    from dataclasses import fields

    from transformers import TrainerState

    return {f.name for f in fields(TrainerState)}
