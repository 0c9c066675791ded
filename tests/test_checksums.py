"""helpers._checksums: the SHA-256 of a checkpoint's files, streamed, and what it costs.

The digests are compared against hashlib over the whole file at once (the reference); the
throughput is measured on a 256 MiB file and printed, the figure quoted in helpers/resume.py.
"""

import hashlib
import os
import time

from helpers._checksums import CHUNK_BYTES, file_checksums, sha256_file


def test_streamed_digest_equals_the_whole_file_digest(tmp_path):
    for size in (0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, 3 * CHUNK_BYTES + 17):
        data = os.urandom(size)
        (tmp_path / "f").write_bytes(data)
        assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest(), size


def test_every_file_but_the_manifest_and_temporaries(tmp_path):
    names = ("model.safetensors", "optimizer.pt", "rng_state.pth", "rng_state_1.pth", "sub/extra.json")
    for name in names:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    for name in ("run_manifest.json", "run_manifest.json.tmp"):
        (tmp_path / name).write_bytes(b"left out")
    found = file_checksums(tmp_path, skip=("run_manifest.json",))
    assert sorted(found) == sorted(names), "every rank's RNG state is hashed: the callback waits for them all"
    assert found["optimizer.pt"] == {"bytes": 12, "sha256": hashlib.sha256(b"optimizer.pt").hexdigest()}


def test_hashing_throughput(tmp_path):
    size = 256 * 2**20  # bytes: about half a 7B LoRA checkpoint (adapter + AdamW states)
    with open(tmp_path / "big", "wb") as f:
        for _ in range(size // CHUNK_BYTES):
            f.write(os.urandom(CHUNK_BYTES))
    sha256_file(tmp_path / "big")  # once to bring it into the page cache, as a just-saved checkpoint is
    start = time.perf_counter()
    sha256_file(tmp_path / "big")
    rate = size / 2**20 / (time.perf_counter() - start)
    print(f"\nSHA-256 of a checkpoint file: {rate:,.0f} MiB/s on one core")
    assert rate > 50  # MiB/s: far below any machine's, so only a broken implementation fails
