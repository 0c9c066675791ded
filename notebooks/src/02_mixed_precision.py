# %% [markdown]
# # 02 · Mixed precision: fp32, fp16 and bf16, measured
#
# **Hardware:** any runtime. On a T4 it measures fp32, fp16 and bf16 for real; on an A100 or L4 too;
# on a CPU it measures fp32 against bf16 autocast on the embedded tiny model.
# **Time:** about 2 minutes on a T4 including the install; under 20 seconds headless on a CPU.
#
# The claim to test: training in 16 bits instead of 32 halves the memory of what it covers and,
# on a GPU with tensor cores, runs faster. There are two 16-bit formats, and a free T4 supports
# only one of them well. This notebook:
#
# 1. shows what each format can and cannot represent, and the two ways fp16 breaks (overflow and
#    underflow);
# 2. shows what loss scaling does about it, with PyTorch's own `GradScaler`;
# 3. measures weights, activations and step time in each precision on this machine;
# 4. picks the precision for this card, and trains a few steps with it.

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
per_device_batch = 4  # sequences per micro-batch
seq_len = 256  # tokens per sequence: 4 x 256 = 1,024 tokens per step
timing_steps = 3  # training steps timed per precision; the median is reported
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
# ## Where this runs
#
# The card decides which 16-bit format is worth using, so first find out which card this is.

# %%
import helpers
from helpers import MIB  # bytes in a MiB (2**20)
from helpers.env import describe

machine = describe()
print(machine.summary())
helpers.record("precision", machine.precision.name)

# %% [markdown]
# ## Three formats, side by side
#
# A floating-point number spends its bits on a *range* (how large and how small it can get) and a
# *precision* (how finely it can tell two nearby numbers apart). fp32 has plenty of both. fp16
# keeps good precision but a narrow range; bf16 keeps fp32's range and gives up precision. Ask
# PyTorch for the limits instead of memorizing them:

# %%
import torch

formats = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
for name, dtype in formats.items():
    info = torch.finfo(dtype)
    smallest = torch.nextafter(torch.zeros((), dtype=dtype), torch.ones((), dtype=dtype)).item()
    print(
        f"{name}: {info.bits} bits, largest {info.max:.4g}, smallest above zero {smallest:.3g}, "
        f"gap after 1.0 {info.eps:.3g}"
    )
helpers.record("fp16_max", torch.finfo(torch.float16).max)

# %% [markdown]
# fp16's largest number is 65504. Anything beyond it becomes infinity: an activation, a dot
# product inside attention, or a gradient.

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
helpers.record("softmax_of_inf_is_nan", bool(probabilities.isnan().all()))
helpers.record("fp16_overflows_past_max", bool(torch.isinf(big.half())))
helpers.record("bf16_of_70000", big.bfloat16().item())

# %% [markdown]
# bf16 stores 70000 as 70144: coarse, but finite. The infinity is worse than it looks: the next
# softmax turns the whole row into `nan`, and a `nan` spreads to the loss and from there to every
# weight.
#
# ## The other end: gradients that vanish
#
# Late in the backward pass, gradients are products of many small factors. fp16 cannot hold
# anything below about 6e-8; smaller values *underflow* to exactly zero, and that weight stops
# learning. Here one weight's gradient is 1e-4 x 1e-4 = 1e-8, computed in fp16:

# %%
x = torch.full((4,), 1e-4, dtype=torch.float16)  # a small activation
w16 = torch.ones(4, dtype=torch.float16, requires_grad=True)
w32 = torch.ones(4, requires_grad=True)


def loss_of(w, scale=1.0):
    # the product runs in the weight's precision; the loss itself is fp32, as under autocast
    return (w * x.to(w.dtype)).float().sum() * 1e-4 * scale


loss_of(w32).backward()
loss_of(w16).backward()
print("gradient in fp32:", w32.grad[0].item(), "| the same gradient in fp16:", w16.grad[0].item())
helpers.record("fp16_grad_without_scaling", w16.grad[0].item())

# %% [markdown]
# **Loss scaling** is the fix. Multiply the loss by a large number S before the backward pass:
# every gradient is S times larger, high enough for fp16 to hold. Then divide the gradients by S
# in fp32, where the small value is safe, before the optimizer uses them.

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
helpers.record("loss_scaled_grad_relative_error", error)

# %% [markdown]
# A fixed S would sometimes be too large: the scaled gradients would overflow instead. PyTorch's
# `GradScaler` (what the Trainer uses when `fp16=True`) adjusts S as it goes. It checks the
# gradients for infinities before each optimizer step; if it finds one, it **skips the step** and
# halves S; after a run of clean steps (its growth interval) it doubles S again. Watch it on fp32
# weights (mixed precision keeps a fp32 copy of the weights) with a forward pass in fp16, first on
# a small activation, then on one large enough that the scaled gradient overflows:

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
helpers.record("overflow_step_skipped", not stepped)
helpers.record("loss_scale_after_overflow", scaler.get_scale())

# %% [markdown]
# That is the whole price of fp16: a scaler that now and then throws a step away. bf16 has fp32's
# range, so it needs no scaler at all, which is why it is the first choice on cards that run it
# natively (compute capability 8.0 and up: A100, L4, H100). A T4 (7.5) runs fp16 on its tensor
# cores; bf16 works there too, but emulated and slower, even though
# `torch.cuda.is_bf16_supported()` answers True.
#
# ## Memory and speed on a real model
#
# Load the model in fp32 (mixed precision keeps fp32 weights and computes in 16 bits), and cut
# the course dataset into `per_device_batch` sequences of `seq_len` tokens.

# %%
from helpers.data import load_course_data
from helpers.models import load_model

model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
model.train()
device = next(model.parameters()).device
rows = load_course_data()
ids = [
    t
    for r in tokenizer([r["instruction"] + "\n" + r["response"] for r in rows])["input_ids"]
    for t in r + [tokenizer.eos_token_id]
]  # every row, one long stream of tokens
batch = torch.tensor(ids[: per_device_batch * seq_len], device=device).view(per_device_batch, seq_len)
print(f"batch: {tuple(batch.shape)} tokens on {device}")

# %% [markdown]
# ### Weights
#
# Stored in 16 bits, a weight takes 2 bytes instead of 4. Convert a copy and count:

# %%
import copy

weight_bytes = {"fp32": sum(p.nbytes for p in model.parameters())}
half_model = copy.deepcopy(model).to(torch.bfloat16)
weight_bytes["bf16"] = sum(p.nbytes for p in half_model.parameters())
del half_model
for name, b in weight_bytes.items():
    print(f"weights in {name}: {b / MIB:8.2f} MiB")
print(f"ratio: {weight_bytes['bf16'] / weight_bytes['fp32']:.2f}")
helpers.record("weights_mib", {k: round(v / MIB, 3) for k, v in weight_bytes.items()})

# %% [markdown]
# A caution the lesson's one-liner hides: the Trainer's `bf16=True` / `fp16=True` is *mixed*
# precision. The weights stay in fp32, each matrix multiplication casts its inputs to 16 bits, so
# the weights do **not** shrink; the activations do. The weights shrink when the model itself is
# loaded in 16 bits, which is how `load_model` loads a model on a GPU and how LoRA runs on a
# frozen model (notebook 05).
#
# ### Activations
#
# One training step in each precision, measured with `helpers.memory.measure`: the activations
# are the bytes autograd keeps for the backward pass (exact, on any device), and on a GPU the
# allocator's peak comes along. Autocast chooses per operation what runs in 16 bits; on a CPU
# only bf16 autocast is what a GPU would do, so a CPU measures fp32 against bf16.

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

# %% [markdown]
# The estimator (`helpers.estimate`, notebook 01) predicts the same activation bytes from the
# model's shape alone, before anything runs:

# %%
activations, predicted = {}, {}
for r in readouts:
    activations[r.label] = r["activations"]
    predicted[r.label] = estimate_training_memory(
        model.config, batch_size=per_device_batch, seq_len=seq_len, precision=r.label, device=device.type
    ).activations
    print(
        f"{r.label}: measured {activations[r.label] / MIB:7.2f} MiB, "
        f"estimated {predicted[r.label] / MIB:7.2f} MiB, {activations[r.label] / activations['fp32']:.2f} x fp32"
    )
helpers.record("activations_mib", {k: round(v / MIB, 3) for k, v in activations.items()})
helpers.record("activations_predicted_mib", {k: round(v / MIB, 3) for k, v in predicted.items()})

# %% [markdown]
# The whole step does not halve. Autocast keeps some operations in fp32 on purpose (the norms'
# statistics, softmax, the loss's log-probabilities over the whole vocabulary, a large share for a
# small model), and it adds a 16-bit copy of each weight and of each input a projection reads.
# What it covers is halved. One MLP block shows it, on an input of the training batch's shape: in
# fp32, with its weights in bf16, and under autocast (which adds those copies).

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
helpers.record("mlp_activation_ratio_bf16", round(mlp_ratio, 4))
helpers.record("mlp_activation_ratio_autocast", round(autocast_ratio, 4))

# %% [markdown]
# ### Step time
#
# A full step (forward, backward, optimizer) in each precision, timed `timing_steps` times (the
# steps above were the warm-up), the precisions taking turns so a busy machine slows them all
# alike. The median is the figure.

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
    print(f"{name}: {s * 1000:8.1f} ms per step ({step_seconds['fp32'] / s:.2f} x the speed of fp32)")
helpers.record("step_seconds", {k: round(v, 5) for k, v in step_seconds.items()})

# %% [markdown]
# On a GPU, 16 bits run on the tensor cores: on a T4, look for fp16 well ahead of fp32, and bf16
# behind fp16, since the T4 emulates it; on an A100, bf16 and fp16 side by side. On a CPU, do not
# read speed into these numbers: CPUs have no tensor cores, and bf16 there is a memory saving at
# best.
#
# ## The precision for this card
#
# `helpers.training.training_args` builds the Trainer's arguments with the precision for this
# card (bf16 from compute capability 8.0, fp16 on a T4, fp32 on a CPU, where `fp16=True` would be
# silently ignored), an explicit seed and logging. It prints what it chose and why:

# %%
from helpers.audit import audit
from helpers.training import training_args

args = training_args(
    "build/checkpoints",  # under build/, which git ignores; save_strategy="no" writes nothing
    per_device_train_batch_size=per_device_batch,
    max_steps=max_steps,
    learning_rate=2e-4,
    logging_steps=max(1, max_steps // 4),
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)

# %% [markdown]
# The two precision mistakes, as `audit` reports them with the fix: bf16 copied from an A100 recipe
# onto a T4, and fp16 on a CPU.

# %%
from_a100_recipe = {"bf16": True, "seed": 42, "report_to": "wandb"}
fp16_on_cpu = {"fp16": True, "use_cpu": True, "seed": 42, "report_to": "wandb"}
findings = audit(from_a100_recipe, gpu="T4") + audit(fp16_on_cpu)
helpers.record("audit_codes", [f.code for f in findings])

# %% [markdown]
# Finally, a few training steps in the chosen precision, on blocks of the course dataset. With
# `fp16=True` the Trainer brings its own `GradScaler`. These two lines and the stream above are
# the course's data recipe (every row tokenized, one end-of-text token after each, the stream cut
# into blocks of `seq_len`); from notebook 03 on, `helpers.data.pack_course_data(tokenizer, seq_len)`
# does it in one call.

# %%
from transformers import Trainer

blocks = torch.tensor(ids[: (len(ids) // seq_len) * seq_len]).view(-1, seq_len)
train_data = [{"input_ids": b, "labels": b} for b in blocks]
trainer = Trainer(model=model, args=args, train_dataset=train_data)
result = trainer.train()
used = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
print(f"trained {result.global_step} steps in {used}: mean loss {result.training_loss:.3f}")
helpers.record("train_loss", round(result.training_loss, 4))

# %% [markdown]
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run
# the cell: it answers at once, with a hint when the answer is not right yet and the explanation
# when it is. Each check prints a receipt (question, attempt, result) that stays in the notebook.
# If your instructor grades these, keep each answer in its `answer_...` line, run all the cells,
# then download the notebook (File > Download > Download .ipynb) and hand it in. Start with your
# student id: the last question gives each student their own numbers.

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
answer_q02_3 = None  # a number, from your own numbers (set student_id first)
check("q02_3", answer_q02_3, student_id=student_id)

# %% [markdown]
# ## In this notebook we:
#
# - read the range and precision of fp32, fp16 and bf16 from PyTorch, and saw fp16 overflow past
#   65504 to infinity while bf16 stays finite;
# - watched a small gradient underflow to zero in fp16, and loss scaling bring it back;
# - watched `GradScaler` skip a step whose scaled gradient overflowed, and halve its scale;
# - measured weights (halved when stored in 16 bits, not under mixed precision), activations
#   (the covered layers halved exactly, the whole step by less) and step time, beside the
#   estimator's prediction;
# - chose the precision for this card with `training_args`, caught the two classic precision
#   mistakes with `audit`, and trained in the chosen precision.
#
# Next: notebook 03 trades compute for activation memory with gradient checkpointing.
