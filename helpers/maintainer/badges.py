"""`python -m helpers badges`: write colab_badges.md, one Colab and one Kaggle badge per notebook.

The links are built from the one setting in `helpers/maintainer/notebooks.py` (`REPOSITORY`, and
`BRANCH`: the git ref, a branch or a tag), the same that the install cells install from, so a badge
opens a notebook whose install cell brings the helpers of that very ref. A fork retargets both with
`python -m helpers publish --repo OWNER/NAME --ref REF`. Each row also gives the notebook's one-line
description and its run time on a T4, both read from the notebook's first (markdown) cell, which
every notebook already starts with:

    # 03 · Gradient checkpointing: trade compute for activation memory      <- the description
    **Hardware:** ...
    **Time:** about 6 minutes on a T4; about 30 seconds headless on a CPU.    <- the run time

The convention for the run time: the `**Time:**` sentence starts with the T4 figure, in the clause
before the first ";" or the end of the sentence, and that clause names the T4 ("about 6 minutes on
a T4", "about 4 minutes on Kaggle's T4 x2"). That clause is what the badge table shows. A notebook
whose first cell breaks the convention stops the generator with an error that names the source
file to fix.

Colab opens `github/<repo>/blob/<branch>/notebooks/<stem>.ipynb` and reads the GPU request (T4)
from the notebook's metadata. Kaggle's import link (`kaggle.com/notebooks/welcome?src=<GitHub
URL>`) takes `&accelerator=nvidiaTeslaT4`, the value of the metadata's kaggle accelerator, so the
notebook opens with a T4 attached. Kaggle does not document that parameter; it is the form
unsloth's Kaggle notebooks have used for years, and the notebook metadata asks for the same card
in case Kaggle ever ignores it.
The tests regenerate the file in memory and fail when the committed one is stale, or when a link
names a notebook that does not exist.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from helpers.maintainer.notebooks import BRANCH, METADATA, NOTEBOOKS_DIR, REPO_ROOT, REPOSITORY, SOURCES_DIR

__all__ = [
    "BADGES_PATH",
    "BadgeError",
    "TitleCell",
    "broken_links",
    "colab_url",
    "kaggle_url",
    "notebooks",
    "problems",
    "read_title",
    "render",
    "write",
]

BADGES_PATH = REPO_ROOT / "colab_badges.md"
COMMAND = "python -m helpers badges"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
KAGGLE_ACCELERATOR = METADATA["kaggle"]["accelerator"]  # one value for the link and the metadata

TITLE = re.compile(r"^#\s+(?P<number>\d\d)\s+·\s+(?P<title>\S.*?)\s*$", re.M)
TIME = re.compile(r"\*\*Time:\*\*\s*(?P<text>.*?)(?=\n\s*\n|\n\s*\*\*[^*\n]+:\*\*|\Z)", re.S)
T4 = re.compile(r"\bT4\b")
TIME_EXAMPLE = "**Time:** about 6 minutes on a T4; about 30 seconds headless on a CPU."


class BadgeError(ValueError):
    """A notebook's first cell does not give what the badge table needs; the message says the fix."""


@dataclass(frozen=True)
class TitleCell:
    """What a notebook's title cell says: one row of the badge table."""

    stem: str  # "00_where_to_get_gpus"
    number: str  # "00"
    title: str  # the one-line description, from the title line
    t4_time: str  # "about 1 minute on a T4 including the install"


def colab_url(stem: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    return f"https://colab.research.google.com/github/{repository}/blob/{quote(branch)}/notebooks/{quote(stem)}.ipynb"


def kaggle_url(stem: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    source = f"https://github.com/{repository}/blob/{quote(branch)}/notebooks/{quote(stem)}.ipynb"
    return f"https://www.kaggle.com/notebooks/welcome?src={source}&accelerator={KAGGLE_ACCELERATOR}"


def read_title(notebook: Path) -> TitleCell:
    """Read the description and the T4 run time from a notebook's first cell."""
    source = SOURCES_DIR / f"{notebook.stem}.py"  # what people edit; the .ipynb is built from it
    fix = f"edit the first cell of {source.relative_to(REPO_ROOT)}, then run `make notebooks`"
    cells = json.loads(notebook.read_text())["cells"]
    first = "".join(cells[0]["source"]) if cells and cells[0]["cell_type"] == "markdown" else ""
    title = TITLE.search(first)
    if not title:
        raise BadgeError(
            f"{notebook.name}: the first cell has no title line like '# {notebook.stem[:2]} · What it teaches'; {fix}"
        )
    if title["number"] != notebook.stem[:2]:
        raise BadgeError(
            f"{notebook.name}: the title says {title['number']} but the file is {notebook.stem[:2]}; {fix}"
        )
    time = TIME.search(first)
    if not time:
        raise BadgeError(
            f"{notebook.name}: the first cell has no **Time:** line; {fix}. Start it with "
            f"the run time on a T4, e.g. {TIME_EXAMPLE!r}"
        )
    text = " ".join(time["text"].split())
    clause = re.split(r";|\.(?:\s|$)", text, maxsplit=1)[0].strip()
    if not (T4.search(clause) and re.search(r"\d", T4.sub("", clause))):
        raise BadgeError(
            f"{notebook.name}: the **Time:** sentence must start with the run time on a T4 "
            f"(a number, and 'T4' before the first ';' or '.'), but it reads {text!r}; {fix}. "
            f"For example: {TIME_EXAMPLE!r}"
        )
    return TitleCell(notebook.stem, title["number"], title["title"], clause)


def notebooks(folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebooks students open, in course order."""
    return sorted(folder.glob("*.ipynb"))


def render(folder: Path | None = None, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The text of colab_badges.md for the notebooks in `folder` (default: the kit's): same input, same bytes."""
    folder = folder or NOTEBOOKS_DIR
    titles = [read_title(p) for p in notebooks(folder)]
    if not titles:
        raise BadgeError(f"no notebooks in {folder}: nothing to make badges for")
    lines = [
        f"<!-- Generated by `{COMMAND}` from notebooks/*.ipynb and helpers/maintainer/notebooks.py"
        " (REPOSITORY, BRANCH). Do not edit by hand. -->",
        "",
        "# Open a notebook in Colab or Kaggle",
        "",
        f"*Generated by `{COMMAND}`; do not edit by hand. The description and run time come from each"
        " notebook's first cell in `notebooks/src/`.*",
        "",
        f"Every badge opens the notebook from [{repository}](https://github.com/{repository}) at `{branch}`, and its"
        f" install cell installs the helpers from the same `{branch}`.",
        "",
        "- **Colab:** the notebook asks for a T4 GPU runtime by itself; Runtime > Run all. The first code cell",
        "  installs the kit and its pinned libraries and keeps Colab's own torch.",
        "- **Kaggle:** the link asks for T4 GPUs (if the session starts without one, choose Settings >",
        "  Accelerator > GPU T4 x2). Switch Settings > Internet On (it needs a phone-verified",
        "  account), then Run All.",
        "",
        "| # | notebook | run time | Colab | Kaggle |",
        "|---|---|---|---|---|",
    ]
    for c in titles:
        colab = f"[![Open In Colab]({COLAB_BADGE})]({colab_url(c.stem, repository, branch)})"
        kaggle = f"[![Open in Kaggle]({KAGGLE_BADGE})]({kaggle_url(c.stem, repository, branch)})"
        title = c.title.replace("|", "\\|")
        lines.append(f"| {c.number} | {title} | {c.t4_time} | {colab} | {kaggle} |")
    return "\n".join(lines) + "\n"


def write(path: Path | None = None, folder: Path | None = None) -> bool:
    """Write colab_badges.md (or `path`) when it differs; return whether it changed."""
    path, text = path or BADGES_PATH, render(folder)
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


LINK = re.compile(r"\]\((?P<url>https://[^)\s]+)\)")
NOTEBOOK_IN_URL = re.compile(
    r"(?:colab\.research\.google\.com/github/|github\.com/)(?P<repo>[^/]+/[^/]+)/blob/(?P<branch>.+?)/(?P<path>notebooks/[^?&#]+\.ipynb)"
)


def broken_links(text: str, root: Path = REPO_ROOT, repository: str = REPOSITORY, branch: str = BRANCH) -> list[str]:
    """Every badge link in `text` that names a notebook missing from `root`, or another repository or branch."""
    found = []
    for url in (m["url"] for m in LINK.finditer(text)):
        if not (
            "colab.research.google.com/github/" in url
            or "kaggle.com/notebooks/welcome" in url
            or "kaggle.com/kernels/welcome" in url
        ):
            continue  # a badge image, or a link to somewhere else
        hit = NOTEBOOK_IN_URL.search(url)
        if not hit:
            found.append(f"{url} names no notebook of the form notebooks/NN_name.ipynb")
        elif (hit["repo"], hit["branch"]) != (repository, branch):
            found.append(
                f"{url} points at {hit['repo']}@{hit['branch']}, "
                f"not {repository}@{branch} (helpers/maintainer/notebooks.py)"
            )
        elif not (root / hit["path"]).is_file():
            found.append(f"{url} names {hit['path']}, which does not exist")
    return found


def problems(path: Path | None = None, folder: Path | None = None) -> list[str]:
    """Why the committed colab_badges.md (or `path`) is wrong, each with the fix; empty when it is current."""
    path, folder = path or BADGES_PATH, folder or NOTEBOOKS_DIR
    if not path.exists():
        return [f"{path.name} is missing; run `{COMMAND}`"]
    text = path.read_text()
    found = [f"{path.name}: {p}; run `{COMMAND}`" for p in broken_links(text, folder.parent)]
    if text != render(folder):
        found.append(
            f"{path.name} is out of date with the notebooks or helpers/maintainer/notebooks.py; run `{COMMAND}`"
        )
    return found
