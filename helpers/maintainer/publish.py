"""`python -m helpers publish --repo OWNER/NAME --ref REF`: point the kit at a fork and a fixed ref.

Students open a notebook from a badge and its install cell installs the helpers; both name one
GitHub repository and one git ref, set once in `helpers/maintainer/notebooks.py` (`REPOSITORY`,
`BRANCH`). On a moving branch a student can get helpers newer than the notebook they opened; a tag
(`--ref fall-2026`) freezes the pair. An instructor who forks the kit runs this once; it

1. rewrites `REPOSITORY` and `BRANCH` in helpers/maintainer/notebooks.py;
2. rebuilds the install cell in every notebooks/src/*.py and the notebooks/*.ipynb built from them;
3. rewrites colab_badges.md;
4. rewrites every mention of the old repository in README.md (links at the old ref move to the new one).

`--check` lists the files it would rewrite and writes nothing (exit 1 when any would change). Then
commit, push, and create the ref on that commit (`git tag fall-2026 && git push origin fall-2026`):
the notebooks at the tag name the tag itself.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from helpers.maintainer import badges, notebooks

__all__ = ["PublishError", "changes", "main", "publish", "retarget_links", "validate_ref", "validate_repository"]

EXAMPLE = "--repo someone/finetune-kit --ref fall-2026"
SETTINGS = Path("helpers", "maintainer", "notebooks.py")  # relative to the repository root
SETTING_LINE = re.compile(r'^(?P<name>REPOSITORY|BRANCH) = "(?P<value>[^"\n]*)"$', re.M)
OWNER = r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}"  # GitHub: letters, digits, single inner hyphens
NAME = r"[A-Za-z0-9._-]{1,100}"
GITHUB_URL = re.compile(rf"github\.com[/:](?P<repo>{OWNER}/{NAME})(?:[/#?].*)?$")
REF_CHARS = re.compile(r"[A-Za-z0-9._/-]+")


class PublishError(ValueError):
    """A --repo or --ref that cannot be published, or a checkout publish cannot read; the message says the fix."""


def validate_repository(text: str) -> str:
    """Return OWNER/NAME as given, or raise PublishError naming the fix (a URL, spaces, a .git suffix)."""
    if not text.strip():
        raise PublishError(f"--repo is empty: give the GitHub OWNER/NAME students open, e.g. {EXAMPLE}")
    if "://" in text or text.startswith(("git@", "github.com", "www.github.com")):
        url = GITHUB_URL.search(text.strip())
        hint = f"--repo {url['repo'].removesuffix('.git')}" if url else EXAMPLE
        raise PublishError(f"--repo takes OWNER/NAME, not a URL ({text!r}): e.g. {hint}")
    if re.search(r"\s", text):
        raise PublishError(
            f"--repo {text!r} contains a space: GitHub owner and repository names have none; "
            f"copy OWNER/NAME from the repository's address, e.g. {EXAMPLE}"
        )
    if text.endswith(".git"):
        raise PublishError(f"--repo {text!r}: leave out the .git, e.g. --repo {text.removesuffix('.git')}")
    if text.count("/") != 1:
        raise PublishError(f"--repo {text!r} is not OWNER/NAME (exactly one '/'), e.g. {EXAMPLE}")
    owner, name = text.split("/")
    if not re.fullmatch(OWNER, owner) or not re.fullmatch(NAME, name) or name in (".", ".."):
        raise PublishError(
            f"--repo {text!r} is not a GitHub OWNER/NAME: an owner is letters, digits and single inner "
            f"hyphens (at most 39), a name letters, digits, '.', '_' and '-'; e.g. {EXAMPLE}"
        )
    return text


def validate_ref(text: str) -> str:
    """Return REF as given (a branch or tag name), or raise PublishError naming the fix."""
    if not text.strip():
        raise PublishError(f"--ref is empty: give the branch or tag students get, e.g. {EXAMPLE}")
    if "://" in text:
        raise PublishError(f"--ref takes a branch or tag name, not a URL ({text!r}): e.g. --ref fall-2026")
    if re.search(r"\s", text):
        raise PublishError(f"--ref {text!r} contains a space: git refs have none; e.g. --ref {'-'.join(text.split())}")
    if text.startswith("refs/"):
        raise PublishError(f"--ref {text!r}: give the name GitHub shows, e.g. --ref {text.split('/', 2)[-1]}")
    if not REF_CHARS.fullmatch(text):
        raise PublishError(
            f"--ref {text!r} has characters a ref cannot carry into a URL and the install cell: "
            "use letters, digits, '.', '_', '-' and '/', e.g. --ref fall-2026"
        )
    dotted = any(not part or part.startswith(".") for part in text.split("/"))  # "a//b", "/a", ".a", "a/.b"
    if dotted or ".." in text or text.endswith((".lock", ".")) or text.startswith("-"):
        raise PublishError(
            f"--ref {text!r} is not a valid git ref name (no '..', no empty or dot-led part between '/', "
            "no leading '-', no '.' or '.lock' at the end; see `git check-ref-format`), e.g. --ref fall-2026"
        )
    return text


def retarget_links(text: str, old: tuple[str, str], new: tuple[str, str]) -> str:
    """Rewrite every mention of the old (repository, ref) in `text`: links at the old ref move to the new one.

    Example: `.../github/kit-org/kit/blob/main/notebooks/00.ipynb` with old = ("kit-org/kit", "main") and
    new = ("someone/fork", "v1") becomes `.../github/someone/fork/blob/v1/notebooks/00.ipynb`.
    """
    (old_repo, old_ref), (new_repo, new_ref) = old, new
    repo = rf"(?<![\w.-]){re.escape(old_repo)}(?![\w-])"
    # 1. the old repository followed by the old ref: blob/tree/raw links, raw.githubusercontent, git+...@ref
    at_ref = re.compile(rf"{repo}(?P<sep>/(?:blob|tree|raw)/|/|\.git@){re.escape(old_ref)}(?=[/?#)\s\"'`>]|$)", re.I)
    text = at_ref.sub(lambda m: f"{new_repo}{m['sep']}{new_ref}", text)
    # 2. any other mention: a link to the repository itself, its issues, a clone command
    return re.compile(repo, re.I).sub(new_repo, text)


def _read_settings(root: Path) -> tuple[Path, dict[str, str]]:
    path = root / SETTINGS
    lines = list(SETTING_LINE.finditer(path.read_text()))
    if sorted(m["name"] for m in lines) != ["BRANCH", "REPOSITORY"]:
        raise PublishError(
            f'{path} must have the lines REPOSITORY = "OWNER/NAME" and BRANCH = "REF" (one each), '
            "as in the kit; restore them, then publish again"
        )
    return path, {m["name"]: m["value"] for m in lines}


def changes(repository: str, ref: str, root: Path = notebooks.REPO_ROOT) -> dict[Path, str]:
    """The new text of every file publishing `repository` at `ref` would rewrite; nothing is written."""
    repository, ref = validate_repository(repository), validate_ref(ref)
    settings, old = _read_settings(root)
    values = {"REPOSITORY": repository, "BRANCH": ref}
    wanted = {settings: SETTING_LINE.sub(lambda m: f'{m["name"]} = "{values[m["name"]]}"', settings.read_text())}
    cell = notebooks.install_cell(repository, ref)
    built = {}
    for source in notebooks.sources(root / "notebooks" / "src"):
        wanted[source] = notebooks.with_install_cell(source.read_text(), cell)
        built[notebooks.notebook_path(source)] = notebooks.render(source, cell)
    wanted |= built
    with tempfile.TemporaryDirectory() as folder:  # the badges read the notebooks as they will be
        for path, nb in built.items():
            Path(folder, path.name).write_text(nb)
        wanted[root / badges.BADGES_PATH.name] = badges.render(Path(folder), repository, ref)
    readme = root / "README.md"
    if readme.exists():
        wanted[readme] = retarget_links(readme.read_text(), (old["REPOSITORY"], old["BRANCH"]), (repository, ref))
    return {path: text for path, text in wanted.items() if not path.exists() or path.read_text() != text}


def publish(repository: str, ref: str, root: Path = notebooks.REPO_ROOT) -> list[Path]:
    """Rewrite the settings, install cells, notebooks, badges and README for `repository` at `ref`; return them."""
    rewrite = changes(repository, ref, root)
    for path, text in rewrite.items():
        path.write_text(text)
    return list(rewrite)


def main(repository: str, ref: str, *, check: bool = False, root: Path = notebooks.REPO_ROOT) -> int:
    """`python -m helpers publish`: 0 when done (with check: nothing to do), 1 when check finds work, 2 on bad input."""
    try:
        paths = list(changes(repository, ref, root)) if check else publish(repository, ref, root)
    except ValueError as e:  # PublishError, a notebook's BadgeError, a source without an install cell
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = "".join(f"\n  {p.relative_to(root)}" for p in paths)
    if not paths:
        print(f"already published: {repository} at {ref}; nothing to change")
    elif check:
        print(f"publishing {repository} at {ref} would rewrite {len(paths)} files:{names}")
    else:
        print(f"published {repository} at {ref}: rewrote {len(paths)} files:{names}")
        print(
            f"next: commit, push to github.com/{repository}, and make sure {ref} exists there on that commit "
            f"(a tag: git tag {ref} && git push origin {ref})"
        )
    return 1 if check and paths else 0
