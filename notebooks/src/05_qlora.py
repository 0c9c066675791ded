# %% [markdown]
# # 05 · QLoRA: a 7B model on a 16 GB card
#
# **Hardware:** any runtime. On a T4 it measures and trains Qwen2.5-0.5B in 4 bits; on a CPU it
# uses the small model that ships with the course, in 4 bits too.
# **Time:** about 3 minutes on a T4 including the install (an estimate: not yet timed on one); 11-20 s on a CPU (measured on 2 machines: 11 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 20 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# NVIDIA sells the T4 as a 16 GB card; PyTorch sees 14.75 GiB of it, and a 7B model's weights in
# 16 bits nearly fill that alone. QLoRA makes the fine-tune fit with three ideas, each measured
# here: frozen weights in **4-bit NF4**, **double quantization** of NF4's own scales, and small
# **LoRA adapters** trained on top. Then the estimator plans the capstone's Qwen2.5-7B on a T4.

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
model_id = "Qwen/Qwen2.5-0.5B"  # a real small model; needs a GPU and the Hub
lora_r = 16  # adapter rank: a d_in x d_out layer gains r x (d_in + d_out) trainable parameters
lora_alpha = 32  # the adapter's output is scaled by alpha / r = 32 / 16 = 2
lora_dropout = 0.05  # dropout on the adapter's input
per_device_batch = 4  # sequences per micro-batch
grad_accum_steps = 2  # effective batch = 4 x 2 x 1 = 8
seq_len = 128  # tokens per sequence: 4 x 128 = 512 tokens per micro-batch
learning_rate = 2e-4  # on a real model: 5e-5 for a full fine-tune, 2e-4 for LoRA or QLoRA (as here)
tiny_learning_rate = 1e-2  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)
train_steps = 10  # optimizer steps of the short QLoRA run
plan_model = "Qwen2.5-7B"  # the 7B of the plan: notebook 08's job (helpers.capstone), from the kit's catalog
plan_gpu = "T4"  # the card of the plan: 14.75 GiB as PyTorch reports it (nvidia-smi: 15,360 MiB)
plan_batch = 1  # per-device batch of the 7B job, as notebook 08 trains it
plan_grad_accum_steps = 16  # effective batch of the 7B job = 1 x 16 x 1 = 16
plan_seq_len = 512  # tokens per sequence of the 7B job

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=0)

# %% [markdown]
# ## This machine, 4-bit, and the model
#
# A round trip through bitsandbytes, which does the 4-bit work, then the model in fp32.

# %%
import gc

import torch

from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.env import check_4bit
from helpers.models import is_embedded, load_model

four_bit_ok, message = check_4bit()
print(message)
if not four_bit_ok:
    raise RuntimeError(
        "bitsandbytes cannot quantize to 4 bits here (the line above says why): run the install "
        "cell again, or switch to a GPU runtime"
    )
model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
source = model.config._name_or_path  # the folder or Hub id load_model chose; every load below reads it
embedded = is_embedded(model)
name = "the course's small model" if embedded else model_id
if embedded:  # its 0.3M weights need far larger steps than a real model's
    print(
        f"tiny model: learning rate {tiny_learning_rate:g}, not a real model's {learning_rate:g} (see the parameters cell)"
    )
    learning_rate = tiny_learning_rate
on_gpu = torch.cuda.is_available()  # the card decides the precision; CUDA decides where tensors live
device_map = {"": 0} if on_gpu else None  # bitsandbytes quantizes on the card while loading

# %% [markdown]
# ## One model, five formats
#
# Count every byte, each tensor once, *quantization constants included*: a quantized weight is
# useless without the scales that turn its integers back into numbers. Only the linear layers
# are quantized.


# %%
def footprint(model):
    """(bytes of the whole model, bytes of its quantizable linear weights, how many weights those hold)."""
    seen = set()

    def size(t):  # each storage once, whatever views point at it
        key = (str(t.device), t.untyped_storage().data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return t.untyped_storage().nbytes()

    linear_bytes = linear_weights = 0
    for module_name, module in model.named_modules():
        # bitsandbytes' 8-bit and 4-bit layers are nn.Linear too; the output head is never quantized
        if isinstance(module, torch.nn.Linear) and not module_name.endswith("lm_head"):
            w = module.weight
            constants = [getattr(w, "SCB", None)]  # 8-bit: one fp32 scale per row
            state = getattr(w, "quant_state", None)  # 4-bit: one scale per block of weights
            while state is not None:  # double quantization nests a second state: the scales' own scales
                constants += [state.absmax, state.code, state.offset]
                state = state.state2
            linear_bytes += size(w) + sum(size(t) for t in constants if t is not None)
            linear_weights += module.in_features * module.out_features
    total = linear_bytes + sum(size(t) for t in [*model.parameters(), *model.buffers()])
    return total, linear_bytes, linear_weights


sizes = {"fp32": footprint(model)}
n_params = sum(p.numel() for p in model.parameters())  # tied weights once
del model  # only the counts are kept

# %% [markdown]
# The same weights four more times, in bf16, LLM.int8 (a byte per weight, an fp32 scale per row)
# and NF4 without and with double quantization:

# %%
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from transformers.utils import logging as hf_logging


def nf4(double_quant):
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


formats = {  # what is not quantized stays in bf16
    "bf16": {},
    "int8": {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)},
    "nf4": {"quantization_config": nf4(double_quant=False)},
    "nf4 + double quant": {"quantization_config": nf4(double_quant=True)},
}
hf_logging.disable_progress_bar()  # the same small files loaded again and again: no progress bars
# load_model downloaded the files already: read them from the cache, never wait on the network here
offline = {"local_files_only": True, "adapter_kwargs": {"local_files_only": True}}
for fmt, kwargs in formats.items():
    m = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16, device_map=device_map, **offline, **kwargs)
    sizes[fmt] = footprint(m)
    del m
gc.collect()
if on_gpu:
    torch.cuda.empty_cache()  # give the copies back before the training below is measured

bytes_per_weight = {fmt: linear / weights for fmt, (total, linear, weights) in sizes.items()}
linear_share = sizes["fp32"][2] / n_params
print(f"{name}: {100 * linear_share:.0f} % of its {n_params:,} weights are in linear layers\n")
print(f"{'format':20} {'whole model':>14} {'linear layers':>14} {'bytes per weight':>17} {'vs fp32':>8}")
for fmt, (total, linear, _) in sizes.items():
    print(
        f"{fmt:20} {total / MIB:10,.3f} MiB {linear / MIB:10,.3f} MiB {bytes_per_weight[fmt]:17.4f} "
        f"{sizes['fp32'][0] / total:7.2f}x"
    )

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3))
bars = ax.bar(list(bytes_per_weight), list(bytes_per_weight.values()), color=["C7", "C0", "C2", "C1", "C3"])
ax.bar_label(bars, fmt="%.3f")
ax.set(ylabel="bytes per weight", title=f"{name}: linear layers, constants included")
plt.show()

# %% [markdown]
# **What to see:** each format halves the last, 4 bytes to 2 to 1 to a half, plus the scaling
# constants. The *whole model* shrinks less: embeddings and head are never quantized. What share
# is that?

# %%
from helpers.estimate import shape_of

shape_7b = shape_of(plan_model)
counts_7b = shape_7b.parameter_counts()
kept_7b = counts_7b["embeddings"] + counts_7b["head"] + counts_7b["other"]  # never quantized
kept_share_7b = kept_7b / sum(counts_7b.values())
print(f"{name}: {100 * (1 - linear_share):.0f} % of the weights are never quantized")
print(
    f"{plan_model}: {100 * kept_share_7b:.1f} % ({kept_7b / 1e9:.2f}B of {sum(counts_7b.values()) / 1e9:.2f}B): "
    f"a vocabulary of {shape_7b.vocab:,} tokens, and a head {'shared with' if shape_7b.tied else 'apart from'} the embeddings"
)

# %% [markdown]
# ## What double quantization saves
#
# NF4 stores, per block of 64 weights, its largest absolute value in fp32: half a bit per weight
# on top of the 4. Double quantization stores those scales in 8 bits, plus one fp32 scale per 256
# of them. Measured on a matrix shaped like one projection of a 7B model:

# %%
import bitsandbytes.functional as bnb_functional

w = torch.randn(4096, 4096, device="cuda" if on_gpu else "cpu")  # a 7B model's q_proj: 16.8M weights
constant_bits = {}
for double_quant in (False, True):
    codes, state = bnb_functional.quantize_4bit(w, quant_type="nf4", compress_statistics=double_quant)
    constants, s = [], state
    while s is not None:
        constants += [t for t in (s.absmax, s.code, s.offset) if t is not None]
        s = s.state2
    bits = constant_bits[double_quant] = 8 * sum(t.nbytes for t in constants) / w.numel()
    print(f"{'with' if double_quant else 'without'} double quantization: 4 bits of code + {bits:.4f} bits of constants")
block, block2 = state.blocksize, state.state2.blocksize  # 64 weights per scale, 256 scales per scale of the scales
print(
    f"from the block sizes: 32 / {block} = {32 / block:.4f} bits without; "
    f"8 / {block} + 32 / ({block} x {block2}) = {8 / block + 32 / (block * block2):.4f} bits with"
)
saved_bits = constant_bits[False] - constant_bits[True]
linear_7b = counts_7b["linear"]
print(
    f"saved: {saved_bits:.4f} bits per weight; on {plan_model}'s {linear_7b / 1e9:.2f}B linear weights "
    f"{linear_7b * saved_bits / 8 / GIB:.2f} GiB"
)
fixed_bytes = state.state2.code.nbytes + state.offset.nbytes  # per matrix: the scales' codebook and offset
break_even = 8 * fixed_bytes / saved_bits
print(f"each double-quantized matrix carries {fixed_bytes:,} bytes more, won back above {break_even:,.0f} weights")

# %% [markdown]
# The QLoRA paper's figure: 0.5 to 0.127 bits per weight (Dettmers et al. 2023, arXiv:2305.14314,
# section 3). A real model's matrices are far above the break-even size; the small model's are
# below it, so the table above shows double quantization *costing* it a little.
#
# ## QLoRA written out
#
# As the transformers and peft documentation write it: load with a `BitsAndBytesConfig`, prepare
# the 4-bit model for training, put a LoRA adapter on every linear layer. An adapter is two small
# matrices beside the frozen W, A (r x d_in) and B (d_out x r): the layer computes
# W x + (alpha / r) B A x, and only A and B train.

# %%
import warnings

from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

from helpers.qlora import disable_cpu_repacking

precision = machine.precision.name
compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)  # fp32 on a CPU
half = torch.float16 if precision == "fp16" else torch.bfloat16  # what is not quantized loads in 16 bits
bnb_config = BitsAndBytesConfig(
    load_in_4bit=True,
    bnb_4bit_quant_type="nf4",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=compute_dtype,
)
plain = AutoModelForCausalLM.from_pretrained(
    source, quantization_config=bnb_config, dtype=half, device_map=device_map, **offline
)
embeddings = plain.get_input_embeddings().weight
before = (embeddings.dtype, embeddings.nbytes)
# peft 0.21 still calls transformers' old checkpointing names, which warn; the calls work
warnings.filterwarnings("ignore", r".*(gradient_checkpointing_enable|is_gradient_checkpointing).*", FutureWarning)
plain = prepare_model_for_kbit_training(
    plain, use_gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
)
embeddings = plain.get_input_embeddings().weight
print(
    f"embeddings: {before[0]} {before[1] / MIB:.3f} MiB before prepare_model_for_kbit_training, "
    f"{embeddings.dtype} {embeddings.nbytes / MIB:.3f} MiB after"
)
lora_config = LoraConfig(
    r=lora_r,
    lora_alpha=lora_alpha,
    lora_dropout=lora_dropout,
    target_modules="all-linear",  # every linear layer but the output head, as in the QLoRA paper
    bias="none",
    task_type="CAUSAL_LM",
)
plain = get_peft_model(plain, lora_config)
if not on_gpu:
    disable_cpu_repacking(plain)  # a CPU-only fix: see helpers/qlora.py
plain.print_trainable_parameters()

# %% [markdown]
# `prepare_model_for_kbit_training` freezes the base and casts all that is not 4-bit to fp32: the
# embeddings doubled above. The kit's shortcut, `helpers.qlora.load_qlora`, does the same in one
# call. Same result:

# %%
from helpers.footprint import measure_footprint
from helpers.qlora import load_qlora

model, tokenizer = load_qlora(model_id, r=lora_r, alpha=lora_alpha, dropout=lora_dropout, smoke=smoke)
fp, fp_plain = measure_footprint(model), measure_footprint(plain)
config = model.peft_config["default"]
same = {
    "trainable parameters": fp.trainable_params == fp_plain.trainable_params,
    "bytes in memory": fp.total_bytes == fp_plain.total_bytes,
    "LoRA settings": all(getattr(config, k) == getattr(lora_config, k) for k in ("r", "lora_alpha", "lora_dropout")),
}
print(", ".join(f"{k}: {'same' if v else 'DIFFERENT'}" for k, v in same.items()))
del plain, fp_plain

# %% [markdown]
# The adapter's parameters, counted: r x (d_in + d_out) per layer, summed.

# %%
import bitsandbytes as bnb

from helpers.capstone import capstone_estimate
from helpers.estimate import estimate_training_memory

all_params = fp.quantized_params + fp.other_params + fp.trainable_params
adapted = [m for m in model.modules() if hasattr(m, "lora_A") and isinstance(m.base_layer, bnb.nn.Linear4bit)]
by_formula = sum(lora_r * (m.base_layer.in_features + m.base_layer.out_features) for m in adapted)
assert by_formula == fp.trainable_params
job_7b = dict(model=plan_model, gpu=plan_gpu, per_device_batch=plan_batch, grad_accum_steps=plan_grad_accum_steps)
job_7b.update(seq_len=plan_seq_len, lora_r=lora_r, lora_dropout=lora_dropout)  # notebook 08's job, with these settings
e7b = capstone_estimate(**job_7b)
print(f"{name}: {len(adapted)} adapted layers, {by_formula:,} trainable ({100 * by_formula / all_params:.2f} %)")
print(f"{plan_model}: {e7b.trainable:,} trainable of {e7b.parameters:,} ({100 * e7b.trainable / e7b.parameters:.2f} %)")

# %% [markdown]
# The share is r / d_in + r / d_out of each layer: large on 64-wide layers, well under 1 % on a
# 7B's 3,584-wide ones.
#
# ## A few steps of training
#
# Copy every frozen tensor and every adapter, train, and compare; the Trainer evaluates a fixed
# batch every other step, so its curve is not noisy from batch to batch.

# %%
from transformers import PrinterCallback, Trainer

from helpers.data import pack_course_data
from helpers.memory import measure
from helpers.training import training_args

train_data = pack_course_data(tokenizer, seq_len)
fixed_batch = train_data.select(range(per_device_batch))  # the same sequences evaluated before, during and after

frozen_before = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if not p.requires_grad}
adapters_before = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
args = training_args(
    "build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,
    max_steps=train_steps,
    learning_rate=learning_rate,
    activation_checkpointing=True,  # the model has it on already; this records it in the arguments
    logging_steps=1,
    eval_strategy="steps",
    eval_steps=2,  # the fixed batch's loss every other step
    per_device_eval_batch_size=per_device_batch,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)
trainer = Trainer(model=model, args=args, train_dataset=train_data, eval_dataset=fixed_batch)
trainer.remove_callback(PrinterCallback)  # the plot below shows the losses
loss_before = trainer.evaluate()["eval_loss"]
with measure("QLoRA training", model=model) as readout:
    result = trainer.train()
train_losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
eval_steps, eval_losses = zip(*[(h["step"], h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h])
eval_steps, eval_losses = [0, *eval_steps], [loss_before, *eval_losses]
loss_after = eval_losses[-1]
frozen_changed = [n for n, t in frozen_before.items() if not torch.equal(model.get_parameter(n).detach().cpu(), t)]
adapters_changed = [n for n, t in adapters_before.items() if not torch.equal(model.get_parameter(n).detach().cpu(), t)]
print(f"loss of a fixed batch: {loss_before:.3f} before, {loss_after:.3f} after {result.global_step} steps")
print(
    f"frozen tensors changed: {len(frozen_changed)} of {len(frozen_before)}; "
    f"adapter tensors changed: {len(adapters_changed)} of {len(adapters_before)} (compared byte for byte)"
)

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(range(1, len(train_losses) + 1), train_losses, "o-", alpha=0.5, label="training loss (each step's own batch)")
ax.plot(eval_steps, eval_losses, "s-", color="green", label="the same fixed batch, evaluated")
ax.set(xlabel="optimizer step", ylabel="cross-entropy loss (nats per token)", title="QLoRA: only the adapters train")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** the loss falls while no frozen byte moved: a 4-bit code has 16 levels, too
# coarse for an optimizer's small steps, so the gradient flows *through* the dequantized weights
# into the adapters. The run's activations beside the estimator's prediction:

# %%
e = estimate_training_memory(
    model.config,
    per_device_batch=per_device_batch,
    seq_len=seq_len,
    method="qlora",
    lora_r=lora_r,
    lora_dropout=lora_dropout,
    checkpointing=True,
    precision=precision,
    grad_accum_steps=grad_accum_steps,
    device="cuda" if on_gpu else "cpu",
)
activation_error = (e.activations - readout["activations"]) / readout["activations"]
print(
    f"activations held for backward: measured {readout['activations'] / MIB:,.2f} MiB, "
    f"predicted {e.activations / MIB:,.2f} MiB ({100 * activation_error:+.2f} %)"
)
if on_gpu:
    peak = readout["peak_allocated"]
    print(
        f"peak allocated: measured {peak / MIB:,.0f} MiB (torch.cuda.max_memory_allocated), "
        f"predicted {e.allocated / MIB:,.0f} MiB ({100 * (e.allocated - peak) / peak:+.1f} %)"
    )

# %% [markdown]
# ## A 7B model on a T4
#
# The estimator needs only the model's shape. `plan` starts from a full fine-tune of notebook 08's
# model with its batch and sequence length, and adds techniques, cheapest first, until the job fits
# the card:

# %%
from helpers.catalog import gpu_bytes
from helpers.plan import format_plan, plan

ladder_settings = {k: v for k, v in job_7b.items() if k not in ("model", "gpu")}
steps = plan(plan_model, plan_gpu, **ladder_settings)
print(format_plan(steps, plan_gpu))
card_gib = gpu_bytes(plan_gpu) / GIB  # what PyTorch sees of the card

fig, ax = plt.subplots(figsize=(6, 3))
ax.barh([s.technique for s in steps][::-1], [s.estimate.total / GIB for s in steps][::-1], color="C0")
ax.axvline(card_gib, color="red", ls="--", label=f"{plan_gpu}: {card_gib:.2f} GiB to PyTorch")
ax.set(xlabel="predicted total (GiB)", title=f"{plan_model}, {plan_batch} x {plan_seq_len} tokens")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **What to see:** checkpointing changes little at one sequence per step (the weights, gradients
# and optimizer states are the bill); freezing the model for LoRA cuts it most, and only QLoRA
# crosses the card's line. The plan keeps every change it made on the way; notebook 08 runs QLoRA
# with the Trainer's own defaults for the rest. Its job, estimated (`helpers.capstone`, the same
# call notebook 08 makes), against the plan's last step:

# %%
qlora = e7b  # notebook 08's job
last = steps[-1].estimate
differ = {k: (last.settings.get(k), v) for k, v in qlora.settings.items() if last.settings.get(k) != v}
print(f"notebook 08's job, {plan_model} with QLoRA on a {plan_gpu}: {qlora.total / GIB:.2f} GiB")
if differ:
    print(
        f"the plan's last step: {last.total / GIB:.2f} GiB; it differs from 08's job in "
        + ", ".join(f"{k} {a} (08: {b})" for k, (a, b) in differ.items())
    )
else:
    print("the plan's last step is the same job: the same figure")

# %% [markdown]
# That job in full, and its weights line taken apart:

# %%
print(qlora.table())
no_dq = estimate_training_memory(plan_model, **{**qlora.settings, "double_quant": False})
print(
    f"\nthe weights line: {linear_7b / 1e9:.2f}B linear weights in NF4 "
    f"{linear_7b * (4 + constant_bits[True]) / 8 / GIB:.2f} GiB + embeddings, head and norms in fp32 "
    f"{4 * kept_7b / GIB:.2f} GiB + adapters in fp32 {4 * qlora.trainable / GIB:.2f} GiB"
)
print(
    f"without double quantization: {no_dq.total / GIB:.2f} GiB in total, {(no_dq.total - qlora.total) / GIB:.2f} more"
)

# %% [markdown]
# The 14 % left unquantized is more than half of the weights line, in fp32; still, the job fits a
# free T4. Notebook 08 runs it. The plan from a terminal (it plans one micro-batch a step, without
# accumulation):
#
# ```
# python -m helpers plan --model Qwen2.5-7B --gpu T4 --seq-len 512 --per-device-batch 1
# ```
#
# ## Quick checks
#
# Replace `None` with your answer and run the cell. If your instructor grades these, run all the
# cells, then download the notebook (File > Download > Download .ipynb). Set your student id first:
# one question gives each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q05_1
answer_q05_1 = None  # one letter, in quotes
check("q05_1", answer_q05_1)

# %%
# QUICK CHECK q05_2
answer_q05_2 = None  # one letter, in quotes
check("q05_2", answer_q05_2)

# %%
# QUICK CHECK q05_3
answer_q05_3 = None  # a number, from your own numbers (set student_id first)
check("q05_3", answer_q05_3, student_id=student_id)

# %%
# QUICK CHECK q05_4
answer_q05_4 = None  # one letter, in quotes
check("q05_4", answer_q05_4)

# %% [markdown]
# The cell below saves this run's figures for the course's own tests; you can skip it.

# %% tags=["record"]
helpers.record("model", "embedded" if embedded else model_id)
helpers.record("footprint_mib", {fmt: round(s[0] / MIB, 4) for fmt, s in sizes.items()})
helpers.record("bits_per_linear_weight", {fmt: round(8 * b, 4) for fmt, b in bytes_per_weight.items()})
helpers.record("linear_share", round(linear_share, 4))
helpers.record("unquantized_share_7b", round(kept_share_7b, 4))
helpers.record("constant_bits_single", round(constant_bits[False], 4))
helpers.record("constant_bits_double", round(constant_bits[True], 4))
helpers.record("double_quant_saves_bits", round(saved_bits, 4))
helpers.record("double_quant_saves_gib_7b", round(linear_7b * saved_bits / 8 / GIB, 3))
helpers.record("double_quant_break_even_weights", round(break_even))
helpers.record("embeddings_dtype_before_prepare", str(before[0]).removeprefix("torch."))
helpers.record("embeddings_dtype_after_prepare", str(embeddings.dtype).removeprefix("torch."))
helpers.record("plain_recipe_same_as_load_qlora", same)
helpers.record("trainable_params", fp.trainable_params)
helpers.record("trainable_pct", round(100 * fp.trainable_params / all_params, 3))
helpers.record("qlora_footprint_mib", round(fp.total_bytes / MIB, 4))
helpers.record("trainable_pct_7b", round(100 * e7b.trainable / e7b.parameters, 3))
helpers.record("train_losses", [round(x, 4) for x in train_losses])
helpers.record("loss_before", round(loss_before, 4))
helpers.record("eval_losses", {step: round(x, 4) for step, x in zip(eval_steps, eval_losses)})
helpers.record("loss_after", round(loss_after, 4))
helpers.record("frozen_changed", len(frozen_changed))
helpers.record("adapters_changed_fraction", round(len(adapters_changed) / len(adapters_before), 4))
helpers.record("activations_mib", round(readout["activations"] / MIB, 4))
helpers.record("activation_error_pct", round(100 * activation_error, 3))
if on_gpu:
    helpers.record("peak_allocated_mib", round(readout["peak_allocated"] / MIB, 1))
    helpers.record("predicted_allocated_mib", round(e.allocated / MIB, 1))
helpers.record("plan_7b_model", plan_model)
helpers.record("plan_7b_totals_gib", {s.technique: round(s.estimate.total / GIB, 2) for s in steps})
helpers.record("plan_7b_last_step", steps[-1].technique)
helpers.record("plan_7b_total_gib", round(steps[-1].estimate.total / GIB, 2))
helpers.record("plan_7b_fits", steps[-1].fits)
helpers.record("capstone_7b_total_gib", round(qlora.total / GIB, 2))
helpers.record("capstone_7b_settings", {k: v for k, v in qlora.settings.items() if k != "harness"})
helpers.record("plan_7b_differs_from_capstone", {k: list(v) for k, v in differ.items()})
helpers.record("qlora_7b_weights_gib", round(qlora.weights / GIB, 2))
helpers.record("qlora_7b_unquantized_gib", round(4 * kept_7b / GIB, 2))

# %% [markdown]
# ## In this notebook we:
#
# - measured the same model in fp32, bf16, int8 and NF4, constants included, and plotted the
#   bytes per weight; saw that embeddings and head stay unquantized (14 % of Qwen2.5-7B);
# - measured double quantization's saving, 0.5 to 0.127 bits per weight, and where it stops paying;
# - wrote QLoRA out with `BitsAndBytesConfig`, `prepare_model_for_kbit_training`, `LoraConfig` and
#   `get_peft_model`, and got the same model from the kit's `load_qlora`;
# - trained it: the loss fell, only the adapters changed, the activations matched the estimate;
# - planned Qwen2.5-7B on a T4: only QLoRA fits.
#
# ## Change this, predict, run
#
# 1. Set `lora_r = 64`, the QLoRA paper's rank. Predict the trainable parameters (of this model
#    and of the 7B) and whether the 7B plan still fits. Run all.
# 2. Set `plan_model = "Mistral-7B"` (a 32,000-token vocabulary). Predict whether its weights
#    line is larger or smaller than Qwen2.5-7B's, and why. Run all.
#
# Next: notebook 06 tracks experiments and seeds.
