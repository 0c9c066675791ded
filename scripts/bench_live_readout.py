"""How much does LiveMemoryCallback slow a training step? It must stay under 2 %.

Trains the embedded tiny model with the real transformers Trainer on CPU, without the callback,
with it at its default (a refresh every 10 steps) and with a refresh on every step (the worst
case), alternating the three a few times so drift in the machine's speed hits all of them alike.
Two figures come out:

- overhead: the median step time with the callback against without. A step's time is the time
  between two consecutive `on_step_begin` calls, so it includes every callback's `on_step_end`
  and the logging; the first steps of each run are warm-up and dropped. Other processes on the
  machine add noise of several percent either way, so on a busy machine it can even read negative.
- in callback: the time spent inside the callback's own methods per step, against the median
  step. No other process can inflate it much; it is the figure to hold against the 2 % budget.

The callback's lines go to a string buffer, not the terminal, so the terminal's speed is not in
the figures (in a real Jupyter kernel one display update and one print each took about 0.2 ms,
once every 10 steps). The tiny model's steps are short (tens of ms), so this is a pessimistic
bound: on a GPU a step takes longer and the callback's cost stays the same.

    python scripts/bench_live_readout.py            # about a minute on 2 CPU cores
    python scripts/bench_live_readout.py --steps 100 --repeats 7
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time

WARMUP_STEPS = 5  # dropped from each run: first batches, allocator warm-up


def make_dataset(tokenizer, rows: int, seq_len: int):
    from helpers.data import load_course_data

    data = load_course_data().select(range(rows))

    def tokenize(batch):
        text = [f"{i}\n{r}" for i, r in zip(batch["instruction"], batch["response"])]
        out = tokenizer(text, truncation=True, max_length=seq_len, padding="max_length")
        out["labels"] = [list(ids) for ids in out["input_ids"]]
        return out

    return data.map(tokenize, batched=True, remove_columns=data.column_names)


def run(dataset, *, steps: int, batch: int, every_n_steps: int | None) -> list[float]:
    """Train `steps` steps; return the seconds of each step after the warm-up, and the seconds
    spent inside the callback per step (timed around its own methods)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from helpers.live import LiveMemoryCallback
    from helpers.models import load_model
    from helpers.seeds import seed_everything

    class StepClock(TrainerCallback):
        def __init__(self):
            self.starts = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.starts.append(time.perf_counter())

    class TimedLive(LiveMemoryCallback):
        """The callback, adding up the time spent in it."""

        seconds = 0.0

        def on_step_end(self, *args, **kwargs):
            start = time.perf_counter()
            super().on_step_end(*args, **kwargs)
            self.seconds += time.perf_counter() - start

        def on_log(self, *args, **kwargs):
            start = time.perf_counter()
            super().on_log(*args, **kwargs)
            self.seconds += time.perf_counter() - start

    seed_everything(42)
    model, _ = load_model("embedded")
    clock = StepClock()
    live = TimedLive(every_n_steps, output="text") if every_n_steps else None
    callbacks = [clock] + ([live] if live else [])
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            out,
            max_steps=steps + 1,
            per_device_train_batch_size=batch,
            learning_rate=1e-3,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            seed=42,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
    step_times = [b - a for a, b in zip(clock.starts, clock.starts[1:])][WARMUP_STEPS:]
    return step_times, (live.seconds / trainer.state.global_step if live else 0.0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each configuration, alternated")
    parser.add_argument("--batch", type=int, default=8, help="per-device batch size")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per row")
    parser.add_argument("--rows", type=int, default=256, help="dataset rows to tokenize")
    opts = parser.parse_args(argv)

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    from helpers.models import load_model

    _, tokenizer = load_model("embedded")
    dataset = make_dataset(tokenizer, opts.rows, opts.seq_len)
    configs = {"without the callback": None, "every 10 steps (default)": 10, "every step (worst case)": 1}
    times: dict[str, list[float]] = {name: [] for name in configs}
    inside: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for repeat in range(opts.repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:  # rotate the order
            step_times, callback_s = run(dataset, steps=opts.steps, batch=opts.batch, every_n_steps=configs[name])
            times[name] += step_times
            inside[name].append(callback_s)

    base = statistics.median(times[names[0]])
    print(
        f"embedded model, batch {opts.batch} x {opts.seq_len} tokens, CPU, {opts.repeats} runs x "
        f"{opts.steps - WARMUP_STEPS} timed steps per configuration"
    )
    print(f"  {'':<26} {'s/step':>9}  {'overhead':>9}  {'in callback':>18}")
    for name in names:
        median = statistics.median(times[name])
        own = statistics.median(inside[name])  # seconds per step spent inside the callback
        print(
            f"  {name:<26} {median:9.4f}  {100 * (median - base) / base:+8.2f} %  "
            f"{own * 1e6:7.1f} us = {100 * own / base:.3f} %"
        )
    print(
        "overhead: median step time against the run without the callback (machine noise included);\n"
        "in callback: time inside the callback's own methods per step, against that median step."
    )
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        print(
            f"note: the machine was busy (load {load:.1f} on {cores} cores): the step times carry other "
            "processes' noise; the time in the callback far less."
        )


if __name__ == "__main__":
    main()
