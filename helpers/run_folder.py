"""The folder a training run saves into, checked before the run starts: what would fail or be lost later.

Used by `helpers.runs.choose_run_folder` (notebook 08), `helpers.training.training_args` (with
`save_total_limit`) and the exported train.py, before the model loads. Two things are found out too
late otherwise:

- the folder cannot be written: a Kaggle dataset of an earlier run is read-only, and the first save,
  a whole save interval of training in, would fail on a PermissionError;
- something of the user's in it looks like a checkpoint to the Trainer: its `save_total_limit`
  rotation (transformers.trainer_utils.sort_checkpoints) takes every folder globbed as `checkpoint-*`
  whose path matches `.*checkpoint-<digits>`, so "checkpoint-40 - Copy" would be deleted, or kept in
  place of the real checkpoint-40.

The kit never deletes or renames what it did not write: it says what to move. Pure Python.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

__all__ = ["CHECKPOINT_RE", "RunFolderError", "check_run_folder"]

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")  # transformers' PREFIX_CHECKPOINT_DIR + "-<step>"


class RunFolderError(ValueError):
    """A run folder the Trainer cannot save into, or holding a folder of the user's it would take for a checkpoint."""


# the Trainer's rotation (transformers.trainer_utils.sort_checkpoints): every folder globbed as
# "checkpoint-*" whose whole path matches this is a checkpoint to it, numbered by the digits
_TRAINER_CHECKPOINT = re.compile(r".*checkpoint-([0-9]+)")


def check_run_folder(folder: str | os.PathLike) -> Path:
    """Refuse, before any training, a run folder the Trainer would fail to save in or would delete from.

    1. The folder, or the nearest folder above it that exists, takes a new file: a read-only folder (a
       Kaggle dataset, a mounted share) fails here, not at the first checkpoint.
    2. No folder in it that the Trainer's `save_total_limit` rotation takes for a checkpoint is other
       than one: "checkpoint-40 - Copy" and "checkpoint-40.bak" match the Trainer's pattern, so it
       would delete them, or keep them in place of the real checkpoint-40.

    Taught in notebook 08 (`choose_run_folder` calls it); the exported train.py calls it first.
    Returns the folder; raises RunFolderError saying what to move, or where to train instead.
    """
    folder = Path(folder)
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise RunFolderError(f"{existing} is a file, so {folder} cannot be a run folder: pass a folder path")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise RunFolderError(
            f"{folder} cannot be written ({existing}: {e.strerror or e}), so the first checkpoint would fail after "
            "a whole save interval of training. Train in a writable folder (on Kaggle under /kaggle/working; to go "
            f"on with a run kept there, copy it first: cp -r {existing} /kaggle/working/)"
        ) from None
    if folder.is_dir():
        lookalikes = sorted(
            p.name
            for p in folder.glob("checkpoint-*")
            if p.is_dir() and _TRAINER_CHECKPOINT.match(str(p)) and not CHECKPOINT_RE.match(p.name)
        )
        if lookalikes:
            raise RunFolderError(
                f"{folder} holds {', '.join(map(repr, lookalikes))}, which the Trainer's save_total_limit rotation "
                "takes for checkpoints (any folder named checkpoint-<number>...): it would delete them, or keep them "
                f"in place of a real one. Move them out of {folder} (or rename them so they do not start with "
                f"'checkpoint-', e.g. {'copy of ' + lookalikes[0]!r}), then run again"
            )
    return folder
