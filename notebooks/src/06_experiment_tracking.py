# %% [markdown]
# # 06 · Experiment tracking: seeds, learning rates, and the config behind every checkpoint
#
# **Hardware:** any runtime. On a T4 it fine-tunes SmolLM2-135M; on a CPU it uses the kit's tiny built-in
# model. Runs go to Weights & Biases when a key is set (a Colab or Kaggle secret named `WANDB_API_KEY`),
# and are saved offline, to upload later, when not.
# **Time:** about 3 minutes on a T4 including the install (an estimate: not yet timed on one); 27-47 s on a CPU (measured on 2 machines: 27 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06; 47 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# A fine-tuning result is one draw from a random process. This notebook tracks runs with wandb, repeats a
# run exactly with a seed, measures which learning rate suits LoRA and which a full fine-tune, measures the
# spread across seeds, and reads back the config saved next to a checkpoint.

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
smoke = False  # True: train the kit's tiny built-in model, whatever the machine (seconds; good for a first try)
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model; needs a GPU and the Hub
seeds = [0, 1, 2]  # one run per seed: n = 3 is the least that shows a spread
per_device_batch = 4  # sequences per micro-batch
grad_accum_steps = 2  # effective batch = 4 x 2 x 1 = 8
seq_len = 64  # tokens per sequence
learning_rate = 5e-5  # on a real model: 5e-5 for a full fine-tune (as here), 2e-4 for LoRA or QLoRA
tiny_learning_rate = 3e-3  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)
max_steps = 20  # optimizer steps per run
sweep_learning_rates = [5e-5, 2e-4, 3e-3, 1e-2, 3e-2]  # a real model's two, then the tiny model's; each both ways
sweep_steps = 10  # optimizer steps per run of the sweep
project = "kit-06-tracking"  # the wandb project the runs go to

# %%
# The setup in one call: one GPU (Kaggle shows two; the pin must come before CUDA starts), what this
# machine is and the precision it trains in, and the seed, so a rerun draws the same numbers.
import helpers

machine = helpers.start(seed=seeds[0])

# %% [markdown]
# ## The model and the data
#
# The course dataset in sequences of `seq_len` tokens; the last 16 are held out to measure the loss on text
# the model never trained on.

# %%
import copy

import torch

from helpers.data import pack_course_data
from helpers.models import is_embedded, load_model

base, tokenizer = load_model(model_id, smoke=smoke, dtype=torch.float32)  # fp32; a GPU trains it under autocast
if is_embedded(base) and not torch.cuda.is_available():
    torch.set_num_threads(1)  # the tiny model's matrices are too small to share out: one CPU thread is fastest
if is_embedded(base):  # its 0.3M weights need far larger steps than a real model's
    print(
        f"tiny model: learning rate {tiny_learning_rate:g}, not a real model's {learning_rate:g} (see the parameters cell)"
    )
    learning_rate = tiny_learning_rate
split = pack_course_data(tokenizer, seq_len).train_test_split(test_size=16, shuffle=False)  # the last 16 held out
train_data, eval_data = split["train"], split["test"]
print(f"{len(train_data)} training and {len(eval_data)} held-out sequences of {seq_len} tokens")


def losses(trainer):  # the training loss at every logged step
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


# %% [markdown]
# ## The plain recipe: wandb.init, then TrainingArguments(report_to="wandb")
#
# As the transformers and wandb docs write it. `mode="offline"` saves the run to disk instead of asking for a
# login (`wandb sync` uploads it later); `report_to="wandb"` makes the Trainer log every loss into it.

# %%
import wandb
from transformers import PrinterCallback, Trainer, TrainingArguments

on_gpu = torch.cuda.is_available()
bf16 = on_gpu and torch.cuda.get_device_capability()[0] >= 8  # bf16 from compute capability 8.0 (A100, L4)
quiet = wandb.Settings(quiet=True)  # wandb's lines at the start, not its 20-line table of every value at the end
run = wandb.init(project=project, name="plain", mode="offline", config={"learning_rate": learning_rate}, settings=quiet)
plain_args = TrainingArguments(
    output_dir="build/plain",
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,  # effective batch = 4 x 2 = 8
    learning_rate=learning_rate,
    max_steps=max_steps,
    logging_steps=1,
    seed=seeds[0],  # set + report the seed
    report_to="wandb",  # every logged loss goes to the wandb run
    bf16=bf16,
    fp16=on_gpu and not bf16,  # a T4 (compute capability 7.5): fp16 with loss scaling (notebook 02)
    save_strategy="no",
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,  # pinned memory only speeds up copies to a GPU
)
plain = Trainer(model=copy.deepcopy(base), args=plain_args, train_dataset=train_data)
plain.remove_callback(PrinterCallback)  # one line at the end instead of one per step
plain.train()
run.finish()
print(f"plain recipe, seed {seeds[0]}: training loss by step {' '.join(f'{x:.4f}' for x in losses(plain))}")

# %% [markdown]
# ## The shortcut: init_tracking and training_args
#
# `init_tracking` calls `wandb.init` for you: online when it finds a key (the `WANDB_API_KEY` variable,
# Colab's or Kaggle's secrets, a saved `wandb login`) and the server answers, offline otherwise; it never
# prompts and never prints the key. `training_args` picks the card's precision. Same seed, so the same run:

# %%
from helpers.tracking import init_tracking
from helpers.training import training_args

settings = dict(
    per_device_train_batch_size=per_device_batch,
    gradient_accumulation_steps=grad_accum_steps,
    learning_rate=learning_rate,
    max_steps=max_steps,
    logging_steps=1,
    disable_tqdm=True,
    dataloader_pin_memory=on_gpu,
)
tracking = init_tracking(project, {"learning_rate": learning_rate}, name="kit")
kit_args = training_args("build/kit", seed=seeds[0], report_to=tracking.report_to, save_strategy="no", **settings)
kit = Trainer(model=copy.deepcopy(base), args=kit_args, train_dataset=train_data)
kit.remove_callback(PrinterCallback)
kit.train()
tracking.finish()

fields = ["per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "max_steps", "seed"]
fields += ["report_to", "bf16", "fp16"]
differing = [f for f in fields if getattr(plain_args, f) != getattr(kit_args, f)]
for f in fields:
    print(f"{f:>28}: plain {getattr(plain_args, f)!s:>9} | kit {getattr(kit_args, f)!s:>9}")
same_seed_diff = max(abs(a - b) for a, b in zip(losses(plain), losses(kit)))
print(f"arguments that differ: {differing or 'none'}; largest loss difference, step by step: {same_seed_diff!r}")

# %% [markdown]
# Same arguments, same seed, same losses: bit for bit on a CPU (on a GPU the last digits may differ; under
# a *simulated* card the kit follows that card's precision while the plain code sees this CPU).
#
# ## LoRA wants a higher learning rate: measured on this model
#
# LoRA trains two small new matrices whose product starts at zero, scaled by `lora_alpha / r`; a full
# fine-tune moves every trained weight. A small sweep, both ways, each rate in `sweep_learning_rates` for `sweep_steps`
# steps, then the held-out loss. The adapter is peft's plain `LoraConfig` + `get_peft_model` (notebook 05
# adds 4-bit loading).

# %%
import math

import matplotlib.pyplot as plt
from peft import LoraConfig, get_peft_model

from helpers.seeds import seed_everything

eval_settings = dict(report_to="none", disable_tqdm=True, dataloader_pin_memory=on_gpu)
lora_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
evaluator = Trainer(model=base, args=TrainingArguments("build/eval", **eval_settings), eval_dataset=eval_data)
evaluator.remove_callback(PrinterCallback)  # it would print the metrics dict; the loss is all we read
base_eval_loss = evaluator.evaluate()["eval_loss"]  # the starting point: before any fine-tuning


def held_out_loss(method, lr):
    seed_everything(seeds[0])  # before get_peft_model: the adapter's random start comes from this seed
    model = copy.deepcopy(base) if method == "full" else get_peft_model(copy.deepcopy(base), lora_config)
    args = dict(settings, learning_rate=lr, max_steps=sweep_steps, logging_steps=sweep_steps)
    args = TrainingArguments("build/sweep", seed=seeds[0], report_to="none", save_strategy="no", **args)
    trainer = Trainer(model=model, args=args, train_dataset=train_data, eval_dataset=eval_data)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.evaluate()["eval_loss"]


def best(results):  # the rate with the lowest held-out loss; a run that diverged (nan) never wins
    return min(results, key=lambda lr: results[lr] if math.isfinite(results[lr]) else math.inf)


sweep = {method: {lr: held_out_loss(method, lr) for lr in sweep_learning_rates} for method in ("full", "lora")}
best_lr = {method: best(results) for method, results in sweep.items()}
names = {"full": "full fine-tune", "lora": "LoRA (r 8)"}
fig, ax = plt.subplots(figsize=(6, 3.5))
for method, results in sweep.items():
    ax.plot(list(results), list(results.values()), marker="o", label=f"{names[method]}: best {best_lr[method]:g}")
    ax.plot(best_lr[method], results[best_lr[method]], "k*", markersize=12)
ax.axhline(base_eval_loss, color="gray", ls="--", label=f"before fine-tuning: {base_eval_loss:.2f}")
ax.set(xscale="log", xlabel="learning rate", ylabel="held-out loss after the run")
ax.set_title(f"this model ({base.num_parameters() / 1e6:.1f}M parameters), {sweep_steps} steps a rate, seed {seeds[0]}")
ax.legend(fontsize="small")
plt.show()
for method in sweep:
    print(f"{names[method]:>15}: " + ", ".join(f"{lr:g} -> {loss:.3f}" for lr, loss in sweep[method].items()))

# %% [markdown]
# **What to see:** each curve is a valley: too small a rate barely leaves the dashed line, too large a rate overshoots. The
# stars mark each method's best: LoRA's lies to the right. The values are this model's and this many
# steps' (a small model takes large steps), not a rule for yours; the direction carries over. Starting points for real models,
# the sweep's first two rates: 5e-5 for a full fine-tune (TrainingArguments' default, printed below) and 2e-4 for LoRA
# (the QLoRA authors' Guanaco 7B script, github.com/artidoro/qlora, as of 2023; 1e-4 for 33B). Every notebook's
# `learning_rate` is one of them. The tiny built-in model, 0.3M weights already trained on the course data, barely
# moves at those rates in a few steps: every notebook gives it `tiny_learning_rate` instead, this sweep's stars on it
# (3e-3 full, 1e-2 LoRA).
#
# ## The "no seed" mistake
#
# Pass no seed and the Trainer seeds itself with `TrainingArguments`' default, 42. It cannot reach what is
# random *before* it starts: a LoRA adapter's starting weights, your own shuffle of the data. Two identical
# LoRA runs without `seed_everything` before `get_peft_model`:

# %%
defaults = TrainingArguments("build/unseeded")
print(f"TrainingArguments' defaults when you pass none: seed {defaults.seed}, learning_rate {defaults.learning_rate:g}")


def unseeded_lora_run():
    model = get_peft_model(copy.deepcopy(base), lora_config)  # the adapter starts from whatever the generator holds
    args = TrainingArguments("build/unseeded", report_to="none", save_strategy="no", **settings)  # no seed=
    trainer = Trainer(model=model, args=args, train_dataset=train_data)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return losses(trainer)


no_seed = [unseeded_lora_run(), unseeded_lora_run()]
no_seed_diff = max(abs(a - b) for a, b in zip(*no_seed))
print(f"two runs, no seed before the adapter: largest loss difference {no_seed_diff:.2e}")

# %% [markdown]
# They differ although the Trainer seeded both with 42: each adapter started from another draw. Seed first,
# then build the model, pass the same seed to `TrainingArguments`, and report it.
#
# ## Other seeds: the spread
#
# One run per seed at the sweep's best full fine-tune rate, each tracked, evaluated after every step and
# saved half way and at the end. `ManifestCallback` writes `run_manifest.json` into every checkpoint: every
# argument, the seed, the effective batch, the model, the data's fingerprint, the package versions.

# %%
import shutil
from pathlib import Path

from transformers.utils import logging as hf_logging

from helpers.manifest import ManifestCallback
from helpers.seeds import plot_seeds, run_seeds

hf_logging.disable_progress_bar()  # no "Writing model shards" bar at every checkpoint
runs_dir = Path("build/runs")
shutil.rmtree(runs_dir, ignore_errors=True)  # checkpoints of an earlier run of this cell must not join the comparison
seed_lr, save_every, trainers = best_lr["full"], max(1, max_steps // 2), {}


def train_and_track(seed):
    tracking = init_tracking(project, {"learning_rate": seed_lr, "seed": seed}, name=f"seed-{seed}")
    args = training_args(
        runs_dir / f"seed-{seed}",
        seed=seed,
        report_to=tracking.report_to,
        quiet=True,
        **dict(settings, learning_rate=seed_lr),
        eval_strategy="steps",
        eval_steps=1,  # the held-out loss after every step: 16 sequences, a fraction of a step's time
        save_strategy="steps",
        save_steps=save_every,
        save_only_model=True,  # weights and manifest: enough to evaluate, not to resume
    )
    trainer = Trainer(
        model=copy.deepcopy(base),
        args=args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        callbacks=[ManifestCallback(dataset=train_data)],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    tracking.finish()
    trainers[seed] = trainer
    return [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h][-1]


def held_out_curve(trainer):  # the held-out loss before fine-tuning (step 0), then after every step
    return [base_eval_loss] + [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]


runs = run_seeds(train_and_track, seeds, metric="held-out loss")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
for seed in seeds:
    left.plot(range(max_steps + 1), held_out_curve(trainers[seed]), label=f"seed {seed}")
left.set(xlabel="optimizer step", ylabel="held-out loss", title=f"one curve per seed, learning rate {seed_lr:g}")
left.xaxis.get_major_locator().set_params(integer=True)
left.legend(fontsize="small")
plot_seeds(runs, ax=right)
plt.tight_layout()
plt.show()
other_seed_diff = max(abs(a - b) for s in seeds[1:] for a, b in zip(losses(trainers[seeds[0]]), losses(trainers[s])))
decimals = max(1, 1 - math.floor(math.log10(runs.std))) if runs.std > 0 else 4  # two significant digits of the std
print(
    f"final held-out loss = {runs.mean:.{decimals}f} ± {runs.std:.{decimals}f} (mean ± sample std over "
    f"n = {len(seeds)} seeds)"
)

# %% [markdown]
# **What to see:** on the left, from the same start every curve falls, but each seed takes its own path (another order of the
# data); on the right, where each run ended. One seed would have reported one of those dots; the standard
# deviation says how far the next run may land. A change that moves the mean by less than a couple of
# standard deviations has not been shown to do anything: report mean, standard deviation and n.
#
# ## The best checkpoint, and what produced it
#
# Every checkpoint holds its manifest, with the last evaluation before the save:

# %%
from helpers.manifest import load_manifest

checkpoints = sorted(runs_dir.glob("seed-*/checkpoint-*"))
eval_loss = {c: load_manifest(c)["metrics"]["last_eval_log"]["eval_loss"] for c in checkpoints}
best = min(checkpoints, key=eval_loss.get)
manifest = load_manifest(best)
training, model_info = manifest["training"], manifest["model"]
tracked = manifest["tracking"]  # None when tracking was disabled
print(f"best of {len(checkpoints)} checkpoints: {best} (held-out loss {eval_loss[best]:.4f})")
print(f"  seed              {training['seed']}")
print(
    f"  effective batch   {training['effective_batch']} = per_device_batch {training['per_device_batch']} x "
    f"grad_accum_steps {training['grad_accum_steps']} x num_devices {training['num_devices']}"
)
print(f"  learning rate     {training['args']['learning_rate']}, saved at step {manifest['step']}")
print(f"  model             {model_info['id']} (revision {model_info['revision']})")
print(f"  data              fingerprint {manifest['data']['fingerprint']}, {manifest['data']['num_rows']} rows")
print(f"  packages          {', '.join(f'{k} {v}' for k, v in manifest['packages'].items())}")
print("  tracking          " + (f"{tracked['mode']} wandb run {tracked['run_id']}" if tracked else "none"))

# %% [markdown]
# Six months from now that file answers "how was this checkpoint made?". It holds no secret: the callback
# scrubs secret-looking values (keys, tokens, passwords) before writing.
#
# ## Quick checks
#
# Replace `None` with your answer and run the cell: it answers at once, with a hint or the explanation. If
# your instructor grades these, run all the cells, download the notebook and hand it in.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q06_1
answer_q06_1 = None  # one letter, in quotes
check("q06_1", answer_q06_1)

# %%
# QUICK CHECK q06_3
answer_q06_3 = None  # one letter, in quotes
check("q06_3", answer_q06_3)

# %%
# QUICK CHECK q06_4
answer_q06_4 = None  # one letter, in quotes
check("q06_4", answer_q06_4)

# %%
# QUICK CHECK q06_5
answer_q06_5 = None  # one letter, in quotes
check("q06_5", answer_q06_5)

# %% [markdown]
# The next cell saves this run's figures for the course's own tests; nothing in it is for you to change.

# %% tags=["record"]
helpers.record("plain_losses", losses(plain))
helpers.record("kit_losses", losses(kit))
helpers.record("plain_kit_differing_args", differing)
helpers.record("same_seed_max_abs_diff", same_seed_diff)
helpers.record("base_eval_loss", base_eval_loss)
helpers.record("sweep_learning_rates", sweep_learning_rates)
for method, results in sweep.items():  # JSON has no nan: a diverged run is None
    helpers.record(f"sweep_eval_loss_{method}", [x if math.isfinite(x) else None for x in results.values()])
helpers.record("best_lr_full", best_lr["full"])
helpers.record("best_lr_lora", best_lr["lora"])
helpers.record("trainer_default_seed", defaults.seed)
helpers.record("trainer_default_learning_rate", defaults.learning_rate)
helpers.record("no_seed_max_abs_diff", no_seed_diff)
helpers.record("seed_learning_rate", seed_lr)
helpers.record("held_out_curve_per_seed", {str(s): held_out_curve(trainers[s]) for s in seeds})
helpers.record("other_seed_max_abs_diff", other_seed_diff)
helpers.record("eval_loss_per_seed", runs.values)
helpers.record("eval_loss_mean", runs.mean)
helpers.record("eval_loss_std", runs.std)
helpers.record("best_checkpoint", best.as_posix())
helpers.record("best_checkpoint_seed", int(best.parent.name.removeprefix("seed-")))
helpers.record("manifest_seed", training["seed"])
helpers.record("manifest_effective_batch", training["effective_batch"])
helpers.record("manifest_learning_rate", training["args"]["learning_rate"])

# %% [markdown]
# ## In this notebook we:
#
# - tracked a run with the plain recipe (`wandb.init(mode="offline")`, `TrainingArguments(report_to="wandb",
#   seed=...)`), then with the kit's shortcut: same arguments, same losses;
# - measured a learning-rate sweep: LoRA's best rate lies above a full fine-tune's;
# - saw the "no seed" mistake: the Trainer defaults to 42, but an adapter built before it is unseeded;
# - plotted a loss curve per seed and reported mean ± standard deviation;
# - chose the best checkpoint from the manifests alone and read back what produced it.
#
# **Change this, predict, run.**
#
# 1. Set `sweep_steps = 40`. Predict whether each method's best rate moves left (smaller) or right when the
#    runs are four times longer, then run all and compare the stars.
# 2. Set `seeds = [0, 1, 2, 3, 4, 5]`. Predict whether the standard deviation shrinks, then run all.
#
# Next: notebook 07 trains on Kaggle's two T4s at once.
