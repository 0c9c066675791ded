"""Every Markdown table the kit writes keeps its shape, whatever a cell holds: `escaping.md_cell`.

Read back with a real CommonMark parser (markdown-it, with GitHub's table rule): a "|" in a
notebook's name, a student id, a figure's key or a wheel's reason must stay in its cell, and a
newline or a backtick must not end the row or open a code span.
"""

import importlib.util
import json
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from test_gradebook_course import answered, write

from helpers.maintainer.execution import Outcome
from helpers.maintainer.summary import write_summary
from helpers.quickcheck.escaping import md_cell, shown
from helpers.quickcheck.grading import grade
from helpers.quickcheck.key import answer_key

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["a|b", "x | y | z", "tick`s` and ``two``", "line\nbreak", "back\\|slash", "\\", "|", "<b>&amp;</b>", ""]


def tables(markdown: str) -> list[list[list[str]]]:
    """Each table in `markdown` as rows of cell texts (header first), as a GitHub-like renderer reads them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(markdown)
    found, row = [], None
    for t in tokens:
        if t.type == "table_open":
            found.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append("".join(c.content for c in t.children or []))
        elif t.type == "tr_close":
            found[-1].append(row)
            row = None
    return found


@pytest.mark.parametrize("text", HOSTILE)
def test_a_cell_keeps_its_text_and_the_row_its_cells(text):
    row = f"| {md_cell(text)} | {md_cell(text, code=True)} | end |"
    (table,) = tables(f"| a | b | c |\n|---|---|---|\n{row}\n")
    assert table[1] == [shown(text), shown(text).replace("`", "\\x60"), "end"]


def test_summary_md_keeps_four_cells_for_a_notebook_named_with_a_pipe(tmp_path):
    outcomes = [
        Outcome("03|evil`name\nrow", "ok", 1.25, {"peak|MiB": 12.5, "note`x": "a|b\nc"}),
        Outcome("04_plain", "failed", 2.0, error="boom"),
    ]
    write_summary(outcomes, tmp_path, smoke=True)
    (table,) = tables((tmp_path / "summary.md").read_text())
    assert table[0] == ["notebook", "status", "seconds", "figures"]
    assert [len(r) for r in table] == [4, 4, 4]
    assert table[1][:3] == [shown("03|evil`name\nrow"), "ok", "1.2"]
    assert table[1][3] == "peak|MiB = 12.5, note\\x60x = " + shown("a|b\nc")
    assert table[2][:2] == ["04_plain", "failed"]
    assert json.loads((tmp_path / "summary.json").read_text())[0]["notebook"] == "03|evil`name\nrow"


def test_summary_md_lists_what_the_runner_ended(tmp_path):
    ended = Outcome("05_bg", "ok", 1.0, notes=["05_bg.ipynb left 1 process running when it ended: pid 7 (sleep 600)"])
    write_summary([ended], tmp_path, smoke=True)
    text = (tmp_path / "summary.md").read_text()
    assert "## Notes" in text and "pid 7 \\(sleep 600\\)" in text


def test_the_course_table_keeps_its_columns_for_ids_with_pipes_and_backticks(tmp_path):
    folder = tmp_path / "subs"
    ids = ["a|b", "c`|`d", "e\\|f"]
    for n, sid in enumerate(ids):
        write(folder, f"s{n}_03.ipynb", answered("03", sid))
        write(folder, f"s{n}_04.ipynb", answered("04", sid))
    run = grade([folder], tmp_path / "g.csv")
    course = next(t for t in tables(run.report_path.read_text()) if t[0][0] == "student")
    assert course[0] == ["student", "03", "04", "total"]
    assert sorted(r[0] for r in course[1:]) == sorted(shown(i).replace("`", "\\x60") for i in ids)
    assert all(len(r) == 4 for r in course)


def test_the_answer_keys_table_has_a_row_per_notebook_and_the_total():
    (table, *_) = tables(answer_key(["03", "04"]))
    assert [r[0] for r in table] == ["notebook", "03", "04", "total"] and all(len(r) == 3 for r in table)


def test_the_wheel_table_keeps_three_cells_for_a_reason_with_a_pipe(tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("build_device_wheels", ROOT / "scripts" / "build_device_wheels.py")
    bdw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bdw)
    wheel = tmp_path / "alpha-1.0-py3-none-any.whl"
    wheel.write_bytes(b"x" * 100)
    monkeypatch.setattr(bdw, "tree_bytes", lambda: 0)
    bdw._table([wheel], {"alpha": ("1.0", "needed by a | b, and `c`")}, 100)
    (table,) = tables(capsys.readouterr().out)
    assert table[1] == ["alpha-1.0-py3-none-any.whl", "0.00", "needed by a | b, and `c`"]
