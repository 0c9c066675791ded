"""From the notebook to a cluster: notebook 08's recipe as a script, its launcher and a Slurm job.

`python -m helpers export 08 --out DIR [--nodes N] [--gpus G] [--card A100-80GB] [--time 04:00:00]` writes

- `DIR/train.py`: the capstone's recipe (load_qlora, training_args, ManifestCallback, a resume
  from `latest_valid_checkpoint`), its parameters on the command line, their defaults read from
  the notebook's `parameters` cell (so a changed default follows at the next export);
- `DIR/launch.sh`: the one launch line, PyTorch's `torchrun` (static rendezvous): G processes on this
  machine, or on each of N given NNODES, NODE_RANK and MASTER_ADDR; the card's precision for train.py;
- `DIR/accelerate_config.yaml`: for `accelerate launch` on one machine, G GPUs, the same precision;
- `DIR/job.sbatch`: the Slurm job: N nodes x G GPUs, `srun` running launch.sh on each node with the
  rendezvous on the first, and a requeue on preemption or at the time limit (Slurm sends USR1 two
  minutes early, the trap calls `scontrol requeue`), after which it resumes from the newest whole checkpoint;
- `DIR/logs/`: where the job's output goes (Slurm does not create the folder itself);
- `DIR/exported.sha256`: what was written (`sha256sum -c exported.sha256` checks it), so that the
  next export replaces the files only where nobody edited them since, unless `--force`.

train.py is written from `helpers.maintainer.train_template`, not cut out of the notebook, the shell files
from `helpers.maintainer.job_scripts`. The job
and launch.sh are shell: every value pasted into them is checked first (#SBATCH lines take no quoting,
so a run name, partition or time sbatch would misread is refused, saying what would work) and every
path in a shell command is quoted. Claim 3 of notebook 08's lesson.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

from helpers._checksums import sha256_file
from helpers.maintainer.job_scripts import LAUNCH_TEMPLATE, SBATCH_TEMPLATE
from helpers.maintainer.notebooks import SOURCES_DIR
from helpers.maintainer.train_template import TRAIN_TEMPLATE

__all__ = [
    "EXPORTABLE",
    "ExportError",
    "accelerate_config",
    "export",
    "launch_script",
    "notebook_parameters",
    "sbatch_script",
]

EXPORTABLE = {"08": "08_capstone"}  # notebook number -> source stem: what `export` knows how to turn into a job
# the notebook's demonstrations only: a real job is cut short by Slurm, answers no question, trains no tiny model,
# mounts no Google Drive
SKIPPED = ("disconnect_after_step", "max_new_tokens", "tiny_learning_rate", "merge_base_id", "hub_repo", "use_drive")
# what an #SBATCH line can carry, unquoted (sbatch splits it on spaces and takes quotes off), matched whole
TIME_FORMAT = re.compile(r"(\d+-)?\d{1,2}:\d{2}:\d{2}")  # Slurm's [D-]HH:MM:SS
NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*"  # a job name, and the run's folder: not "..", not an option
PARTITIONS = re.compile(rf"{NAME}(,{NAME})*")  # one or several, by preference
PRECISIONS = ("no", "fp16", "bf16")
MAX_GPUS = 64  # per node: more than any machine holds
MAX_NODES = 64  # past this a course job is a typo, and the rendezvous on one node's port its bottleneck
RECORD = "exported.sha256"  # sha256sum's format: "<hex>  <name>" a line


class ExportError(ValueError):
    """An export that cannot be done as asked; the message says what would work."""


def notebook_parameters(source: str | Path) -> dict[str, tuple[object, str]]:
    """The `parameters` cell of a py:percent notebook: name -> (default, its inline comment).

    Read with `ast` (nothing runs): each line `name = literal  # comment` of the cell tagged
    "parameters". Used by `export` so that train.py's defaults are the notebook's.

    Example:
        >>> notebook_parameters(SOURCES_DIR / "08_capstone.py")["grad_accum_steps"]  # doctest: +SKIP
        (16, 'effective batch = 1 x 16 x 1 = 16')
    """
    text = Path(source).read_text(encoding="utf-8") if isinstance(source, Path) else source
    cells = re.split(r"^# %%", text, flags=re.MULTILINE)
    cell = next((c for c in cells if re.match(r'[^\n]*tags=\[[^\]]*"parameters"', c)), None)
    if cell is None:
        raise ExportError('the notebook has no cell tagged "parameters" (# %% tags=["parameters"])')
    cell = "# %%" + cell  # the marker line back: a comment, so line numbers match
    lines = cell.splitlines()
    found = {}
    for node in ast.parse(cell).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            raise ExportError(f"parameter {node.targets[0].id} is not a plain constant; write its value out") from None
        line = lines[node.lineno - 1]
        comment = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        found[node.targets[0].id] = (value, comment)
    return found


def accelerate_config(gpus: int, mixed_precision: str) -> str:
    """An accelerate config (YAML) for `gpus` GPUs on one machine: distributed_type MULTI_GPU for 2 or more.

    One machine only: several are launch.sh's (torchrun), so that there is one multi-node launch line.
    """
    _check_precision(mixed_precision)
    return "\n".join(
        [
            "# written by `python -m helpers export 08`: one machine, "
            + (f"{gpus} GPUs (data parallel)" if gpus > 1 else "one GPU")
            + "; several machines: launch.sh",
            "compute_environment: LOCAL_MACHINE",
            "debug: false",
            f"distributed_type: '{'MULTI_GPU' if gpus > 1 else 'NO'}'",  # quoted: a bare NO is false too
            "downcast_bf16: 'no'",
            "gpu_ids: all",
            "machine_rank: 0",
            "main_training_function: main",
            f"mixed_precision: '{mixed_precision}'",  # quoted: YAML reads a bare no as false
            "num_machines: 1",
            f"num_processes: {gpus}",
            "rdzv_backend: static",
            "same_network: true",
            "tpu_env: []",
            "tpu_use_cluster: false",
            "tpu_use_sudo: false",
            "use_cpu: false",
            "",
        ]
    )


def launch_script(gpus: int, mixed_precision: str) -> str:
    """launch.sh: torchrun, `gpus` processes here or on each of NNODES machines; the rest from the environment."""
    _check_counts(1, gpus)
    _check_precision(mixed_precision)
    return LAUNCH_TEMPLATE.replace("{{GPUS}}", str(gpus)).replace("{{PRECISION}}", mixed_precision)


def _check_precision(mixed_precision: str) -> None:
    if mixed_precision not in PRECISIONS:
        raise ExportError(f"mixed_precision {mixed_precision!r}: pass one of {', '.join(PRECISIONS)}, or a --card")


def sbatch_script(
    gpus: int, *, nodes: int = 1, time: str = "04:00:00", partition: str | None = None, run_name: str = "capstone"
) -> str:
    """The Slurm job: `nodes` x `gpus` GPUs, requeued on preemption, resuming from the last valid checkpoint.

    srun starts launch.sh once per node (--ntasks-per-node=1); the rendezvous is on the allocation's first
    node. Raises ExportError for a value sbatch would misread: the #SBATCH block ends at its first line
    that is not one (a newline in a partition would leave --requeue and --signal out of it).
    """
    _check_counts(nodes, gpus)
    _check_sbatch_values(time, partition, run_name)
    options = [
        f"--job-name=kit-08-{run_name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",  # one launcher a node; torchrun starts its GPUs' processes
        f"--gres=gpu:{gpus}",
        f"--cpus-per-task={4 * gpus}",
        f"--mem={32 * gpus}G",
        f"--time={time}",
        *([f"--partition={partition}"] if partition else []),
        "--output=logs/%x-%j.out",  # the same file across requeues (the job id stays), appended to
        "--open-mode=append",
        "--requeue",
        "--signal=B:USR1@120",  # USR1 to this script 120 s before the time limit
    ]
    return (
        SBATCH_TEMPLATE.replace("{{SBATCH}}", "\n".join(f"#SBATCH {o}" for o in options))
        .replace("{{OUTPUT_DIR}}", shlex.quote(f"runs/{run_name}"))
        .replace("{{GPUS}}", str(gpus))
    )


def _check_sbatch_values(time: str, partition: str | None, run_name: str) -> None:
    """Each value is one sbatch reads as it is meant, or an ExportError naming it and what would work."""
    if not (isinstance(time, str) and TIME_FORMAT.fullmatch(time)):
        raise ExportError(f"time {time!r} is not Slurm's [D-]HH:MM:SS: pass e.g. --time 04:00:00 or 1-00:00:00")
    unquoted = "#SBATCH lines take no quoting: letters, digits, '.', '_' and '-' only, starting with neither"
    if partition is not None and not (isinstance(partition, str) and PARTITIONS.fullmatch(partition)):
        raise ExportError(
            f"partition {partition!r} is not a Slurm partition name ({unquoted} '.' nor '-'; several joined "
            f"by commas): pass e.g. --partition {_suggest(partition, 'gpu')}"
        )
    if not (isinstance(run_name, str) and re.fullmatch(NAME, run_name)):
        raise ExportError(
            f"run_name {run_name!r} cannot name the Slurm job and its folder runs/<run_name> ({unquoted} '.' nor "
            f"'-'): set e.g. run_name = {_suggest(run_name, 'capstone')!r} in the parameters cell of "
            f"{SOURCES_DIR / (EXPORTABLE['08'] + '.py')}, then export again"
        )


def _suggest(value, default: str) -> str:
    """`value` with every run of characters an #SBATCH line cannot carry (and of '-') made one '-'."""
    return re.sub(r"(?:[^A-Za-z0-9._]|-)+", "-", str(value)).strip("-.") or default


def export(
    number: str,
    out: str | Path,
    *,
    gpus: int = 1,
    nodes: int = 1,
    card: str | None = None,
    mixed_precision: str | None = None,
    time: str = "04:00:00",
    partition: str | None = None,
    force: bool = False,
) -> list[Path]:
    """Write train.py, launch.sh, accelerate_config.yaml, job.sbatch and logs/ into `out`; return the files written.

    Args:
        number: the notebook, "08" (the capstone) or "08_capstone".
        out: a folder (created if needed).
        gpus: GPUs per node, 1..64: one process each.
        nodes: machines, 1..64; each runs launch.sh (torchrun) with `gpus` processes.
        card: a catalog card ("T4", "A100-80GB"): bf16 from compute capability 8.0, fp16 below.
        mixed_precision: "no", "fp16" or "bf16"; overrides the card.
        time: Slurm's time limit, [D-]HH:MM:SS.
        partition: the Slurm partition (or several, comma-separated); None: the cluster's default.
        force: replace files edited since the last export (without it, an ExportError names them).
    """
    stem, out = _check(number, out)
    _check_counts(nodes, gpus)
    source = SOURCES_DIR / f"{stem}.py"
    if not source.is_file():
        raise ExportError(f"{source} is missing: export runs from a clone of the kit (git clone, then run it there)")
    parameters = {k: v for k, v in notebook_parameters(source).items() if k not in SKIPPED}
    precision = mixed_precision or _card_precision(card)
    run_name = parameters.get("run_name", ("capstone",))[0]
    files = {  # every value checked before anything is written
        "train.py": TRAIN_TEMPLATE.replace("{{PARAMETERS}}", _parameters_literal(parameters)),
        "launch.sh": launch_script(gpus, precision),
        "accelerate_config.yaml": accelerate_config(gpus, precision),
        "job.sbatch": sbatch_script(gpus, nodes=nodes, time=time, partition=partition, run_name=run_name),
    }
    edited = _edited(out, files)
    if edited and not force:
        raise ExportError(
            f"{', '.join(map(str, edited))}: changed since the last export (not the SHA-256 in {out / RECORD}, "
            "or no export wrote it): keep a copy of your edits, then export again with --force (force=True) to "
            "replace them, or pass another --out"
        )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    for name in ("job.sbatch", "launch.sh"):
        (out / name).chmod(0o755)
    (out / RECORD).write_text("".join(f"{sha256_file(out / name)}  {name}\n" for name in files), encoding="utf-8")
    return [out / name for name in files]


def _edited(out: Path, files: dict[str, str]) -> list[Path]:
    """The files in `out` that writing `files` would replace and that are not what the last export wrote there."""
    recorded = {}
    if (out / RECORD).is_file():
        for line in (out / RECORD).read_text(encoding="utf-8", errors="replace").splitlines():
            digest, _, name = line.partition("  ")
            recorded[name] = digest
    return [
        out / name
        for name, text in files.items()
        if (out / name).is_file()
        and (out / name).read_bytes() != text.encode("utf-8")  # the same again loses nothing
        and sha256_file(out / name) != recorded.get(name)
    ]


def _check(number: str, out) -> tuple[str, Path]:
    stem = EXPORTABLE.get(str(number)) or (str(number) if str(number) in EXPORTABLE.values() else None)
    if stem is None:
        known = ", ".join(f"{k} ({v})" for k, v in EXPORTABLE.items())
        raise ExportError(f"notebook {number!r} cannot be exported: export knows {known}; e.g. export 08 --out job")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: pass a folder, e.g. --out {out.with_suffix('')}-job")
    return stem, out


def _check_counts(nodes: int, gpus: int) -> None:
    """Whole numbers in range (pasted into shell: not True, 2.0 nor "2"), or an ExportError saying what works."""
    if not (type(nodes) is int and 1 <= nodes <= MAX_NODES):
        raise ExportError(f"nodes={nodes!r}: pass a whole number of machines from 1 to {MAX_NODES}, e.g. --nodes 2")
    if gpus == 0 and nodes > 1:
        raise ExportError(
            f"nodes={nodes} with gpus=0: a node count with no GPUs per node; --gpus is per node: pass e.g. "
            f"--nodes {nodes} --gpus 4"
        )
    if not (type(gpus) is int and 1 <= gpus <= MAX_GPUS):
        raise ExportError(f"gpus={gpus!r}: pass a whole number of GPUs per node from 1 to {MAX_GPUS}, e.g. --gpus 2")


def _card_precision(card: str | None) -> str:
    """bf16 from compute capability 8.0 (A100, L4, H100), fp16 below (T4, V100); "no" without a card."""
    if card is None:
        return "no"  # train.py's training_args picks the card's precision when the job runs
    from helpers.catalog import card_capability
    from helpers.env import half_precision

    try:
        return half_precision(card_capability(card))
    except ValueError as e:
        raise ExportError(f"{e}. Or pass --mixed-precision bf16|fp16|no") from None


def _parameters_literal(parameters: dict[str, tuple[object, str]]) -> str:
    """The PARAMETERS dict as ruff would format it: one entry a line, split where it is too long."""
    rows = []
    for name, (value, comment) in parameters.items():
        key, value, comment = (_literal(x) for x in (name, value, comment))
        row = f"    {key}: ({value}, {comment}),"
        rows.append(row if len(row) <= 120 else f"    {key}: (\n        {value},\n        {comment},\n    ),")
    return "{\n" + "\n".join(rows) + "\n}"


def _literal(value) -> str:
    """Python source for a constant, strings in double quotes unless that needs more escapes (as ruff does)."""
    if isinstance(value, str) and value.count('"') <= value.count("'"):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)
