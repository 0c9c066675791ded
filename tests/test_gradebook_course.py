"""A gradebook an instructor can trust: a whole course in one batch, stray cells, rosters, output paths.

Each test is one class of failure an instructor with a class (or a hostile file) met: a course
scored by its best notebook, a pasted cell widening everyone's points, a blank key column
dropping everyone, rosters that hang or crash, outputs half written, stale feedback.
"""

import csv
import io
import json
import os
import subprocess
import sys
import threading
import unicodedata
from pathlib import Path

import pytest
from test_quickcheck import SID, solve, submission, write, wrong

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.quickcheck.bank import bank_notebooks, load_bank
from helpers.quickcheck.grading import grade, grade_submission
from helpers.quickcheck.roster import RosterError, read_roster
from helpers.quickcheck.writing import OutputError

COURSE_POINTS = sum(q.points for nb in bank_notebooks() for q in load_bank(nb))
CANVAS = "Student,ID,SIS User ID,SIS Login ID,Section\n"
GRADESCOPE = "Name,Email,SID,Role\n"
MOODLE = "First name,Last name,ID number,Institution,Department,Email address\n"


def handout(nb: str) -> dict:
    return json.loads(next(NOTEBOOKS_DIR.glob(f"{nb}_*.ipynb")).read_text())


def answered(nb: str, student_id: str = SID, right: bool = True) -> dict:
    """Notebook `nb` as `student_id` hands it in: every question right (or every one wrong)."""
    answers = {q.id: (solve if right else wrong)(q, student_id) for q in load_bank(nb)}
    return submission(answers, student_id=student_id, base=handout(nb))


def points(nb: str) -> int:
    """The points notebook `nb`'s quick checks are worth, from the bank."""
    return sum(q.points for q in load_bank(nb))


def add_cell(nb: dict, source: str) -> dict:
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None, "source": source})
    return nb


def rows(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))


def by_header(table: list[list[str]]) -> list[dict[str, str]]:
    return [dict(zip(table[0], row)) for row in table[1:]]


# ---------------------------------------------------------------- a course graded in one batch


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Jane hands in all nine notebooks, all right; Rick hands in notebook 03, all wrong."""
    folder = tmp_path_factory.mktemp("course")
    for nb in bank_notebooks():
        write(folder, f"jane_{nb}.ipynb", answered(nb))
    write(folder, "rick_03.ipynb", answered("03", "rroe", right=False))
    return folder


ROSTERS = {
    "canvas": CANVAS + '"Doe, Jane",2201,S-042,s-042,Section 1\n"Roe, Rick",2202,S-077,rroe,Section 2\n',
    "gradescope": GRADESCOPE + "Jane Doe,jdoe@uni.edu,s-042,Student\nRick Roe,rroe@uni.edu,rroe,Student\n",
    "moodle": MOODLE + "Jane,Doe,s-042,Uni,CS,jdoe@uni.edu\nRick,Roe,rroe,Uni,CS,rroe@uni.edu\n",
}


@pytest.mark.parametrize("fmt", ["canvas", "gradescope", "moodle"])
def test_a_course_of_nine_notebooks_imports_as_the_sum_over_them(tmp_path, course, fmt):
    roster = read_roster(write(tmp_path, "roster.csv", ROSTERS[fmt]), fmt)
    run = grade([course], tmp_path / "import.csv", roster=roster, notebooks=bank_notebooks())
    table = rows(run.csv_path)
    if fmt == "canvas":  # one assignment per notebook, each with its own Points Possible
        assert table[0][5:] == [f"Quick checks {nb}" for nb in bank_notebooks()]
        assert sum(map(float, table[1][5:])) == COURSE_POINTS
        assert sum(map(float, table[2][5:])) == COURSE_POINTS  # Jane: every notebook counted
        assert table[3][5:] == ["" if nb != "03" else "0" for nb in bank_notebooks()]  # Rick: blank, not 0
    elif fmt == "gradescope":
        jane, rick = by_header(table)
        assert (float(jane["Total Score"]), float(jane["Max Points"])) == (COURSE_POINTS, COURSE_POINTS)
        assert (float(rick["Total Score"]), float(rick["Max Points"])) == (0, COURSE_POINTS)
        assert len(table[0]) == 5 + sum(len(load_bank(nb)) for nb in bank_notebooks())
    else:
        jane, rick = by_header(table)
        assert sum(float(jane[f"Quick checks {nb}"]) for nb in bank_notebooks()) == COURSE_POINTS
        assert rick["Quick checks 03"] == "0" and rick["Quick checks 04"] == ""
    report = run.report_path.read_text()
    assert "| `s-042` | " in report and f" | {COURSE_POINTS}/{COURSE_POINTS} |" in report
    assert "out of all of them" in report


def test_the_terminal_says_full_marks_only_for_the_whole_course(tmp_path, course):
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", "grade", str(course), "--out", str(tmp_path / "g.csv")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    # Jane: full marks over nine notebooks; Rick: 0 over the one he submitted for
    assert "2 students graded" in done.stdout and "1 with full marks, 1 with none" in done.stdout
    assert "course of notebooks 00, 01, 02, 03, 04, 05, 06, 07, 08" in done.stdout
    assert "out of those notebooks' points" in done.stdout  # no --notebook: the basis is said


def test_without_the_issued_list_each_student_is_out_of_what_they_submitted_for(tmp_path, course):
    roster = read_roster(write(tmp_path, "gs.csv", ROSTERS["gradescope"]), "gradescope")
    run = grade([course], tmp_path / "gs_out.csv", roster=roster)
    jane, rick = by_header(rows(run.csv_path))
    assert float(jane["Max Points"]) == COURSE_POINTS
    assert float(rick["Max Points"]) == sum(q.points for q in load_bank("03"))


# ---------------------------------------------------------------- one student's file never re-scores the class


@pytest.fixture
def class_of_03(tmp_path):
    """Ten students hand in notebook 03, all right; one of them pasted notebook 05's cells too."""
    folder = tmp_path / "subs"
    for n in range(10):
        write(folder, f"s{n}.ipynb", answered("03", f"s-{n:03d}"))
    stray = answered("03", "s-999")
    for q in load_bank("05")[:2]:  # answered right, so scoring them would show
        add_cell(stray, f"# QUICK CHECK {q.id}\nanswer_{q.id} = {solve(q, 's-999')}\ncheck('{q.id}', answer_{q.id})\n")
    write(folder, "stray.ipynb", stray)
    return folder


@pytest.mark.parametrize("notebooks", [None, ["03"]])
def test_a_pasted_cell_from_another_notebook_is_reported_not_scored(tmp_path, class_of_03, notebooks):
    roster_text = CANVAS + "".join(f"S{n},{n},S{n},s-{n:03d},A\n" for n in [*range(10), 999])
    roster = read_roster(write(tmp_path, "c.csv", roster_text), "canvas")
    run = grade([class_of_03], tmp_path / "c_out.csv", roster=roster, notebooks=notebooks)
    table = rows(run.csv_path)
    full = str(points("03"))
    assert table[0][5:] == ["Quick checks 03"] and table[1][5] == full  # Points Possible: notebook 03's only
    assert [r[5] for r in table[2:]] == [full] * 11
    stray = next(s for s in run.submissions if s.path.name == "stray.ipynb")
    assert stray.notebook == "03" and stray.foreign == ["q05_1", "q05_2"] and stray.max_points == points("03")
    report = run.report_path.read_text()
    section = report.split("## Questions from other notebooks (reported, not scored) (1)")[1].split("##")[0]
    assert "stray.ipynb" in section and "`q05_1`" in section
    every = by_header(rows(tmp_path / "c_out_all.csv"))
    assert "q05_1" not in every[0] and {r["max_points"] for r in every} == {full}


def test_a_file_as_much_of_one_notebook_as_another_goes_by_its_name_or_the_issued_list(tmp_path):
    both = answered("02")  # two notebooks of four questions each: neither outnumbers the other
    for q in load_bank("05"):
        add_cell(both, f"# QUICK CHECK {q.id}\nanswer_{q.id} = {solve(q)}\ncheck('{q.id}', answer_{q.id})\n")
    named = grade_submission(write(tmp_path, "doe_12345_05_qlora.ipynb", both))
    assert named.notebook == "05" and named.foreign == [q.id for q in load_bank("02")]
    unnamed = grade_submission(write(tmp_path, "mine.ipynb", both))
    assert unnamed.notebook == "02" and any("as many quick checks of notebook 02 as of 05" in n for n in unnamed.notes)
    issued = grade_submission(write(tmp_path, "doe_05.ipynb", both), notebooks=["02"])
    assert issued.notebook == "02" and issued.max_points == points("02")


def test_a_wrong_notebook_handed_in_adds_nothing_to_the_classmates(tmp_path):
    folder = tmp_path / "subs"
    for n in range(3):
        write(folder, f"s{n}.ipynb", answered("03", f"s-{n}"))
    write(folder, "odd.ipynb", answered("05", "s-9"))
    roster = read_roster(
        write(tmp_path, "g.csv", GRADESCOPE + "".join(f"N{n},e{n}@x,s-{n},Student\n" for n in [0, 1, 2, 9])),
        "gradescope",
    )
    run = grade([folder], tmp_path / "out.csv", roster=roster, notebooks=["03"])
    table = by_header(rows(run.csv_path))
    full = str(points("03"))
    assert [(r["Total Score"], r["Max Points"]) for r in table] == [(full, full)] * 3 + [("0", full)]
    assert all("q05_1" not in r for r in table)


def test_a_plain_assignment_name_for_several_notebooks_is_refused_and_nothing_is_written(tmp_path, course):
    roster = read_roster(write(tmp_path, "r.csv", ROSTERS["canvas"]), "canvas")
    with pytest.raises(ValueError, match=r"names one column, but this batch grades notebooks 00, 01"):
        grade([course], tmp_path / "x.csv", roster=roster, assignment="Homework (1101)")
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x_report.md").exists()
    run = grade([course], tmp_path / "y.csv", roster=roster, assignment=["03=Checkpointing (1103)"])
    header = rows(run.csv_path)[0]
    assert "Checkpointing (1103)" in header and "Quick checks 04" in header


# ---------------------------------------------------------------- rosters


@pytest.mark.parametrize(
    "text, message",
    [
        (MOODLE + "Jane,Doe,,Uni,CS,j@x\nRick,Roe,,Uni,CS,r@x\n", "is blank for all 2 students"),
        (CANVAS, "has a header but no students"),
        (CANVAS.replace(",", ";"), "has a header but no students"),  # detected as ;-separated, then refused
    ],
)
def test_a_roster_with_nobody_to_match_is_refused_with_the_fix(tmp_path, text, message):
    fmt = "moodle" if text.startswith("First") else "canvas"
    with pytest.raises(RosterError, match=message) as e:
        read_roster(write(tmp_path, "r.csv", text), fmt)
    if "blank" in message:
        assert "--roster-key 'Email address'" in str(e.value)


@pytest.mark.parametrize("sep", [";", "\t"])
def test_semicolon_tab_and_utf16_rosters_are_read(tmp_path, sep):
    text = ROSTERS["moodle"].replace(",", sep)
    for name, data in [("r.csv", text.encode()), ("excel.txt", b"\xff\xfe" + text.encode("utf-16-le"))]:
        roster = read_roster(write(tmp_path, name, data), "moodle")
        assert roster.key == "ID number" and [s["Last name"] for s in roster.students] == ["Doe", "Roe"]
    named = read_roster(write(tmp_path, "n.csv", text), "moodle", delimiter=sep)
    assert len(named.students) == 2
    with pytest.raises(RosterError, match="split at each comma"):
        read_roster(write(tmp_path, "n.csv", text), "moodle", delimiter=",")


def test_a_fifo_or_a_device_as_roster_is_refused_at_once(tmp_path):
    fifo = tmp_path / "roster.csv"
    os.mkfifo(fifo)
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_refusal(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)  # bounded: a hang fails the test instead of the suite
    assert outcome == ["not a regular file"]
    assert _refusal(Path("/dev/zero")) == "not a regular file"
    assert _refusal(tmp_path) == "is a folder"


def _refusal(path: Path) -> str:
    try:
        read_roster(path, "canvas")
    except RosterError as e:
        return next(m for m in ("not a regular file", "is a folder") if m in str(e))
    return "read"


def test_ids_match_across_unicode_forms_and_invisible_marks(tmp_path):
    folder = tmp_path / "subs"
    nfd = unicodedata.normalize("NFD", "josé-42")
    write(folder, "jose.ipynb", answered("00", nfd))
    write(folder, "zw.ipynb", answered("00", "\u200bs-077\ufeff"))
    roster_text = CANVAS + f"José,1,J,{unicodedata.normalize('NFC', 'JOSÉ-42')},A\nRick,2,R,S-077,A\n"
    run = grade([folder], tmp_path / "out.csv", roster=read_roster(write(tmp_path, "r.csv", roster_text), "canvas"))
    assert [r[5] for r in rows(run.csv_path)[2:]] == ["4", "4"] and not run.roster_check.unknown


def test_html_and_links_in_roster_names_never_reach_the_report_raw(tmp_path):
    folder = tmp_path / "subs"
    write(folder, "a.ipynb", answered("00", "zz-1"))  # not on the roster: the roster's students are listed
    names = ["<img src=x onerror=alert(1)>", "[click](http://evil.example)", "**bold** www.evil.example"]
    roster_text = CANVAS + "".join(f'"{name}",{n},S{n},s-{n},A\n' for n, name in enumerate(names))
    run = grade([folder], tmp_path / "o.csv", roster=read_roster(write(tmp_path, "r.csv", roster_text), "canvas"))
    report = run.report_path.read_text()
    assert "<img" not in report and "](http" not in report and "**bold**" not in report
    assert "http://" not in report and "www.evil" not in report
    assert "&lt;img src=x onerror=alert\\(1\\)\\>" in report


# ---------------------------------------------------------------- output paths and fresh feedback


def test_every_output_path_is_checked_before_anything_is_written(tmp_path):
    folder = tmp_path / "subs"
    write(folder, "a.ipynb", answered("00"))
    (tmp_path / "g_report.md").mkdir()  # the report's name taken by a folder
    with pytest.raises(OutputError, match="g_report.md is a folder"):
        grade([folder], tmp_path / "g.csv")
    assert not (tmp_path / "g.csv").exists() and not (tmp_path / "g_feedback").exists()
    (tmp_path / "h_feedback").write_text("mine")  # the feedback folder's name taken by a file
    with pytest.raises(OutputError, match="h_feedback is a file"):
        grade([folder], tmp_path / "h.csv")
    assert (tmp_path / "h_feedback").read_text() == "mine"
    with pytest.raises(OutputError, match="is a file, not a folder"):  # --out inside a file
        grade([folder], tmp_path / "h_feedback" / "deeper" / "g.csv")


def test_a_write_that_fails_halfway_leaves_the_previous_grades_whole(tmp_path, monkeypatch):
    folder = tmp_path / "subs"
    write(folder, "a.ipynb", answered("00"))
    first = grade([folder], tmp_path / "g.csv")
    before = first.csv_path.read_bytes(), first.report_path.read_bytes()
    write(folder, "b.ipynb", answered("00", "s-2"))
    real = Path.write_text

    def full_disk(self, text, *args, **kwargs):  # a fake: a disk that fills up as the report is written
        if self.name == ".g_report.md.tmp" and text:
            raise OSError(28, "No space left on device", str(self))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OutputError, match=r"No space left on device.*nothing was replaced"):
        grade([folder], tmp_path / "g.csv")
    assert (first.csv_path.read_bytes(), first.report_path.read_bytes()) == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_command_line_names_an_unwritable_out_without_a_traceback(tmp_path):
    folder = tmp_path / "subs"
    write(folder, "a.ipynb", answered("00"))
    (tmp_path / "afile").write_text("x")
    for out in [tmp_path / "afile" / "g.csv", tmp_path]:
        done = subprocess.run(
            [sys.executable, "-m", "helpers.quickcheck", "grade", str(folder), "--out", str(out)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_a_regrade_writes_feedback_fresh_and_keeps_what_the_grader_did_not_write(tmp_path):
    folder = tmp_path / "subs"
    write(folder, "ann.ipynb", answered("00", "ann"))
    write(folder, "bob.ipynb", answered("00", "bob"))
    run = grade([folder], tmp_path / "g.csv")
    (run.feedback_dir / "notes_for_me.txt").write_text("the instructor's own")
    (folder / "bob.ipynb").unlink()  # bob withdrew
    run = grade([folder], tmp_path / "g.csv")
    assert sorted(p.name for p in run.feedback_dir.iterdir()) == ["ann.txt", "notes_for_me.txt"]


# ---------------------------------------------------------------- a file of a notebook nobody handed out


@pytest.fixture
def class_with_a_stray(tmp_path):
    """Ten students hand in notebook 03; one of them also dropped notebook 05 into the folder, all right."""
    folder = tmp_path / "subs"
    for n in range(10):
        write(folder, f"s{n}.ipynb", answered("03", f"s-{n:03d}"))
    write(folder, "odd_05.ipynb", answered("05", "s-001"))
    return folder


@pytest.mark.parametrize("fmt", ["csv", "canvas", "gradescope", "moodle"])
def test_a_notebook_nobody_handed_out_adds_no_column_and_is_named_once(tmp_path, class_with_a_stray, fmt):
    roster_text = {
        "csv": "student_id\n" + "".join(f"s-{n:03d}\n" for n in range(10)),
        "canvas": CANVAS + "".join(f"S{n},{n},S{n},s-{n:03d},A\n" for n in range(10)),
        "gradescope": GRADESCOPE + "".join(f"N{n},e{n}@x,s-{n:03d},Student\n" for n in range(10)),
        "moodle": MOODLE + "".join(f"F{n},L{n},s-{n:03d},U,D,e{n}@x\n" for n in range(10)),
    }[fmt]
    roster = read_roster(write(tmp_path, "r.csv", roster_text), fmt)
    run = grade([class_with_a_stray], tmp_path / "out.csv", roster=roster)
    assert run.notebooks == ["03"], "only the handed-out notebook makes columns"
    header = " ".join(rows(run.csv_path)[0])
    assert "05" not in header and "q05" not in header
    stray = next(s for s in run.submissions if s.path.name == "odd_05.ipynb")
    assert stray.status == "not graded" and stray.questions == {} and stray.notebook == ""
    assert "notebook 05, which 1 of the batch's 10 students handed in" in stray.reason
    report = run.report_path.read_text()
    assert report.split("\n## ", 1)[1].count("odd_05.ipynb") == 1, "named once, in its section"
    section = report.split("## Not handed out, not graded (1)")[1].split("\n## ")[0]
    assert "notebook 05, handed in by 1 of the batch's 10 students: `" in section
    assert "grade again with --notebook 03 --notebook 05; if not, remove this file from the folder" in section
    assert not run.roster_check.unknown and not run.roster_check.no_id  # not "an id not on the roster"
    plain = by_header(rows(tmp_path / "out_all.csv" if fmt != "csv" else run.csv_path))
    assert [r["status"] for r in plain if r["file"].endswith("odd_05.ipynb")] == ["not graded"]
    assert "not graded" in (run.feedback_dir / "odd_05.txt").read_text()


def test_the_terminal_names_the_stray_and_the_exact_command_that_grades_it_too(tmp_path, class_with_a_stray):
    command = [sys.executable, "-m", "helpers.quickcheck", "grade", str(class_with_a_stray)]
    done = subprocess.run([*command, "--out", str(tmp_path / "g.csv")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (
        "not graded: odd_05.ipynb, a file of notebook 05, which 1 of the batch's 10 students handed in" in done.stdout
    )
    rerun = f"python -m helpers.quickcheck grade {class_with_a_stray} --out {tmp_path / 'g.csv'}"
    rerun += " --notebook 03 --notebook 05"
    assert f"if you handed out notebook 05 too, run: {rerun}" in done.stdout
    assert "course of notebooks" not in done.stdout  # one notebook graded: no course
    again = subprocess.run([sys.executable, *rerun.split()[1:]], capture_output=True, text=True)
    assert again.returncode == 0 and "course of notebooks 03, 05" in again.stdout and "not graded:" not in again.stdout


def test_with_the_issued_list_nothing_is_set_aside_and_a_whole_course_is_never_a_stray(
    tmp_path, class_with_a_stray, course
):
    issued = grade([class_with_a_stray], tmp_path / "a.csv", notebooks=["03", "05"])
    assert issued.notebooks == ["03", "05"] and not [s for s in issued.submissions if s.status == "not graded"]
    whole = grade([course], tmp_path / "b.csv")  # Jane's nine notebooks and Rick's 03: each by half the class
    assert whole.notebooks == bank_notebooks() and not whole.strays.files


# ---------------------------------------------------------------- a roster over the default bound


def test_a_roster_over_the_row_bound_is_refused_with_the_flag_that_reads_it(tmp_path):
    many = CANVAS + "".join(f"S{n},{n},S{n},s-{n},A\n" for n in range(1200))
    path = write(tmp_path, "big.csv", many)
    with pytest.raises(RosterError, match=r"over 1,000 rows.*raise the bound with --roster-max-rows 2000") as e:
        read_roster(path, "canvas", max_rows=1000)
    assert e.value.option == ("--roster-max-rows", "2000")
    assert len(read_roster(path, "canvas", max_rows=2000).students) == 1200


def test_a_roster_over_the_byte_bound_names_the_rows_that_would_read_it(tmp_path, monkeypatch):
    from helpers.quickcheck import roster as roster_module

    monkeypatch.setattr(roster_module, "MAX_ROSTER_BYTES", 4000)  # the bounds, scaled down: 4 KB, 10 rows
    wide = CANVAS + "".join(f"S{n},{n},S{n},s-{n},{'A' * 300}\n" for n in range(30))  # 10 KB in 30 rows
    path = write(tmp_path, "wide.csv", wide)
    with pytest.raises(RosterError, match=r"export only the students' columns.*--roster-max-rows 1000") as e:
        read_roster(path, "canvas", max_rows=10)
    assert e.value.option == ("--roster-max-rows", "1000")
    assert len(read_roster(path, "canvas", max_rows=1000).students) == 30


@pytest.mark.slow
def test_the_command_line_refuses_a_huge_roster_by_default_and_reads_it_with_the_flag(tmp_path):
    folder = tmp_path / "subs"
    write(folder, "a.ipynb", answered("03", "s-1"))
    roster = write(tmp_path, "big roster.csv", CANVAS + "".join(f"S{n},{n},S{n},s-{n},A\n" for n in range(50_001)))
    command = ["grade", str(folder), "--format", "canvas", "--roster", str(roster), "--out", str(tmp_path / "c.csv")]
    done = subprocess.run([sys.executable, "-m", "helpers.quickcheck", *command], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "has over 50,000 rows, the most the grader reads by default" in done.stderr
    rerun = (
        f"python -m helpers.quickcheck grade {folder} --format canvas --roster '{roster}' --out {tmp_path / 'c.csv'}"
    )
    assert f"run: {rerun} --roster-max-rows 51000" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "helpers.quickcheck", *command, "--roster-max-rows", "51000"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "roster: 1 matched, 50000 with no submission" in done.stdout
    for bad in ["0", "lots", "9999999"]:
        done = subprocess.run(
            [sys.executable, "-m", "helpers.quickcheck", *command, "--roster-max-rows", bad],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and f"argument --roster-max-rows: '{bad}' is not a number of rows" in done.stderr
