# %% [markdown]
# # 00 · Where to get GPUs, and what the one you have can do
#
# **Hardware:** any runtime. Best on a free Colab T4 or Kaggle's T4 x2; on a CPU it uses the small
# model that ships with the course.
# **Time:** about 1 minute on a T4 including the install (an estimate: not yet timed on one); 9-18 s on a CPU (measured on 2 machines: 9 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 18 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# Research starts with whatever card a free notebook hands you; the skill is shaping the experiment
# to that card. Below: where to get GPU time, what this card can do, and the largest model each
# recipe fits on it, from measured bytes per parameter.

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
card = "T4"  # without a GPU, the "what fits" table is for this card: "T4", "L4", "A100-40GB", "A100-80GB", "H100-80GB"
nf4_blocksize = 64  # weights per 4-bit block; each block also stores one scale (QLoRA uses 64)

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## Where the GPU time comes from
#
# | option | card | cost | the catch | source, as of |
# |---|---|---|---|---|
# | Colab, free tier | usually one T4, 16 GB | free | GPUs "not guaranteed and not unlimited"; at most 12 hours a session, less when idle | [Colab FAQ](https://research.google.com/colaboratory/faq.html), 2025 |
# | Kaggle Notebooks | "GPU T4 x2": two 16 GB T4s | free; about 30 GPU hours a week | internet needs a phone-verified account; 12 hours a session | [Kaggle docs](https://www.kaggle.com/docs/notebooks), 2025 |
# | Rented (Lambda, RunPod, Vast.ai) | one A100 or H100, 40 or 80 GB | Lambda: A100 40 GB $1.48/h, H100 PCIe $2.86/h | billed while it runs, idle or not | [lambda.ai/pricing](https://lambda.ai/pricing), May 2026 |
# | University cluster | what it owns | your group's allocation | a queue and a job script ([Slurm](https://slurm.schedmd.com)) | your research computing pages |
#
# Quotas and prices change: check the source.
#
# ## GB or GiB?
#
# Vendors count in **GB** (10^9 bytes); PyTorch, `nvidia-smi` and this course in **GiB** (2^30
# bytes, 7.4 % more). A "16 GB" T4 is 15,360 MiB to `nvidia-smi`; PyTorch can use a little less:

# %%
from helpers import GIB, MIB  # bytes in a GiB (2**30) and in a MiB (2**20)
from helpers.catalog import gpu_bytes

t4_smi_bytes, t4_torch_bytes = 15_360 * MIB, gpu_bytes("T4")  # nvidia-smi's total; what PyTorch can allocate
print(f"T4 to nvidia-smi: {t4_smi_bytes / 1e9:.2f} GB = {t4_smi_bytes / GIB:.2f} GiB")
print(f"T4 to PyTorch:    {t4_torch_bytes / 1e9:.2f} GB = {t4_torch_bytes / GIB:.2f} GiB")

# %% [markdown]
# From here on the code prints GiB and MiB.
#
# ## Where is this notebook running?
#
# `helpers.start()`, the setup cell at the top, made three calls you can also make yourself:
# `use_one_gpu()` keeps this process on one card (Kaggle shows two), `describe()` reads the platform,
# each card's name, memory and *compute capability* (its hardware generation: 7.5 for a T4, 8.0 for
# an A100), and `seed_everything(0)` seeds Python, NumPy and torch. What `describe()` returns:

# %%
from helpers.env import describe

machine = describe()  # the table the setup cell printed, as an object
gpu_names = [g.name for g in machine.gpus] or ["none"]
print(f"platform {machine.platform!r}, GPUs {gpu_names}, trains in {machine.precision.name}")

# %% [markdown]
# ## Which precision this card should train in
#
# Mixed precision computes in 16 bits, and the card decides which: **bf16** (fp32's range, no loss
# scaling) natively from compute capability 8.0; **fp16** (largest number 65504, so the loss is
# scaled) on a T4 (7.5). A T4's `torch.cuda.is_bf16_supported()` says True because bf16 can be
# *emulated*, slowly: the kit decides from the capability.

# %%
from helpers.training import precision_kwargs

print(machine.precision.reason)
print("TrainingArguments keywords:", precision_kwargs(machine.gpus))

# %% [markdown]
# ## Does 4-bit work here?
#
# QLoRA stores frozen weights in 4 bits (bitsandbytes). Quantize a matrix here and back:

# %%
from helpers.env import check_4bit

four_bit_ok, message = check_4bit()
print(message)

# %% [markdown]
# ## What one parameter costs
#
# Training memory is mostly a per-parameter bill: weights, a gradient per trainable weight, the
# optimizer's state. Measure it: one matrix the shape of a 7B Llama's attention projection (4096 x
# 4096) in fp32, bf16 and 4-bit NF4 with double quantization (the block scales quantized too):

# %%
import bitsandbytes.functional as bnb_functional
import torch

w = torch.randn(4096, 4096)  # one projection of a 7B model: 16.8M parameters
packed, state = bnb_functional.quantize_4bit(w, blocksize=nf4_blocksize, quant_type="nf4", compress_statistics=True)
nf4_bytes = sum(t.nbytes for t in (packed, state.absmax, state.code, state.state2.absmax, state.state2.code))
bytes_per_param = {
    "fp32": w.nbytes / w.numel(),
    "bf16": w.to(torch.bfloat16).nbytes / w.numel(),
    "nf4": nf4_bytes / w.numel(),  # 4-bit codes + the blocks' scales + the scales' own scales
}
for fmt, b in bytes_per_param.items():
    print(f"{fmt:>5}: {b:.4f} bytes per parameter ({8 * b:.3f} bits)")

# %% [markdown]
# Now one AdamW step, and count the state it keeps:

# %%
p = torch.nn.Parameter(torch.randn(1024, 1024))
p.grad = torch.zeros_like(p)
opt = torch.optim.AdamW([p])
opt.step()
adam_bytes_per_param = sum(t.nbytes for t in opt.state[p].values()) / p.numel()
print(f"AdamW state: {adam_bytes_per_param:.2f} bytes per parameter ({sorted(opt.state[p])})")

# %% [markdown]
# ## What fits this card
#
# Add the measured costs per recipe. A full fine-tune pays weight + gradient + AdamW state for every
# parameter; LoRA freezes 16-bit weights and trains small adapters (well under 1 % more); QLoRA
# freezes 4-bit weights. These are **ceilings**: activations come on top (notebook 01).

# %%
budget = machine.gpu_memory_bytes or gpu_bytes(card)
where = "this card" if machine.gpus else f"a {card}, as there is no GPU here"
recipes = {
    "full fine-tune, fp32 + AdamW": 2 * bytes_per_param["fp32"] + adam_bytes_per_param,
    "LoRA on a 16-bit model": bytes_per_param["bf16"],
    "QLoRA on a 4-bit NF4 model": bytes_per_param["nf4"],
}
max_params_b = {recipe: budget / cost / 1e9 for recipe, cost in recipes.items()}  # billions of parameters
print(f"budget: {budget / GIB:.2f} GiB ({where})")
for recipe, cost in recipes.items():
    seven_b = 7e9 * cost / GIB  # what a 7B model costs in this recipe, before activations
    print(
        f"{recipe:29} {cost:6.2f} bytes/param -> at most {max_params_b[recipe]:5.1f}B parameters; "
        f"a 7B model needs {seven_b:6.1f} GiB"
    )

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh(list(max_params_b), list(max_params_b.values()), color=["tab:red", "tab:orange", "tab:green"])
ax.axvline(7, color="black", ls="--", label="a 7B model")
ax.set(xlabel="largest model, billions of parameters (before activations)", title=f"what fits {where}")
ax.invert_yaxis()
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** only bars past the dashed line hold a 7B model's weights. On a T4, a full
# fine-tune stops under 1B parameters, LoRA in 16 bits reaches about 8B with nothing left for
# activations, QLoRA about 30B: room to train a 7B (notebook 05).
#
# ## Load a model
#
# `load_model` loads the model asked for; with no GPU or no internet, or when the parameters cell asks
# for it, it says so and loads the course's small model (pre-trained on the course text), so every
# cell runs.

# %%
from helpers.models import is_embedded, load_model

model, tokenizer = load_model(model_id, smoke=smoke)
n_params = sum(p.numel() for p in model.parameters())
name = "the course's small model" if is_embedded(model) else model_id
print(f"{name}: {n_params:,} parameters in {model.dtype}")

# %% [markdown]
# Underneath is plain transformers; loading the docs' way gives the same model:

# %%
from transformers import AutoModelForCausalLM

plain = AutoModelForCausalLM.from_pretrained(model.name_or_path, dtype=model.dtype)  # files already on disk
plain_params = sum(p.numel() for p in plain.parameters())
same_weights = all(
    torch.equal(a.cpu(), b.cpu()) for a, b in zip(plain.state_dict().values(), model.state_dict().values())
)
print(f"from_pretrained: {plain_params:,} parameters; identical weights: {same_weights}")
del plain

# %% [markdown]
# The course dataset (instruction/response pairs written for this kit): `load_course_data()` is one
# line of `datasets`:

# %%
from datasets import load_dataset

from helpers.data import DATASET_PATH, load_course_data

data = load_dataset("json", data_files=str(DATASET_PATH), split="train")  # the plain call
print(data)
print("same rows as load_course_data():", data[:] == load_course_data()[:])
print(data[0])

# %% [markdown]
# How well does the model know this text? Its loss is the average of -ln(probability of each next
# token), in nats per token; guessing uniformly over the vocabulary scores ln(vocabulary size):

# %%
import math

tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token  # some tokenizers ship without one
rows = [r["instruction"] + "\n" + r["response"] for r in data.select(range(8))]
batch = tokenizer(rows, return_tensors="pt", padding=True).to(model.device)
labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)  # no loss on padding
with torch.no_grad():
    base_loss = model(**batch, labels=labels).loss.item()
chance_loss = math.log(len(tokenizer))
print(
    f"loss on 8 course rows: {base_loss:.2f} nats per token; uniform guessing: ln {len(tokenizer):,} = {chance_loss:.2f}"
)

# %% [markdown]
# Far below chance: the model knows the course's words, not yet its question-and-answer format;
# the next notebooks fine-tune it on that format.
#
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
# The next cell saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
helpers.record("platform", machine.platform)
helpers.record("gpu_name", machine.gpus[0].name if machine.gpus else "none")
helpers.record("gpu_memory_gib", round(machine.gpu_memory_bytes / GIB, 2))
helpers.record("gpu_count", len(machine.gpus))
helpers.record("t4_gib", {"nvidia_smi": round(t4_smi_bytes / GIB, 3), "pytorch": round(t4_torch_bytes / GIB, 3)})
helpers.record("t4_gb", {"nvidia_smi": round(t4_smi_bytes / 1e9, 3), "pytorch": round(t4_torch_bytes / 1e9, 3)})
helpers.record("precision", machine.precision.name)
helpers.record("four_bit_ok", four_bit_ok)
helpers.record("bytes_per_param", {k: round(v, 4) for k, v in bytes_per_param.items()})
helpers.record("nf4_bits_per_param", round(8 * bytes_per_param["nf4"], 4))
helpers.record("adamw_bytes_per_param", round(adam_bytes_per_param, 3))
helpers.record("budget_gib", round(budget / GIB, 3))
helpers.record("max_params_b", {k: round(v, 2) for k, v in max_params_b.items()})
helpers.record("max_params_b_qlora", round(max_params_b["QLoRA on a 4-bit NF4 model"], 1))
helpers.record("model", "embedded" if is_embedded(model) else model_id)
helpers.record("model_params", n_params)
helpers.record("plain_load_same_weights", same_weights and plain_params == n_params)
helpers.record("dataset_rows", len(data))
helpers.record("base_loss", round(base_loss, 4))
helpers.record("chance_loss", round(chance_loss, 4))

# %% [markdown]
# ## In this notebook we:
#
# - compared free, rented and university GPU time, each fact with its source and date;
# - told GB (10^9 bytes, vendors) from GiB (2^30 bytes, the code);
# - chose this card's precision from its compute capability, and checked 4-bit here;
# - measured the bytes a parameter costs and turned them into the largest model per recipe: on a
#   T4 only QLoRA leaves a 7B model room;
# - loaded a model and the dataset with the kit and with plain transformers / datasets (same result).
#
# ## Change this, predict, run
#
# 1. Set `card = "A100-80GB"` in the parameters cell (on a CPU runtime). Predict the largest full
#    fine-tune it holds. Does a 7B fit? Run all.
# 2. Set `nf4_blocksize = 256`. Predict whether NF4's bits per parameter go up or down, and by how
#    much. Run all and compare.
#
# Next: notebook 01, the memory bill line by line.
