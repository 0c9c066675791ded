"""What autograd saves for backward: the activations, counted exactly.

Taught in notebook 01 (memory anatomy; used again in 02 and 03): `track_saved_tensors(*models)`
counts the bytes of every tensor autograd keeps for the backward pass, each storage once,
parameters excluded. That is the definition of "activations" the estimator (`helpers.estimate`)
predicts, the activations line of `helpers.memory.measure`, and what the pretend card of
`helpers.oom.activation_budget` limits (through the same hooks).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["SavedTensors", "track_saved_tensors"]


@dataclass
class SavedTensors:
    """What autograd kept for backward during a `track_saved_tensors` block."""

    bytes: int = 0  # each storage once, parameters excluded
    count: int = 0  # distinct storages
    by_dtype: dict = field(default_factory=dict)  # dtype name -> bytes
    peak_bytes: int = 0  # most bytes held for backward at one moment (equals `bytes` for one forward)


class _Held:
    """A saved tensor as the graph holds it; tells the tracker when the graph lets go of it."""

    __slots__ = ("tensor", "_release")

    def __init__(self, tensor, release):
        self.tensor, self._release = tensor, release

    def __del__(self):  # the graph was freed (after backward) or dropped
        self._release()


class _SavedTensorCounter:
    """The saved-tensor hooks behind `track_saved_tensors` and `helpers.oom.activation_budget`.

    Counts each storage autograd saves once (a view adds nothing), skips the models' parameters,
    and follows what the graph holds now (given back when the graph lets go), so `peak_bytes` is
    the most held at one moment. `admit(live, size)`, when given, is called before the graph takes
    a storage it does not hold yet, with the bytes it holds now and the new storage's bytes: it may
    raise (an activation budget's out-of-memory error), and then nothing is counted.
    """

    def __init__(self, models, admit=None):
        # a sharded parameter (FSDP2's DTensor) by the shard this process holds; its gathered copy counts as saved
        local = (p.to_local() if hasattr(p, "to_local") else p for m in models for p in m.parameters())
        self.params = {p.untyped_storage().data_ptr() for p in local}
        self.admit = admit
        self.seen: set[int] = set()
        self.held: dict[int, list[int]] = {}  # storage address -> [saved references alive, bytes]
        self.live = 0  # bytes the graph holds now
        self.saved = SavedTensors()

    def pack(self, t):
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if key in self.params:
            return t
        if key not in self.held:  # first reference the graph holds to this storage
            if self.admit is not None:
                self.admit(self.live, size)
            self.held[key] = [0, size]
            self.live += size
            self.saved.peak_bytes = max(self.saved.peak_bytes, self.live)
        if key not in self.seen:
            self.seen.add(key)
            self.saved.bytes += size
            self.saved.count += 1
            name = str(t.dtype).removeprefix("torch.")
            self.saved.by_dtype[name] = self.saved.by_dtype.get(name, 0) + size
        self.held[key][0] += 1
        # a detached alias, not the tensor: the tensor would close a cycle (output -> grad_fn ->
        # saved -> output) that only a backward pass breaks, so a failed step would never be freed
        return _Held(t.detach(), lambda: self._release(key))

    def unpack(self, h):
        return h.tensor if isinstance(h, _Held) else h

    def _release(self, key):
        entry = self.held[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.held[key]


@contextmanager
def track_saved_tensors(*models, admit=None):
    """Count the bytes autograd saves for backward inside the block: the activations.

    Every tensor an op saves for its backward pass goes through a saved-tensor hook; this counts
    each underlying storage once (a view of a counted tensor adds nothing) and skips the storages
    of the given models' parameters, which are weights, not activations. On CPU this is exact, and
    it is the definition the estimator (`helpers.estimate`) predicts. Taught in notebook 01.

    `bytes` adds up everything saved in the block; `peak_bytes` is the most the graph held at one
    moment, which is what a block of several training steps needs (each backward frees its graph).

    Args:
        models: the modules whose parameters are not to be counted.
        admit: called as `admit(bytes_held_now, new_storage_bytes)` before the graph takes a storage
            it does not hold yet; it may raise, and then nothing is counted
            (`helpers.oom.activation_budget` raises a simulated out-of-memory error).

    Returns:
        a `SavedTensors`, filled as the block runs.

    Example:
        >>> with track_saved_tensors(model) as saved:  # doctest: +SKIP
        ...     loss = model(**batch).loss
        >>> saved.bytes  # doctest: +SKIP
    """
    import torch

    counter = _SavedTensorCounter(models, admit)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        yield counter.saved
