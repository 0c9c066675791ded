# %% [markdown]
# # 05 · QLoRA: a 7B model on a 16 GB card
#
# **Hardware:** any runtime. On a T4 it measures and trains Qwen2.5-0.5B in 4 bits; on a CPU it
# uses the embedded tiny model (bitsandbytes quantizes on a CPU too).
# **Time:** about 3 minutes on a T4 including the install; under 30 seconds headless on a CPU.
#
# A 7B model's weights take 13.5 GiB in 16 bits, which leaves a free T4 (14.75 GiB to PyTorch) almost nothing to
# train with. QLoRA makes it fit with three ideas; this notebook measures each one on the model at
# hand, then plans the 7B:
#
# 1. store the frozen weights in **4-bit NF4**: the same model in fp32, bf16, 8-bit and 4-bit, measured;
# 2. **double quantization**: quantize the 4-bit format's own scales too, and see what it saves;
# 3. train small **LoRA adapters** in full precision on top: count them, train a few steps, and
#    check that the 4-bit weights did not move;
# 4. ask the estimator what a 7B model needs on a T4.

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
model_id = "Qwen/Qwen2.5-0.5B"  # a real small model; needs a GPU and the Hub
lora_r = 16  # adapter rank: a d_in x d_out layer gains r x (d_in + d_out) trainable parameters
lora_alpha = 32  # the adapter's output is scaled by alpha / r = 32 / 16 = 2
per_device_batch = 4  # sequences per micro-batch
grad_accum_steps = 4  # effective batch = 4 x 4 x 1 = 16
seq_len = 256  # tokens per sequence: 4 x 256 = 1,024 tokens per micro-batch
learning_rate = 2e-4  # adapters take a higher learning rate than a full fine-tune
max_steps = 20  # optimizer steps of the short QLoRA run
plan_model = "Mistral-7B"  # the 7B of the plan, from the kit's catalog of model shapes
plan_gpu = "T4"  # the card of the plan: 14.75 GiB as PyTorch reports it (nvidia-smi: 15,360 MiB)
plan_batch = 4  # per-device batch of the 7B job
plan_seq_len = 512  # tokens per sequence of the 7B job: 4 x 512 = 2,048 tokens per micro-batch

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
# ## This machine, 4-bit, and the model
#
# First a real round trip through bitsandbytes, the library that does the 4-bit (and 8-bit) work:
# if it fails here, nothing below can run. Then the model, in fp32, as `load_model` chooses it.

# %%
import gc

import torch

import helpers
from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.env import check_4bit, describe
from helpers.models import is_embedded, load_model

machine = describe()
print(machine.summary())
four_bit_ok, message = check_4bit()
print(message)
if not four_bit_ok:
    raise RuntimeError(
        "bitsandbytes cannot quantize to 4 bits here (the line above says why): run the install "
        "cell again, or switch to a GPU runtime"
    )
model, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)
source = model.config._name_or_path  # the folder or Hub id load_model chose; every load below reads it
name = "the embedded tiny model" if is_embedded(model) else model_id
on_gpu = torch.cuda.is_available()  # the card decides the precision; CUDA decides where tensors live
device_map = {"": 0} if on_gpu else None  # bitsandbytes quantizes on the card while loading
helpers.record("model", "embedded" if is_embedded(model) else model_id)

# %% [markdown]
# ## One model, four formats
#
# Count every byte the model holds, each tensor once (a tied embedding and output head share
# one), *quantization constants included*: a quantized weight is useless without the scales that
# turn its small integers back into numbers. The linear layers are what gets quantized; the
# embeddings, the norms and the output head stay as they were loaded.


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
# Now load the same weights four more times, each time asking `from_pretrained` for another
# format. 8-bit is bitsandbytes' LLM.int8: one signed byte per weight and one fp32 scale per row
# of each matrix. bitsandbytes 0.50 quantizes to 8 bits on a CPU as well, so this loads it for real
# on any machine. 4-bit is NF4, with and without double quantization.

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
hf_logging.disable_progress_bar()  # five loads of the same files: no progress bars
# load_model downloaded the files already: read them from the cache, never wait on the network here
offline = {"local_files_only": True, "adapter_kwargs": {"local_files_only": True}}
for fmt, kwargs in formats.items():
    m = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16, device_map=device_map, **offline, **kwargs)
    sizes[fmt] = footprint(m)
    del m
hf_logging.enable_progress_bar()
gc.collect()
if on_gpu:
    torch.cuda.empty_cache()  # give the copies back before the training below is measured

fp32_total = sizes["fp32"][0]
print(
    f"{name}: {sizes['fp32'][2]:,} of its {n_params:,} weights are in linear layers "
    f"({100 * sizes['fp32'][2] / n_params:.0f} %); the rest is never quantized (fp32 in the first row, bf16 below)\n"
)
print(f"{'format':20} {'whole model':>14} {'linear layers':>14} {'bits per weight':>16} {'vs fp32':>8}")
for fmt, (total, linear, weights) in sizes.items():
    print(
        f"{fmt:20} {total / MIB:10,.3f} MiB {linear / MIB:10,.3f} MiB {8 * linear / weights:16.3f} "
        f"{fp32_total / total:7.2f}x"
    )
helpers.record("footprint_mib", {fmt: round(s[0] / MIB, 4) for fmt, s in sizes.items()})
helpers.record("bits_per_linear_weight", {fmt: round(8 * s[1] / s[2], 4) for fmt, s in sizes.items()})

# %% [markdown]
# Read the *bits per weight* column first: 32 and 16, then 8 and 4 plus the constants. The *whole
# model* shrinks less than its linear layers, because the embeddings and the head stay in 16 bits:
# a large share of a small model (printed above), under 4 % of a 7B model.
#
# ## What double quantization saves
#
# NF4 cuts the weights into blocks of 64 and stores, per block, its largest absolute value
# (*absmax*) in fp32, to scale the 16 NF4 levels back. 32 bits shared by 64 weights is half a bit
# per weight, on top of the 4. Double quantization quantizes those scales in turn: 8 bits per
# block, plus one fp32 scale per 256 scales. The arithmetic, from the block sizes bitsandbytes
# itself reports, and the bits measured on a matrix shaped like one projection of a 7B model:

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
    code_bits = 8 * codes.nbytes / w.numel()
    bits = constant_bits[double_quant] = 8 * sum(t.nbytes for t in constants) / w.numel()
    print(
        f"{'with' if double_quant else 'without'} double quantization: {code_bits:.3f} bits of code + "
        f"{bits:.4f} bits of constants = {code_bits + bits:.4f} bits per weight"
    )
block, block2 = state.blocksize, state.state2.blocksize  # 64 weights per scale, 256 scales per scale of the scales
single_bits = 32 / block  # one fp32 absmax per block
double_bits = 8 / block + 32 / (block * block2)  # one 8-bit absmax per block, one fp32 per block2 of them
print(
    f"\nfrom the block sizes: 32 / {block} = {single_bits:.4f} bits without; "
    f"8 / {block} + 32 / ({block} x {block2}) = {double_bits:.4f} bits with"
)
saved_bits = constant_bits[False] - constant_bits[True]
print(f"double quantization saves {saved_bits:.4f} bits per weight")
helpers.record("constant_bits_single", round(constant_bits[False], 4))
helpers.record("constant_bits_double", round(constant_bits[True], 4))
helpers.record("double_quant_saves_bits", round(saved_bits, 4))

# %% [markdown]
# That is the QLoRA paper's figure: the constants fall from 0.5 to 0.127 bits per weight (the
# tiny rest of the measurement is the codebooks, fixed per matrix). What is that worth on a 7B
# model, and on the model at hand? Each double-quantized matrix also carries a fixed cost, a
# 256-entry fp32 codebook for its 8-bit scales, so a matrix must be large enough to win it back:

# %%
from helpers.estimate import shape_of

linear_7b = shape_of(plan_model).parameter_counts()["linear"]
print(
    f"{plan_model}: {linear_7b / 1e9:.2f}B weights in linear layers x {saved_bits:.3f} bits = "
    f"{linear_7b * saved_bits / 8 / GIB:.2f} GiB saved"
)
fixed_bytes = state.state2.code.nbytes + state.offset.nbytes  # per matrix: the scales' codebook and offset
break_even = 8 * fixed_bytes / saved_bits
bits_here = {fmt: 8 * sizes[fmt][1] / sizes[fmt][2] for fmt in ("nf4", "nf4 + double quant")}
change = bits_here["nf4"] - bits_here["nf4 + double quant"]
print(
    f"a double-quantized matrix carries {fixed_bytes:,} bytes more of fixed cost, won back above "
    f"{break_even:,.0f} weights per matrix"
)
print(
    f"{name}: {bits_here['nf4']:.3f} bits per weight without, {bits_here['nf4 + double quant']:.3f} with: "
    f"double quantization {'saves' if change > 0 else 'costs'} {abs(change):.3f} bits per weight here"
)
helpers.record("double_quant_saves_gib_7b", round(linear_7b * saved_bits / 8 / GIB, 3))
helpers.record("double_quant_break_even_weights", round(break_even))

# %% [markdown]
# On a real model every matrix holds millions of weights, far above the break-even point, so
# double quantization always helps there; on the embedded model's tiny matrices (a few thousand
# weights each) the fixed cost can win instead. Nothing is free: it is the same trade at every
# scale, and the measurement tells you which side you are on.
#
# ## QLoRA in one call
#
# `helpers.qlora.load_qlora` does what a QLoRA script does: load the model with every linear layer
# but the output head in NF4 with double quantization, freeze it, turn on gradient checkpointing,
# and put a LoRA adapter on each of those layers. An adapter is two small matrices beside the frozen weight W:
# A (r x d_in) and B (d_out x r); the layer computes W x + (alpha / r) B A x, and only A and B
# train. B starts at zero, so training starts from the model exactly as it was. It prints the
# footprint it measured:

# %%
import bitsandbytes as bnb

from helpers.qlora import load_qlora, measure_footprint

model, tokenizer = load_qlora(model_id, r=lora_r, alpha=lora_alpha, smoke=smoke)
fp = measure_footprint(model)
all_params = fp.quantized_params + fp.other_params + fp.trainable_params
adapted = [m for m in model.modules() if hasattr(m, "lora_A") and isinstance(m.base_layer, bnb.nn.Linear4bit)]
by_formula = sum(lora_r * (m.base_layer.in_features + m.base_layer.out_features) for m in adapted)
first = adapted[0]
a, b = first.lora_A["default"].weight, first.lora_B["default"].weight
print(
    f"\n{len(adapted)} adapted layers; the first: W {first.base_layer.out_features} x "
    f"{first.base_layer.in_features} (frozen, 4-bit), A {tuple(a.shape)}, B {tuple(b.shape)}"
)
print(
    f"trainable: {fp.trainable_params:,} of {all_params:,} parameters ({100 * fp.trainable_params / all_params:.2f} %)"
    f"; r x (d_in + d_out) summed over those layers: {by_formula:,}"
)
assert by_formula == fp.trainable_params
helpers.record("trainable_params", fp.trainable_params)
helpers.record("trainable_pct", round(100 * fp.trainable_params / all_params, 3))
helpers.record("qlora_footprint_mib", round(fp.total_bytes / MIB, 4))

# %% [markdown]
# An adapter adds r x (d_in + d_out) parameters to a layer of d_in x d_out weights: a share of
# r / d_in + r / d_out. That share depends on how wide the model is. The embedded model's layers are
# 64 wide, so rank 16 is a large fraction of them; a 7B model's are 4,096 wide or more:

# %%
from helpers.estimate import estimate_training_memory

e7b = estimate_training_memory(plan_model, batch_size=1, seq_len=plan_seq_len, method="qlora", lora_r=lora_r)
print(
    f"{plan_model}, r = {lora_r} on every linear layer: {e7b.trainable:,} trainable of {e7b.parameters:,} "
    f"({100 * e7b.trainable / e7b.parameters:.2f} %)"
)
helpers.record("trainable_pct_7b", round(100 * e7b.trainable / e7b.parameters, 3))

# %% [markdown]
# ## A few steps of training
#
# The course dataset, cut into sequences of `seq_len` tokens (`pack_course_data`: notebook 02's
# recipe in one call), and the Trainer with the kit's `training_args`. Before training, keep a copy
# of every frozen tensor (the 4-bit codes included) and of every adapter, to compare afterwards.
# `measure` wraps the run: the activations autograd held for backward at the peak, counted
# exactly, and on a GPU the allocator's peak.

# %%
from transformers import PrinterCallback, Trainer

from helpers.data import pack_course_data
from helpers.memory import measure
from helpers.training import training_args

train_data = pack_course_data(tokenizer, seq_len)

frozen_before = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if not p.requires_grad}
adapters_before = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}
args = training_args(
    "build/checkpoints",
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,
    max_steps=max_steps,
    learning_rate=learning_rate,
    activation_checkpointing=True,  # load_qlora turned it on in the model already; this says so
    logging_steps=1,
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)
trainer = Trainer(model=model, args=args, train_dataset=train_data)
trainer.remove_callback(PrinterCallback)  # the losses are printed below, one line for the whole run
with measure("QLoRA training", model=model) as readout:
    result = trainer.train()
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
print(
    f"{result.global_step} steps of {per_device_batch} x {grad_accum_steps} sequences, "
    f"loss by step: {', '.join(f'{x:.3f}' for x in losses)}"
)
helpers.record("train_losses", [round(x, 4) for x in losses])

# %%
frozen_changed = [
    n
    for n, p in model.named_parameters()
    if not p.requires_grad and not torch.equal(p.detach().cpu(), frozen_before[n])
]
adapters_changed = [
    n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p.detach().cpu(), adapters_before[n])
]
print(
    f"frozen tensors (4-bit codes, embeddings, norms): {len(frozen_changed)} of {len(frozen_before)} changed, "
    f"compared byte for byte"
)
print(f"adapter tensors (A and B of every layer): {len(adapters_changed)} of {len(adapters_before)} changed")
helpers.record("frozen_changed", len(frozen_changed))
helpers.record("adapters_changed_fraction", round(len(adapters_changed) / len(adapters_before), 4))

# %% [markdown]
# The optimizer never touched the 4-bit weights: it only holds the adapters. A 4-bit code has 16
# possible values, far too coarse for the small steps an optimizer takes, which is why QLoRA keeps
# the trainable part in 16 or 32 bits and the gradient flows *through* the dequantized weights
# into the adapters.
#
# Now the run's memory next to the estimator's prediction for the same settings. The activations
# are counted exactly on any device; on a GPU the allocator's peak comes too, against the
# estimator's `allocated` line (what `torch.cuda.max_memory_allocated` reports).

# %%
e = estimate_training_memory(
    model.config,
    batch_size=per_device_batch,
    seq_len=seq_len,
    method="qlora",
    lora_r=lora_r,
    lora_dropout=0.05,
    checkpointing=True,
    precision=machine.precision.name,
    grad_accum_steps=grad_accum_steps,
    device="cuda" if on_gpu else "cpu",
)
error = (e.activations - readout["activations"]) / readout["activations"]
print(
    f"activations held for backward: measured {readout['activations'] / MIB:,.2f} MiB, "
    f"predicted {e.activations / MIB:,.2f} MiB ({100 * error:+.2f} %)"
)
helpers.record("activations_mib", round(readout["activations"] / MIB, 4))
helpers.record("activation_error_pct", round(100 * error, 3))
if on_gpu:
    peak = readout["peak_allocated"]
    print(
        f"peak allocated: measured {peak / MIB:,.0f} MiB (torch.cuda.max_memory_allocated), "
        f"predicted {e.allocated / MIB:,.0f} MiB ({100 * (e.allocated - peak) / peak:+.1f} %)"
    )
    helpers.record("peak_allocated_mib", round(peak / MIB, 1))
    helpers.record("predicted_allocated_mib", round(e.allocated / MIB, 1))
else:
    print("no GPU here: the allocator's peak, and the estimator's `allocated` beside it, show on a GPU runtime")

# %% [markdown]
# ## A 7B model on a T4
#
# The estimator needs only the model's shape, so it can answer for a 7B model on any machine.
# `plan` starts from the job as asked, a full fine-tune, and applies techniques in order of what
# they cost until the job fits the card:

# %%
from helpers.plan import format_plan, plan

steps = plan(plan_model, plan_gpu, batch_size=plan_batch, seq_len=plan_seq_len)
print(format_plan(steps, plan_gpu))
helpers.record("plan_7b_last_step", steps[-1].technique)
helpers.record("plan_7b_total_gib", round(steps[-1].estimate.total / GIB, 2))
helpers.record("plan_7b_fits", steps[-1].fits)

# %% [markdown]
# LoRA freezes the model but keeps it in 16 bits, and 13.5 GiB of weights leave no room on a
# 14.75 GiB card. The QLoRA line, in full:

# %%
qlora = steps[-1].estimate
print(qlora.table())
counts = shape_of(plan_model).parameter_counts()
kept = counts["embeddings"] + counts["head"] + counts["other"]
no_dq = estimate_training_memory(plan_model, **{**qlora.settings, "double_quant": False})
print(
    f"\nthe weights line: {counts['linear'] / 1e9:.2f}B linear weights in NF4 "
    f"{counts['linear'] * (4 + constant_bits[True]) / 8 / GIB:.2f} GiB + embeddings, head and norms in fp32 "
    f"{4 * kept / GIB:.2f} GiB + adapters in fp32 {4 * qlora.trainable / GIB:.2f} GiB"
)
print(
    f"without double quantization the total would be {no_dq.total / GIB:.2f} GiB, "
    f"{(no_dq.total - qlora.total) / GIB:.2f} GiB more"
)
helpers.record("qlora_7b_weights_gib", round(qlora.weights / GIB, 2))

# %% [markdown]
# About 4.5 GiB of weights where LoRA needed 13.5, and the rest of the bill (adapters, their
# gradients and AdamW states, checkpointed activations) is small: a 7B fine-tune fits a free T4
# with room to spare. Notebook 08 runs it for real. The same plan from a terminal:
#
# ```
# python -m helpers plan --model Mistral-7B --gpu T4 --seq-len 512 --batch-size 4
# ```
#
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Each check prints a receipt (question, attempt, result) that stays in the notebook. If
# your instructor grades these, keep each answer in its `answer_...` line, run all the cells, then
# download the notebook (File > Download > Download .ipynb) and hand it in. Set your student id
# first: the last question gives each student their own numbers.

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

# %% [markdown]
# ## In this notebook we:
#
# - measured the same model in fp32, bf16, 8-bit (LLM.int8) and 4-bit NF4, constants included, and
#   saw why the whole model shrinks less than its linear layers;
# - computed what double quantization saves from the block sizes (0.5 to 0.127 bits per weight),
#   measured it, and found where a matrix is too small for it to pay;
# - loaded a model for QLoRA in one call, counted its trainable parameters with r x (d_in + d_out),
#   and saw why their share depends on the model's width;
# - trained a few steps and proved, byte for byte, that only the adapters changed, with the
#   activations measured beside the estimator's prediction;
# - asked the estimator for a 7B model on a T4: only QLoRA fits, with room to spare.
#
# Next: notebook 06 keeps track of the experiments: seeds, their spread, and the config saved with
# every checkpoint.
