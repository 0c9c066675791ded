"""The bounds on the work one submitted file can cost, checked before the work, never after it.

Used by `python -m helpers.quickcheck grade` (through `submissions`, `reading` and `safe_eval`) and
by `check()` in notebooks 00 ... 08, which reads the kernel's history with the same reader. The
grader never runs student code, but reading a file's text is work too: a blank-line cell, a
megabyte list or a thousand-digit literal once cost minutes and gigabytes. Each limit is far above
what a real notebook needs and is checked on the text before it is parsed or evaluated:

    MAX_FILE_BYTES       25 MiB  a file larger than this is refused before it is read
    MAX_JSON_VALUES      1.5 M   JSON objects, lists and strings in a file (brackets and quotes, counted
                                 before parsing), and numbers (counted while parsing)
    MAX_CELLS            10 000  code cells in one notebook
    MAX_CELL_CHARS       50 K    a cell longer than this is read line by line, never parsed whole
    MAX_LINE_CHARS       10 K    a line longer than this is not parsed (an answer line it sets is reported)
    MAX_CODE_CHARS       200 K   code parsed per file, all cells together
    MAX_SECONDS          1.0 s   reading a file's cells stops at the next cell or line after this
    MAX_VALUE_NODES      1 000   syntax nodes in one answer's expression
    MAX_TEXT_CHARS       1 000   characters in one string of an answer
    MAX_INT_BITS         128     bits of one integer literal (about 38 digits)
    MAX_IDS              1 000   distinct question ids taken from one file's markers, calls or receipts
    MAX_PASSED_NAMES     20      other names passed to check() looked for in the rest of the file
    MAX_NOTES            10      notes kept per file (the rest are counted)

What is refused is said, with the limit and what the student can do, in the file's row.
"""

from __future__ import annotations

import time

__all__ = [
    "MAX_CELLS",
    "MAX_CELL_CHARS",
    "MAX_CODE_CHARS",
    "MAX_FILE_BYTES",
    "MAX_IDS",
    "MAX_INT_BITS",
    "MAX_JSON_VALUES",
    "MAX_LINE_CHARS",
    "MAX_NOTES",
    "MAX_PASSED_NAMES",
    "MAX_SECONDS",
    "MAX_TEXT_CHARS",
    "MAX_VALUE_NODES",
    "Budget",
]

MAX_FILE_BYTES = 25 * 2**20
MAX_JSON_VALUES = 1_500_000
MAX_CELLS = 10_000
MAX_CELL_CHARS = 50_000
MAX_LINE_CHARS = 10_000
MAX_CODE_CHARS = 200_000
MAX_SECONDS = 1.0
MAX_VALUE_NODES = 1_000
MAX_TEXT_CHARS = 1_000
MAX_INT_BITS = 128
MAX_IDS = 1_000
MAX_NOTES = 10
MAX_PASSED_NAMES = 20
_LINE_COST = 64  # what parsing one line costs at least, in characters of the budget


class Budget:
    """What is left of one file's parsing budget: characters of code and seconds.

    Example:
        >>> budget = Budget(chars=100)
        >>> budget.take(60), budget.take(60), budget.spent
        (True, False, True)
    """

    def __init__(self, chars: int = MAX_CODE_CHARS, seconds: float = MAX_SECONDS):
        self.chars = chars
        self.deadline = time.perf_counter() + seconds
        self.spent = False

    def take(self, chars: int) -> bool:
        """Reserve `chars` characters of parsing (a line costs at least 64); False once out of either."""
        cost = max(chars, _LINE_COST)
        if self.spent or cost > self.chars or time.perf_counter() > self.deadline:
            self.spent = True
            return False
        self.chars -= cost
        return True

    def can_parse_whole(self, chars: int) -> bool:
        """True when a cell this long may be parsed in one piece (else: line by line)."""
        return chars <= MAX_CELL_CHARS and chars <= self.chars
