"""Distribution names and a requirements file's exact pins, each read one way for the whole kit.

Private to the package: `helpers.install` (the install cell's report) compares installed names with
`canonical_name`; the maintainer scripts (scripts/build_device_wheels.py, scripts/measure_install.py),
the runtime matrix (noxfile.py) and the tests read requirements.txt, requirements-dev.txt, the
runtimes' files and the device's lists through `read_pins`. Standard library only: the install
cell may import it in a venv that holds nothing else.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["PIN", "canonical_name", "read_pins"]

# `name==version`, then an optional `# reason`
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)==([^\s#]+)\s*(?:#\s*(.*))?$")


def canonical_name(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): runs of -, _ and . become one -, lower case.

    Example:
        >>> canonical_name("Foo_Bar.baz")
        'foo-bar-baz'
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path, *, reasons: bool = False) -> dict[str, tuple[str, str]]:
    """{canonical name: (version, reason)} of every `name==version  # reason` line of a requirements file.

    Args:
        path: the file; a `-r OTHER` line reads OTHER (beside it) in its place.
        reasons: every other line must be such a pin with its reason after a #; without it, lines
            that are not pins (a bare name, as the device image lists what it has) are passed over.

    Raises:
        ValueError: naming the file and line of a name pinned twice, or, with `reasons`, of a line
            that is not a pin or has no reason.

    Example:
        >>> read_pins(Path("requirements.txt"))["transformers"]  # doctest: +SKIP
        ('5.23.0', 'taught in every notebook (Trainer, TrainingArguments); its API is drift-checked here')
    """
    found: dict[str, tuple[str, str]] = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            included = read_pins(Path(path).parent / line[3:].strip(), reasons=reasons)
            twice = sorted(set(found) & set(included))
            if twice:
                raise ValueError(f"{Path(path).name}:{number}: {', '.join(twice)} pinned here and in {line[3:]}")
            found |= included
            continue
        match = PIN.match(line)
        if not match:
            if reasons:
                raise ValueError(f"{Path(path).name}:{number}: {line!r} is not `name==version  # reason`")
            continue
        name, version, reason = canonical_name(match[1]), match[2], (match[3] or "").strip()
        if reasons and not reason:
            raise ValueError(f"{Path(path).name}:{number}: {match[1]}=={version} needs its reason after a #")
        if name in found:
            raise ValueError(f"{Path(path).name}:{number}: {match[1]} is listed twice: keep one version")
        found[name] = (version, reason)
    return found
