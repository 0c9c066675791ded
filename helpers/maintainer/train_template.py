"""The train.py that `python -m helpers export 08` writes: notebook 08's capstone as a script.

Written from this template, not cut out of the notebook: the notebook teaches (a simulated
disconnect, a report), the script runs unattended, requeued by Slurm and resumed each time. Its
`{{PARAMETERS}}` is the notebook's parameters cell (`helpers.maintainer.export.notebook_parameters`).
"""

__all__ = ["TRAIN_TEMPLATE"]

TRAIN_TEMPLATE = '''\
"""Notebook 08's capstone as a script: a QLoRA fine-tune that resumes from its last valid checkpoint.

Written by `python -m helpers export 08`; its defaults are the notebook's parameters cell as it was
then (export again to follow a change). The kit must be installed (pip install the repository).

    python train.py --smoke --max-steps 4                            # the embedded tiny model, on a CPU
    bash launch.sh                                                   # torchrun: this machine, or several
    accelerate launch --config_file accelerate_config.yaml train.py  # 1..N GPUs on this machine
    sbatch job.sbatch                                                # Slurm: N nodes, requeued on preemption

Every flag's value is checked as it is read, and the run folder (writable, nothing of yours in it the
checkpoint rotation would delete) and the data (--seq-len leaves answers to learn and to evaluate) before
the model loads. Started again with the same --output-dir and the same settings (a requeued job is), it
goes on from the newest whole checkpoint of this model (helpers.resume.latest_valid_checkpoint); a
finished run trains nothing more, and one that stopped before writing final/ and result.json writes them
from its last checkpoint. It prints "done" and exits 0 only with both written.
Under several processes each says its rank and rendezvous first, then all check that every node's
launcher was told the same numbers; every collective fails after --collective-timeout seconds rather
than hang, and torchrun's summary names the rank that failed, and why.
Started with a setting that decides the result changed (--learning-rate, --max-steps, ...:
helpers.runs.RESULT_SETTINGS), it says which and trains a new run beside it, in OUTPUT_DIR-2 (-3, ...),
never on from the old run's checkpoints (helpers.runs.choose_run_folder).
It never trains over a checkpoint it cannot use: newer ones it skips are moved to
OUTPUT_DIR/rejected-<time>/, and when none can be resumed it stops and says what is wrong with each
(--set-aside-rejected moves them there and starts afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# notebooks/src/08_capstone.py's parameters cell: name -> (default, the notebook's comment)
PARAMETERS = {{PARAMETERS}}


def parse_args(argv=None):
    """The flags, each value checked as it is read (helpers.job.check_setting): a bad one stops here, exit code 2."""
    from helpers.job_flags import setting_type

    parser = argparse.ArgumentParser(description="Notebook 08's QLoRA fine-tune, resumable.")
    for name, (default, comment) in PARAMETERS.items():
        flag = "--" + name.replace("_", "-")
        text = f"{comment} (default {default})".replace("%", "%%")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            parser.add_argument(flag, type=setting_type(name, default), default=default, help=text)
    parser.add_argument(
        "--output-dir",
        help="checkpoints go here, and a restart with the same settings resumes here; a changed setting trains in "
        "OUTPUT_DIR-2, -3, ... (default: runs/RUN_NAME)",
    )
    parser.add_argument("--track", action="store_true", help="track with W&B (offline without a key), notebook 06")
    parser.add_argument(
        "--collective-timeout",
        type=seconds,
        default=1800,
        metavar="SECONDS",
        help="with several processes, how long each waits for the others (their first meeting, every step, every "
        "save) before it stops with an error instead of hanging (default 1800, the Trainer's: time for one node to "
        "download the model while the others wait)",
    )
    parser.add_argument(
        "--set-aside-rejected",
        action="store_true",
        help="when no checkpoint in --output-dir can be resumed, move them to OUTPUT_DIR/rejected-<time>/ (nothing "
        "is deleted) and train afresh; a usable checkpoint is still resumed, so a requeued job goes on from its own",
    )
    return parser.parse_args(argv)


def seconds(text):
    """--collective-timeout's type: whole seconds from 1 to a day."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole seconds: pass e.g. --collective-timeout 600") from None
    if not 1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{value} is out of range: pass 1 to 86400 s, e.g. --collective-timeout 600")
    return value


def course_data(tokenizer, opts, tiny):
    """The notebook's data: instruction / response pairs in the model's chat format, the loss on the answers
    only, a few held out (72 rows when tiny); SystemExit when --seq-len leaves nothing to train or evaluate on."""
    from helpers.data import SeqLenTooShort, chat_dataset, load_course_data

    rows = load_course_data().shuffle(seed=opts.seed)
    rows = rows.select(range(72)) if tiny else rows
    split = rows.train_test_split(test_size=8 if tiny else 16, seed=opts.seed)
    data = {}
    for name, part in (("training", "train"), ("held-out", "test")):
        try:
            data[part] = chat_dataset(split[part], tokenizer, opts.seq_len)
        except SeqLenTooShort as e:  # nothing to learn from, or no held-out loss to say how the run did
            raise SystemExit(
                f"error: --seq-len {opts.seq_len} leaves none of the {len(split[part])} {name} examples an answer "
                f"token (the shortest prompt is {e.shortest_prompt} tokens): pass a --seq-len above {e.shortest_prompt}"
            ) from None
    return data["train"], data["test"]


def choose_checkpoint(output_dir, model, opts):
    """(the checkpoint to resume from or None, what to move out of the run's way); SystemExit if none can be resumed.

    Out of the way means out of the Trainer's reach: it would save over a newer checkpoint it skipped
    when it reaches that step, and save_total_limit deletes checkpoint-N folders, not rejected-<time>/.
    """
    from helpers.resume import CheckpointsRejected, latest_valid_checkpoint, list_checkpoints

    try:
        resume_from = latest_valid_checkpoint(output_dir, model=model)  # checked against this model
    except CheckpointsRejected as e:
        if not opts.set_aside_rejected:
            raise SystemExit(
                f"error: {e}.\\nOr, with this script: --set-aside-rejected moves them (with final/ and result.json) "
                f"to {output_dir / 'rejected-<time>'} and trains afresh; --output-dir NEW_FOLDER trains elsewhere."
            ) from None
        return None, [*e.rejected, *(p for p in (output_dir / "final", output_dir / "result.json") if p.exists())]
    checkpoints = list_checkpoints(output_dir)
    return resume_from, checkpoints[: checkpoints.index(Path(resume_from))] if resume_from else []


def set_aside(output_dir, paths):
    """Move `paths` into OUTPUT_DIR/rejected-<time>/, whole; returns that folder."""
    aside = output_dir / time.strftime("rejected-%Y%m%d-%H%M%S")
    aside.mkdir(exist_ok=True)
    for path in paths:
        path.rename(aside / path.name)
    return aside


def finished(checkpoint):
    """True when `checkpoint` ends its run: resuming from it would train one step past the end."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return state["global_step"] >= state["max_steps"]


def delivered(output_dir):
    """True when the run's results are whole: final/ holds the adapter and result.json its held-out loss."""
    from helpers.resume import check_checkpoint

    try:
        result = json.loads((output_dir / "result.json").read_text())
    except (OSError, ValueError):
        return False
    final = output_dir / "final"
    return final.is_dir() and not check_checkpoint(final, for_resume=False) and "eval_loss" in result


def finish(trainer, output_dir, resume_from, checkpoint=None):
    """Evaluate on the held-out rows, then save final/ and result.json (rank 0); SystemExit with no held-out loss.

    `checkpoint`: a finished run's last checkpoint whose results were never written (the job stopped after
    it): its adapter is loaded first, so the results are those of the run that trained it.
    """
    if checkpoint is not None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(trainer.model, load_file(str(Path(checkpoint) / "adapter_model.safetensors")))
        state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
        trainer.state.global_step, trainer.state.log_history = state["global_step"], state["log_history"]
    eval_loss = trainer.evaluate().get("eval_loss")
    if eval_loss is None:  # nothing is called done without it
        raise SystemExit("error: the held-out evaluation gave no eval_loss; final/ and result.json were not written")
    if trainer.is_world_process_zero():
        trainer.save_model(str(output_dir / "final"))
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        step = trainer.state.global_step
        result = {"resumed_from": resume_from, "global_step": step, "eval_loss": eval_loss, "losses": losses}
        (output_dir / "result.json").write_text(json.dumps(result, indent=2))
        print(f"done: step {step}, held-out loss {eval_loss:.4f}, in {output_dir}")


def main(argv=None):
    opts = parse_args(argv)  # every value checked here, before anything is imported or loaded
    env = os.environ
    if int(env.get("WORLD_SIZE", "1")) > 1:  # torchrun's values: which process this is, where they all meet
        where = f"node {env.get('GROUP_RANK')}, local rank {env.get('LOCAL_RANK')}"
        meet = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        print(f"rank {env['RANK']} of {env['WORLD_SIZE']} ({where}): rendezvous at {meet}", flush=True)
    if "TORCHELASTIC_ERROR_FILE" in env:  # under torchrun (launch.sh, accelerate launch): torch loads next anyway
        return recorded(fine_tune)(opts)
    return fine_tune(opts)


def recorded(function):
    """`function` under torchrun's @record: its summary names the rank that failed and why, a SystemExit's
    message included, which @record itself passes by unrecorded (the summary would say "error_file: <N/A>")."""
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

    def run(*args):
        try:
            return function(*args)
        except SystemExit as e:
            if isinstance(e.code, str):
                get_error_handler().record_exception(e)
            raise

    return record(run)


def join_process_group(timeout_s):
    """Every process joins the group, its collectives bounded by `timeout_s`; SystemExit if the launchers disagree.

    torchrun takes node 0's word for the world: a node launched with another --nnodes or --nproc-per-node
    still starts, then trains a world nobody asked for, or waits out torchrun's exit barrier (300 s) at the
    end. Each process knows what its own launcher was told (GROUP_WORLD_SIZE x LOCAL_WORLD_SIZE); one
    all_gather shows every process what all were told, so all stop together, saying so.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    # made here, not left to the Trainer: on CPU, transformers leaves ddp_timeout out of the group it makes
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(seconds=timeout_s))
    told = [None] * dist.get_world_size()  # (node, nodes, processes a node): torchrun's; None from another launcher
    dist.all_gather_object(told, [os.environ.get(k) for k in ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE")])
    if any(nodes and per_node and int(nodes) * int(per_node) != len(told) for _, nodes, per_node in told):
        said = ", ".join(sorted({f"node {node}'s {nodes} nodes x {per_node}" for node, nodes, per_node in told}))
        dist.destroy_process_group()  # all are here: leaving it does not wait on anyone
        raise SystemExit(
            f"error: the launchers disagree ({said} processes), and {len(told)} processes met. Start every node "
            "with the same NNODES and NPROC_PER_NODE (launch.sh; the same --nnodes and --nproc-per-node for "
            "torchrun) and its own NODE_RANK, 0 to NNODES-1"
        )


def saved_line():
    """A callback: rank 0 says each checkpoint it saved (manifest written), where a requeued job goes on from."""
    from transformers import TrainerCallback

    class SavedLine(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                rank = os.environ.get("RANK", "0")
                print(f"rank {rank}: saved checkpoint-{state.global_step} in {args.output_dir}", flush=True)

    return SavedLine()


def fine_tune(opts):
    from helpers.run_folder import RunFolderError, check_run_folder

    base = Path(opts.output_dir or Path("runs") / opts.run_name).resolve()
    try:
        check_run_folder(base)  # writable, and nothing of yours in it that the checkpoint rotation would delete
    except RunFolderError as e:
        raise SystemExit(f"error: {e}") from None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        join_process_group(opts.collective_timeout)  # before the rest loads: a launch that is wrong stops now
    import datasets
    import torch
    from transformers import DataCollatorForSeq2Seq, Trainer

    from helpers.manifest import MANIFEST_NAME, ManifestCallback, load_manifest
    from helpers.models import embedded_dir, load_tokenizer
    from helpers.qlora import load_qlora
    from helpers.runs import choose_run_folder
    from helpers.seeds import seed_everything
    from helpers.training import training_args

    datasets.disable_progress_bars()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")  # no GPU: the processes train on CPU over gloo
    seed_everything(opts.seed)
    # the data first, with the tokenizer alone: a --seq-len that leaves nothing to learn stops before the weights load
    tokenizer, source = load_tokenizer(opts.model_id, smoke=opts.smoke)
    tiny = Path(source).resolve() == embedded_dir().resolve()
    train, held_out = course_data(tokenizer, opts, tiny=opts.smoke or tiny)
    model, tokenizer = load_qlora(str(source))
    if tiny and not torch.cuda.is_available():
        torch.set_num_threads(1)  # the tiny model's matrices are too small to share out
    model_name = "embedded" if tiny else opts.model_id
    # the same settings find the same folder, so a requeued job goes on with its run (notebook 08's rule)
    output_dir = choose_run_folder(
        base,
        model,
        train,
        model_id=model_name,
        seq_len=opts.seq_len,
        learning_rate=opts.learning_rate,
        max_steps=opts.max_steps,
        num_train_epochs=opts.num_train_epochs,
        per_device_batch=opts.per_device_batch,
        grad_accum_steps=opts.grad_accum_steps,
        seed=opts.seed,
    )
    resume_from, in_the_way = choose_checkpoint(output_dir, model, opts)
    if in_the_way and int(os.environ.get("RANK", "0")) == 0:  # one process moves them; every one resumes the same
        aside = set_aside(output_dir, in_the_way)
        print(f"moved {', '.join(p.name for p in in_the_way)} to {aside}: kept whole, where this run cannot overwrite")
    done = resume_from and finished(resume_from)
    if done and delivered(output_dir):
        print(f"{resume_from} ends a finished run: nothing left to train (a changed setting trains a new run)")
        return 0
    if done:
        print(f"{resume_from} ends a finished run whose final/ or result.json is missing or cut off: finishing it")
    else:
        print(f"resuming from {resume_from}" if resume_from else f"starting afresh in {output_dir}")
    report_to = "none"
    if opts.track and int(os.environ.get("RANK", "0")) == 0:
        from helpers.tracking import init_tracking

        manifest = Path(resume_from) / MANIFEST_NAME if resume_from else None  # none: checked by its structure alone
        previous = load_manifest(manifest)["tracking"] if manifest and manifest.is_file() else None
        config = {k: getattr(opts, k) for k in PARAMETERS} | {"model": model_name}
        run_id = previous["run_id"] if previous else None
        tracking = init_tracking("kit-08-capstone", config, name=opts.run_name, dir=output_dir, run_id=run_id)
        report_to = tracking.report_to
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")  # from accelerate_config.yaml, or launch.sh
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
        ddp_timeout=opts.collective_timeout,
        **({"bf16": precision == "bf16", "fp16": precision == "fp16"} if precision in ("bf16", "fp16") else {}),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=held_out,
        data_collator=DataCollatorForSeq2Seq(tokenizer),  # pads the labels with -100: padding is not learned
        callbacks=[ManifestCallback(model_id=model_name, dataset=train, seq_len=opts.seq_len), saved_line()],
    )
    if done:
        finish(trainer, output_dir, resume_from, checkpoint=resume_from)
    else:
        trainer.train(resume_from_checkpoint=resume_from)
        finish(trainer, output_dir, resume_from)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        leave_process_group(trainer.accelerator, tracking if report_to != "none" else None)
    return 0


def leave_process_group(accelerator, tracking=None, timeout_s=60):
    """Every rank waits for rank 0's saving, leaves the process group, then exits: bounded in time.

    A rank that exits with the group alive aborts in gloo's threads ("terminate called without an
    active exception") and the launcher reports the whole job failed after it trained to the end;
    and leaving it (destroy_process_group) now and then never returns (pytorch#75097). Seen here in
    two of four runs of the test matrix on Python 3.13: two CPU processes trained, saved and printed
    "done", then did not exit until killed. So the leaving gets `timeout_s`, and the rank then exits
    at once, skipping the interpreter's teardown that gloo's threads can abort: every file is
    written and closed by now.
    """
    import threading

    accelerator.wait_for_everyone()  # rank 0 has saved final/ and result.json
    if tracking is not None:
        tracking.finish()  # what the interpreter's exit would have done for the tracking run
    left = threading.Event()
    threading.Thread(target=lambda: (accelerator.end_training(), left.set()), daemon=True).start()
    if not left.wait(timeout_s):
        rank = os.environ.get("RANK", "0")
        print(f"rank {rank}: still leaving the process group after {timeout_s} s (pytorch#75097); saved, exiting")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
'''
