# %% [markdown]
# # 07 · Kaggle T4 x2: data parallel on two GPUs from a notebook
#
# **Hardware:** Kaggle's GPU T4 x2 (Settings > Accelerator), or any machine with several GPUs. Without a GPU,
# two CPU processes stand in for the cards.
# **Time:** about 3 minutes on Kaggle's T4 x2 including the install (an estimate: not yet timed on one); 14-19 s on a CPU (measured on 2 machines: 14 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-03; 19 s on a 2-core AMD EPYC with no bf16 units, 2026-12-03).
#
# *Data parallel* training uses both of Kaggle's T4s: each card holds a whole copy of the model and trains
# on its own share of every batch; after each backward pass the cards average their gradients (an
# *all-reduce*), so every copy takes the same step. Below: one process per card, the copies checked, the
# step time measured against one device, the effective batch counted.

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
    from helpers.models import is_embedded, load_model

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

with socket.socket() as s:  # a free port: 29500, the default, may still be held by an earlier run
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
notebook_launcher(train_ddp, args=(config,), num_processes=num_processes, use_port=str(port))
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
# data parallel buys speed, not memory; a model too big for one card needs QLoRA (notebook 05) or sharding
# (FSDP, DeepSpeed ZeRO).

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
# - wrote the training function as `train.py` for `accelerate launch`.
#
# **Change this, predict, run.**
#
# 1. Set `grad_accum_steps = 1`. Predict the effective batch on two devices and the baseline's accumulation
#    steps, then run all and compare with the counted lines.
# 2. Set `per_device_batch = 8`. Predict which lines of "What each card holds" grow, then run all.
#
# Next: notebook 08 puts the whole recipe together and survives a disconnect.
