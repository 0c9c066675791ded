"""`python -m helpers run`: every notebook executed by papermill on the embedded model, and its errors."""

import json
import subprocess
import sys

import nbformat
import pytest

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.maintainer.runner import UsageError, select


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "helpers", "run", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_every_notebook_runs_headless(notebook_run):
    done, out = notebook_run, notebook_run.out
    assert done.returncode == 0, done.stdout + done.stderr
    stems = [p.stem for p in sorted(NOTEBOOKS_DIR.glob("*.ipynb"))]
    for stem in stems:
        line = next(line for line in done.stdout.splitlines() if line.split()[1:2] == [stem])
        assert line.startswith("ok"), line
        assert (out / "notebooks" / f"{stem}.ipynb").is_file()
        assert json.loads((out / "results" / f"{stem}.json").read_text()), f"{stem} recorded nothing"
    summary = json.loads((out / "summary.json").read_text())
    assert [s["notebook"] for s in summary] == stems and all(s["status"] == "ok" for s in summary)
    assert "| notebook | status | seconds | figures |" in (out / "summary.md").read_text()


def test_executed_copy_shows_the_smoke_banner_and_injected_parameters(notebook_run):
    out = notebook_run.out
    nb = nbformat.read(out / "notebooks" / "00_where_to_get_gpus.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "smoke = True" in injected[0].source
    text = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert "USING THE EMBEDDED TINY MODEL" in text


def test_notebook_00_figures_are_measured_on_this_machine(notebook_run):
    r = notebook_run.results["00_where_to_get_gpus"]
    assert r["platform"] == "local" and r["gpu_count"] == 0 and r["precision"] == "fp32"
    assert r["four_bit_ok"] is True and r["model"] == "embedded" and r["dataset_rows"] >= 300
    assert 4.0 < r["nf4_bits_per_param"] < 4.2  # 4-bit codes + double-quantized block scales
    assert r["adamw_bytes_per_param"] == pytest.approx(8, abs=0.01)  # two fp32 moments


def test_unknown_notebook_name_lists_the_real_ones():
    done = run_cli("--only", "99_nope")
    assert done.returncode == 2
    assert "--only '99_nope' is not a notebook" in done.stderr and "00_where_to_get_gpus" in done.stderr


def test_only_takes_a_number_prefix():
    assert [p.stem for p in select(["00"])] == ["00_where_to_get_gpus"]
    with pytest.raises(UsageError, match="is not a notebook"):
        select(["nope"])


def test_empty_notebook_folder_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no notebooks in"):
        select(None, tmp_path)


def test_failing_cell_is_printed_and_the_exit_code_says_so(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("import helpers\nhelpers.record('before_the_error', 1)"),
        nbformat.v4.new_code_cell("per_device_batch = 0\nsteps = 16 // per_device_batch"),
        nbformat.v4.new_code_cell("helpers.record('never', 2)"),
    ]
    folder = tmp_path / "nbs"
    folder.mkdir()
    nbformat.write(nb, folder / "98_broken.ipynb")
    done = run_cli("--notebooks", str(folder), "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "failed" in done.stdout and "0 ok, 1 failed" in done.stdout
    assert "ZeroDivisionError" in done.stderr and "steps = 16 // per_device_batch" in done.stderr
    results = json.loads((tmp_path / "out" / "results" / "98_broken.json").read_text())
    assert results == {"before_the_error": 1}  # what ran before the failure is kept
    assert "## Failures" in (tmp_path / "out" / "summary.md").read_text()


def test_parameters_with_arithmetic_comments_are_still_injected(tmp_path):
    """papermill's own parser skips `x = 16  # 1 x 16 = 16`; the runner reads the cell with ast."""
    from helpers.maintainer.runner import declared_parameters

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("smoke = False\nmax_steps = 100  # 4 x 25 = 100 steps")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("import helpers\nhelpers.record('max_steps', max_steps)")]
    folder = tmp_path / "nbs"
    folder.mkdir()
    nbformat.write(nb, folder / "97_params.ipynb")
    assert declared_parameters(folder / "97_params.ipynb") == {"smoke", "max_steps"}
    done = run_cli("--smoke", "--notebooks", str(folder), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "results" / "97_params.json").read_text()) == {"max_steps": 4}
    assert "Unable to parse" not in done.stdout + done.stderr
