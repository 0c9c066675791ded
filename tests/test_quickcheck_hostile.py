"""helpers.quickcheck against the hostile and accidental files an instructor really receives.

Each test is a probe from the issue (or one added next to it), written to fail before its fix:
every file gets its row whatever it holds, no file costs more than bounded time and memory, every
string that leaves the grader is escaped, `check()` never raises for an answer, and the handout
refuses what it cannot blank instead of handing the answer out.
"""

import ast
import csv
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from test_quickcheck import RIGHT, SID, WRONG_ANSWERS, read_csv, submission, write

from helpers.quickcheck import check, reading, safe_eval, submissions
from helpers.quickcheck import checks as checks_module
from helpers.quickcheck import grading as grading_module
from helpers.quickcheck.answers import normalize
from helpers.quickcheck.bank import get_question, load_bank
from helpers.quickcheck.grading import grade, grade_submission
from helpers.quickcheck.handout import HandoutError, student_version
from helpers.quickcheck.judging import CORRECT
from helpers.quickcheck.limits import MAX_CODE_CHARS, MAX_IDS, MAX_INT_BITS, MAX_LINE_CHARS
from helpers.quickcheck.reading import Cell, scan

ROOT = Path(__file__).resolve().parents[1]


def set_line(nb, pattern, replacement):
    """Replace the first line matching `pattern` in notebook 00's cells (regex, multiline)."""
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if re.search(pattern, src, re.M):
            cell["source"] = re.sub(pattern, replacement, src, count=1, flags=re.M).splitlines(True)
            return nb
    raise AssertionError(f"no line matches {pattern}")


def add_output(nb, qid, text):
    for cell in nb["cells"]:
        if f"answer_{qid} =" in "".join(cell["source"]):
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": [text]}]
            return nb
    raise AssertionError(qid)


def assert_outputs_are_whole(run, n_files):
    """Every file has its row; the CSV, the report and each feedback file are valid UTF-8, one line per row."""
    text = run.csv_path.read_bytes().decode("utf-8")
    assert len(text.splitlines()) == n_files + 1, "a row spans several lines or is missing"
    assert len(list(csv.DictReader(text.splitlines()))) == n_files
    run.report_path.read_bytes().decode("utf-8")
    feedback = list(run.feedback_dir.iterdir())
    assert len(feedback) == n_files
    for f in feedback:
        f.name.encode("utf-8")  # a name any filesystem and zip tool can hold
        assert len(f.name.encode()) <= 200
        f.read_bytes().decode("utf-8")


# The tests below bound the WORK a hostile file costs (what is parsed, computed, read), not the
# seconds it takes: a busy machine makes any file slow, a missing bound makes it cost more work.


class ParseSpy:
    """The `ast` module as helpers.quickcheck.reading sees it, keeping every text the reader parses."""

    def __init__(self):
        self.texts: list[str] = []

    def parse(self, text, *args, **kwargs):
        self.texts.append(text)
        return ast.parse(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(ast, name)


def spy_on_parsing(monkeypatch) -> ParseSpy:
    spy = ParseSpy()
    monkeypatch.setattr(reading, "ast", spy)
    return spy


def spy_on_arithmetic(monkeypatch) -> list[tuple]:
    """The operands of every arithmetic step safe_eval takes (a huge literal must be refused before one)."""
    steps, real = [], safe_eval._arithmetic

    def arithmetic(op, left, right):
        steps.append((left, right))
        return real(op, left, right)

    monkeypatch.setattr(safe_eval, "_arithmetic", arithmetic)
    return steps


def huge(value) -> bool:
    return isinstance(value, int) and value.bit_length() > MAX_INT_BITS


def read_by_this_thread() -> int | None:
    """Bytes this thread has read through read() calls so far (Linux's rchar); None where the kernel does not say."""
    try:
        return int(re.search(r"^rchar: (\d+)$", Path("/proc/thread-self/io").read_text(), re.M).group(1))
    except (OSError, AttributeError):
        return None


# ---------------------------------------------------------------- high: the whole gradebook lost


def test_a_lone_surrogate_in_a_student_id_costs_no_row(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "alice.ipynb", submission(RIGHT))
    sneaky = submission(RIGHT, student_id="\udce9")  # the cell holds the ten ASCII characters '\udce9'
    assert any("student_id = '\\udce9'" in "".join(c["source"]) for c in sneaky["cells"])
    write(subs, "sneaky.ipynb", sneaky)
    run = grade([subs], tmp_path / "g.csv")
    assert_outputs_are_whole(run, 2)
    rows = read_csv(run.csv_path)
    assert rows["alice.ipynb"]["total"] == "4"
    assert rows["sneaky.ipynb"]["status"] == "graded" and rows["sneaky.ipynb"]["student_id"] == "\\udce9"
    assert rows["sneaky.ipynb"]["q00_1"] == "1" and rows["sneaky.ipynb"]["q00_4"] in ("0", "1")  # its own numbers


def test_a_file_name_that_is_not_utf8_costs_no_row(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "alice.ipynb", submission(RIGHT, student_id="alice"))
    name = os.fsdecode(b"Jos\xe9.ipynb")  # what unzip makes of an LMS zip without the UTF-8 flag
    try:
        write(subs, name, submission(RIGHT))
    except (OSError, UnicodeError):
        pytest.skip("this filesystem refuses names that are not UTF-8")
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", "grade", str(subs), "--out", str(tmp_path / "g.csv")],
        capture_output=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    run_rows = read_csv(tmp_path / "g.csv")
    assert run_rows["Jos\\xe9.ipynb"]["total"] == "4"
    names = sorted(p.name for p in (tmp_path / "g_feedback").iterdir())
    assert len(names) == 2 and all(n.encode("utf-8") for n in names)


def test_a_cell_of_blank_lines_is_read_in_linear_time(monkeypatch, capsys):
    blank = " \n" * 30_000  # 60 KB: the marker regex took seconds on it (quadratic)
    found = scan([Cell(1, blank + "# QUICK CHECK q00_1\nanswer_q00_1 = 'b'\n")])
    assert "q00_1" in found.markers
    # linear, as a fact about the regex rather than a duration: the spaces before a marker never
    # run past a line end, so an attempt from each line reads that line only. The quadratic
    # `^\s*#` ran from every blank line over all the blank lines after it, and matched from the first.
    (match,) = reading.MARKER.finditer(blank + "# QUICK CHECK q00_1\n")
    assert match.start() == len(blank) and "\n" not in match.group(0), "a marker's match spans blank lines"
    scans, real_scan = [], reading.scan
    monkeypatch.setattr(
        reading, "scan", lambda cells, *a: scans.append([c.source for c in cells]) or real_scan(cells, *a)
    )
    monkeypatch.setattr(checks_module, "_input_history", lambda: [blank, "answer_q00_1 = 'b'"])
    check("q00_1", "b")  # in the student's kernel, check() reads the history the same way
    assert "Quick check q00_1" in capsys.readouterr().out
    assert scans == [[blank, "answer_q00_1 = 'b'"]], "check() reads the history through the scan above"


# ---------------------------------------------------------------- medium


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_forged_receipt_with_a_huge_attempt_count_is_ignored_and_said(tmp_path, digits):
    nb = add_output(submission(RIGHT), "q00_1", f"receipt q00_1 · attempt {'9' * digits} · correct\n")
    write(tmp_path / "subs", "forged.ipynb", nb)
    write(tmp_path / "subs", "plain.ipynb", submission(RIGHT))
    run = grade([tmp_path / "subs"], tmp_path / "g.csv")
    assert_outputs_are_whole(run, 2)
    row = read_csv(run.csv_path)["forged.ipynb"]
    assert row["status"] == "graded" and row["total"] == "4" and row["attempts_q00_1"] == ""
    assert "attempt count" in run.report_path.read_text()


def test_two_long_file_names_in_different_folders_keep_their_rows_and_feedback(tmp_path):
    name = "x" * 243 + ".ipynb"  # 249 characters, as long as a filesystem allows with the folders added
    for who in ("ann", "ben"):
        write(tmp_path / "subs" / who, name, submission(RIGHT, student_id=who))
    run = grade([tmp_path / "subs"], tmp_path / "g.csv")
    assert_outputs_are_whole(run, 2)


def test_huge_integer_literals_are_refused_before_any_arithmetic(tmp_path, monkeypatch):
    parsed, steps = spy_on_parsing(monkeypatch), spy_on_arithmetic(monkeypatch)
    big = "0x" + "f" * 400_000  # a megabyte cell: refused by its size, never parsed
    nb = set_line(submission(RIGHT), r"^answer_q00_3 = .*$", f"answer_q00_3 = {big} // {big[:200_000]}")
    s = grade_submission(write(tmp_path, "hex.ipynb", nb))
    assert s.questions["q00_3"].status == "unreadable" and "too long to read" in s.questions["q00_3"].message
    assert s.questions["q00_1"].status == CORRECT
    assert parsed.texts and not any(big[:MAX_LINE_CHARS] in text for text in parsed.texts), "the literal was parsed"
    small = "0x" + "f" * 20_000  # 30 KB: parsed, and its literal refused before the division
    nb = set_line(submission(RIGHT), r"^answer_q00_3 = .*$", f"answer_q00_3 = {small} // {small[:10_000]}")
    g = grade_submission(write(tmp_path, "hex2.ipynb", nb)).questions["q00_3"]
    assert g.status == "unreadable" and "about 24,083 digits" in g.message, g.message
    assert any(small in text for text in parsed.texts), "the 30 KB cell is parsed whole"
    assert not any(huge(x) for step in steps for x in step), "arithmetic on a huge literal"


MEMORY_PROBE = """
import gc, json, sys
import psutil
from helpers._probes import read_peak_rss, reset_peak_rss
from helpers.quickcheck.grading import grade
grade([sys.argv[3]], sys.argv[2] + "/warm.csv")  # banks loaded, modules warm
gc.collect()
before = psutil.Process().memory_info().rss
# the kernel's own high-water mark, reset here: getrusage's ru_maxrss survives exec, so a child of a
# large pytest process would start from its parent's peak
assert reset_peak_rss(), "this kernel cannot reset the peak RSS"
run = grade([sys.argv[1]], sys.argv[2] + "/g.csv")
gc.collect()
after = psutil.Process().memory_info().rss
peak = read_peak_rss()
mb = 2**20
print(json.dumps({"rows": len(run.submissions), "peak_mb": (peak - before) / mb, "kept_mb": (after - before) / mb}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads and resets the peak RSS through /proc (Linux)")
def test_memory_stays_bounded_per_file_and_nothing_outlives_its_row(tmp_path):
    subs = tmp_path / "subs"
    for i in range(3):  # a 1 MB list in an answer cell: its syntax tree alone took ~450 MB and was kept
        nb = set_line(submission(RIGHT), r"^answer_q00_2 = .*$", "answer_q00_2 = [" + "0, " * (350_000 + i) + "]")
        write(subs, f"list{i}.ipynb", nb)
    write(subs, "bomb.ipynb", '{"cells": [' + ", ".join(["{}"] * 3_000_000) + "]}")  # 12 MB of empty objects
    write(subs, "strings.ipynb", '{"cells": [], "x": [' + ",".join(['"ab"'] * 5_000_000) + "]}")  # 24 MB
    write(subs, "plain.ipynb", submission(RIGHT))
    write(tmp_path / "warm", "w.ipynb", submission(RIGHT))
    done = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(subs), str(tmp_path), str(tmp_path / "warm")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.splitlines()[-1])
    assert figures["rows"] == 6
    assert figures["peak_mb"] < 250, figures
    assert figures["kept_mb"] < 60, figures


# ---------------------------------------------------------------- medium: the handout passes answers through

SECRET = "'zq-secret'"
ANSWER_FORMS = {
    "cell magic": f"%%time\nanswer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "shell line": f"!echo hi\nanswer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "if block": f"if True:\n    answer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "tuple": f"answer_q00_1, answer_q00_2 = {SECRET}, 'ac'\ncheck('q00_1', answer_q00_1)",
    "answer in the call": f"check('q00_1', {SECRET})",
    "answer keyword": f"check('q00_1', answer={SECRET})",
    "walrus": f"check('q00_1', (answer_q00_1 := {SECRET}))",
    "for target": f"for answer_q00_1 in [{SECRET}]:\n    pass\ncheck('q00_1', answer_q00_1)",
    "augmented": f"answer_q00_1 = ''\nanswer_q00_1 += {SECRET}\ncheck('q00_1', answer_q00_1)",
    "globals": f"globals()['answer_q00_1'] = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "exec": f"exec('answer_q00_1 = ' + repr({SECRET}))\ncheck('q00_1', answer_q00_1)",
    "line magic": f"%time answer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "global in a function": f"def f():\n    global answer_q00_1\n    answer_q00_1 = {SECRET}\nf()",
    "another name": f"mine = {SECRET}\ncheck('q00_1', mine)",
    "syntax error": f"answer_q00_1 = {SECRET}\nprint(\ncheck('q00_1', answer_q00_1)",
    "line separator before": f"note = 'a\u2028b'\nanswer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "form feed before": f"# page\x0c\nx = 1\x0c\nanswer_q00_1 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "chained": f"answer_q00_1 = answer_q00_2 = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "annotated": f"answer_q00_1: str = {SECRET}\ncheck('q00_1', answer_q00_1)",
    "semicolons": f"x = 1; answer_q00_1 = {SECRET}; check('q00_1', answer_q00_1)",
    "crlf": f"x = 1\r\nanswer_q00_1 = {SECRET}\r\ncheck('q00_1', answer_q00_1)",
}


@pytest.mark.parametrize("form", ANSWER_FORMS)
def test_the_handout_blanks_or_refuses_every_answer_form(form):
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["## Quick checks"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 1, "source": ANSWER_FORMS[form]},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    try:
        out, notes = student_version(nb, "lesson.ipynb")
    except HandoutError as e:
        assert "lesson.ipynb, cell 2" in str(e), str(e)
        return
    text = "".join(out["cells"][1]["source"])
    assert "zq-secret" not in text, f"{form}: the answer reached the student version:\n{text}"
    assert any("set it blank" in n for n in notes), notes


# ---------------------------------------------------------------- low


class Hostile:
    def __float__(self):
        raise RuntimeError("boom")

    def __repr__(self):
        raise RuntimeError("no repr either")


@pytest.mark.parametrize(
    "make",
    [
        lambda: __import__("numpy").array([16]),
        lambda: __import__("numpy").array([1, 2]),
        lambda: 10**400,
        lambda: 10**5000,  # its repr raises ValueError (over 4300 digits)
        lambda: "z" * 5_000_000,
        lambda: Hostile(),
        lambda: {"per_device_batch": __import__("numpy").array([1, 2]), "grad_accum_steps": 10**400},
        lambda: ["a"] * 1_000_000,
    ],
    ids=["np-1", "np-2", "10e400", "10e5000", "5MB-text", "raising", "dict-of-arrays", "1M-list"],
)
def test_check_prints_a_verdict_for_any_answer_and_never_raises(make, capsys):
    answer = make()
    for qid in ("q00_1", "q00_2", "q00_3", "q00_4", "q04_3"):
        check(qid, answer, student_id=SID)
    out = capsys.readouterr().out
    assert out.count("Quick check") == 5 and len(out) < 20_000


def test_a_symlink_never_takes_over_another_students_row(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "bob.ipynb", submission(WRONG_ANSWERS, student_id="bob"))
    write(subs, "carol.ipynb", submission(RIGHT))
    (subs / "aaa.ipynb").symlink_to(subs / "carol.ipynb")  # sorted first: it used to claim carol's row
    run = grade([subs], tmp_path / "g.csv")
    rows = read_csv(run.csv_path)
    assert rows["carol.ipynb"]["total"] == "4" and rows["carol.ipynb"]["student_id"] == SID
    assert rows["aaa.ipynb"]["status"] == "unreadable" and "link" in rows["aaa.ipynb"]["notes"]
    assert_outputs_are_whole(run, 3)


def test_one_huge_number_in_the_json_costs_no_right_answer(tmp_path):
    text = json.dumps(submission(RIGHT), indent=1)
    text = text.replace('"nbformat": 4', '"nbformat": 4, "huge": ' + "7" * 5000, 1)
    s = grade_submission(write(tmp_path, "huge.ipynb", text))
    assert s.status in ("graded", "damaged") and s.total == 4, s.reason


def test_a_syntax_error_in_the_answer_line_is_called_one(tmp_path):
    nb = set_line(submission(RIGHT), r"^answer_q00_1 = .*$", "answer_q00_1 = 'b")
    g = grade_submission(write(tmp_path, "s.ipynb", nb)).questions["q00_1"]
    assert g.status == "unreadable" and "syntax error" in g.message and "deleted" not in g.message


def test_trailing_garbage_is_not_called_cut_off(tmp_path):
    text = json.dumps(submission(RIGHT), indent=1) + "\n<<<<<<< HEAD garbage"
    s = grade_submission(write(tmp_path, "s.ipynb", text))
    assert s.total == 4
    assert not any("cut off" in n for n in s.notes) and any("after the end" in n for n in s.notes), s.notes


def test_a_huge_wrong_answer_is_not_echoed_into_the_feedback(tmp_path):
    nb = set_line(submission(RIGHT), r"^answer_q00_1 = .*$", "answer_q00_1 = '" + "z" * 5_000_000 + "'")
    write(tmp_path / "subs", "big.ipynb", nb)
    run = grade([tmp_path / "subs"], tmp_path / "g.csv")
    assert (run.feedback_dir / "big.txt").stat().st_size < 20_000
    assert run.csv_path.stat().st_size < 20_000 and run.report_path.stat().st_size < 20_000


def test_grade_refuses_to_write_over_a_submission(tmp_path):
    subs = tmp_path / "subs"
    target = write(subs, "a.ipynb", submission(RIGHT))
    before = target.read_bytes()
    with pytest.raises(ValueError, match="submission"):
        grade([subs], target)
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", "grade", str(subs), "--out", str(target)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "submission" in done.stderr
    assert target.read_bytes() == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_never_blocks_the_batch(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "good.ipynb", submission(RIGHT))
    os.mkfifo(subs / "pipe.ipynb")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "helpers.quickcheck", "grade", str(subs / "pipe.ipynb"), str(subs)]
            + ["--out", str(tmp_path / "g.csv")],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("grade blocked on a FIFO")
    assert done.returncode == 0, done.stderr
    rows = read_csv(tmp_path / "g.csv")
    assert rows["good.ipynb"]["total"] == "4" and "not a regular file" in rows["pipe.ipynb"]["notes"]


def test_the_report_says_what_an_attempt_count_can_and_cannot_prove(tmp_path):
    write(tmp_path / "subs", "a.ipynb", submission(RIGHT))
    report = grade([tmp_path / "subs"], tmp_path / "g.csv").report_path.read_text()
    assert "## What attempt counts prove" in report
    assert "can be edited" in report and "millisecond" in report


# ---------------------------------------------------------------- probes added next to the issue's


def test_control_characters_and_newlines_in_names_and_ids_stay_on_one_line(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "new\nline.ipynb", submission(RIGHT, student_id="a\nb\u202e\x00c"))
    write(subs, "tab\tand`tick`.ipynb", submission(RIGHT, student_id="=cmd|' /C calc'!A0"))
    run = grade([subs], tmp_path / "g.csv")
    assert_outputs_are_whole(run, 2)
    rows = read_csv(run.csv_path)
    assert rows["new\\nline.ipynb"]["student_id"] == "a\\nb\\u202e\\x00c"
    assert rows["tab\\tand`tick`.ipynb"]["student_id"].startswith("'=")
    report = run.report_path.read_text()
    assert all("\t" not in line and "\u202e" not in line for line in report.splitlines())


def test_a_megabyte_student_id_and_a_flood_of_markers_stay_small(tmp_path, monkeypatch):
    nb = submission(RIGHT, student_id="i" * 1_000_000)
    nb["cells"].append(
        {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "source": "".join(f"# QUICK CHECK q00_x{i}\n" for i in range(100_000)),
        }
    )
    write(tmp_path / "subs", "flood.ipynb", nb)
    parsed, scans, judged = spy_on_parsing(monkeypatch), [], []
    real_scan, real_judge = reading.scan, grading_module.judge
    monkeypatch.setattr(reading, "scan", lambda cells, *a: scans.append(real_scan(cells, *a)) or scans[-1])
    monkeypatch.setattr(grading_module, "judge", lambda q, *a: judged.append(q.id) or real_judge(q, *a))
    run = grade([tmp_path / "subs"], tmp_path / "g.csv")
    assert run.csv_path.stat().st_size < 5_000 and run.report_path.stat().st_size < 20_000
    assert read_csv(run.csv_path)["flood.ipynb"]["q00_1"] == "1"
    # bounded work: 100 000 markers keep at most MAX_IDS ids, every question is judged once (none
    # per marker), and the megabyte id's line is never parsed
    (found,) = scans
    assert 0 < len(found.markers) <= MAX_IDS
    assert sorted(judged) == sorted(q.id for q in load_bank("00")), judged[:10]
    assert not any("i" * MAX_LINE_CHARS in text for text in parsed.texts), "the megabyte id was parsed"


def test_many_broken_cells_cost_bounded_work_and_notes(tmp_path, monkeypatch):
    broken = {"cell_type": "code", "metadata": {}, "outputs": [], "source": "answer_q00_9 = (\n"}
    for n in (9_000, 50_000):  # under and over the 10 000 code cells the grader reads
        nb = submission(RIGHT)
        nb["cells"] = [dict(broken) for _ in range(n)] + nb["cells"]
        write(tmp_path / f"subs{n}", "broken.ipynb", nb)
        parsed = spy_on_parsing(monkeypatch)
        run = grade([tmp_path / f"subs{n}"], tmp_path / f"g{n}.csv")
        assert run.report_path.stat().st_size < 20_000
        row = read_csv(run.csv_path)["broken.ipynb"]
        if n < 10_000:  # the quick-check cells are read first: the junk cannot spend their budget
            assert row["q00_1"] == "1" and row["notes"].startswith("stopped reading at cell")
            # each parse spends at least 64 characters of the file's budget: the parsing stops with
            # the budget, not at the last of the 9 000 cells (two parses each: whole, then its line)
            assert 0 < len(parsed.texts) <= MAX_CODE_CHARS // 64 < 2 * n
        else:
            assert row["status"] == "unreadable" and "50,0" in row["notes"] and "code cells" in row["notes"]
            assert parsed.texts == [], "refused by its count of cells before any of them was parsed"


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "subs" / "huge.ipynb"
    path.parent.mkdir()
    with path.open("wb") as f:
        f.write(b'{"cells": [], "pad": "')
        f.truncate(300 * 2**20)  # 300 MB, sparse: nothing to read before refusing it
    grade_submission(tmp_path / "absent.ipynb")  # once, so a first call's imports are not counted below
    parsed = []
    monkeypatch.setattr(submissions, "parse_notebook", lambda data: parsed.append(len(data)) or ([], []))
    before = read_by_this_thread()
    s = grade_submission(path)
    after = read_by_this_thread()
    assert s.status == "unreadable" and "MB" in s.reason and "Clear" in s.reason, s.reason
    assert parsed == [], "the file's bytes reached the parser"
    if before is not None:  # Linux: every read() this thread made, whatever reads the file
        assert after - before < 64 * 2**10, f"{after - before:,} bytes read (the limit alone is 25 MiB)"


def test_case_and_reserved_names_get_distinct_feedback_files(tmp_path):
    subs = tmp_path / "subs"
    for name in ("Ann.ipynb", "ann.ipynb", "CON.ipynb", ".hidden_start.ipynb"[1:]):
        write(subs, name, submission(RIGHT))
    run = grade([subs], tmp_path / "g.csv")
    names = [p.name for p in run.feedback_dir.iterdir()]
    assert len({n.casefold() for n in names}) == 4 and "CON.txt" not in names


def test_the_student_command_refuses_naming_cell_line_and_form_and_writes_nothing(tmp_path):
    (tmp_path / "src").mkdir()
    good = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": "answer_q00_1 = 'b'"}]}
    bad = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": ANSWER_FORMS["if block"]}]}
    for name, nb in (("a_good.ipynb", good), ("b_bad.ipynb", bad)):
        (tmp_path / "src" / name).write_text(json.dumps({**nb, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", "student", str(tmp_path / "src"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "b_bad.ipynb, cell 1, line 2: answer_q00_1 is set inside an indented block" in done.stderr
    assert not (tmp_path / "out").exists(), "a refusal writes nothing, not even the good notebook"


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f():\n    answer_q00_1 = None  # YOUR ANSWER\n", "def f():\n    answer_q00_1 = None  # YOUR ANSWER\n"),
        ("x = 'answer_q00_1 is the first'\nprint(x)", "x = 'answer_q00_1 is the first'\nprint(x)"),
        ("ANSWER = 'b'\nanswer_q00_1 = ANSWER", "ANSWER = 'b'\nanswer_q00_1 = None"),
        ("answer_q00_1 = (\n    'b'\n)  # done", "answer_q00_1 = (\n    None\n)  # done"),
        ("%%capture out\nanswer_q00_1 = 'b'", "%%capture out\nanswer_q00_1 = None"),
        ("answer_q00_1 = 'é' ; student_id = 'ü'", 'answer_q00_1 = None ; student_id = ""'),
    ],
)
def test_forms_the_handout_can_blank_for_sure_are_blanked_not_refused(source, expected):
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": source}], "metadata": {}}
    out, notes = student_version(nb, "lesson.ipynb")
    assert "".join(out["cells"][0]["source"]) == expected
    if source.startswith("ANSWER"):
        assert any("answer_q00_1 (from ANSWER) was computed" in n for n in notes), notes


def test_links_to_folders_are_not_followed_and_named_links_are(tmp_path):
    subs = tmp_path / "subs"
    write(subs, "a.ipynb", submission(RIGHT))
    (subs / "loop").symlink_to(subs)  # a folder that contains itself
    (tmp_path / "named.ipynb").symlink_to(subs / "a.ipynb")
    run = grade([subs, tmp_path / "named.ipynb"], tmp_path / "g.csv")
    assert len(run.submissions) == 1  # the named link is the same file as a.ipynb
    assert any("link to a folder" in why for _, why in run.skipped)


def test_escaping_keeps_every_string_printable_bounded_and_valid_utf8():
    from helpers.quickcheck.escaping import csv_cell, feedback_names, md_code, shown, shown_path, shown_value

    assert shown("a\nb\t\udce9\u202e\x00") == "a\\nb\\t\\udce9\\u202e\\x00"
    assert shown_path(os.fsdecode(b"Jos\xe9.ipynb")) == "Jos\\xe9.ipynb"
    assert shown("x" * 1000, 10) == "xxxxxxxxxx… (990 more characters)"
    assert csv_cell("=1+1") == "'=1+1" and csv_cell("-2") == "'-2" and md_code("a`b") == "`a\\x60b`"
    assert shown_value(10**5000) == "an integer of about 5,001 digits" and shown_value(Hostile()).startswith("<Hostile")
    names = feedback_names([Path("a/x.ipynb"), Path("b/X.ipynb"), Path("nul.ipynb"), Path("c/" + "é" * 200 + ".ipynb")])
    assert names[:3] == ["a__x", "b__X", "_nul"] and len(names[3].encode()) <= 100


def test_a_budget_refuses_work_past_its_characters():
    from helpers.quickcheck.limits import Budget

    budget = Budget(chars=1000)
    assert budget.can_parse_whole(900) and not budget.can_parse_whole(1001)
    assert budget.take(900) and not budget.take(200) and budget.spent
    found = scan([Cell(1, "# QUICK CHECK q00_1\nanswer_q00_1 = 'b'\n" + "x = 1\n" * 400)], Budget(chars=100))
    assert not found.complete and any("stopped reading" in n for n in found.notes)


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_a_one_element_array_or_tensor_is_its_number_whatever_numpy_runs(shape):
    """float() of a numpy array of shape (1,) is 16.0 with a warning on Colab's numpy 2.1 and a TypeError on
    numpy 2.4; torch takes any one-element tensor. The verdict is the same everywhere, with no warning."""
    number, fields = get_question("q00_3"), get_question("q04_3")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for one in (np.full(shape, 16), torch.full(shape, 16)):
            assert normalize(number, one) == normalize(number, 16)
            assert normalize(fields, {"per_device_batch": one, "grad_accum_steps": 2})[0] == (
                '{"grad_accum_steps": 2, "per_device_batch": 16}'
            )


@pytest.mark.parametrize(
    "make",
    [lambda: np.array([16, 16]), lambda: torch.zeros(2), lambda: np.array([]), lambda: np.array(["16"])],
    ids=["np-2", "torch-2", "np-empty", "np-text"],
)
def test_an_array_of_several_or_of_text_is_not_one_number(make):
    with pytest.raises(ValueError, match=r"answer_q00_3 is (ndarray|Tensor) .*which is not one number"):
        normalize(get_question("q00_3"), make())
    with pytest.raises(ValueError, match=r"answer_q04_3\['per_device_batch'\] is \w+ .*; write a number"):
        normalize(get_question("q04_3"), {"per_device_batch": make(), "grad_accum_steps": 2})
