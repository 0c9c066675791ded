"""`grade --format canvas|gradescope|moodle --roster FILE`: each LMS's import file, field by field.

Each SAMPLE below is written from that LMS's documentation of its import (the header, the
"Points Possible" row, one row per student) and compared cell by cell with what the grader
writes. Rosters are each LMS's own export of its students: Canvas's exported gradebook,
Gradescope's roster, Moodle's plain-text grade export.
"""

import csv
import io
import subprocess
import sys

import pytest
from test_quickcheck import RIGHT, SID, WRONG_ANSWERS, submission, write

from helpers.quickcheck.grading import grade
from helpers.quickcheck.roster import RosterError, read_roster

# Canvas: Grades > Export; its "Points Possible" row, one existing assignment "Homework 1 (1101)"
CANVAS_ROSTER = (
    "Student,ID,SIS User ID,SIS Login ID,Section,Homework 1 (1101)\n"
    "    Points Possible,,,,,10\n"
    '"Doe, Jane",2201,S-042,s-042,Section 1,9\n'
    '"Roe, Rick",2202,S-077,rroe,Section 2,7\n'
)
CANVAS_SAMPLE = (
    "Student,ID,SIS User ID,SIS Login ID,Section,Quick checks 00\n"
    "Points Possible,,,,,4\n"
    '"Doe, Jane",2201,S-042,s-042,Section 1,4\n'
    '"Roe, Rick",2202,S-077,rroe,Section 2,\n'
)
# Gradescope: Roster > Download Roster (Name, Email, SID, Role)
GRADESCOPE_ROSTER = "Name,Email,SID,Role\nJane Doe,jdoe@uni.edu,S-042,Student\nRick Roe,rroe@uni.edu,S-077,Student\n"
GRADESCOPE_SAMPLE = (
    "Name,SID,Email,Total Score,Max Points,q00_1,q00_2,q00_3,q00_4\n"
    "Jane Doe,S-042,jdoe@uni.edu,4,4,1,1,1,1\n"
    "Rick Roe,S-077,rroe@uni.edu,,4,,,,\n"
)
# Moodle: Grades > Export > Plain text file
MOODLE_ROSTER = (
    "First name,Last name,ID number,Institution,Department,Email address,Assignment: Essay (Real)\n"
    "Jane,Doe,S-042,Uni,CS,jdoe@uni.edu,-\n"
    "Rick,Roe,S-077,Uni,CS,rroe@uni.edu,-\n"
)
MOODLE_SAMPLE = (
    "First name,Last name,ID number,Institution,Department,Email address,Quick checks 00,"
    "Quick checks 00: q00_1,Quick checks 00: q00_2,Quick checks 00: q00_3,Quick checks 00: q00_4\n"
    "Jane,Doe,S-042,Uni,CS,jdoe@uni.edu,4,1,1,1,1\n"
    "Rick,Roe,S-077,Uni,CS,rroe@uni.edu,,,,,\n"
)


def rows(text):
    return list(csv.reader(io.StringIO(text)))


@pytest.fixture
def subs(tmp_path):
    """Jane (id in another case) right; a stranger not on the roster; a file that is not a notebook."""
    folder = tmp_path / "subs"
    write(folder, "jane.ipynb", submission(RIGHT, student_id=SID.upper()))
    write(folder, "stranger.ipynb", submission(WRONG_ANSWERS, student_id="zz-999"))
    write(folder, "broken.ipynb", "oops")
    return folder


@pytest.mark.parametrize(
    "fmt, roster_text, sample, key",
    [
        ("canvas", CANVAS_ROSTER, CANVAS_SAMPLE, None),
        ("gradescope", GRADESCOPE_ROSTER, GRADESCOPE_SAMPLE, None),
        ("moodle", MOODLE_ROSTER, MOODLE_SAMPLE, None),
    ],
)
def test_each_format_matches_its_documented_sample_field_by_field(tmp_path, subs, fmt, roster_text, sample, key):
    roster = write(tmp_path, f"{fmt}_roster.csv", roster_text)
    run = grade([subs], tmp_path / "import.csv", roster=read_roster(roster, fmt, key))
    got, want = rows(run.csv_path.read_text(encoding="utf-8")), rows(sample)
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want):
        assert got_row == want_row
    report = run.report_path.read_text()
    assert "### No submission (blank in the import file: enter 0 or an excuse in the LMS) (1)" in report
    assert "Roe" in report.split("## Roster")[1]
    assert "`zz-999` in" in report and "stranger.ipynb" in report  # not on the roster: kept, never dropped
    assert "broken.ipynb" in report.split("## Roster")[1]
    # every file still has its row in the plain gradebook beside the import file
    every = {r["file"].rsplit("/", 1)[-1]: r for r in csv.DictReader(open(tmp_path / "import_all.csv"))}
    assert set(every) == {"jane.ipynb", "stranger.ipynb", "broken.ipynb"}


def test_the_roster_key_is_the_instructors_choice_and_matches_ignoring_case(tmp_path, subs):
    roster = write(tmp_path, "r.csv", GRADESCOPE_ROSTER.replace("S-042", "s-042 "))
    run = grade([subs], tmp_path / "gs.csv", roster=read_roster(roster, "gradescope", "sid"))
    assert run.roster_check.matched[0][0]["Name"] == "Jane Doe"
    by_email = write(tmp_path, "e.csv", GRADESCOPE_ROSTER.replace("jdoe@uni.edu", SID))
    run = grade([subs], tmp_path / "gs2.csv", roster=read_roster(by_email, "gradescope", "Email"))
    assert [s["Name"] for s, _ in run.roster_check.matched] == ["Jane Doe"]


def test_several_submissions_for_one_student_keep_the_best_and_say_so(tmp_path, subs):
    write(subs, "jane_again.ipynb", submission(WRONG_ANSWERS, student_id=SID))
    roster = write(tmp_path, "c.csv", CANVAS_ROSTER)
    run = grade([subs], tmp_path / "c_out.csv", roster=read_roster(roster, "canvas"))
    assert rows(run.csv_path.read_text())[2][5] == "4"
    report = run.report_path.read_text()
    assert "### Several submissions for one student and notebook (the highest total was written) (1)" in report


def test_hostile_roster_strings_are_escaped_in_the_file_and_the_report(tmp_path, subs):
    hostile = (
        "Student,ID,SIS User ID,SIS Login ID,Section\n"
        '"=HYPERLINK(""http://x"")",1,S1,s-042,"A\u202eB"\n'
        '"Line\nbreak",2,S2,other,"@SUM(1)"\n'
    )
    roster = write(tmp_path, "h.csv", hostile)
    run = grade([subs], tmp_path / "h_out.csv", roster=read_roster(roster, "canvas"))
    text = run.csv_path.read_text(encoding="utf-8")
    assert len(text.splitlines()) == 4  # header, points, two students: nothing spans two lines
    got = rows(text)
    assert got[2][0] == '\'=HYPERLINK("http://x")' and got[2][4] == "A\\u202eB"
    assert got[3][0] == "Line\\nbreak" and got[3][4] == "'@SUM(1)"
    report = run.report_path.read_text()
    assert "\u202e" not in report and "Line\\nbreak" in report


@pytest.mark.parametrize(
    "fmt, text, key, message",
    [
        ("canvas", "Name,Email\nJane,j@x\n", None, "has no 'Student' column, which a canvas import needs"),
        ("moodle", "Email address,Name\nj@x,Jane\n", None, "no column 'ID number' to match student_id against"),
        ("gradescope", GRADESCOPE_ROSTER + "Jane Two,j2@uni.edu,s-042 ,Student\n", None, "to two students (lines 2"),
        ("csv", "", None, "is empty"),
    ],
)
def test_unusable_rosters_are_refused_with_the_fix(tmp_path, fmt, text, key, message):
    with pytest.raises(RosterError, match=message.replace("(", r"\(")):
        read_roster(write(tmp_path, "r.csv", text), fmt, key)


def run_cli(*args):
    cmd = [sys.executable, "-m", "helpers.quickcheck", "grade", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.mark.slow
def test_command_line_exit_codes_and_nothing_half_written(tmp_path, subs):
    roster = write(tmp_path, "canvas.csv", CANVAS_ROSTER)
    out = tmp_path / "out" / "import.csv"
    ok = run_cli(subs, "--out", out, "--format", "canvas", "--roster", roster)
    assert ok.returncode == 0, ok.stderr
    assert "roster: 1 matched, 1 with no submission (blank), 1 id(s) not on the roster" in ok.stdout
    assert "not on the roster: zz-999" in ok.stdout
    assert rows(out.read_text()) == rows(CANVAS_SAMPLE)

    bad_out = tmp_path / "bad" / "g.csv"
    unknown = run_cli(subs, "--out", bad_out, "--format", "blackboard", "--roster", roster)
    assert unknown.returncode == 2 and "invalid choice: 'blackboard'" in unknown.stderr
    no_roster = run_cli(subs, "--out", bad_out, "--format", "moodle")
    assert no_roster.returncode == 2 and "--format moodle needs --roster" in no_roster.stderr
    dup = write(tmp_path, "dup.csv", CANVAS_ROSTER + '"Doe, Jim",2203,S-043,S-042,Section 1,1\n')
    duplicate = run_cli(subs, "--out", bad_out, "--format", "canvas", "--roster", dup)
    assert duplicate.returncode == 2 and "to two students" in duplicate.stderr and "--roster-key" in duplicate.stderr
    wrong_key = run_cli(subs, "--out", bad_out, "--format", "canvas", "--roster", roster, "--roster-key", "Email")
    assert wrong_key.returncode == 2 and "--roster-key 'SIS Login ID'" in wrong_key.stderr
    over_roster = run_cli(subs, "--out", roster, "--format", "canvas", "--roster", roster)
    assert over_roster.returncode == 2 and "is the roster" in over_roster.stderr
    assert not bad_out.parent.exists()  # nothing written for a refused command
    assert roster.read_text() == CANVAS_ROSTER


def test_canvas_assignment_name_with_its_id_fills_that_assignment(tmp_path, subs):
    roster = write(tmp_path, "canvas.csv", CANVAS_ROSTER)
    run = grade([subs], tmp_path / "i.csv", roster=read_roster(roster, "canvas"), assignment="Quick checks 00 (1234)")
    assert rows(run.csv_path.read_text())[0][5] == "Quick checks 00 (1234)"
