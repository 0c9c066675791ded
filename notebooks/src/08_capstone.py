# %% [markdown]
# # 08 · Capstone: the full recipe on a 7B model, a disconnect survived, a report a reviewer trusts
#
# **Hardware:** a free Colab T4 (16 GB), one of Kaggle's T4s, or a rented A100. Without a GPU or
# the Hub it runs the same cells on the kit's embedded tiny model.
# **Time:** about 30 minutes on a T4 for the 7B model, download included; under 30 seconds headless on a CPU.
#
# Everything the course took apart, put back together in one run:
#
# 1. the lesson's `TrainingArguments`: per-device batch 1, 16 accumulation steps, gradient
#    checkpointing, mixed precision for the card, learning rate 2e-4, 3 epochs, a loss logged every
#    10 steps, seed 42, tracked;
# 2. on QLoRA (notebook 05): a 7B model in 4 bits with a LoRA adapter, on a 16 GB card;
# 3. with the live memory readout while it trains;
# 4. checkpoints in a folder that outlives the runtime, and a resume after a disconnect, shown by
#    cutting the run in two;
# 5. the report a reviewer asks for, every figure read back from what the run saved.

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
smoke = False  # True: the embedded tiny model and a tiny slice of the data (the runner's --smoke sets it)
model_id = "Qwen/Qwen2.5-7B"  # the capstone's 7B; "Qwen/Qwen2.5-0.5B" trains in a few minutes instead
run_name = "capstone"  # the run's folder; run the notebook again with the same name to resume, a new one starts afresh
per_device_batch = 1  # sequences per micro-batch: what a 16 GB card holds for a 7B
grad_accum_steps = 16  # effective batch = 1 x 16 x 1 = 16
num_train_epochs = 3
learning_rate = 2e-4  # higher than for a full fine-tune: normal for LoRA
logging_steps = 10  # a loss every 10 optimizer steps
seed = 42
seq_len = 512  # tokens kept per example; the course's examples are shorter, so none is cut
max_steps = -1  # -1: the epochs decide (3 epochs of 21 steps on the whole dataset); the runner's smoke run sets 4
save_steps = 20  # a checkpoint every 20 optimizer steps: at most 20 x 16 = 320 sequences of work lost to a disconnect
disconnect_after_step = 22  # the simulated disconnect: the first session stops here, 2 steps past its last checkpoint

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
# ## A folder that survives a disconnect
#
# A free session ends when it likes: Colab after an idle spell or a few hours, Kaggle at its
# session limit. With it goes the runtime's disk. A checkpoint is only worth something where the
# next session can find it:
#
# - **Colab:** Google Drive, mounted at `/content/drive` (Colab asks you to allow access). If the
#   mount fails, this notebook says so loudly and falls back to `/content`, which does not survive.
# - **Kaggle:** `/kaggle/working`. It lasts as long as the session; to outlive it, use Save Version >
#   Save & Run All, which runs the notebook in the background (no browser needed, up to Kaggle's
#   session time limit) and keeps `/kaggle/working` as the version's output. To resume from it in a
#   later session, add that output as input and copy its `runs/<run_name>` folder back into
#   `/kaggle/working/runs/` (inputs are read-only) before running this notebook.
# - **Your own machine or a rented one:** `build/runs` on its disk (`build/` is the kit's scratch
#   folder, which git ignores).

# %%
import shutil
from pathlib import Path

import helpers
from helpers import GIB, MIB  # bytes in a GiB (2**30) and a MiB (2**20)
from helpers.env import describe, detect_platform

machine = describe()
print(machine.summary())
platform = detect_platform()
if platform == "colab":
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
output_dir = (runs / (f"{run_name}-smoke" if smoke else run_name)).resolve()
if smoke and output_dir.exists():
    shutil.rmtree(output_dir)  # a smoke run always starts afresh, in its own folder, never a real run's
output_dir.mkdir(parents=True, exist_ok=True)
print(f"\ncheckpoints go to {output_dir}\nsurvives a disconnect: {survives}")
helpers.record("platform", platform)
helpers.record("output_dir", str(output_dir))

# %% [markdown]
# ## The model: QLoRA
#
# `load_qlora` loads the model in 4-bit NF4 with double quantization, computing in the card's
# precision, turns on gradient checkpointing and puts a LoRA adapter (rank 16) on every linear
# layer, then prints the footprint it measured. Without a GPU or the Hub it loads the embedded tiny
# model instead, with a banner that says so.

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
helpers.record("model", model_name)

# %% [markdown]
# Before activations, the bill has two parts: the frozen base (4 bits and a little per quantized
# weight, about 0.52 bytes; embeddings, norms and the output head stay in higher precision) and
# the adapters, which train like any model: an fp32 weight, an fp32 gradient and AdamW's two fp32
# moments, 16 bytes per parameter. Measured on the model just loaded, and estimated for the 7B on
# a T4 by the kit's estimator (notebook 01) from its shape alone:

# %%
from helpers.catalog import load_catalog
from helpers.estimate import estimate_training_memory
from helpers.qlora import measure_footprint

footprint = measure_footprint(model)
adapters_training = footprint.trainable_params * 16  # fp32 weight + gradient + two AdamW moments
print(
    f"loaded model, measured: frozen base {(footprint.quantized_bytes + footprint.other_bytes) / MIB:,.2f} MiB "
    f"({footprint.bits_per_quantized_weight:.2f} bits per quantized weight); {footprint.trainable_params:,} adapter "
    f"parameters x 16 bytes = {adapters_training / MIB:,.2f} MiB to train them"
)
catalog = {entry.get("hub_id"): name for name, entry in load_catalog("models").items()}
planned = catalog.get(model_id, "Qwen2.5-7B")  # the model asked for, by its shape
plan = estimate_training_memory(
    planned, batch_size=per_device_batch, seq_len=seq_len, precision="fp16", method="qlora", checkpointing=True
)
print(
    f"{planned} on a T4, estimated: weights {plan.weights / GIB:.2f} GiB ({plan.parameters / 1e9:.1f}B "
    f"parameters), adapter gradients + AdamW {(plan.gradients + plan.optimizer) / GIB:.2f} GiB, activations "
    f"{plan.activations / GIB:.2f} GiB; {plan.total / GIB:.1f} GiB in all with the CUDA context and the "
    f"allocator's slack -> fits a T4: {plan.fits('T4')}"
)
helpers.record("adapter_params", footprint.trainable_params)
helpers.record("planned_total_gib_t4", round(plan.total / GIB, 2))

# %% [markdown]
# The weights are more than 0.52 bytes x 7.6B: Qwen2.5's vocabulary of 152,064 tokens makes its
# embedding and its output head about 1.1 billion parameters, which QLoRA leaves unquantized (and
# the k-bit preparation keeps in fp32). It still fits a 16 GB card with room for the activations.

# %% [markdown]
# ## The data
#
# The course dataset as instruction / response pairs, a few held out to measure the final loss on
# examples the model never trained on. With one sequence per micro-batch nothing needs padding.
# On the embedded tiny model (and in the smoke run) a slice of 72 examples stands in for the
# 349, so that the lesson's 3 epochs take seconds on a CPU.

# %%
import datasets

from helpers.data import load_course_data

datasets.disable_progress_bars()  # one line per step is enough output


def to_features(row):
    text = f"### Instruction:\n{row['instruction']}\n\n### Response:\n{row['response']}{tokenizer.eos_token}"
    return tokenizer(text, truncation=True, max_length=seq_len)


tiny = smoke or is_embedded(model)  # the tiny model runs the recipe, it does not need the data
rows = load_course_data().shuffle(seed=seed)
rows = rows.select(range(72)) if tiny else rows
split = rows.train_test_split(test_size=8 if tiny else 16, seed=seed)
train = split["train"].map(to_features, remove_columns=rows.column_names)
held_out = split["test"].map(to_features, remove_columns=rows.column_names)
lengths = [len(x) for x in train["input_ids"]]
print(f"{len(train)} training examples ({min(lengths)} to {max(lengths)} tokens), {len(held_out)} held out")
helpers.record("train_examples", len(train))

# %% [markdown]
# ## Tracking, and where this run stands
#
# Before building anything, look in the run's folder. A checkpoint holds the adapter's weights and
# also the optimizer's and the scheduler's state, the random number generators and the position in
# the data, which is what lets a run go on exactly where it stopped. The Trainer's own
# `resume_from_checkpoint=True` takes the highest-numbered folder whatever state it is in, and a
# disconnect in the middle of a save leaves a half-written one; `latest_valid_checkpoint` returns the
# newest checkpoint that is whole (skipping the others, with the reason), or None on a first run.
# If there is one, its manifest names the tracking run, and `init_tracking` continues that run
# instead of starting a second one. Without a W&B key (or without internet) the run is
# recorded offline, in the run's folder, and the cell prints the command that uploads it later.

# %%
from helpers.manifest import load_manifest
from helpers.resume import latest_valid_checkpoint
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
    return init_tracking(
        "kit-08-capstone", config, name=run_name, dir=output_dir, run_id=previous["run_id"] if previous else None
    )


resume_from = latest_valid_checkpoint(output_dir)
tracking = start_tracking(resume_from)

# %% [markdown]
# ## The lesson's TrainingArguments
#
# The lesson's values, with two choices made for you: the precision (bf16 only from compute
# capability 8.0, fp16 on a T4, fp32 on a CPU, `training_args` reads it from the card) and the
# tracking (`report_to` from `init_tracking`). Beyond the lesson: when to save and how many
# checkpoints to keep (2: the newest, and one to fall back on if the newest was cut off).
# `training_args` prints the effective batch; `audit` then checks the settings for the mistakes
# of notebooks 02 to 06.

# %%
from helpers.audit import audit
from helpers.training import training_args

total_steps = max_steps if max_steps > 0 else -(-len(train) // (per_device_batch * grad_accum_steps)) * num_train_epochs
if not save_steps < disconnect_after_step < total_steps:  # a short run (the smoke run): cut it in two around its middle
    save_steps = max(1, total_steps // 2)
    disconnect_after_step = min(save_steps + 1, total_steps - 1)
    print(
        f"a {total_steps}-step run: a checkpoint every {save_steps} steps, the disconnect after step "
        f"{disconnect_after_step}"
    )
args = training_args(
    str(output_dir),
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,
    gradient_checkpointing=True,  # already on in the QLoRA model; the lesson's line, kept for the record
    learning_rate=learning_rate,
    num_train_epochs=num_train_epochs,
    logging_steps=logging_steps,
    report_to=tracking.report_to,
    seed=seed,
    max_steps=max_steps,
    save_strategy="steps",
    save_steps=save_steps,
    save_total_limit=2,
    disable_tqdm=True,  # the live readout below replaces the progress bar
    dataloader_pin_memory=torch.cuda.is_available(),
)
findings = audit(args, model=model, seq_len=seq_len)
print("audit: " + (f"{len(findings)} finding(s), each printed above" if findings else "nothing to fix"))
helpers.record("total_steps", total_steps)
helpers.record("audit_codes", [f.code for f in findings])

# %% [markdown]
# ## Train, until the connection drops
#
# The Trainer gets three callbacks: `LiveMemoryCallback` refreshes one line with the step, the
# loss and the memory every `logging_steps` steps; `ManifestCallback` writes `run_manifest.json`
# into each checkpoint (every argument, the seed, the effective batch, the model, the data's
# fingerprint, the library versions, the card, the peak memory); and, for this demonstration
# only, `SimulatedDisconnect` ends the session after `disconnect_after_step`, a little past a
# checkpoint, as a dropped connection would. `resume_from_checkpoint` is the value found above:
# None on a first run, so training starts from scratch.
#
# One trap, handled by `train_or_report`: handed the *last* checkpoint of a finished run, the
# Trainer does not stop; it trains one step past the end. So when the checkpoint's own
# `trainer_state.json` says the run is complete, nothing is trained: its adapter weights are loaded
# for the report instead.

# %%
import json
import time

from peft import set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback

from helpers.live import LiveMemoryCallback
from helpers.manifest import ManifestCallback


class SimulatedDisconnect(TrainerCallback):
    """End training after `step`, without a save: all that is left is what was already on disk."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def make_trainer(model, *callbacks):
    live = LiveMemoryCallback(every_n_steps=min(logging_steps, max(1, total_steps // 4)))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)  # labels = inputs, padding masked out
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=collator,
        callbacks=[live, ManifestCallback(model_id=model_name, dataset=train), *callbacks],
    )
    return trainer, live


sessions = []  # (steps trained, seconds) for each call of train_or_report that trained


def train_or_report(trainer, checkpoint):
    """Train on from `checkpoint` (None: from scratch); return (step reached, steps in the run)."""
    if checkpoint:
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
        if state["global_step"] >= state["max_steps"]:
            print(
                f"{checkpoint} ends a finished run (step {state['global_step']} of {state['max_steps']}): nothing "
                "left to train, its adapter is loaded for the report. A new run_name trains a new run."
            )
            set_peft_model_state_dict(trainer.model, load_file(Path(checkpoint) / "adapter_model.safetensors"))
            trainer.remove_callback(LiveMemoryCallback)  # no training to show (and it expects one to have begun)
            return state["global_step"], state["max_steps"]
    start = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=checkpoint)
    sessions.append((result.global_step - (state["global_step"] if checkpoint else 0), time.perf_counter() - start))
    return result.global_step, trainer.state.max_steps


trainer, live = make_trainer(model, SimulatedDisconnect(disconnect_after_step))
first_step, _ = train_or_report(trainer, resume_from)
print(
    f"\nsession 1 ended at step {first_step}; on disk: "
    f"{', '.join(sorted(p.name for p in output_dir.glob('checkpoint-*')))}"
)
helpers.record("session1_last_step", first_step)

# %% [markdown]
# ## After the disconnect
#
# A disconnect takes the whole runtime: the model in memory, the optimizer's state, every step
# since the last checkpoint. So start as a new session would: let go of the model and the Trainer,
# load the model again, build a new Trainer on the same folder, and let `latest_valid_checkpoint`
# find where to go on from. After a real disconnect this is simply the notebook run again from the
# top: the same cells find the same folder.
#
# Resuming restores the adapter's weights, AdamW's state, the learning-rate schedule, the random
# number generators and the position in the data, so the run goes on as if nothing had happened
# (the kit's tests kill a run with SIGKILL and check that the resumed one ends with the same loss
# and weights, bit for bit). The steps after the last checkpoint are trained again.

# %%
from helpers.oom import free_memory

tracking.finish()  # a real disconnect leaves the tracking run unfinished; resuming it works the same
trainer, model = free_memory(trainer, model)
seed_everything(seed)
model, tokenizer = load_qlora(model_id, smoke=smoke)
resume_from = latest_valid_checkpoint(output_dir)
resumed_from_step = load_manifest(resume_from)["step"] if resume_from else 0
tracking = start_tracking(resume_from)
trainer, live = make_trainer(model)
final_step, run_steps = train_or_report(trainer, resume_from)
redone = first_step - resumed_from_step
print(
    f"\nsession 2 resumed from step {resumed_from_step} (session 1 had reached step {first_step}: {redone} "
    f"step(s) trained again) and finished at step {final_step} of {run_steps}"
)
assert final_step == run_steps
helpers.record("resumed_from_step", resumed_from_step)
helpers.record("steps_redone", redone)
helpers.record("final_step", final_step)

# %% [markdown]
# ## The report a reviewer asks for
#
# A number on its own convinces nobody. Next to the result a reviewer wants the effective batch
# (not the per-device batch), the seed, the hardware and its peak memory, and the exact
# configuration, which here is the manifest in the last checkpoint: read back from disk, not from
# the notebook's variables. The final loss is measured on the held-out examples. One seed is one
# sample: before claiming that one setting beats another, run a few seeds and report the mean and
# the spread (notebook 06).

# %%
from helpers.manifest import MANIFEST_NAME
from helpers.resume import check_checkpoint, list_checkpoints

final_loss = trainer.evaluate()["eval_loss"]
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
# Close the tracking run; offline, this prints the command that uploads it once a W&B key and the
# internet are at hand.

# %%
sync_command = tracking.finish()

# %% [markdown]
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run
# the cell: it answers at once, with a hint when the answer is not right yet and the explanation
# when it is. Each check prints a receipt (question, attempt, result) that stays in the notebook.
# If your instructor grades these, keep each answer in its `answer_...` line, run all the cells,
# then download the notebook (File > Download > Download .ipynb) and hand it in. Start with your
# student id: the second question gives each student their own numbers.

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
answer_q08_2 = None  # a number of GB, from your own numbers (set student_id first)
check("q08_2", answer_q08_2, student_id=student_id)

# %%
# QUICK CHECK q08_3
answer_q08_3 = None  # every letter that applies, in one string
check("q08_3", answer_q08_3)

# %% [markdown]
# ## In this notebook we:
#
# - put the checkpoints where a disconnect cannot reach them: Google Drive on Colab, the working
#   folder on Kaggle (kept by Save Version), the disk elsewhere;
# - loaded a 7B model for a 16 GB card with QLoRA;
# - trained with the lesson's `TrainingArguments` (effective batch 1 x 16 x 1 = 16, checkpointing,
#   the card's precision, seed 42, tracking), audited them first, and watched memory live;
# - lost the session on purpose, and resumed in a fresh one from the newest whole checkpoint, the
#   tracking run continued;
# - wrote the report a reviewer needs, read back from the manifest saved with the last checkpoint:
#   effective batch, seed, hardware and peak memory, the configuration and the library versions;
# - checked what we learned with three quick checks.
#
# That is the course: pick the card, count the memory, make it fit, track it, and make it survive.
