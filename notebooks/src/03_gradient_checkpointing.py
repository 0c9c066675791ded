# %% [markdown]
# # 03 · Gradient checkpointing: memory for compute, measured
#
# **Hardware:** any runtime. On a T4 it sweeps SmolLM2-135M up to 2,048 tokens; on a CPU it uses
# the embedded tiny model (up to its 512 positions) and a pretend card for the out-of-memory part.
# **Time:** about 3 minutes on a T4 including the install; under 20 seconds headless on a CPU.
#
# During the forward pass, autograd keeps what each layer needs for the backward pass: the
# *activations*. They grow with batch size and sequence length, and at long sequences they are
# most of the bill. Gradient checkpointing (transformers 5 calls it *activation* checkpointing)
# keeps only each decoder layer's input and recomputes the rest of the layer during the backward
# pass. This notebook:
#
# 1. measures activation memory against sequence length, with and without checkpointing;
# 2. measures what the recomputation costs in time, against what the documentation says;
# 3. takes the out-of-memory error a student blames on the model, predicts it for a T4 before
#    running anything, and fixes it with checkpointing.

# %% tags=["install"]
# Install the kit and its pinned libraries (about a minute). The runtime's own torch is kept, and
# nothing happens where the kit is installed already (a clone set up with `make`, or a second run).
import importlib.metadata as metadata
import os
import socket
import subprocess
import sys
import tempfile

if not any(metadata.distributions(name="compute-realities-kit")):
    repo, ref = "compute-realities/finetune-kit", "main"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:  # Kaggle's internet may be off: say so now, not after pip's retries
        try:
            socket.create_connection(("github.com", 443), timeout=5).close()
        except OSError:
            raise RuntimeError(
                "This Kaggle session has no internet. Open Settings > Internet, switch it On "
                "(it needs a phone-verified account), then run this cell again."
            ) from None
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
    print(f"Installing the kit from github.com/{repo} at {ref} ...")
    done = subprocess.run(pip, capture_output=True, text=True)  # pip's output only if it fails
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        raise RuntimeError("Installing the kit failed: pip says why just above. Fix that, then run this cell again.")
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
smoke = False  # True: use the embedded tiny model whatever the machine (the runner's --smoke sets it)
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model; needs a GPU and the Hub
per_device_batch = 2  # sequences per micro-batch
seq_lens = [128, 256, 512, 1024, 2048]  # the sweep; the embedded model stops at its 512 positions
timing_steps = 3  # timed runs per setting; the median is reported
t4_model = "Qwen2.5-0.5B"  # the out-of-memory story: a full fine-tune of this catalog model on a T4
t4_batch = 4  # per-device batch of that story
t4_seq_len = 1024  # tokens per sequence: 4 x 1,024 = 4,096 tokens per micro-batch
max_steps = 20  # optimizer steps of the short training run at the end

# %%
# A helpers.py or helpers/ folder of yours would hide the kit's `helpers`: name it before anything imports it.
import importlib.util
import os

found = importlib.util.find_spec("helpers")
folders = list(found.submodule_search_locations or []) if found else []
if found and not any(os.path.exists(os.path.join(folder, "env.py")) for folder in folders):
    shadow = folders[0] if folders else found.origin  # your helpers/ folder, or your helpers.py
    renamed = os.path.join(os.path.dirname(shadow), "my_" + os.path.basename(shadow))
    raise RuntimeError(
        f"{shadow} hides the course kit's `helpers` package. Rename it to {renamed} (any other name works), "
        "then restart the session (Colab: Runtime > Restart session. Kaggle: Run > Restart & clear cell outputs)."
    )

# Kaggle's "GPU T4 x2" shows two cards to every notebook: this one trains on one (notebook 07 uses both).
# The pin only works before anything starts CUDA, so it comes first.
from helpers.env import use_one_gpu

gpus_in_use = use_one_gpu()  # 1 on a GPU machine (one of Kaggle's two T4s), 0 without a GPU

# %% [markdown]
# ## The model and the data
#
# The model in fp32; on a GPU each step runs under autocast in the card's half precision, as the
# Trainer does with `fp16=True` or `bf16=True`. The data: the course dataset as one stream of
# tokens, cut into sequences of whatever length a measurement needs (`pack_course_data`: notebook
# 02's recipe in one call).

# %%
import torch

import helpers
from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.data import pack_course_data
from helpers.env import describe
from helpers.models import load_model

machine = describe()
model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
model.train()  # checkpointing only acts in training mode
model.config.use_cache = False  # the generation cache is for generating; training never reads it
device = next(model.parameters()).device
amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(machine.precision.name)  # None on a CPU
seq_lens = [s for s in seq_lens if s <= model.config.max_position_embeddings]
packed = {s: pack_course_data(tokenizer, s) for s in seq_lens}  # the course dataset cut at each length
print(
    f"precision {machine.precision.name}, sequence lengths {seq_lens}, "
    f"{len(packed[seq_lens[-1]])} sequences of {seq_lens[-1]} tokens"
)


def batch_of(seq_len):
    """The first per_device_batch sequences of seq_len tokens, on the model's device."""
    return packed[seq_len][:per_device_batch]["input_ids"].to(device)


def training_step(batch):
    """Forward (under autocast on a GPU) and backward; what a Trainer does between optimizer steps."""
    with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def set_checkpointing(on):
    if on:  # non-reentrant: PyTorch's recommended mode, and the Trainer's default
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.activation_checkpointing_disable()


# %% [markdown]
# ## Activation memory against sequence length
#
# For each length, one training step with checkpointing off and one with it on, measured by
# `helpers.memory.measure`: the activations are the bytes autograd holds for the backward pass,
# counted exactly on any device. Beside each, the estimator's prediction from the model's shape.

# %%
from helpers.estimate import estimate_training_memory
from helpers.memory import measure

precision = machine.precision.name
measured = {False: [], True: []}
predicted = {False: [], True: []}
for seq_len in seq_lens:
    for on in (False, True):
        set_checkpointing(on)
        with measure(f"{seq_len} {'on' if on else 'off'}", model=model) as readout:
            training_step(batch_of(seq_len))
        measured[on].append(readout["activations"])
        predicted[on].append(
            estimate_training_memory(
                model.config,
                batch_size=per_device_batch,
                seq_len=seq_len,
                precision=precision,
                checkpointing=on,
                device=device.type,
            ).activations
        )
        peak = f", peak allocated {readout['peak_allocated'] / MIB:,.0f} MiB" if "peak_allocated" in readout else ""
        print(
            f"seq_len {seq_len:5}, checkpointing {'on ' if on else 'off'}: activations "
            f"{measured[on][-1] / MIB:8.2f} MiB (estimated {predicted[on][-1] / MIB:8.2f}){peak}"
        )
ratio = measured[True][-1] / measured[False][-1]
print(f"at {seq_lens[-1]} tokens checkpointing keeps {ratio:.2f} x the activations")
parts = estimate_training_memory(
    model.config,
    batch_size=per_device_batch,
    seq_len=seq_lens[-1],
    precision=precision,
    checkpointing=True,
    device=device.type,
).activation_parts
print(
    "what is left with checkpointing on, by the estimator's parts:",
    ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in parts.items()),
)
helpers.record("seq_lens", seq_lens)
helpers.record("activations_mib_off", [round(b / MIB, 3) for b in measured[False]])
helpers.record("activations_mib_on", [round(b / MIB, 3) for b in measured[True]])
helpers.record("activations_predicted_mib_on", [round(b / MIB, 3) for b in predicted[True]])
helpers.record("activation_ratio_at_longest", round(ratio, 4))

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(6, 3.5))
for on, label in ((False, "checkpointing off"), (True, "checkpointing on")):
    (line,) = ax.plot(seq_lens, [b / MIB for b in measured[on]], "o-", label=f"{label}, measured")
    ax.plot(seq_lens, [b / MIB for b in predicted[on]], "x--", color=line.get_color(), label=f"{label}, estimated")
ax.set_xlabel("seq_len (tokens)")
ax.set_ylabel("activations (MiB)")
ax.set_title(f"batch {per_device_batch}, {precision}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Both lines grow in step with the sequence; checkpointing changes the slope. Without it every
# layer keeps its norms, projections, attention and MLP intermediates. With it, each layer keeps
# one tensor, its input, and most of what is left lies outside the layers: the loss's
# log-probabilities over the whole vocabulary, a large share for a small model (the parts above).
#
# ## What the recomputation costs
#
# Checkpointing runs each layer's forward twice: once in the forward pass, once more in the
# backward pass. Time a step (forward and backward) both ways at the longest length, `timing_steps`
# times each, taking turns, and a plain forward pass as well: the recomputation should cost about
# one forward pass of the layers, so a step should slow down by at most about
# `1 + forward / step`.

# %%
import statistics
import time


def seconds(fn):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()  # wait for the GPU before reading the clock
    return time.perf_counter() - start


def forward_only(batch):
    with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
        model(input_ids=batch, labels=batch)


batch = batch_of(seq_lens[-1])
times = {"off": [], "on": [], "forward": []}
for on in (False, True):  # warm-up
    set_checkpointing(on)
    training_step(batch)
for _ in range(timing_steps):
    set_checkpointing(False)
    times["off"].append(seconds(lambda: training_step(batch)))
    times["forward"].append(seconds(lambda: forward_only(batch)))
    set_checkpointing(True)
    times["on"].append(seconds(lambda: training_step(batch)))
median = {k: statistics.median(v) for k, v in times.items()}
time_ratio = median["on"] / median["off"]
expected = 1 + median["forward"] / median["off"]
print(
    f"step without checkpointing {median['off'] * 1000:.1f} ms, with {median['on'] * 1000:.1f} ms: "
    f"{time_ratio:.2f} x (+{(time_ratio - 1) * 100:.0f} %); one forward pass {median['forward'] * 1000:.1f} ms, "
    f"so at most about {expected:.2f} x was expected"
)
print(f"activations: {ratio:.2f} x ({(ratio - 1) * 100:+.0f} %)")
helpers.record("time_ratio", round(time_ratio, 3))
helpers.record("time_ratio_expected", round(expected, 3))

# %% [markdown]
# Compare with what the transformers documentation states. Its gradient checkpointing guide
# (huggingface.co/docs/transformers/en/grad_checkpointing) says training gets about 20 % slower.
# Its older single-GPU performance guide (the v4.2x "Efficient Training on a Single GPU") measured
# bert-large with and without: +29 % time for -22 % memory. Two things differ from the numbers
# above. That -22 % is of the *whole* GPU memory, weights and optimizer states included, which
# checkpointing does not touch; above, only the activations are counted, so the saving looks
# larger. And the time depends on the machine and the model: what checkpointing adds is about one
# more forward pass of the layers, so the step slows down by the share of the forward pass in it,
# the expectation printed beside the measurement. On a busy CPU timings are noisy: read the ratio,
# not the milliseconds, and run the cell again if the two disagree.
#
# ## "The model is too big for my GPU"
#
# A classic: a full fine-tune of Qwen2.5-0.5B on a free T4, 4 sequences of 1,024 tokens per step,
# in fp16, crashes with `CUDA out of memory`, and the conclusion drawn is that the model is too
# big for the card. The estimator says otherwise, before anything is loaded:

# %%
for on in (False, True):
    e = estimate_training_memory(t4_model, batch_size=t4_batch, seq_len=t4_seq_len, precision="fp16", checkpointing=on)
    state = e.weights + e.gradients + e.optimizer  # what checkpointing cannot change
    print(
        f"{t4_model}, batch {t4_batch} x {t4_seq_len} tokens, fp16, checkpointing {'on ' if on else 'off'}: "
        f"{e.total / GIB:5.1f} GiB in total; weights + gradients + AdamW {state / GIB:4.1f} GiB, "
        f"activations {e.activations / GIB:4.1f} GiB -> {'fits' if e.fits('T4') else 'does NOT fit'} a T4"
    )
    helpers.record(f"t4_total_gib_{'on' if on else 'off'}", round(e.total / GIB, 2))
    helpers.record(f"t4_fits_{'on' if on else 'off'}", e.fits("T4"))

# %% [markdown]
# The weights, gradients and AdamW states fit with room to spare; the activations are what
# overflow the card, and checkpointing removes most of them. `helpers.audit.audit` catches the
# mistake from the run's settings and says what to change:

# %%
from helpers.audit import audit

findings = audit(
    {"per_device_train_batch_size": t4_batch, "fp16": True, "seed": 42, "report_to": "wandb"},
    model=t4_model,
    gpu="T4",
    seq_len=t4_seq_len,
)
helpers.record("audit_codes", [f.code for f in findings])

# %% [markdown]
# ## The same error on this machine
#
# A real out-of-memory error is nothing to cause on purpose (on a CPU it can take the whole
# machine down), so this notebook plays a card with room for less activation memory than one step
# at the longest length needs without checkpointing, and more than it needs with it:
# `helpers.oom.activation_budget` raises the same `torch.OutOfMemoryError` a GPU raises once
# autograd holds more than that.

# %%
from helpers.oom import activation_budget, free_memory, is_oom_error

budget = (measured[False][-1] + measured[True][-1]) // 2
print(
    f"pretend card: room for {budget / MIB:.2f} MiB of activations; one step at {seq_lens[-1]} tokens needs "
    f"{measured[False][-1] / MIB:.2f} MiB without checkpointing, {measured[True][-1] / MIB:.2f} MiB with it"
)
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
helpers.record("oom_without_checkpointing", out_of_memory)

# %%
set_checkpointing(True)
with activation_budget(budget, model):
    training_step(batch)
print("checkpointing on: the same step fits the same card")
helpers.record("fits_with_checkpointing", True)

# %% [markdown]
# ## In the Trainer
#
# One argument. transformers 5 renamed `gradient_checkpointing=True` to
# `activation_checkpointing=True`; the old name still works with a deprecation warning, and most
# tutorials (and the lesson) use it. `helpers.training.training_args` takes either and says which
# one it passed on. Train a few steps on the same pretend card, with the live memory readout:

# %%
from transformers import Trainer

from helpers.live import LiveMemoryCallback
from helpers.training import training_args

args = training_args(
    "build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    gradient_checkpointing=True,  # the lesson's name for it
    max_steps=max_steps,
    learning_rate=2e-4,
    logging_steps=max(1, max_steps // 4),
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",
)
train_data = packed[seq_lens[-1]]
live = LiveMemoryCallback(every_n_steps=max(1, max_steps // 4))
trainer = Trainer(model=model, args=args, train_dataset=train_data, callbacks=[live])
with activation_budget(budget, model):
    result = trainer.train()
print(
    f"activation_checkpointing={args.activation_checkpointing}: {result.global_step} steps, "
    f"mean loss {result.training_loss:.3f}"
)
helpers.record("train_loss", round(result.training_loss, 4))

# %% [markdown]
# ## Quick checks
#
# Two questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Each check prints a receipt (question, attempt, result) that stays in the notebook. If
# your instructor grades these, keep each answer in its `answer_...` line, run all the cells, then
# download the notebook (File > Download > Download .ipynb) and hand it in.

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

# %% [markdown]
# ## In this notebook we:
#
# - measured activation memory against sequence length with checkpointing off and on, and drew
#   both beside the estimator's prediction;
# - timed what the recomputation costs, compared it with one forward pass, and with the 20 % and
#   the +29 % time / -22 % memory the transformers documentation reports;
# - predicted, before loading anything, the out-of-memory error of a full fine-tune on a T4, and
#   saw that the activations, not the model, overflow the card;
# - reproduced that error on a pretend card and fixed it with checkpointing, by hand and in the
#   Trainer, under either name of the argument.
#
# Next: notebook 04 gets a large batch's gradients at a small batch's memory with gradient
# accumulation.
