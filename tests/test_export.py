"""`python -m helpers export 08`: notebook 08 as train.py, launch.sh (torchrun), an accelerate config and a Slurm job.

The exported 2-node job.sbatch itself runs here, under a FAKE `srun` and a FAKE `scontrol` (Slurm
cannot run here): the fake srun starts launch.sh once per "node" with SLURM_NODEID 0 and 1, so two
torchrun launchers of one process each meet on localhost and train on CPU over gloo. One run is
killed with SIGKILL after its first checkpoint (every process, as a preempted job loses them),
requeued under the same job id, and resumes to the same final adapter, bit for bit. The job file is
checked against a table of sbatch options and by `bash -n`, and run with a fake srun that sleeps to
see the USR1 trap requeue the job; launch.sh's torchrun line is read by torchrun's own parser; two
launchers told different node counts stop together with an error saying so.
"""

import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from background import background, write_executable
from safetensors.torch import load_file

from helpers._checksums import sha256_file
from helpers.maintainer import export as export_module
from helpers.maintainer.export import ExportError, export, notebook_parameters
from helpers.maintainer.notebooks import SOURCES_DIR

SLOW_FIXTURES = ("two_node_runs", "requeued_runs")  # train.py runs, in the background lane (conftest: slow)
VENV_BIN = Path(sys.executable).parent  # torchrun
# the variables a launcher reads: none may come in from the shell that runs the tests (or a real Slurm job)
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NPROC_PER_NODE", "NODE_RANK", "RDZV_TIMEOUT")
LAUNCH_VARIABLES += ("ACCELERATE_MIXED_PRECISION", "OUTPUT_DIR", "RANK", "WORLD_SIZE", "LOCAL_RANK")
FAKE_SRUN = """#!/bin/bash
# A FAKE srun, for the tests only (Slurm cannot run here): the command once per node of the allocation,
# each with the SLURM_NODEID the real srun gives it; srun's own options are skipped, not acted on.
while [[ "$1" == -* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
"""
FAKE_SCONTROL = """#!/bin/bash
# A FAKE scontrol, for the tests only: `show hostnames A,B` prints A and B, a line each; the rest is recorded.
if [[ "$1 $2" == "show hostnames" ]]; then tr ',' '\\n' <<<"$3"; else echo "$@" >> "$FAKE_SCONTROL_LOG"; fi
"""

CAPSTONE = SOURCES_DIR / "08_capstone.py"
TIMEOUT_S = 600  # one two-process run takes about 20 s alone, 76 s beside the notebooks; once over 300 s on a
# loaded CI machine (Python 3.13), so the failure names the log
# a short run of the capstone's recipe: 64 training rows, 2 x 1 per process x 2 processes = 4 a step, so 16
# steps an epoch and the run crosses into the second; its steps take about 0.1 s each
STEPS = 20  # the killed run is stopped at its first checkpoint (step 4): 16 steps of margin before the end
RUN = ["--smoke", "--per-device-batch", "2", "--grad-accum-steps", "1", "--max-steps", str(STEPS), "--save-steps", "4"]
RUN += ["--logging-steps", "1"]


def helpers_cli(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True, timeout=120)


# ---------------------------------------------------------------------------------------------
# the defaults come from the notebook


def test_train_py_takes_its_defaults_from_the_notebooks_parameters_cell(tmp_path, monkeypatch):
    cell = CAPSTONE.read_text().split('# %% tags=["parameters"]')[1].split("# %%")[0]
    expected = {}
    exec(cell, {}, expected)  # the cell as papermill would run it
    found = notebook_parameters(CAPSTONE)
    assert {k: v for k, (v, _) in found.items()} == expected
    assert found["grad_accum_steps"][1] == "effective batch = 1 x 16 x 1 = 16"

    # a changed default follows at the next export
    changed = tmp_path / "src"
    changed.mkdir()
    text = CAPSTONE.read_text().replace("grad_accum_steps = 16  #", "grad_accum_steps = 8  #")
    (changed / CAPSTONE.name).write_text(text)
    monkeypatch.setattr(export_module, "SOURCES_DIR", changed)
    export("08", tmp_path / "job")
    done = subprocess.run([sys.executable, tmp_path / "job" / "train.py", "--help"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    help_text = " ".join(done.stdout.split())
    assert "--grad-accum-steps GRAD_ACCUM_STEPS effective batch = 1 x 16 x 1 = 16 (default 8)" in help_text
    for flag in ("--model-id", "--per-device-batch", "--seq-len", "--max-steps", "--learning-rate", "--seed"):
        assert flag in help_text
    assert "--output-dir" in help_text and "--smoke" in help_text and "--disconnect-after-step" not in help_text
    assert "--use-drive" not in help_text, "Google Drive is the notebook's, on Colab"


def test_train_py_passes_the_kits_linter_and_formatter(tmp_path):
    export("08", tmp_path)
    ruff = [sys.executable, "-m", "ruff"]
    rules = ["--isolated", "--line-length", "120"]
    checked = subprocess.run([*ruff, "check", *rules, "--select", "E,W,F,I,B,UP", tmp_path / "train.py"], text=True,
                             capture_output=True)  # fmt: skip
    assert checked.returncode == 0, checked.stdout
    formatted = subprocess.run(
        [*ruff, "format", "--diff", *rules, tmp_path / "train.py"], capture_output=True, text=True
    )
    assert formatted.returncode == 0, formatted.stdout


def test_a_notebook_without_a_parameters_cell_is_refused():
    with pytest.raises(ExportError, match='no cell tagged "parameters"'):
        notebook_parameters("# %%\nx = 1\n")
    with pytest.raises(ExportError, match="seed is not a plain constant"):
        notebook_parameters('# %% tags=["parameters"]\nseed = int("4")\n')


# ---------------------------------------------------------------------------------------------
# the accelerate config, as accelerate itself reads it


@pytest.mark.parametrize(
    ("gpus", "card", "kind", "precision"),
    [(1, None, "NO", "no"), (2, "T4", "MULTI_GPU", "fp16"), (8, "A100-80GB", "MULTI_GPU", "bf16")],
)
def test_the_accelerate_config_loads_in_accelerate(tmp_path, gpus, card, kind, precision):
    from accelerate.commands.config.config_args import load_config_from_file

    export("08", tmp_path, gpus=gpus, card=card)
    config = load_config_from_file(str(tmp_path / "accelerate_config.yaml"))
    assert config.distributed_type.name == kind and config.num_processes == gpus
    assert str(config.mixed_precision) == precision and config.num_machines == 1
    assert export("08", tmp_path, gpus=2, card="T4", mixed_precision="bf16")  # the flag overrides the card
    assert "mixed_precision: 'bf16'" in (tmp_path / "accelerate_config.yaml").read_text()


# ---------------------------------------------------------------------------------------------
# the Slurm job: every #SBATCH line against a table, bash -n, and the trap at work

DURATION = r"(\d+-)?\d{1,2}:\d{2}:\d{2}"
SBATCH_OPTIONS = {  # option -> the format of its value (sbatch(1)); None: a flag without a value
    "job-name": r"[\w.-]+",
    "nodes": r"\d+",
    "ntasks-per-node": r"\d+",
    "gres": r"gpu(:[\w-]+)?:\d+",
    "gpus": r"\d+",
    "cpus-per-task": r"\d+",
    "mem": r"\d+[KMGT]?",
    "time": DURATION,
    "partition": r"[\w,-]+",
    "account": r"[\w-]+",
    "output": r"[\w./%-]+",
    "error": r"[\w./%-]+",
    "open-mode": r"append|truncate",
    "requeue": None,
    "signal": r"(B:|R:)?(USR1|USR2|TERM|INT)(@\d+)?",
}


def sbatch_options(text: str) -> dict[str, str | None]:
    """Each `#SBATCH --option[=value]` line (those before the first command, as sbatch reads them)."""
    found = {}
    for line in text.splitlines()[1:]:
        if line and not line.startswith("#"):
            break  # sbatch stops reading options at the first command
        if not line.startswith("#SBATCH"):
            continue
        match = re.fullmatch(r"#SBATCH --([a-z-]+)(?:=(\S+))?", line)
        assert match, f"not an sbatch option line: {line!r}"
        name, value = match.groups()
        assert name in SBATCH_OPTIONS, f"unknown sbatch option --{name}"
        pattern = SBATCH_OPTIONS[name]
        if pattern is None:
            assert value is None, f"--{name} takes no value, got {value!r}"
        else:
            assert value is not None and re.fullmatch(pattern, value), f"--{name}={value} does not read as {pattern}"
        found[name] = value
    return found


def test_the_job_file_reads_as_sbatch_and_as_bash(tmp_path):
    export("08", tmp_path, nodes=2, gpus=4, time="1-12:00:00", partition="gpu")
    text = (tmp_path / "job.sbatch").read_text()
    assert text.startswith("#!/bin/bash\n")
    options = sbatch_options(text)
    assert options["nodes"] == "2" and options["ntasks-per-node"] == "1", "one launcher a node"
    assert options["gres"] == "gpu:4" and options["time"] == "1-12:00:00" and options["partition"] == "gpu"
    assert "requeue" in options and options["open-mode"] == "append" and options["signal"] == "B:USR1@120"
    assert (tmp_path / "logs").is_dir(), "Slurm does not create the --output folder"
    for name in ("job.sbatch", "launch.sh"):
        checked = subprocess.run(["bash", "-n", tmp_path / name], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    assert 'scontrol requeue "${SLURM_JOB_ID}"' in text and "trap requeue USR1" in text
    assert 'bash launch.sh --output-dir "${OUTPUT_DIR}" "$@"' in text  # the same folder every restart: it resumes
    assert 'NPROC_PER_NODE="${NPROC_PER_NODE:-4}"' in (tmp_path / "launch.sh").read_text()
    with pytest.raises(AssertionError, match="unknown sbatch option --gress"):
        sbatch_options("#!/bin/bash\n#SBATCH --gress=gpu:4\n")
    with pytest.raises(AssertionError, match="does not read as"):
        sbatch_options("#!/bin/bash\n#SBATCH --time=4h\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    outside = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert outside.returncode == 2 and "without Slurm: bash launch.sh" in outside.stderr, outside.stderr


def fake_slurm(folder: Path, srun: str = FAKE_SRUN) -> Path:
    """A folder holding a FAKE srun and a FAKE scontrol (Slurm cannot run here), to put first on PATH."""
    folder.mkdir(exist_ok=True)
    for name, text in (("srun", srun), ("scontrol", FAKE_SCONTROL)):
        write_executable(folder / name, text)
    return folder


def slurm_env(job: Path, fake: Path, base: dict[str, str] | None = None, **values: str) -> dict[str, str]:
    """What Slurm gives a 2-node batch script, nothing of a launcher's from this shell (`base`: os.environ), the
    fakes first on PATH."""
    base = dict(os.environ) if base is None else base
    env = {k: v for k, v in base.items() if not k.startswith("SLURM_") and k not in LAUNCH_VARIABLES}
    return env | {
        "PATH": f"{fake}:{VENV_BIN}:{base['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.2",  # two names for this machine
        "SLURM_SUBMIT_DIR": str(job),
        "FAKE_SCONTROL_LOG": str(fake / "scontrol.log"),
        **values,
    }


def test_usr1_requeues_the_job(tmp_path):
    """The job under a fake Slurm: USR1 (what --signal sends) makes the trap call scontrol requeue."""
    job = tmp_path / "job"
    export("08", job, nodes=2, gpus=4)
    sleeping = "#!/bin/bash\n"  # a FAKE srun: says what it was given, then its "training" sleeps
    sleeping += (
        f'echo "$MASTER_ADDR $MASTER_PORT $NNODES $NPROC_PER_NODE ${{NODE_RANK:-unset}}" > {tmp_path}/rendezvous\n'
    )
    sleeping += f'echo "$@" > {tmp_path}/launched\nexec sleep 60\n'
    fake = fake_slurm(tmp_path / "bin", srun=sleeping)
    env = slurm_env(job, fake, SLURM_JOB_NODELIST="gpu-a1,gpu-a2", SLURM_CPUS_PER_TASK="16", NODE_RANK="5")
    with open(tmp_path / "job.log", "w") as log:  # a file: the sleeping fake would hold a pipe open
        process = subprocess.Popen(
            ["bash", "job.sbatch", "--max-steps", "7"], cwd=job, env=env, start_new_session=True,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "launched").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGUSR1)  # to the batch shell only, as B: asks
        assert process.wait(timeout=30) == 128 + signal.SIGUSR1  # the job ends; Slurm requeues it
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the fake training still sleeps
    out = (tmp_path / "job.log").read_text()
    assert (tmp_path / "launched").read_text().split() == [
        "--kill-on-bad-exit=1", "--cpus-per-task=16", "bash", "launch.sh", "--output-dir", "runs/capstone",
        "--max-steps", "7",
    ]  # fmt: skip
    # the first node, a port from the job id (29500 + 4242 % 1000), Slurm's node count; no NODE_RANK from the shell
    assert (tmp_path / "rendezvous").read_text().split() == ["gpu-a1", "29742", "2", "4", "unset"]
    assert (fake / "scontrol.log").read_text().split() == ["requeue", "4242"], out
    assert "requeueing job 4242" in out and "2 nodes x 4 GPUs, rendezvous at gpu-a1:29742" in out


@pytest.mark.parametrize(
    ("env", "node_rank", "nnodes", "addr", "port"),
    [
        ({}, 0, "1", "127.0.0.1", 29500),  # one machine, all its GPUs
        ({"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29613"}, 1, "2", "10.0.0.1",
         29613),  # a plain set of machines
        ({"NNODES": "2", "SLURM_NODEID": "1", "MASTER_ADDR": "gpu-a1", "MASTER_PORT": "29742"}, 1, "2", "gpu-a1",
         29742),  # under srun
    ],
)  # fmt: skip
def test_launch_sh_is_a_torchrun_command_its_own_parser_reads(tmp_path, env, node_rank, nnodes, addr, port):
    from torch.distributed.run import config_from_args, get_args_parser

    export("08", tmp_path, gpus=4, card="A100-80GB")
    fake = tmp_path / "bin"
    fake.mkdir()
    # a FAKE torchrun: what it was given, NUL-separated, and the precision launch.sh exported for train.py
    write_executable(fake / "torchrun", f"#!/bin/bash\nprintf '%s\\0' \"$@\" > {tmp_path}/args\n"
                                        f'echo "$ACCELERATE_MIXED_PRECISION" > {tmp_path}/precision\n')  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCH_VARIABLES}
    done = subprocess.run(["bash", "launch.sh", "--max-steps", "7"], cwd=tmp_path, capture_output=True, text=True,
                          env=clean | {"PATH": f"{fake}:{os.environ['PATH']}"} | env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = get_args_parser().parse_args((tmp_path / "args").read_text().split("\0")[:-1])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == (nnodes, "4", node_rank)
    assert (args.master_addr, args.master_port, args.rdzv_backend) == (addr, port, "static")
    assert args.rdzv_conf == "timeout=600", "node 0 waits a bounded time for the others"
    assert (tmp_path / args.training_script).resolve() == (tmp_path / "train.py").resolve()  # from launch.sh's folder
    assert args.training_script_args == ["--max-steps", "7"]
    config, _, _ = config_from_args(args)
    assert config.rdzv_configs == {"timeout": "600", "rank": node_rank} and config.max_nodes == int(nnodes)
    assert (tmp_path / "precision").read_text().strip() == "bf16", "the card's, as accelerate_config.yaml has it"


# ---------------------------------------------------------------------------------------------
# train.py: two nodes of one process each over gloo, through the exported job.sbatch; killed, requeued, resumed


def job_ids_with_free_ports(count: int) -> list[int]:
    """Slurm job ids whose rendezvous ports (job.sbatch: 29500 + id % 1000) are free here now, each another."""
    found = []
    for offset in random.sample(range(1000), 1000):
        with socket.socket() as s:
            try:
                s.bind(("", 29500 + offset))
            except OSError:
                continue
        found.append(100_000 + offset)
        if len(found) == count:
            return found
    pytest.fail("no free port in 29500..30499 for the rendezvous")


def launch(job: Path, out: Path, log: Path, job_id: int, base: dict[str, str], restart: int = 0) -> subprocess.Popen:
    """The exported job.sbatch as Slurm would run it on 2 nodes (FAKE srun and scontrol): two torchrun launchers
    of one process each, on CPU over gloo; `restart` is SLURM_RESTART_COUNT (a requeued job keeps its id)."""
    env = slurm_env(job, job / "fake-slurm", base, SLURM_JOB_ID=str(job_id), SLURM_RESTART_COUNT=str(restart))
    env |= {"OUTPUT_DIR": str(out), "HF_HOME": str(job / "hf"), "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = str(SOURCES_DIR.parents[1])
    with open(log, "w") as log_file:  # a file, not a pipe: a full pipe would stall the run
        return subprocess.Popen(
            ["bash", "job.sbatch", *RUN], cwd=job, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the job and every process under it (srun, the launchers, the ranks): torchrun starts its ranks in their
    own groups. A job that has already ended has nothing left to kill."""
    try:
        tree = [process.pid] + [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:  # ended and reaped (poll() saw it end)
        tree = []
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def finish(process: subprocess.Popen, log: Path) -> None:
    try:
        process.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        tree = psutil.Process(process.pid).children(recursive=True)
        alive = [f"{p.pid} {p.status()}: {' '.join(p.cmdline())[-60:]}" for p in tree]
        kill_tree(process)
        pytest.fail(
            f"{log.name}: not done {TIMEOUT_S} s after it was awaited; under the launcher {alive}; its last "
            f"lines:\n{log.read_text()[-4000:]}"
        )
    text = log.read_text()
    assert process.returncode == 0, text[-4000:]
    # a rank that exits with its process group alive can abort in gloo's threads (pytorch#190489)
    assert "terminate called" not in text, text[-4000:]


@background
def two_node_runs(job: Path, env: dict[str, str]):
    """The exported 2-node job run twice at once: once through, once killed after its first checkpoint and requeued.

    Returns the job's folder, what the killed run left, and each run's Slurm job id.
    """
    export("08", job, nodes=2, gpus=1)
    fake_slurm(job / "fake-slurm")
    ids = dict(zip(("reference", "killed"), job_ids_with_free_ports(2), strict=True))
    reference = launch(job, job / "reference", job / "reference.log", ids["reference"], env)
    doomed = launch(job, job / "killed", job / "killed.log", ids["killed"], env)
    deadline = time.monotonic() + TIMEOUT_S
    while not any((c / "run_manifest.json").exists() for c in (job / "killed").glob("checkpoint-*")):
        if doomed.poll() is not None or time.monotonic() > deadline:
            kill_tree(doomed)
            log = (job / "killed.log").read_text()[-4000:]
            pytest.fail(f"no checkpoint before the run ended or timed out:\n{log}")
        time.sleep(0.01)
    kill_tree(doomed)  # the job, both launchers and both ranks, with no cleanup: a preempted job
    left = sorted(p.name for p in (job / "killed").iterdir())
    finish(reference, job / "reference.log")
    resumed = launch(job, job / "killed", job / "resumed.log", ids["killed"], env, restart=1)  # requeued: the same id
    finish(resumed, job / "resumed.log")
    return job, left, ids


@pytest.mark.slow
def test_the_job_trains_on_two_nodes_to_the_end(two_node_runs):
    """The very job.sbatch a student submits, for 2 nodes x 1 GPU: srun (FAKE) starts launch.sh on each node,
    their torchruns meet on the first node, rank 0 alone saves, each checkpoint once."""
    job, _, ids = two_node_runs
    result = json.loads((job / "reference" / "result.json").read_text())
    assert result["global_step"] == STEPS and result["resumed_from"] is None
    log = (job / "reference.log").read_text()
    where = f"rendezvous at 127.0.0.1:{29500 + ids['reference'] % 1000}"  # the first node; a port from the job id
    assert f"restart 0, on {socket.gethostname()}" in log and f"2 nodes x 1 GPUs, {where}" in log
    for node in (0, 1):
        assert f"node {node} of 2, {where}" in log, f"launch.sh on node {node}, under srun"
        assert f"rank {node} of 2 (node {node}, local rank 0): {where}" in log, "one process a node, one world"
    assert "effective batch 2 x 1 x 2 = 4" in log, "two processes, one batch each per step"
    saved = re.findall(r"rank (\d+): saved checkpoint-(\d+) in (.+)", log)
    assert saved == [("0", str(s), str(job / "reference")) for s in range(4, STEPS + 1, 4)], "rank 0 saves, once"
    checkpoint = job / "reference" / f"checkpoint-{STEPS}"
    assert sorted(p.name for p in checkpoint.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"], (
        "each rank its own RNG state, in one world of two: none trained (and saved) alone"
    )
    recorded = json.loads((checkpoint / "run_manifest.json").read_text())["checksums"]["files"]
    assert recorded["rng_state_1.pth"]["sha256"] == sha256_file(checkpoint / "rng_state_1.pth"), (
        "the manifest waits for rank 1's RNG state and hashes it whole"
    )
    assert list(result["losses"]) == [str(s) for s in range(1, STEPS + 1)]


def test_a_killed_run_resumes_from_its_last_valid_checkpoint_to_the_same_adapter(two_node_runs):
    job, left, ids = two_node_runs
    assert "result.json" not in left and f"checkpoint-{STEPS}" not in left, left
    resumed = json.loads((job / "killed" / "result.json").read_text())
    reference = json.loads((job / "reference" / "result.json").read_text())
    start = int(Path(resumed["resumed_from"]).name.split("-")[1])
    assert Path(resumed["resumed_from"]).parent == job / "killed" and 4 <= start < STEPS
    log = (job / "resumed.log").read_text()
    assert f"this run trains in {job / 'killed'}: the same settings as its checkpoints" in log, "the requeue's rule"
    assert log.count(f"resuming from {resumed['resumed_from']}\n") == 2, "both ranks, from the one checkpoint"
    assert f"job {ids['killed']}, restart 1" in log and "rank 1 of 2 (node 1, local rank 0)" in log
    assert resumed["global_step"] == STEPS
    assert resumed["eval_loss"] == reference["eval_loss"]
    assert all(resumed["losses"][str(s)] == reference["losses"][str(s)] for s in range(start + 1, STEPS + 1))
    expected = load_file(job / "reference" / "final" / "adapter_model.safetensors")
    got = load_file(job / "killed" / "final" / "adapter_model.safetensors")
    assert expected.keys() == got.keys() and len(expected) > 0
    assert all(torch.equal(expected[k], got[k]) for k in expected), "every final adapter weight, bit for bit"


@pytest.mark.slow
def test_launchers_told_different_node_counts_stop_together_saying_so(tmp_path):
    """Node 0's launch.sh told 2 nodes, node 1's told 3. torchrun takes node 0's word and starts both ranks (left
    alone they would train, then wait out torchrun's 300 s exit barrier and exit 0); train.py's check stops both
    within seconds, each saying what each launcher was told, and torchrun's summary names the rank."""
    export("08", tmp_path, nodes=2, gpus=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in LAUNCH_VARIABLES}
    env |= {"PATH": f"{VENV_BIN}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    env |= {"PYTHONPATH": str(SOURCES_DIR.parents[1]), "MASTER_PORT": str(29500 + job_ids_with_free_ports(1)[0] % 1000)}
    start, launchers = time.monotonic(), []
    for rank, nodes in ((0, "2"), (1, "3")):
        with open(tmp_path / f"node{rank}.log", "w") as log:
            command = ["bash", "launch.sh", "--smoke", "--output-dir", str(tmp_path / "run")]
            told = env | {"NNODES": nodes, "NODE_RANK": str(rank)}
            launchers.append(subprocess.Popen(command, cwd=tmp_path, env=told, stdout=log, stderr=subprocess.STDOUT))
    for launcher in launchers:
        try:
            launcher.wait(timeout=120 - (time.monotonic() - start))
        except subprocess.TimeoutExpired:
            for each in launchers:
                kill_tree(each)
            pytest.fail(f"still running after 120 s:\n{(tmp_path / 'node0.log').read_text()[-3000:]}")
    print(f"both stopped {time.monotonic() - start:.1f} s after they started")
    said = "error: the launchers disagree (node 0's 2 nodes x 1, node 1's 3 nodes x 1 processes), and 2 processes met"
    for rank, launcher in enumerate(launchers):
        log = (tmp_path / f"node{rank}.log").read_text()
        assert launcher.returncode == 1 and f"{said}. Start every node with the same NNODES" in log, log[-3000:]
        assert f"rank      : {rank} (local_rank: 0)" in log and f"SystemExit: {said}" in log, "torchrun's summary"
        assert "terminate called" not in log and "Training completed" not in log


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@background
def requeued_runs(folder: Path, env: dict[str, str], two_node_runs):
    """train.py requeued by hand on what the reference run left, each case in a folder of its own:

    - "unfinished": its checkpoints without final/ and result.json (preempted while evaluating), requeued twice;
    - "rejected": its checkpoints with every manifest cut short, then again with --set-aside-rejected.

    Returns {case: (the run folder, its files before the first run, [(each run's result, the files after it)])}.
    """
    job, *_ = two_node_runs
    env = env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SOURCES_DIR.parents[1])}
    unfinished, rejected = folder / "unfinished", folder / "rejected"
    shutil.copytree(job / "reference", unfinished, ignore=shutil.ignore_patterns("final", "result.json"))
    for checkpoint in (job / "reference").glob("checkpoint-*"):
        shutil.copytree(checkpoint, rejected / checkpoint.name)
        (rejected / checkpoint.name / "run_manifest.json").write_text("{")
    requeues = {
        "unfinished": (unfinished, [[], []]),
        "rejected": (rejected, [[], ["--set-aside-rejected", "--max-steps", "2"]]),
    }
    cases = {}
    for case, (out, flags) in requeues.items():
        before, runs = files(out), []
        for extra in flags:
            command = [sys.executable, "train.py", *RUN, "--output-dir", str(out), *extra]
            done = subprocess.run(command, cwd=job, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
            runs.append((done, files(out)))
        cases[case] = (out, before, runs)
    return cases


def test_a_finished_run_without_its_results_finishes_them_and_then_trains_nothing(two_node_runs, requeued_runs):
    """A job stopped after its last checkpoint, before final/ and result.json (preempted while evaluating; a
    crash in its last lines): requeued, it writes them from that checkpoint; requeued again, it has nothing to do."""
    job, *_ = two_node_runs
    out, _, ((finished, _), (again, _)) = requeued_runs["unfinished"]
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert (
        f"{out / f'checkpoint-{STEPS}'} ends a finished run whose final/ or result.json is missing" in finished.stdout
    )
    reference = json.loads((job / "reference" / "result.json").read_text())
    result = json.loads((out / "result.json").read_text())
    assert result["eval_loss"] == reference["eval_loss"] and result["losses"] == reference["losses"]
    assert result["global_step"] == STEPS
    expected = load_file(job / "reference" / "final" / "adapter_model.safetensors")
    got = load_file(out / "final" / "adapter_model.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)

    assert again.returncode == 0, again.stderr[-3000:]
    assert f"this run trains in {out}: the same settings as its checkpoints" in again.stdout
    assert "ends a finished run: nothing left to train" in again.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seq-len", "0"], "argument --seq-len: 0 is out of range: pass a whole number from 1"),
        (["--learning-rate", "nan"], "argument --learning-rate: nan is out of range"),
        (["--per-device-batch", "0"], "argument --per-device-batch: 0 is out of range"),
        (["--max-steps", "0"], "argument --max-steps: 0 is out of range"),
        (["--save-steps", "-5"], "argument --save-steps: -5 is out of range"),
        (["--run-name", "../x"], "argument --run-name: '../x' cannot name a run folder"),
    ],
)
def test_a_bad_value_stops_train_py_as_it_is_read_before_anything_loads(tmp_path, flags, message):
    export("08", tmp_path)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "train.py", *flags], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    seconds = time.monotonic() - start
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "quantized" not in done.stdout and not (tmp_path / "runs").exists(), "nothing loaded, nothing written"
    print(f"{' '.join(flags)}: refused in {seconds:.2f} s")


@pytest.mark.slow
def test_a_seq_len_that_leaves_nothing_to_evaluate_stops_before_the_model_loads(tmp_path):
    export("08", tmp_path)
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "train.py", "--smoke", "--seq-len", "20", "--output-dir", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    said = done.stderr
    assert "error: --seq-len 20 leaves none of the 8 held-out examples an answer token (the shortest prompt is" in said
    assert "pass a --seq-len above" in done.stderr and "Traceback" not in done.stderr
    assert "quantized" not in done.stdout, "the model never loaded"
    assert not (tmp_path / "run").exists() and "done" not in done.stdout


def test_a_folder_the_checkpoint_rotation_would_delete_from_stops_train_py_first(tmp_path):
    export("08", tmp_path)
    mine = tmp_path / "run" / "checkpoint-40 - Copy"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("the user's own")
    done = subprocess.run(
        [sys.executable, "train.py", "--smoke", "--output-dir", str(tmp_path / "run")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "holds 'checkpoint-40 - Copy', which the Trainer's" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "quantized" not in done.stdout
    assert (mine / "notes.txt").read_text() == "the user's own"


# ---------------------------------------------------------------------------------------------
# the command line


def test_export_writes_the_four_files_and_says_what_next(tmp_path):
    done = helpers_cli("export", "08", "--out", str(tmp_path / "job"), "--gpus", "2", "--card", "A100-80GB")
    assert done.returncode == 0, done.stderr
    names = ("train.py", "launch.sh", "accelerate_config.yaml", "job.sbatch")
    for name in names:
        assert f"wrote {tmp_path / 'job' / name}" in done.stdout
    assert (
        "sbatch job.sbatch" in done.stdout
        and f"or, without Slurm: cd {tmp_path / 'job'} && bash launch.sh" in done.stdout
    )
    checked = subprocess.run(
        ["sha256sum", "-c", "exported.sha256"], cwd=tmp_path / "job", capture_output=True, text=True
    )
    assert checked.returncode == 0 and checked.stdout.split() == [x for n in names for x in (f"{n}:", "OK")]
    two = helpers_cli("export", "08", "--out", str(tmp_path / "two"), "--nodes", "2", "--gpus", "4")
    assert two.returncode == 0 and "NNODES=2 NODE_RANK=<0 to 1, 0 on the first> MASTER_ADDR=" in two.stdout, two.stderr
    assert "#SBATCH --nodes=2\n" in (tmp_path / "two" / "job.sbatch").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export", "99", "--out", "{tmp}/job"], "notebook '99' cannot be exported: export knows 08 (08_capstone)"),
        (["export", "08", "--out", "{tmp}/file.txt"], "is a file: pass a folder, e.g. --out"),
        (["export", "08", "--out", "{tmp}/job", "--gpus", "0"], "gpus=0: pass a whole number of GPUs per node from 1"),
        (["export", "08", "--out", "{tmp}/job", "--gpus", "65"], "gpus=65: pass a whole number of GPUs per node"),
        (
            ["export", "08", "--out", "{tmp}/job", "--nodes", "0"],
            "nodes=0: pass a whole number of machines from 1 to 64",
        ),
        (["export", "08", "--out", "{tmp}/job", "--nodes", "65"], "nodes=65: pass a whole number of machines from 1"),
        (["export", "08", "--out", "{tmp}/job", "--nodes", "1.5"], "'1.5' is not a whole number: pass e.g. --nodes 2"),
        (["export", "08", "--out", "{tmp}/job", "--gpus", "two"], "'two' is not a whole number: pass e.g. --gpus 4"),
        (
            ["export", "08", "--out", "{tmp}/job", "--nodes", "2", "--gpus", "0"],
            "nodes=2 with gpus=0: a node count with no GPUs per node; --gpus is per node: pass e.g. --nodes 2 --gpus 4",
        ),
        (["export", "08", "--out", "{tmp}/job", "--card", "P100"], "unknown GPU 'P100'"),
        (["export", "08", "--out", "{tmp}/job", "--time", "4h"], "pass e.g. --time 04:00:00"),
    ],
)
def test_export_refuses_what_it_cannot_do(tmp_path, args, message):
    (tmp_path / "file.txt").write_text("not a folder")
    done = helpers_cli(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        ({"nodes": "2"}, "nodes='2': pass a whole number"),
        ({"nodes": True}, "nodes=True: pass a whole number"),
        ({"nodes": 2.0}, "nodes=2.0: pass a whole number"),
        ({"gpus": 1.5}, "gpus=1.5: pass a whole number"),
        ({"nodes": 3, "gpus": 0}, "nodes=3 with gpus=0: a node count with no GPUs per node"),
    ],
)
def test_a_count_that_is_not_a_whole_number_in_range_writes_nothing(tmp_path, counts, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        export("08", tmp_path / "job", **counts)
    assert not (tmp_path / "job").exists()


def test_export_needs_the_notebook_source(tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "SOURCES_DIR", tmp_path)
    with pytest.raises(ExportError, match="is missing: export runs from a clone of the kit"):
        export("08", tmp_path / "job")


# ---------------------------------------------------------------------------------------------
# what reaches the shell: every value checked, every path quoted, edits kept


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"run_name": "$(touch pwned)"}, "run_name '$(touch pwned)' cannot name the Slurm job"),
        ({"run_name": "my run's"}, "set e.g. run_name = 'my-run-s'"),
        ({"run_name": "-x"}, "starting with neither"),
        ({"partition": "gpu\n#SBATCH --x"}, r"pass e.g. --partition gpu-SBATCH-x"),
        ({"partition": "a b"}, "pass e.g. --partition a-b"),
        ({"time": "04:00:00\n"}, "is not Slurm's"),
    ],
)
def test_a_value_sbatch_would_misread_is_refused_saying_what_works(job, message):
    with pytest.raises(ExportError, match=re.escape(message)):
        export_module.sbatch_script(1, **job)


def test_a_run_name_with_shell_in_it_writes_nothing_and_runs_nothing(tmp_path, monkeypatch):
    """The notebook's run_name reaches #SBATCH --job-name and the job's output folder: never as shell."""
    changed = tmp_path / "src"
    changed.mkdir()
    text = CAPSTONE.read_text().replace('run_name = "capstone"', 'run_name = "x$(touch {})"'.format(tmp_path / "pwn"))
    (changed / CAPSTONE.name).write_text(text)
    monkeypatch.setattr(export_module, "SOURCES_DIR", changed)
    with pytest.raises(ExportError, match=r"run_name 'x\$\(touch .*in the parameters cell of"):
        export("08", tmp_path / "job")
    assert not (tmp_path / "job").exists() and not (tmp_path / "pwn").exists()


def test_the_printed_next_step_is_a_command_that_pastes(tmp_path):
    out = tmp_path / "my job $(touch pwned) 'x'"
    done = helpers_cli("export", "08", "--out", str(out))
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("next: "))
    assert line == f"next: cd {shlex.quote(str(out))} && sbatch job.sbatch"
    pasted = subprocess.run(["bash", "-c", line.removeprefix("next: ").replace("sbatch job.sbatch", "pwd")],
                            capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert pasted.stdout.strip() == str(out) and not (tmp_path / "pwned").exists()


def test_a_second_export_keeps_edited_files_unless_forced(tmp_path):
    export("08", tmp_path, gpus=2)
    assert export("08", tmp_path, gpus=2)  # nothing edited: the same again is fine
    assert export("08", tmp_path, gpus=4)  # nor another choice over files nobody edited
    train = tmp_path / "train.py"
    edited = train.read_text().replace("save_total_limit=2", "save_total_limit=5")
    train.write_text(edited)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(ExportError, match=rf"{re.escape(str(train))}: changed since the last export.*--force"):
        export("08", tmp_path, gpus=2)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before, "nothing replaced"
    done = helpers_cli("export", "08", "--out", str(tmp_path))
    assert done.returncode == 2 and "train.py: changed since the last export" in done.stderr, done.stderr
    assert helpers_cli("export", "08", "--out", str(tmp_path), "--force").returncode == 0
    assert "save_total_limit=2" in train.read_text()
    other = tmp_path / "other"  # a job.sbatch no export wrote: the user's own
    other.mkdir()
    (other / "job.sbatch").write_text("#!/bin/bash\necho mine\n")
    with pytest.raises(ExportError, match="job.sbatch: changed since the last export"):
        export("08", other)
    assert (other / "job.sbatch").read_text() == "#!/bin/bash\necho mine\n"


def test_train_py_never_trains_over_checkpoints_it_cannot_resume(requeued_runs):
    """Every checkpoint rejected (manifests cut short, weights whole): it stops, then sets them aside on request."""
    out, before, ((stopped, after), (aside, _)) = requeued_runs["rejected"]
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert f"no checkpoint in {out} can be resumed, so none was loaded and none deleted" in stopped.stderr
    assert "--set-aside-rejected moves them" in stopped.stderr and "Traceback" not in stopped.stderr
    assert after == before

    assert aside.returncode == 0, aside.stderr[-3000:]
    (moved,) = out.glob("rejected-*")
    assert f"to {moved}: kept whole" in aside.stdout
    assert files(moved) == before
    assert json.loads((out / "result.json").read_text())["global_step"] == 2
