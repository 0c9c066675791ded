"""A memory planner to play with: move a slider, see the bill and the verdict change.

Taught in notebook 01 (memory anatomy) and again in the capstone, notebook 08. Every figure comes
from `helpers.estimate` (the same bill `python -m helpers plan` prints): the stacked bill of the
training step and of the loading beside the card's usable memory, and the verdict. Where widgets
cannot render (a headless run, a front end without the widget manager, such as Kaggle's at
times) the same call prints the bill for its starting values, so the cell teaches anywhere.
"""

from __future__ import annotations

import io

from helpers._util import GIB, ipython_shell
from helpers.catalog import card_capability, describe_card, gpu_bytes, load_catalog
from helpers.estimate import LOOPS, PRECISIONS, estimate_training_memory

__all__ = ["CARD_PRECISION", "CONTROLS", "SEGMENTS", "planner", "planner_figure", "planner_text"]

# the controls and their choices; the slider steps are the sizes people actually pick
CONTROLS = {
    "method": ("full", "lora", "qlora"),
    "precision": PRECISIONS,
    "per_device_batch": (1, 2, 4, 8, 16, 32, 64),
    "seq_len": (128, 256, 512, 1024, 2048, 4096, 8192),
    "loop": LOOPS,
}
# the bill's segments, bottom to top, and their colours (one per term family of the estimator)
SEGMENTS = {
    "weights": "#4c72b0",
    "optimizer states": "#dd8452",
    "gradients": "#55a868",
    "activations and transients": "#c44e52",
    "allocator reserve": "#8172b3",
    "CUDA context": "#937860",
}


CARD_PRECISION = "(the card's)"  # the precision control's first choice: bf16 from compute capability 8.0, else fp16


def _estimate(model, gpu, settings: dict):
    """The estimate for these settings on `gpu` (a catalog card, or GiB), in the card's half precision
    unless another is named."""
    settings = dict(settings)
    if settings.get("precision", CARD_PRECISION) == CARD_PRECISION:
        capability = card_capability(gpu)
        settings["precision"] = "bf16" if capability is None or capability >= (8, 0) else "fp16"
    return estimate_training_memory(model, gpu=gpu if isinstance(gpu, str) else None, **settings)


def _segments(e, loading: bool = False) -> dict[str, int]:
    """The bill at its peak in the segments the plot stacks, bytes; they add up to the total."""
    if loading:  # before the first step: the weights as they load, the allocator, the context
        slack = e.load_total - e.load_peak - e.cuda_context
        return {"weights": e.load_peak, "allocator reserve": slack, "CUDA context": e.cuda_context}
    at_peak = e.allocated - e.weights - e.optimizer  # gradients (when alive at the peak) and activations
    gradients = min(e.gradients, at_peak) if not e.grads_in_forward else e.gradients
    return {
        "weights": e.weights,
        "optimizer states": e.optimizer,
        "gradients": gradients,
        "activations and transients": at_peak - gradients,
        "allocator reserve": e.allocator_slack,
        "CUDA context": e.cuda_context,
    }


def planner_text(model, gpu="T4", **settings) -> str:
    """The bill and the verdict as plain text: what the planner shows, for any front end."""
    e = _estimate(model, gpu, settings)
    return f"{model} on {describe_card(gpu)}\n{e.table()}\n{e.verdict_line(gpu)}"


def planner_figure(model, gpu="T4", **settings):
    """The stacked bill of the training step and of the loading against the card's usable memory."""
    from matplotlib.figure import Figure  # not pyplot: a figure the notebook's backend does not show twice

    from helpers.estimate import SAFETY_MARGIN

    e = _estimate(model, gpu, settings)
    card = gpu_bytes(gpu) / GIB
    fig = Figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for x, loading in ((0, False), (1, True)):
        bottom = 0.0
        for name, size in _segments(e, loading).items():
            ax.bar(
                x, size / GIB, bottom=bottom, color=SEGMENTS[name], label=name if x == 0 or name == "weights" else None
            )
            bottom += size / GIB
    ax.axhline(card, color="black", label=f"usable on {gpu if isinstance(gpu, str) else 'the card'}: {card:.2f} GiB")
    margin = SAFETY_MARGIN[e.settings["method"]]
    ax.axhline(card / (1 + margin), color="black", linestyle="--", label=f"with {margin:.0%} to spare")
    ax.set_xticks([0, 1], ["training step", "loading"])
    ax.set_ylabel("GiB")
    ax.set_title(f"{model}: {e.verdict(gpu)}")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    return fig


def planner(model="Qwen2.5-1.5B", gpu="T4", **settings) -> None:
    """Plan a fine-tune with controls: model, method, precision, per-device batch, sequence length,
    checkpointing, loop and card; the bill is redrawn and the verdict said again at each change.

    Prints the bill for the starting values first, so a front end that cannot render widgets (or
    a headless run) still shows it. `settings` are `estimate_training_memory`'s starting values
    (method="qlora", per_device_batch=4, seq_len=1024, checkpointing=True, loop="trainer" unless given).

    The controls are shown with `IPython.display.display`; nothing is returned, so a notebook does
    not show them twice.

    Example:
        >>> planner("Mistral-7B", "T4", method="qlora", seq_len=512)  # doctest: +SKIP
    """
    start = dict(method="qlora", per_device_batch=4, seq_len=1024, checkpointing=True, loop="trainer")
    start.update(settings)
    print(planner_text(model, gpu, **start))
    if ipython_shell() is None:
        return
    try:
        import ipywidgets as widgets
    except ImportError:  # the bill above is the whole answer
        return
    _widgets(widgets, model, gpu, start)


def _widgets(widgets, model, gpu, start: dict):
    """The controls and the output area they redraw."""
    from IPython.display import Image, clear_output, display

    models = sorted(load_catalog("models"), key=str.lower)
    cards = list(load_catalog("gpus"))
    controls = {
        "model": widgets.Combobox(value=model, options=models, description="model", ensure_option=False),
        "gpu": widgets.Dropdown(options=cards, value=gpu if gpu in cards else cards[0], description="card"),
        "method": widgets.ToggleButtons(options=CONTROLS["method"], value=start["method"], description="method"),
        "precision": widgets.Dropdown(
            options=(CARD_PRECISION, *CONTROLS["precision"]),
            value=start.get("precision", CARD_PRECISION),
            description="precision",
        ),
        "per_device_batch": widgets.SelectionSlider(
            options=CONTROLS["per_device_batch"], value=start["per_device_batch"], description="per-device batch"
        ),
        "seq_len": widgets.SelectionSlider(options=CONTROLS["seq_len"], value=start["seq_len"], description="seq_len"),
        "checkpointing": widgets.Checkbox(value=start["checkpointing"], description="gradient checkpointing"),
        "loop": widgets.Dropdown(options=CONTROLS["loop"], value=start["loop"], description="loop"),
    }
    output = widgets.Output()

    def redraw(_=None):
        values = {name: c.value for name, c in controls.items()}
        card, name = values.pop("gpu"), values.pop("model").strip()
        with output:
            clear_output(wait=True)
            try:
                e = _estimate(name, card, values)
            except ValueError as error:  # an unknown model, a Hub that does not answer, a bad mix
                print(f"cannot estimate this: {error}")
                return
            png = io.BytesIO()
            planner_figure(name, card, **values).savefig(png, format="png", dpi=90)
            display(Image(data=png.getvalue()))
            print(e.verdict_line(card))

    for control in controls.values():
        control.style.description_width = "initial"  # "per-device batch" whole, not cut to fit
        control.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([*controls.values(), output])
    display(box)
    return box
