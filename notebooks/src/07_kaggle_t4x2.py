# %% [markdown]
# # 07 · Kaggle T4 x2: data parallel and sharding on two GPUs from a notebook
#
# **Hardware:** Kaggle's GPU T4 x2 (Settings > Accelerator), or any machine with several GPUs. Without a GPU,
# two CPU processes stand in for the cards.
# **Time:** about 3 minutes on Kaggle's T4 x2 including the install (an estimate: not yet timed on one); 26 s on a CPU (measured on a 2-core AMD EPYC with AVX512-BF16, 2026-12-06).
#
# *Data parallel* training uses both of Kaggle's T4s: each card holds a whole copy of the model and trains
# on its own share of every batch; after each backward pass the cards average their gradients (an
# *all-reduce*), so every copy takes the same step. Below: one process per card, the copies checked, the
# step time measured against one device, the effective batch counted. Then the same training *sharded*,
# so that each card holds half the model instead of all of it.

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
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model, fully fine-tuned; needs a GPU and the Hub
per_device_batch = 4  # sequences per micro-batch, on each card
grad_accum_steps = 2  # effective batch = 4 x 2 x 2 = 16 on two cards
seq_len = 128  # tokens per sequence
max_steps = 20  # optimizer steps
learning_rate = 5e-5  # on a real model: 5e-5 for a full fine-tune (as here), 2e-4 for LoRA or QLoRA
tiny_learning_rate = 3e-3  # used on the tiny built-in model instead: 3e-3 full, 1e-2 LoRA (notebook 06's sweep)
seed = 42

# %%
# The setup in one call: what this machine is, read through NVML so CUDA stays unstarted, with both
# cards visible (this notebook trains on every one). No seed here: each launched process seeds itself.
import helpers

machine = helpers.start(seed=None, one_gpu=False)

# %% [markdown]
# ## One rule: no CUDA in the notebook before the launch
#
# The launcher *forks* this notebook's process, and CUDA does not survive a fork: once a cell has started
# it (a model on the GPU, `torch.cuda.is_available()`, importing bitsandbytes), every child fails and only a
# restart helps. So the notebook reads the cards through NVML (what `nvidia-smi` reads) and loads the model
# only inside the training function.

# %%
import torch

from helpers import MIB  # bytes in a MiB (2**20)
from helpers.memory import read_gpu_memory

cards = read_gpu_memory()
for card in cards:
    print(card)
print(f"CUDA initialised in this notebook's process: {torch.cuda.is_initialized()}")

# %% [markdown]
# One process per card. Without a GPU, two CPU processes exchange gradients over *gloo* where GPUs use
# *NCCL*.

# %%
num_processes = len(machine.gpus) if machine.gpus else 2
if machine.gpus and not machine.simulated:
    backend = "nccl"
    if num_processes > 1:
        print(f"{num_processes} GPUs: one training process per card, their gradients averaged over NCCL")
    else:  # Colab's single T4: the same code, with nothing to average
        print("1 GPU: one training process; with no other process, nothing is averaged (Kaggle's T4 x2 runs two)")
else:
    backend = "gloo"
    rule = "=" * 78
    stand_in = "SIMULATED cards" if machine.simulated else "NO GPU"
    print(
        f"{rule}\n {stand_in}: launching {num_processes} CPU process{'es' if num_processes > 1 else ''} "
        "instead of GPU processes\n"
        " they exchange gradients over gloo instead of NCCL; the code and the checks are the same,\n"
        " and every time below is this CPU's: it says nothing about a T4\n"
        f"{rule}"
    )

# %% [markdown]
# Load the dataset once here (the processes find it cached) and import the model code, which the forked
# children inherit; neither touches a device.

# %%
import sys

import transformers.models.llama.modeling_llama  # noqa: F401  (SmolLM2 and the embedded model are Llama-shaped)

from helpers.data import load_course_data

print(f"course dataset: {len(load_course_data())} instruction/response pairs")
print(f"bitsandbytes imported: {'bitsandbytes' in sys.modules}; CUDA initialised: {torch.cuda.is_initialized()}")

# %% [markdown]
# ## The training function
#
# It runs in *every* process: a plain PyTorch loop with accelerate's three additions, numbered in the
# comments: `Accelerator` (joins the group, picks the card), `accelerator.prepare` (wraps the model in
# `DistributedDataParallel`, gives each process its share of the batches) and `accelerator.backward`
# (averages the gradients). Rank 0 writes the results to a JSON file.


# %%
def train_ddp(config):
    """Train one data-parallel copy of the model; gather checksums, losses, step times and memory from every process."""
    import contextlib
    import datetime
    import io
    import json
    import time
    import warnings

    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, gather_object, set_seed

    from helpers.data import pack_course_data
    from helpers.env import choose_precision, detect_gpus
    from helpers.memory import measure
    from helpers.models import is_embedded, load_model

    # 1. join the group: NCCL between GPUs; gloo between CPU processes (cpu=True), mixed precision for the card
    on_gpu = torch.cuda.is_available()  # in a child process CUDA is allowed
    card_precision = choose_precision(detect_gpus()).name  # what the card trains in (fp16 on a T4)
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(card_precision, "no") if on_gpu else "no"  # CPU: fp32
    # every collective gives up after 2 minutes (a process that died leaves the others an error, not a hang)
    timeout = InitProcessGroupKwargs(timeout=datetime.timedelta(minutes=2))
    with warnings.catch_warnings():  # on CPU, accelerate gives each process cores / processes threads, and says so
        warnings.filterwarnings("ignore", message="OMP_NUM_THREADS")
        accelerator = Accelerator(
            cpu=not on_gpu,
            mixed_precision=precision,
            gradient_accumulation_steps=config["grad_accum_steps"],
            kwargs_handlers=[timeout],
        )
    rank = accelerator.process_index
    set_seed(config["seed"])
    if not on_gpu:
        torch.set_num_threads(1)  # one core per CPU process: one "device" each, in the baseline too

    # 2. a whole copy of the model in every process, in fp32 (autocast runs the matmuls in 16 bits)
    quiet = contextlib.nullcontext() if accelerator.is_main_process else contextlib.redirect_stdout(io.StringIO())
    with accelerator.main_process_first(), quiet:  # rank 0 downloads, the others read its copy; one banner
        model, tokenizer = load_model(config["model_id"], smoke=config["smoke"], dtype=torch.float32)
    model.config.use_cache = False

    # 3. the course dataset as one stream of tokens, cut into blocks of seq_len: a (blocks, seq_len) tensor
    blocks = pack_course_data(tokenizer, config["seq_len"])["input_ids"][:]
    loader = torch.utils.data.DataLoader(blocks, batch_size=config["per_device_batch"], shuffle=True, drop_last=True)
    tiny = is_embedded(model)  # its 0.3M weights need far larger steps than a real model's
    learning_rate = config["tiny_learning_rate"] if tiny else config["learning_rate"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

    # 4. DistributedDataParallel around the model; the loader now yields this process's share only
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # 5. train: accumulate grad_accum_steps micro-batches, then one optimizer step, in sync with the others
    steps, sequences, per_step, losses, step_seconds, first_batch = 0, 0, [], [], [], None
    loss_sum, micro_batches = 0.0, 0
    start = last = time.perf_counter()
    with measure(f"rank {rank}", model=accelerator.unwrap_model(model), optimizer=optimizer.optimizer) as memory:
        while steps < config["max_steps"]:
            for batch in loader:
                first_batch = int(batch.sum()) if first_batch is None else first_batch
                with accelerator.accumulate(model):  # no gradient exchange until the last micro-batch
                    loss = model(input_ids=batch, labels=batch).loss
                    accelerator.backward(loss)  # on the last micro-batch: all-reduce, every process gets the mean
                    optimizer.step()  # skipped by accelerate until the gradients are complete
                    optimizer.zero_grad(set_to_none=False)  # zeroed, kept: the readout at the end counts them
                sequences += batch.shape[0]
                loss_sum, micro_batches = loss_sum + loss.item(), micro_batches + 1
                if accelerator.sync_gradients:  # an optimizer step just happened
                    now = time.perf_counter()
                    steps, per_step, step_seconds = steps + 1, per_step + [sequences], step_seconds + [now - last]
                    losses.append(loss_sum / micro_batches)  # this process's mean loss over the step's micro-batches
                    sequences, loss_sum, micro_batches, last = 0, 0.0, 0, now
                    if steps == config["max_steps"]:
                        break
    seconds = time.perf_counter() - start

    # 6. every copy's checksum (sum and sum of squares of all weights, in float64), gathered from all processes
    weights = [p.detach().double() for p in accelerator.unwrap_model(model).parameters()]
    checksum = torch.stack([sum(w.sum() for w in weights), sum((w * w).sum() for w in weights)])
    checksums = accelerator.gather(checksum.to(accelerator.device).unsqueeze(0)).tolist()  # (processes, 2)
    ranks = gather_object(
        [
            {
                "rank": rank,
                "device": "cpu" if accelerator.device.type == "cpu" else str(accelerator.device),
                "first_batch_token_sum": first_batch,
                "losses": losses,
                "sequences_per_step": per_step[0],
                "step_seconds": step_seconds,
                "seconds": seconds,
                "memory": memory.as_dict(),
            }
        ]
    )
    report = {
        "num_processes": accelerator.num_processes,
        "distributed_type": str(accelerator.distributed_type),
        "backend": accelerator.state.backend,
        "mixed_precision": precision,
        "steps": steps,
        "learning_rate": learning_rate,
        "tiny": tiny,
        "per_device_batch": config["per_device_batch"],
        "grad_accum_steps": config["grad_accum_steps"],
        "checksums": checksums,
        "ranks": ranks,
    }
    if accelerator.is_main_process:
        with open(config["result_file"], "w") as f:
            json.dump(report, f, indent=2)
    accelerator.wait_for_everyone()

    # 7. let go of the wrapped model while the process group still exists (freed after it, gloo can hang),
    #    then leave the group; a process the notebook forked simply exits, and accelerate leaves it at that
    model = optimizer = loader = None
    accelerator.free_memory()
    accelerator.end_training()
    return report


# %% [markdown]
# ## Launch
#
# First the baseline: the same training on **one** device with twice the accumulation steps (the same
# effective batch), in one forked child so this notebook still never starts CUDA. Then `notebook_launcher`
# forks one process per card and returns when all are done.

# %%
import json
import multiprocessing
import socket  # noqa: F811 (the install cell imported it too; this cell must not depend on it)
from pathlib import Path

from accelerate import notebook_launcher

work = Path("build")  # this notebook's files: the processes' results, and train.py below
work.mkdir(exist_ok=True)
config = dict(
    model_id=model_id,
    smoke=smoke,
    per_device_batch=per_device_batch,
    grad_accum_steps=grad_accum_steps,
    seq_len=seq_len,
    max_steps=max_steps,
    learning_rate=learning_rate,
    tiny_learning_rate=tiny_learning_rate,
    seed=seed,
    result_file=str((work / "ddp_result.json").resolve()),  # rank 0 writes it, this notebook reads it
)
one_config = dict(
    config, grad_accum_steps=grad_accum_steps * num_processes, result_file=str((work / "one_device.json").resolve())
)

for run_config in (config, one_config):
    Path(run_config["result_file"]).unlink(missing_ok=True)  # an earlier run's result must not pass as this one's

# the baseline: one process on one device, forked so that CUDA starts in the child, not here
child = multiprocessing.get_context("fork").Process(target=train_ddp, args=(one_config,))
child.start()
child.join()
if child.exitcode != 0:
    raise RuntimeError(f"the one-device run stopped (exit code {child.exitcode}); its error is printed above")
one = json.loads(Path(one_config["result_file"]).read_text())


def free_port():
    """A free port for the processes to meet on: 29500, the default, may still be held by an earlier run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


notebook_launcher(train_ddp, args=(config,), num_processes=num_processes, use_port=str(free_port()))
report = json.loads(Path(config["result_file"]).read_text())
tiny_note = " (the tiny model's, not a real model's: see the parameters cell)" if report["tiny"] else ""
print(
    f"{report['num_processes']} processes ({report['distributed_type']}, backend {report['backend']}, "
    f"mixed precision {report['mixed_precision']}): {report['steps']} optimizer steps at learning rate "
    f"{report['learning_rate']:g}{tiny_note}"
)

# %% [markdown]
# ## Did the copies stay in sync?
#
# Each process saw different sequences, yet all applied the same averaged gradient, so the weights must
# agree:

# %%
for r, (total, squares) in zip(report["ranks"], report["checksums"]):
    print(
        f"rank {r['rank']} on {r['device']}: first micro-batch token sum {r['first_batch_token_sum']:>8,}, "
        f"last loss {r['losses'][-1]:.4f} | weights: sum {total:.10f}, sum of squares {squares:.10f}"
    )
in_sync = all(c == report["checksums"][0] for c in report["checksums"])
different_data = len({r["first_batch_token_sum"] for r in report["ranks"]}) == len(report["ranks"])
if report["num_processes"] > 1:
    print(f"parameters identical in every process: {in_sync}; every process had its own data: {different_data}")
else:
    print("one process, one copy of the weights: nothing to keep in sync (two processes show the check)")
assert in_sync, "the copies drifted apart: the gradients were not averaged"

# %% [markdown]
# With two processes or more, identical to the last digit: every copy started from rank 0's weights
# and added the same numbers. With one there is a single copy, and the cell said so.
#
# ## One device or two: loss and time per step
#
# Both runs see the same sequences per step (counted below). A second device changes the time per step:
# each runs half the micro-batches, plus the all-reduce. The warm-up step is left out.

# %%
import statistics

import matplotlib.pyplot as plt


def mean_losses(run):  # the loss per optimizer step, averaged over the processes
    return [statistics.fmean(step) for step in zip(*(r["losses"] for r in run["ranks"]))]


def step_time(run):  # seconds per optimizer step, median after the first step, slowest process
    return max(statistics.median(r["step_seconds"][1:] or r["step_seconds"]) for r in run["ranks"])


device, devices = ("GPU", "GPUs") if backend == "nccl" else ("CPU process", "CPU processes")
n = report["num_processes"]
runs = {f"1 {device} (baseline)": one, f"{n} {devices if n > 1 else device} (launched)": report}
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
for label, run in runs.items():
    label_with_steps = f"{label}, grad_accum_steps {run['grad_accum_steps']}"
    left.plot(range(1, run["steps"] + 1), mean_losses(run), marker="o", label=label_with_steps)
    print(f"{label_with_steps}: {step_time(run):.3f} s per optimizer step, final loss {mean_losses(run)[-1]:.4f}")
left.set(xlabel="optimizer step", ylabel="training loss (mean over processes)", title="same effective batch")
left.xaxis.get_major_locator().set_params(integer=True)
left.legend(fontsize="small")
right.bar(list(runs), [step_time(run) for run in runs.values()], color=["tab:blue", "tab:orange"])
right.set(ylabel="seconds per optimizer step", title="time per step (measured on this machine)")
plt.tight_layout()
plt.show()
speedup = step_time(one) / step_time(report)
print(f"time per step, one device / {n}: {speedup:.2f} (above 1: the launched run took less time per step)")
if backend == "gloo":
    print(
        "measured with CPU processes sharing this machine's cores"
        + (" (the T4s are simulated: no GPU ran)" if machine.simulated else "")
        + ": this says nothing about two T4s; on Kaggle's T4 x2 the same cell measures the cards"
    )

# %% [markdown]
# **What to see:** on the left, the same recipe and the same effective batch; the runs draw different batches, so the curves differ step by
# step but not in level. On the right, the time per step.
# On Kaggle's T4 x2 this measures the cards: each runs half the micro-batches, and the all-reduce adds time
# to every step. On a CPU both "devices" share the same cores, so the bar says nothing about GPUs.
#
# ## What each card holds
#
# Each process measured its own bill (exact bytes, and the peak). Every row is the whole single-GPU bill:
# data parallel buys speed, not memory; a model too big for one card needs QLoRA (notebook 05) or sharding,
# which the next sections try.

# %%
for r in report["ranks"]:
    m = r["memory"]
    peak = (
        f"peak allocated {m['peak_allocated'] / MIB:,.0f} MiB, reserved {m['peak_reserved'] / MIB:,.0f} MiB"
        if "peak_allocated" in m
        else f"peak RSS growth {m['rss_peak_delta'] / MIB:,.0f} MiB (whole process)"
    )
    print(
        f"rank {r['rank']}: weights {m['weights'] / MIB:7.2f} MiB, gradients {m['gradients'] / MIB:7.2f} MiB, "
        f"AdamW {m['optimizer'] / MIB:7.2f} MiB, activations {m['activations'] / MIB:7.2f} MiB | {peak}"
    )
for card in read_gpu_memory():
    print(f"after the launch, through NVML: {card}")

# %% [markdown]
# ## The effective batch with two devices
#
# Every device adds its micro-batches to each optimizer step. Counted in the processes:

# %%
effective_batch = per_device_batch * grad_accum_steps * report["num_processes"]
counted = sum(r["sequences_per_step"] for r in report["ranks"])
one_counted = sum(r["sequences_per_step"] for r in one["ranks"])
print(
    f"{report['num_processes']} devices: per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} "
    f"x num_devices {report['num_processes']} = {effective_batch}; counted "
    f"{' + '.join(str(r['sequences_per_step']) for r in report['ranks'])} = {counted}"
)
print(
    f"1 device:  per_device_batch {per_device_batch} x grad_accum_steps {one['grad_accum_steps']} x num_devices 1 "
    f"= {per_device_batch * one['grad_accum_steps']}; counted {one_counted}"
)
assert counted == effective_batch == one_counted

# %% [markdown]
# From one card to two, the optimizer sees twice the batch unless you halve the accumulation, as the
# baseline did the other way round. Report the effective batch with its three factors.
#
# ## The second card as memory: sharding
#
# Data parallel keeps a whole copy on every card, so two T4s hold no bigger model than one. *Sharding*
# splits the copy instead: with PyTorch's FSDP2 (`fully_shard`), each card keeps 1/N of every weight, of
# its gradient and of its AdamW state. While a layer runs, its weights are *gathered* whole from the
# cards, then dropped again; in the backward each card keeps only its share of the reduced gradients.
#
# The recipe is two lines around the model: `fully_shard` on every decoder layer (each one is gathered
# on its own, so only about one is whole at a time), then on the model itself (the embeddings, the final
# norm and the head). The function below trains either way, data parallel (`DistributedDataParallel`,
# plain PyTorch this time) or sharded, on the same batches in the same order, and measures each process:
# its weights, gradients and optimizer states (exact bytes of what it holds) and the step's peak above them.
# Step 3 is the whole change; `helpers.sharding.shard(model, "full")` does the same in one call.


# %%
def train_sharded(config):
    """Train one process's part, data parallel or sharded; gather every rank's bill and losses."""
    import contextlib
    import datetime
    import io
    import json
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from helpers.data import pack_course_data
    from helpers.memory import measure
    from helpers.models import is_embedded, load_model
    from helpers.sharding import decoder_layers, step_peak

    # 1. join the group; every collective gives up after 2 minutes instead of waiting for a dead rank forever.
    #    With one device the launcher runs this in the notebook's own process, with no group to join: a group of one
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("MASTER_PORT", str(config["port"]))
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    elif int(os.environ["WORLD_SIZE"]) > 1:
        torch.set_num_threads(1)  # one core per CPU process, as in the data-parallel run
    dist.init_process_group("nccl" if on_gpu else "gloo", timeout=datetime.timedelta(minutes=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    # 2. the same model in every process, in fp32; LoRA or QLoRA adapters when asked
    torch.manual_seed(config["seed"])
    quiet = contextlib.redirect_stdout(io.StringIO())  # the model's banner was printed by the first launch
    with quiet:
        if config["method"] == "qlora":
            from helpers.qlora import load_qlora

            model, tokenizer = load_qlora(config["model_id"], r=8, smoke=config["smoke"])
        else:
            model, tokenizer = load_model(config["model_id"], smoke=config["smoke"], dtype=torch.float32)
            model.to(device)
    model.config.use_cache = False
    tiny = is_embedded(model)  # its 0.3M weights need far larger steps than a real model's
    if config["method"] == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    config_dict = (model.get_base_model() if hasattr(model, "get_base_model") else model).config.to_dict()

    # 3. THE CHANGE: a whole copy with DDP, or every layer sharded, then the rest of the model
    if config["sharding"] == "none":
        if world > 1:  # one process has no other copy to keep in step: DDP would only add its gradient buckets
            model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        for layer in decoder_layers(model):  # each layer gathered on its own while it runs
            fully_shard(layer, reshard_after_forward=config["sharding"] == "full")
        fully_shard(model, reshard_after_forward=config["sharding"] == "full")
    trainable = [p for p in model.parameters() if p.requires_grad]
    learning_rate = config["tiny_learning_rate"] if tiny else config["learning_rate"]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate, foreach=True)

    # 4. the same batches in every run: a seeded order; each step's batch split over the ranks
    blocks = pack_course_data(tokenizer, config["seq_len"])["input_ids"][:]
    per_step = config["per_device_batch"] * world
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(config["seed"]))
    step_rows = order[: len(order) // per_step * per_step].view(-1, per_step)  # (steps in one pass, per_step)
    losses, peaks = [], []
    with measure(f"rank {rank}", model=model, optimizer=optimizer, device=device) as bill:
        for step in range(config["steps"]):
            batch = blocks[step_rows[step % len(step_rows)][rank::world]].to(device)
            optimizer.zero_grad()  # the last step's gradients freed before the peak is read, as the Trainer does
            with step_peak(device) as peak:
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # the step's loss over every rank's share
            losses.append(mean.item() / world)
            peaks.append(peak.bytes)
            del loss, mean  # freed here, not inside the next step's measurement

    # 5. every rank's bill, gathered; rank 0 writes them for the notebook
    memory = bill.as_dict()
    mine = {"rank": rank, "peak": max(peaks[1:] or peaks), "tensors": len(trainable)}
    mine |= {name: memory[name] for name in ("weights", "gradients", "optimizer")}
    ranks = [None] * world
    dist.all_gather_object(ranks, mine)
    if rank == 0:
        report = {"ranks": ranks, "losses": losses, "config": config_dict, "world_size": world}
        with open(config["result_file"], "w") as f:
            json.dump(report, f)
    model = optimizer = None  # freed while the group still exists
    dist.barrier()
    dist.destroy_process_group()


# %% [markdown]
# Four runs on the same number of processes: a full fine-tune and LoRA, each data parallel and sharded.
# Each launch forks fresh processes, so every run starts from the same weights.

# %%
import contextlib
import io


def launch(method, sharding, steps):
    """One run of train_sharded on every card (or CPU process); its report."""
    port = free_port()
    run_config = dict(config, method=method, sharding=sharding, steps=steps, port=port)
    run_config["result_file"] = str((work / f"{method}-{sharding}.json").resolve())
    Path(run_config["result_file"]).unlink(missing_ok=True)  # an earlier run's result must not pass as this one's
    with contextlib.redirect_stdout(io.StringIO()):  # accelerate says "CUDAs" even for CPU processes
        notebook_launcher(train_sharded, args=(run_config,), num_processes=num_processes, use_port=str(port))
    return json.loads(Path(run_config["result_file"]).read_text())


shard_steps = min(max_steps, 5)  # the bill is the same at every step after the first: five compare the losses
runs = {}
for method in ("full", "lora"):
    for sharding in ("none", "full"):
        name = f"{method}, {'data parallel' if sharding == 'none' else 'sharded'}"
        runs[name] = launch(method, sharding, shard_steps)
        print(f"{name}: {len(runs[name]['losses'])} steps on {runs[name]['world_size']} {devices}")

# %% [markdown]
# ### What each process holds, measured and estimated
#
# Beside each measured figure, the kit's estimator for one process of that job (`world_size` and
# `sharding` are two of its settings, as they are of `python -m helpers plan` and the planner). The
# peak is the step's most allocated above what a process holds between steps (its weights and AdamW
# state).

# %%
from helpers.estimate import estimate_training_memory
from helpers.sharding import rank_table

estimate_device = "cuda" if backend == "nccl" else "cpu"  # dropout masks and attention kernels differ
rows, estimates = [], {}
for name, run in runs.items():
    method, sharding = name.split(", ")[0], "none" if name.endswith("data parallel") else "full"
    e = estimate_training_memory(
        run["config"],
        per_device_batch=per_device_batch,
        seq_len=seq_len,
        precision="fp32",
        method=method,
        lora_r=8,
        optimizer="adamw_foreach",  # torch's AdamW with foreach=True, as trained
        world_size=run["world_size"],
        sharding=sharding if run["world_size"] > 1 else "none",  # one process: nothing to split
        device=estimate_device,
    )
    estimates[name] = e
    for r in run["ranks"]:
        rows.append(
            dict(
                r,
                run=name,
                weights_estimate=e.weights,
                gradients_estimate=e.gradients,
                # AdamW also keeps a 4-byte step count per tensor, which the estimator leaves out
                optimizer_estimate=e.optimizer + 4 * r["tensors"],
                peak_estimate=e.allocated - e.weights - e.optimizer,
            )
        )
print(rank_table(rows))
if num_processes == 1:
    print("one process: sharding splits nothing here; Kaggle's T4 x2 (or two CPU processes) shows the halves")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=False)
for ax, method in zip(axes, ("full", "lora")):
    names = [n for n in runs if n.startswith(method)]
    bottoms = [0.0] * len(names)
    for part, color in (("weights", "tab:blue"), ("gradients", "tab:green"), ("optimizer", "tab:orange")):
        heights = [runs[n]["ranks"][0][part] / MIB for n in names]
        ax.bar(names, heights, bottom=bottoms, color=color, label=part)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    estimated = [(estimates[n].weights + estimates[n].gradients + estimates[n].optimizer) / MIB for n in names]
    ax.scatter(names, estimated, color="black", marker="_", s=900, label="estimated", zorder=3)
    ax.set(title=f"{method} fine-tune: rank 0 holds", ylabel="MiB")
axes[0].legend(fontsize="small")
plt.tight_layout()
plt.show()

# %% [markdown]
# **What to see:** sharded, each process holds half the weights, half the gradients and half the AdamW
# state of its data-parallel twin, to the byte (a parameter whose rows do not split evenly would be padded
# by under one row per process). The step's peak shrinks far less: it is mostly activations, and sharding
# splits the model, not the micro-batch. The data-parallel rows also carry DDP's gradient buckets, a second
# copy of the gradients during the step.
#
# ### The same training?
#
# Both ways apply the same averaged gradient to the same weights, so the losses must agree, though not
# always to the last bit: data parallel sums whole gradients across the processes, sharding sums each
# shard on its own, and with more than two processes (or NCCL's ring on GPUs) the additions come in
# another order and round differently. The tolerance below, 1e-4 of the loss, is a thousand times fp32's
# rounding and far below any real difference between recipes.

# %%
loss_gaps = {}
for method in ("full", "lora"):
    ddp, fsdp = runs[f"{method}, data parallel"]["losses"], runs[f"{method}, sharded"]["losses"]
    worst = loss_gaps[method] = max(abs(a - b) / abs(a) for a, b in zip(ddp, fsdp))
    print(f"{method}: last loss {ddp[-1]:.6f} data parallel, {fsdp[-1]:.6f} sharded; largest relative gap {worst:.1e}")
    assert worst < 1e-4, f"{method}: sharded training drifted from data parallel by {worst:.1e}"

# %% [markdown]
# ### What sharding costs: the traffic
#
# Memory comes back as communication. Data parallel sends each gradient once around the ring (an
# all-reduce moves about twice its bytes); sharding gathers every weight for the forward, again for the
# backward, and reduce-scatters the gradients. Per optimizer step and process, for the full fine-tune:

# %%
from helpers.sharding import traffic_per_step

whole = runs["full, data parallel"]["ranks"][0]  # one process's whole model and gradients
cards = max(num_processes, 2)  # one device sends nothing: then the figures are for two
traffic = {
    sharding: traffic_per_step(sharding, cards, whole["weights"], whole["gradients"]) for sharding in ("none", "full")
}
for sharding, sent in traffic.items():
    name = "data parallel" if sharding == "none" else "sharded"
    print(f"{name:>13}: {sent / MIB:8.2f} MiB sent per step by each of {cards} devices")
print(f"sharded / data parallel: {traffic['full'] / traffic['none']:.2f}x the traffic, for 1/{cards} of the states")

# %% [markdown]
# On two T4s, which talk over PCIe rather than NVLink, that traffic is why sharding a model that fits one
# card only slows it down: shard when the model does not fit, not before.
#
# ### QLoRA, sharded
#
# FSDP2 shards each parameter on its own, whatever its dtype, so bitsandbytes' packed 4-bit weights split
# like any other tensor (FSDP1 flattened a layer into one tensor of one dtype and needed the 4-bit codes
# stored as bf16 for that). Tried on this runtime:

# %%
try:
    qlora = launch("qlora", "full", steps=2)
    for r in qlora["ranks"]:
        print(f"rank {r['rank']}: weights {r['weights'] / MIB:.3f} MiB (4-bit codes and fp32 rest, its shard)")
    print(f"QLoRA trained sharded: losses {', '.join(f'{x:.4f}' for x in qlora['losses'])}")
except Exception as error:  # a runtime whose bitsandbytes or torch cannot shard 4-bit weights
    qlora = None
    print(f"QLoRA could not be sharded on this runtime: {type(error).__name__}: {error}")

# %% [markdown]
# ### How many cards does a job need?
#
# Sharding divides weights, gradients and optimizer states by the number of cards; activations and the
# gathered layers stay. `helpers.sharding.fewest_cards` asks the estimator for one card's share at 1, 2, 4, ...
# cards and returns the fewest of a kind that hold the job, fully sharded:

# %%
from helpers.sharding import fewest_cards

needed = {}
for model_name, method in (("Llama-2-7B", "full"), ("Llama-2-7B", "lora"), ("Llama-2-13B", "qlora")):
    cards = fewest_cards(model_name, "T4", method=method, per_device_batch=1, seq_len=1024, checkpointing=True)
    needed[f"{model_name} {method}"] = cards.count
    print(cards)

# %% [markdown]
# A 7B full fine-tune needs its weights, gradients and two AdamW moments in fp32, 16 bytes a parameter,
# over 100 GiB: only many cards hold it. LoRA trains a sliver, so two T4s share what one cannot hold;
# QLoRA makes the 13B fit one. Sharding is how a cluster fits a job; on a notebook's two cards, QLoRA
# usually gets there first.

# %% [markdown]
# ## The same training on a rented multi-GPU machine
#
# On a rented machine (RunPod, Lambda, Vast.ai) or a cluster node, `accelerate launch` starts one process
# per GPU from a terminal. `train_ddp`, written to `train.py` with the settings above, is the whole script.

# %%
import inspect

script = f'''"""Data-parallel fine-tuning, as notebook 07 runs it: one process per GPU.

    accelerate launch --num_processes 2 train.py
"""


{inspect.getsource(train_ddp)}

if __name__ == "__main__":
    train_ddp({dict(config, smoke=False, result_file="ddp_result.json")!r})
'''
(work / "train.py").write_text(script)
print(f"wrote {(work / 'train.py').resolve()} ({len(script.splitlines())} lines); its last lines:\n")
print("\n".join(script.splitlines()[-3:]))

# %% [markdown]
# Then, on the rented machine (the kit installed with the install cell's `pip install` line):
#
# ```bash
# accelerate launch --multi_gpu --num_processes 2 --mixed_precision bf16 train.py   # fp16 on T4s or a V100
# ```
#
# Without a GPU the same line starts two CPU processes over gloo: the course's tests run this very file so,
# and reach the notebook's checksums.
#
# ## Quick checks
#
# Replace `None` with your answer and run the cell: it answers at once, with a hint or the explanation. If
# your instructor grades these, run all the cells, download the notebook (File > Download notebook on
# Kaggle) and hand it in. Set your student id first: the second question gives each student their own numbers.

# %%
# QUICK CHECK student
from helpers.quickcheck import check

student_id = ""  # your student id, in quotes, exactly as your instructor gave it

# %%
# QUICK CHECK q07_1
answer_q07_1 = None  # one letter, in quotes
check("q07_1", answer_q07_1)

# %%
# QUICK CHECK q07_2
answer_q07_2 = None  # a number, from your own numbers (set student_id first)
check("q07_2", answer_q07_2, student_id=student_id)

# %%
# QUICK CHECK q07_3
answer_q07_3 = None  # one letter, in quotes
check("q07_3", answer_q07_3)

# %%
# QUICK CHECK q07_4
answer_q07_4 = None  # one letter, in quotes
check("q07_4", answer_q07_4)

# %%
# QUICK CHECK q07_5
answer_q07_5 = None  # one letter, in quotes
check("q07_5", answer_q07_5)

# %%
# QUICK CHECK q07_6
answer_q07_6 = None  # a number
check("q07_6", answer_q07_6)

# %% [markdown]
# The next cell saves this run's figures for the course's own tests; nothing in it is for you to change.

# %% tags=["record"]
helpers.record("gpu_count", len(machine.gpus))
helpers.record("gpu_names", [g.name for g in machine.gpus])
helpers.record("num_processes", num_processes)
helpers.record("backend", backend)
helpers.record("processes_ran", report["num_processes"])
helpers.record("params_in_sync", in_sync)
helpers.record("param_checksums", [c[0] for c in report["checksums"]])
helpers.record("different_data_per_rank", different_data)
helpers.record("losses_data_parallel", mean_losses(report))
helpers.record("losses_one_device", mean_losses(one))
helpers.record("step_seconds_data_parallel", step_time(report))
helpers.record("step_seconds_one_device", step_time(one))
helpers.record("step_time_ratio_one_over_launched", speedup)
helpers.record("step_time_measured_on", "gpu" if backend == "nccl" else "cpu processes")
if "peak_allocated" in report["ranks"][0]["memory"]:
    helpers.record(
        "peak_allocated_mib_per_rank", [round(r["memory"]["peak_allocated"] / MIB, 1) for r in report["ranks"]]
    )
helpers.record("weights_mib_per_rank", [round(r["memory"]["weights"] / MIB, 2) for r in report["ranks"]])
helpers.record("optimizer_mib_per_rank", [round(r["memory"]["optimizer"] / MIB, 2) for r in report["ranks"]])
helpers.record("sharded_rows", rows)
helpers.record("sharded_loss_gap", loss_gaps)
helpers.record("sharded_traffic_ratio", traffic["full"] / traffic["none"])
helpers.record("qlora_sharded_losses", qlora["losses"] if qlora else None)
helpers.record("fewest_t4s", needed)
helpers.record("effective_batch", effective_batch)
helpers.record("effective_batch_counted", counted)
helpers.record("effective_batch_one_device_counted", one_counted)
helpers.record("per_device_batch", per_device_batch)
helpers.record("grad_accum_steps", grad_accum_steps)
helpers.record("grad_accum_steps_one_device", one["grad_accum_steps"])

# %% [markdown]
# ## In this notebook we:
#
# - read the cards through NVML and kept CUDA out of the notebook, as the launcher needs;
# - launched one process per card, each with a whole copy, and checked the copies stayed identical;
# - compared one device with twice the accumulation against two: the same loss curve, and the time per
#   step measured (on a CPU only a stand-in for the cards);
# - saw that data parallel buys speed, not memory, and counted the effective batch;
# - sharded the same training with FSDP2's `fully_shard`: each process held half the weights, gradients
#   and AdamW state, to the byte the estimator predicted, for 1.5 times the traffic, with the same losses;
# - trained QLoRA sharded, and asked how many T4s a 7B and a 13B need;
# - wrote the training function as `train.py` for `accelerate launch`.
#
# **Change this, predict, run.**
#
# 1. Set `grad_accum_steps = 1`. Predict the effective batch on two devices and the baseline's accumulation
#    steps, then run all and compare with the counted lines.
# 2. Set `per_device_batch = 8`. Predict which lines of "What each card holds" grow, and which columns of
#    the sharded table, then run all.
#
# Next: notebook 08 puts the whole recipe together and survives a disconnect.
