"""Out-of-memory errors: recognise one, go on without a restart, fit the batch, play a smaller card.

Which notebook teaches what:

- `is_oom_error(exc)` and `free_memory(...)`: notebooks 03 and 08, going on after a CUDA
  out-of-memory error without restarting the runtime;
- `fit_batch(train, args)`: notebook 04, halving the per-device batch and doubling accumulation
  after an out-of-memory error, so the effective batch stays what you chose;
- `activation_budget(max_bytes, model)`: notebooks 03 and 04, a pretend card that raises the same
  error once autograd holds more activations than it has room for (counted as
  `helpers.saved_tensors.track_saved_tensors` counts them).

Importing this module is cheap: torch and transformers load when a function needs them.
"""

from __future__ import annotations

import gc
import inspect
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

from helpers._settings import effective_batch, settings
from helpers._util import MIB, ipython_shell
from helpers.saved_tensors import track_saved_tensors

__all__ = ["BatchFitError", "Fitted", "activation_budget", "fit_batch", "free_memory", "is_oom_error"]


# ---------------------------------------------------------------------------------------------
# going on after an out-of-memory error

_OOM_MESSAGES = (
    "out of memory",  # CUDA, HIP, XPU: "CUDA out of memory. Tried to allocate ..."; MPS
    "cublas_status_alloc_failed",  # cuBLAS could not get its workspace
    "cudnn_status_alloc_failed",
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
)


def is_oom_error(exc: BaseException) -> bool:
    """Say whether `exc` (or an exception it was raised from) is an out-of-memory error.

    Recognises torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) and the RuntimeErrors that
    report the same in words: "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
    "DefaultCPUAllocator: can't allocate memory". Taught in notebooks 03 and 08.

    Args:
        exc: the exception caught.

    Returns:
        True when retrying with less memory (smaller batch, checkpointing) is the fix.

    Example:
        >>> try:  # doctest: +SKIP
        ...     trainer.train()
        ... except Exception as e:
        ...     if not is_oom_error(e):
        ...         raise
        ...     trainer, model = free_memory(trainer, model)
    """
    torch = sys.modules.get("torch")
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if torch is not None and isinstance(exc, torch.OutOfMemoryError):
            return True
        if isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def free_memory(*objects) -> list[None]:
    """Free the memory an out-of-memory error left behind, so the notebook goes on without a restart.

    After an error in a notebook cell, Python keeps the traceback (sys.last_traceback, IPython's
    last result), and the traceback keeps every frame the error passed through, and the frames
    keep their local variables: the activations of the forward pass that failed. That, not the
    GPU, is why a notebook "needs a restart" after a CUDA out-of-memory error. This clears the
    local variables of the frames of that error (and of the one being handled, and of any
    exception passed in), drops the passed objects from IPython's output cache (`Out`, `_`,
    `_12`: a cell that showed `model` keeps it), runs the garbage collector and returns
    torch.cuda's cached blocks to the driver. Post-mortem debugging (%debug) of that error is
    no longer possible afterwards. Taught in notebooks 03 and 08.

    Python cannot delete the caller's variables: reassign them from the list returned, as with
    accelerate's `release_memory`.

    Args:
        objects: what to let go of (the trainer, the model, an optimizer, a batch, an exception).

    Returns:
        a list of None, one per object, to assign back.

    Example:
        >>> trainer.train()  # doctest: +SKIP
        OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB ...
        >>> # the next cell, no restart: let go, then build again with a smaller batch
        >>> trainer, model = free_memory(trainer, model)  # doctest: +SKIP
    """
    objects = list(objects)
    n = len(objects)
    shell = ipython_shell()
    errors = [getattr(sys, "last_value", None), getattr(sys, "last_exc", None), sys.exc_info()[1]]
    if shell is not None:
        errors.append(getattr(getattr(shell, "last_execution_result", None), "error_in_exec", None))
        _drop_from_output_cache(shell, objects)
    errors += [o for o in objects if isinstance(o, BaseException)]
    for exc in errors:
        _clear_frames(exc)
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    del errors, objects  # this function's own references go before collecting
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # hand cached blocks back to the driver (nvidia-smi shows it)
    return [None] * n


def _clear_frames(exc):
    """Drop the local variables of every finished frame in `exc`'s traceback and its chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            try:
                frame.clear()
            except RuntimeError:  # a frame still running (the caller's own) keeps its variables
                pass
            else:
                if frame.f_code.co_flags & inspect.CO_OPTIMIZED:  # a function's frame, not a module's
                    # a traceback printer that read frame.f_locals left a dict copy of the locals on
                    # the frame (Python < 3.13), which clear() keeps; reading it again re-syncs it
                    # with the now empty frame and empties it
                    frame.f_locals  # noqa: B018
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def _drop_from_output_cache(shell, objects):
    """Remove `objects` from IPython's output history: Out[n], _n, _, __ and ___."""
    if not objects:
        return
    ids = {id(o) for o in objects if o is not None}
    out = shell.user_ns.get("_oh")  # the dict `Out` names
    if isinstance(out, dict):
        for key in [k for k, v in out.items() if id(v) in ids]:
            del out[key]
    for ns in (shell.user_ns, getattr(shell, "user_ns_hidden", {})):
        for key in [k for k, v in ns.items() if id(v) in ids and k.startswith("_") and k.strip("_").isdigit()]:
            del ns[key]
        for key in ("_", "__", "___"):
            if id(ns.get(key)) in ids:
                ns[key] = ""
    hook = getattr(shell, "displayhook", None)
    for attr in ("_", "__", "___"):
        if id(getattr(hook, attr, None)) in ids:
            setattr(hook, attr, "")
    last = getattr(shell, "last_execution_result", None)  # the previous cell's value
    if id(getattr(last, "result", None)) in ids:
        last.result = None


# ---------------------------------------------------------------------------------------------
# auto-fit after an out-of-memory error


class BatchFitError(RuntimeError):
    """Out of memory even at a per-device batch of 1; the message lists what to try next."""


@dataclass
class Fitted:
    """What `fit_batch` ran: the result of `train`, the arguments that fit, every (batch, accumulation) tried."""

    result: object
    args: object
    tried: list[tuple[int, int]] = field(default_factory=list)


def fit_batch(train, args, *, num_devices: int | None = None) -> Fitted:
    """Run `train(args)`; after an out-of-memory error, halve the batch, double accumulation, retry.

    The per-device batch halves (an odd one drops to its largest proper divisor) and gradient
    accumulation grows by the same factor, so the effective batch, and with it the learning rate
    that suits it, stays what you chose. transformers' own `auto_find_batch_size=True` only
    shrinks the batch (accelerate multiplies it by 0.9) and leaves accumulation alone, so the
    effective batch drops without a word. Each retry is printed. Other errors pass through.

    `train` should start from scratch each time (build the Trainer inside it): an out-of-memory
    error usually comes in the first step, before anything was learned. Taught in notebook 04.

    Args:
        train: a function of one argument, the arguments to run with (e.g.
            `lambda a: Trainer(model, a, train_dataset=data).train()`).
        args: TrainingArguments, or a dict with `per_device_train_batch_size` (and
            `gradient_accumulation_steps`) for a hand-written loop.
        num_devices: for the printed effective batch (default: as `effective_batch_size`).

    Returns:
        a `Fitted`: `result` (what `train` returned), `args` (the arguments that ran), `tried`.

    Raises:
        BatchFitError: out of memory even at a per-device batch of 1; it says what to try next.

    Example:
        >>> fitted = fit_batch(lambda a: Trainer(model, a, train_dataset=data).train(), args)  # doctest: +SKIP
        out of memory at per_device_batch 8 x grad_accum_steps 2: retrying with 4 x 4 (effective batch 16 kept)
    """
    current, tried = args, []
    while True:
        s = settings(current)
        b, k = s["per_device_train_batch_size"], s["gradient_accumulation_steps"]
        tried.append((b, k))
        try:
            result = train(current)
        except Exception as e:  # anything but an out-of-memory error is re-raised below
            if not is_oom_error(e):
                raise
            free_memory(e)  # drop the failed attempt's activations, held by the traceback's frames
            if b == 1:
                raise BatchFitError(_no_fit_message(s, tried, current, num_devices)) from e
            smaller = _next_batch(b)
            factor = b // smaller
            print(
                f"out of memory at per_device_batch {b} x grad_accum_steps {k}: retrying with {smaller} x "
                f"{k * factor} (effective batch {effective_batch(current, num_devices)} kept)"
            )
            current = _replace(current, per_device_train_batch_size=smaller, gradient_accumulation_steps=k * factor)
            continue
        if len(tried) > 1:
            print(
                f"fits at per_device_batch {b} x grad_accum_steps {k}: effective batch "
                f"{effective_batch(current, num_devices)}, as asked"
            )
        return Fitted(result, current, tried)


def _next_batch(b: int) -> int:
    """Half of b when b is even; otherwise b's largest proper divisor (1 for a prime)."""
    if b % 2 == 0:
        return b // 2
    return max(d for d in range(1, b // 2 + 1) if b % d == 0)


def _replace(args, **changes):
    if isinstance(args, dict):
        return {**args, **changes}
    import dataclasses

    return dataclasses.replace(args, **changes)


def _no_fit_message(s: dict, tried, args, num_devices) -> str:
    steps = ", ".join(f"{b} x {k}" for b, k in tried)
    options = []
    if not s["activation_checkpointing"]:
        options.append("activation_checkpointing=True (recompute activations in the backward pass; notebook 03)")
    options += [
        "a shorter seq_len (activations grow with it)",
        "optim='paged_adamw_8bit' (8-bit optimizer states, bitsandbytes)",
        "LoRA or QLoRA instead of a full fine-tune (notebook 05)",
    ]
    return (
        f"out of memory even at per_device_batch 1 (tried per_device_batch x grad_accum_steps: {steps}; "
        f"effective batch {effective_batch(args, num_devices)}). The batch is not the problem any more; "
        "next, in order of cost: " + "; ".join(options) + ". helpers.plan.plan(...) predicts which one fits."
    )


# ---------------------------------------------------------------------------------------------
# a pretend card: an out-of-memory error past a budget of activations


@contextmanager
def activation_budget(max_bytes: int, *models):
    """Act as a card with room for `max_bytes` of activations: raise an out-of-memory error past it.

    A stand-in for a GPU that fills up, for notebooks and tests on a CPU, where a real
    out-of-memory error cannot be produced safely. Inside the block, every tensor autograd saves
    for backward is counted by the hooks of `helpers.saved_tensors.track_saved_tensors` (each storage
    once, the models' parameters excluded, given back when the graph is freed); the save that
    would pass `max_bytes` raises `torch.OutOfMemoryError`, which `is_oom_error` and `fit_batch`
    recognize like the real one. Tensors saved inside a checkpointed layer never reach it, exactly
    as they never take the card's memory until the backward pass recomputes them. Taught in
    notebooks 03 and 04.

    Args:
        max_bytes: the activation bytes the pretend card holds (what is left after weights,
            gradients and optimizer states).
        models: whose parameters are weights, not activations.

    Example:
        >>> with activation_budget(8 * 1024**2, model):  # doctest: +SKIP
        ...     model(**batch).loss.backward()  # torch.OutOfMemoryError past 8 MiB of activations
    """
    import torch

    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")

    def admit(live, size):  # called before the graph takes a storage it does not hold yet
        if live + size > max_bytes:
            raise torch.OutOfMemoryError(
                f"simulated out of memory: activations would take {(live + size) / MIB:.2f} MiB, "
                f"the budget is {max_bytes / MIB:.2f} MiB (helpers.oom.activation_budget)"
            )

    with track_saved_tensors(*models, admit=admit):
        yield
