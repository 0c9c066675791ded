"""A training job's settings as command-line flags: `python -m helpers plan`'s and the exported train.py's.

Each flag is made from a `helpers.job.TrainingJob` field (its name, help, choices or range) or a run
setting (`helpers.job.RUN_SETTINGS`), and each value is checked as argparse reads it, by
`helpers.job.check_setting`: a bad value stops the command with exit code 2 and the fix, before
anything is imported or loaded. Taught with the planner in notebook 01; used by `plan` and by the
train.py that `python -m helpers export 08` writes. Pure Python: no torch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields

from helpers.job import RUN_SETTINGS, JobSettingError, TrainingJob, check_setting

__all__ = ["add_job_arguments", "job_from_arguments", "setting_type"]


def setting_type(name: str, default):
    """An argparse `type` for the setting `name` (a TrainingJob field, a RUN_SETTINGS name, or anything else,
    parsed as its default's type): a bad value stops the command with exit code 2 and the fix."""
    job_fields = {f.name: f for f in fields(TrainingJob)}
    if name in job_fields:
        return _parse(job_fields[name])
    if name not in RUN_SETTINGS:
        return type(default)
    kind = RUN_SETTINGS[name][0]

    def parse(text: str):
        value: object = text
        if kind == "whole":
            value = int(text) if text.strip().lstrip("+-").isdigit() else text
        elif kind == "rate":
            try:
                value = float(text)
            except ValueError:
                pass
        try:
            return check_setting(name, value)
        except JobSettingError as e:
            raise argparse.ArgumentTypeError(_as_flag(name, str(e))) from None

    return parse


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every TrainingJob field to `parser` (--per-device-batch, --seq-len, ...), each checked
    as it is parsed, so a bad value stops the command with exit code 2 and the fix."""
    for f in fields(TrainingJob):
        flag, meta = "--" + f.name.replace("_", "-"), f.metadata
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=meta["help"])
            continue
        kind = _parse(f)
        default = f.metadata.get("cli_default", None if f.default is MISSING else f.default)
        required = default is None and f.default is MISSING
        parser.add_argument(
            flag, dest=f.name, type=kind, default=default, required=required, metavar=_metavar(f), help=_help(f)
        )
        if f.name == "per_device_batch":  # its old name, still taken, with a word about the new one
            parser.add_argument("--batch-size", dest=f.name, type=kind, action=_Renamed, help=argparse.SUPPRESS)
    group = parser.add_mutually_exclusive_group()  # shorthands for --method
    group.add_argument("--lora", dest="method", action="store_const", const="lora", help="same as --method lora")
    group.add_argument("--qlora", dest="method", action="store_const", const="qlora", help="same as --method qlora")


class _Renamed(argparse.Action):
    """A flag's old name: stores the value under the new one and says the new name on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = "--" + self.dest.replace("_", "-")
        print(f"note: {option_string} is now {new}; the old name still works", file=sys.stderr)
        setattr(namespace, self.dest, values)


def job_from_arguments(args: argparse.Namespace) -> TrainingJob:
    """The TrainingJob that parsed flags describe (the flags `add_job_arguments` added)."""
    return TrainingJob(**{f.name: getattr(args, f.name) for f in fields(TrainingJob)})


def _metavar(f) -> str:
    return "N" if "most" in f.metadata else "P" if "below" in f.metadata else "NAME"


def _help(f) -> str:
    default = f.default if f.default not in (MISSING, None) else None
    choices = f.metadata.get("choices")
    shown = f" ({', '.join(choices)})" if choices and len(choices) <= 6 else ""
    return f.metadata["help"] + shown + (f" (default {default})" if default is not None else "")


def _parse(f):
    """An argparse type for one field: argparse turns its ArgumentTypeError into exit code 2, no traceback."""

    def parse(text: str):
        value: object = text
        if "most" in f.metadata:
            value = int(text) if text.strip().lstrip("+-").isdigit() else text
        elif "below" in f.metadata:
            try:
                value = float(text)
            except ValueError:
                pass
        elif f.name == "lora_targets":
            value = tuple(t.strip() for t in text.split(",") if t.strip()) or text
            value = "all-linear" if value == ("all-linear",) else value
        try:
            check_setting(f.name, value)
        except JobSettingError as e:
            raise argparse.ArgumentTypeError(_as_flag(f.name, str(e))) from None
        return value

    parse.__name__ = f.name  # what argparse names in "invalid <name> value"
    return parse


def _as_flag(name: str, message: str) -> str:
    """A setting's error as argparse shows it after "argument --lora-r: ": the value, then the fix as a flag."""
    said = message.removeprefix(f"{name}=")
    return said.replace(f"{name}=", "--" + name.replace("_", "-") + " ")
