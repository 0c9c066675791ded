"""Time the quick-check grader on a class-sized batch of synthetic submissions, some of them hostile.

    python scripts/bench_quickcheck.py                      # 500 submissions of notebook 00, 10 % hostile
    python scripts/bench_quickcheck.py --hostile 0          # the ordinary class only
    python scripts/bench_quickcheck.py --n 2000 --keep out/ # more, and keep the files and the CSV

Each ordinary submission is notebook 00 as a student downloads it from Colab: outputs in every
code cell, one plot (a 60 KB base64 PNG, as matplotlib writes), Colab's widget state, receipts,
and answers drawn at random: right, wrong, blank, written as a computed name (unreadable), or
with the quick-check cells edited. One in twenty is damaged (cut off) and one in twenty is not a
notebook at all.

The hostile share (default 10 %) cycles through the probes of the issue and a few more
(`probes`): a lone surrogate in the id, a name that is not UTF-8, a 415 KB cell of blank lines,
a forged 400-digit attempt count, 249-character names in two folders, 3 MB of hex literals, a
5 MB list cell, a syntax error, trailing garbage, a 50 MB wrong answer, a JSON bomb, a 24 MB
flood of short strings, 20 MB of plots (an honest notebook: it must be graded), a 100 000-digit
JSON number, a link to another student's file, a FIFO, 9 000 broken cells, 60 000 tiny cells,
a flood of markers with a megabyte id, five dense 49 KB code cells, control characters in names
and ids, a 5 000-digit decimal literal.

It prints the figures the issue asks for: the batch's seconds (target: 500 in under 15 s on two
cores), every file's row (rows == files), and, grading each file alone in a forked process, the
slowest file's seconds (target <= 2 s) and the largest growth of resident memory (<= 500 MB).
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import base64
import csv
import functools
import json
import os
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.quickcheck.bank import load_bank, params_for  # noqa: E402
from helpers.quickcheck.grading import collect, grade, grade_submission  # noqa: E402
from helpers.quickcheck.judging import format_receipt, judge  # noqa: E402

NOTEBOOK = ROOT / "notebooks" / "00_where_to_get_gpus.ipynb"
MB = 2**20


def candidates(q, student_id: str) -> list[str]:
    """Answers a student might write, as source text; which are right is for the grader to find."""
    if q.kind == "choice":
        return [repr(k) for k in q.choices] + ([repr("".join(sorted(q.choices)[1:]))] if q.multiple else [])
    if q.personal:
        memory = params_for(q, student_id).get("memory_gb", 16)
        return [f"{memory} / 0.52", f"{memory * 2}", "12.5"]
    return ["16", "8", "12", "32"]


def make_submission(base: dict, i: int, rng: random.Random) -> str | bytes:
    if i % 20 == 19:
        return rng.choice([b"%PDF-1.7 not a notebook", "<html>exported page</html>", ""])
    student_id = f"s{i:05d}"
    nb = json.loads(json.dumps(base))
    nb["metadata"]["widgets"] = {
        "application/vnd.jupyter.widget-state+json": {
            "state": {f"w{k}": {"model_name": "HTMLModel", "state": {"value": "x" * 200}} for k in range(20)}
        }
    }
    plot = base64.b64encode(rng.randbytes(45_000)).decode()
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]).replace('student_id = ""', f'student_id = "{student_id}"')
        outputs = [{"output_type": "stream", "name": "stdout", "text": ["measured figure: 1.234\n"] * 40}]
        for q in load_bank("00"):
            if f"answer_{q.id} = None" in src and rng.random() < 0.9:
                answer = rng.choice(candidates(q, student_id) + (["bytes_pp"] if rng.random() < 0.1 else []))
                src = src.replace(f"answer_{q.id} = None", f"answer_{q.id} = {answer}")
                if answer != "bytes_pp":
                    verdict = judge(q, eval(answer), student_id)  # the synthetic answer is ours, not a student's
                    outputs.append(
                        {
                            "output_type": "stream",
                            "name": "stdout",
                            "text": [format_receipt(verdict, rng.randint(1, 4)) + "\n"],
                        }
                    )
        if "bytes_per_param" in src:
            outputs.append(
                {"output_type": "display_data", "metadata": {}, "data": {"image/png": plot, "text/plain": "<Figure>"}}
            )
        cell["source"], cell["outputs"] = src.splitlines(keepends=True), outputs
        cell["metadata"] = {"colab": {"base_uri": "https://localhost:8080/"}, "outputId": f"o{i}"}
    if i % 20 == 7:  # edited: the quick-check cells moved to the top
        qc = [c for c in nb["cells"] if "QUICK CHECK" in "".join(c["source"])]
        nb["cells"] = qc + [c for c in nb["cells"] if c not in qc]
    text = json.dumps(nb, indent=1)
    return text[: len(text) * 9 // 10] if i % 20 == 13 else text


# ---------------------------------------------------------------- the hostile share


def _answer(nb: dict, qid: str, text: str) -> dict:
    """Set one answer line of notebook 00 to `text` (any source text)."""
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if f"answer_{qid} = None" in src:
            cell["source"] = src.replace(f"answer_{qid} = None", f"answer_{qid} = {text}", 1)
    return nb


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source}


def _cell(nb: dict, source: str, at: int = 3) -> dict:
    nb["cells"].insert(at, _code(source))
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb)


def _plots(nb: dict, megabytes: int) -> dict:
    """Outputs of base64 PNGs, as matplotlib writes them: a heavy notebook, but an honest one."""
    png = base64.b64encode(random.Random(7).randbytes(750_000)).decode()  # 1 MB of base64
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for k in range(megabytes):
        cells[k % len(cells)].setdefault("outputs", []).append(
            {"output_type": "display_data", "metadata": {}, "data": {"image/png": png, "text/plain": "<Figure>"}}
        )
    return nb


def _receipt(nb: dict, text: str) -> dict:
    for cell in nb["cells"]:
        if "answer_q00_1 =" in "".join(cell["source"]):
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [text]}]
    return nb


def _plant(folder: Path, name: str, content: str | bytes) -> list[Path]:
    path = folder / name if isinstance(name, str) else Path(os.fsdecode(os.fsencode(folder) + b"/" + name))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    return [path]


def _plant_made(folder: Path, i: int, make) -> list[Path]:
    return _plant(folder, f"h{i:03d}.ipynb", make())


def _link(folder: Path, i: int, good: str) -> list[Path]:
    target = _plant(folder, f"h{i:03d}_target.ipynb", good)[0]
    link = folder / f"h{i:03d}_a_link.ipynb"
    link.symlink_to(target)
    return [target, link]


def _fifo(folder: Path, i: int, good: str) -> list[Path]:
    path = folder / f"h{i:03d}_pipe.ipynb"
    os.mkfifo(path)
    return [path]


def _long_names(folder: Path, i: int, good: str) -> list[Path]:
    name = f"h{i:03d}" + "x" * 239 + ".ipynb"  # 249 characters
    return _plant(folder / f"h{i:03d}_a", name, good) + _plant(folder / f"h{i:03d}_b", name, good)


def probes(good: dict) -> dict:
    """name -> function(folder, i) that writes one hostile submission and returns the paths it made.

    `good` is notebook 00 with a student id and blank answers; each probe plants its answer lines.
    """

    def fresh():
        return json.loads(json.dumps(good))

    hexa = "0x" + "f" * 1_500_000
    texts = {
        "surrogate id": lambda: _dump(_answer(fresh(), "q00_1", "'b'\nstudent_id = '\\udce9'")),
        "blank-line cell 415 KB": lambda: _dump(_cell(fresh(), " \n" * 200_000 + "  ")),
        "forged 400-digit receipt": lambda: _dump(
            _receipt(fresh(), f"receipt q00_1 · attempt {'9' * 400} · correct\n")
        ),
        "hex literals 3 MB": lambda: _dump(_answer(fresh(), "q00_3", f"{hexa} // {hexa[:900_000]}")),
        "list cell 5 MB": lambda: _dump(_answer(fresh(), "q00_2", "[" + "0, " * 1_700_000 + "]")),
        "syntax error": lambda: _dump(_answer(fresh(), "q00_1", "'b")),
        "trailing garbage": lambda: _dump(fresh()) + "\n<<<<<<< HEAD\n",
        "wrong answer 50 MB": lambda: _dump(_answer(fresh(), "q00_1", "'" + "z" * 50_000_000 + "'")),
        "JSON bomb": lambda: '{"cells": [' + ",".join(["{}"] * 7_000_000) + "]}",
        "string flood 24 MB": lambda: '{"cells": [], "x": [' + ",".join(['"ab"'] * 5_000_000) + "]}",
        "plots 20 MB (legitimate)": lambda: _dump(_plots(_answer(fresh(), "q00_1", "'b'"), 20)),
        "100000-digit JSON number": lambda: _dump(fresh()).replace(
            '"nbformat": 4', '"nbformat": 4, "n": ' + "7" * 100_000
        ),
        "9000 broken cells": lambda: _dump(
            {**fresh(), "cells": [{"cell_type": "code", "source": "answer_q00_9 = (\n"}] * 9_000 + fresh()["cells"]}
        ),
        "60000 tiny cells": lambda: _dump({**fresh(), "cells": [{"cell_type": "code", "source": "x=1"}] * 60_000}),
        "marker flood, 1 MB id": lambda: _dump(
            _cell(
                _answer(fresh(), "q00_1", "'b'\nstudent_id = '" + "i" * 1_000_000 + "'"),
                "".join(f"# QUICK CHECK q00_x{k}\n" for k in range(100_000)),
            )
        ),
        "dense code, 5 cells of 49 KB": lambda: _dump(
            {
                **fresh(),
                "cells": [_code(f"answer_q00_9 = {k}\n" + "x=[1,2];" * 6_100) for k in range(5)] + fresh()["cells"],
            }
        ),
        "control characters": lambda: _dump(_answer(fresh(), "q00_1", "'b'\nstudent_id = 'a\\nb\\u202e=c\\x00'")),
        "decimal literal 5000 digits": lambda: _dump(_answer(fresh(), "q00_3", "1" + "0" * 5000)),
    }
    made = {name: functools.partial(_plant_made, make=make) for name, make in texts.items()}
    made["name not UTF-8"] = lambda folder, i: _plant(folder, f"h{i:03d}_Jos".encode() + b"\xe9.ipynb", _dump(good))
    made["newline and tab in the name"] = lambda folder, i: _plant(folder, f"h{i:03d}_new\nline\t.ipynb", _dump(good))
    made["249-character names, two folders"] = lambda folder, i: _long_names(folder, i, _dump(good))
    made["link to another student's file"] = lambda folder, i: _link(folder, i, _dump(good))
    made["FIFO"] = lambda folder, i: _fifo(folder, i, _dump(good))
    return made


# ---------------------------------------------------------------- measuring


def in_child(work) -> tuple[float, float, object]:
    """(seconds, growth of peak resident memory in MB, what `work()` returned), run in a forked process.

    A forked child's ru_maxrss starts from its own size at the fork, so its peak is this work's alone.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        before = psutil.Process().memory_info().rss
        start = time.perf_counter()
        result = work()
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        os.write(write, json.dumps([seconds, (peak - before) / MB, result]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        seconds, grown, result = json.loads(f.read() or "[99, 99999, null]")
    os.waitpid(pid, 0)
    return seconds, max(grown, 0.0), result


def alone(path: Path) -> tuple[float, float, str]:
    """(seconds, MB of memory growth, status) of grading one file on its own."""
    return in_child(lambda: grade_submission(path).status)


def batch(subs: Path, out: Path) -> tuple[float, float, object]:
    """Grade the whole folder as the command does; (seconds, MB, [submissions, unreadable, CSV rows])."""

    def work():
        run = grade([subs], out)
        with open(run.csv_path, newline="", encoding="utf-8") as f:
            rows = len(list(csv.DictReader(f)))
        return [len(run.submissions), len(run.unreadable), rows]

    return in_child(work)


def write_class(subs: Path, n: int, hostile_share: float, rng: random.Random) -> dict[str, list[Path]]:
    """Write the batch; return the hostile probes' paths by probe name."""
    base = json.loads(NOTEBOOK.read_text())
    n_hostile = round(n * hostile_share)
    for i in range(n - n_hostile):
        content = make_submission(base, i, rng)
        path = subs / f"student_{i:05d}.ipynb"
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    blank = json.loads(json.dumps(base).replace('student_id = \\"\\"', 'student_id = \\"h-student\\"'))
    kinds = list(probes(blank).items())
    planted = {}
    for i in range(n_hostile):
        name, make = kinds[i % len(kinds)]
        planted.setdefault(name, []).extend(make(subs / "hostile", i))
    return planted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="number of submissions (default 500)")
    parser.add_argument("--hostile", type=float, default=0.10, help="share of hostile submissions (default 0.10)")
    parser.add_argument("--keep", type=Path, help="write the submissions and results here instead of a temp dir")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        subs = root / "submissions"
        subs.mkdir(parents=True, exist_ok=True)
        planted = write_class(subs, args.n, args.hostile, random.Random(0))
        files = collect([subs])[0]
        seconds, batch_peak, (graded, unreadable, rows) = batch(subs, root / "grades.csv")
        worst = {p: alone(p) for p in files}
        return report(args, files, (graded, unreadable, rows, seconds, batch_peak), worst, planted)


def report(args, files, figures, worst, planted) -> int:
    graded, unreadable, rows, seconds, batch_peak = figures
    slowest = max(worst, key=lambda p: worst[p][0])
    biggest = max(worst, key=lambda p: worst[p][1])
    print(f"probes planted ({sum(len(v) for v in planted.values())} files):")
    for name, paths in planted.items():
        measured = [p for p in paths if p in worst]
        secs = max((worst[p][0] for p in measured), default=0)
        grown = max((worst[p][1] for p in measured), default=0)
        outcome = ", ".join(sorted({worst[p][2] for p in measured}))
        print(f"  {name:36} {outcome:22} {secs:6.3f} s  {grown:6.1f} MB")
    limit = 15 * args.n / 500
    print(
        f"batch: {graded} submissions ({unreadable} unreadable) in {seconds:.2f} s "
        f"(target < {limit:.0f} s on 2 cores), peak memory +{batch_peak:.0f} MB; "
        f"rows {rows} == files {len(files)}: {rows == len(files)}\n"
        f"per file, graded alone: max {worst[slowest][0]:.3f} s ({slowest.name[:40]!r}, target <= 2 s), "
        f"max RSS growth {worst[biggest][1]:.0f} MB ({biggest.name[:40]!r}, target <= 500 MB)"
    )
    ok = seconds < limit and rows == len(files) and worst[slowest][0] <= 2 and worst[biggest][1] <= 500
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
