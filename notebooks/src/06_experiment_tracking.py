# %% [markdown]
# # 06 · Experiment tracking: seeds, spread, and the config behind every checkpoint
#
# **Hardware:** any runtime. On a T4 it fine-tunes SmolLM2-135M; on a CPU it uses the embedded tiny
# model. Runs go to Weights & Biases when a key is set (a Colab or Kaggle secret named
# `WANDB_API_KEY`), and are saved offline, to upload later, when not.
# **Time:** about 3 minutes on a T4 including the install; under 30 seconds headless on a CPU.
#
# A fine-tuning result is a number from one training run, and a training run is one draw from a
# random process: the order of the data, the dropout masks, the initial values of new weights all
# come from a random generator. This notebook:
#
# 1. trains twice with the same seed and gets the same losses, bit for bit;
# 2. trains with other seeds, sees the spread, and reports the result as mean ± standard deviation;
# 3. tracks every run with wandb, online or offline, without ever stopping at a login prompt;
# 4. saves the run's config next to every checkpoint, picks the best checkpoint and reads back
#    exactly what produced it.

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
seeds = [0, 1, 2]  # one run per seed: n = 3 is the least that shows a spread
per_device_batch = 4  # sequences per micro-batch
grad_accum_steps = 2  # effective batch = 4 x 2 x 1 = 8
seq_len = 64  # tokens per sequence
learning_rate = 2e-4  # a full fine-tune of a small model
max_steps = 20  # optimizer steps per run; evaluated and saved at half way and at the end
project = "kit-06-tracking"  # the wandb project the runs go to

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
# ## The model, the data and one training run
#
# The course dataset as one stream of tokens, cut into sequences of `seq_len` (`pack_course_data`,
# as in notebooks 03 to 05); the last 16 sequences are held out for evaluation. `train(seed)` is
# one complete run: it seeds every random generator with `seed_everything`, copies the base model,
# and trains it with the Trainer (which seeds again from `seed=`).

# %%
import copy

import torch

import helpers
from helpers.data import pack_course_data
from helpers.env import describe
from helpers.models import load_model
from helpers.seeds import seed_everything
from helpers.training import training_args

machine = describe()
print(machine.summary())
base, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)  # fp32; a GPU trains it under autocast
split = pack_course_data(tokenizer, seq_len).train_test_split(test_size=16, shuffle=False)  # the last 16 held out
train_data, eval_data = split["train"], split["test"]
save_every = max(1, max_steps // 2)
print(f"{len(train_data)} training and {len(eval_data)} evaluation sequences of {seq_len} tokens")
settings = dict(
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,
    learning_rate=learning_rate,
    max_steps=max_steps,
    logging_steps=1,
    disable_tqdm=True,
    dataloader_pin_memory=torch.cuda.is_available(),
)
_ = training_args("build/checkpoints", seed=seeds[0], **settings)  # what every run below uses, each with its seed

# %%
from transformers import PrinterCallback, Trainer
from transformers.utils import logging as hf_logging

from helpers.manifest import ManifestCallback

hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint


def train(seed, output_dir="build/checkpoints", report_to="none", save=False):
    """One run from the base model: returns the Trainer, its losses in trainer.state.log_history."""
    seed_everything(seed)
    model = copy.deepcopy(base)  # every run starts from the same weights
    args = training_args(
        output_dir,
        seed=seed,
        report_to=report_to,
        quiet=True,
        **settings,
        eval_strategy="steps" if save else "no",
        eval_steps=save_every,
        save_strategy="steps" if save else "no",
        save_steps=save_every,
        save_only_model=True,
    )  # weights and manifest: enough to evaluate, not to resume
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        callbacks=[ManifestCallback(dataset=train_data)],
    )  # a manifest in every checkpoint
    trainer.remove_callback(PrinterCallback)  # the losses are printed below, one line per run
    trainer.train()
    return trainer


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


# %% [markdown]
# ## Same seed, same losses
#
# Train twice with seed 0 and compare the loss of every step.

# %%
first = losses(train(seeds[0]))
again = losses(train(seeds[0]))
same_seed_diff = max(abs(a - b) for a, b in zip(first, again))
print(f"seed {seeds[0]}, run 1: loss by step {' '.join(f'{x:.6f}' for x in first)}")
print(f"seed {seeds[0]}, run 2: loss by step {' '.join(f'{x:.6f}' for x in again)}")
print(
    f"largest difference between the two runs: {same_seed_diff!r}"
    + (" (identical, bit for bit)" if same_seed_diff == 0 else "")
)
helpers.record("same_seed_max_abs_diff", same_seed_diff)

# %% [markdown]
# On a CPU the same seed gives exactly the same run: every operation is computed the same way, in
# the same order. On a GPU some kernels add numbers with atomic operations, in an order that varies
# from run to run, so the losses can differ in their last digits; `full_determinism=True` in
# TrainingArguments forbids those kernels, at some cost in speed.
#
# ## Tracking every run, without a login prompt
#
# `init_tracking(project, config)` starts a wandb run. It looks for a key in the `WANDB_API_KEY`
# variable, in Colab's secrets, in Kaggle's secrets and in a saved `wandb login`, and goes online
# only when it finds one and the server answers within seconds. Otherwise the run is written to
# disk, offline, and it prints the `wandb sync` command that uploads it later. It never asks for
# anything, so Run all never hangs on an input box, and it never prints or saves the key.
#
# It also sets `WANDB_MODE` for this process, so that a run the Trainer starts by itself follows
# the same choice; when the first run goes offline, the runs after it say that they found it set.
#
# `ManifestCallback` writes `run_manifest.json` into every checkpoint folder the Trainer saves:
# every training argument, the seed, the effective batch, the model and its revision, the
# dataset's fingerprint, the package versions, the kit's commit, the machine and the peak memory.
#
# ## Other seeds: the spread
#
# `run_seeds(train_fn, seeds)` seeds, calls `train_fn(seed)` for each seed, and collects the number
# it returns: here the evaluation loss at the end of the run. Each run is tracked, evaluated and
# saved at half way and at the end.

# %%
import shutil
from pathlib import Path

from helpers.seeds import run_seeds
from helpers.tracking import init_tracking

runs_dir = Path("build/runs")
shutil.rmtree(runs_dir, ignore_errors=True)  # checkpoints of an earlier run of this cell must not join the comparison
config = {
    "model_id": model_id,
    "per_device_batch": per_device_batch,
    "grad_accum_steps": grad_accum_steps,
    "effective_batch": per_device_batch * grad_accum_steps,
    "seq_len": seq_len,
    "learning_rate": learning_rate,
    "max_steps": max_steps,
}
trainers = {}


def train_and_track(seed):
    tracking = init_tracking(project, {**config, "seed": seed}, name=f"seed-{seed}")
    trainers[seed] = train(seed, runs_dir / f"seed-{seed}", report_to=tracking.report_to, save=True)
    tracking.finish()
    return [h["eval_loss"] for h in trainers[seed].state.log_history if "eval_loss" in h][-1]


runs = run_seeds(train_and_track, seeds, metric="eval_loss")

# %% [markdown]
# The training losses of every seed, step by step, beside the first run of seed 0 from above:

# %%
print(f"{'step':>4} {'seed ' + str(seeds[0]) + ' above':>14}" + "".join(f"{'seed ' + str(s):>12}" for s in seeds))
for step, row in enumerate(zip(first, *(losses(trainers[s]) for s in seeds)), 1):
    print(f"{step:4} {row[0]:14.6f}" + "".join(f"{x:12.6f}" for x in row[1:]))
in_sweep_diff = max(abs(a - b) for a, b in zip(first, losses(trainers[seeds[0]])))
other_seed_diff = max((abs(a - b) for s in seeds[1:] for a, b in zip(first, losses(trainers[s]))), default=0.0)
print(
    f"seed {seeds[0]} again, now tracked and saved: largest difference {in_sweep_diff!r}; "
    f"other seeds: up to {other_seed_diff:.6f}"
)
helpers.record("seed_in_sweep_max_abs_diff", in_sweep_diff)
helpers.record("other_seed_max_abs_diff", other_seed_diff)

# %% [markdown]
# Tracking, evaluation and checkpoints do not change the run: the same seed gives the same losses
# again (on a GPU, up to the last digits). Another seed changes the order in which the training
# sequences come, and from the first step on each run takes its own path.
#
# ## The result: mean ± standard deviation over seeds

# %%
import math

from helpers.seeds import plot_seeds

decimals = max(1, 1 - math.floor(math.log10(runs.std))) if runs.std > 0 else 4  # two significant digits of the std
print(
    f"final eval loss = {runs.mean:.{decimals}f} ± {runs.std:.{decimals}f} (mean ± std over n = {len(seeds)} "
    f"seeds; from {min(runs.values):.{decimals}f} to {max(runs.values):.{decimals}f})"
)
print(
    f"a change to the recipe must move the mean by more than a couple of standard deviations, "
    f"2 x {runs.std:.{decimals}f} = {2 * runs.std:.{decimals}f}, before these seeds tell it from noise"
)
helpers.record("eval_loss_per_seed", runs.values)
helpers.record("eval_loss_mean", runs.mean)
helpers.record("eval_loss_std", runs.std)
ax = plot_seeds(runs)

# %% [markdown]
# ## Why one seed's number is not a result
#
# Had this notebook run only one seed, it would have reported one of the dots above, and nothing
# in that number says how far the next run would land. The standard deviation is that distance. A
# change to the recipe (a learning rate, a data filter) that moves the mean by less than a couple of
# standard deviations has not been shown to do anything: rerunning the baseline with another seed
# moves it as much. So report the mean, the standard deviation and n, over at least three seeds,
# and compare recipes by their means *and* spreads. (The standard deviation here is the sample
# one, divided by n - 1, as `statistics.stdev` and `numpy.std(ddof=1)` compute it.)
#
# ## The best checkpoint, and what produced it
#
# Every checkpoint folder holds its manifest. The manifest also keeps the last evaluation before
# the save, so choosing the best checkpoint needs nothing but the manifests:

# %%
from helpers.manifest import load_manifest

checkpoints = sorted(runs_dir.glob("seed-*/checkpoint-*"))
eval_loss = {c: load_manifest(c)["metrics"]["last_eval_log"]["eval_loss"] for c in checkpoints}
for c, loss in eval_loss.items():
    print(f"{c}: eval loss {loss:.6f}")
best = min(checkpoints, key=eval_loss.get)
print(f"\nbest: {best}; its folder holds {', '.join(sorted(p.name for p in best.iterdir()))}")

# %%
manifest = load_manifest(best)
training, model_info, kit = manifest["training"], manifest["model"], manifest["kit"]
print(f"read back from {best / 'run_manifest.json'}:")
print(f"  seed              {training['seed']}")
print(
    f"  effective batch   {training['effective_batch']} = per_device_batch {training['per_device_batch']} x "
    f"grad_accum_steps {training['grad_accum_steps']} x num_devices {training['num_devices']}"
)
print(
    f"  learning rate     {training['args']['learning_rate']}; saved at step {manifest['step']} "
    f"of {training['args']['max_steps']}"
)
print(
    f"  model             {model_info['id']} (revision {model_info['revision']}, commit {model_info['commit']}), "
    f"{model_info['trainable_parameters']:,} trainable parameters"
)
print(f"  data              fingerprint {manifest['data']['fingerprint']}, {manifest['data']['num_rows']} rows")
print(f"  packages          {', '.join(f'{k} {v}' for k, v in manifest['packages'].items())}")
print(
    f"  kit               {kit['version']}, commit {(kit['commit'] or 'unknown')[:12]}"
    + (" with uncommitted changes" if kit["dirty"] else "")
)
print(
    f"  machine           {manifest['machine']['platform']}, "
    f"{', '.join(g['name'] for g in manifest['machine']['gpus']) or 'no GPU'}, "
    f"precision {manifest['machine']['precision']['name']}"
)
tracked = manifest["tracking"]  # None when tracking was disabled
print(
    "  tracking          "
    + (f"{tracked['mode']} wandb run {tracked['run_id']} in project {tracked['project']}" if tracked else "none")
)
helpers.record("best_checkpoint", best.as_posix())
helpers.record("best_checkpoint_seed", int(best.parent.name.removeprefix("seed-")))
helpers.record("manifest_seed", training["seed"])
helpers.record("manifest_effective_batch", training["effective_batch"])
helpers.record("manifest_learning_rate", training["args"]["learning_rate"])

# %% [markdown]
# Six months from now, that file answers "how was this checkpoint made?" without your memory or
# your notebook: rerun with the same seed, arguments, data, model revision and package versions,
# and you get it back. Nothing secret is in it: the callback leaves out the environment and scrubs
# the values of secret-looking variables (keys, tokens, passwords) before writing.
#
# ## Quick checks
#
# Three questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Each check prints a receipt (question, attempt, result) that stays in the notebook. If
# your instructor grades these, keep each answer in its `answer_...` line, run all the cells, then
# download the notebook (File > Download > Download .ipynb) and hand it in. Set your student id
# first: the second question gives each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q06_1
answer_q06_1 = None  # one letter, in quotes
check("q06_1", answer_q06_1)

# %%
# QUICK CHECK q06_2
answer_q06_2 = None  # a number, from your own numbers (set student_id first)
check("q06_2", answer_q06_2, student_id=student_id)

# %%
# QUICK CHECK q06_3
answer_q06_3 = None  # one letter, in quotes
check("q06_3", answer_q06_3)

# %% [markdown]
# ## In this notebook we:
#
# - trained twice with one seed and got the same losses, bit for bit on a CPU, and saw why a GPU
#   may differ in the last digits;
# - trained with other seeds and saw each take its own path;
# - reported the result as mean ± standard deviation over n seeds, with a plot, and saw why one
#   seed's number is not a result;
# - tracked every run with wandb, online with a key and offline without, never prompting;
# - wrote a manifest into every checkpoint, chose the best checkpoint from the manifests alone, and
#   read back the seed, effective batch, learning rate, model, data, package versions and commit
#   that produced it.
#
# Next: notebook 07 trains on Kaggle's two T4s at once.
