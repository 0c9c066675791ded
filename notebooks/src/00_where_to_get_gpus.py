# %% [markdown]
# # 00 · Where to get GPUs, and what the one you have can do
#
# **Hardware:** any runtime. Best on a free Colab T4 or Kaggle's T4 x2; a CPU-only runtime works too
# and uses the kit's embedded tiny model.
# **Time:** about 1 minute on a T4 including the install; about 15 seconds headless on a CPU.
#
# Fine-tuning research rarely starts with a cluster. It starts with whatever card a free notebook
# service hands you, and the skill is shaping the experiment to that card. This notebook:
#
# 1. compares where students actually get GPU time;
# 2. finds out where it is running and which card it got;
# 3. picks the training precision that card supports;
# 4. measures what one parameter costs in each format, and turns that into the largest model this
#    card can train with each recipe.

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
# ## Where the GPU time comes from
#
# | option | card | what it costs | the catch |
# |---|---|---|---|
# | Google Colab, free tier | one T4: 15,360 MiB to nvidia-smi, 14.75 GiB to PyTorch | nothing | sessions end when idle or after some hours, and a GPU is not guaranteed at busy times |
# | Kaggle Notebooks | two T4s ("GPU T4 x2") | nothing; a weekly quota of about 30 GPU hours | internet must be switched on in Settings (phone-verified account); each notebook but 07 trains on one of the two cards |
# | Rented by the hour (RunPod, Lambda, Vast.ai and others) | one A100 or H100, 40 to 80 GB | a few dollars an hour, billed while the machine runs | you pay for idle time: stop the instance when the job ends |
# | A university cluster | whatever the cluster owns, often A100s | your group's allocation | a scheduler queue (usually Slurm) and a job script instead of a notebook |
#
# A LoRA fine-tune of a model under about 1B parameters fits the free tiers. A 7B model fits a
# 16 GB card only with the full set of tricks this course teaches, ending with QLoRA (notebook 05)
# and the capstone (notebook 08). The rented A100 is for when the experiment, not the budget,
# decides the size.
#
# ## Where is this notebook running?
#
# `describe()` reads the platform from the variables Colab and Kaggle set, and each card's name,
# memory and *compute capability* (the hardware generation: 7.5 for a T4, 8.0 for an A100).

# %%
import helpers
from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.env import describe

machine = describe()
print(machine.summary())

# %%
helpers.record("platform", machine.platform)
helpers.record("gpu_name", machine.gpus[0].name if machine.gpus else "none")
helpers.record("gpu_memory_gib", round(machine.gpu_memory_bytes / GIB, 2))
helpers.record("gpu_count", len(machine.gpus))

# %% [markdown]
# ## Which precision this card should train in
#
# Half-precision training stores activations (and often weights) in 2 bytes instead of 4. There are
# two 16-bit formats, and the card decides which one you can use:
#
# - **bf16** keeps fp32's range, so it needs no loss scaling. Tensor cores run it natively from
#   compute capability 8.0 (A100, L4, A10G, H100).
# - **fp16** has a much smaller range (its largest number is 65504), so the Trainer scales the loss
#   to keep small gradients from vanishing. It is what a T4 (7.5) runs fast.
#
# A trap: on a T4, `torch.cuda.is_bf16_supported()` answers True, because bf16 can be *emulated*
# there, slowly. The kit decides from the compute capability instead. On a CPU, `fp16=True` in the
# Trainer does nothing at all, silently. Here is the decision for this machine, as the keywords
# `TrainingArguments` takes:

# %%
from helpers.training import precision_kwargs

print(machine.precision.reason)
print("TrainingArguments keywords:", precision_kwargs(machine.gpus))
helpers.record("precision", machine.precision.name)

# %% [markdown]
# ## Does 4-bit work here?
#
# QLoRA stores the frozen weights in 4 bits with bitsandbytes. Rather than trusting a version
# number, quantize a matrix on this machine and back again:

# %%
from helpers.env import check_4bit

four_bit_ok, message = check_4bit()
print(message)
helpers.record("four_bit_ok", four_bit_ok)

# %% [markdown]
# ## What one parameter costs
#
# Memory for training is mostly a per-parameter bill: the weights, a gradient for each trainable
# weight, and the optimizer's state (AdamW keeps two running averages per weight). Instead of
# quoting the bill, measure it. First the weights of one matrix with the shape of a 7B Llama's
# attention projection (4096 x 4096), in 32 bits, 16 bits, and 4-bit NF4 with double quantization
# (the quantization constants are themselves quantized):

# %%
import bitsandbytes.functional as bnb_functional
import torch

w = torch.randn(4096, 4096)  # one projection of a 7B model: 16.8M parameters
packed, state = bnb_functional.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
nf4_bytes = (
    packed.nbytes
    + state.absmax.nbytes
    + state.code.nbytes  # 4-bit codes, per-block scales
    + state.state2.absmax.nbytes
    + state.state2.code.nbytes
)  # the scales' own scales
bytes_per_param = {
    "fp32": w.nbytes / w.numel(),
    "bf16": w.to(torch.bfloat16).nbytes / w.numel(),
    "nf4": nf4_bytes / w.numel(),
}
for fmt, b in bytes_per_param.items():
    print(f"{fmt:>5}: {b:.4f} bytes per parameter ({8 * b:.3f} bits)")
helpers.record("nf4_bits_per_param", round(8 * bytes_per_param["nf4"], 4))

# %% [markdown]
# Now the optimizer: one AdamW step on a parameter, then count the state it keeps.

# %%
p = torch.nn.Parameter(torch.randn(1024, 1024))
p.grad = torch.zeros_like(p)
opt = torch.optim.AdamW([p])
opt.step()
adam_bytes_per_param = sum(t.nbytes for t in opt.state[p].values()) / p.numel()
print(f"AdamW state: {adam_bytes_per_param:.2f} bytes per parameter ({sorted(opt.state[p])})")
helpers.record("adamw_bytes_per_param", round(adam_bytes_per_param, 3))

# %% [markdown]
# ## What fits this card
#
# Add the measured costs up per recipe. A full fine-tune pays weights + gradients + optimizer for
# every parameter. LoRA freezes the model, so it pays only for the weights (the small adapters add
# well under 1 %). QLoRA pays for 4-bit weights. These ceilings leave out activations, which grow
# with batch and sequence length; notebook 01 adds them, and the estimator gives the whole picture.
# Without a GPU the budget below is a T4's total as `nvidia-smi` reports it (15,360 MiB).

# %%
T4_BYTES = 15_360 * MIB  # a Tesla T4 as nvidia-smi reports it
budget = machine.gpu_memory_bytes or T4_BYTES
recipes = {
    "full fine-tune, fp32 + AdamW": 2 * bytes_per_param["fp32"] + adam_bytes_per_param,
    "LoRA on a 16-bit model": bytes_per_param["bf16"],
    "QLoRA on a 4-bit NF4 model": bytes_per_param["nf4"],
}
print(f"budget: {budget / GIB:.1f} GiB ({'this card' if machine.gpus else 'a T4, since there is no GPU here'})")
for recipe, cost in recipes.items():
    print(f"{recipe:30} {cost:6.2f} bytes/param -> at most {budget / cost / 1e9:5.1f}B parameters")
helpers.record("max_params_b_qlora", round(budget / recipes["QLoRA on a 4-bit NF4 model"] / 1e9, 1))

# %% [markdown]
# Read the last column against a 7B model: a full fine-tune is out of reach by an order of
# magnitude, LoRA on 16-bit weights is borderline once activations arrive, and QLoRA leaves room
# to spare. That is the arithmetic behind the whole course.
#
# ## Load a model
#
# `load_model` loads the model the notebook asks for. When there is no GPU, no internet, or the
# runner asked for a smoke run, it says so in a banner and loads the kit's embedded tiny model
# instead, so every cell still runs and every figure is still measured.

# %%
from helpers.models import is_embedded, load_model

model, tokenizer = load_model(model_id, smoke=smoke)
n_params = sum(p.numel() for p in model.parameters())
weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
name = "the embedded tiny model" if is_embedded(model) else model_id
print(
    f"{name}: {n_params:,} parameters, {weight_bytes / MIB:.2f} MiB of weights "
    f"({weight_bytes / n_params:.1f} bytes per parameter in {model.dtype})"
)
helpers.record("model", "embedded" if is_embedded(model) else model_id)
helpers.record("model_params", n_params)

# %% [markdown]
# And the course dataset every notebook trains on: instruction/response pairs about training on a
# budget, written for this kit.

# %%
from helpers.data import load_course_data

data = load_course_data()
print(data)
print(data[0])
helpers.record("dataset_rows", len(data))

# %% [markdown]
# ## Quick checks
#
# Four questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Each check prints a receipt (question, attempt, result) that stays in the notebook.
#
# If your instructor grades these, the answers written in these cells are what counts: keep each
# one in its `answer_...` line, run all the cells, then download the notebook (File > Download >
# Download .ipynb) and hand it in. Start with your student id: the last question gives each
# student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q00_1
answer_q00_1 = None  # one letter, in quotes
check("q00_1", answer_q00_1)

# %%
# QUICK CHECK q00_2
answer_q00_2 = None  # every letter that applies, in one string
check("q00_2", answer_q00_2)

# %%
# QUICK CHECK q00_3
answer_q00_3 = None  # a number
check("q00_3", answer_q00_3)

# %%
# QUICK CHECK q00_4
answer_q00_4 = None  # a number, from your own numbers (set student_id first)
check("q00_4", answer_q00_4, student_id=student_id)

# %% [markdown]
# ## In this notebook we:
#
# - compared free, rented and university GPU options, and when each is the right one;
# - read the platform, card, memory and compute capability of this runtime;
# - chose the training precision from the compute capability, not from `is_bf16_supported()`;
# - checked that 4-bit quantization works here with a real round trip;
# - measured the per-parameter cost of fp32, bf16 and NF4 weights and of AdamW's state, and turned
#   them into the largest model each recipe can train on this card;
# - loaded a model and the course dataset, with the embedded fallback when the real one can't run;
# - checked what we learned with four quick checks.
#
# Next: notebook 01 opens the memory bill line by line, activations included.
