"""The shell files `python -m helpers export 08` writes beside train.py: the Slurm job and the torchrun launcher.

Templates only, filled in by `helpers.maintainer.export` (which checks every value pasted into them first):
`SBATCH_TEMPLATE`, the Slurm job, starts `LAUNCH_TEMPLATE`, launch.sh (one torchrun per node), once on each
node under srun; without Slurm, a person runs launch.sh on each machine. Claim 3 of notebook 08's lesson;
the several-node job is notebook 07's "the same job on a cluster".
"""

__all__ = ["LAUNCH_TEMPLATE", "SBATCH_TEMPLATE"]

SBATCH_TEMPLATE = """\
#!/bin/bash
# Notebook 08's capstone as a Slurm job, written by `python -m helpers export 08`.
# Submit from this folder, in an environment with the kit installed: sbatch job.sbatch
# Arguments after the file go to train.py: sbatch job.sbatch --max-steps 200 --model-id Qwen/Qwen2.5-0.5B
# srun runs launch.sh (torchrun) once on each node, the rendezvous on the first. With several nodes this
# folder must be on a disk they all see: rank 0 writes the checkpoints, every rank resumes from them.
# Preempted or near the time limit, Slurm sends USR1 (--signal), the trap requeues the job
# (--requeue), and the requeued job resumes from the newest valid checkpoint in OUTPUT_DIR.
{{SBATCH}}

set -euo pipefail
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "job.sbatch is for sbatch; without Slurm: bash launch.sh" >&2; exit 2; }
cd "${SLURM_SUBMIT_DIR:-.}"
# the same folder on every restart: that is what resumes (OUTPUT_DIR=DIR sbatch job.sbatch picks another)
DEFAULT_OUTPUT_DIR={{OUTPUT_DIR}}
OUTPUT_DIR="${OUTPUT_DIR:-${DEFAULT_OUTPUT_DIR}}"

# the rendezvous: the allocation's first node, a port from the job id (another job there has another; a
# requeue keeps it; MASTER_PORT=N sbatch job.sbatch chooses). launch.sh takes each node's rank from the
# SLURM_NODEID srun gives it: a NODE_RANK from the submitting shell would give every node the same one.
MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"
MASTER_PORT="${MASTER_PORT:-$((29500 + SLURM_JOB_ID % 1000))}"
NNODES="${SLURM_NNODES}"
NPROC_PER_NODE="${SLURM_GPUS_ON_NODE:-{{GPUS}}}"  # a process per GPU Slurm gave each node
export MASTER_ADDR MASTER_PORT NNODES NPROC_PER_NODE
unset NODE_RANK

requeue() {
    echo "$(date -Is) USR1: requeueing job ${SLURM_JOB_ID}; it resumes from the newest valid checkpoint"
    scontrol requeue "${SLURM_JOB_ID}"
}
trap requeue USR1

echo "$(date -Is) job ${SLURM_JOB_ID}, restart ${SLURM_RESTART_COUNT:-0}, on $(hostname), into ${OUTPUT_DIR}:" \\
    "${NNODES} nodes x ${NPROC_PER_NODE} GPUs, rendezvous at ${MASTER_ADDR}:${MASTER_PORT}"
# a launcher per node (--ntasks-per-node=1) with the job's CPUs (not every Slurm passes --cpus-per-task on to
# srun); a node whose launcher fails ends the others at once (--kill-on-bad-exit), not at a timeout
srun --kill-on-bad-exit=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" bash launch.sh --output-dir "${OUTPUT_DIR}" "$@" &
pid=$!
status=0
wait "${pid}" || status=$?  # USR1 interrupts wait: the trap runs, then the requeue ends this job
exit "${status}"
"""

LAUNCH_TEMPLATE = """\
#!/bin/bash
# Notebook 08's capstone under PyTorch's own launcher, torchrun, written by `python -m helpers export 08`.
# In an environment with the kit installed; arguments go to train.py. This machine, {{GPUS}} GPU(s):
#     bash launch.sh --max-steps 200
# Several machines without Slurm: this folder on a disk they all see; on each the same NNODES, MASTER_ADDR
# (node 0's address, reachable from the others) and MASTER_PORT, and its own NODE_RANK, 0 to NNODES-1:
#     NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash launch.sh    # on 10.0.0.1; then NODE_RANK=1 on the other
# Slurm's job.sbatch runs it on every node under srun, with the allocation's values. Node 0 waits
# RDZV_TIMEOUT seconds for the others; train.py checks that every launcher said the same numbers.
set -euo pipefail
NNODES="${NNODES:-1}"
NPROC_PER_NODE="${NPROC_PER_NODE:-{{GPUS}}}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-0}}"  # under srun: this node's place in the allocation
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
RDZV_TIMEOUT="${RDZV_TIMEOUT:-600}"
# the card's precision, as in accelerate_config.yaml: train.py reads it where `accelerate launch` would set it
export ACCELERATE_MIXED_PRECISION="${ACCELERATE_MIXED_PRECISION:-{{PRECISION}}}"
echo "launch.sh on $(hostname): node ${NODE_RANK} of ${NNODES}, rendezvous at ${MASTER_ADDR}:${MASTER_PORT}"
status=0
torchrun \\
    --nnodes="${NNODES}" \\
    --nproc-per-node="${NPROC_PER_NODE}" \\
    --node-rank="${NODE_RANK}" \\
    --rdzv-backend=static \\
    --master-addr="${MASTER_ADDR}" \\
    --master-port="${MASTER_PORT}" \\
    --rdzv-conf="timeout=${RDZV_TIMEOUT}" \\
    "$(dirname "${BASH_SOURCE[0]}")/train.py" "$@" || status=$?
if ((status != 0)); then
    echo "launch.sh: torchrun on node ${NODE_RANK} exited with ${status}; its summary names the rank that failed." \\
        "A DistStoreError or DistNetworkError above (timed out waiting for clients, keys or node 0): the nodes did" \\
        "not meet. Start each with the same NNODES, NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT and its own NODE_RANK" >&2
fi
exit "${status}"
"""
