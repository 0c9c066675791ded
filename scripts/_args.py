"""Argument types the scripts share: a bad value is argparse's usage error (exit 2), naming the fix.

argparse turns the `ArgumentTypeError` these raise into `error: argument --steps: <message>` and
exit code 2, with no traceback, before the script does any work. Each message gives the value as
typed and an example that would work.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

__all__ = ["existing_file", "number", "output_file", "output_folder", "whole_number"]


def whole_number(flag: str, low: int, high: int, example: str):
    """A type: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number from {low:,} to {high:,}: pass e.g. {flag} {example}"
            )
        return value

    return parse


def number(flag: str, low: float, high: float, example: str):
    """A type: a finite number from `low` to `high` (nan and inf refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:  # False for nan
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number from {low:g} to {high:g}: pass e.g. {flag} {example}"
            )
        return value

    return parse


def output_folder(flag: str, example: str):
    """A type: a folder to write (created if missing), not an existing file."""

    def parse(text: str) -> Path:
        path = Path(text)
        if path.exists() and not path.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text} is a file: name a folder (created if missing), e.g. {flag} {example}"
            )
        return path

    return parse


def output_file(flag: str, example: str):
    """A type: a file to write, not an existing folder."""

    def parse(text: str) -> Path:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder: name a file in it, e.g. {flag} {example}")
        return path

    return parse


def existing_file(flag: str, example: str):
    """A type: a file that is there (an interpreter, an input)."""

    def parse(text: str) -> Path:
        path = Path(text)
        if not path.is_file():
            what = "a folder" if path.is_dir() else "not there"
            raise argparse.ArgumentTypeError(f"{text} is {what}: pass the path of a file, e.g. {flag} {example}")
        return path

    return parse
