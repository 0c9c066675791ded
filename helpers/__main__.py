"""The kit's command line.

python -m helpers run [--only NAME ...] [--smoke] [--simulate T4|T4x2|A100] [--out DIR] [--cell-timeout S]  # make run
python -m helpers notebooks [--check] [--times SUMMARY_JSON]  # rebuild .ipynb from notebooks/src, and the badges
python -m helpers badges [--check]                             # rewrite colab_badges.md
python -m helpers publish --repo OWNER/NAME --ref REF [--check]  # retarget badges, install cells, README at a fork
python -m helpers plan --model Mistral-7B --gpu T4 --seq-len 512 [--qlora]  # what fits, and how
python -m helpers gpu-proof --out DIR [--only A,B] [--order A,B] [--notebooks-budget S] [--time-limit S]  # 1 GPU
python -m helpers export 08 --out DIR [--nodes N] [--gpus G] [--card A100-80GB]  # train.py, launch.sh, Slurm job
python -m helpers quickcheck student|grade|key|seal ...        # instructors: see python -m helpers.quickcheck -h
python -m helpers --version

Installed with pip, the same commands are `course-kit run`, `course-kit plan ...`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["quickcheck"]:  # its own command line, shared with `python -m helpers.quickcheck`
        from helpers.quickcheck.__main__ import main as quickcheck_main

        return quickcheck_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "plan":
        return _plan(args)
    if args.command == "run":
        return _run(args)
    if args.command == "publish":
        from helpers.maintainer import publish

        return publish.main(args.repo, args.ref, check=args.check)
    if args.command == "gpu-proof":
        from helpers.maintainer import gpu_proof

        only = tuple(name for names in args.only or () for name in names)  # --only a,b --only c
        return gpu_proof.main(
            args.out,
            only=only,
            order=args.order,
            notebooks_budget_s=args.notebooks_budget,
            time_limit_s=args.time_limit,
        )
    if args.command == "export":
        return _export(args)
    return _notebooks(args)


def _prog() -> str:
    """How the user started us: `course-kit` (pip's script) or `python -m helpers`."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m helpers" if name in ("", "__main__.py", "-c", "-m") else name


def _parser() -> argparse.ArgumentParser:
    from helpers import __version__

    parser = argparse.ArgumentParser(prog=_prog(), description="The course kit's commands.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="execute the notebooks headless with papermill and report their figures")
    run.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="a notebook stem or its number (00, 03_gradient_checkpointing); repeatable",
    )
    run.add_argument("--smoke", action="store_true", help="force the embedded tiny model and a few steps")
    run.add_argument("--out", type=Path, default=None, help="output folder (default: build, or build/simulated-CARD)")
    run.add_argument(
        "--simulate", metavar="CARD", help="run on this CPU as if on T4, T4x2 or A100 (figures stay CPU figures)"
    )
    run.add_argument("--notebooks", type=Path, default=None, help="folder of notebooks (default: the kit's)")
    run.add_argument(
        "--cell-timeout",
        type=_number("--cell-timeout", 0, 7 * 24 * 3600, "seconds", "300"),
        metavar="SECONDS",
        help="fail a notebook whose cell runs longer (default: 300 with --smoke, 3600 without)",
    )

    nbs = sub.add_parser("notebooks", help="rebuild notebooks/*.ipynb from notebooks/src/*.py")
    nbs.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")
    nbs.add_argument(
        "--times",
        type=Path,
        default=None,
        metavar="SUMMARY_JSON",
        help="first stamp each notebook's CPU time from a `python -m helpers run` summary (not --smoke)",
    )

    bdg = sub.add_parser("badges", help="write colab_badges.md: a Colab and a Kaggle badge per notebook")
    bdg.add_argument("--check", action="store_true", help="only say whether it is current; exit 1 if not")

    pub = sub.add_parser("publish", help="point badges, install cells and README links at OWNER/NAME and REF")
    pub.add_argument("--repo", required=True, metavar="OWNER/NAME", help="a GitHub repository: someone/finetune-kit")
    pub.add_argument("--ref", required=True, help="the branch or tag students get; a tag (fall-2026) freezes the term")
    pub.add_argument("--check", action="store_true", help="only list the files it would rewrite; exit 1 if any")

    proof = sub.add_parser("gpu-proof", help="prove the kit on one CUDA GPU (no internet needed); see docs/")
    proof.add_argument("--out", type=Path, required=True, help="folder for gpu-proof.md and gpu-proof.json")
    _gpu_proof_arguments(proof)

    _plan_arguments(sub.add_parser("plan", help="estimate a fine-tune's memory on a card and plan what makes it fit"))
    _export_arguments(sub.add_parser("export", help="notebook 08 as train.py, an accelerate config and a Slurm job"))
    # listed for the help only: main() hands `quickcheck ...` to its own command line before parsing
    sub.add_parser("quickcheck", help="instructors: student versions, grading, answer key (quickcheck -h for more)")
    return parser


def _gpu_proof_arguments(proof: argparse.ArgumentParser) -> None:
    from helpers.maintainer.gpu_proof import NOTEBOOKS_BUDGET_S, SECTIONS  # no torch: it imports lazily

    sections = ",".join(SECTIONS)
    proof.add_argument(
        "--only",
        type=_names,
        action="append",
        metavar="SECTION[,SECTION]",
        help=f"run only these of the sections {sections}; repeatable",
    )
    proof.add_argument(
        "--order",
        type=_names,
        metavar="SECTION,...",
        help=f"the sections to run, in this order (default: {sections})",
    )
    proof.add_argument(
        "--notebooks-budget",
        type=_number("--notebooks-budget", 0, 24 * 3600, "seconds", str(NOTEBOOKS_BUDGET_S)),
        default=NOTEBOOKS_BUDGET_S,
        metavar="SECONDS",
        help=f"seconds for all the notebooks; those left when it is spent are skipped (default: {NOTEBOOKS_BUDGET_S})",
    )
    proof.add_argument(
        "--time-limit",
        type=_number("--time-limit", 0, 24 * 3600, "seconds", "500"),
        metavar="SECONDS",
        help="seconds for the whole run: the notebooks, last, get what the other sections left (default: no limit)",
    )


def _export_arguments(exp: argparse.ArgumentParser) -> None:
    exp.add_argument("notebook", metavar="NUMBER", help="the notebook to export: 08 (the capstone)")
    exp.add_argument("--out", type=Path, required=True, help="the folder to write into (created if needed)")
    exp.add_argument("--nodes", type=_whole("--nodes", "2"), default=1, help="machines, 1..64 (default 1)")
    exp.add_argument("--gpus", type=_whole("--gpus", "4"), default=1, help="GPUs on each node, 1..64 (default 1)")
    exp.add_argument("--card", help="a catalog card (T4, L4, A100-80GB, H100-80GB): bf16 from A100 on, fp16 before")
    exp.add_argument("--mixed-precision", choices=("no", "fp16", "bf16"), help="overrides the card's choice")
    exp.add_argument("--time", default="04:00:00", help="Slurm's time limit, [D-]HH:MM:SS (default 04:00:00)")
    exp.add_argument("--partition", help="the Slurm partition (default: the cluster's)")
    exp.add_argument("--force", action="store_true", help="replace files in --out edited since the last export")


def _whole(flag: str, example: str):
    """An argparse type: a whole number; export checks its range (a node count with no GPUs, ...), saying what works."""

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: pass e.g. {flag} {example}") from None

    return parse


def _plan_arguments(pln: argparse.ArgumentParser) -> None:
    from helpers.job_flags import add_job_arguments

    pln.add_argument(
        "--model",
        required=True,
        help="a catalog model (Mistral-7B, Qwen3-0.6B), a path to a config.json or its folder, or a Hub id",
    )
    pln.add_argument(
        "--gpu", type=_card, default="T4", help="a catalog card (T4, L4, A100-40GB, ...) or GiB, e.g. 15.0"
    )
    add_job_arguments(pln)  # a flag per helpers.job.TrainingJob field: --per-device-batch, --seq-len, --method, ...
    run = pln.add_argument_group("a whole run over real data (helpers.estimate.estimate_run_memory)")
    run.add_argument("--lengths", metavar="FILE", help="each example's token count: one a line, or a JSON list")
    run.add_argument("--batching", choices=("dynamic", "padded", "packed"), default="dynamic")
    run.add_argument("--steps", type=int, default=None, help="micro-batches to replay (default: one epoch)")
    run.add_argument(
        "--expandable-segments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (default: as this shell's variable says)",
    )


# argument types: argparse turns their ArgumentTypeError into "error: argument --x: <message>" and
# exit code 2, with no traceback; each message says what would work


def _number(flag: str, low: float, high: float, unit: str, example: str):
    """An argparse type: a finite number above `low`, at most `high` (nan, inf and the rest refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: pass {unit}, e.g. {flag} {example}") from None
        if not low < value <= high:  # False for nan; inf is above any `high`
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: pass {unit} above {low:g} and at most {high:g}, e.g. {flag} {example}"
            )
        return value

    return parse


def _names(text: str) -> list[str]:
    """An argparse type: names separated by commas (gpu-proof checks them against its sections)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names nothing: pass e.g. estimator,headline")
    return names


MAX_CARD_GIB = 1024  # GiB: more than any single card has (the largest hold a few hundred)


def _card(text: str) -> str | float:
    """An argparse type for --gpu: a card name as given (the catalog checks it), or GiB as a sane number."""
    try:
        float(text)
    except ValueError:
        return text  # a name: plan() looks it up and lists the catalog when it is not there
    return _number("--gpu", 0, MAX_CARD_GIB, "the card's memory in GiB", "15.0 (or a card: --gpu T4)")(text)


def _run(args) -> int:
    from helpers.maintainer import runner

    try:
        return runner.run(
            args.only,
            smoke=args.smoke,
            out=args.out,
            folder=args.notebooks or runner.NOTEBOOKS_DIR,
            simulate=args.simulate,
            cell_timeout=args.cell_timeout,
        )
    except runner.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _export(args) -> int:
    from helpers.maintainer.export import ExportError, export

    try:
        written = export(
            args.notebook,
            args.out,
            gpus=args.gpus,
            nodes=args.nodes,
            card=args.card,
            mixed_precision=args.mixed_precision,
            time=args.time,
            partition=args.partition,
            force=args.force,
        )
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(f"wrote {p}" for p in written))
    cd = f"cd {shlex.quote(str(args.out))} &&"  # a command to paste: the folder quoted as the shell needs
    print(f"next: {cd} sbatch job.sbatch")
    if args.nodes == 1:
        print(f"or, without Slurm: {cd} bash launch.sh")
    else:  # the folder on a disk every machine sees; the same values on each, and its own NODE_RANK
        print(
            f"or, without Slurm, on each of {args.nodes} machines: {cd} NNODES={args.nodes} "
            f"NODE_RANK=<0 to {args.nodes - 1}, 0 on the first> MASTER_ADDR=<the first's address> bash launch.sh"
        )
    return 0


def _notebooks(args) -> int:
    """`notebooks` and `badges`: the badges are built from the notebooks."""
    from helpers.maintainer import badges, notebooks

    try:
        if args.command == "badges":
            name = badges.BADGES_PATH.name
            if args.check:
                found = badges.problems()
                print("\n".join(found) or f"{name} is current")
                return 1 if found else 0
            print(f"wrote {badges.BADGES_PATH}" if badges.write() else f"{name} already current")
            return 0
        if args.check:
            found = notebooks.problems() + badges.problems()
            print("\n".join(found) or "notebooks and colab_badges.md are in sync with notebooks/src")
            return 1 if found else 0
        stamped = []
        if getattr(args, "times", None) is not None:
            from helpers.maintainer.times import stamp_times

            stamped = stamp_times(args.times)
        changed = stamped + notebooks.sync()
        if badges.write():
            changed.append(badges.BADGES_PATH)
        print("\n".join(f"wrote {p}" for p in changed) or "notebooks already in sync")
        return 0
    except (badges.BadgeError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _plan(args) -> int:
    """Print the estimate for the job as asked, whether it fits, and the plan that makes it fit."""
    from helpers.catalog import describe_card, model_notes
    from helpers.job_flags import job_from_arguments
    from helpers.plan import assumed_stack, format_plan, plan
    from helpers.sharding import fewest_cards

    gpu = args.gpu  # a card name, or GiB as a float (_card)
    try:
        job = job_from_arguments(args)
        steps = plan(args.model, gpu, job)
        cards = fewest_cards(args.model, gpu, job)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    asked = steps[0].estimate
    s = asked.settings
    print(
        f"{args.model} ({asked.parameters / 1e9:.2f}B parameters, {asked.trainable / 1e6:,.1f}M trainable), "
        f"{s['method']}, {s['precision']}, per-device batch {s['per_device_batch']} x {s['seq_len']} tokens, "
        f"checkpointing {'on' if s['checkpointing'] else 'off'}, optimizer {s['optimizer']}, loop {s['loop']}"
        + (
            f", {s['world_size']} GPUs, sharding {s['sharding']} (the figures are one GPU's)"
            if s["world_size"] > 1
            else ""
        )
    )
    print("\n".join([*model_notes(args.model), assumed_stack(asked), asked.table()]))
    shown = {"fits": "yes", "borderline": "borderline (within the estimator's known error)", "does not fit": "no"}
    print(f"fits {describe_card(gpu)}: {shown[steps[0].verdict]}")
    print(f"  {asked.verdict_line(gpu)}")
    print(f"cards: {cards}\n")
    print(format_plan(steps, gpu))
    return _whole_run(args, job) if args.lengths else 0


def _whole_run(args, job) -> int:
    """The run over the examples' lengths in --lengths: its reserve, the batch that sets it, what the screen shows."""
    from helpers.estimate import estimate_run_memory
    from helpers.estimate._run import read_lengths

    try:
        run = estimate_run_memory(
            args.model,
            job,
            lengths=read_lengths(args.lengths),
            batching=args.batching,
            steps=args.steps,
            expandable_segments=args.expandable_segments,
            gpu=args.gpu,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\nwhole run ({args.batching} batches, expandable segments {'on' if run.expandable_segments else 'off'}):")
    print(f"  {run.line()}")
    print(run.longest.screen_table(run.peak_reserved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
