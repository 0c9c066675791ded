# %% [markdown]
# # 08 · Capstone: the full recipe on a 7B model, a disconnect survived, a report a reviewer trusts
#
# **Hardware:** a free Colab T4 (14.75 GiB as PyTorch reports it), one of Kaggle's T4s, or a rented A100. Without a GPU
# or the Hub it runs the same cells on the kit's tiny built-in model.
# **Time:** about 30 minutes on a T4 for the 7B model, download included (an estimate: not yet timed on one); 18-40 s on a CPU (measured on 2 machines: 18 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 40 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# The whole course in one run: the lesson's `TrainingArguments` on QLoRA, checkpoints that outlive the
# runtime, a resume after a disconnect, an answer before and after, and the report a reviewer asks for.
#
# **Before Run all on Colab:** the notebook mounts Google Drive to keep its checkpoints, and Google asks you in a
# pop-up to authorize that; Run all waits, without a word, until you answer. To skip it, set `use_drive = False`
# in the parameters cell: the checkpoints then vanish with the runtime.

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
smoke = False  # True: the kit's tiny built-in model and a slice of the data, whatever the machine (seconds)
model_id = "unsloth/Qwen2.5-7B-bnb-4bit"  # the 7B saved in 4-bit (5.5 GB); "Qwen/Qwen2.5-7B" is its bf16 original
merge_base_id = "Qwen/Qwen2.5-7B"  # the 16-bit model the adapter is merged into: the original of model_id
hub_repo = ""  # a Hub repo of yours ("you/qwen-course-adapter") to push the adapter to; needs a token named HF_TOKEN
run_name = "capstone"  # the run's folder: the same settings resume there; a changed one trains in capstone-2, -3, ...
use_drive = True  # Colab: checkpoints kept on Google Drive (asks to authorize); False: no dialog, lost with the runtime
per_device_batch = 1  # sequences per micro-batch: what a 16 GB card holds for a 7B
grad_accum_steps = 16  # effective batch = 1 x 16 x 1 = 16
num_train_epochs = 3
learning_rate = 2e-4  # on a real model: 5e-5 for a full fine-tune, 2e-4 for LoRA or QLoRA (as here)
tiny_learning_rate = 1e-2  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)
logging_steps = 10  # a loss every 10 optimizer steps
seed = 42
seq_len = 512  # tokens kept per example; the course's examples are shorter, so none is cut
max_steps = -1  # -1: the epochs decide (3 epochs of 21 steps on the whole dataset); a number stops there
save_steps = 20  # a checkpoint every 20 optimizer steps: at most 20 x 16 = 320 sequences of work lost to a disconnect
disconnect_after_step = 22  # the simulated disconnect: the first session stops here, 2 steps past its last checkpoint
max_new_tokens = 40  # the length of the answer generated before and after the fine-tune

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=seed)

# %% [markdown]
# ## A folder that survives a disconnect
#
# A free session's disk goes with it. Checkpoints go to Google Drive on Colab (this cell says loudly if it
# cannot mount it); to `/kaggle/working` on Kaggle, kept by Save Version > Save & Run All (to resume, add
# that output as input and copy its `runs/` folder back); to `build/runs` elsewhere.
#
# On Colab this cell opens Google's pop-up asking you to authorize Drive access, and waits for your answer.
# `use_drive = False` in the parameters cell skips it: the checkpoints then stay on the runtime's own disk.

# %%
import shutil
from pathlib import Path

from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.env import detect_platform

platform = detect_platform()
if platform == "colab" and not use_drive:
    runs = Path("/content/runs")
    survives = "NO: use_drive = False, so these checkpoints vanish with the runtime"
elif platform == "colab":
    try:
        from google.colab import drive

        drive.mount("/content/drive")
        runs = Path("/content/drive/MyDrive/compute-realities/runs")
        survives = "yes: Google Drive outlives the Colab runtime"
    except Exception as error:  # refused, timed out, or no Drive: keep going, but say what it costs
        runs = Path("/content/runs")
        survives = (
            f"NO: Google Drive could not be mounted ({type(error).__name__}: {error}). These checkpoints "
            "vanish with the runtime; run this cell again and allow Drive access to keep them"
        )
elif platform == "kaggle":
    runs = Path("/kaggle/working/runs")
    survives = "for this session; Save Version > Save & Run All keeps it as the notebook's output"
else:
    runs = Path("build/runs")
    survives = "yes: this machine's disk"
run_folder = (runs / (f"{run_name}-smoke" if smoke else run_name)).resolve()
if smoke and run_folder.exists():
    shutil.rmtree(run_folder)  # a quick run (smoke = True) always starts afresh, in its own folder
print(f"\nruns go to {run_folder.parent}, this one to {run_folder.name} (or beside it: see below)")
print(f"survives a disconnect: {survives}")

# %% [markdown]
# ## The model: QLoRA
#
# `load_qlora` is the shortcut for the recipe notebook 05 writes out: `BitsAndBytesConfig` (4-bit NF4,
# double quantization, the card's compute precision), `prepare_model_for_kbit_training`, then `LoraConfig`
# and `get_peft_model`. The settings it used, read back from the model:

# %%
import torch

from helpers.models import is_embedded
from helpers.qlora import load_qlora
from helpers.seeds import seed_everything

seed_everything(seed)
model, tokenizer = load_qlora(model_id, smoke=smoke)
if is_embedded(model) and not torch.cuda.is_available():
    torch.set_num_threads(1)  # the tiny model's matrices are too small to share out: one CPU thread is fastest
model_name = "embedded" if is_embedded(model) else model_id
lora, quantization = model.peft_config["default"], model.config.quantization_config
print(
    f"BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type={quantization.bnb_4bit_quant_type!r}, "
    f"bnb_4bit_use_double_quant={quantization.bnb_4bit_use_double_quant}, "
    f"bnb_4bit_compute_dtype={quantization.bnb_4bit_compute_dtype})"
)
print(
    f"LoraConfig(r={lora.r}, lora_alpha={lora.lora_alpha}, lora_dropout={lora.lora_dropout}, "
    f"target_modules={sorted(lora.target_modules)})"
)

# %% [markdown]
# Before activations: the frozen 4-bit base, plus the adapters at 16 bytes a parameter (fp32 weight,
# gradient, two AdamW moments). Measured on this model, and estimated for the 7B on a T4 (notebook 01):

# %%
from helpers.capstone import capstone_estimate
from helpers.catalog import load_catalog
from helpers.estimate import estimate_training_memory  # used again at the end, for this run's model
from helpers.footprint import measure_footprint

footprint = measure_footprint(model)
adapters_training = footprint.trainable_params * 16  # fp32 weight + gradient + two AdamW moments
print(
    f"loaded model, measured: frozen base {(footprint.quantized_bytes + footprint.other_bytes) / MIB:,.2f} MiB "
    f"({footprint.bits_per_quantized_weight:.2f} bits per quantized weight); {footprint.trainable_params:,} adapter "
    f"parameters x 16 bytes = {adapters_training / MIB:,.2f} MiB to train them"
)
catalog = {entry.get("hub_id"): name for name, entry in load_catalog("models").items()}
planned = catalog.get(model_id, "Qwen2.5-7B")  # the model asked for, by its shape
plan = capstone_estimate(  # the course's 7B job on a T4 with this notebook's settings: notebook 05 plans the same
    model=planned,
    per_device_batch=per_device_batch,
    grad_accum_steps=grad_accum_steps,
    seq_len=seq_len,
    lora_r=lora.r,
    lora_dropout=lora.lora_dropout,
)
print(
    f"{planned} on a T4, estimated: weights {plan.weights / GIB:.2f} GiB ({plan.parameters / 1e9:.1f}B "
    f"parameters), adapter gradients + AdamW {(plan.gradients + plan.optimizer) / GIB:.2f} GiB, activations "
    f"{plan.activations / GIB:.2f} GiB; {plan.total / GIB:.2f} GiB in all with the CUDA context and the "
    f"allocator's slack -> fits a T4: {plan.fits('T4')}"
)

# %% [markdown]
# Before you rent anything, play with the plan: the same estimate with controls. Try a longer `seq_len`, a
# bigger per-device batch, your own loop, another card; the bars are redrawn and the verdict said again.

# %%
from helpers.planner import planner

planner(planned, "T4", method="qlora", per_device_batch=per_device_batch, seq_len=seq_len, checkpointing=True)

# %% [markdown]
# The 7B comes from one of two sources: its bf16 original, quantized to 4 bits while it loads (each layer arrives
# in 16 bits first), or a copy saved already in 4 bits (`model_id`'s default), loaded as saved. Colab's disk and
# your half hour both feel the download:

# %%
from helpers.plan import checkpoint_bytes

for source, weights in ((merge_base_id, "bf16"), (model_id if model_id != merge_base_id else "a 4-bit copy", "nf4")):
    print(
        f"{source:>30}: {checkpoint_bytes(planned, weights) / 1e9:5.1f} GB to download ({weights}; estimated from the shape)"
    )
print(
    f"loading peak on the card: {plan.load_peak / GIB:.2f} GiB quantizing while loading (estimated), no more from the "
    "4-bit copy: both end with peft casting the embeddings and the head to fp32, the largest moment"
)

# %% [markdown]
# `save_quantized` makes such a copy of any model (quantize once, keep the 4-bit folder on Drive) and `load_qlora`
# loads either kind, saying which it got. Measured here on the tiny model, whose embeddings are most of it:

# %%
import tempfile

from helpers.models import embedded_dir
from helpers.qlora import save_quantized

copy = save_quantized("embedded", Path(tempfile.mkdtemp()) / "tiny-4bit")
original_mib = sum(f.stat().st_size for f in embedded_dir().glob("*.safetensors")) / MIB
copy_mib = sum(f.stat().st_size for f in copy.glob("*.safetensors")) / MIB
print(f"the tiny model's weights: {original_mib:.2f} MiB in fp32, {copy_mib:.2f} MiB in the 4-bit copy")
tiny_4bit, _ = load_qlora(str(copy))  # the first line it prints says which kind of checkpoint it got

# %% [markdown]
# ## The data, in the model's own chat format
#
# The course's instruction / response pairs, a few held out. On the tiny model 72 examples stand in for the
# 349, so 3 epochs take seconds. The first held-out instruction is the question asked before and after.
#
# A model is asked questions in the format its tokenizer's chat template writes (`apply_chat_template`), so
# it is trained in that format too. This is one conversation as the template renders it:

# %%
import datasets

from helpers.data import chat_prompt, load_course_data

datasets.disable_progress_bars()  # one line per step is enough output
tiny = smoke or is_embedded(model)  # the tiny model runs the recipe, it does not need all the data
rows = load_course_data().shuffle(seed=seed)
rows = rows.select(range(72)) if tiny else rows
split = rows.train_test_split(test_size=8 if tiny else 16, seed=seed)
first = split["train"][0]
conversation = [{"role": "user", "content": first["instruction"]}, {"role": "assistant", "content": first["response"]}]
print(tokenizer.apply_chat_template(conversation, tokenize=False))

# %% [markdown]
# ### The loss on the answers only
#
# The model should learn to *answer*, not to write questions. So each example is the prompt (the user's turn,
# up to where the assistant's answer begins: `add_generation_prompt=True`) followed by the answer, and the
# labels are set to -100 on every prompt token: the loss skips them. `chat_dataset` does this for every row;
# decoding one example's labels shows what is trained on.

# %%
from helpers.data import IGNORE_INDEX, chat_dataset

train = chat_dataset(split["train"], tokenizer, seq_len)
held_out = chat_dataset(split["test"], tokenizer, seq_len)
example = train[0]
trained_on = [token for token, label in zip(example["input_ids"], example["labels"]) if label != IGNORE_INDEX]
print(f"the prompt, masked ({example['labels'].count(IGNORE_INDEX)} tokens, label -100):")
print(repr(chat_prompt(tokenizer, first["instruction"])))
print(f"\nwhat the loss is computed on ({len(trained_on)} tokens):")
print(repr(tokenizer.decode(trained_on)))

# %% [markdown]
# Over the whole training set, the share of tokens that count in the loss:

# %%
all_tokens = sum(len(ids) for ids in train["input_ids"])
loss_tokens = sum(sum(label != IGNORE_INDEX for label in labels) for labels in train["labels"])
lengths = [len(ids) for ids in train["input_ids"]]
question = split["test"][0]["instruction"]
print(f"{len(train)} training examples ({min(lengths)} to {max(lengths)} tokens), {len(held_out)} held out")
print(
    f"tokens in the loss: {loss_tokens:,} of {all_tokens:,} ({loss_tokens / all_tokens:.0%}); "
    f"the other {all_tokens - loss_tokens:,} are prompt, masked"
)
print(f"the question: {question}")

# %% [markdown]
# ## Before the fine-tune
#
# The held-out loss, and a greedy answer (the most likely token each time: the same every run). The
# adapter's update starts at zero: this is the base model.

# %%
from transformers import DataCollatorForSeq2Seq, PrinterCallback, Trainer, TrainingArguments


def greedy_ids(model, logits=False):
    """The token ids of the model's greedy answer to `question`, asked in its chat format (and its logits on it)."""
    inputs = tokenizer(chat_prompt(tokenizer, question), add_special_tokens=False, return_tensors="pt")
    inputs = inputs.to(model.device)
    model.eval()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, use_cache=True)
        scores = model(**inputs).logits.float().cpu() if logits else None
    model.train()
    ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    return (ids, scores) if logits else ids


def answer(model):
    return tokenizer.decode(greedy_ids(model), skip_special_tokens=True).strip()


# pads input_ids with the pad token and labels with -100, so padding never counts in the loss either
collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX)
quiet = dict(report_to="none", disable_tqdm=True, dataloader_pin_memory=torch.cuda.is_available())
before = Trainer(
    model=model, args=TrainingArguments("build/eval", **quiet), eval_dataset=held_out, data_collator=collator
)
before.remove_callback(PrinterCallback)  # its {'eval_loss': ...} dicts would repeat what is printed below
base_loss = before.evaluate()["eval_loss"]
unmasked = held_out.map(lambda row: {"labels": row["input_ids"]})  # the same examples, every token in the loss
base_loss_unmasked = before.evaluate(unmasked)["eval_loss"]
reply_before = answer(model)
print(f"held-out loss before, on the answers: {base_loss:.4f} (on every token: {base_loss_unmasked:.4f})")
print(f"answer before: {reply_before!r}")

# %% [markdown]
# ## Which run this is, and where it stands
#
# A run folder holds one run: the checkpoints of one set of settings. Run the notebook again with the same
# settings (after a disconnect, or next week: on Colab the folder is on Drive) and it goes on with that run; a
# finished one is reused, not trained again. Change a setting that decides the result (the model, the learning
# rate, `max_steps` or the epochs, `seq_len`, the batch, the accumulation, the seed, LoRA's r or alpha, the
# data) and it is another run: `choose_run_folder` compares them with the manifest in the newest checkpoint,
# names each that changed (old -> new), and trains in a new folder beside it (`capstone-2`, `capstone-3`, ...)
# from step 0. Set it back and the first run's folder is found again.
#
# `max_steps` counts too, larger or smaller: the learning rate decays to zero at a run's last step, so 8 steps
# are not the first 8 of a 12-step run, and steps added past a finished run's end are not the longer run either.
# What only changes the logging, the saving or this notebook's demonstration (`logging_steps`, `save_steps`,
# `disconnect_after_step`) does not count. The list, each with why, is `RESULT_SETTINGS` in `helpers/runs.py`.
#
# Inside the folder, a checkpoint holds the adapter, the optimizer and scheduler state, the random generators and
# the data position. `resume_from_checkpoint=True` takes the highest-numbered folder even if a disconnect cut its
# save short; `latest_valid_checkpoint` returns the newest *whole* one that fits this `model` (None on a first
# run), and when every one is rejected it stops with the reasons instead of training over them.

# %%
from helpers.manifest import load_manifest
from helpers.resume import latest_valid_checkpoint
from helpers.runs import choose_run_folder
from helpers.tracking import init_tracking


def start_tracking(resume_from):
    previous = load_manifest(resume_from)["tracking"] if resume_from else None
    config = {
        "model": model_name,
        "seed": seed,
        "per_device_batch": per_device_batch,
        "grad_accum_steps": grad_accum_steps,
        "learning_rate": learning_rate,
        "seq_len": seq_len,
    }
    run_id = previous["run_id"] if previous else None
    return init_tracking("kit-08-capstone", config, name=output_dir.name, dir=output_dir, run_id=run_id)


if tiny:  # the rate this run trains at, so the one its folder is chosen by
    print(f"tiny model: learning rate {tiny_learning_rate:g} instead of {learning_rate:g} (see the parameters cell)")
    learning_rate = tiny_learning_rate
settings = dict(
    model_id=model_name, seq_len=seq_len, learning_rate=learning_rate, max_steps=max_steps,
    num_train_epochs=num_train_epochs, per_device_batch=per_device_batch, grad_accum_steps=grad_accum_steps, seed=seed,
)  # fmt: skip
output_dir = choose_run_folder(run_folder, model, train, **settings)  # with the LoRA adapter's r and alpha, the data
output_dir.mkdir(parents=True, exist_ok=True)
resume_from = latest_valid_checkpoint(output_dir, model=model)
tracking = start_tracking(resume_from)

# %% [markdown]
# ## The lesson's TrainingArguments, written out
#
# The lesson's block as you would type it (notebook 06 showed `training_args` gives the same in one call),
# with what it leaves to you: the precision for the card, the tracking, when to save (2 checkpoints kept). A
# short run (the tiny model) saves, disconnects and logs sooner so that each happens. `audit` checks for
# the mistakes of notebooks 02 to 06.

# %%
from helpers.audit import audit

total_steps = max_steps if max_steps > 0 else -(-len(train) // (per_device_batch * grad_accum_steps)) * num_train_epochs
if not save_steps < disconnect_after_step < total_steps:  # a short run: cut it in two around its middle
    save_steps = max(1, total_steps // 2)
    disconnect_after_step = min(save_steps + 1, total_steps - 1)
    logging_steps = 1  # the lesson's 10 would log nothing in so few steps
    print(
        f"a {total_steps}-step run: a checkpoint every {save_steps} steps, the disconnect after {disconnect_after_step}"
    )
last_save = disconnect_after_step // save_steps * save_steps  # the checkpoint the second session resumes from
logged_around = range(last_save, disconnect_after_step + 1)  # both sessions train steps last_save+1 .. disconnect
on_gpu = torch.cuda.is_available()
bf16 = on_gpu and torch.cuda.get_device_capability()[0] >= 8
args = TrainingArguments(
    output_dir=str(output_dir),
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,  # effective batch = 1 * 16 = 16
    activation_checkpointing=True,  # recompute activations to save memory (the lesson's gradient_checkpointing)
    activation_checkpointing_kwargs={"use_reentrant": False},  # PyTorch's recommended mode
    bf16=bf16,  # mixed precision from compute capability 8.0 (A100, L4)
    fp16=on_gpu and not bf16,  # older cards such as the T4
    learning_rate=learning_rate,  # higher LR is normal for LoRA
    num_train_epochs=num_train_epochs,
    logging_steps=logging_steps,
    report_to=tracking.report_to,  # track loss/metrics for reproducibility
    seed=seed,  # set + report the seed
    max_steps=max_steps,
    save_strategy="steps",
    save_steps=save_steps,
    save_total_limit=2,
    disable_tqdm=True,  # the live readout below replaces the progress bar
    dataloader_pin_memory=on_gpu,  # pinned memory only speeds up copies to a GPU
)
findings = audit(args, model=model, seq_len=seq_len)
print("audit: " + (f"{len(findings)} finding(s), each printed above" if findings else "nothing to fix"))

# %% [markdown]
# ## Train, until the connection drops
#
# `LiveMemoryCallback` shows step, loss and memory; `ManifestCallback` writes `run_manifest.json` into each
# checkpoint; `SimulatedDisconnect` ends the session a little past a checkpoint. `LogAroundDisconnect` logs
# every step from that checkpoint to the disconnect: both sessions train those steps, and with `logging_steps`
# alone (10 on the 7B: steps 10, 20, 30 ...) neither session would log one of them for the two to be compared.
# `train_or_report` only loads a *finished* run (handed its last checkpoint, the Trainer would train one step
# past the end).

# %%
import json
import time

from peft import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import PrinterCallback, TrainerCallback

from helpers.live import LiveMemoryCallback
from helpers.manifest import ManifestCallback


class SimulatedDisconnect(TrainerCallback):
    """End training after `step`, without a save: all that is left is what was already on disk."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


class LogAroundDisconnect(TrainerCallback):
    """Log the training loss at each of `steps`, besides every `logging_steps`."""

    def __init__(self, steps):
        self.steps = set(steps)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.steps:
            control.should_log = True  # a logged loss is the mean since the last log: past the first, this step's


def make_trainer(model, *callbacks):
    live = LiveMemoryCallback(every_n_steps=min(logging_steps, max(1, total_steps // 4)))
    manifest = ManifestCallback(model_id=model_name, dataset=train, seq_len=seq_len)  # what choose_run_folder reads
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=collator,
        callbacks=[live, manifest, LogAroundDisconnect(logged_around), *callbacks],
    )
    trainer.remove_callback(PrinterCallback)  # its {'loss': ...} dicts would print around the live readout
    return trainer, live


sessions = []  # (steps trained, seconds) for each call of train_or_report that trained


def train_or_report(trainer, checkpoint):
    """Train on from `checkpoint` (None: from scratch); return (step reached, steps in the run)."""
    if checkpoint:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
        if state["global_step"] >= state["max_steps"]:
            print(
                f"{checkpoint} ends a finished run (step {state['global_step']} of {state['max_steps']}): nothing "
                "left to train, its adapter is loaded for the report. A changed setting trains a new run."
            )
            set_peft_model_state_dict(trainer.model, load_file(Path(checkpoint) / "adapter_model.safetensors"))
            trainer.remove_callback(LiveMemoryCallback)  # no training to show (and it expects one to have begun)
            return state["global_step"], state["max_steps"]
    start = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    sessions.append((result.global_step - (state["global_step"] if checkpoint else 0), time.perf_counter() - start))
    return result.global_step, trainer.state.max_steps


def logged_losses(trainer, after_step):  # {step: training loss} this trainer logged after `after_step`
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] > after_step}


trainer, live = make_trainer(model, SimulatedDisconnect(disconnect_after_step))
session1_start = load_manifest(resume_from)["step"] if resume_from else 0
first_step, _ = train_or_report(trainer, resume_from)
session1_losses = logged_losses(trainer, session1_start)
print(
    f"\nsession 1 ended at step {first_step}; on disk: {', '.join(sorted(p.name for p in output_dir.glob('checkpoint-*')))}"
)

# %% [markdown]
# ## After the disconnect
#
# A disconnect takes the model, the optimizer's state and every step since the last checkpoint. So start as
# a new session would: let go of the model, load it again, find the run's folder by its settings (the same
# settings: the same folder), build a new Trainer there. After a real disconnect this is simply the notebook
# run again from the top.

# %%
from helpers.oom import free_memory

tracking.finish()  # a real disconnect leaves the tracking run unfinished; resuming it works the same
trainer, model = free_memory(trainer, model)
seed_everything(seed)
model, tokenizer = load_qlora(model_id, smoke=smoke)
output_dir = choose_run_folder(run_folder, model, train, **settings)  # as a new session does: the same run found
resume_from = latest_valid_checkpoint(output_dir, model=model)
resumed_from_step = load_manifest(resume_from)["step"] if resume_from else 0
tracking = start_tracking(resume_from)
trainer, live = make_trainer(model)
final_step, run_steps = train_or_report(trainer, resume_from)
session2_losses = logged_losses(trainer, resumed_from_step)
redone = first_step - resumed_from_step
print(
    f"\nsession 2 resumed from step {resumed_from_step} (session 1 had reached step {first_step}: {redone} "
    f"step(s) trained again) and finished at step {final_step} of {run_steps}"
)
assert final_step == run_steps

# %% [markdown]
# ## The loss across the disconnect

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.2))
for losses, style, label in ((session1_losses, "o-", "session 1"), (session2_losses, "x--", "session 2, resumed")):
    ax.plot(list(losses), list(losses.values()), style, label=label)
if session1_losses:
    ax.axvline(first_step + 0.5, color="red", lw=1, label=f"disconnect after step {first_step}")
    ax.axvspan(resumed_from_step + 0.5, first_step + 0.5, color="gray", alpha=0.2, label="steps trained twice")
ax.set(xlabel="optimizer step", ylabel="training loss", title=f"{model_name}, learning rate {learning_rate:g}")
ax.xaxis.get_major_locator().set_params(integer=True)
ax.legend(fontsize="small")
plt.show()
twice = sorted(set(session1_losses) & set(session2_losses))
for step in twice:
    print(f"step {step}: loss {session1_losses[step]:.6f} in session 1, {session2_losses[step]:.6f} after the resume")

# %% [markdown]
# **What to see:** the dashed curve picks up at the last checkpoint, and where both sessions trained a step (gray band) they
# got the same loss: the checkpoint restored everything the next step depends on.
#
# ## After the fine-tune: the same question

# %%
final_loss = trainer.evaluate()["eval_loss"]
reply_after = answer(trainer.model)
print(f"question: {question}\n")
print(f"before (held-out loss {base_loss:.4f}): {reply_before!r}\n")
print(f"after  (held-out loss {final_loss:.4f}): {reply_after!r}")

# %% [markdown]
# The held-out loss is the measurement; the answer is one greedy sample, an illustration (on the tiny model
# at most its form changes; with the 7B, judge the two yourself).
#
# ## The adapter: saved, reloaded, merged
#
# What the fine-tune made is the adapter, a few MB beside a base model anyone can download. `save_pretrained`
# on the peft model writes the adapter alone: its weights and `adapter_config.json`, which names the base.

# %%
adapter_dir = output_dir / "adapter"
trainer.model.save_pretrained(adapter_dir)
adapter_files = {f.name: f.stat().st_size for f in adapter_dir.iterdir()}
adapter_bytes = sum(adapter_files.values())
print(", ".join(f"{name} ({size / MIB:,.2f} MiB)" for name, size in sorted(adapter_files.items())))
print(f"the adapter: {adapter_bytes / MIB:,.2f} MiB on disk for {footprint.trainable_params:,} parameters")
trained_ids, trained_logits = greedy_ids(trainer.model, logits=True)  # to compare the reloaded model with
run_config = trainer.model.config  # this run's model, for the estimates below

# %% [markdown]
# A new session has only the files. Load the base as it was trained (the same 4-bit weights: `load_qlora`, whose
# fresh adapter `unload()` takes off again), put the saved adapter on it with `PeftModel.from_pretrained`, and
# ask the same question: the greedy answer must be the trained model's, token for token.

# %%

from peft import PeftModel

from helpers.memory import measure


def peak_bytes(readout):
    """The most a block held: allocated on the card on a GPU, else the process's RSS growth (libraries included)."""
    return readout["peak_allocated"] if "peak_allocated" in readout else readout["rss_peak_delta"]


trainer, model = free_memory(trainer, model)
with measure("reload") as reload_readout:
    base, tokenizer = load_qlora(model_id, smoke=smoke, checkpointing=False)
    reloaded = PeftModel.from_pretrained(base.unload(), adapter_dir)
reloaded_ids, reloaded_logits = greedy_ids(reloaded, logits=True)
reloaded_bytes = measure_footprint(reloaded).total_bytes
print(
    f"reloaded: {reloaded_bytes / MIB:,.2f} MiB of weights (4-bit base + adapter), peak {peak_bytes(reload_readout) / MIB:,.1f} MiB"
)
logits_diff = (reloaded_logits - trained_logits).abs().max().item()
print(f"same greedy answer as the trained model: {reloaded_ids == trained_ids} ({len(trained_ids)} tokens)")
print(f"largest difference in the logits on the question's {trained_logits.shape[1]} tokens: {logits_diff:g}")
assert reloaded_ids == trained_ids, "the reloaded adapter answers differently: was the base loaded another way?"

# %% [markdown]
# To serve the model without peft, merge the adapter into the base: `merge_and_unload` adds each adapter's update
# into its weight and drops the adapter. The base must be the 16-bit original (a 4-bit weight cannot hold the sum),
# all of it in memory at once, so the estimate says first whether this machine has the room. It runs on the CPU:
# a T4 could not hold a 16-bit 7B at all.

# %%
import psutil
from transformers import AutoModelForCausalLM

from helpers.models import embedded_dir

base, reloaded = free_memory(base, reloaded)
merge_source = embedded_dir() if tiny else merge_base_id
merge_dtype = torch.float16 if on_gpu and not bf16 else torch.bfloat16  # the card's 16-bit format (bf16 on a CPU)
merge_plan = checkpoint_bytes(run_config if tiny else merge_base_id, "bf16") + adapter_bytes
room = psutil.virtual_memory().available
print(f"merging needs about {merge_plan / GIB:,.3f} GiB in memory (estimated: every weight in 16 bits + the adapter);")
print(f"this machine has {room / GIB:,.1f} GiB free")
merged_dir, merged_bytes, merge_peak = output_dir / "merged", None, None
if merge_plan < 0.9 * room:  # a margin for what else the session holds
    with measure("merge", device="cpu") as merge_readout:
        base16 = AutoModelForCausalLM.from_pretrained(merge_source, dtype=merge_dtype)
        merged = PeftModel.from_pretrained(base16, adapter_dir).merge_and_unload()
        merged.save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
    merged_bytes, merge_peak = sum(p.numel() * p.element_size() for p in merged.parameters()), peak_bytes(merge_readout)
    merged_reply = tokenizer.decode(greedy_ids(merged), skip_special_tokens=True).strip()
    on_disk = sum(f.stat().st_size for f in merged_dir.iterdir()) / MIB
    print(
        f"merged: {merged_bytes / MIB:,.2f} MiB of {merge_dtype} weights, peak {merge_peak / MIB:,.1f} MiB; {merged_dir}: {on_disk:,.2f} MiB"
    )
    print(f"its answer: {merged_reply!r}")
    base16, merged = free_memory(base16, merged)
else:
    print(f"not merged here: merge on a machine with {merge_plan / GIB:,.0f} GiB free; the adapter + base is the model")

# %% [markdown]
# The merged answer may differ from the 4-bit one: it runs on the original 16-bit weights, not on their 4-bit
# rounding the adapter was trained against.
#
# To share the adapter, push it to the Hub: set `hub_repo` in the parameters cell and give the notebook a token
# with the Write role (huggingface.co/settings/tokens), named `HF_TOKEN`. On Colab: the key icon in the left bar,
# with "Notebook access" on; on Kaggle: Add-ons > Secrets, attached to this notebook; elsewhere `hf auth login`.
# `helpers.tokens.find_token` looks in all of them and never prints the token. The push is huggingface_hub's
# `HfApi(token=...).create_repo(hub_repo, private=True, exist_ok=True)` then `.upload_folder(...)`, each given a
# time limit; without a repo or a token, or when the push fails, the cell says why in one line and goes on.

# %%
from helpers.share import push_adapter

hub_url = push_adapter(adapter_dir, hub_repo)  # the repo's URL, or None and a line that says why

# %% [markdown]
# ### What the estimator said, beside what was measured
#
# The course opened with an estimate made before anything was loaded. Here it is for this run's model, step by
# step, beside this run's figures.

# %%
from helpers.resume import list_checkpoints

manifest_peak = load_manifest(list_checkpoints(output_dir)[0])["memory"]["peak_bytes"]  # the run's, as recorded
plan_run = estimate_training_memory(
    run_config if tiny else planned, per_device_batch=per_device_batch, seq_len=seq_len,
    precision="fp32" if not on_gpu else "bf16" if bf16 else "fp16", method="qlora", checkpointing=True,
    device="cuda" if on_gpu else "cpu",
)  # fmt: skip
steps_table = [
    ("training step, peak", plan_run.total, manifest_peak if on_gpu else None),  # on a CPU: RSS, not comparable
    ("4-bit base + adapter, loaded", plan_run.weights, footprint.total_bytes),
    ("adapter on disk", plan_run.trainable * 4, adapter_bytes),  # fp32: 4 bytes a parameter
    ("reloaded: base + adapter", plan_run.weights, reloaded_bytes),
    ("merged, 16-bit weights", plan_run.parameters * 2, merged_bytes),
]
print(f"{'step':<30}{'estimated':>14}{'measured':>14}")
for step, estimated, measured in steps_table:
    shown = f"{measured / MIB:,.2f} MiB" if measured is not None else "-"
    print(f"{step:<30}{estimated / MIB:>10,.2f} MiB{shown:>14}")
if not on_gpu:
    print("(no GPU: the training peak recorded is the process's RSS, libraries included, not the estimator's figure)")
if merged_bytes is None:
    print("(not merged on this machine: see above)")

# %% [markdown]
# ## The report a reviewer asks for
#
# The effective batch, the seed, the hardware and its peak memory, and the exact configuration: the manifest
# in the last checkpoint, read back from disk. One seed is one sample (notebook 06).

# %%
from helpers.manifest import MANIFEST_NAME
from helpers.resume import check_checkpoint, list_checkpoints

last_checkpoint = list_checkpoints(output_dir)[0]  # the newest: the one the run ended with
assert check_checkpoint(last_checkpoint) == [], check_checkpoint(last_checkpoint)
manifest_path = last_checkpoint / MANIFEST_NAME
manifest = load_manifest(last_checkpoint)
t, memory = manifest["training"], manifest["memory"]
peak = memory["peak_bytes"]
measured_by = {  # what the manifest's peak is, in words
    "torch.cuda.max_memory_allocated": "torch.cuda.max_memory_allocated: the most the model's tensors held on the card",
    "process peak RSS": "peak RSS of the whole Python process (libraries included): no GPU here",
}.get(memory["measured_by"], memory["measured_by"])
card = ", ".join(g["name"] for g in manifest["machine"]["gpus"]) or "CPU only, no GPU"
size = f"{peak / GIB:.2f} GiB" if peak >= GIB else f"{peak / MIB:,.0f} MiB"
lines = [
    (
        "model",
        f"{manifest['model']['id']}, 4-bit NF4 + LoRA r={manifest['model']['adapters']['default']['r']}, "
        f"{manifest['model']['trainable_parameters']:,} trainable parameters",
    ),
    (
        "effective batch",
        f"{t['effective_batch']} = per_device_batch {t['per_device_batch']} x grad_accum_steps "
        f"{t['grad_accum_steps']} x num_devices {t['num_devices']}",
    ),
    ("seed", f"{t['seed']} (one seed: no spread measured)"),
    ("learning rate", f"{t['args']['learning_rate']}, {t['args']['lr_scheduler_type']} schedule"),
    ("precision", "bf16" if t["args"]["bf16"] else "fp16" if t["args"]["fp16"] else "fp32"),
    (
        "steps",
        f"{manifest['step']} optimizer steps, epoch {manifest['epoch']:.2f}; resumed from step "
        f"{resumed_from_step} after a disconnect",
    ),
    ("final loss", f"{final_loss:.4f} on {len(held_out)} held-out examples"),
    ("hardware", f"{card}; platform {manifest['machine']['platform']}"),
    (
        "run time",
        f"{sum(s for _, s in sessions):,.1f} s of training for {sum(n for n, _ in sessions)} steps in "
        f"{len(sessions)} session(s) of this notebook run"
        if sessions
        else "trained in an earlier session",
    ),
    ("peak memory", f"{size}, {measured_by}"),
    ("libraries", ", ".join(f"{k} {v}" for k, v in manifest["packages"].items() if v)),
    ("code", f"kit {manifest['kit']['version']}, commit {manifest['kit']['commit'] or 'unknown'}"),
    (
        "tracking",
        f"wandb {manifest['tracking']['mode']}, run {manifest['tracking']['run_id']}"
        if manifest["tracking"]
        else "none",
    ),
    ("manifest", str(manifest_path)),
]
print("\n".join(f"{name:>16}: {value}" for name, value in lines))

# %% [markdown]
# Close the tracking run (offline, it prints the upload command).

# %%
sync_command = tracking.finish()

# %% [markdown]
# ## Quick checks
#
# Replace `None` with your answer and run the cell: it answers at once, with a hint or the explanation. If
# your instructor grades these, run all the cells, download the notebook and hand it in. Set your student
# id first: the second question gives each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q08_1
answer_q08_1 = None  # one letter, in quotes
check("q08_1", answer_q08_1)

# %%
# QUICK CHECK q08_2
answer_q08_2 = None  # a number of GiB, from your own numbers (set student_id first)
check("q08_2", answer_q08_2, student_id=student_id)

# %%
# QUICK CHECK q08_3
answer_q08_3 = None  # every letter that applies, in one string
check("q08_3", answer_q08_3)

# %%
# QUICK CHECK q08_4
answer_q08_4 = None  # one letter, in quotes
check("q08_4", answer_q08_4)

# %%
# QUICK CHECK q08_5
answer_q08_5 = None  # one letter, in quotes
check("q08_5", answer_q08_5)

# %%
# QUICK CHECK q08_6
answer_q08_6 = None  # every letter that applies, in one string
check("q08_6", answer_q08_6)

# %% [markdown]
# The next cell saves this run's figures for the course's own tests; nothing in it is for you to change.

# %% tags=["record"]
helpers.record("platform", platform)
helpers.record("output_dir", str(output_dir))
helpers.record("steps_trained", sum(n for n, _ in sessions))  # in this notebook run: 0 when a finished run is reused
helpers.record("model", model_name)
helpers.record("adapter_params", footprint.trainable_params)
helpers.record("planned_total_gib_t4", round(plan.total / GIB, 2))
helpers.record("train_examples", len(train))
helpers.record("tokens_in_loss", loss_tokens)
helpers.record("tokens_total", all_tokens)
helpers.record("base_loss_unmasked", base_loss_unmasked)
helpers.record("logged_around", list(logged_around))
helpers.record("adapter_bytes", adapter_bytes)
helpers.record("adapter_files", sorted(adapter_files))
helpers.record("reload_same_answer", reloaded_ids == trained_ids)
helpers.record("reload_logits_max_diff", logits_diff)
helpers.record("merge_plan_bytes", merge_plan)
helpers.record("merged_bytes", merged_bytes)
helpers.record("merged_dir", str(merged_dir) if merged_bytes is not None else None)
helpers.record("estimate_vs_measured", [[step, estimated, measured] for step, estimated, measured in steps_table])
helpers.record("question", question)
helpers.record("base_loss", base_loss)
helpers.record("reply_before", reply_before)
helpers.record("total_steps", total_steps)
helpers.record("learning_rate", learning_rate)
helpers.record("audit_codes", [f.code for f in findings])
helpers.record("session1_last_step", first_step)
helpers.record("session1_losses", {str(k): v for k, v in session1_losses.items()})
helpers.record("session2_losses", {str(k): v for k, v in session2_losses.items()})
helpers.record("resumed_from_step", resumed_from_step)
helpers.record("steps_redone", redone)
helpers.record("final_step", final_step)
helpers.record("reply_after", reply_after)
helpers.record("effective_batch", t["effective_batch"])
helpers.record("effective_batch_parts", [t["per_device_batch"], t["grad_accum_steps"], t["num_devices"]])
helpers.record("seed", t["seed"])
helpers.record("peak_memory_mib", round(peak / MIB, 1))
helpers.record("peak_memory_measured_by", memory["measured_by"])
helpers.record("final_loss", round(final_loss, 4))
helpers.record("train_seconds", round(sum(s for _, s in sessions), 1))
helpers.record("manifest_path", str(manifest_path))
helpers.record("manifest_step", manifest["step"])

# %% [markdown]
# ## In this notebook we:
#
# - put the checkpoints where a disconnect cannot reach them, and loaded a 7B for a 16 GB card with QLoRA, from a
#   copy saved in 4 bits (5.5 GB to download instead of 15.2);
# - put the data in the model's chat format and trained on the answers only (the prompt's labels set to -100);
# - wrote out the lesson's `TrainingArguments` (effective batch 1 x 16 x 1 = 16, seed 42) and audited them;
# - chose the run's folder by the settings that decide its result: the same ones go on with their run, a changed
#   one trains a new run beside it;
# - lost the session on purpose, resumed from the newest whole checkpoint, and plotted the loss across it;
# - asked the same question before and after the fine-tune, and measured the held-out loss both times;
# - saved the adapter alone, reloaded it onto a fresh base to the same answer, merged it into the 16-bit model
#   where the memory allowed, and set the estimator's figure beside each measured one;
# - wrote the report a reviewer needs from the manifest in the last checkpoint.
#
# **Change this, predict, run.**
#
# 1. Set `max_steps = 8` (on a GPU: `max_steps = 30` and `disconnect_after_step = 23`). Another length is another
#    run: predict the folder it trains in, which steps are trained twice and where session 2 resumes, then run
#    all and check the gray band. Set `max_steps = -1` again and run all: which folder, and how many steps trained?
# 2. Set `tiny_learning_rate = 2e-4`, the 7B's rate (on a GPU, where the 7B trains: `learning_rate = 2e-5`).
#    Predict the folder it trains in, and the held-out loss after the fine-tune against before, then run all.
#
# That is the course: pick the card, count the memory, make it fit, track it, and make it survive.
