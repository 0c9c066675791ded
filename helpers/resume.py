"""Resume after a disconnect: find the newest whole checkpoint, and say why the others are not.

Taught in notebook 08 (capstone: surviving a disconnect). This is about the checkpoint folders the
Trainer saves, not gradient checkpointing (notebook 03). A free Colab session can end at any
moment, and a process killed while the Trainer writes `checkpoint-N` leaves a folder with a
truncated weight file or no `trainer_state.json`. `Trainer.train(resume_from_checkpoint=True)`
takes the highest-numbered folder whatever its state and stops on it with an error such as
safetensors' "incomplete metadata, file not fully covered"; this module checks each folder, newest
first, and hands back the newest one that is whole:

    trainer.train(resume_from_checkpoint=latest_valid_checkpoint(args.output_dir))

None (no usable checkpoint yet) makes the Trainer start from scratch, so the same line works for
the first run and for every resume.

What is checked, without loading any tensor (so it takes milliseconds even for a 7B model):
`trainer_state.json` parses and names the folder's step; every weight file (safetensors, sharded
or not, full model or adapter) has a header that parses and exactly the bytes that header
promises; the optimizer, scheduler and RNG files are complete zip archives, as torch writes them.
The layout checked is the Trainer's own on one GPU or with data parallel (DDP); DeepSpeed and
FSDP write theirs differently and are not recognised.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR + "-<step>"
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

__all__ = ["check_checkpoint", "latest_valid_checkpoint", "list_checkpoints"]


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The Trainer's checkpoint folders under `output_dir`, newest (highest step) first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def check_checkpoint(folder: str | os.PathLike, *, for_resume: bool = True) -> list[str]:
    """List what makes a checkpoint folder unusable; an empty list means it is whole.

    Args:
        folder: a `checkpoint-N` folder the Trainer wrote.
        for_resume: also require the optimizer and scheduler states (needed to resume training;
            not needed to load the weights for evaluation).

    Returns:
        one sentence per problem, e.g. "model.safetensors is truncated: 4,096 of 1,267,832 bytes".

    Example:
        >>> check_checkpoint("out/checkpoint-40")  # doctest: +SKIP
        []
    """
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    problems = _check_state(folder)
    weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        problems.append(f"no weights file (one of {', '.join(WEIGHT_FILES)})")
    for name in weights:
        problems += _check_weights(folder / name)
    if for_resume:
        for name in RESUME_FILES:
            if not (folder / name).is_file():
                problems.append(f"no {name} (saved with save_only_model=True? then it can be loaded, not resumed)")
            else:
                problems += _check_torch_file(folder / name)
    # optional (RNG states per process, the fp16 loss scaler), but a partial one breaks the resume
    for path in sorted(folder.glob("rng_state*.pth")) + sorted(folder.glob("scaler.pt")):
        problems += _check_torch_file(path)
    return problems


def latest_valid_checkpoint(output_dir: str | os.PathLike, *, for_resume: bool = True) -> str | None:
    """The newest checkpoint under `output_dir` that is whole, or None when there is none yet.

    Prints one line for each newer folder it skips, naming the folder and what is wrong, and one
    line saying which checkpoint it picked (or that training starts from scratch). Taught in
    notebook 08.

    Args:
        output_dir: the Trainer's `output_dir`.
        for_resume: require the optimizer and scheduler states too (see `check_checkpoint`).

    Returns:
        the folder as a string, ready for `trainer.train(resume_from_checkpoint=...)`, or None.

    Example:
        >>> trainer.train(resume_from_checkpoint=latest_valid_checkpoint(args.output_dir))  # doctest: +SKIP
        skipping out/checkpoint-60: model.safetensors is truncated: 65,536 of 1,267,832 bytes
        resuming from out/checkpoint-40 (step 40)
    """
    for folder in list_checkpoints(output_dir):
        problems = check_checkpoint(folder, for_resume=for_resume)
        if not problems:
            print(f"resuming from {folder} (step {CHECKPOINT_RE.match(folder.name).group(1)})")
            return str(folder)
        print(f"skipping {folder}: {'; '.join(problems)}")
    print(f"no usable checkpoint in {output_dir}: training starts from scratch")
    return None


def _check_state(folder: Path) -> list[str]:
    path = folder / TRAINER_STATE
    if not path.is_file():
        return [f"no {TRAINER_STATE} (the save was cut off: the Trainer writes it last)"]
    try:
        state = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return [f"{TRAINER_STATE} does not parse ({e.__class__.__name__}: {e})"]
    step = int(CHECKPOINT_RE.match(folder.name).group(1)) if CHECKPOINT_RE.match(folder.name) else None
    if not isinstance(state, dict) or "global_step" not in state:
        return [f"{TRAINER_STATE} has no global_step"]
    if step is not None and state["global_step"] != step:
        return [f"{TRAINER_STATE} says step {state['global_step']} but the folder is {folder.name}"]
    return []


def _check_weights(path: Path) -> list[str]:
    if path.name.endswith(".index.json"):  # a sharded model: check the index, then every shard it names
        try:
            shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError) as e:
            return [f"{path.name} does not parse ({e.__class__.__name__})"]
        problems = []
        for shard in shards:
            if not (path.parent / shard).is_file():
                problems.append(f"shard {shard} named in {path.name} is missing")
            else:
                problems += _check_safetensors(path.parent / shard)
        return problems
    if path.suffix == ".safetensors":
        return _check_safetensors(path)
    return _check_torch_file(path)


def _check_safetensors(path: Path) -> list[str]:
    """A safetensors file is 8 bytes of header length (little-endian u64), a JSON header, then the data.

    The header gives each tensor's [start, end) byte offsets into the data, so the file must be
    exactly 8 + header + the largest end long: anything shorter was cut off.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return [f"{path.name} is truncated: {size:,} bytes, not even a header"]
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            return [f"{path.name} is truncated: {size:,} bytes, its header alone needs {8 + header_len:,}"]
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return [f"{path.name} has a header that does not parse (not a safetensors file, or overwritten)"]
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return [f"{path.name} is truncated: {size:,} of {expected:,} bytes"]
    if size > expected:
        return [f"{path.name} has {size - expected:,} bytes more than its header describes (written over?)"]
    return []


def _check_torch_file(path: Path) -> list[str]:
    """torch.save writes a zip archive whose directory comes last: a cut-off file has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except zipfile.BadZipFile:
        return [f"{path.name} is not a complete torch file ({path.stat().st_size:,} bytes; cut off while saving?)"]
    return []
