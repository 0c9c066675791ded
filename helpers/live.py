"""The live readout while a Trainer trains: step, loss and memory in one output area.

Taught in notebooks 03 (gradient checkpointing) and 08 (capstone): `LiveMemoryCallback` refreshes
one line every few steps, against the card's capacity, and leaves `callback.summary` for
`helpers.record`. The measured readouts of a block of code are `helpers.memory`.

`LiveMemoryCallback` subclasses transformers' TrainerCallback, built on first use
(`helpers._callbacks.lazy_callbacks`), so importing this module is cheap: torch, transformers,
psutil and IPython load when a callback is made or trains.
"""

from __future__ import annotations

import multiprocessing
import time

from helpers._callbacks import lazy_callbacks
from helpers._probes import read_peak_rss, reset_peak_rss
from helpers._util import GIB, MIB, ipython_shell

__all__ = ["LiveMemoryCallback"]  # noqa: F822 (built on first use by __getattr__ below)


# LiveMemoryCallback is this class plus transformers.TrainerCallback, put together on first use
# (see __getattr__ below) so that importing helpers.live does not import transformers.
class _LiveReadout:
    """Show step, loss and memory in one output area while a Trainer trains.

    Every `every_n_steps` steps one line is refreshed in place: step / max steps, the last logged
    loss, current and peak memory against the card's capacity (torch.cuda allocated, peak and
    reserved on a GPU; the process RSS against total RAM on CPU, and it says which), and seconds
    per step. When training ends a summary line follows and `callback.summary` holds the same
    figures for `helpers.record`. In a notebook (Colab, Kaggle, JupyterLab) the line is a
    text/plain display updated through its display id, so it needs no widgets; headless it prints
    one plain line per update. Only the main process shows anything (data parallel runs).

    It reads counters only (no synchronize, no NVML), so it costs far below 2 % of a step
    (scripts/bench_live_readout.py measures it). The peak counters are reset when training begins.
    The loss is the last one the Trainer logged: set `logging_steps` to `every_n_steps` to see a
    fresh one on every update. Taught in notebooks 03 (gradient checkpointing) and 08 (capstone).

    Args:
        every_n_steps: refresh every this many optimizer steps.
        output: "auto" (a display in a notebook, lines otherwise), "notebook" or "text".

    Example:
        >>> trainer = Trainer(model=model, args=args, train_dataset=data,
        ...                   callbacks=[LiveMemoryCallback(every_n_steps=10)])  # doctest: +SKIP
        >>> trainer.train()  # doctest: +SKIP
        step 10/100 | loss 3.2107 (step 10) | cuda:0 1.10 GiB allocated, peak 2.31 GiB (peak reserved ...
    """

    def __init__(self, every_n_steps: int = 10, *, output: str = "auto"):
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an int >= 1, got {every_n_steps!r}; e.g. LiveMemoryCallback(10)")
        if output not in ("auto", "notebook", "text"):
            raise ValueError(f"output must be 'auto', 'notebook' or 'text', got {output!r}")
        self.every_n_steps = every_n_steps
        self.output = output
        self.summary: dict = {}  # filled at the end of training, ready for helpers.record
        # set again by on_train_begin; here so that a log before any training (trainer.evaluate()) finds them
        self._pending, self._loss, self._train_loss = False, None, None
        self._notebook, self._handle, self._line = False, None, ""

    def on_train_begin(self, args, state, control, **kwargs):
        self._meter = _Meter(str(args.device))
        self._notebook = self.output == "notebook" or (self.output == "auto" and _in_notebook())
        self._handle = None
        self._line = ""
        self._loss = self._train_loss = None
        self._pending = False
        self._first_step = state.global_step  # not 0 when resuming from a checkpoint
        self._start = time.perf_counter()
        self.summary = {}

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every_n_steps or not state.is_world_process_zero:
            return
        if control.should_log:  # the Trainer logs this step's loss next: show the line then
            self._pending = True
        else:
            self._show_status(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self._loss = (float(logs["loss"]), state.global_step)
        if "train_loss" in logs:  # the Trainer's last log: mean loss over the run
            self._train_loss = float(logs["train_loss"])
        if self._pending and state.is_world_process_zero:
            self._pending = False
            self._show_status(state)

    def on_train_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if self._pending:  # a log the Trainer skipped: show the step without it
            self._show_status(state)
        steps = state.global_step - self._first_step
        seconds = time.perf_counter() - self._start
        _, peak, reserved = self._meter.read()
        self.summary = {
            "steps": steps,
            "seconds": seconds,
            "seconds_per_step": seconds / steps if steps else None,
            "loss": self._loss[0] if self._loss else None,
            "train_loss": self._train_loss,
            "device": self._meter.device,
            "peak_bytes": peak,
            "capacity_bytes": self._meter.capacity,
        }
        losses = ([f"last loss {self._loss[0]:.4f}"] if self._loss else []) + (
            [f"mean loss {self._train_loss:.4f}"] if self._train_loss is not None else []
        )
        loss = "".join(", " + text for text in losses)
        per_step = f" ({seconds / steps:.3f} s/step)" if steps else ""
        text = (
            f"done: {steps} steps in {seconds:.1f} s{per_step}{loss}, peak {self._meter.describe_peak(peak, reserved)}"
        )
        self._show(f"{self._line}\n{text}" if self._notebook and self._line else text)

    def _show_status(self, state):
        current, peak, reserved = self._meter.read()
        done = state.global_step - self._first_step
        per_step = (time.perf_counter() - self._start) / done if done else 0.0
        loss = f"loss {self._loss[0]:.4f} (step {self._loss[1]})" if self._loss else "loss -"
        self._line = (
            f"step {state.global_step}/{state.max_steps} | {loss} | "
            f"{self._meter.describe(current, peak, reserved)} | {per_step:.3f} s/step"
        )
        self._show(self._line)

    def _show(self, text: str):
        if not self._notebook:
            print(text, flush=True)
            return
        from IPython import display

        bundle = {"text/plain": text}  # plain text: renders in Colab, Kaggle, JupyterLab, no widgets
        if self._handle is None:
            self._handle = display.display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)


class _Meter:
    """Current and peak memory of one device, read from counters only (no synchronize, no NVML)."""

    def __init__(self, device: str):
        import torch

        if device.startswith("cuda") and torch.cuda.is_available():
            self.device = f"cuda:{torch.device(device).index or 0}"
            self.capacity = torch.cuda.get_device_properties(self.device).total_memory  # bytes
            torch.cuda.reset_peak_memory_stats(self.device)  # peak = peak of this training run
        else:
            import psutil

            self.device = "cpu"
            self.capacity = psutil.virtual_memory().total  # bytes of RAM
            self._process = psutil.Process()
            self._exact_peak = reset_peak_rss()
            self._peak = 0

    def read(self) -> tuple[int, int, int | None]:
        """(current, peak, peak reserved) in bytes; reserved is None on CPU."""
        if self.device != "cpu":
            import torch

            return (
                torch.cuda.memory_allocated(self.device),
                torch.cuda.max_memory_allocated(self.device),
                torch.cuda.max_memory_reserved(self.device),
            )
        rss = self._process.memory_info().rss
        self._peak = max(self._peak, rss, (read_peak_rss() or 0) if self._exact_peak else 0)
        return rss, self._peak, None

    def describe(self, current: int, peak: int, reserved: int | None) -> str:
        if reserved is None:
            return (
                f"RSS {_human(current)}, peak {_human(peak)} "
                f"= {peak / self.capacity:.0%} of {_human(self.capacity)} RAM"
            )
        return (
            f"{self.device} {_human(current)} allocated, peak {_human(peak)} "
            f"(peak reserved {_human(reserved)} = {reserved / self.capacity:.0%} of {_human(self.capacity)})"
        )

    def describe_peak(self, peak: int, reserved: int | None) -> str:
        if reserved is None:
            return f"RSS {_human(peak)} = {peak / self.capacity:.0%} of {_human(self.capacity)} RAM"
        return (
            f"{self.device} {_human(peak)} allocated, {_human(reserved)} reserved "
            f"= {reserved / self.capacity:.0%} of {_human(self.capacity)}"
        )


def _human(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def _in_notebook() -> bool:
    """True inside a Jupyter kernel's own process (Colab, Kaggle, JupyterLab, papermill)."""
    if multiprocessing.parent_process() is not None:
        return False  # a worker started by notebook_launcher / DataLoader
    shell = ipython_shell()  # None where IPython is not loaded
    return shell is not None and getattr(shell, "kernel", None) is not None


# LiveMemoryCallback subclasses TrainerCallback: built, importing transformers, on first use
__getattr__, __dir__ = lazy_callbacks(globals(), LiveMemoryCallback=_LiveReadout)
