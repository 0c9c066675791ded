"""Ids that read alike (C03, C003, c-03) are flagged without a roster, never merged; a roster keeps its say."""

import subprocess
import sys

import pytest
from test_quickcheck import solve, submission, write

from helpers.quickcheck.bank import load_bank
from helpers.quickcheck.grades import by_student
from helpers.quickcheck.grading import grade
from helpers.quickcheck.near_ids import loose_id, near_duplicates
from helpers.quickcheck.roster import read_roster


@pytest.mark.parametrize(
    ("a", "b"),
    [("C03", "C003"), ("C03", "c-03"), ("c 3", "C_0003"), ("s.042", "S42"), ("A01B002", "a1b2"), ("Ｃ０３", "c3")],
)
def test_ids_equal_after_case_separators_and_zero_padding_read_alike(a, b):
    assert loose_id(a) == loose_id(b)


@pytest.mark.parametrize(("a", "b"), [("C03", "C30"), ("C03", "C04"), ("C10", "C1"), ("s042", "s0420")])
def test_ids_that_differ_in_a_digit_do_not(a, b):
    assert loose_id(a) != loose_id(b)


def test_a_five_thousand_digit_id_is_read_as_text():
    assert loose_id("0" * 10 + "7" * 5000) == "7" * 5000  # int() of it would raise past 4,300 digits


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Notebook 00 from four files: one student as C03 and c03, maybe again as C003; another as C04."""
    root = tmp_path_factory.mktemp("near")
    for name, sid in [("a.ipynb", "C03"), ("b.ipynb", "c03"), ("c.ipynb", "C003"), ("d.ipynb", "C04")]:
        write(root / "subs", name, submission({q.id: solve(q, sid) for q in load_bank("00")}, student_id=sid))
    return root


def test_the_report_lists_them_together_and_grades_them_apart(batch, tmp_path):
    run = grade([batch / "subs"], tmp_path / "g.csv")
    groups = near_duplicates(run.submissions)
    assert [g.written() for g in groups] == [["C03 / c03", "C003"]] and groups[0].files == 3
    assert len(by_student(run.submissions)) == 3  # not merged: C03 (= c03), C003, C04
    report = run.report_path.read_text()
    section = report.split("## Near-duplicate student ids (1)")[1].split("\n## ")[0]
    assert "graded as different students, not merged" in section and "--roster" in section
    line = next(x for x in section.splitlines() if x.startswith("- "))
    assert line.startswith("- 2 students: `C03 / c03` in ") and "; `C003` in " in line
    assert all(name in line for name in ("a.ipynb", "b.ipynb", "c.ipynb")) and "d.ipynb" not in line


def test_the_terminal_lists_them_without_a_roster_and_a_roster_keeps_its_own_report(batch, tmp_path):
    cmd = [sys.executable, "-m", "helpers.quickcheck", "grade", str(batch / "subs"), "--out", str(tmp_path / "g.csv")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "near-duplicate student ids (1), graded as different students, not merged" in done.stdout
    assert "  C03 / c03 (2 files), C003 (1 file)\n" in done.stdout
    roster_file = tmp_path / "roster.csv"
    roster_file.write_text("student_id,name\nC03,Ana\nC04,Ben\n")
    run = grade([batch / "subs"], tmp_path / "r.csv", roster=read_roster(roster_file, "csv"))
    assert "Near-duplicate" not in run.report_path.read_text()
    assert [s.student_id for s in run.roster_check.unknown] == ["C003"]  # as before: not on the roster
