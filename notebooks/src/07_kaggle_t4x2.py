# %% [markdown]
# # 07 · Kaggle T4 x2: data parallel on two GPUs from a notebook
#
# **Hardware:** Kaggle with Settings > Accelerator > GPU T4 x2. Any machine with several GPUs works
# the same; one GPU runs one process; a machine without a GPU runs two CPU processes, so every step
# still runs and is checked.
# **Time:** about 3 minutes on Kaggle's T4 x2 including the install; under 30 seconds headless on a CPU.
#
# Kaggle gives you two T4s, and a notebook that trains on one of them leaves half the hardware idle.
# *Data parallel* training uses both: each card holds a whole copy of the model, its gradients and its
# optimizer state, and trains on its own share of every batch. After each backward pass the cards
# average their gradients (an *all-reduce*), so every copy takes the same optimizer step and the
# copies stay identical. This notebook:
#
# 1. reads the cards through the driver, without touching CUDA in the notebook itself;
# 2. starts one training process per card from the notebook, with accelerate's `notebook_launcher`;
# 3. trains a few steps and checks, number for number, that the copies stayed in sync;
# 4. works out what the second card does to the effective batch;
# 5. writes the same training as a script for `accelerate launch` on a rented multi-GPU machine.

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
model_id = "HuggingFaceTB/SmolLM2-135M"  # a real small model, fully fine-tuned; needs a GPU and the Hub
per_device_batch = 4  # sequences per micro-batch, on each card
grad_accum_steps = 2  # effective batch = 4 x 2 x 2 = 16 on two cards
seq_len = 128  # tokens per sequence
max_steps = 20  # optimizer steps
learning_rate = 5e-5  # a full fine-tune of a pretrained model wants a small step
seed = 42

# %% [markdown]
# ## One rule: no CUDA in the notebook before the launch
#
# `notebook_launcher` starts the training processes by *forking* the notebook's own process: each
# child starts as a copy of it. CUDA does not survive a fork. If anything in the notebook has
# already initialised it (moving a model to the GPU, `torch.cuda.is_available()`, even importing
# bitsandbytes), every child stops with "Cannot re-initialize CUDA in forked subprocess", and only
# a restart of the notebook helps. So, until the launch, this notebook:
#
# - reads the cards through NVML, the driver's own management library (what `nvidia-smi` shows),
#   never through `torch.cuda`;
# - loads no model and imports no bitsandbytes, nor anything that imports it, such as transformers'
#   `TrainingArguments` (accelerate refuses to launch once bitsandbytes is loaded): all of that
#   happens inside the training function, in each child. That is also why this notebook works out
#   the effective batch by hand rather than with `helpers.training`, which builds `TrainingArguments`.
#
# `describe(use_nvml=True)` and `read_gpu_memory()` do the reading:

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

import torch

import helpers
from helpers import MIB  # bytes in a MiB (2**20)
from helpers.env import describe
from helpers.memory import read_gpu_memory

machine = describe(use_nvml=True)
print(machine.summary())
cards = read_gpu_memory()
for card in cards:
    print(card)
print(f"CUDA initialised in this notebook's process: {torch.cuda.is_initialized()}")
helpers.record("gpu_count", len(machine.gpus))
helpers.record("gpu_names", [g.name for g in machine.gpus])

# %% [markdown]
# ## How many processes
#
# One process per card: two on Kaggle's T4 x2. With one card there is nothing to run in parallel
# and the launcher simply calls the function. Without any GPU this notebook starts two CPU
# processes instead, so that the same code is exercised on any machine: the processes then talk
# over *gloo* (PyTorch's CPU backend for exchanging tensors) where GPUs use *NCCL*. Everything else,
# the gradient averaging and the checks below, is the same.

# %%
num_processes = len(machine.gpus) if machine.gpus else 2
if machine.gpus and not machine.simulated:
    backend = "nccl"
    print(f"{num_processes} GPU(s): one training process per card, gradients averaged over NCCL")
else:
    backend = "gloo"
    rule = "=" * 78
    stand_in = "SIMULATED cards" if machine.simulated else "NO GPU"
    print(
        f"{rule}\n {stand_in}: launching {num_processes} CPU process{'es' if num_processes > 1 else ''} "
        "instead of GPU processes\n"
        " they exchange gradients over gloo instead of NCCL; the code and the checks are the same\n"
        " on Kaggle's T4 x2 this cell says 2 GPUs, and the same cells train on both cards\n"
        f"{rule}"
    )
helpers.record("num_processes", num_processes)
helpers.record("backend", backend)

# %% [markdown]
# A little preparation that touches no device: load the course dataset once here, so the processes
# find it in the cache instead of all building it at once; and import the model code, which the
# forked children inherit instead of importing it again (a few seconds each).

# %%
import sys

import transformers.models.llama.modeling_llama  # noqa: F401  (SmolLM2 and the embedded model are Llama-shaped)

from helpers.data import load_course_data

print(f"course dataset: {len(load_course_data())} instruction/response pairs")
print(f"bitsandbytes imported: {'bitsandbytes' in sys.modules}; CUDA initialised: {torch.cuda.is_initialized()}")

# %% [markdown]
# ## The training function
#
# Everything below runs in *every* process. It is an ordinary training loop with accelerate's three
# additions: an `Accelerator` (which joins the process group and picks this process's card),
# `accelerator.prepare` (which wraps the model in PyTorch's `DistributedDataParallel` and gives each
# process its own share of the batches) and `accelerator.backward` (where the gradients are
# averaged over the processes). At the end each process computes a checksum of its copy of the
# weights, and the processes exchange them with `accelerator.gather`.
#
# It takes all its settings in one dictionary and imports what it needs itself, so the same
# function can be saved as a script (last section). Rank 0, the first process, writes the results
# to a small JSON file: the children cannot hand Python objects back to the notebook, but they
# share its working folder.


# %%
def train_ddp(config):
    """Train one data-parallel copy of the model; gather checksums, step sizes and memory from every process."""
    import contextlib
    import io
    import json
    import time
    import warnings

    import torch
    from accelerate import Accelerator
    from accelerate.utils import gather_object, set_seed

    from helpers.data import pack_course_data
    from helpers.env import choose_precision, detect_gpus
    from helpers.memory import measure
    from helpers.models import load_model

    # 1. join the group: NCCL between GPUs; gloo between CPU processes (cpu=True), mixed precision for the card
    on_gpu = torch.cuda.is_available()  # in a child process CUDA is allowed
    card_precision = choose_precision(detect_gpus()).name  # what the card trains in (fp16 on a T4)
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(card_precision, "no") if on_gpu else "no"  # CPU: fp32
    with warnings.catch_warnings():  # on CPU, accelerate gives each process cores / processes threads, and says so
        warnings.filterwarnings("ignore", message="OMP_NUM_THREADS")
        accelerator = Accelerator(
            cpu=not on_gpu, mixed_precision=precision, gradient_accumulation_steps=config["grad_accum_steps"]
        )
    rank = accelerator.process_index
    set_seed(config["seed"])

    # 2. a whole copy of the model in every process, in fp32 (autocast runs the matmuls in 16 bits)
    quiet = contextlib.nullcontext() if accelerator.is_main_process else contextlib.redirect_stdout(io.StringIO())
    with accelerator.main_process_first(), quiet:  # rank 0 downloads, the others read its copy; one banner
        model, tokenizer = load_model(config["model_id"], smoke=config["smoke"], dtype=torch.float32)
    model.config.use_cache = False

    # 3. the course dataset as one stream of tokens, cut into blocks of seq_len: a (blocks, seq_len) tensor
    blocks = pack_course_data(tokenizer, config["seq_len"])["input_ids"][:]
    loader = torch.utils.data.DataLoader(blocks, batch_size=config["per_device_batch"], shuffle=True, drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["learning_rate"])

    # 4. DistributedDataParallel around the model; the loader now yields this process's share only
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # 5. train: accumulate grad_accum_steps micro-batches, then one optimizer step, in sync with the others
    steps, sequences, per_step, losses, first_batch = 0, 0, [], [], None
    start = time.perf_counter()
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
                if accelerator.sync_gradients:  # an optimizer step just happened
                    steps, per_step = steps + 1, per_step + [sequences]
                    losses.append(loss.item())
                    sequences = 0
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
                "last_loss": losses[-1],
                "sequences_per_step": per_step[0],
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
# `notebook_launcher(train_ddp, args=(config,), num_processes=...)` forks the notebook into that many
# processes, gives each its rank, and returns when all of them are done. They meet on a local port:
# a free one is picked here, since 29500, the default, may still be held by an earlier run.
#
# One oddity: without a GPU, accelerate's own launch line still says "CUDAs"; the processes
# themselves report, below, where they ran.

# %%
import json
import socket
import time
from pathlib import Path

from accelerate import notebook_launcher

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
work = Path("build")  # this notebook's files: the processes' results, and train.py below
work.mkdir(exist_ok=True)
result_file = (work / "ddp_result.json").resolve()  # rank 0 writes it, this notebook reads it
result_file.unlink(missing_ok=True)
config = dict(
    model_id=model_id,
    smoke=smoke,
    per_device_batch=per_device_batch,
    grad_accum_steps=grad_accum_steps,
    seq_len=seq_len,
    max_steps=max_steps,
    learning_rate=learning_rate,
    seed=seed,
    result_file=str(result_file),
)
start = time.perf_counter()
notebook_launcher(train_ddp, args=(config,), num_processes=num_processes, use_port=str(port))
launch_seconds = time.perf_counter() - start
report = json.loads(result_file.read_text())
print(
    f"{report['num_processes']} processes ({report['distributed_type']}, backend {report['backend']}, "
    f"mixed precision {report['mixed_precision']}): {report['steps']} optimizer steps, "
    f"{launch_seconds:.1f} s from launch to the last process's exit"
)
helpers.record("launch_seconds", round(launch_seconds, 1))
helpers.record("processes_ran", report["num_processes"])

# %% [markdown]
# ## Did the copies stay in sync?
#
# Each process saw different sequences (the token sums of their first micro-batches differ) and
# so computed a different loss. Yet after every step the weights must agree, because each process
# applied the same averaged gradient. The checksums, one row per process:

# %%
for r, (total, squares) in zip(report["ranks"], report["checksums"]):
    print(
        f"rank {r['rank']} on {r['device']}: first micro-batch token sum {r['first_batch_token_sum']:>8,}, "
        f"last loss {r['last_loss']:.4f} | weights: sum {total:.10f}, sum of squares {squares:.10f}"
    )
in_sync = all(c == report["checksums"][0] for c in report["checksums"])
different_data = len({r["first_batch_token_sum"] for r in report["ranks"]}) == len(report["ranks"])
print(f"parameters identical in every process: {in_sync}; every process had its own data: {different_data}")
assert in_sync, "the copies drifted apart: the gradients were not averaged"
helpers.record("params_in_sync", in_sync)
helpers.record("param_checksums", [c[0] for c in report["checksums"]])
helpers.record("different_data_per_rank", different_data)

# %% [markdown]
# Equal to the last digit: not "close", identical, because every process started from the same
# weights (DDP copies rank 0's at the start) and added the same numbers to them in the same order.
#
# ## What each card holds
#
# Each process measured its own training with `measure`: the bytes of the weights, gradients and
# AdamW states (exact), the activations, and the device's peak (torch.cuda's on its card, the
# process RSS on CPU). Data parallel saves no memory per card: every row shows the whole bill.
# Then NVML again, from the notebook: with the processes gone, their memory is back, and the
# launcher can run again in the same session.

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
if "peak_allocated" in report["ranks"][0]["memory"]:
    helpers.record(
        "peak_allocated_mib_per_rank", [round(r["memory"]["peak_allocated"] / MIB, 1) for r in report["ranks"]]
    )
helpers.record("weights_mib_per_rank", [round(r["memory"]["weights"] / MIB, 2) for r in report["ranks"]])
helpers.record("optimizer_mib_per_rank", [round(r["memory"]["optimizer"] / MIB, 2) for r in report["ranks"]])

# %% [markdown]
# The per-card bill is the single-GPU bill. What the second card buys is speed: twice the sequences
# per step at the same time per micro-batch, less the time spent averaging gradients. If the model
# does not fit one card, data parallel does not help: that takes QLoRA (notebook 05) or sharding
# the model itself across the cards (FSDP or DeepSpeed ZeRO, beyond this course).
#
# ## The effective batch with two devices
#
# The optimizer steps once per `grad_accum_steps` micro-batches on *each* device, and every device
# contributes its micro-batches to that step. Counted in the processes: the sequences each one
# fed into one optimizer step, added up over the processes.

# %%
counted = sum(r["sequences_per_step"] for r in report["ranks"])
effective_batch = per_device_batch * grad_accum_steps * report["num_processes"]
print(
    f"effective batch = per_device_batch {per_device_batch} x grad_accum_steps {grad_accum_steps} "
    f"x num_devices {report['num_processes']} = {effective_batch}"
)
print(
    f"sequences per optimizer step, counted: {' + '.join(str(r['sequences_per_step']) for r in report['ranks'])} "
    f"= {counted}"
)
assert counted == effective_batch
helpers.record("effective_batch", effective_batch)
helpers.record("effective_batch_counted", counted)
helpers.record("per_device_batch", per_device_batch)
helpers.record("grad_accum_steps", grad_accum_steps)

# %% [markdown]
# Moving a recipe from one card to two therefore changes the batch the optimizer sees, unless you
# change something else. To keep the effective batch (and with it the learning rate that suited
# it), halve the accumulation steps:

# %%
for devices, accumulation in ((1, grad_accum_steps * 2), (2, grad_accum_steps)):
    print(
        f"{devices} device(s): per_device_batch {per_device_batch} x grad_accum_steps {accumulation:2} "
        f"x num_devices {devices} = {per_device_batch * accumulation * devices}"
    )

# %% [markdown]
# Half the accumulation steps means half the micro-batches each card runs per step, so a step
# takes about half as long: that is the speed-up. Report the effective batch and its three factors;
# "batch size 4" hides two of them.
#
# ## The same training on a rented multi-GPU machine
#
# In a notebook the launcher forks the kernel. On a rented machine with several GPUs (RunPod,
# Lambda, Vast.ai) or a cluster node, the usual way is a script started from a terminal with
# `accelerate launch`, which starts one process per GPU and sets each one's rank. `train_ddp` needs
# no change for that: written to `train.py` with the settings above, it is the whole script.

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
# accelerate config           # once: answers saved to ~/.cache/huggingface/accelerate/default_config.yaml
# accelerate launch --num_processes 2 train.py
# ```
#
# What `accelerate config` asks, and the answers for one machine with several GPUs: "This machine";
# "multi-GPU"; 1 machine; no to DeepSpeed, FSDP and torch dynamo; "all" GPUs; and the mixed precision
# for the card: `bf16` on an A100 or H100, `fp16` on T4s or a V100. Skip it altogether and pass the
# same answers on the command line: `accelerate launch --multi_gpu --num_processes 2
# --mixed_precision bf16 train.py`. (`train_ddp` hands the card's precision to `Accelerator` itself,
# which takes precedence over the flag; in a script that does not, the flag decides.) `nvidia-smi`
# in a second terminal shows both cards busy.
#
# Without a GPU, `accelerate launch --num_processes 2` starts a single process; `accelerate launch
# --multi_gpu --num_processes 2 train.py` (or `torchrun --nproc_per_node 2 train.py`) starts two,
# which meet over gloo because `train_ddp` asks for `cpu=True` where it finds no GPU. That is how
# the kit's tests run this very file, and they get the same checksums as the notebook.
#
# ## Quick checks
#
# Two questions on this notebook. In each cell below, replace `None` with your answer and run the
# cell: it answers at once, with a hint when the answer is not right yet and the explanation when
# it is. Each check prints a receipt (question, attempt, result) that stays in the notebook. If
# your instructor grades these, keep each answer in its `answer_...` line, run all the cells, then
# download the notebook (File > Download notebook on Kaggle) and hand it in. Start with your
# student id: the second question gives each student their own numbers.

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

# %% [markdown]
# ## In this notebook we:
#
# - read both cards through NVML and kept CUDA untouched in the notebook, which `notebook_launcher`
#   needs (and chose two CPU processes over gloo where there is no GPU);
# - launched one training process per card from the notebook, each with a whole copy of the model;
# - checked that the copies stayed identical, weight for weight, although each process trained on
#   different sequences: the all-reduce averages the gradients;
# - measured each process's memory: data parallel buys speed, not memory;
# - counted the effective batch, per-device batch x accumulation x devices, and kept it the same on
#   two cards by halving the accumulation;
# - wrote the same training function as `train.py` for `accelerate launch` on a rented machine.
#
# Next: notebook 08 puts the whole recipe together and survives a disconnect.
