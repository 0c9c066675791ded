"""helpers.planner: the bill with controls (notebooks 01 and 08), and the plain text it prints everywhere.

The widgets are built with the real ipywidgets and driven by setting their values, as a browser's
slider does (`make e2e` moves one in JupyterLab); the figure is matplotlib's, rendered to PNG. The
runtime matrix runs this file under Colab's ipywidgets 7.7.1 and Kaggle's 8.1.5; the main venv has 8.
Outside a kernel the output area prints through, so what it would show is read from stdout.
"""

import io

import ipywidgets as widgets
import pytest

from helpers import planner as planner_module
from helpers.estimate import estimate_training_memory
from helpers.job import BATCHES
from helpers.plan import assumed_stack, format_plan, plan
from helpers.planner import SEGMENTS, START, _segments, _widgets, planner, planner_figure, planner_text

IMAGE = "<IPython.core.display.Image object>"  # what display(Image) prints outside IPython


def test_the_text_is_the_estimates_bill_verdict_and_stack_on_the_card_in_its_half_precision():
    text = planner_text("Qwen2.5-1.5B", "T4", **START)
    e = estimate_training_memory("Qwen2.5-1.5B", precision="fp16", gpu="T4", **START)  # a T4 computes in fp16
    assert e.table() in text and e.verdict_line("T4") in text and assumed_stack(e) in text
    assert "What makes it fit" not in text, "a job that fits gets no ladder"
    a100 = planner_text("Qwen2.5-1.5B", "A100-40GB", **START)
    assert estimate_training_memory("Qwen2.5-1.5B", precision="bf16", gpu="A100-40GB", **START).table() in a100


def test_a_job_that_does_not_fit_gets_the_ladder_plan_prints_and_what_its_name_was_read_as():
    job = dict(method="qlora", per_device_batch=1, seq_len=2048, checkpointing=True)
    text = planner_text("Llama-3-8B", "T4", **job)
    assert "\ndoes not fit: the training step needs 14.97 GiB" in text
    assert "Llama-3-8B (meta-llama/Meta-Llama-3-8B) has the shapes of the catalog's Llama-3.1-8B" in text
    assert "context 8,192 tokens (Llama-3.1-8B: 131,072)" in text
    assert format_plan(plan("Llama-3-8B", "T4", **job), "T4") in text  # one ladder, the command line's
    assert text.rstrip().splitlines()[-1].startswith("fused loss")


def test_in_a_kernel_no_front_end_shows_it_prints_and_opens_no_widget(capsys, monkeypatch):
    """HELPERS_HEADLESS (the runner's and the tests' kernels): nbclient can block on a widget cell (nbclient#312)."""
    opened = []
    monkeypatch.setattr(planner_module, "ipython_shell", lambda: object())  # stand-in: any IPython shell
    monkeypatch.setattr(planner_module, "_widgets", lambda *args: opened.append(args))  # a spy
    monkeypatch.setenv("HELPERS_HEADLESS", "1")
    planner("SmolLM2-135M", "T4", seq_len=512)
    assert not opened and capsys.readouterr().out.startswith("SmolLM2-135M on T4")
    monkeypatch.setenv("HELPERS_HEADLESS", "0")
    planner("SmolLM2-135M", "T4", seq_len=512)
    assert len(opened) == 1, "a kernel a front end shows gets the controls"


def test_outside_a_notebook_it_prints_the_bill_and_shows_no_widgets(capsys):
    assert planner("SmolLM2-135M", "T4", seq_len=512) is None
    printed = capsys.readouterr().out
    assert printed.startswith("SmolLM2-135M on T4") and "which is what runs out" in printed and "assumes: " in printed


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


def said(capsys) -> str:
    """What the output area shows after its last redraw: the text under the bill's image."""
    return capsys.readouterr().out.split(IMAGE)[-1].strip()


def test_every_control_redraws_the_verdict_the_stack_and_the_ladder(capsys):
    box = _widgets(widgets, "Qwen2.5-1.5B", "T4", dict(START))
    controls, output = controls_of(box)
    assert isinstance(output, widgets.Output) and set(controls) == {
        "model",
        "card",
        "method",
        "precision",
        "per-device batch",
        "seq_len",
        "LoRA rank",
        "optimizer",
        "gradient checkpointing",
        "fused loss (Liger, Unsloth)",
        "loop",
        "GPUs",
        "sharding",
    }
    assert controls["per-device batch"].options == BATCHES
    first = said(capsys)
    assert first.startswith("fits: the training step needs") and "\nassumes: the Hugging Face Trainer" in first
    controls["model"].value = "Llama-3-8B"  # typed in: a name the catalog reads as Llama-3.1-8B's shapes
    controls["seq_len"].value = 2048
    now = said(capsys)
    assert now.startswith("does not fit: the training step needs") and "context 8,192 tokens" in now
    assert "What makes it fit, cheapest first" in now and "\nfused loss " in now
    controls["fused loss (Liger, Unsloth)"].value = True
    now = said(capsys)
    assert "a fused linear cross-entropy (Liger's or Unsloth's)" in now and "\nfused loss " not in now
    controls["LoRA rank"].value = 64
    controls["optimizer"].value = "paged_adamw_8bit"
    now = said(capsys)
    assert "peft LoRA r=64" in now and "bitsandbytes paged AdamW 8-bit" in now
    controls["method"].value = "full"
    now = said(capsys)
    assert controls["LoRA rank"].disabled and "every weight trained" in now and "\nQLoRA " in now
    assert "Cards: Llama-3-8B, full" in now and "fully sharded" in now  # how many such cards would hold it
    one_card = float(now.split("the training step needs ")[1].split(" GiB")[0])
    controls["sharding"].value = "full"  # on one GPU: the bad mix is said, not raised
    assert "cannot estimate this: sharding='full' on one GPU splits nothing" in said(capsys)
    controls["GPUs"].value = 8
    now = said(capsys)
    assert float(now.split("the training step needs ")[1].split(" GiB")[0]) < one_card / 2  # one GPU's share
    controls["sharding"].value = "none"
    controls["GPUs"].value = 1
    controls["card"].value = "H100-80GB"
    controls["method"].value = "lora"
    assert said(capsys).startswith("fits") and not controls["LoRA rank"].disabled


def test_a_model_is_read_once_per_name_not_at_every_slider_move(capsys, monkeypatch):
    """A Hub id's config is fetched when its name is given, never again as the sliders move."""
    read = []

    def counted(model):
        read.append(model)
        return estimate_shape(model)

    estimate_shape = planner_module.shape_of
    monkeypatch.setattr(planner_module, "shape_of", counted)  # a spy: the real shape_of underneath
    box = _widgets(widgets, "Qwen2.5-1.5B", "T4", dict(START))
    controls, _ = controls_of(box)
    for value in (512, 2048, 4096):
        controls["seq_len"].value = value
    controls["model"].value = "Mistral-9B"
    controls["per-device batch"].value = 8
    assert read == ["Qwen2.5-1.5B", "Mistral-9B"]


def test_an_unknown_model_typed_in_says_why_and_the_nearest_names_instead_of_raising(capsys):
    box = _widgets(widgets, "Qwen2.5-1.5B", "T4", dict(START))
    controls, _ = controls_of(box)
    capsys.readouterr()
    controls["model"].value = "Mistral-9B"
    out = capsys.readouterr().out
    assert "cannot estimate this: unknown model 'Mistral-9B'" in out and "Traceback" not in out
    assert "the nearest are Mistral-7B" in out


def test_past_a_rotary_models_context_the_verdict_says_so_once_and_the_ladder_marks_it():
    text = planner_text("Llama-2-7B", "A100-80GB", method="full", per_device_batch=1, seq_len=16384)
    note = "seq_len 16,384 is past Llama-2-7B's trained context of 4,096 tokens: the memory is as estimated"
    verdict = next(line for line in text.splitlines() if line.startswith("does not fit: "))
    assert note in verdict and f"\n* {note}" in text and "\nas asked " in text and " no* " in text
    assert "was trained for" not in text, "the catalog's own context note is not said a second time"


def test_a_seq_len_past_a_learned_position_table_says_why_instead_of_raising(capsys):
    box = _widgets(widgets, "GPT-2", "T4", dict(START, seq_len=512, method="full"))
    controls, _ = controls_of(box)
    capsys.readouterr()
    controls["seq_len"].value = 4096
    out = capsys.readouterr().out
    assert "cannot estimate this: seq_len=4096 is past GPT-2's 1,024 learned positions" in out
    assert "pass seq_len <= 1024" in out and "Traceback" not in out
