# %% [markdown]
# # 03 · Gradient checkpointing: memory for compute, measured
#
# **Hardware:** any runtime. On a T4 it sweeps SmolLM2-135M up to 2,048 tokens; on a CPU it uses
# the small model that ships with the course (up to its 512 positions) and a pretend card for the
# out-of-memory part.
# **Time:** about 3 minutes on a T4 including the install (an estimate: not yet timed on one); 10-16 s on a CPU (measured on 2 machines: 10 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 16 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# In the forward pass, autograd keeps what each layer needs for the backward pass: the
# *activations*. They grow with batch size and sequence length. Gradient checkpointing
# (transformers 5 calls it *activation* checkpointing) keeps only each decoder layer's input and
# recomputes the rest of the layer during the backward pass. This notebook:
#
# 1. measures activation memory and step time against sequence length, with and without it;
# 2. predicts the out-of-memory error of a full fine-tune on a T4, then fixes it;
# 3. writes the Trainer recipe out in plain transformers, then with the kit's shortcut.

# %% tags=["install"]
# @title Install the kit (about a minute; nothing to do where it is installed)
# Installs the kit and its pinned libraries. The runtime's own torch is kept, and nothing happens
# where the kit is installed already (a clone set up with `make`, or a second run).
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import threading

# A helpers.py or helpers/ folder of yours would hide the kit's `helpers`: name it before anything imports it.
found = importlib.util.find_spec("helpers")
folders = list(found.submodule_search_locations or []) if found else []
if found and not any(os.path.exists(os.path.join(folder, "env.py")) for folder in folders):
    shadow = folders[0] if folders else found.origin  # your helpers/ folder, or your helpers.py
    renamed = os.path.join(os.path.dirname(shadow), "my_" + os.path.basename(shadow))
    raise RuntimeError(
        f"{shadow} hides the course kit's `helpers` package. Rename it to {renamed} (any other name works), "
        "then restart the session (Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs)."
    )

if not any(metadata.distributions(name="compute-realities-kit")):
    repo, ref = "compute-realities/finetune-kit", "main"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:  # Kaggle's internet may be off: say so now, not after pip's retries
        reached = []  # the name lookup has no timeout of its own: the probe gets 10 s in all, in a thread

        def probe():
            try:
                socket.create_connection(("github.com", 443), timeout=5).close()
                reached.append(True)
            except OSError:
                pass

        probing = threading.Thread(target=probe, daemon=True)
        probing.start()
        probing.join(10)
        if not reached:
            raise RuntimeError(
                "This Kaggle session has no internet. Open Settings > Internet, switch it On "
                "(it needs a phone-verified account), then run this cell again."
            )
    runtime_pins = os.path.join(tempfile.mkdtemp(), "runtime-pins.txt")  # pip may not replace the runtime's torch
    with open(runtime_pins, "w") as f:
        f.writelines(f"torch=={d.version}\n" for d in metadata.distributions(name="torch"))
    pins = f"https://raw.githubusercontent.com/{repo}/{ref}/requirements.txt"
    pip = [sys.executable, "-m", "pip", "install", "--retries", "1", "-c", pins, "-c", runtime_pins]
    pip.append(f"git+https://github.com/{repo}.git@{ref}")

    def imported():  # name -> version of each library this session has imported (a fresh Colab has psutil)
        found = metadata.packages_distributions().items()
        names = {d for module, ds in found if module in sys.modules for d in ds if d}
        return {name: metadata.version(name) for name in sorted(names)}

    before = imported()
    every = {d.metadata["Name"]: d.version for d in metadata.distributions()}  # to mend what pip breaks
    print(f"Installing the kit from github.com/{repo} at {ref} ...")
    done = subprocess.run(pip, capture_output=True, text=True)  # pip's output only if it fails
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise RuntimeError("Installing the kit failed: pip says why just above. Fix that, then run this cell again.")
    importlib.invalidate_caches()  # the kit's files are new since this session started
    from helpers.install import keep_runtime_working

    keep_runtime_working(every, pip[:-1])  # the runtime's other libraries pip broke: mended, or named
    after = imported()
    replaced = [f"{name} {old} -> {after.get(name, 'gone')}" for name, old in before.items() if after.get(name) != old]
    if replaced:  # the session holds their old code: only a restart loads the new versions
        print("Installed, but pip replaced libraries this session had already imported:", *replaced, sep="\n  ")
        raise RuntimeError(
            "Restart the session, then run the notebook from the top (this cell will skip the install). "
            "Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs."
        )
    print("Installed.")

# %% tags=["parameters"]
smoke = False  # True: use the small model that ships with the course, on any machine (quick; the course's tests set it)
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model; needs a GPU and the Hub
per_device_batch = 2  # sequences per micro-batch
seq_lens = [128, 256, 512, 1024, 2048]  # the sweep, in tokens; the course's small model stops at 512
timing_steps = 3  # timed steps per setting; the median is reported
t4_model = "Qwen2.5-0.5B"  # the out-of-memory story: a full fine-tune of this catalog model on a T4
t4_batch = 4  # per-device batch of that story
t4_seq_len = 768  # tokens per sequence: 4 x 768 = 3,072 tokens per micro-batch
run_model = "Qwen2.5-1.5B"  # the whole-run story: LoRA on this catalog model, on a T4
run_batch = 2  # per-device batch of that run
run_max_length = 2048  # its sequences are cut here; each batch is padded to its own longest
run_median_length = 300  # the examples' lengths are drawn around this median (your dataset's real lengths go here)
run_examples = 400  # examples in one epoch of that run
train_steps = 20  # optimizer steps of the short fine-tune at the end
learning_rate = 5e-5  # on a real model: 5e-5 for a full fine-tune (as here), 2e-4 for LoRA or QLoRA
tiny_learning_rate = 3e-3  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## The model and the data
#
# The model in fp32; on a GPU each step runs under autocast in the card's half precision, as the
# Trainer does with `fp16=True` or `bf16=True`. The data: the course dataset cut into sequences of
# each length (`pack_course_data`, notebook 02).

# %%
import torch

from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.data import pack_course_data
from helpers.models import is_embedded, load_model

model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
if is_embedded(model):  # its 0.3M weights need far larger steps than a real model's
    print(
        f"tiny model: learning rate {tiny_learning_rate:g}, not a real model's {learning_rate:g} (see the parameters cell)"
    )
    learning_rate = tiny_learning_rate
model.train()  # checkpointing only acts in training mode
model.config.use_cache = False  # the generation cache is for generating; training never reads it
device = next(model.parameters()).device
amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(machine.precision.name)  # None on a CPU
seq_lens = [s for s in seq_lens if s <= model.config.max_position_embeddings]
packed = {s: pack_course_data(tokenizer, s) for s in seq_lens}
print(f"precision {machine.precision.name}, sequence lengths {seq_lens}")


def batch_of(seq_len):
    """The first per_device_batch sequences of seq_len tokens, on the model's device."""
    return packed[seq_len][:per_device_batch]["input_ids"].to(device)


def forward(batch):
    """The loss, under autocast on a GPU."""
    with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        return model(input_ids=batch, labels=batch).loss


def training_step(batch):
    """Forward and backward: what a Trainer does between optimizer steps."""
    forward(batch).backward()
    model.zero_grad(set_to_none=True)


def set_checkpointing(on):
    if on:  # non-reentrant: PyTorch's recommended mode, and the Trainer's default
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()


# %% [markdown]
# ## Memory and time against sequence length
#
# For each length and each setting: the activations of one training step (`helpers.memory.measure`
# counts exactly the bytes autograd holds for backward), the estimator's prediction beside it, and
# the median time of `timing_steps` steps after a warm-up step.

# %%
import statistics
import time

from helpers.estimate import estimate_training_memory
from helpers.memory import measure


def seconds(fn, *args):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn(*args)
    if device.type == "cuda":
        torch.cuda.synchronize()  # wait for the GPU before reading the clock
    return time.perf_counter() - start


precision = machine.precision.name
measured, predicted, step_ms = {False: [], True: []}, {False: [], True: []}, {False: [], True: []}
for seq_len in seq_lens:
    batch = batch_of(seq_len)
    for on in (False, True):
        set_checkpointing(on)
        with measure(f"{seq_len} {'on' if on else 'off'}", model=model) as readout:
            training_step(batch)  # also the warm-up for the timing below
        measured[on].append(readout["activations"])
        predicted[on].append(
            estimate_training_memory(
                model.config,
                per_device_batch=per_device_batch,
                seq_len=seq_len,
                precision=precision,
                checkpointing=on,
                device=device.type,
            ).activations
        )
        step_ms[on].append(1000 * statistics.median(seconds(training_step, batch) for _ in range(timing_steps)))
        print(
            f"seq_len {seq_len:5}, checkpointing {'on ' if on else 'off'}: activations {measured[on][-1] / MIB:8.2f} MiB "
            f"(estimated {predicted[on][-1] / MIB:8.2f} MiB), step {step_ms[on][-1]:7.1f} ms"
        )
forward_ms = 1000 * statistics.median(seconds(forward, batch) for _ in range(timing_steps))  # longest length
ratio = measured[True][-1] / measured[False][-1]
time_ratio = step_ms[True][-1] / step_ms[False][-1]
expected = 1 + forward_ms / step_ms[False][-1]  # one more forward pass per step, at most
print(
    f"\nat {seq_lens[-1]} tokens: checkpointing keeps {ratio:.2f} x the activations and took {time_ratio:.2f} x "
    f"the time on this machine (medians of {timing_steps}); one forward pass is {forward_ms:.1f} ms, so at most "
    f"about {expected:.2f} x was expected"
)

# %% [markdown]
# Milliseconds on a shared machine move from run to run; the work does not. PyTorch's
# `FlopCounterMode` counts the floating-point operations of every matrix product that runs inside
# it, the ones recomputed during backward included:

# %%
from torch.utils.flop_counter import FlopCounterMode

step_flops = {}
for on in (False, True):
    set_checkpointing(on)
    with FlopCounterMode(display=False) as counter:
        training_step(batch_of(seq_lens[-1]))
    step_flops[on] = counter.get_total_flops()
set_checkpointing(False)
with FlopCounterMode(display=False) as counter:
    forward(batch_of(seq_lens[-1]))
forward_flops = counter.get_total_flops()
work_ratio = step_flops[True] / step_flops[False]
print(
    f"one step at {seq_lens[-1]} tokens: {step_flops[False] / forward_flops:.2f} forward passes' worth of arithmetic "
    f"without checkpointing, {step_flops[True] / forward_flops:.2f} with it: {work_ratio:.2f} x, on any machine"
)

# %%
import matplotlib.pyplot as plt

fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(10, 3.5))
for on, label in ((False, "checkpointing off"), (True, "checkpointing on")):
    (line,) = mem_ax.plot(seq_lens, [b / MIB for b in measured[on]], "o-", label=f"{label}, measured")
    mem_ax.plot(seq_lens, [b / MIB for b in predicted[on]], "x--", color=line.get_color(), label=f"{label}, estimated")
    time_ax.plot(seq_lens, step_ms[on], "o-", color=line.get_color(), label=label)
mem_ax.set(xlabel="seq_len (tokens)", ylabel="activations (MiB)", title=f"memory, batch {per_device_batch}")
time_ax.set(xlabel="seq_len (tokens)", ylabel="one training step (ms)", title=f"time, {precision}")
mem_ax.legend(fontsize=8), time_ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** on the left, checkpointing flattens the slope: each layer keeps one tensor, its
# input, instead of its norms, projections, attention and MLP intermediates. On the right, the
# price: every step runs each layer's forward twice, the arithmetic counted above (the loss and
# the head are not recomputed, so less than one more forward pass).
# The transformers guide on gradient checkpointing puts it at "~20 % slower"
# (huggingface.co/docs/transformers/en/grad_checkpointing, April 2026); Stas Bekman's *Machine
# Learning Engineering* book says 20-25 % less throughput (github.com/stas00/ml-engineering, as of
# 2025). This machine's milliseconds may say more or less: on a shared CPU they are noise around
# the work, which the count gives exactly.
#
# ## "The model is too big for my GPU"
#
# A full fine-tune of Qwen2.5-0.5B on a free T4, 4 sequences of 768 tokens, fp16, crashes with
# `CUDA out of memory`, and the model gets the blame. The estimator, before anything is loaded:

# %%
t4_total_gib, t4_fits = {}, {}
for on in (False, True):
    e = estimate_training_memory(
        t4_model, per_device_batch=t4_batch, seq_len=t4_seq_len, precision="fp16", checkpointing=on, gpu="T4"
    )
    state = e.weights + e.gradients + e.optimizer  # what checkpointing cannot change
    t4_total_gib[on], t4_fits[on] = round(e.total / GIB, 2), e.fits("T4")
    print(
        f"checkpointing {'on ' if on else 'off'}: {e.total / GIB:5.1f} GiB in total; weights + gradients + AdamW "
        f"{state / GIB:4.1f} GiB, activations {e.activations / GIB:4.1f} GiB -> "
        f"{'fits' if t4_fits[on] else 'does NOT fit'} a T4 (14.75 GiB)"
    )

# %% [markdown]
# The weights, gradients and AdamW states fit; the activations overflow the card, and checkpointing
# removes most of them. `helpers.audit.audit` catches the mistake from the run's settings:

# %%
from helpers.audit import audit

findings = audit(
    {"per_device_train_batch_size": t4_batch, "fp16": True, "seed": 42, "report_to": "wandb"},
    model=t4_model,
    gpu="T4",
    seq_len=t4_seq_len,
)

# %% [markdown]
# ## The same error on this machine
#
# A real out-of-memory error is nothing to cause on purpose, so this machine plays a card with
# room for less than one step at the longest length needs without checkpointing, and more than it
# needs with it: `helpers.oom.activation_budget` raises the same `torch.OutOfMemoryError` a GPU
# raises once autograd holds more than that.

# %%
from helpers.oom import activation_budget, free_memory, is_oom_error

budget = (measured[False][-1] + measured[True][-1]) // 2
print(f"pretend card: room for {budget / MIB:.2f} MiB of activations")
set_checkpointing(False)
try:
    with activation_budget(budget, model):
        training_step(batch)
    out_of_memory = False
except Exception as error:
    if not is_oom_error(error):
        raise
    print(f"checkpointing off: {type(error).__name__}: {error}")
    out_of_memory = True
    free_memory(error)  # let go of the failed step's activations, as after a real CUDA OOM

# %%
set_checkpointing(True)
with activation_budget(budget, model):
    training_step(batch)
fits_with_checkpointing = True
print("checkpointing on: the same step fits the same card")

# %% [markdown]
# ## Over a whole run: batches of every length
#
# Real data is not packed into equal lengths. The kit's collator pads each batch to its own longest
# sequence, so every step has a different shape, and a plan for one step at the longest length is
# not the whole story. PyTorch's caching allocator keeps the blocks a step frees, to hand them to
# the next step. A longer step asks for larger blocks than any it kept, so it reserves new ones,
# and the shorter step's blocks stay reserved beside them. The reserve a run reaches depends on the
# order its lengths come in, not only on its longest batch. On a large card it climbs far past what
# any step needs; on a T4 it fills the card, and the allocator must hand its cache back to the driver
# to go on, slowly: a job that was near the edge runs out.
#
# `helpers.estimate.estimate_run_memory` replays a run's requests, batch by batch, through the
# allocator's rules. Here: LoRA on a T4, examples drawn around a median length (pass your dataset's
# real ones: `[len(ids) for ids in tokenized["input_ids"]]`), each batch padded to its longest.

# %%
import math
import random

from helpers.catalog import gpu_bytes
from helpers.estimate import estimate_run_memory

draw = random.Random(0)
run_lengths = [max(8, round(draw.lognormvariate(math.log(run_median_length), 0.7))) for _ in range(run_examples)]
run_job = dict(per_device_batch=run_batch, seq_len=run_max_length, method="lora", checkpointing=True, gpu="T4")
one_step = estimate_training_memory(run_model, **run_job)
print(f"one step of {run_batch} x {run_max_length} tokens: {one_step.verdict_line('T4')}")
runs = {}  # expandable segments off (the default allocator), then on
for on in (False, True):
    runs[on] = estimate_run_memory(run_model, lengths=run_lengths, expandable_segments=on, **run_job)
    print(f"\nexpandable segments {'on ' if on else 'off'}: {runs[on].line()}")

# %% [markdown]
# The default allocator gives memory out in *segments*: a request of 10 MiB or more gets a segment
# of its own, and a segment goes back only when every block in it is free. With
# `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` there is one segment per pool that grows at
# its end, so a longer batch extends the space a shorter one freed. `helpers.start()` sets it
# before CUDA starts, in every notebook that trains on one GPU. The reserve over the steps:

# %%
fig, ax = plt.subplots(figsize=(8, 3.5))
steps_run = range(1, len(runs[False].lengths) + 1)
ax.plot(steps_run, [one_step.reserved / GIB] * len(steps_run), "--", color="gray", label="one step, longest length")
for on, run in runs.items():
    label = f"whole run, expandable segments {'on' if on else 'off'}"
    ax.plot(range(1, len(run.reserved) + 1), [r / GIB for r in run.reserved], label=label)
    if run.out_of_memory is not None:
        ax.plot(run.out_of_memory + 1, run.reserved[-1] / GIB, "rx", markersize=12, label="runs out here")
room = (gpu_bytes("T4") - one_step.cuda_context) / GIB  # what the allocator may reserve on a T4
ax.axhline(room, color="black", lw=1, label=f"a T4 less the CUDA context: {room:.2f} GiB")
ax.set(xlabel="step", ylabel="PyTorch reserved (GiB)", title=f"{run_model}, LoRA, batches padded to their longest")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** with the default allocator the reserve climbs in steps, each time a batch asks
# for more than any block it kept, until it meets the card's line, long after the step that set
# the plan's figure. With expandable segments the run stays close to what its longest step allocates.
# The figures are the estimator's, for a T4, on any machine. On a GPU the next cell also measures
# this notebook's own model over the course's examples, each batch padded to its longest.

# %%
from helpers.data import load_course_data

course = load_course_data()
course_ids = [tokenizer(r["instruction"] + "\n" + r["response"])["input_ids"][: seq_lens[-1]] for r in course]
course_ids = course_ids[: 12 * per_device_batch]  # 12 steps
course_lengths = [len(ids) for ids in course_ids]
measured_run = None
if device.type == "cuda":
    set_checkpointing(False)
    torch.cuda.empty_cache()  # start from an empty cache, as a fresh run would
    torch.cuda.reset_peak_memory_stats()
    measured_run = []
    for i in range(0, len(course_ids), per_device_batch):
        rows = course_ids[i : i + per_device_batch]
        longest = max(len(r) for r in rows)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        batch = torch.tensor([r + [pad] * (longest - len(r)) for r in rows], device=device)
        training_step(batch)
        measured_run.append(torch.cuda.max_memory_reserved())
    course_run = estimate_run_memory(
        model.config, lengths=course_lengths, shuffle=False, per_device_batch=per_device_batch,
        seq_len=max(course_lengths), precision=precision, optimizer="sgd", gpu=None,
    )  # fmt: skip
    print(
        f"{len(measured_run)} steps of the course's examples: PyTorch reserved {measured_run[-1] / MIB:,.0f} MiB, "
        f"estimated {course_run.peak_reserved / MIB:,.0f} MiB "
        f"(expandable segments {'on' if course_run.expandable_segments else 'off'} in this session)"
    )
else:
    print(f"no CUDA allocator on this {device.type}: the run above is the estimator's; a GPU measures it here")

# %% [markdown]
# ## In the Trainer
#
# One argument, as the lesson writes it. transformers 5 renamed `gradient_checkpointing` to
# `activation_checkpointing`; the old name still works, with a deprecation warning.

# %%
from transformers import PrinterCallback, Trainer, TrainingArguments

args = TrainingArguments(
    output_dir="build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    gradient_checkpointing=True,  # recompute activations in the backward pass to save memory
    gradient_checkpointing_kwargs={"use_reentrant": False},  # PyTorch's recommended mode
    fp16=precision == "fp16",  # the card's half precision (notebook 02): fp16 on a T4,
    bf16=precision == "bf16",  # bf16 on an A100 or newer, neither on a CPU
    learning_rate=learning_rate,
    max_steps=train_steps,
    logging_steps=1,
    seed=42,  # set it, and report it
    report_to="none",  # notebook 06 turns on wandb
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",  # pinned memory only helps copies to a GPU
)
print(f"activation_checkpointing={args.activation_checkpointing}, seed {args.seed}, fp16={args.fp16}, bf16={args.bf16}")

# %% [markdown]
# The kit's `training_args` is the shortcut: it picks the precision for this card, sets the seed
# and `report_to="none"` unless you pass them, accepts either name, and prints one summary line.
# Same settings, same arguments:

# %%
from helpers.training import training_args

shortcut = training_args(
    "build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    gradient_checkpointing=True,
    learning_rate=learning_rate,
    max_steps=train_steps,
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",
)
compared = [
    "per_device_train_batch_size", "activation_checkpointing", "activation_checkpointing_kwargs", "fp16", "bf16",
    "learning_rate", "max_steps", "seed", "report_to",
]  # fmt: skip
differ = [k for k in compared if getattr(args, k) != getattr(shortcut, k)]
print(f"compared {len(compared)} settings: {'all equal' if not differ else f'these differ: {differ}'}")

# %% [markdown]
# Train with it, on the shortest sequences to keep it quick, the loss of a fixed batch measured
# before and after. `LiveMemoryCallback` shows step, loss and memory on one line that refreshes in
# place while it trains. With the progress bar off (`disable_tqdm=True`), the Trainer adds its own
# `PrinterCallback`, which prints every log as a `{'loss': ...}` dict around that line: remove it.

# %%
from helpers.live import LiveMemoryCallback

eval_batch = batch_of(seq_lens[0])


def eval_loss():
    model.eval()
    with torch.no_grad():
        loss = forward(eval_batch).item()
    model.train()
    return loss


loss_before = eval_loss()
live = LiveMemoryCallback(every_n_steps=max(1, train_steps // 4))  # refresh 4 times
trainer = Trainer(model=model, args=args, train_dataset=packed[seq_lens[0]], callbacks=[live])
trainer.remove_callback(PrinterCallback)  # the readout and the plot show the losses
result = trainer.train()
train_losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
loss_after = eval_loss()
print(
    f"{result.global_step} steps of {per_device_batch} x {seq_lens[0]} tokens; loss of the fixed batch {loss_before:.3f} -> {loss_after:.3f}"
)

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(range(1, len(train_losses) + 1), train_losses, "o-", label="training loss (each step's batch)")
ax.axhline(loss_before, color="gray", ls="--", label=f"fixed batch before: {loss_before:.2f}")
ax.axhline(loss_after, color="green", ls="--", label=f"fixed batch after: {loss_after:.2f}")
ax.set(xlabel="optimizer step", ylabel="cross-entropy loss (nats per token)", title="fine-tune with checkpointing on")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** the loss falls while checkpointing is on: it changes memory and time, never
# what the model learns (the gradients are the same).
#
# ## Quick checks
#
# Replace `None` with your answer and run the cell. If your instructor grades these, run all the
# cells, then download the notebook (File > Download > Download .ipynb).

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q03_1
answer_q03_1 = None  # one letter, in quotes
check("q03_1", answer_q03_1)

# %%
# QUICK CHECK q03_2
answer_q03_2 = None  # every letter that applies, in one string
check("q03_2", answer_q03_2)

# %%
# QUICK CHECK q03_3
answer_q03_3 = None  # one letter, in quotes
check("q03_3", answer_q03_3)

# %%
# QUICK CHECK q03_4
answer_q03_4 = None  # one letter, in quotes
check("q03_4", answer_q03_4)

# %%
# QUICK CHECK q03_5
answer_q03_5 = None  # one letter, in quotes
check("q03_5", answer_q03_5)

# %% [markdown]
# The cell below saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
helpers.record("seq_lens", seq_lens)
helpers.record("activations_mib_off", [round(b / MIB, 3) for b in measured[False]])
helpers.record("activations_mib_on", [round(b / MIB, 3) for b in measured[True]])
helpers.record("activations_predicted_mib_on", [round(b / MIB, 3) for b in predicted[True]])
helpers.record("activation_ratio_at_longest", round(ratio, 4))
helpers.record("step_ms_off", [round(t, 3) for t in step_ms[False]])
helpers.record("step_ms_on", [round(t, 3) for t in step_ms[True]])
helpers.record("time_ratio", round(time_ratio, 3))
helpers.record("time_ratio_expected", round(expected, 3))
helpers.record(
    "step_forwards", {k: round(step_flops[on] / forward_flops, 4) for k, on in (("off", False), ("on", True))}
)
helpers.record("checkpointing_work_ratio", round(work_ratio, 4))
helpers.record("t4_total_gib_off", t4_total_gib[False])
helpers.record("t4_total_gib_on", t4_total_gib[True])
helpers.record("t4_fits_off", t4_fits[False])
helpers.record("t4_fits_on", t4_fits[True])
helpers.record("audit_codes", [f.code for f in findings])
helpers.record("oom_without_checkpointing", out_of_memory)
helpers.record("fits_with_checkpointing", fits_with_checkpointing)
helpers.record("run_one_step_verdict", one_step.verdict("T4"))
allocators = {"default": runs[False], "expandable": runs[True]}
helpers.record("run_verdicts", {name: run.verdict() for name, run in allocators.items()})
helpers.record("run_out_of_memory_step", runs[False].out_of_memory)
helpers.record("run_history_gib", {name: round(run.history / GIB, 3) for name, run in allocators.items()})
helpers.record("run_one_step_reserved_gib", round(one_step.reserved / GIB, 3))
helpers.record("run_reserved_gib", {name: round(run.peak_reserved / GIB, 3) for name, run in allocators.items()})
helpers.record("course_run_reserved_mib", None if measured_run is None else [round(r / MIB, 1) for r in measured_run])
helpers.record("args_differ_from_shortcut", differ)
helpers.record("train_losses", [round(x, 4) for x in train_losses])
helpers.record("loss_before", round(loss_before, 4))
helpers.record("loss_after", round(loss_after, 4))
helpers.record("train_loss", round(result.training_loss, 4))
helpers.record("live_readout_steps", live.summary["steps"])

# %% [markdown]
# ## In this notebook we:
#
# - measured activations and step time against sequence length, with checkpointing off and on:
#   a fraction of the memory for at most one more forward pass per step;
# - predicted a T4's out-of-memory error before loading anything, and saw that the activations,
#   not the model, overflow the card;
# - replayed a whole run of batches of every length through the caching allocator's rules: the
#   run's reserve grew gigabytes past one step's plan until it met the card, and expandable segments
#   kept it near what the longest step allocates;
# - reproduced the error on a pretend card, fixed it with checkpointing, and fine-tuned there with
#   `TrainingArguments(gradient_checkpointing=True)`, written out and with the kit's shortcut.
#
# ## Change this, predict, run
#
# 1. Set `per_device_batch = 4` in the parameters cell. Predict how both lines of the memory plot
#    move, and whether the ratio printed at the longest length changes. Run all.
# 2. Set `run_median_length = 800`. Predict whether the lengths' order adds more or less to the
#    default allocator's reserve than before (longer examples: more batches near the longest). Run all.
#
# Next: notebook 04 gets a large batch's gradients at a small batch's memory.
