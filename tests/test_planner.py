"""helpers.planner: the bill with controls (notebooks 01 and 08), and the plain text it prints everywhere.

The widgets are built with the real ipywidgets and driven by setting their values, as a browser's
slider does (`make e2e` moves one in JupyterLab); the figure is matplotlib's, rendered to PNG.
"""

import io

import ipywidgets as widgets
import pytest

from helpers.estimate import estimate_training_memory
from helpers.planner import CONTROLS, SEGMENTS, _segments, _widgets, planner, planner_figure, planner_text

START = dict(method="qlora", per_device_batch=4, seq_len=1024, checkpointing=True, loop="trainer")


def test_the_text_is_the_estimates_bill_and_verdict_on_the_card_in_its_half_precision():
    text = planner_text("Qwen2.5-1.5B", "T4", **START)
    e = estimate_training_memory("Qwen2.5-1.5B", precision="fp16", gpu="T4", **START)  # a T4 computes in fp16
    assert e.table() in text and e.verdict_line("T4") in text
    a100 = planner_text("Qwen2.5-1.5B", "A100-40GB", **START)
    assert estimate_training_memory("Qwen2.5-1.5B", precision="bf16", gpu="A100-40GB", **START).table() in a100


def test_outside_a_notebook_it_prints_the_bill_and_shows_no_widgets(capsys):
    assert planner("SmolLM2-135M", "T4", seq_len=512) is None
    printed = capsys.readouterr().out
    assert printed.startswith("SmolLM2-135M on T4") and "which is what runs out" in printed


@pytest.mark.parametrize("settings", [START, dict(START, method="full", checkpointing=False, loop="custom")])
def test_the_stacked_segments_add_up_to_what_the_card_must_hold(settings):
    e = estimate_training_memory("Qwen2.5-1.5B", precision="fp16", gpu="T4", **settings)
    step, loading = _segments(e), _segments(e, loading=True)
    assert sum(step.values()) == e.total and sum(loading.values()) == e.load_total
    assert all(size >= 0 for size in [*step.values(), *loading.values()]) and set(step) <= set(SEGMENTS)


def test_the_figure_draws_both_bars_and_the_cards_lines():
    fig = planner_figure("Mistral-7B", "T4", **START)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["training step", "loading"]
    assert len(ax.lines) == 2 and "usable on T4: 14.75 GiB" in [t.get_text() for t in ax.get_legend().get_texts()]
    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"


def controls_of(box):
    """The planner's controls by their description, and its output area."""
    *controls, output = box.children
    return {c.description: c for c in controls}, output


def test_moving_a_control_redraws_the_bill_and_says_the_verdict_again(capsys):
    box = _widgets(widgets, "Qwen2.5-1.5B", "T4", dict(START))
    controls, _ = controls_of(box)
    assert set(controls) == {
        "model",
        "card",
        "method",
        "precision",
        "per-device batch",
        "seq_len",
        "gradient checkpointing",
        "loop",
    }
    assert controls["per-device batch"].options == CONTROLS["per_device_batch"]
    first = capsys.readouterr().out  # outside a kernel the output area prints through
    assert "fits: the training step needs" in first
    controls["per-device batch"].value = 64
    controls["seq_len"].value = 8192
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("does not fit: the training step needs"), last
    controls["card"].value = "H100-80GB"
    controls["per-device batch"].value = 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("fits")


def test_an_unknown_model_typed_in_says_why_instead_of_raising(capsys):
    box = _widgets(widgets, "Qwen2.5-1.5B", "T4", dict(START))
    controls, _ = controls_of(box)
    capsys.readouterr()
    controls["model"].value = "Mistral-9B"
    said = capsys.readouterr().out
    assert "cannot estimate this: unknown model 'Mistral-9B'" in said and "Traceback" not in said
