# %% [markdown]
# # 02 · Mixed precision: fp32, fp16 and bf16, measured
#
# **Hardware:** any runtime. On a T4 it measures fp32, fp16 and bf16; on a CPU, fp32 against bf16 on
# the small model that ships with the course.
# **Time:** about 2 minutes on a T4 including the install (an estimate: not yet timed on one); 10-20 s on a CPU (measured on 2 machines: 10 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 20 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# Claim: 16 bits halve the memory of what they cover, and run faster on a GPU. Below: how fp16 breaks,
# memory and time per precision, and a fine-tune with the Trainer recipe written out.

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
per_device_batch = 4  # sequences per micro-batch
seq_len = 256  # tokens per sequence: 4 x 256 = 1,024 tokens per step
timing_steps = 3  # training steps timed per precision; the median is reported
max_steps = 20  # optimizer steps of the fine-tune at the end (the course's own tests run 4)
learning_rate = 5e-5  # on a real model: 5e-5 for a full fine-tune (as here), 2e-4 for LoRA or QLoRA
tiny_learning_rate = 3e-3  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## Three formats, side by side
#
# A float spends its bits on *range* (how large, how small) and *precision* (how fine). fp16 keeps
# precision but a narrow range; bf16 keeps fp32's range and gives up precision:

# %%
import torch

from helpers import MIB  # bytes in a MiB (2**20)

formats = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
for name, dtype in formats.items():
    info = torch.finfo(dtype)
    smallest = torch.nextafter(torch.zeros((), dtype=dtype), torch.ones((), dtype=dtype)).item()
    print(
        f"{name}: {info.bits} bits, largest {info.max:.4g}, smallest above zero {smallest:.3g}, "
        f"gap after 1.0 {info.eps:.3g}"
    )

# %% [markdown]
# Past 65504, fp16 gives infinity: to an activation, an attention score or a gradient.

# %%
big = torch.tensor(70000.0)
print("70000 stored in fp16:", big.half().item(), "| in bf16:", big.bfloat16().item())

row = torch.full((1, 512), 12.0)  # one row of 512 activations, each 12: the dot product is 512 x 144
print(
    "dot product in fp32:",
    (row @ row.T).item(),
    "| in fp16:",
    (row.half() @ row.half().T).item(),
    "| in bf16:",
    (row.bfloat16() @ row.bfloat16().T).item(),
)
scores = torch.tensor([(row.half() @ row.half().T).item(), 1.0])  # an attention row holding that score
probabilities = torch.softmax(scores, dim=0)
print("softmax over those scores:", probabilities.tolist())

# %% [markdown]
# bf16 stores 70000 as 70144: coarse, but finite. The fp16 infinity turns the softmax into `nan`,
# which spreads to the loss and every weight.
#
# ## The other end: gradients that vanish
#
# Below about 6e-8, fp16 *underflows* to zero. One gradient of 1e-4 x 1e-4 = 1e-8:

# %%
x = torch.full((4,), 1e-4, dtype=torch.float16)  # a small activation
w16 = torch.ones(4, dtype=torch.float16, requires_grad=True)
w32 = torch.ones(4, requires_grad=True)


def loss_of(w, scale=1.0):
    # the product runs in the weight's precision; the loss itself is fp32, as under autocast
    return (w * x.to(w.dtype)).float().sum() * 1e-4 * scale


loss_of(w32).backward()
loss_of(w16).backward()
fp16_grad = w16.grad[0].item()
print("gradient in fp32:", w32.grad[0].item(), "| the same gradient in fp16:", fp16_grad)

# %% [markdown]
# **Loss scaling** is the fix: multiply the loss by a large S before backward, so the gradients fit
# in fp16, then divide them by S in fp32 before the optimizer step.

# %%
scale = 2.0**16
w16.grad = None
loss_of(w16, scale).backward()
recovered = w16.grad[0].float().item() / scale  # unscale in fp32
error = abs(recovered - w32.grad[0].item()) / w32.grad[0].item()
print(
    f"fp16 gradient with the loss x {scale:.0f}: {w16.grad[0].item():.4g}; divided back in fp32: "
    f"{recovered:.4g} (fp32 reference {w32.grad[0].item():.4g}, relative error {error:.1e})"
)

# %% [markdown]
# A fixed S can be too large: the gradients overflow instead. `GradScaler` (the Trainer's, with
# `fp16=True`) **skips the step** on an infinity and halves S, and doubles S after a run of clean
# steps. A small activation, then one that overflows:

# %%
w = torch.nn.Parameter(torch.ones(4))  # fp32 master weights
optimizer = torch.optim.SGD([w], lr=1.0)
steps_taken = []
optimizer.register_step_post_hook(lambda *_: steps_taken.append(1))  # counts the optimizer steps that ran
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)  # on a GPU, the same with "cuda"

for activation in (1e-4, 3e4):
    taken_before, s_before = len(steps_taken), scaler.get_scale()
    loss = (w.half() * torch.full((4,), activation, dtype=torch.float16)).float().sum() * 1e-4
    scaler.scale(loss).backward()  # backward through the fp16 forward, scaled by S
    scaler.unscale_(optimizer)  # divide the gradients by S (in fp32) and look for infinities
    grad = w.grad[0].item()
    scaler.step(optimizer)  # skipped when a gradient is inf or nan
    scaler.update()  # halve S after a skipped step
    optimizer.zero_grad()
    stepped = len(steps_taken) > taken_before
    print(
        f"activation {activation:g}: unscaled gradient {grad:.4g}, "
        f"optimizer step {'taken' if stepped else 'SKIPPED'}, scale {s_before:.0f} -> {scaler.get_scale():.0f}"
    )
print(f"S doubles again after {scaler.get_growth_interval()} clean steps in a row")

# %% [markdown]
# bf16 has fp32's range and needs no scaler: the first choice from compute capability 8.0. A T4
# (7.5) runs fp16 on its tensor cores and only emulates bf16.
#
# ## Memory and speed on a real model
#
# The model in fp32, and the course dataset as one token stream (an end-of-text token after each
# row) cut into blocks of `seq_len`: `pack_course_data` from notebook 03 on.

# %%
from helpers.data import load_course_data
from helpers.models import is_embedded, load_model

model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
model.train()
if is_embedded(model):  # its 0.3M weights need far larger steps than a real model's
    print(
        f"tiny model: learning rate {tiny_learning_rate:g}, not a real model's {learning_rate:g} (see the parameters cell)"
    )
    learning_rate = tiny_learning_rate
device = next(model.parameters()).device
rows = load_course_data()
ids = [
    t
    for r in tokenizer([r["instruction"] + "\n" + r["response"] for r in rows])["input_ids"]
    for t in r + [tokenizer.eos_token_id]
]  # every row, one long stream of tokens
blocks = torch.tensor(ids[: (len(ids) // seq_len) * seq_len]).view(-1, seq_len)  # (n_blocks, seq_len)
batch = blocks[:per_device_batch].clone().to(device)  # a copy: a view would hold the whole stream's storage
print(f"{len(blocks)} blocks of {seq_len} tokens; one batch: {tuple(batch.shape)} on {device}")

# %% [markdown]
# ### Weights
#
# In 16 bits a weight takes 2 bytes, not 4:

# %%
import copy

weight_bytes = {"fp32": sum(p.nbytes for p in model.parameters())}
half_model = copy.deepcopy(model).to(torch.bfloat16)
weight_bytes["bf16"] = sum(p.nbytes for p in half_model.parameters())
del half_model
for name, b in weight_bytes.items():
    print(f"weights in {name}: {b / MIB:8.2f} MiB")

# %% [markdown]
# `bf16=True` / `fp16=True` is *mixed* precision: the weights stay in fp32 and each product casts
# its inputs to 16 bits, so weights do **not** shrink (unless the model is loaded in 16 bits, as
# LoRA does in notebook 05).
#
# ### Activations
#
# One step per precision, measured, beside the estimator (notebook 01); a CPU compares fp32 with
# bf16 only (its fp16 autocast is not what a GPU does).

# %%
from helpers.estimate import estimate_training_memory
from helpers.memory import compare, measure

on_gpu = device.type == "cuda"
precisions = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
if not on_gpu:
    del precisions["fp16"]  # fp16 autocast on a CPU is not what a GPU does: compare fp32 with bf16 there


def training_step(dtype):
    """Forward under autocast (none for fp32), then backward; gradients land in fp32 as always."""
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    return loss


for dtype in precisions.values():
    training_step(dtype)  # warm-up, so the readouts below do not include first-call costs
readouts = []
for name, dtype in precisions.items():
    model.zero_grad(set_to_none=True)
    with measure(name, model=model) as readout:
        training_step(dtype)
    readouts.append(readout)
model.zero_grad(set_to_none=True)
print(compare(readouts))
activations = {r.label: r["activations"] for r in readouts}
predicted = {
    r.label: estimate_training_memory(
        model.config, per_device_batch=per_device_batch, seq_len=seq_len, precision=r.label, device=device.type
    ).activations
    for r in readouts
}
for name in activations:
    print(
        f"{name}: activations measured {activations[name] / MIB:7.2f} MiB, estimated {predicted[name] / MIB:7.2f} MiB, "
        f"{activations[name] / activations['fp32']:.2f} x fp32"
    )

# %% [markdown]
# What autocast covers is halved, the whole step is not: norms, softmax and log-probabilities stay
# fp32, and projections keep 16-bit copies of their inputs. One MLP block in fp32, with bf16 weights,
# and under bf16 autocast:

# %%
from helpers.saved_tensors import track_saved_tensors

mlp = model.model.layers[0].mlp
h = torch.randn(per_device_batch, seq_len, model.config.hidden_size, device=device, requires_grad=True)
mlp_bf16 = copy.deepcopy(mlp).to(torch.bfloat16)

with track_saved_tensors(mlp) as saved_fp32:
    out = mlp(h)
out.sum().backward()  # each backward frees the graph it measured
with track_saved_tensors(mlp_bf16) as saved_bf16:
    out = mlp_bf16(h.to(torch.bfloat16))
out.sum().backward()
with torch.autocast(device.type, dtype=torch.bfloat16), track_saved_tensors(mlp) as saved_autocast:
    out = mlp(h)
out.sum().backward()
model.zero_grad(set_to_none=True)
mlp_ratio = saved_bf16.bytes / saved_fp32.bytes
autocast_ratio = saved_autocast.bytes / saved_fp32.bytes
print(
    f"one MLP block saves {saved_fp32.bytes / MIB:.2f} MiB in fp32, {saved_bf16.bytes / MIB:.2f} MiB in bf16 "
    f"({mlp_ratio:.3f} x), {saved_autocast.bytes / MIB:.2f} MiB under bf16 autocast ({autocast_ratio:.3f} x)"
)

# %% [markdown]
# ### Step time
#
# A full step per precision, timed `timing_steps` times in turns after the warm-up; the median counts.

# %%
import statistics
import time

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)


def timed_step(dtype):
    if on_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    training_step(dtype)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if on_gpu:
        torch.cuda.synchronize()  # wait for the GPU before reading the clock
    return time.perf_counter() - start


times = {name: [] for name in precisions}
for _ in range(timing_steps):
    for name, dtype in precisions.items():
        times[name].append(timed_step(dtype))
step_seconds = {name: statistics.median(t) for name, t in times.items()}
for name, s in step_seconds.items():
    spread = f"{1000 * min(times[name]):.1f} to {1000 * max(times[name]):.1f}"
    print(
        f"{name}: {s * 1000:8.1f} ms per step, median of {timing_steps} ({spread} ms); {step_seconds['fp32'] / s:.2f} x fp32's speed"
    )

# %% [markdown]
# ### What decides the speed: matrix units
#
# 16 bits are faster only where the hardware multiplies 16-bit matrices itself: tensor cores on a GPU
# (a T4's for fp16, an A100's for fp16 and bf16), and on some CPUs the AMX or AVX512-BF16
# instructions; elsewhere bf16 is converted and computed in fp32, and autocast's casts cost time.
# What this machine has, and one matrix product in each precision, timed 20 times: 1,024 x 1,024
# where the hardware multiplies bf16 matrices itself, smaller on a CPU without bf16 units (a bf16
# product runs in software there, tens of times slower: the cell says by how much it was sized down).

# %%
from helpers.env import cpu_bf16_units

full_size = 1024  # rows (= columns) of each matrix where 16-bit matrix units do the work
# without bf16 units a 1,024 x 1,024 bf16 product takes seconds (3.5 s on an AVX2-only AMD EPYC, 63 x fp32):
# 256 x 256 is 64 x less work, about a second for the 21 products below
size = full_size if on_gpu or cpu_bf16_units() else 256
repeats = 20  # timed products per precision, after one warm-up


def matmul_ms(dtype, n=size, repeats=repeats):
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    runs = []
    for _ in range(repeats + 1):  # the first is a warm-up
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        a @ b
        if on_gpu:
            torch.cuda.synchronize()
        runs.append(1000 * (time.perf_counter() - start))
    return statistics.median(runs[1:]), min(runs[1:]), max(runs[1:])


units = torch.cuda.get_device_name() if on_gpu else ", ".join(cpu_bf16_units()) or "no bf16 matrix instructions"
matmul = {name: matmul_ms(dtype or torch.float32) for name, dtype in precisions.items()}
print(f"{'this GPU' if on_gpu else 'this CPU'}: {units}; {torch.get_num_threads()} threads")
for name, (median, low, high) in matmul.items():
    print(
        f"{name}: {median:7.2f} ms per {size} x {size} matmul (median; {low:.2f} to {high:.2f}), "
        f"{matmul['fp32'][0] / median:.2f} x fp32's speed"
    )
if size < full_size:  # what the full size would have cost: the same work scales with the cube of the size
    scale = (full_size / size) ** 3
    print(
        f"sized down from {full_size:,} x {full_size:,}: this CPU has no bf16 matrix units, so a bf16 product runs in "
        f"software; at full size the {repeats + 1} bf16 products would take about "
        f"{(repeats + 1) * scale * matmul['bf16'][0] / 1000:.0f} s "
        f"here ({scale:.0f} x the work of these)"
    )

# %%
import matplotlib.pyplot as plt

names = list(precisions)
fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(10, 3.2))
x = range(len(names))
mem_ax.bar([i - 0.2 for i in x], [activations[n] / MIB for n in names], width=0.4, label="measured")
mem_ax.bar([i + 0.2 for i in x], [predicted[n] / MIB for n in names], width=0.4, label="estimated")
mem_ax.set(xticks=list(x), xticklabels=names, ylabel="activations of one step (MiB)", title="memory")
mem_ax.legend(fontsize=8)
time_ax.bar(names, [1000 * step_seconds[n] for n in names], color="tab:gray")
time_ax.set(ylabel="one training step (ms, median)", title=f"time on {'this GPU' if on_gpu else 'this CPU'}")
plt.show()

# %% [markdown]
# **What to see:** on the left, 16 bits shrink the activations by less than half, and the estimator
# matches the measurement. On the right, this machine's step times: whether bf16 wins depends on the
# matrix units the cell above named. A T4 or an A100 runs 16 bits on tensor cores; a CPU with AMX or
# AVX512-BF16 can run bf16 matmuls several times faster than fp32, and one without them cannot, while a
# whole step also pays autocast's casts. On a shared machine the milliseconds move from run to run:
# read the medians and their spread. Published figures:
#
# | card | fp32 | 16-bit | source, as of |
# |---|---|---|---|
# | T4, peak | 8.1 TFLOPS | 65 TFLOPS (fp16) | NVIDIA T4 datasheet, 2018 |
# | A100, peak | 19.5 TFLOPS | 312 TFLOPS (fp16, bf16) | NVIDIA A100 datasheet, 2020 |
# | V100, bert-large fine-tune | 57.8 s | 27.5 s with `fp16=True` (2.1 x) | Hugging Face single-GPU training guide, transformers v4.26 docs, Jan 2023 |
#
# A whole step also moves memory and runs fp32 operations, so it gains less than the peak ratio.
#
# ## The Trainer recipe, written out
#
# A short fine-tune as the transformers docs write it: precision from the card (bf16 from compute
# capability 8.0, fp16 below it with a `GradScaler`, neither on a CPU), the seed written down (the
# Trainer's default is 42: say so in your config), the last blocks held out for the loss.

# %%
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback

gpu = machine.gpus[0] if machine.gpus else None  # the card helpers.start() found at the top
use_bf16 = gpu is not None and gpu.capability >= (8, 0)
use_fp16 = gpu is not None and not use_bf16
args = TrainingArguments(
    output_dir="build/checkpoints",  # under build/, which git ignores; save_strategy="no" writes nothing
    per_device_train_batch_size=per_device_batch,
    max_steps=max_steps,
    learning_rate=learning_rate,
    bf16=use_bf16,
    fp16=use_fp16,
    seed=42,
    logging_steps=1,
    logging_first_step=True,
    report_to="none",  # notebook 06 sends this to wandb
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)
train_data = [{"input_ids": b, "labels": b} for b in blocks[:-per_device_batch]]
held_out = blocks[-per_device_batch:].clone().to(device)


def held_out_loss():
    model.eval()
    with torch.no_grad():
        loss = model(input_ids=held_out, labels=held_out).loss.item()
    model.train()
    return loss


loss_before = held_out_loss()
trainer = Trainer(model=model, args=args, train_dataset=train_data)
trainer.remove_callback(PrinterCallback)  # one printed line per step is too many: the plot below shows them
result = trainer.train()
train_losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
loss_after = held_out_loss()
used = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
print(f"trained {result.global_step} steps in {used}; held-out loss {loss_before:.3f} -> {loss_after:.3f}")

# %%
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(range(1, len(train_losses) + 1), train_losses, "o-", label="training loss (each step's batch)")
ax.axhline(loss_before, color="gray", ls="--", label=f"held-out batch before: {loss_before:.2f}")
ax.axhline(loss_after, color="green", ls="--", label=f"held-out batch after: {loss_after:.2f}")
ax.set(xlabel="optimizer step", ylabel="loss (nats per token)", title=f"fine-tune in {used}")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** the held-out loss (dashed lines; text it never trained on) falls: the model is
# learning the course's question-and-answer format. Each step's training loss is noisier: every step
# sees different blocks.
#
# ## The same arguments in one call
#
# `training_args` makes the same precision choice, writes the seed down and says what it chose:

# %%
from helpers.training import training_args

shortcut = training_args(
    "build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    max_steps=max_steps,
    learning_rate=learning_rate,
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)
compared = ["bf16", "fp16", "seed", "per_device_train_batch_size", "max_steps", "learning_rate", "logging_steps",
            "logging_first_step", "report_to", "save_strategy"]  # fmt: skip
differ = [k for k in compared if getattr(args, k) != getattr(shortcut, k)]
print(f"compared {len(compared)} settings: {'all equal' if not differ else f'these differ: {differ}'}")

# %% [markdown]
# `helpers.audit` catches the two classic precision mistakes: bf16 from an A100 recipe on a T4,
# and fp16 on a CPU.

# %%
from helpers.audit import audit

from_a100_recipe = {"bf16": True, "seed": 42, "report_to": "wandb"}
fp16_on_cpu = {"fp16": True, "use_cpu": True, "seed": 42, "report_to": "wandb"}
findings = audit(from_a100_recipe, gpu="T4") + audit(fp16_on_cpu)

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
# QUICK CHECK q02_1
answer_q02_1 = None  # one letter, in quotes
check("q02_1", answer_q02_1)

# %%
# QUICK CHECK q02_2
answer_q02_2 = None  # one letter, in quotes
check("q02_2", answer_q02_2)

# %%
# QUICK CHECK q02_3
answer_q02_3 = None  # one letter, in quotes
check("q02_3", answer_q02_3)

# %%
# QUICK CHECK q02_4
answer_q02_4 = None  # one letter, in quotes
check("q02_4", answer_q02_4)

# %% [markdown]
# The next cell saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
helpers.record("precision", machine.precision.name)
helpers.record("fp16_max", torch.finfo(torch.float16).max)
helpers.record("softmax_of_inf_is_nan", bool(probabilities.isnan().all()))
helpers.record("fp16_overflows_past_max", bool(torch.isinf(big.half())))
helpers.record("bf16_of_70000", big.bfloat16().item())
helpers.record("fp16_grad_without_scaling", fp16_grad)
helpers.record("loss_scaled_grad_relative_error", error)
helpers.record("overflow_step_skipped", not stepped)
helpers.record("loss_scale_after_overflow", scaler.get_scale())
helpers.record("weights_mib", {k: round(v / MIB, 3) for k, v in weight_bytes.items()})
helpers.record("activations_mib", {k: round(v / MIB, 3) for k, v in activations.items()})
helpers.record("activations_predicted_mib", {k: round(v / MIB, 3) for k, v in predicted.items()})
helpers.record("mlp_activation_ratio_bf16", round(mlp_ratio, 4))
helpers.record("mlp_activation_ratio_autocast", round(autocast_ratio, 4))
helpers.record("step_seconds", {k: round(v, 5) for k, v in step_seconds.items()})
helpers.record("matmul_ms", {k: round(v[0], 4) for k, v in matmul.items()})
helpers.record("matmul_size", size)
helpers.record("cpu_bf16_units", list(cpu_bf16_units()))
helpers.record("matrix_units_printed", units)
helpers.record("trained_in", used)
helpers.record("train_losses", [round(x, 4) for x in train_losses])
helpers.record("loss_before", round(loss_before, 4))
helpers.record("loss_after", round(loss_after, 4))
helpers.record("train_loss", round(result.training_loss, 4))
helpers.record("args_differ_from_shortcut", differ)
helpers.record("audit_codes", [f.code for f in findings])

# %% [markdown]
# ## In this notebook we:
#
# - saw fp16 overflow past 65504 and underflow below 6e-8, and loss scaling fix the second;
# - measured weights (halved only when stored in 16 bits), activations (less than halved) and step
#   time, and saw that 16-bit speed needs matrix units that compute in 16 bits (tensor cores, or a
#   CPU's AMX or AVX512-BF16), which this machine's figures show it has or lacks;
# - fine-tuned with `TrainingArguments` written out (held-out loss falling), and got the same
#   arguments from `training_args`.
#
# ## Change this, predict, run
#
# 1. Set `seq_len = 512` in the parameters cell. Predict whether the bf16/fp32 activation ratio goes
#    up, goes down or stays. Run all and check.
# 2. Set `tiny_learning_rate = 5e-5`, a real model's rate (with a real model on a GPU, the other way round:
#    `learning_rate = 5e-4`, ten times a full fine-tune's).
#    Predict whether the held-out loss after the fine-tune lands above or below this run's. Run all and
#    compare.
#
# Next: 03, gradient checkpointing.
