"""SHA-256 checksums of a checkpoint's files: recorded when it is saved, compared when it is resumed.

Private to the package: `helpers.manifest.ManifestCallback` records them in each checkpoint's
run_manifest.json, `helpers.resume` verifies them (both taught in notebook 08). Hashing streams
each file in 1 MiB chunks, so memory stays flat whatever the checkpoint's size; the cost is one
read of every file (about 1 GB/s of SHA-256 on one core, measured by scripts/bench_checksums.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["CHUNK_BYTES", "file_checksums", "sha256_file"]

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
