"""How fast does the kit hash a checkpoint? The SHA-256 throughput of `helpers._checksums.sha256_file`.

ManifestCallback hashes every file of a checkpoint when it is saved, and `helpers.resume` hashes
them again before a resume; the cost is one read of each file. This writes a file of random bytes
(default 256 MiB: about half a 7B LoRA checkpoint, adapter + AdamW states), hashes it once to bring
it into the page cache (as a just-saved checkpoint is), then hashes it `--repeats` times and prints:

- streamed: `sha256_file` on the file, in MiB/s on one core (the median and the best run), the
  figure quoted in helpers/_checksums.py and helpers/resume.py (about 1 GB/s);
- in memory: hashlib over the same bytes already in memory, the ceiling the streaming can reach.

Each streamed digest is checked against the in-memory one. Exit status 1 below 50 MiB/s (far
below any machine's: only a broken implementation misses it) or on a digest that differs.

    python scripts/bench_checksums.py                # 256 MiB, 5 repeats: a few seconds
    python scripts/bench_checksums.py --mib 1024 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers._checksums import CHUNK_BYTES, sha256_file  # noqa: E402

MIB = 2**20
FLOOR_MIB_S = 50  # MiB/s: the floor tests/test_checksums.py asserted before the figure moved here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="size of the file to hash, in MiB (default 256)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs after the warm-up (default 5)")
    args = parser.parse_args(argv)
    size = args.mib * MIB
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.bin"
        with open(path, "wb") as f:
            for _ in range(size // CHUNK_BYTES):
                f.write(os.urandom(CHUNK_BYTES))
        data = path.read_bytes()
        start = time.perf_counter()
        expected = hashlib.sha256(data).hexdigest()
        in_memory = size / MIB / (time.perf_counter() - start)
        del data
        sha256_file(path)  # once to bring it into the page cache, as a just-saved checkpoint is
        rates, digests = [], set()
        for _ in range(args.repeats):
            start = time.perf_counter()
            digests.add(sha256_file(path))
            rates.append(size / MIB / (time.perf_counter() - start))
    median = statistics.median(rates)
    print(
        f"SHA-256 of a {args.mib} MiB checkpoint file, on one core: {median:,.0f} MiB/s streamed "
        f"(median of {args.repeats}; best {max(rates):,.0f}), {in_memory:,.0f} MiB/s in memory"
    )
    if digests != {expected}:
        print("the streamed digest differs from hashlib's over the same bytes")
        return 1
    if median < FLOOR_MIB_S:
        print(f"below the floor of {FLOOR_MIB_S} MiB/s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
