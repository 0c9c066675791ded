"""A checkpoint's files checked whole without loading a tensor: what `helpers.resume` reads of each file.

Private to `helpers.resume` (taught in notebook 08). A process killed while the Trainer saves leaves
files cut off at any byte: a safetensors file shorter than its header promises, a torch zip archive
without its directory (written last), a sharded index naming a shard that is missing. Each check
reads headers and sizes only and returns one sentence per problem, never raising for a bad file.
"""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

__all__ = ["check_torch_file", "check_weights"]


def check_weights(path: Path) -> list[str]:
    """What is wrong with a weights file (safetensors, a sharded model's index and its shards, or torch's)."""
    if path.name.endswith(".index.json"):  # a sharded model: check the index, then every shard it names
        return _index(path)
    if path.suffix == ".safetensors":
        return _safetensors(path)
    return check_torch_file(path)


def _index(path: Path) -> list[str]:
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        return [f"{path.name} does not parse ({e.__class__.__name__})"]
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return [f"{path.name} has a weight_map that is not a table of tensor names to shard files"]
    problems = []
    for shard in sorted(set(weight_map.values())):
        shard_path = path.parent / shard
        if Path(shard).is_absolute() or ".." in Path(shard).parts:
            problems.append(f"{path.name} names a shard outside the checkpoint: {shard}")
        elif not shard_path.is_file():
            problems.append(f"shard {shard} named in {path.name} is missing")
        else:
            problems += _safetensors(shard_path)
    return problems


def _safetensors(path: Path) -> list[str]:
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
    ends = _data_ends(header)
    if ends is None:
        return [f"{path.name} has a header that is not a table of tensors with data offsets (overwritten?)"]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        return [f"{path.name} is truncated: {size:,} of {expected:,} bytes"]
    if size > expected:
        return [f"{path.name} has {size - expected:,} bytes more than its header describes (written over?)"]
    return []


def _data_ends(header) -> list[int] | None:
    """Each tensor's end offset from a safetensors header; None when the header is not well formed."""
    if not isinstance(header, dict):
        return None
    ends = []
    for key, tensor in header.items():
        if key == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return None
        if not 0 <= offsets[0] <= offsets[1]:
            return None
        ends.append(offsets[1])
    return ends


def check_torch_file(path: Path) -> list[str]:
    """torch.save writes a zip archive whose directory comes last: a cut-off file has none."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except zipfile.BadZipFile:
        return [f"{path.name} is not a complete torch file ({path.stat().st_size:,} bytes; cut off while saving?)"]
    return []
