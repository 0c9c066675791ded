"""SHA-256 checksums of a checkpoint's files: recorded when it is saved, compared when it is resumed.

Private to the package: `helpers.manifest.ManifestCallback` records them in each checkpoint's
run_manifest.json, `helpers.resume` verifies them (both taught in notebook 08). Hashing streams
each file in 1 MiB chunks, so memory stays flat whatever the checkpoint's size; the cost is one
read of every file (about 1 GB/s of SHA-256 on one core, measured by scripts/bench_checksums.py).
The training rows get one too (`rows_sha256`), which `helpers.runs` compares to tell one run's data
from another's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

__all__ = ["CHUNK_BYTES", "file_checksums", "rows_sha256", "sha256_file"]

CHUNK_BYTES = 2**20  # bytes read at a time


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file's content as hex, read in `CHUNK_BYTES` chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(folder: str | Path, *, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """{path relative to `folder`: {"bytes": size, "sha256": hex}} for every file under it.

    Leaves out the names in `skip` (the manifest itself) and temporary `*.tmp` files. Every
    data-parallel process's RNG state is included: `ManifestCallback` waits for all of them first.
    """
    folder = Path(folder)
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name in skip or name.endswith(".tmp"):
            continue
        found[name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return found


def rows_sha256(dataset) -> str | None:
    """The SHA-256 of a dataset's rows (every column, as JSON), or None for one without a length (a stream).

    By content, because datasets' own `_fingerprint` is not: for a file read with `load_dataset` it
    changes with the file's modification time and the cache folder, so a fresh Colab runtime, which
    installs the kit again, would give the same rows another one. A datasets.Dataset is read in
    batches of 1,024 rows (the course's 333 in milliseconds; a 50,000-row set of 512 tokens in seconds).
    """
    if not hasattr(dataset, "__len__"):
        return None
    digest = hashlib.sha256()
    if hasattr(dataset, "with_format") and hasattr(dataset, "iter"):  # a datasets.Dataset: as Python lists
        batches = dataset.with_format(None).iter(batch_size=1024)
    else:  # a list of rows, a torch Dataset
        batches = ([dataset[i]] for i in range(len(dataset)))
    for batch in batches:
        digest.update(json.dumps(batch, sort_keys=True, default=_as_list).encode())
    return digest.hexdigest()


def _as_list(value):
    """A tensor or an array as a list, for JSON; anything else by its text."""
    return value.tolist() if hasattr(value, "tolist") else str(value)
