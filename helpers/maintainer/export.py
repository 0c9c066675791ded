"""From the notebook to a cluster: notebook 08's recipe as a script, an accelerate config and a Slurm job.

`python -m helpers export 08 --out DIR [--gpus N] [--card A100-80GB] [--time 04:00:00]` writes

- `DIR/train.py`: the capstone's recipe (load_qlora, training_args, ManifestCallback, a resume
  from `latest_valid_checkpoint`), its parameters on the command line, their defaults read from
  the notebook's `parameters` cell (so a changed default follows at the next export);
- `DIR/accelerate_config.yaml`: 1..N GPUs on one machine, mixed precision from the card;
- `DIR/job.sbatch`: the Slurm job: resources, and a requeue on preemption or at the time limit
  (Slurm sends USR1 two minutes early, the trap calls `scontrol requeue`), after which the job
  resumes from the newest whole checkpoint;
- `DIR/logs/`: where the job's output goes (Slurm does not create the folder itself).

train.py is written from the template below, not cut out of the notebook: the notebook teaches
(a simulated disconnect, a report), the script runs unattended. Claim 3 of notebook 08's lesson.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from helpers.maintainer.notebooks import SOURCES_DIR

__all__ = ["EXPORTABLE", "ExportError", "accelerate_config", "export", "notebook_parameters", "sbatch_script"]

EXPORTABLE = {"08": "08_capstone"}  # notebook number -> source stem: what `export` knows how to turn into a job
# the notebook's demonstrations only: a real job is cut short by Slurm, answers no question, trains no tiny model
SKIPPED = ("disconnect_after_step", "max_new_tokens", "tiny_learning_rate")
TIME_FORMAT = re.compile(r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$")  # Slurm's [D-]HH:MM:SS
MAX_GPUS = 64  # per node: more than any machine holds


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
    """An accelerate config (YAML) for `gpus` GPUs on one machine: distributed_type MULTI_GPU for 2 or more."""
    return "\n".join(
        [
            "# written by `python -m helpers export 08`: one machine, "
            + (f"{gpus} GPUs (data parallel)" if gpus > 1 else "one GPU"),
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


def sbatch_script(
    gpus: int, *, time: str = "04:00:00", partition: str | None = None, run_name: str = "capstone"
) -> str:
    """The Slurm job: `gpus` GPUs on one node, requeued on preemption, resuming from the last valid checkpoint."""
    options = [
        f"--job-name=kit-08-{run_name}",
        "--nodes=1",
        "--ntasks-per-node=1",
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
    return SBATCH_TEMPLATE.replace("{{SBATCH}}", "\n".join(f"#SBATCH {o}" for o in options)).replace(
        "{{RUN_NAME}}", run_name
    )


def export(number: str, out: str | Path, *, gpus: int = 1, card: str | None = None, **job) -> list[Path]:
    """Write train.py, accelerate_config.yaml, job.sbatch and logs/ into `out`; return the files written.

    Args:
        number: the notebook, "08" (the capstone) or "08_capstone".
        out: a folder (created if needed).
        gpus: GPUs per job, 1..64.
        card: a catalog card ("T4", "A100-80GB"): bf16 from compute capability 8.0, fp16 below.
        job: `mixed_precision` ("no", "fp16", "bf16"; overrides the card), `time` ([D-]HH:MM:SS),
            `partition`.
    """
    stem, out = _check(number, out, gpus, job.get("time", "04:00:00"))
    source = SOURCES_DIR / f"{stem}.py"
    if not source.is_file():
        raise ExportError(f"{source} is missing: export runs from a clone of the kit (git clone, then run it there)")
    parameters = {k: v for k, v in notebook_parameters(source).items() if k not in SKIPPED}
    precision = job.get("mixed_precision") or _card_precision(card)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    files = {
        "train.py": TRAIN_TEMPLATE.replace("{{PARAMETERS}}", _parameters_literal(parameters)),
        "accelerate_config.yaml": accelerate_config(gpus, precision),
        "job.sbatch": sbatch_script(
            gpus,
            time=job.get("time", "04:00:00"),
            partition=job.get("partition"),
            run_name=str(parameters.get("run_name", ("capstone",))[0]),
        ),
    }
    for name, text in files.items():
        (out / name).write_text(text, encoding="utf-8")
    (out / "job.sbatch").chmod(0o755)
    return [out / name for name in files]


def _check(number: str, out, gpus: int, time: str) -> tuple[str, Path]:
    stem = EXPORTABLE.get(str(number)) or (str(number) if str(number) in EXPORTABLE.values() else None)
    if stem is None:
        known = ", ".join(f"{k} ({v})" for k, v in EXPORTABLE.items())
        raise ExportError(f"notebook {number!r} cannot be exported: export knows {known}; e.g. export 08 --out job")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: pass a folder, e.g. --out {out.with_suffix('')}-job")
    if not (isinstance(gpus, int) and 1 <= gpus <= MAX_GPUS):
        raise ExportError(f"gpus={gpus!r}: pass a whole number from 1 to {MAX_GPUS}, e.g. --gpus 2")
    if not TIME_FORMAT.match(time):
        raise ExportError(f"time {time!r} is not Slurm's [D-]HH:MM:SS: pass e.g. --time 04:00:00 or 1-00:00:00")
    return stem, out


def _card_precision(card: str | None) -> str:
    """bf16 from compute capability 8.0 (A100, L4, H100), fp16 below (T4, V100); "no" without a card."""
    if card is None:
        return "no"  # train.py's training_args picks the card's precision when the job runs
    from helpers.catalog import card_capability

    try:
        return "bf16" if card_capability(card) >= (8, 0) else "fp16"
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


TRAIN_TEMPLATE = '''\
"""Notebook 08's capstone as a script: a QLoRA fine-tune that resumes from its last valid checkpoint.

Written by `python -m helpers export 08`; its defaults are the notebook's parameters cell as it was
then (export again to follow a change). The kit must be installed (pip install the repository).

    python train.py --smoke --max-steps 4                            # the embedded tiny model, on a CPU
    accelerate launch --config_file accelerate_config.yaml train.py  # 1..N GPUs on this machine
    sbatch job.sbatch                                                # Slurm: requeued on preemption

Started again with the same --output-dir (a requeued job is), it goes on from the newest whole
checkpoint (helpers.resume.latest_valid_checkpoint); a finished run trains nothing more.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# notebooks/src/08_capstone.py's parameters cell: name -> (default, the notebook's comment)
PARAMETERS = {{PARAMETERS}}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Notebook 08's QLoRA fine-tune, resumable.")
    for name, (default, comment) in PARAMETERS.items():
        flag = "--" + name.replace("_", "-")
        text = f"{comment} (default {default})".replace("%", "%%")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=text)
    parser.add_argument("--output-dir", help="checkpoints go here; a restart resumes here (default: runs/RUN_NAME)")
    parser.add_argument("--track", action="store_true", help="track with W&B (offline without a key), notebook 06")
    return parser.parse_args(argv)


def course_data(tokenizer, opts, tiny):
    """The notebook's data: instruction / response pairs, a few held out (72 rows when tiny)."""
    from helpers.data import load_course_data

    def to_features(row):
        text = f"### Instruction:\\n{row['instruction']}\\n\\n### Response:\\n{row['response']}{tokenizer.eos_token}"
        return tokenizer(text, truncation=True, max_length=opts.seq_len)

    rows = load_course_data().shuffle(seed=opts.seed)
    rows = rows.select(range(72)) if tiny else rows
    split = rows.train_test_split(test_size=8 if tiny else 16, seed=opts.seed)
    return [split[s].map(to_features, remove_columns=rows.column_names) for s in ("train", "test")]


def finished(checkpoint):
    """True when `checkpoint` ends its run: resuming from it would train one step past the end."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return state["global_step"] >= state["max_steps"]


def main(argv=None):
    opts = parse_args(argv)
    import datasets
    import torch
    from transformers import DataCollatorForLanguageModeling, Trainer

    from helpers.manifest import ManifestCallback, load_manifest
    from helpers.models import is_embedded
    from helpers.qlora import load_qlora
    from helpers.resume import latest_valid_checkpoint
    from helpers.seeds import seed_everything
    from helpers.training import training_args

    datasets.disable_progress_bars()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")  # no GPU: the processes train on CPU over gloo
    output_dir = Path(opts.output_dir or Path("runs") / opts.run_name).resolve()
    seed_everything(opts.seed)
    model, tokenizer = load_qlora(opts.model_id, smoke=opts.smoke)
    if is_embedded(model) and not torch.cuda.is_available():
        torch.set_num_threads(1)  # the tiny model's matrices are too small to share out
    model_name = "embedded" if is_embedded(model) else opts.model_id
    train, held_out = course_data(tokenizer, opts, tiny=opts.smoke or is_embedded(model))
    resume_from = latest_valid_checkpoint(output_dir)
    if resume_from and finished(resume_from):
        print(f"{resume_from} ends a finished run: nothing left to train (a new --output-dir starts afresh)")
        return 0
    print(f"resuming from {resume_from}" if resume_from else f"starting afresh in {output_dir}")
    report_to = "none"
    if opts.track and int(os.environ.get("RANK", "0")) == 0:
        from helpers.tracking import init_tracking

        previous = load_manifest(resume_from)["tracking"] if resume_from else None
        config = {k: getattr(opts, k) for k in PARAMETERS} | {"model": model_name}
        run_id = previous["run_id"] if previous else None
        tracking = init_tracking("kit-08-capstone", config, name=opts.run_name, dir=output_dir, run_id=run_id)
        report_to = tracking.report_to
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")  # from accelerate_config.yaml
    args = training_args(
        str(output_dir),
        per_device_train_batch_size=opts.per_device_batch,
        gradient_accumulation_steps=opts.grad_accum_steps,
        activation_checkpointing=True,  # already on in the QLoRA model; recorded in the manifest
        learning_rate=opts.learning_rate,
        num_train_epochs=opts.num_train_epochs,
        logging_steps=opts.logging_steps,
        report_to=report_to,
        seed=opts.seed,
        max_steps=opts.max_steps,
        save_strategy="steps",
        save_steps=opts.save_steps,
        save_total_limit=2,
        disable_tqdm=True,
        dataloader_pin_memory=torch.cuda.is_available(),
        ddp_find_unused_parameters=False,  # every LoRA adapter takes part in every step
        **({"bf16": precision == "bf16", "fp16": precision == "fp16"} if precision in ("bf16", "fp16") else {}),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        callbacks=[ManifestCallback(model_id=model_name, dataset=train)],
    )
    trainer.train(resume_from_checkpoint=resume_from)
    eval_loss = trainer.evaluate()["eval_loss"]
    if trainer.is_world_process_zero():
        trainer.save_model(str(output_dir / "final"))
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        step = trainer.state.global_step
        result = {"resumed_from": resume_from, "global_step": step, "eval_loss": eval_loss, "losses": losses}
        (output_dir / "result.json").write_text(json.dumps(result, indent=2))
        print(f"done: step {step}, held-out loss {eval_loss:.4f}, in {output_dir}")
    # every rank waits for rank 0's saving, then leaves the process group: a rank that exits with
    # the group alive aborts in gloo's threads ("terminate called without an active exception")
    # and the launcher reports the whole job failed, after it trained to the end
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

SBATCH_TEMPLATE = """\
#!/bin/bash
# Notebook 08's capstone as a Slurm job, written by `python -m helpers export 08`.
# Submit from this folder, in an environment with the kit installed: sbatch job.sbatch
# Arguments after the file go to train.py: sbatch job.sbatch --max-steps 200 --model-id Qwen/Qwen2.5-0.5B
# Preempted or near the time limit, Slurm sends USR1 (--signal), the trap requeues the job
# (--requeue), and the requeued job resumes from the newest valid checkpoint in OUTPUT_DIR.
{{SBATCH}}

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
OUTPUT_DIR="${OUTPUT_DIR:-runs/{{RUN_NAME}}}"  # the same folder on every restart: that is what resumes

requeue() {
    echo "$(date -Is) USR1: requeueing job ${SLURM_JOB_ID}; it resumes from the newest valid checkpoint"
    scontrol requeue "${SLURM_JOB_ID}"
}
trap requeue USR1

echo "$(date -Is) job ${SLURM_JOB_ID:-none}, restart ${SLURM_RESTART_COUNT:-0}, on $(hostname), into ${OUTPUT_DIR}"
accelerate launch --config_file accelerate_config.yaml train.py --output-dir "${OUTPUT_DIR}" "$@" &
pid=$!
status=0
wait "${pid}" || status=$?  # USR1 interrupts wait: the trap runs, then the requeue ends this job
exit "${status}"
"""
