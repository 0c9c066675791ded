# %% [markdown]
# # 01 · Memory anatomy: where every byte of a training step goes
#
# **Hardware:** any runtime; a T4 shows the GPU's own peak beside the exact count.
# **Time:** about 2 minutes on a T4 including the install; about 15 seconds headless on a CPU.
#
# "CUDA out of memory" tells you that a job did not fit, not why. This notebook takes one training
# step apart and measures each line of its memory bill on the model at hand:
#
# 1. the **weights**, the **gradients** and the **optimizer states**, counted tensor by tensor;
# 2. the **activations**: every tensor autograd keeps from the forward pass for the backward pass;
# 3. the same bill **predicted** by the kit's estimator before anything runs, and its error;
# 4. the estimator's answer for real models on a T4, and a plan that makes a 7B model fit.

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
batch_size = 4  # sequences per step
seq_len = 256  # tokens per sequence: 4 x 256 = 1,024 tokens per step

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
# ## The model and one batch
#
# The batch is the course dataset's text, tokenized and cut into `batch_size` rows of `seq_len`
# tokens (no padding, as in packed training), so every row costs the same.

# %%
import torch

import helpers
from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.data import load_course_data
from helpers.env import describe
from helpers.models import is_embedded, load_model

machine = describe()
print(machine.summary())
model, tokenizer = load_model(model_id, smoke=smoke)
device = next(model.parameters()).device
text = "\n\n".join(load_course_data()["response"])
ids = tokenizer(text, verbose=False)["input_ids"][: batch_size * seq_len]  # one long text, cut below
batch = torch.tensor(ids, device=device).view(batch_size, seq_len)
n_params = sum(p.numel() for p in model.parameters())
print(
    f"{'embedded tiny model' if is_embedded(model) else model_id}: {n_params:,} parameters; "
    f"batch {tuple(batch.shape)} = {batch.numel():,} tokens"
)
helpers.record("model_params", n_params)

# %% [markdown]
# ## Measure one training step
#
# `measure` wraps a block of code and counts, exactly: the bytes of the parameters, of their
# gradients and of AdamW's states when the block ends, and the bytes autograd held for the
# backward pass at the block's peak (through saved-tensor hooks: every saved tensor, each storage
# once, parameters excluded). On a GPU it also reads the allocator's peak.

# %%
from helpers.memory import measure


def train_step(model, label, autocast_dtype=None):
    """One forward, backward and AdamW step on `batch`, measured; fresh optimizer each time."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.zero_grad(set_to_none=True)
    with measure(label, model=model, optimizer=optimizer) as readout:
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
    return readout


model.train()
fp32 = train_step(model, "fp32")
print(fp32)

# %% [markdown]
# Four lines make the bill. The weights are 4 bytes per parameter in fp32. The gradients are the
# same size again. AdamW keeps two running averages per parameter: 8 bytes. Activations depend
# on the batch, the sequence length and the architecture, and on a small model they are often the
# largest line of all.
#
# ## The estimator, before anything runs
#
# `estimate_training_memory` predicts the same lines from the model's configuration alone: it
# walks one decoder layer op by op (norms, projections, rotary embedding, attention, MLP) and adds
# what each op saves for backward, in the dtype it saves it in. Side by side with the measurement:

# %%
from helpers.estimate import estimate_training_memory

where = "cuda" if device.type == "cuda" else "cpu"  # dropout masks and kernels differ by device


def predicted_vs_measured(readout, **settings):
    """A table of each component: measured, predicted, error."""
    e = estimate_training_memory(model.config, batch_size=batch_size, seq_len=seq_len, device=where, **settings)
    print(f"{readout.label}: {'component':12} {'measured MiB':>13} {'predicted MiB':>14} {'error':>8}")
    errors = {}
    for name in ("weights", "gradients", "optimizer", "activations"):
        m, p = readout[name], e[name]
        errors[name] = (p - m) / m
        print(f"{'':{len(readout.label)}}  {name:12} {m / MIB:13.2f} {p / MIB:14.2f} {100 * errors[name]:+7.2f}%")
    return e, errors


estimate_fp32, errors_fp32 = predicted_vs_measured(fp32, precision="fp32")
helpers.record("activations_mib_fp32", round(fp32["activations"] / MIB, 3))
helpers.record("activation_error_pct_fp32", round(100 * errors_fp32["activations"], 3))

# %% [markdown]
# The weights, gradients and optimizer lines match to the byte (AdamW also keeps a 4-byte step
# counter per tensor, which the estimator leaves out). The activation line is where every other
# tool guesses; here it is computed from the architecture and lands within a fraction of a percent.
#
# ## Where the activations go
#
# The estimator can say which parts of the model hold them. Note the loss's line: it keeps the
# log-probabilities of every token over the whole vocabulary, in fp32, whatever the precision.

# %%
parts = sorted(estimate_fp32.activation_parts.items(), key=lambda kv: -kv[1])
total = estimate_fp32.activations
for name, b in parts:
    print(f"{name:28} {b / MIB:9.2f} MiB  {100 * b / total:5.1f}%")
helpers.record("loss_logprobs_share_pct", round(100 * estimate_fp32.activation_parts["loss log-probs"] / total, 1))

# %% [markdown]
# ## Two techniques, measured and predicted
#
# Mixed precision runs the matrix multiplications in 16 bits, so most activations shrink to 2
# bytes (notebook 02). Gradient checkpointing keeps only each layer's input and recomputes the rest
# during backward (notebook 03). Measure both on the same batch:

# %%
from helpers.memory import compare, plot

half = torch.bfloat16 if machine.precision.name != "fp16" else torch.float16
label = "bf16" if half == torch.bfloat16 else "fp16"
mixed = train_step(model, label, autocast_dtype=half)
estimate_mixed, errors_mixed = predicted_vs_measured(mixed, precision=label)

model.config.use_cache = False  # a generation cache makes no sense while recomputing layers
model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
checkpointed = train_step(model, f"{label} + checkpointing", autocast_dtype=half)
model.activation_checkpointing_disable()
estimate_ckpt, errors_ckpt = predicted_vs_measured(checkpointed, precision=label, checkpointing=True)

print(
    f"\n{label} activations are {mixed['activations'] / fp32['activations']:.2f} x fp32's; "
    f"with checkpointing {checkpointed['activations'] / fp32['activations']:.2f} x\n"
)
print(compare([fp32, mixed, checkpointed]))
helpers.record("activations_mib_mixed", round(mixed["activations"] / MIB, 3))
helpers.record("activations_mib_checkpointed", round(checkpointed["activations"] / MIB, 3))
helpers.record(
    "activation_error_pct_worst",
    round(100 * max(abs(e["activations"]) for e in (errors_fp32, errors_mixed, errors_ckpt)), 3),
)

# %%
ax = plot([fp32, mixed, checkpointed])
_ = ax.set_title("One training step, measured")

# %% [markdown]
# Why does mixed precision not halve the activations? Under autocast the residual stream, the
# norms and the loss's log-probabilities stay in fp32, and each matrix multiplication keeps a
# 16-bit copy of its fp32 weight for the backward pass (the estimator's "weight casts" line).
# Checkpointing cuts much deeper, at the price of a second forward pass through each layer during
# backward: compare the time row.
#
# ## Real models on a real card, before loading them
#
# The estimator needs no weights, only shapes, so it can answer for models far too large for this
# machine. On a GPU the peak also holds what is not saved for backward (the logits at the end of
# the forward, one recomputed layer when checkpointing), plus the CUDA context and the allocator's
# slack; `total` adds them up and `fits` compares with the card.

# %%
for name in ("SmolLM2-135M", "Qwen2.5-0.5B", "Qwen2.5-1.5B"):
    e = estimate_training_memory(name, batch_size=4, seq_len=512, precision="fp16")
    print(
        f"{name:13} full fine-tune, fp16 mixed, 4 x 512 tokens: {e.total / GIB:6.2f} GiB -> fits a T4: {e.fits('T4')}"
    )

# %% [markdown]
# ## A plan for a 7B model on a T4
#
# `plan` applies techniques in order of what they cost until the job fits: mixed precision, then
# checkpointing, then a smaller per-device batch with gradient accumulation (the effective batch
# stays the same), then an 8-bit optimizer, then LoRA, then QLoRA.

# %%
from helpers.plan import format_plan, plan

steps = plan("Mistral-7B", "T4", batch_size=4, seq_len=512)
print(format_plan(steps, "T4"))
helpers.record("plan_7b_t4_last_step", steps[-1].technique)
helpers.record("plan_7b_t4_total_gib", round(steps[-1].estimate.total / GIB, 2))

# %% [markdown]
# Every technique short of QLoRA leaves a 7B model above a T4's 14.75 GiB: its weights alone are
# 27 GiB in fp32 and 13.5 GiB in 16 bits, before a single activation. In 4 bits they take under
# 5 GiB, with room left to train. Notebooks 02 to 05 take
# each step of this plan apart, and notebook 08 runs it.
#
# The same answer from a terminal, in well under a second:
#
# ```
# python -m helpers plan --model Mistral-7B --gpu T4 --seq-len 512 --batch-size 4
# ```
#
# ## The allocation timeline, on a GPU
#
# `measure` gives totals. PyTorch can also record every allocation and free of one step, each with
# the line of code that made it, and draw them as a timeline: the weights as a flat band, the
# activations rising through the forward pass and falling through backward, AdamW's states
# appearing at the first `optimizer.step()`. The cell below records one fp32 step and saves the
# snapshot; download `build/memory_snapshot.pickle` and drop it on https://pytorch.org/memory_viz
# (it runs in your browser; nothing is uploaded). On a CPU it says so and skips.

# %%
from pathlib import Path

snapshot = Path("build/memory_snapshot.pickle")
if device.type == "cuda":
    torch.cuda.memory._record_memory_history(max_entries=100_000)  # every alloc and free from here, with its stack
    train_step(model, "fp32, recorded")
    snapshot.parent.mkdir(exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(snapshot))
    torch.cuda.memory._record_memory_history(enabled=None)  # stop recording
    print(f"wrote {snapshot.resolve()}: drop it on https://pytorch.org/memory_viz to see the timeline")
else:
    print("The allocation timeline needs a GPU (CUDA's allocator keeps it): nothing recorded on this machine.")

# %% [markdown]
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Set your student id first: the last two questions give each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q01_1
answer_q01_1 = None  # one letter, in quotes
check("q01_1", answer_q01_1)

# %%
# QUICK CHECK q01_2
answer_q01_2 = None  # a number, from your own numbers (set student_id first)
check("q01_2", answer_q01_2, student_id=student_id)

# %%
# QUICK CHECK q01_3
answer_q01_3 = None  # a number, from your own numbers
check("q01_3", answer_q01_3, student_id=student_id)

# %% [markdown]
# ## In this notebook we:
#
# - measured one training step line by line: weights, gradients, AdamW states and activations;
# - predicted the same lines from the configuration alone, with the error beside each;
# - saw where activations go, and that the loss's fp32 log-probabilities are a large share;
# - measured what mixed precision and gradient checkpointing save, and predicted it;
# - asked the estimator about real models on a T4, and got a plan that fits a 7B model.
