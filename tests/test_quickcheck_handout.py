"""Student versions (`python -m helpers.quickcheck student`): folded cells stay folded, the key stays out.

The kit's notebooks fold their install cell (and the cell that records the figures) under its
title: JupyterLab reads `jupyter.source_hidden`, Colab `cellView: form`. A student version keeps
exactly that, and nothing of the answer key.
"""

import copy
import json

import pytest

from helpers.maintainer.notebooks import NOTEBOOKS_DIR
from helpers.quickcheck.bank import load_bank
from helpers.quickcheck.handout import HandoutError, student_version, write_student_versions
from helpers.quickcheck.judging import judge
from helpers.quickcheck.key import KEY_MARKER, answer_key, right_answer

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


@pytest.fixture(scope="module")
def handouts(tmp_path_factory):
    """(original, student version) of every committed notebook, through the command's own writer."""
    out = tmp_path_factory.mktemp("handout")
    made = write_student_versions(NOTEBOOKS_DIR, out)
    assert [p.name for p, _ in made] == [p.name for p in NOTEBOOKS]
    return {p.stem: (json.loads(p.read_text()), json.loads((out / p.name).read_text())) for p in NOTEBOOKS}


def tagged(nb, tag):
    return [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]


@pytest.mark.parametrize("stem", [p.stem for p in NOTEBOOKS])
def test_the_install_cell_is_folded_in_the_handout_as_in_the_original(handouts, stem):
    original, handout = handouts[stem]
    (install,) = tagged(original, "install")
    (kept,) = tagged(handout, "install")
    assert install["metadata"].get("jupyter", {}).get("source_hidden") is True  # the originals fold it
    assert kept["metadata"] == install["metadata"], f"{stem}: the install cell's metadata changed in the handout"
    # every other folded cell too (the one that records the figures), cell by cell
    assert [c["metadata"] for c in handout["cells"]] == [c["metadata"] for c in original["cells"]]


def test_only_tags_and_folding_survive_from_a_cells_metadata():
    nb = copy.deepcopy(json.loads(NOTEBOOKS[0].read_text()))
    cell = tagged(nb, "install")[0]
    cell["metadata"] = {
        "tags": ["install"],
        "cellView": "form",
        "collapsed": True,
        "jupyter": {"source_hidden": True, "outputs_hidden": False, "private": "x"},
        "colab": {"id": "abc", "base_uri": "https://localhost:8080/"},
        "scrolled": True,
        "execution": {"iopub.execute_input": "2026-01-01T00:00:00Z"},
    }
    out, _ = student_version(nb, "00.ipynb")
    assert tagged(out, "install")[0]["metadata"] == {
        "tags": ["install"],
        "cellView": "form",
        "collapsed": True,
        "jupyter": {"source_hidden": True, "outputs_hidden": False},
    }


def test_a_notebook_holding_the_answer_key_is_refused_and_nothing_is_written(tmp_path):
    nb = json.loads(NOTEBOOKS[0].read_text())
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": answer_key(["00"])})
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "lesson.ipynb").write_text(json.dumps(nb))
    with pytest.raises(HandoutError, match=r"lesson.ipynb, cell \d+: holds the answer key"):
        write_student_versions(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_no_handout_holds_the_keys_answers_or_explanations(handouts):
    for stem, (_, handout) in handouts.items():
        text = json.dumps(handout, ensure_ascii=False)
        assert KEY_MARKER not in text
        for q in load_bank(stem[:2]):
            if q.personal:
                continue  # a formula, the same for every student: the notebook may well teach it
            canonical = right_answer(q)
            explanation = judge(q, canonical if q.kind == "choice" else int(canonical) / 10**q.decimals).message
            assert explanation not in text, f"{stem}: {q.id}'s explanation is in the handout"
