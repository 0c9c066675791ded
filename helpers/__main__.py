"""The kit's command line.

    python -m helpers run [--only NAME ...] [--smoke] [--out DIR]   # execute the notebooks (make run)
    python -m helpers notebooks [--check]                          # rebuild .ipynb from notebooks/src
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers", description="The course kit's commands.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="execute the notebooks headless with papermill and report their figures")
    run.add_argument("--only", action="append", metavar="NAME",
                     help="a notebook stem or its number (00, 03_gradient_checkpointing); repeatable")
    run.add_argument("--smoke", action="store_true", help="force the embedded tiny model and a few steps")
    run.add_argument("--out", type=Path, default=Path("build"), help="output folder (default: build)")
    run.add_argument("--notebooks", type=Path, default=None, help="folder of notebooks (default: the kit's)")

    nbs = sub.add_parser("notebooks", help="rebuild notebooks/*.ipynb from notebooks/src/*.py")
    nbs.add_argument("--check", action="store_true", help="only report drift; exit 1 if any")

    args = parser.parse_args(argv)
    if args.command == "run":
        from helpers import runner

        try:
            return runner.run(args.only, smoke=args.smoke, out=args.out,
                              folder=args.notebooks or runner.NOTEBOOKS_DIR)
        except runner.UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from helpers import notebooks  # the only other command: "notebooks"

    if args.check:
        found = notebooks.problems()
        print("\n".join(found) or "notebooks are in sync with notebooks/src")
        return 1 if found else 0
    changed = notebooks.sync()
    print("\n".join(f"wrote {p}" for p in changed) or "notebooks already in sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
