# %% [markdown]
# # 04 · Gradient accumulation: a large batch's gradients at a small batch's memory
#
# **Hardware:** any runtime. A T4 runs it on SmolLM2-135M; a CPU on the embedded tiny model.
# **Time:** about 2 minutes on a T4 including the install; under 20 seconds headless on a CPU.
#
# When the batch you want does not fit, run it in pieces: split it into *micro-batches*, run the
# forward and backward pass on each, let the gradients add up, and step the optimizer once at the
# end. The optimizer sees the gradient of the whole batch; memory only ever holds one
# micro-batch's activations. This notebook:
#
# 1. proves the first half of that sentence: accumulated gradients equal the large batch's, to
#    the last bits of fp32, and measures the second half;
# 2. shows the trap for language models, where sequences differ in length, and the fix the
#    Trainer applies;
# 3. adds the devices to the effective batch, the number to report;
# 4. recovers from an out-of-memory error by trading batch for accumulation, automatically.

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
per_device_batch = 2  # sequences per micro-batch: what fits the card
grad_accum_steps = 8  # effective batch = 2 x 8 x 1 = 16
num_devices = 1  # GPUs in data parallel (Kaggle's T4 x2: 2, notebook 07)
seq_len = 64  # tokens per sequence
max_steps = 10  # optimizer steps of the training run at the end

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
# ## The effective batch
#
# The optimizer steps once per `grad_accum_steps` micro-batches on each device, so the batch it
# learns from is the product of three numbers. It is the number to report: the per-device batch
# alone hides the other two.

# %%
import helpers
from helpers import MIB  # bytes in a MiB (2**20)
from helpers.training import effective_batch_size

effective_batch = per_device_batch * grad_accum_steps * num_devices
print(
    f"effective batch = per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} "
    f"x num_devices {num_devices} = {effective_batch}"
)
settings = {"per_device_train_batch_size": per_device_batch, "gradient_accumulation_steps": grad_accum_steps}
assert effective_batch_size(settings, num_devices=num_devices) == effective_batch
helpers.record("effective_batch", effective_batch)

# %% [markdown]
# ## Proof: the same gradients
#
# Take one batch of `per_device_batch x grad_accum_steps` sequences of equal length. Compute its
# gradient in one go; then again in `grad_accum_steps` micro-batches, dividing each micro-batch's
# loss by `grad_accum_steps` so the sum of the pieces is the mean over the batch. Compare every
# gradient entry. The model runs in fp32 here, so the only difference left is the order in which
# floating-point numbers are added.

# %%
import torch

from helpers.data import load_course_data, pack_course_data
from helpers.models import load_model
from helpers.saved_tensors import track_saved_tensors

model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
model.train()
device = next(model.parameters()).device
train_data = pack_course_data(tokenizer, seq_len)  # the course dataset in sequences of seq_len tokens
n_sequences = per_device_batch * grad_accum_steps  # one device's share of the effective batch
batch = train_data[:n_sequences]["input_ids"].to(device)
micro_batches = batch.split(per_device_batch)
print(f"one batch {tuple(batch.shape)}, or {len(micro_batches)} micro-batches {tuple(micro_batches[0].shape)}")


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
print(f"largest gradient entry {g_big.abs().max().item():.3g}; largest difference {max_diff:.2e}")
print(
    f"activations held: {saved_big.bytes / MIB:.2f} MiB for the whole batch, {saved_micro.bytes / MIB:.2f} MiB "
    f"per micro-batch ({saved_micro.bytes / saved_big.bytes:.3f} x)"
)
tolerance = 1e-6 if device.type == "cpu" else 1e-5 * g_big.abs().max().item()  # GPU kernels vary with the batch shape
assert max_diff < tolerance, f"accumulated gradients differ from the large batch's by {max_diff:.2e}"
helpers.record("accumulation_max_abs_diff", max_diff)
helpers.record("activation_ratio_micro_to_batch", round(saved_micro.bytes / saved_big.bytes, 4))

# %% [markdown]
# Equal to within rounding, for `1 / grad_accum_steps` of the activation memory. What it costs:
# the micro-batches run one after another, `grad_accum_steps` smaller forward and backward passes
# for each optimizer step instead of one large one.
#
# ## The trap: sequences of different lengths
#
# A causal language model's loss is the *mean over tokens*. The proof above used sequences of
# equal length, so every micro-batch held the same number of tokens and the mean of the
# micro-batches' means was the mean over all tokens. Real batches are padded sequences of
# different lengths (padding is labelled -100 and not counted). Then the mean of means gives each
# micro-batch the same weight however many tokens it holds: a token in a short micro-batch counts
# more than one in a long one, and the gradient is no longer the large batch's.
#
# Take rows of the course dataset from the shortest to the longest, padded the way a data collator
# pads them: each micro-batch to its own longest sequence, the whole batch to the longest of all.

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
    return {
        "input_ids": enc.input_ids,
        "attention_mask": enc.attention_mask,
        "labels": enc.input_ids.masked_fill(enc.attention_mask == 0, -100),
    }


whole = encode(chosen)
micros = [encode(chosen[i : i + per_device_batch]) for i in range(0, n, per_device_batch)]
# the tokens the loss counts: labels shift by one (token t predicts t + 1), padding excluded
tokens = [int((m["labels"][:, 1:] != -100).sum()) for m in micros]
total_tokens = sum(tokens)
print(f"tokens the loss counts, per micro-batch: {tokens}; in all: {total_tokens}")

# %% [markdown]
# Three gradients: the reference (the whole batch in one go), the mean of the micro-batches'
# means (the naive loop above), and the right one: each micro-batch's *sum* of token losses,
# divided by the number of tokens in the whole accumulated batch. Passing `num_items_in_batch`
# to a transformers model does exactly that division.

# %%
reference_loss = model(**whole).loss
reference_loss.backward()
g_reference = gradients()

mean_of_means = 0.0
for m in micros:
    loss = model(**m).loss / grad_accum_steps  # each micro-batch's mean, averaged: the trap
    loss.backward()
    mean_of_means += loss.item()
g_naive = gradients()

token_mean = 0.0
for m in micros:
    loss = model(**m, num_items_in_batch=total_tokens).loss  # sum over its tokens / tokens in the whole batch
    loss.backward()
    token_mean += loss.item()
g_tokens = gradients()

naive_error = (g_naive - g_reference).abs().max().item()
right_error = (g_tokens - g_reference).abs().max().item()
print(
    f"loss: whole batch {reference_loss.item():.5f}, mean of means {mean_of_means:.5f}, "
    f"sum / all tokens {token_mean:.5f}"
)
print(
    f"largest gradient difference from the whole batch: mean of means {naive_error:.2e} "
    f"({(g_naive - g_reference).norm() / g_reference.norm():.1%} of the gradient's length), "
    f"sum / all tokens {right_error:.2e}"
)
assert right_error < tolerance
helpers.record("variable_length_naive_max_abs_diff", naive_error)
helpers.record("variable_length_token_sum_max_abs_diff", right_error)

# %% [markdown]
# The Trainer does the right thing for you: before each optimizer step it counts the labelled
# tokens in all the micro-batches of that step, and passes the count as `num_items_in_batch` to the
# model's loss, whenever the model's `forward` accepts it (transformers models do; the Trainer
# records this in `model_accepts_loss_kwargs`). A hand-written loop, or a custom loss that ignores
# `num_items_in_batch`, falls into the trap.
#
# ## Devices, and the number to report
#
# With data parallel training every device runs its own micro-batches, so the devices multiply the
# effective batch too: Kaggle's T4 x2 doubles it. Here is the same per-device setting on one and
# two cards:

# %%
for devices in (1, 2):
    print(
        f"per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} x num_devices {devices} "
        f"= effective batch {effective_batch_size(settings, num_devices=devices)}"
    )

# %% [markdown]
# The mistake reviewers catch: the paper says "batch size 2" (the per-device setting), while the
# optimizer stepped on 16 or 32 sequences. `audit` compares the number you report with the
# effective batch:

# %%
from helpers.audit import audit

reported = per_device_batch
findings = audit({**settings, "seed": 42, "report_to": "wandb"}, reported_batch=reported, num_devices=2)
helpers.record("audit_codes", [f.code for f in findings])

# %% [markdown]
# ## Out of memory at batch 8, and a larger effective batch wanted
#
# The lesson's situation. A card runs out of memory at a per-device batch of 8, yet the run
# needs an effective batch of 16. More memory is not on offer; the fix is a smaller per-device
# batch and more accumulation. `helpers.oom.fit_batch` does it for you: it runs the training,
# and on an out-of-memory error halves the per-device batch and doubles the accumulation, so the
# effective batch stays what you chose. (transformers' own `auto_find_batch_size=True` only
# shrinks the batch, and the effective batch with it.)
#
# This machine plays a card with room for the activations of a little more than
# `per_device_batch` sequences (`activation_budget`, as in notebook 03), and the Trainer starts at 8.
# The `EffectiveBatchCallback` prints and records the effective batch each time training starts.

# %%
from transformers import Trainer

from helpers.oom import activation_budget, fit_batch
from helpers.training import EffectiveBatchCallback, training_args

start_batch = 8  # the lesson's card runs out of memory at this per-device batch
args = training_args(
    "build/checkpoints",
    per_device_train_batch_size=start_batch,
    gradient_accumulation_steps=max(1, per_device_batch * grad_accum_steps // start_batch),
    max_steps=max_steps,
    learning_rate=2e-4,
    logging_steps=max(1, max_steps // 4),
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=device.type == "cuda",
)

# the pretend card: measure one micro-batch of per_device_batch sequences in the Trainer's precision
micro = train_data[:per_device_batch]["input_ids"].to(device)
amp_dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None
with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
    with track_saved_tensors(model) as saved:
        loss = model(input_ids=micro, labels=micro).loss
loss.backward()
model.zero_grad(set_to_none=True)
budget = saved.bytes * 5 // 4  # room for per_device_batch sequences, not for twice as many
print(
    f"pretend card: room for {budget / MIB:.2f} MiB of activations "
    f"({per_device_batch} sequences of {seq_len} tokens take {saved.bytes / MIB:.2f} MiB)"
)


def train(args):
    trainer = Trainer(model=model, args=args, train_dataset=train_data, callbacks=[EffectiveBatchCallback()])
    return trainer.train()


with activation_budget(budget, model):
    fitted = fit_batch(train, args)
print(f"tried (per_device_batch, grad_accum_steps): {fitted.tried}; mean loss {fitted.result.training_loss:.3f}")
helpers.record("fit_tried", [list(t) for t in fitted.tried])
helpers.record("train_loss", round(fitted.result.training_loss, 4))

# %% [markdown]
# Same effective batch, so the same learning rate still suits it. If even a per-device batch of 1
# does not fit, `fit_batch` stops and says what comes next: gradient checkpointing (notebook 03),
# then an 8-bit optimizer or QLoRA (notebook 05).
#
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run
# the cell: it answers at once, with a hint when the answer is not right yet and the explanation
# when it is. Each check prints a receipt (question, attempt, result) that stays in the notebook.
# If your instructor grades these, keep each answer in its `answer_...` line, run all the cells,
# then download the notebook (File > Download > Download .ipynb) and hand it in. Start with your
# student id: two of the questions give each student their own numbers.

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

# %% [markdown]
# ## In this notebook we:
#
# - computed the effective batch, per-device batch x accumulation steps x devices;
# - proved that accumulated gradients equal the large batch's (the largest difference printed and
#   asserted), and measured the activation memory a micro-batch needs instead;
# - showed that averaging micro-batch means goes wrong when sequences differ in length, and that
#   dividing summed token losses by the tokens of the whole batch (`num_items_in_batch`, what the
#   Trainer passes) is right;
# - caught a per-device batch reported as the batch size with `audit`;
# - recovered from an out-of-memory error at batch 8 by trading batch for accumulation with
#   `fit_batch`, keeping the effective batch.
#
# Next: notebook 05 makes a 7B model fit a 16 GB card with QLoRA.
