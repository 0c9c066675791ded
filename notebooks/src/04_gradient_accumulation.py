# %% [markdown]
# # 04 · Gradient accumulation: a large batch's gradients at a small batch's memory
#
# **Hardware:** any runtime. A T4 runs it on SmolLM2-135M; a CPU on the small model that ships
# with the course.
# **Time:** about 2 minutes on a T4 including the install (an estimate: not yet timed on one); 11-19 s on a CPU (measured on 2 machines: 11 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 19 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# When the batch you want does not fit, run it in *micro-batches*: forward and backward on each,
# let the gradients add up, step the optimizer once. This notebook proves it gives the large
# batch's gradients, shows the trap when sequences differ in length, and recovers from an
# out-of-memory error by trading batch for accumulation.

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
per_device_batch = 2  # sequences per micro-batch: what fits the card
grad_accum_steps = 8  # effective batch = 2 x 8 x 1 = 16
num_devices = 1  # GPUs in data parallel (Kaggle's T4 x2: 2, notebook 07)
seq_len = 64  # tokens per sequence
train_steps = 10  # optimizer steps of the fine-tune at the end
learning_rate = 5e-5  # on a real model: 5e-5 for a full fine-tune (as here), 2e-4 for LoRA or QLoRA
tiny_learning_rate = 3e-3  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## The effective batch
#
# The optimizer steps once per `grad_accum_steps` micro-batches on each device, so the batch it
# learns from is the product of three numbers. Report it: the per-device batch alone hides the
# other two.

# %%
from helpers import MIB  # bytes in a MiB (2**20)
from helpers.training import effective_batch_size

effective_batch = per_device_batch * grad_accum_steps * num_devices
print(
    f"effective batch = per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} "
    f"x num_devices {num_devices} = {effective_batch}"
)
settings = {"per_device_train_batch_size": per_device_batch, "gradient_accumulation_steps": grad_accum_steps}
assert effective_batch_size(settings, num_devices=num_devices) == effective_batch

# %% [markdown]
# ## Proof: the same gradients
#
# One batch of equal-length sequences: its gradient in one go, then in `grad_accum_steps`
# micro-batches, each loss divided by `grad_accum_steps` so the pieces add up to the batch's mean.

# %%
import torch

from helpers.data import load_course_data, pack_course_data
from helpers.models import is_embedded, load_model
from helpers.saved_tensors import track_saved_tensors

model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
if is_embedded(model):  # its 0.3M weights need far larger steps than a real model's
    print(
        f"tiny model: learning rate {tiny_learning_rate:g}, not a real model's {learning_rate:g} (see the parameters cell)"
    )
    learning_rate = tiny_learning_rate
model.train()
device = next(model.parameters()).device
train_data = pack_course_data(tokenizer, seq_len)  # the course dataset in sequences of seq_len tokens
batch = train_data[: per_device_batch * grad_accum_steps]["input_ids"].to(device)
micro_batches = batch.split(per_device_batch)


def gradients():
    """Every parameter's gradient as one vector; clears them for the next computation."""
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g


with track_saved_tensors(model) as saved_big:
    loss = model(input_ids=batch, labels=batch).loss
loss.backward()
g_big = gradients()

for micro in micro_batches:
    with track_saved_tensors(model) as saved_micro:
        loss = model(input_ids=micro, labels=micro).loss / grad_accum_steps
    loss.backward()  # adds to the .grad of every parameter
g_accumulated = gradients()

max_diff = (g_accumulated - g_big).abs().max().item()
print(f"one batch {tuple(batch.shape)} or {len(micro_batches)} micro-batches {tuple(micro_batches[0].shape)}")
print(f"largest gradient entry {g_big.abs().max().item():.3g}; largest difference {max_diff:.2e}")
print(
    f"activations held: {saved_big.bytes / MIB:.2f} MiB for the whole batch, {saved_micro.bytes / MIB:.2f} MiB "
    f"per micro-batch ({saved_micro.bytes / saved_big.bytes:.3f} x)"
)
tolerance = 1e-6 if device.type == "cpu" else 1e-5 * g_big.abs().max().item()  # GPU kernels vary with the batch shape
assert max_diff < tolerance, f"accumulated gradients differ from the large batch's by {max_diff:.2e}"

# %% [markdown]
# Equal to within rounding, for `1 / grad_accum_steps` of the activation memory. The cost: a step
# takes `grad_accum_steps` small passes, one after another, instead of one large one.
#
# ## The trap: sequences of different lengths
#
# A language model's loss is the *mean over tokens*. Above, every micro-batch held as many tokens
# as the others. Real batches are padded rows of different lengths (padding is labelled -100 and
# not counted), and the mean of the micro-batches' means then weighs a token in a short
# micro-batch more than one in a long one. Rows of the course dataset, shortest to longest, padded
# as a data collator pads them:

# %%
texts = [r["instruction"] + "\n" + r["response"] for r in load_course_data()]
lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
by_length = sorted(range(len(texts)), key=lengths.__getitem__)
n = per_device_batch * grad_accum_steps
chosen = [texts[by_length[i * (len(texts) - 1) // (n - 1)]] for i in range(n)]  # evenly from shortest to longest
tokenizer.padding_side = "right"  # left padding would shift positions between the whole batch and its pieces


def encode(some_texts):
    """Pad to the longest of these texts; label the padding -100 so the loss skips it."""
    enc = tokenizer(some_texts, padding=True, return_tensors="pt").to(device)
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    return {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels}


whole = encode(chosen)
micros = [encode(chosen[i : i + per_device_batch]) for i in range(0, n, per_device_batch)]
# the tokens the loss counts: labels shift by one (token t predicts t + 1), padding excluded
tokens = [int((m["labels"][:, 1:] != -100).sum()) for m in micros]
total_tokens = sum(tokens)
print(f"tokens the loss counts, per micro-batch: {tokens}; in all: {total_tokens}")

# %% [markdown]
# Three gradients: the whole batch (the reference), the mean of means (the loop above), and each
# micro-batch's *sum* of token losses divided by all the batch's tokens, which is what passing
# `num_items_in_batch` to a transformers model does.

# %%
model(**whole).loss.backward()
g_reference = gradients()

for m in micros:
    (model(**m).loss / grad_accum_steps).backward()  # each micro-batch's mean, averaged: the trap
g_naive = gradients()

for m in micros:
    model(**m, num_items_in_batch=total_tokens).loss.backward()  # sum over its tokens / tokens in the whole batch
g_tokens = gradients()

error = {  # the gradient's error, relative to its length
    "mean of means": ((g_naive - g_reference).norm() / g_reference.norm()).item(),
    "sum / all tokens": ((g_tokens - g_reference).norm() / g_reference.norm()).item(),
}
naive_error = (g_naive - g_reference).abs().max().item()
right_error = (g_tokens - g_reference).abs().max().item()
print(", ".join(f"{k}: {v:.2e} of the gradient's length" for k, v in error.items()))
assert right_error < tolerance

# %%
import matplotlib.pyplot as plt

fig, (weight_ax, error_ax) = plt.subplots(1, 2, figsize=(10, 3.5))
steps = range(1, len(micros) + 1)
weight_ax.bar([i - 0.2 for i in steps], [1 / (grad_accum_steps * t) for t in tokens], 0.4, label="mean of means")
weight_ax.bar([i + 0.2 for i in steps], [1 / total_tokens] * len(tokens), 0.4, label="sum / all tokens")
weight_ax.set(xlabel="micro-batch (shortest rows first)", ylabel="weight of one token in the loss")
weight_ax.legend(fontsize=8)
error_ax.bar(list(error), [max(v, 1e-12) for v in error.values()], color=["C0", "C1"])
error_ax.set(yscale="log", ylabel="gradient error (relative to its length)", title="against the whole batch")
plt.show()

# %% [markdown]
# **What to see:** on the left, the mean of means gives a token in the shortest micro-batch more
# weight than one in the longest; summing token losses and dividing by all the tokens weighs every
# token alike. On the right, the price: the first is off by a clear
# share of the gradient (printed above), the second only by rounding (log scale).
#
# The Trainer counts the labelled tokens of each optimizer step's micro-batches and passes
# `num_items_in_batch` for you (checked below). A hand-written loop, or a custom loss that ignores
# it, falls into the trap.
#
# ## Devices, and the number to report
#
# In data parallel training every device runs its own micro-batches, so the devices multiply the
# effective batch too:

# %%
for devices in (1, 2):
    print(
        f"per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} x num_devices {devices} "
        f"= effective batch {effective_batch_size(settings, num_devices=devices)}"
    )

# %% [markdown]
# The mistake reviewers catch: a paper says "batch size 2" (the per-device setting) while the
# optimizer stepped on 16 or 32 sequences. `audit` compares the number you report with the
# effective batch:

# %%
from helpers.audit import audit

findings = audit({**settings, "seed": 42, "report_to": "wandb"}, reported_batch=per_device_batch, num_devices=2)

# %% [markdown]
# ## In the Trainer: out of memory at batch 8
#
# The lesson's situation: the card runs out of memory at a per-device batch of 8, and the run
# needs an effective batch of 16. The arguments as you would write them first:

# %%
from transformers import PrinterCallback, Trainer, TrainingArguments

precision = machine.precision.name
start_batch = 8  # the per-device batch the card runs out of memory at
args = TrainingArguments(
    output_dir="build/checkpoints",
    per_device_train_batch_size=start_batch,
    gradient_accumulation_steps=effective_batch // start_batch,  # effective batch = 8 x 2 x 1 = 16
    fp16=precision == "fp16",  # the card's half precision (notebook 02): fp16 on a T4,
    bf16=precision == "bf16",  # bf16 on an A100 or newer, neither on a CPU
    learning_rate=learning_rate,
    max_steps=train_steps,
    logging_steps=1,
    seed=42,
    report_to="none",
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",
)
print(
    f"effective batch {args.per_device_train_batch_size} x {args.gradient_accumulation_steps} x 1 = {effective_batch}"
)

# %% [markdown]
# The kit's `training_args` is the shortcut: it picks the card's precision and the seed itself,
# and prints the effective batch. Same arguments:

# %%
from helpers.training import EffectiveBatchCallback, training_args

shortcut = training_args(
    "build/checkpoints",
    per_device_train_batch_size=start_batch,
    gradient_accumulation_steps=effective_batch // start_batch,
    learning_rate=learning_rate,
    max_steps=train_steps,
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",
)
compared = ["per_device_train_batch_size", "gradient_accumulation_steps", "fp16", "bf16", "learning_rate", "seed"]
differ = [k for k in compared if getattr(args, k) != getattr(shortcut, k)]
print(f"compared {len(compared)} settings: {'all equal' if not differ else f'these differ: {differ}'}")

# %% [markdown]
# This machine plays a card with room for a little more than `per_device_batch` sequences
# (`activation_budget`, notebook 03). `helpers.oom.fit_batch` trains, and on an out-of-memory error
# halves the batch and doubles the accumulation, keeping the effective batch (transformers'
# `auto_find_batch_size=True` only shrinks the batch, and the effective batch with it).

# %%
from helpers.oom import activation_budget, fit_batch

micro = train_data[:per_device_batch]["input_ids"].to(device)
amp_dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None  # the Trainer's autocast
with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
    with track_saved_tensors(model) as saved:
        loss = model(input_ids=micro, labels=micro).loss
loss.backward()
model.zero_grad(set_to_none=True)
budget = saved.bytes * 5 // 4  # room for per_device_batch sequences, not for twice as many
print(
    f"pretend card: room for {budget / MIB:.2f} MiB of activations ({per_device_batch} sequences take {saved.bytes / MIB:.2f})"
)

eval_batch = train_data[-per_device_batch:]["input_ids"].to(device)  # a fixed batch, to compare before and after


def eval_loss():
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=eval_batch, labels=eval_batch).loss.item()
    model.train()
    return loss


trainers = []


def train(args):
    trainer = Trainer(model=model, args=args, train_dataset=train_data, callbacks=[EffectiveBatchCallback()])
    trainer.remove_callback(PrinterCallback)  # the plot below shows the losses
    trainers.append(trainer)
    return trainer.train()


loss_before = eval_loss()
with activation_budget(budget, model):
    fitted = fit_batch(train, args)
loss_after = eval_loss()
train_losses = [h["loss"] for h in trainers[-1].state.log_history if "loss" in h]
print(f"tried (per_device_batch, grad_accum_steps): {fitted.tried}")
print(f"the Trainer passes num_items_in_batch to this model: {trainers[-1].model_accepts_loss_kwargs}")
print(f"loss of a fixed batch: {loss_before:.3f} before, {loss_after:.3f} after {fitted.result.global_step} steps")

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(range(1, len(train_losses) + 1), train_losses, "o-", label="training loss (each step's 16 sequences)")
ax.axhline(loss_before, color="gray", ls="--", label=f"fixed batch before: {loss_before:.2f}")
ax.axhline(loss_after, color="green", ls="--", label=f"fixed batch after: {loss_after:.2f}")
b, k = fitted.tried[-1]
ax.set(xlabel="optimizer step", ylabel="cross-entropy loss (nats per token)", title=f"{b} x {k} x 1 = {b * k}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** the loss falls at the same effective batch the run asked for, so the learning
# rate chosen for it still suits it. If even a per-device batch of 1 does not fit, `fit_batch`
# stops and says what comes next: gradient checkpointing (notebook 03), then QLoRA (notebook 05).
#
# ## Quick checks
#
# Replace `None` with your answer and run the cell. If your instructor grades these, run all the
# cells, then download the notebook (File > Download > Download .ipynb). Set your student id first:
# two questions give each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q04_1
answer_q04_1 = None  # a number, from your own numbers (set student_id first)
check("q04_1", answer_q04_1, student_id=student_id)

# %%
# QUICK CHECK q04_2
answer_q04_2 = None  # one letter, in quotes
check("q04_2", answer_q04_2)

# %%
# QUICK CHECK q04_3
answer_q04_3 = None  # a dict {"per_device_batch": ..., "grad_accum_steps": ...}, from your own numbers
check("q04_3", answer_q04_3, student_id=student_id)

# %%
# QUICK CHECK q04_4
answer_q04_4 = None  # one letter, in quotes
check("q04_4", answer_q04_4)

# %% [markdown]
# The cell below saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
helpers.record("effective_batch", effective_batch)
helpers.record("accumulation_max_abs_diff", max_diff)
helpers.record("activation_ratio_micro_to_batch", round(saved_micro.bytes / saved_big.bytes, 4))
helpers.record("variable_length_tokens", tokens)
helpers.record("variable_length_naive_max_abs_diff", naive_error)
helpers.record("variable_length_token_sum_max_abs_diff", right_error)
helpers.record("variable_length_relative_error", {k: float(f"{v:.4g}") for k, v in error.items()})
helpers.record("audit_codes", [f.code for f in findings])
helpers.record("args_differ_from_shortcut", differ)
helpers.record("fit_tried", [list(t) for t in fitted.tried])
helpers.record("trainer_passes_num_items", trainers[-1].model_accepts_loss_kwargs)
helpers.record("train_losses", [round(x, 4) for x in train_losses])
helpers.record("loss_before", round(loss_before, 4))
helpers.record("loss_after", round(loss_after, 4))
helpers.record("train_loss", round(fitted.result.training_loss, 4))

# %% [markdown]
# ## In this notebook we:
#
# - computed the effective batch, per-device batch x accumulation steps x devices, and caught a
#   per-device batch reported as the batch size;
# - proved that accumulated gradients equal the large batch's, for a fraction of the activations;
# - plotted the variable-length trap: averaging micro-batch means weighs tokens unequally, while
#   dividing summed token losses by all the tokens (`num_items_in_batch`, what the Trainer
#   passes) matches the whole batch;
# - wrote `TrainingArguments` with accumulation, recovered from an out-of-memory error at batch 8
#   with `fit_batch`, and watched the loss fall at the effective batch we asked for.
#
# ## Change this, predict, run
#
# 1. Set `grad_accum_steps = 4`. Predict the effective batch, the activation ratio of a
#    micro-batch to the whole batch, and what `fit_batch` tries. Run all.
# 2. Set `per_device_batch = 4`. Predict whether the mean-of-means error in the plot grows or
#    shrinks with fewer, larger micro-batches. Run all.
#
# Next: notebook 05 makes a 7B model fit a 16 GB card with QLoRA.
