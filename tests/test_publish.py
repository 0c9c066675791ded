"""`python -m helpers publish`: one command points the badges, install cells and README at a fork and a ref.

The end-to-end tests run the command as an instructor would, in a copy of the kit (the files it
reads and writes, nothing else) with the copy as the working tree, then look for any trace of the
old repository and run the drift checks there.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from background import background

from helpers.__main__ import main
from helpers.maintainer import badges, notebooks, publish
from helpers.maintainer.notebooks import BRANCH, REPO_ROOT, REPOSITORY

# what publish reads and writes, and what `python -m helpers` needs to start
COPIED = ("helpers", "notebooks", "README.md", "colab_badges.md", "pyproject.toml", "requirements.txt")
FORK, REF = "someone/fork", "v1"
SLOW_FIXTURES = ("fork",)  # the command line publishing a copy of the kit (conftest: each user is slow)
# links a README may carry to the kit (this one links colab_badges.md instead): publish must move them too
README_LINKS = f"""
[Open 00 in Colab](https://colab.research.google.com/github/{REPOSITORY}/blob/{BRANCH}/notebooks/00_where_to_get_gpus.ipynb)
[The kit on GitHub](https://github.com/{REPOSITORY}); `pip install git+https://github.com/{REPOSITORY}.git@{BRANCH}`
"""


def kit(root, *args, env: dict[str, str] | None = None):
    """`python -m helpers ARGS` with `root` as the working tree: `helpers` is imported from there."""
    return subprocess.run(
        [sys.executable, "-m", "helpers", *args], cwd=root, capture_output=True, text=True, timeout=300, env=env
    )


@background(seconds=2)
def fork(root: Path, env: dict[str, str]):
    """A copy of the kit, published as someone/fork at v1 by the command line; (root, the command's result)."""
    skip = shutil.ignore_patterns("__pycache__", "build", "wandb", "*.egg-info", ".ipynb_checkpoints")
    for name in COPIED:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=skip)
        else:
            shutil.copy(source, root / name)
    (root / "README.md").write_text((root / "README.md").read_text() + README_LINKS)
    return root, kit(root, "publish", "--repo", FORK, "--ref", REF, env=env)


def test_publish_leaves_no_trace_of_the_old_repository(fork):
    root, done = fork
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"published {FORK} at {REF}: rewrote" in done.stdout and f"git tag {REF}" in done.stdout
    texts = {p: p.read_text(errors="replace") for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"}
    traces = [str(p.relative_to(root)) for p, text in texts.items() if REPOSITORY.lower() in text.lower()]
    assert not traces, f"{REPOSITORY} is still named in {traces}"
    for name in ("README.md", "colab_badges.md", "notebooks/00_where_to_get_gpus.ipynb"):
        assert FORK in texts[root / name], name
    assert f'REPOSITORY = "{FORK}"\nBRANCH = "{REF}"' in texts[root / "helpers/maintainer/notebooks.py"]
    assert REPOSITORY in (REPO_ROOT / "helpers/maintainer/notebooks.py").read_text(), "the kit itself is untouched"


def test_the_readme_links_move_to_the_fork_at_the_new_ref(fork):
    readme = (fork[0] / "README.md").read_text()
    assert f"colab.research.google.com/github/{FORK}/blob/{REF}/notebooks/00_where_to_get_gpus.ipynb" in readme
    assert f"[The kit on GitHub](https://github.com/{FORK})" in readme
    assert f"git+https://github.com/{FORK}.git@{REF}`" in readme


def test_after_publishing_the_drift_checks_pass_and_a_second_run_has_nothing_to_do(fork):
    root, _ = fork
    check = kit(root, "notebooks", "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    again = kit(root, "publish", "--repo", FORK, "--ref", REF, "--check")
    assert again.returncode == 0 and "already published" in again.stdout, again.stdout + again.stderr


def test_every_badge_opens_a_notebook_that_installs_the_helpers_from_the_same_ref(fork):
    root, _ = fork
    text = (root / "colab_badges.md").read_text()
    links = [badges.NOTEBOOK_IN_URL.search(m["url"]) for m in badges.LINK.finditer(text)]
    links = [hit for hit in links if hit]
    assert len(links) == 2 * len(list((root / "notebooks").glob("*.ipynb")))  # a Colab and a Kaggle badge each
    for hit in links:
        assert (hit["repo"], hit["branch"]) == (FORK, REF), hit.group(0)
        cells = json.loads((root / hit["path"]).read_text())["cells"]
        (install,) = [c for c in cells if "install" in c["metadata"].get("tags", [])]
        assert "".join(install["source"]) == notebooks.install_cell(FORK, REF), hit["path"]
    cell = notebooks.install_cell(FORK, REF)
    assert f'repo, ref = "{FORK}", "{REF}"' in cell and "{repo}/{ref}/requirements.txt" in cell
    assert 'f"git+https://github.com/{repo}.git@{ref}"' in cell  # the kit from the notebook's own ref


def test_check_lists_what_would_change_and_writes_nothing(capsys):
    watched = [REPO_ROOT / "helpers/maintainer/notebooks.py", badges.BADGES_PATH, REPO_ROOT / "README.md"]
    watched += notebooks.sources() + [notebooks.notebook_path(s) for s in notebooks.sources()]
    before = {p: p.read_text() for p in watched}
    would = publish.changes(FORK, REF)
    assert set(would) == set(watched) - {REPO_ROOT / "README.md"}  # this README has no link to the repository
    assert main(["publish", "--repo", FORK, "--ref", REF, "--check"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"publishing {FORK} at {REF} would rewrite {len(would)} files:")
    assert "\n  helpers/maintainer/notebooks.py\n" in out and "\n  colab_badges.md" in out
    assert {p: p.read_text() for p in watched} == before, "--check must write nothing"


def test_check_on_the_kit_as_it_is_has_nothing_to_do(capsys):
    assert main(["publish", "--repo", REPOSITORY, "--ref", BRANCH, "--check"]) == 0
    assert capsys.readouterr().out == f"already published: {REPOSITORY} at {BRANCH}; nothing to change\n"


@pytest.mark.parametrize(
    "repo, ref, message",
    [
        ("https://github.com/someone/fork", REF, r"--repo takes OWNER/NAME, not a URL .*: e\.g\. --repo someone/fork$"),
        ("git@github.com:someone/fork.git", REF, r"not a URL .*: e\.g\. --repo someone/fork$"),
        ("github.com/someone/fork/tree/v1", REF, r"not a URL .*: e\.g\. --repo someone/fork$"),
        ("some one/fork", REF, r"--repo 'some one/fork' contains a space: GitHub owner and repository names have none"),
        ("someone/fork.git", REF, r"leave out the \.git, e\.g\. --repo someone/fork$"),
        ("someone", REF, r"--repo 'someone' is not OWNER/NAME \(exactly one '/'\)"),
        ("someone-/fork", REF, r"is not a GitHub OWNER/NAME: an owner is letters, digits and single inner hyphens"),
        ("", REF, r"--repo is empty"),
        (FORK, "", r"--ref is empty"),
        (FORK, "fall 2026", r"--ref 'fall 2026' contains a space: git refs have none; e\.g\. --ref fall-2026"),
        (FORK, "https://github.com/someone/fork/tree/v1", r"--ref takes a branch or tag name, not a URL"),
        (FORK, "refs/tags/v1", r"give the name GitHub shows, e\.g\. --ref v1$"),
        (FORK, 'v1"x', r"has characters a ref cannot carry into a URL and the install cell"),
        (FORK, "v1..v2", r"is not a valid git ref name"),
        (FORK, "v1.lock", r"is not a valid git ref name"),
        (FORK, "term/", r"is not a valid git ref name"),
    ],
)
def test_bad_input_is_refused_with_the_fix_and_nothing_is_written(repo, ref, message, capsys):
    with pytest.raises(publish.PublishError, match=message):
        publish.changes(repo, ref)
    assert main(["publish", "--repo", repo, "--ref", ref]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --re") and re.search(message, err.strip()), err
    assert f'REPOSITORY = "{REPOSITORY}"' in (REPO_ROOT / "helpers/maintainer/notebooks.py").read_text()


@pytest.mark.parametrize("repo, ref", [(FORK, REF), ("Some-Org/kit.v2", "fall-2026/week_1"), (FORK, "0a1b2c3")])
def test_good_input_is_taken_as_given(repo, ref):
    assert (publish.validate_repository(repo), publish.validate_ref(ref)) == (repo, ref)


def test_links_at_the_old_ref_move_to_the_new_one_and_other_mentions_to_the_new_repository():
    old, new = ("kit-org/kit", "main"), ("someone/fork", "v1")
    text = (
        "https://colab.research.google.com/github/kit-org/kit/blob/main/notebooks/00.ipynb\n"
        "https://www.kaggle.com/notebooks/welcome?src=https://github.com/kit-org/kit/blob/main/notebooks/00.ipynb&x=1\n"
        "https://raw.githubusercontent.com/kit-org/kit/main/requirements.txt\n"
        "git+https://github.com/kit-org/kit.git@main and [issues](https://github.com/Kit-Org/Kit/issues)\n"
        "https://github.com/kit-org/kit/tree/dev/docs, kit-org/kit-extras, https://github.com/kit-org/kit/mainly\n"
    )
    assert publish.retarget_links(text, old, new) == (
        "https://colab.research.google.com/github/someone/fork/blob/v1/notebooks/00.ipynb\n"
        "https://www.kaggle.com/notebooks/welcome?src=https://github.com/someone/fork/blob/v1/notebooks/00.ipynb&x=1\n"
        "https://raw.githubusercontent.com/someone/fork/v1/requirements.txt\n"
        "git+https://github.com/someone/fork.git@v1 and [issues](https://github.com/someone/fork/issues)\n"
        "https://github.com/someone/fork/tree/dev/docs, kit-org/kit-extras, https://github.com/someone/fork/mainly\n"
    )


def test_a_checkout_without_the_setting_lines_says_how_to_fix_it(tmp_path):
    settings = tmp_path / "helpers" / "maintainer" / "notebooks.py"
    settings.parent.mkdir(parents=True)
    settings.write_text('REPOSITORY = "a/b"\n')
    with pytest.raises(publish.PublishError, match=r"must have the lines REPOSITORY = .* and BRANCH = .*restore them"):
        publish.changes(FORK, REF, root=tmp_path)


def test_the_readme_says_how_to_publish_your_own_copy():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Publish your own copy") :]
    assert "python -m helpers publish --repo" in section and "--ref" in section and "--check" in section
