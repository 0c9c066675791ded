"""helpers.maintainer.times: each notebook's **Time:** line comes from the runner's measured seconds.

`python -m helpers notebooks --times SUMMARY_JSON` stamps them; these check the stamping on a copy
of two sources, the refusals, and that every committed notebook carries a measured CPU time with its
machine and day (issue 23: no time a notebook states is a guess).
"""

import json
import re
import subprocess
import sys

import pytest
from notebook_results import STEMS, notebook_cells

from helpers.maintainer.times import TIME_LINE, describe_cpu, stamp_times

SOURCE = (
    "# %% [markdown]\n# # 0{n} · A notebook\n#\n"
    "# **Time:** about 2 minutes on a T4 (an estimate); under 30 seconds on a CPU.\n\n# %%\nx = 1\n"
)
MEASURED = re.compile(r"\d+ s on a CPU \(measured on a \d+-core [^,]+, \d{4}-\d\d-\d\d\)\.$")


def sources(tmp_path):
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    for n in (1, 2):
        (folder / f"0{n}_notebook.py").write_text(SOURCE.format(n=n))
    return folder


def summary(tmp_path, runs, mode="Mode: full (falls back to the embedded model without a GPU or the Hub)."):
    path = tmp_path / "run" / "summary.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(runs))
    path.with_name("summary.md").write_text(f"# Notebook run summary\n\n{mode}\n")
    return path


def test_the_cpu_clause_is_rewritten_from_the_measured_seconds_and_the_rest_is_kept(tmp_path):
    folder = sources(tmp_path)
    runs = [
        {"notebook": "01_notebook", "status": "ok", "seconds": 54.4},
        {"notebook": "02_notebook", "status": "failed", "seconds": 3.0},  # a failed run times nothing
    ]
    changed = stamp_times(summary(tmp_path, runs), folder, machine="a 2-core Test CPU", day="2026-12-03")
    assert changed == [folder / "01_notebook.py"]
    first = (folder / "01_notebook.py").read_text()
    assert (
        "# **Time:** about 2 minutes on a T4 (an estimate); 54 s on a CPU (measured on a 2-core Test CPU, 2026-12-03)."
        in first
    )
    assert first.replace(TIME_LINE.search(first).group(0), "") == SOURCE.format(n=1).replace(
        TIME_LINE.search(SOURCE.format(n=1)).group(0), ""
    )
    assert (folder / "02_notebook.py").read_text() == SOURCE.format(n=2)


@pytest.mark.parametrize(
    "mode, message",
    [
        ("Mode: smoke (embedded tiny model).", "smoke or simulated"),
        ("**Simulated T4 on a CPU**: ...", "smoke or simulated"),
    ],
)
def test_a_smoke_or_simulated_summary_is_refused(tmp_path, mode, message):
    path = summary(tmp_path, [{"notebook": "01_notebook", "status": "ok", "seconds": 5.0}], mode)
    with pytest.raises(ValueError, match=message):
        stamp_times(path, sources(tmp_path))


def test_a_file_that_is_not_a_summary_and_a_source_without_the_line_say_so(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"notebook": "01"}))
    with pytest.raises(ValueError, match="is not a summary.json that `python -m helpers run` wrote"):
        stamp_times(bad, sources(tmp_path))
    folder = sources(tmp_path)
    (folder / "01_notebook.py").write_text("# %% [markdown]\n# # 01 · No time\n")
    with pytest.raises(ValueError, match=r"has no '# \*\*Time:\*\* <on a GPU>; <on a CPU>' line"):
        stamp_times(summary(tmp_path, [{"notebook": "01_notebook", "status": "ok", "seconds": 5.0}]), folder)


def test_the_command_line_names_a_bad_summary_without_a_traceback(tmp_path):
    bad = tmp_path / "missing.json"
    done = subprocess.run(
        [sys.executable, "-m", "helpers", "notebooks", "--times", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stderr.startswith("error:") and "Traceback" not in done.stderr


def test_describe_cpu_names_the_cores_and_the_model():
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t: fpu\n"
    assert describe_cpu(cpuinfo, cores=2) == "a 2-core AMD EPYC 9B14"
    assert describe_cpu("", cores=4) == "a 4-core CPU"


@pytest.mark.parametrize("stem", STEMS)
def test_every_notebook_states_a_measured_cpu_time_with_its_machine(stem):
    first = notebook_cells(stem)[0].source
    line = TIME_LINE.search(first)
    assert line, f"{stem}: the first cell has no '**Time:** <on a GPU>; <on a CPU>' line"
    assert MEASURED.search(line["cpu"]), (
        f"{stem}: the CPU time is not a measured one ({line['cpu']!r}): run `python -m helpers run --out DIR` on a "
        "CPU, then `python -m helpers notebooks --times DIR/summary.json`"
    )
    assert "estimate" in line["gpu"] or "measured" in line["gpu"], f"{stem}: say whether the GPU time was measured"
