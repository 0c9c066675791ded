# %% [markdown]
# # 01 · Memory anatomy: where every byte of a training step goes
#
# **Hardware:** any runtime; a T4 shows the GPU's own peak beside the exact count.
# **Time:** about 2 minutes on a T4 including the install (an estimate: not yet timed on one); 10-21 s on a CPU (measured on 2 machines: 10 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 21 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# "CUDA out of memory" says a job did not fit, not why. This notebook measures each line of one
# training step's bill (weights, gradients, optimizer states, activations), predicts it from the
# model's shape before anything runs, and plans a 7B fine-tune onto a T4, step by step. Sizes are in
# MiB and GiB (2^20 and 2^30 bytes; notebook 00).

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
smoke = (
    False  # True: use the small model that ships with the course, on any machine (quick; the course's own tests set it)
)
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model; needs a GPU and the Hub
per_device_batch = 4  # sequences per step
seq_len = 256  # tokens per sequence: 4 x 256 = 1,024 tokens per step
plan_model = "Mistral-7B"  # a model from the course catalog, for the plan at the end
plan_card = "T4"  # the card to plan for: "T4", "L4", "A100-40GB", "A100-80GB", ...

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## The model and one batch
#
# The batch is the course dataset's text, tokenized and cut into `per_device_batch` rows of
# `seq_len` tokens (no padding, as in packed training), so every row costs the same.

# %%
import torch

from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.data import load_course_data
from helpers.models import is_embedded, load_model

model, tokenizer = load_model(model_id, smoke=smoke)
device = next(model.parameters()).device
text = "\n\n".join(load_course_data()["response"])
ids = tokenizer(text, verbose=False)["input_ids"][: per_device_batch * seq_len]  # one long text, cut below
batch = torch.tensor(ids, device=device).view(per_device_batch, seq_len)
n_params = sum(p.numel() for p in model.parameters())
print(
    f"{'the course small model' if is_embedded(model) else model_id}: {n_params:,} parameters; "
    f"batch {tuple(batch.shape)} = {batch.numel():,} tokens"
)

# %% [markdown]
# ## Measure one training step
#
# A step in plain PyTorch: forward, loss, backward, AdamW. `measure` counts the bytes of parameters,
# gradients and AdamW states, and the bytes autograd held for backward at its peak (on a GPU, the
# allocator's peak too). Each measured step follows an unmeasured warm-up step.

# %%
from helpers.memory import measure


def train_step(model, label, autocast_dtype=None):
    """One warm-up step, then one forward, backward and AdamW step on `batch`, measured."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):  # the first pass is the warm-up; the second one's readout is returned
        model.zero_grad(set_to_none=True)
        optimizer.state.clear()  # each step starts from nothing, so AdamW's states appear in the count
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
# Weights: 4 bytes a parameter in fp32; gradients the same; AdamW two running averages, 8 bytes.
# Activations depend on batch, sequence length and architecture.
#
# ## The estimator, before anything runs
#
# `estimate_training_memory` predicts the same lines from the configuration alone, op by op:

# %%
from helpers.estimate import estimate_training_memory

where = "cuda" if device.type == "cuda" else "cpu"  # dropout masks and kernels differ by device


def predicted_vs_measured(readout, **settings):
    """Print each component measured, predicted, and the error; return the estimate and the errors."""
    e = estimate_training_memory(
        model.config, per_device_batch=per_device_batch, seq_len=seq_len, device=where, **settings
    )
    print(f"{readout.label}: {'component':12} {'measured MiB':>13} {'predicted MiB':>14} {'error':>8}")
    errors = {}
    for name in ("weights", "gradients", "optimizer", "activations"):
        m, p = readout[name], e[name]
        errors[name] = (p - m) / m
        print(f"{'':{len(readout.label)}}  {name:12} {m / MIB:13.2f} {p / MIB:14.2f} {100 * errors[name]:+7.2f}%")
    return e, errors


estimate_fp32, errors_fp32 = predicted_vs_measured(fp32, precision="fp32")

# %% [markdown]
# Weights and gradients match to the byte; the optimizer line misses only AdamW's 4-byte step counter
# per tensor; read the activation error in the last column.
#
# ## Where the activations go
#
# Note the loss's line: log-probabilities of every token over the whole vocabulary, in fp32.

# %%
parts = sorted(estimate_fp32.activation_parts.items(), key=lambda kv: -kv[1])
total = estimate_fp32.activations
for name, b in parts:
    print(f"{name:28} {b / MIB:9.2f} MiB  {100 * b / total:5.1f}%")
loss_share = estimate_fp32.activation_parts["loss log-probs"] / total

# %% [markdown]
# ## Two techniques, measured and predicted
#
# Mixed precision computes in 16 bits (notebook 02); checkpointing keeps each layer's input and
# recomputes the rest in backward (notebook 03). Both on the same batch:

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
print()
print(compare([fp32, mixed, checkpointed]))

# %%
ax = plot([fp32, mixed, checkpointed])
_ = ax.set_title("one training step, measured")

# %% [markdown]
# **What to see:** only the activations move. Mixed precision trims them but does not halve them
# (norms, residual stream and log-probabilities stay fp32; projections keep 16-bit weight copies);
# checkpointing cuts deeper. Its price is a second forward pass per layer. The time row above
# includes the counting hooks, so time the steps without them, median of 3. On a shared machine the
# milliseconds move from run to run; notebook 03 counts the arithmetic itself, which does not.

# %%
import statistics
import time


def step_seconds(autocast_dtype=None, repeats=3):
    """Median wall time of `repeats` forward + backward passes on `batch` (no optimizer, no hooks)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()  # wait for the GPU before reading the clock
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return statistics.median(times)


timed = {label: step_seconds(half)}
model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
timed[f"{label} + checkpointing"] = step_seconds(half)
model.activation_checkpointing_disable()
for name, seconds in timed.items():
    print(f"{name:22} {1000 * seconds:7.1f} ms per forward + backward")
checkpointing_time_ratio = timed[f"{label} + checkpointing"] / timed[label]
print(
    f"on this machine, checkpointing took {checkpointing_time_ratio:.2f} x the time (medians of 3) for "
    f"{checkpointed['activations'] / mixed['activations']:.2f} x the activations"
)

# %% [markdown]
# ## Your loop or the Trainer's: what the loop keeps
#
# The Trainer computes the loss and lets the model's output go before backward. A loop written by
# hand usually keeps it: `outputs = model(**batch)` then `outputs.loss.backward()` holds
# `outputs.logits` (batch x sequence x vocabulary) through backward and the optimizer's step, and
# the previous step's until the next forward returns. Measure both loops' peak with the allocator
# (`track_allocations` counts what torch's CPU allocator hands out, as `torch.cuda.max_memory_allocated`
# does on a card), and ask the estimator with `loop="trainer"` and `loop="custom"`:

# %%
from helpers.memory import track_allocations


def loop_peak(keep_outputs):
    """Peak bytes allocated over two steps of a loop, above what was there before (weights, states)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept = []

    def step():
        outputs = model(input_ids=batch, labels=batch)
        kept[:] = [outputs] if keep_outputs else []  # a hand-written loop's `outputs` variable
        loss = outputs.loss
        del outputs  # the Trainer keeps only the loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the warm-up creates AdamW's states
    kept.clear()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step(), step()
        return torch.cuda.max_memory_allocated() - start
    with track_allocations() as allocated:
        step(), step()
    return allocated.peak


loops = {"trainer": loop_peak(keep_outputs=False), "custom": loop_peak(keep_outputs=True)}
held_measured = loops["custom"] - loops["trainer"]
estimates = {
    loop: estimate_training_memory(
        model.config, per_device_batch=per_device_batch, seq_len=seq_len, precision="fp32", device=where, loop=loop
    )
    for loop in loops
}
held_predicted = estimates["custom"].allocated - estimates["trainer"].allocated
for loop, peak in loops.items():
    print(f"loop={loop!r:10} measured step peak above the weights and states: {peak / MIB:7.2f} MiB")
print(
    f"the hand-written loop holds {held_measured / MIB:.2f} MiB more; the estimator says {held_predicted / MIB:.2f} MiB"
)

# %% [markdown]
# Which one is yours? If your code binds the model's output to a name that outlives
# `loss.backward()`, it is `loop="custom"`: pass that to `estimate_training_memory` and
# `python -m helpers plan --loop custom`. Or write `loss = model(**batch).loss`, and the logits go
# as soon as the loss is computed.

# %% [markdown]
# ## Real models on a real card, before loading them
#
# The estimator needs only shapes. On a GPU, `total` adds what is not saved for backward (logits,
# one recomputed layer), the CUDA context and the allocator's slack; `fits` compares with the card.

# %%
for name in ("SmolLM2-135M", "Qwen2.5-0.5B", "Qwen2.5-1.5B"):
    e = estimate_training_memory(name, per_device_batch=4, seq_len=512, precision="fp16", gpu="T4")
    print(f"{name:13} full fine-tune, fp16, 4 x 512 tokens: {e.total / GIB:6.2f} GiB -> fits a T4: {e.fits('T4')}")

# %% [markdown]
# ## A plan for a 7B model on a T4
#
# `plan` starts from the job as asked (a full fine-tune in fp32, 4 x 512 tokens) and applies
# techniques in order of cost until it fits: mixed precision, a fused loss (the logits never held
# whole), gradient checkpointing, a smaller micro-batch with gradient accumulation (left out when it
# would not lower the estimate), an 8-bit optimizer, LoRA, QLoRA. The table lists the steps taken
# and what each costs you.

# %%
from helpers.plan import format_plan, plan

steps = plan(plan_model, plan_card, per_device_batch=4, seq_len=512, precision="fp32")
print(f"{plan_model}, full fine-tune, 4 x 512 tokens, starting in fp32")
print(format_plan(steps, plan_card))
taken = [s.technique for s in steps]
skipped = steps.left_out  # the techniques plan tried and left out
print("tried and left out, since it would not lower the estimate:", ", ".join(skipped) or "nothing")

# %% [markdown]
# What each step changed, read from the estimates: the total, and the line that moved most.

# %%
bill_lines = ("weights", "gradients", "optimizer", "activations")
plan_changes = {}  # technique -> change of the predicted total, GiB
for before, after in zip(steps, steps[1:]):
    moved = {k: (getattr(after.estimate, k) - getattr(before.estimate, k)) / GIB for k in bill_lines}
    most = max(moved, key=lambda k: abs(moved[k]))
    change = plan_changes[after.technique] = (after.estimate.total - before.estimate.total) / GIB
    direction = "more" if change > 0 else "less" if change < 0 else "no change"
    print(f"{after.technique:24} {abs(change):7.2f} GiB {direction:9} (most of it: {most} {moved[most]:+.2f} GiB)")

# %%
import matplotlib.pyplot as plt

from helpers.catalog import gpu_bytes

card_gib = gpu_bytes(plan_card) / GIB
totals_gib = [s.estimate.total / GIB for s in steps]
fig, ax = plt.subplots(figsize=(8, 3.2))
ax.bar(taken, totals_gib, color=["tab:green" if s.fits else "tab:red" for s in steps])
ax.axhline(card_gib, color="black", ls="--", label=f"{plan_card}: {card_gib:.2f} GiB")
for i, t in enumerate(totals_gib):
    ax.annotate(f"{t:.1f}", (i, t), ha="center", va="bottom", fontsize=8)
ax.set_yscale("log")  # 100 GiB and 7 GiB on one axis
ax.set(ylabel="predicted total (GiB, log scale)", title=f"{plan_model} on a {plan_card}, one technique at a time")
ax.tick_params(axis="x", labelrotation=20)
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** bars above the dashed line do not fit. At 7B the bill is about 16 bytes a parameter
# of fp32 weights, gradients and AdamW states. Mixed precision leaves those in fp32 (the master
# weights) and computes in 16 bits, keeping 16-bit copies beside fp32 tensors: the lines before the
# plot say whether that lowered or raised this job's bill. Checkpointing shrinks only the activations.
# The 8-bit optimizer cuts the states; only 4-bit weights (QLoRA) get under the line. From a terminal:
# `python -m helpers plan --model Mistral-7B --gpu T4 --seq-len 512`.
#
# ## Your own plan, with controls
#
# Pick a model (a catalog name such as `Llama-3-8B`, or a Hub id when the Hub answers; press Enter), a
# method, the LoRA rank, a precision, the optimizer, a fused loss, the per-device batch, the sequence
# length, checkpointing, your loop and a card: the bill is redrawn and the verdict said again at each
# change. Under the bill: the stack the verdict assumes and, when the job does not fit, the changes
# that make it fit, cheapest first, each with its predicted total. The bars stack what the card must
# hold at its peak; the solid line is what PyTorch can use on the card, the dashed one leaves the
# estimator's known error free. Where the controls do not show, the cell still prints the bill for
# its starting values: change them in the call.

# %%
from helpers.planner import planner

planner("Qwen2.5-1.5B", "T4", method="qlora", per_device_batch=4, seq_len=1024, checkpointing=True)

# %% [markdown]
# Try it: double the sequence length and watch the red block (activations and the logits) grow
# while the weights stay put; switch the loop to `custom` and see what holding `outputs` costs;
# move the card to an A100 and see the attention kernel change what the activations cost.
#
# ## The allocation timeline, on a GPU
#
# On a GPU, PyTorch records every allocation of one step; the cell saves
# `build/memory_snapshot.pickle` for https://pytorch.org/memory_viz (it runs in your browser). On a
# CPU it skips.

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
# Replace `None` with your answer and run the cell: it answers at once. If your instructor grades
# these, set your student id, run all the cells, then download the notebook (File > Download >
# Download .ipynb) and hand it in.

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

# %%
# QUICK CHECK q01_4
answer_q01_4 = None  # one letter, in quotes
check("q01_4", answer_q01_4)

# %% [markdown]
# The next cell saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
readouts = {"fp32": fp32, "mixed": mixed, "checkpointed": checkpointed}
helpers.record("model_params", n_params)
helpers.record(
    "bill_mib",
    {
        k: {n: round(r[n] / MIB, 3) for n in ("weights", "gradients", "optimizer", "activations")}
        for k, r in readouts.items()
    },
)
helpers.record("step_seconds", {k: round(v, 5) for k, v in timed.items()})
helpers.record("checkpointing_time_ratio", round(checkpointing_time_ratio, 3))
helpers.record("activations_mib_fp32", round(fp32["activations"] / MIB, 3))
helpers.record("activations_mib_mixed", round(mixed["activations"] / MIB, 3))
helpers.record("activations_mib_checkpointed", round(checkpointed["activations"] / MIB, 3))
helpers.record("activation_error_pct_fp32", round(100 * errors_fp32["activations"], 3))
helpers.record(
    "activation_error_pct_worst",
    round(100 * max(abs(e["activations"]) for e in (errors_fp32, errors_mixed, errors_ckpt)), 3),
)
helpers.record("weight_error_pct", round(100 * errors_fp32["weights"], 6))
helpers.record("loss_logprobs_share_pct", round(100 * loss_share, 1))
helpers.record(
    "loop_held_mib", {"measured": round(held_measured / MIB, 3), "predicted": round(held_predicted / MIB, 3)}
)
helpers.record("plan_steps", taken)
helpers.record("plan_skipped", skipped)
helpers.record("plan_totals_gib", [round(t, 2) for t in totals_gib])
helpers.record("plan_fits", [s.fits for s in steps])
helpers.record("plan_changes_gib", {k: round(v, 3) for k, v in plan_changes.items()})
helpers.record("plan_card_gib", round(card_gib, 3))
helpers.record("plan_7b_t4_last_step", steps[-1].technique)
helpers.record("plan_7b_t4_total_gib", round(steps[-1].estimate.total / GIB, 2))

# %% [markdown]
# ## In this notebook we:
#
# - measured one step's bill line by line, and predicted it from the configuration alone;
# - saw the loss's fp32 log-probabilities take a large share of a small model's activations;
# - measured what mixed precision and checkpointing save, and timed checkpointing's cost;
# - planned a 7B fine-tune onto a T4: only 4-bit weights get under the card's line.
#
# ## Change this, predict, run
#
# 1. Set `seq_len = 512` in the parameters cell. Predict which bars of the "one training step" plot
#    grow, and by how much. Run all and compare.
# 2. Set `plan_card = "A100-80GB"`. Predict the step at which the plan stops now. Run all.
#
# Next: notebook 02, mixed precision.
