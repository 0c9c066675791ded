"""helpers.maintainer.times: each notebook's **Time:** line comes from the runner's measured seconds.

`python -m helpers notebooks --times SUMMARY_JSON` stamps them; these check the stamping on a copy
of two sources and of the table of machines, the range over machines, the refusals, and that every
committed notebook carries a measured CPU time with its machine and day (issue 23: no time a notebook
states is a guess; issue 32: the range over the CPUs measured, each named with its bf16 units).
"""

import json
import re
import subprocess
import sys

import pytest
from notebook_results import STEMS, notebook_cells

from helpers.maintainer.times import (
    TIME_LINE,
    TIMES_FILE,
    MachineTimes,
    cpu_clause,
    describe_cpu,
    read_times,
    stamp_times,
)

SOURCE = (
    "# %% [markdown]\n# # 0{n} · A notebook\n#\n"
    "# **Time:** about 2 minutes on a T4 (an estimate); under 30 seconds on a CPU.\n\n# %%\nx = 1\n"
)
MACHINE = r"a \d+-core [^,;]+ with (?:no bf16 units|[A-Z0-9+ -]+BF16), \d{4}-\d\d-\d\d"
MEASURED = re.compile(
    rf"^(?:\d+ s on a CPU \(measured on {MACHINE}\)\."
    rf"|\d+(?:-\d+)? s on a CPU \(measured on \d+ machines: \d+ s on {MACHINE}; \d+ s on {MACHINE}\)\.)$"
)


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
    folder, table = sources(tmp_path), tmp_path / "times.csv"
    runs = [
        {"notebook": "01_notebook", "status": "ok", "seconds": 54.4},
        {"notebook": "02_notebook", "status": "failed", "seconds": 3.0},  # a failed run times nothing
    ]
    changed = stamp_times(
        summary(tmp_path, runs), folder, machine="a 2-core Test CPU", day="2026-12-03", units=(), table=table
    )
    assert changed == [folder / "01_notebook.py"]
    first = (folder / "01_notebook.py").read_text()
    assert (
        "# **Time:** about 2 minutes on a T4 (an estimate); 54 s on a CPU (measured on a 2-core Test CPU with no "
        "bf16 units, 2026-12-03)." in first
    )
    assert first.replace(TIME_LINE.search(first).group(0), "") == SOURCE.format(n=1).replace(
        TIME_LINE.search(SOURCE.format(n=1)).group(0), ""
    )
    assert (folder / "02_notebook.py").read_text() == SOURCE.format(n=2)
    assert read_times(table) == [MachineTimes("a 2-core Test CPU", (), "2026-12-03", {"01_notebook": 54.0})]


def row(machine, units, day, **seconds):
    return MachineTimes(machine, units, day, {f"0{n[1:]}_notebook": s for n, s in seconds.items()})


def test_the_range_runs_over_the_machines_that_timed_the_notebook_and_names_both_ends():
    rows = [
        row("a 2-core AMD EPYC", ("AVX512-BF16",), "2026-12-03", n1=14.4, n2=12.0),
        row("a 2-core AMD EPYC", (), "2026-12-04", n1=73.6),  # no bf16 units: the slow end
        row("a 4-core Intel Xeon", ("AMX-BF16", "AVX512-BF16"), "2026-12-05", n1=20.0, n2=12.2),
    ]
    assert cpu_clause("01_notebook", rows) == (
        "14-74 s on a CPU (measured on 3 machines: 14 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-03; "
        "74 s on a 2-core AMD EPYC with no bf16 units, 2026-12-04)."
    )
    assert cpu_clause("02_notebook", rows) == (  # equal once rounded: one figure, both machines named
        "12 s on a CPU (measured on 2 machines: 12 s on a 2-core AMD EPYC with AVX512-BF16, 2026-12-03; "
        "12 s on a 4-core Intel Xeon with AMX-BF16 + AVX512-BF16, 2026-12-05)."
    )
    assert cpu_clause("03_notebook", rows) is None  # timed nowhere: the line is left as it is
    for stem in ("01_notebook", "02_notebook"):
        assert MEASURED.search(cpu_clause(stem, rows))
    assert MEASURED.search(cpu_clause("01_notebook", rows[:1]))


def test_a_run_replaces_its_own_machines_row_and_keeps_the_others(tmp_path):
    folder, table = sources(tmp_path), tmp_path / "times.csv"
    epyc = dict(machine="a 2-core AMD EPYC", units=(), table=table)

    def stamp(day, units=(), **seconds):
        runs = [{"notebook": f"0{n[1:]}_notebook", "status": "ok", "seconds": s} for n, s in seconds.items()]
        return stamp_times(summary(tmp_path, runs), folder, day=day, **dict(epyc, units=units))

    stamp("2026-12-03", units=("AVX512-BF16",), n1=14.0, n2=12.0)
    stamp("2026-12-04", n1=80.0, n2=20.0)  # the same name, no bf16 units: another machine, a row of its own
    stamp("2026-12-05", n1=60.0)  # that machine again, one notebook: its row takes the new figure and day
    assert [(r.bf16_units, r.day, r.seconds) for r in read_times(table)] == [
        (("AVX512-BF16",), "2026-12-03", {"01_notebook": 14.0, "02_notebook": 12.0}),
        ((), "2026-12-05", {"01_notebook": 60.0, "02_notebook": 20.0}),
    ]
    first = TIME_LINE.search((folder / "01_notebook.py").read_text())["cpu"]
    assert first.startswith("14-60 s on a CPU (measured on 2 machines: 14 s on a 2-core AMD EPYC with AVX512-BF16")
    assert "60 s on a 2-core AMD EPYC with no bf16 units, 2026-12-05" in first


def test_the_shipped_table_holds_every_notebook_and_says_which_machine_lacks_bf16_units():
    rows = read_times(TIMES_FILE)
    assert len({r.key for r in rows}) == len(rows), "one row per machine"
    assert {stem for r in rows for stem in r.seconds} == set(STEMS)
    assert any(r.bf16_units for r in rows) and any(not r.bf16_units for r in rows)
    for stem in STEMS:  # the committed Time lines are what the table gives
        assert TIME_LINE.search(notebook_cells(stem)[0].source)["cpu"] == cpu_clause(stem, rows), (
            f"{stem}: its Time line is not the table's: run `python -m helpers notebooks --times DIR/summary.json`"
        )


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
        stamp_times(path, sources(tmp_path), table=tmp_path / "times.csv")


def test_a_file_that_is_not_a_summary_and_a_source_without_the_line_say_so(tmp_path):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"notebook": "01"}))
    with pytest.raises(ValueError, match="is not a summary.json that `python -m helpers run` wrote"):
        stamp_times(bad, sources(tmp_path), table=tmp_path / "times.csv")
    folder = sources(tmp_path)
    (folder / "01_notebook.py").write_text("# %% [markdown]\n# # 01 · No time\n")
    with pytest.raises(ValueError, match=r"has no '# \*\*Time:\*\* <on a GPU>; <on a CPU>' line"):
        stamp_times(
            summary(tmp_path, [{"notebook": "01_notebook", "status": "ok", "seconds": 5.0}]),
            folder,
            table=tmp_path / "times.csv",
        )
    assert not (tmp_path / "times.csv").exists(), "a failed stamp writes no table"


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
