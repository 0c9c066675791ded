"""`python -m helpers run`: every notebook executed by papermill on the embedded model, and its errors."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from background import background

from helpers._util import NotRegularFile, read_regular_file
from helpers.maintainer import execution, failures, runner
from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.maintainer.runner import UsageError, run, select

# notebooks that fail, hang, orphan processes or attack the runner, run in the background lane (conftest: slow)
SLOW_FIXTURES = ("failing_notebooks", "orphaning_notebooks", "hostile_notebooks")


def run_cli(*args, cwd=None, timeout=600, env=None):
    return subprocess.run(
        [sys.executable, "-m", "helpers", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_parameters_with_arithmetic_comments_are_still_injected(tmp_path):
    """papermill's own parser skips `x = 16  # 1 x 16 = 16`; the runner reads the cell with ast."""
    from helpers.maintainer.execution import declared_parameters

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


@background(timed=True)
def failing_notebooks(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
    """A kernel that dies, a corrupt file, a cell that hangs past --cell-timeout 3, then one that runs (about
    10 s, mostly the hanging cell's bound): (the runner's result, its folder)."""
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
    return run_cli(
        "--notebooks", str(tmp_path / "nbs"), "--out", str(tmp_path / "out"), "--cell-timeout", "3", env=env
    ), tmp_path


def test_a_dead_kernel_a_hanging_cell_and_a_corrupt_file_are_failed_rows_and_the_rest_still_runs(failing_notebooks):
    done, tmp_path = failing_notebooks
    finished = tmp_path / "finished"
    # an order, not a duration: the hanging cell was stopped before its 60 s were up; a runner that
    # ignored --cell-timeout 3 (or stopped it at a bound of a minute or more) would let it write `finished`
    assert not finished.exists(), "the hanging cell was let run to its end: --cell-timeout did not stop it"
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 ok, 3 failed" in done.stdout
    assert "helpers/maintainer/runner.py" not in done.stderr, "no traceback from the runner itself"
    assert "helpers/maintainer/execution.py" not in done.stderr, "no traceback from the runner itself"
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


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
@pytest.mark.slow
def test_an_interrupt_still_writes_the_summary(tmp_path, sig, code):
    """Ctrl-C, or SIGTERM (what a scheduler or CI sends), to a real runner in a sleeping cell."""
    started = tmp_path / "kernel.pid"  # written by the sleeping cell as it starts: an event, not a delay
    child = tmp_path / "child.pid"  # a process the notebook started in a session of its own, never waited for
    sleeps = (
        "import os, subprocess, time\n"
        f"open({str(child)!r}, 'w').write(str(subprocess.Popen(['sleep', '3600'], start_new_session=True).pid))\n"
        f"open({str(started)!r}, 'w').write(str(os.getpid()))\ntime.sleep(3600)"
    )
    notebooks = {"01_runs": RUNS_AFTER, "02_sleeps": [sleeps], "03_never_reached": RUNS_AFTER}
    write_notebooks(tmp_path / "nbs", notebooks)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "helpers", "run", "--notebooks", str(tmp_path / "nbs"), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process.poll() is None, "the runner ended before the sleeping cell started"
        process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == code, stdout + stderr
    assert f"interrupted ({sig.name})" in stderr and "1 ok, 0 failed, 1 interrupted, 1 not run" in stdout
    rows = json.loads((out / "summary.json").read_text())
    assert [(r["notebook"], r["status"]) for r in rows] == [
        ("01_runs", "ok"),
        ("02_sleeps", "interrupted"),
        ("03_never_reached", "not run"),
    ]
    assert rows[0]["results"] == {"ran": True}  # what finished before the interrupt is kept
    assert f"the cells it ran are in {out / 'notebooks' / '02_sleeps.ipynb'}" in rows[1]["error"]
    assert "| 02_sleeps | interrupted |" in (out / "summary.md").read_text()
    kernel = int(started.read_text())
    deadline = time.monotonic() + 30
    while _alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kernel), f"the interrupted notebook's kernel (pid {kernel}) is still running"
    assert not _alive(int(child.read_text())), "a process the interrupted notebook started is still running"


def starts_orphans(tag: str, folder: Path) -> str:
    """A cell that starts two processes it never waits for, each in a session of its own, and writes their pids."""
    return (
        f"!setsid nohup sleep 600 > /dev/null 2>&1 & echo $! > {folder / (tag + '.shell')}\n"
        "import subprocess\n"
        f"open({str(folder / (tag + '.popen'))!r}, 'w').write(str(subprocess.Popen(['sleep', '601'], "
        "start_new_session=True).pid))"
    )


@background(timed=True)
def orphaning_notebooks(tmp_path: Path, env: dict[str, str]):
    """Notebooks that start processes they never wait for, one failing, one past --cell-timeout 5 (about 12 s):
    (the runner's result, its folder, {pid file: pid}, the pids still alive the moment it returned)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    notebooks = {
        "01_passes": [starts_orphans("01", pids), "x = 1"],
        "02_fails": [starts_orphans("02", pids), "1 / 0"],
        "03_times_out": [starts_orphans("03", pids), "import time\ntime.sleep(60)"],
        "04_waits": ["import subprocess\nsubprocess.Popen(['sleep', '0.1']).wait()"],  # nothing left: no note
    }
    write_notebooks(tmp_path / "nbs", notebooks)
    done = run_cli("--notebooks", str(tmp_path / "nbs"), "--out", str(tmp_path / "out"), "--cell-timeout", "5", env=env)
    started = {p.name: int(p.read_text()) for p in sorted(pids.iterdir())}
    return done, tmp_path, started, [pid for pid in started.values() if _alive(pid)]  # no waiting: at once


def test_no_process_a_notebook_starts_outlives_it_whether_it_passes_fails_or_times_out(orphaning_notebooks):
    done, tmp_path, started, alive = orphaning_notebooks
    assert "2 ok, 2 failed" in done.stdout, done.stdout + done.stderr
    assert len(started) == 6, started
    for name, pid in started.items():  # gone when the runner returned
        assert pid not in alive, f"{name}: pid {pid}, started by a notebook, outlived `python -m helpers run`"
    rows = {r["notebook"]: r for r in json.loads((tmp_path / "out" / "summary.json").read_text())}
    for stem, tag in [("01_passes", "01"), ("02_fails", "02")]:
        (note,) = rows[stem]["notes"]
        assert note.startswith(f"{stem}.ipynb left ") and "the runner ended" in note
        assert f"pid {started[tag + '.popen']} (sleep 601)" in note and f"note: {note}" in done.stderr
    assert rows["04_waits"]["notes"] == []
    assert "## Notes" in (tmp_path / "out" / "summary.md").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"  # a zombie has ended


def run_fake(tmp_path, monkeypatch, execute_02):
    """run() over three notebooks whose execution is faked, 02's by `execute_02(path)`; its code and rows."""
    write_notebooks(tmp_path / "nbs", {"01_first": RUNS_AFTER, "02_second": RUNS_AFTER, "03_third": RUNS_AFTER})

    def fake_execute(path, out, **kwargs):
        if path.stem == "02_second":
            execute_02(path)
        return execution.Outcome(path.stem, "ok", 1.0)

    monkeypatch.setattr(runner, "execute", fake_execute)
    code = run(folder=tmp_path / "nbs", out=tmp_path / "out")
    rows = json.loads((tmp_path / "out" / "summary.json").read_text())
    return code, [(r["notebook"], r["status"]) for r in rows]


def test_sigterm_stops_run_as_ctrl_c_does_and_the_previous_handler_is_put_back(tmp_path, monkeypatch):
    reached = []  # a SIGTERM that reaches the test's own handler was not caught by run()

    def sigterm_then_wait(path):
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # run()'s handler raises out of this loop
            time.sleep(0.05)

    previous = signal.signal(signal.SIGTERM, reached.append)
    try:
        code, rows = run_fake(tmp_path, monkeypatch, sigterm_then_wait)
        after = signal.getsignal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert reached == [] and after == reached.append
    assert code == 143
    assert rows == [("01_first", "ok"), ("02_second", "interrupted"), ("03_third", "not run")]


def test_off_the_main_thread_or_with_sigterm_ignored_run_leaves_the_handler_alone(tmp_path, monkeypatch):
    seen = []
    # signal.signal raises ValueError off the main thread: run() must not try
    worker = threading.Thread(
        target=lambda: seen.append(run_fake(tmp_path / "thread", monkeypatch, lambda path: None)[0])
    )
    worker.start()
    worker.join(60)
    assert seen == [0]
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ignored on purpose (nohup, a parent's choice)
    try:
        code, _ = run_fake(
            tmp_path / "ignored", monkeypatch, lambda path: seen.append(signal.getsignal(signal.SIGTERM))
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 0 and seen[1:] == [signal.SIG_IGN]


# ---------------------------------------------------------------------------------------------
# hostile notebooks: what the runner copies of an error is bounded and printable; it opens only
# regular files


HUGE = 20_000_000  # characters of one error message: 20 MB, copied whole three times before the cap


def run_cli_capped(*args, timeout, env=None):
    """run_cli with each process's address space capped at 4 GiB (the kernel inherits it): a runner
    that read /dev/zero would fail with MemoryError instead of filling the machine."""
    capped = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
        "from helpers.__main__ import main; sys.exit(main())"
    )
    command = [sys.executable, "-c", capped, "run", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


@background(timed=True)
def hostile_notebooks(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """A 20 MB error, control characters, a FIFO and /dev/zero named like notebooks, then one that runs, under a
    4 GiB address-space cap (about 7 s): (the runner's result, the notebooks' folder, the output folder)."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    escapes = r"raise ValueError('\x1b[2J\x1b]0;title\x07\rOVERWRITTEN\n```\n# not a heading')"
    write_notebooks(
        nbs,
        {"01_huge_error": [f"raise ValueError('x' * {HUGE})"], "02_escapes": [escapes], "05_runs_after": RUNS_AFTER},
    )
    os.mkfifo(nbs / "03_x.ipynb")  # opened, it would block the run until a writer came: never
    (nbs / "04_zero.ipynb").symlink_to("/dev/zero")  # read, it would never end
    return run_cli_capped("--notebooks", str(nbs), "--out", str(out), timeout=300, env=env), nbs, out


def test_a_huge_error_control_characters_a_fifo_and_a_device_are_bounded_rows_and_the_rest_still_runs(
    hostile_notebooks,
):
    done, nbs, out = hostile_notebooks
    assert done.returncode == 1 and "1 ok, 4 failed" in done.stdout, done.stdout + done.stderr[-3000:]
    rows = {row["notebook"]: row for row in json.loads((out / "summary.json").read_text())}
    assert rows["05_runs_after"]["status"] == "ok" and rows["05_runs_after"]["results"] == {"ran": True}
    summary = (out / "summary.md").read_text()
    # 1. the 20 MB error: a few KB in each copy, saying where it was cut and where the whole is
    for copy, text in [("summary.md", summary), ("summary.json", json.dumps(rows)), ("the terminal", done.stderr)]:
        assert len(text) < 20_000, f"{copy} holds {len(text):,} characters"
    huge = rows["01_huge_error"]["error"]
    assert len(huge) <= failures.MAX_ERROR_CHARS + 500
    executed = out / "notebooks" / "01_huge_error.ipynb"
    assert f"[cut at character 1,000 of {HUGE:,}: the whole is in the executed notebook {executed}]" in huge
    assert "raise ValueError('x' * 20000000)" in huge  # the cell and the traceback survive the cut
    error_outputs = [o for c in json.loads(executed.read_text())["cells"] for o in c.get("outputs", [])]
    assert [len(o["evalue"]) for o in error_outputs if o["output_type"] == "error"] == [HUGE]  # kept whole there
    # 2. control characters: escaped, so they neither clear the terminal nor rewrite its line
    escaped = rows["02_escapes"]["error"]
    assert "ValueError: \\x1b[2J\\x1b]0;title\\x07\\rOVERWRITTEN" in escaped
    for copy, text in [("summary.md", summary), ("summary.json", escaped), ("the terminal", done.stderr)]:
        assert "\x1b[2J" not in text and "\x07" not in text and "\rOVERWRITTEN" not in text, copy
    # the error's own ``` cannot close its code block in summary.md: the fence is longer
    block = re.search(r"^(`{4,})\n02_escapes\.ipynb: .*?^\1$", summary, re.S | re.M)
    assert block and "\n# not a heading\n" in block.group()
    # 3. a FIFO and a link to a device, named like notebooks: refused unopened, with the reason and the fix
    fix = "the runner opens only regular files"
    assert rows["03_x"]["error"].startswith(f"03_x.ipynb is a named pipe (FIFO), not a regular file: {fix}")
    assert rows["04_zero"]["error"].startswith(
        f"04_zero.ipynb is a character device (a symbolic link to /dev/zero), not a regular file: {fix}"
    )
    assert f"Put the notebook itself at {nbs / '03_x.ipynb'}, or move this out of {nbs}." in rows["03_x"]["error"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["03", "03_x.ipynb"], ids=["by-number", "by-path"])
def test_a_fifo_named_on_the_command_line_is_refused_without_hanging(tmp_path, name):
    (tmp_path / "nbs").mkdir()
    os.mkfifo(tmp_path / "nbs" / "03_x.ipynb")
    only = name if name == "03" else str(tmp_path / "nbs" / name)
    done = run_cli("--notebooks", str(tmp_path / "nbs"), "--out", str(tmp_path / "out"), "--only", only, timeout=120)
    assert done.returncode == 1 and "0 ok, 1 failed" in done.stdout, done.stdout + done.stderr
    assert "03_x.ipynb is a named pipe (FIFO), not a regular file" in done.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())[0]["status"] == "failed"


def test_a_path_swapped_for_a_fifo_after_its_check_is_refused_without_blocking(tmp_path, monkeypatch):
    fifo, regular = tmp_path / "03_x.ipynb", tmp_path / "regular.ipynb"
    os.mkfifo(fifo)
    regular.write_text("{}")
    real_stat = os.stat
    # the swap as the reader sees it: os.stat found a regular file, the open finds a FIFO
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(regular if Path(p) == fifo else p, *a, **k))
    refused = []

    def read():
        with pytest.raises(NotRegularFile) as e:
            read_regular_file(fifo)
        refused.append(str(e.value))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # blocked in a blocking open: a writer releases it before the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert refused == ["03_x.ipynb is a named pipe (FIFO), not a regular file"]


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
        return execution.Outcome(path.stem, "ok", 1.0)

    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert run(folder=tmp_path / "nbs", out=tmp_path / "out") == 0
    monkeypatch.undo()
    return stdout.getvalue()


@pytest.mark.slow
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
