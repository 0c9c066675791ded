"""Every string that leaves the grader goes through here: bounded, printable, valid UTF-8.

Used by `python -m helpers.quickcheck grade` for the CSV, the feedback files and their names, the
report and the lines it prints, and by `check()` in notebooks 00 ... 08 to show an answer in a
message. A file name or a student id is data the student controls: a lone surrogate
("\\udce9"), bytes that are not UTF-8 (an LMS zip unzipped without its UTF-8 flag), a newline, a
right-to-left override or a megabyte of text must neither crash a writer nor rewrite a line.
Such characters are shown as Python escapes (`\\xe9`, `\\n`, `\\u202e`); long text is cut with
a count of what was left out.

Every cell of every Markdown table the kit writes goes through `md_cell`: the grader's report and the
answer key here, `python -m helpers run`'s summary.md (`helpers.maintainer.summary`) and the wheel
table of scripts/build_device_wheels.py. A "|" in a notebook's name, an id or a reason would
otherwise end the cell and shift the rest of the row; a newline would end the row.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["csv_cell", "feedback_names", "md_cell", "md_code", "md_text", "shown", "shown_path", "shown_value"]

# C0/C1 controls, zero-width and bidi format characters, line/paragraph separators, BOM, surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Markdown and HTML that could format, link or run: escaped by backslash (CommonMark's escapes) or
# as an entity; a backslash only where it would escape what follows (shown's \\n stays as it is);
# "_" only where it could open emphasis (not inside q04_2); a bare URL's "://" and "www." broken so
# no renderer turns them into links
_MARKDOWN = re.compile(
    r"\\(?=[!-/:-@\[-`{-~])|[`*\[\]()!|~#>+]|(?<![^\W_])_|_(?![^\W_])|(?<=www)\.|:(?=//)|<|&(?=#?\w+;)"
)
_FORMULA = ("=", "+", "-", "@")
_WINDOWS_RESERVED = re.compile(r"(con|prn|aux|nul|com\d|lpt\d)(\..*)?", re.I)
_NAME_BYTES = 100


def shown(text: Any, limit: int = 300) -> str:
    """`text` as one printable line of valid UTF-8, at most `limit` characters before escaping.

    Example:
        >>> shown("a\\nb\\udce9")
        'a\\\\nb\\\\udce9'
    """
    text = text if isinstance(text, str) else str(text)
    cut = len(text) - limit
    text = _UNSAFE.sub(_escape, text[:limit] if cut > 0 else text)
    return f"{text}… ({cut:,} more characters)" if cut > 0 else text


def shown_path(path: str | Path, limit: int = 300) -> str:
    """A file name as `shown` prints it, bytes that are not UTF-8 written as \\xNN (Jos\\xe9.ipynb)."""
    text = str(path)
    try:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        pass  # a surrogate that stands for no byte: `shown` writes it as \\udXXX
    return shown(text, limit)


def csv_cell(text: Any, limit: int = 300) -> str:
    """`shown` text that a spreadsheet keeps as text: a leading =, +, - or @ gets a quote ('=HYPERLINK...)."""
    text = shown(text, limit)
    return "'" + text if text.startswith(_FORMULA) else text


def md_code(text: Any, limit: int = 200) -> str:
    """`shown` text as a Markdown code span: a backtick inside is written \\x60 so it cannot end the span."""
    return "`" + shown(text, limit).replace("`", "\\x60") + "`"


def md_text(text: Any, limit: int = 300) -> str:
    """`shown` text for a Markdown report: no HTML, link, image or emphasis a name could smuggle in.

    Example:
        >>> print(md_text("<img src=x> [me](http://evil)"))
        &lt;img src=x\\> \\[me\\]\\(http\\://evil\\)
    """
    return _MARKDOWN.sub(_md_escape, shown(text, limit))


def md_cell(text: Any, limit: int = 300, *, code: bool = False) -> str:
    """`text` as one cell of a Markdown table: `md_text` (or `md_code` with `code`), every "|" as "\\|".

    One line (a newline is written \\n), no backtick that opens a span, no "|" that ends the cell:
    GitHub-flavoured tables take "\\|" as a "|" in the cell, inside a code span too.

    Example:
        >>> print(md_cell("a|b"), md_cell("x|`y`", code=True))
        a\\|b `x\\|\\x60y\\x60`
    """
    if not code:
        return md_text(text, limit)  # escapes "|" (and ` * [ ...) with a backslash already
    cell = md_code(text, limit).replace("|", "\\|")
    return "" if cell == "``" else cell  # an empty code span is shown as two backticks: leave the cell empty


def shown_value(value: Any, limit: int = 60) -> str:
    """The repr of any answer, cut to about `limit`; never raises (a 5000-digit int, a raising __repr__).

    Example:
        >>> shown_value(10**400)
        'an integer of about 401 digits'
    """
    try:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
            return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
        if isinstance(value, (dict, set, frozenset)) and len(value) > limit:
            return f"a {type(value).__name__} of {len(value):,} items"
        if isinstance(value, (str, bytes, list, tuple)) and len(value) > limit:
            unit = "characters" if isinstance(value, (str, bytes)) else "items"
            return f"{shown(repr(value[:limit]), 4 * limit)}… ({len(value):,} {unit} in all)"
        return shown(repr(value), limit)
    except Exception as e:  # a value whose repr or len raises is still shown, by its type
        return f"<{type(value).__name__} that cannot be shown: {type(e).__name__}>"


def feedback_names(paths: list[Path]) -> list[str]:
    """A unique, readable, safe file stem per submission, for its feedback file (add ".txt").

    The stem of the submission's name, with its two folders in front when stems repeat
    (subs__ann__notebook); letters, digits, "_", "-" and "." only, at most 100 UTF-8 bytes
    (a long name keeps a short hash of the whole), unique even where case does not count,
    never a name Windows reserves (CON, NUL, ...). Never made from raw bytes.
    """
    stems = [_slug(p.stem) for p in paths]
    repeated = Counter(s.casefold() for s in stems)
    used, names = set(), []
    for path, stem in zip(paths, stems):
        name = stem
        if repeated[stem.casefold()] > 1:
            name = "__".join([*(_slug(part) for part in Path(path).parent.parts[-2:]), stem]).strip("._-")
        name = _fit(name or "submission")
        base, n = name, 2
        while name.casefold() in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name.casefold())
        names.append(name)
    return names


def _escape(match: re.Match) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _md_escape(match: re.Match) -> str:
    char = match.group()
    return {"<": "&lt;", "&": "&amp;"}.get(char, "\\" + char)


def _slug(text: str) -> str:
    """Letters, digits, _ - . of a name (as shown_path prints it); the rest as _."""
    return re.sub(r"[^\w.-]+", "_", shown_path(text, 400)).strip("._-")


def _fit(name: str) -> str:
    if _WINDOWS_RESERVED.fullmatch(name):
        name = "_" + name
    if len(name.encode()) <= _NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = name.encode()[: _NAME_BYTES - 9].decode("utf-8", "ignore").rstrip("._-")
    return f"{head}_{digest}"
