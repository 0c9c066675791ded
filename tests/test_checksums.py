"""helpers._checksums: the SHA-256 of a checkpoint's files, streamed, and what it costs.

The digests are compared against hashlib over the whole file at once (the reference), and a
large file is checked to be read once, in chunks. The throughput (the figure quoted in
helpers/resume.py) is a machine's speed, not a property of the code: `python scripts/bench_checksums.py`
measures and prints it.
"""

import hashlib
import os

from helpers import _checksums
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


def test_a_checkpoint_sized_file_is_read_once_in_chunks_and_hashed_as_hashlib(tmp_path, monkeypatch):
    # the throughput this test once asserted (> 50 MiB/s) is printed by scripts/bench_checksums.py
    size = 64 * 2**20 + 17  # bytes: many chunks and a short last one
    data = os.urandom(size)
    (tmp_path / "big").write_bytes(data)
    reads = []

    class Counted:
        """The file sha256_file opens, recording the size asked for and the bytes returned by each read."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            chunk = self.f.read(n)
            reads.append((n, len(chunk)))
            return chunk

    monkeypatch.setattr(_checksums, "open", lambda *a, **k: Counted(open(*a, **k)), raising=False)
    assert sha256_file(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    assert sum(got for _, got in reads) == size, "one read of the file, no more"
    assert all(0 < asked <= CHUNK_BYTES for asked, _ in reads), "streamed: memory stays flat whatever the size"
