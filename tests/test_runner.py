"""`python -m helpers run`: every notebook executed by papermill on the embedded model, and its errors."""

import io
import json
import re
import signal
import subprocess
import sys
import time

import nbformat
import pytest

from helpers.maintainer import runner
from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.maintainer.runner import UsageError, run, select


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


# ---------------------------------------------------------------------------------------------
# whatever stops one notebook is one failed row: every other notebook runs, the summary is written


def write_notebooks(folder, sources: dict) -> None:
    """One notebook per name, its cells from `sources[name]` (a list of sources), or raw text for a non-notebook."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, cells in sources.items():
        if isinstance(cells, str):
            (folder / f"{name}.ipynb").write_text(cells)
            continue
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
        nbformat.write(nb, folder / f"{name}.ipynb")


RUNS_AFTER = ["import helpers\nhelpers.record('ran', True)"]


def test_a_dead_kernel_a_hanging_cell_and_a_corrupt_file_are_failed_rows_and_the_rest_still_runs(tmp_path):
    finished = tmp_path / "finished"  # written by the hanging cell if it is ever let finish
    hang = f"import time\ntime.sleep(60)  # a cell that hangs, 20 x --cell-timeout\nopen({str(finished)!r}, 'w')"
    write_notebooks(
        tmp_path / "nbs",
        {
            "01_oom_killed": ["x = 1", "import os\nos.kill(os.getpid(), 9)  # what the kernel's OOM killer does"],
            "02_corrupt": '{"cells": [ a notebook cut off mid-write',
            "03_hangs": [hang],
            "04_runs_after": RUNS_AFTER,
        },
    )
    done = run_cli("--notebooks", str(tmp_path / "nbs"), "--out", str(tmp_path / "out"), "--cell-timeout", "3")
    # an order, not a duration: the hanging cell was stopped before its 60 s were up; a runner that
    # ignored --cell-timeout 3 (or stopped it at a bound of a minute or more) would let it write `finished`
    assert not finished.exists(), "the hanging cell was let run to its end: --cell-timeout did not stop it"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 ok, 3 failed" in done.stdout
    assert "helpers/maintainer/runner.py" not in done.stderr, "no traceback from the runner itself"
    rows = {row["notebook"]: row for row in json.loads((tmp_path / "out" / "summary.json").read_text())}
    assert {name: row["status"] for name, row in rows.items()} == {
        "01_oom_killed": "failed",
        "02_corrupt": "failed",
        "03_hangs": "failed",
        "04_runs_after": "ok",
    }
    died, hung = rows["01_oom_killed"]["error"], rows["03_hangs"]["error"]
    assert "the kernel died while running a cell" in died
    assert "(number 2 of 2)" in died and "os.kill(os.getpid(), 9)" in died  # the cell it died in
    assert "02_corrupt.ipynb is not a valid notebook (NotJSONError" in rows["02_corrupt"]["error"]
    assert "ran past --cell-timeout (3 s)" in hung and "time.sleep(60)" in hung
    print(f"\nthe hanging cell's notebook failed after {rows['03_hangs']['seconds']:.1f} s (--cell-timeout 3)")
    assert rows["04_runs_after"]["results"] == {"ran": True}
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| 04_runs_after | ok |" in summary and summary.count("```\n") == 2 * 3  # three failures shown


def test_an_interrupt_still_writes_the_summary(tmp_path):
    write_notebooks(tmp_path / "nbs", {"01_hangs": ["import time\ntime.sleep(3600)"], "02_never_reached": RUNS_AFTER})
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "helpers", "run", "--notebooks", str(tmp_path / "nbs"), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        # papermill writes the executed copy as the first cell starts
        while not (out / "notebooks" / "01_hangs.ipynb").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1)  # into the sleeping cell
        process.send_signal(signal.SIGINT)  # Ctrl-C
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stdout + stderr
    assert "interrupted" in stderr and "0 ok, 0 failed, 2 not run" in stdout
    rows = json.loads((out / "summary.json").read_text())
    assert [(r["notebook"], r["status"]) for r in rows] == [("01_hangs", "not run"), ("02_never_reached", "not run")]


def test_out_must_be_a_folder_that_can_be_written(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    for out, why in [
        (tmp_path / "a-file", "is a file, not a folder: pass a folder"),
        (tmp_path / "a-file" / "sub", "cannot be written (Not a directory): pass a folder you can write to"),
    ]:
        done = run_cli("--only", "00", "--out", str(out))
        assert done.returncode == 2 and f"error: --out {out} {why}" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert (tmp_path / "a-file").read_text() == "not a folder"  # left as it was


@pytest.mark.parametrize("seconds", ["0", "-5", "nan", "inf", "ten"])
def test_cell_timeout_must_be_a_positive_number_of_seconds(seconds):
    done = run_cli("--only", "00", "--cell-timeout", seconds)
    assert done.returncode == 2 and "argument --cell-timeout" in done.stderr
    assert "e.g. --cell-timeout 300" in done.stderr
    assert "Traceback" not in done.stderr
    with pytest.raises(UsageError, match="--cell-timeout"):  # the same check for a caller of runner.run
        run(["00"], cell_timeout=float(seconds) if seconds != "ten" else seconds)


class FakeTTY(io.StringIO):
    """A fake terminal: a StringIO that says it is one."""

    def isatty(self):
        return True


def run_with_fake_execute(tmp_path, monkeypatch, stdout, shown=0):
    """run() over two notebooks whose execution is faked; what it printed.

    Each fake notebook runs until its running line has been printed `shown` times (or 30 s went by):
    an event to wait for, not a duration, so a slow machine only waits longer.
    """
    write_notebooks(tmp_path / "nbs", {"01_first": RUNS_AFTER, "02_second": RUNS_AFTER})

    def fake_execute(path, out, **kwargs):
        deadline = time.monotonic() + 30
        while stdout.getvalue().count(f"running {path.stem} ") < shown and time.monotonic() < deadline:
            time.sleep(0.05)
        return runner.Outcome(path.stem, "ok", 1.0)

    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert run(folder=tmp_path / "nbs", out=tmp_path / "out") == 0
    monkeypatch.undo()
    return stdout.getvalue()


def test_on_a_terminal_the_running_line_rewrites_itself_with_the_seconds(tmp_path, monkeypatch):
    printed = run_with_fake_execute(tmp_path, monkeypatch, FakeTTY(), shown=2)  # at the start, then a second later
    first, _, second = printed.split("\n")[:3]
    # shown at the start, again each second, and once more at the end: one line, rewritten
    assert re.fullmatch(r"(\r\[1/2\] running 01_first \.\.\. \d+ s){3,}", first), first
    assert first.startswith("\r[1/2] running 01_first ... 0 s\r") and first.count("\r") >= 3
    assert re.fullmatch(r"(\r\[2/2\] running 02_second \.\.\. \d+ s){3,}", second), second


def test_off_a_terminal_the_running_lines_are_unchanged(tmp_path, monkeypatch):
    printed = run_with_fake_execute(tmp_path, monkeypatch, io.StringIO())
    lines = printed.splitlines()
    assert "\r" not in printed
    assert lines[0] == "[1/2] running 01_first ..." and lines[2] == "[2/2] running 02_second ..."
