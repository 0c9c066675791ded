"""A memory planner to play with: move a slider, see the bill, the verdict and the way to fit change.

Taught in notebook 01 (memory anatomy) and again in the capstone, notebook 08. Every figure comes
from `helpers.estimate`, and the ladder of changes that make a job fit from `helpers.plan.plan`
(the same ladder `python -m helpers plan` prints): the stacked bill of the training step and of the
loading beside the card's usable memory, the verdict, the stack the verdict assumes, what a model's
name was read as, and, when the job does not fit, the ladder. Where widgets cannot render (a
headless run, a front end without the widget manager, such as Kaggle's at times) the same call
prints all of it for its starting values, so the cell teaches anywhere.
"""

from __future__ import annotations

import io
from dataclasses import fields as dataclass_fields

from helpers._util import GIB, headless, ipython_shell
from helpers.catalog import describe_card, gpu_bytes, load_catalog, model_notes
from helpers.estimate import SAFETY_MARGIN, shape_of
from helpers.job import TrainingJob
from helpers.plan import OPTIMIZER_LABELS, assumed_stack, format_plan, plan
from helpers.sharding import fewest_cards

__all__ = ["CARD_PRECISION", "CONTROLS", "SEGMENTS", "START", "planner", "planner_figure", "planner_text"]

# the fields of helpers.job.TrainingJob the planner has a control for, in order; each control's label,
# choices and slider stops come from the field (the rest of a job keep START's or the call's values)
CONTROLS = (
    "method",
    "precision",
    "per_device_batch",
    "seq_len",
    "lora_r",
    "optimizer",
    "checkpointing",
    "fused_loss",
    "loop",
    "world_size",
    "sharding",
)
# where the planner starts unless the call says otherwise
START = dict(
    method="qlora",
    per_device_batch=4,
    seq_len=1024,
    lora_r=16,
    optimizer="adamw",
    checkpointing=True,
    fused_loss=False,
    loop="trainer",
    world_size=1,
    sharding="none",
)
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


def _plan(model, gpu, settings: dict):
    """The plan for these settings on `gpu` (a catalog card, or GiB): its first step is the job as asked,
    in the card's half precision unless another is named."""
    settings = {**START, **settings}
    if settings.get("precision") == CARD_PRECISION:
        del settings["precision"]  # plan() takes the card's
    return plan(model, gpu, **settings)


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


def _said(model, gpu, steps, shape=None) -> str:
    """What the planner says under the bill: the verdict first (with a seq_len past the model's trained
    context, `Estimate.context_note`), what the name was read as, the stack the verdict assumes, how many
    such cards the job needs (`helpers.sharding.fewest_cards`), and the ladder when it does not fit as asked."""
    asked = steps[0].estimate
    job = {f.name: asked.settings[f.name] for f in dataclass_fields(TrainingJob)}
    cards = fewest_cards(shape if shape is not None else model, gpu, **job)
    lines = [asked.verdict_line(gpu), *model_notes(model), assumed_stack(asked), f"Cards: {cards}"]
    if len(steps) > 1 or not steps[0].fits:
        lines += ["", "What makes it fit, cheapest first (each step keeps the ones above it):", format_plan(steps, gpu)]
    return "\n".join(lines)


def planner_text(model, gpu="T4", **settings) -> str:
    """The bill, the verdict, the stack it assumes and the ladder as plain text: what the planner shows, for
    any front end. `settings` as in `planner` (START unless given).

    Example:
        >>> print(planner_text("Llama-3-8B", "T4", per_device_batch=1, seq_len=2048))  # doctest: +SKIP
    """
    steps = _plan(model, gpu, settings)
    return f"{model} on {describe_card(gpu)}\n{steps[0].estimate.table()}\n{_said(model, gpu, steps)}"


def planner_figure(model, gpu="T4", **settings):
    """The stacked bill of the training step and of the loading against the card's usable memory."""
    return _figure(_plan(model, gpu, settings)[0].estimate, model, gpu)


def _figure(e, model, gpu):
    from matplotlib.figure import Figure  # not pyplot: a figure the notebook's backend does not show twice

    card = gpu_bytes(gpu) / GIB
    fig = Figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for x, loading in ((0, False), (1, True)):
        bottom = 0.0
        for name, size in _segments(e, loading).items():
            label = name if x == 0 or name == "weights" else None
            ax.bar(x, size / GIB, bottom=bottom, color=SEGMENTS[name], label=label)
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
    """Plan a fine-tune with controls: model, card, method, precision, per-device batch, sequence length,
    LoRA rank, optimizer, checkpointing, a fused loss and the loop; at each change the bill is redrawn,
    the verdict and the stack it assumes said again, and the ladder that makes the job fit listed.

    Prints all of it for the starting values first, so a front end that cannot render widgets (or a
    headless run) still shows it. `settings` are `estimate_training_memory`'s starting values (START
    unless given).

    The controls are shown with `IPython.display.display`; nothing is returned, so a notebook does
    not show them twice.

    Example:
        >>> planner("Llama-3-8B", "T4", method="qlora", seq_len=2048)  # doctest: +SKIP
    """
    start = {**START, **settings}
    print(planner_text(model, gpu, **start))
    if ipython_shell() is None or headless():  # the text above is all a script or a headless run can show
        return
    try:
        import ipywidgets as widgets
    except ImportError:  # the text above is the whole answer
        return
    _widgets(widgets, model, gpu, start)


def _controls(widgets, model, gpu, start: dict) -> dict:
    """The controls, by the setting each one sets (ipywidgets 7 and 8 alike)."""
    catalog = load_catalog("models")
    names = sorted({*catalog, *(v for e in catalog.values() for v in e.get("variants", {}))}, key=str.lower)
    cards = list(load_catalog("gpus"))
    if gpu not in cards and isinstance(gpu, str):  # a card spelled otherwise ("t4") is shown as the catalog's name
        gpu = next((c for c in cards if c.lower() == gpu.strip().lower()), gpu)
    fields = {f.name: f for f in dataclass_fields(TrainingJob)}
    return {
        # continuous_update=False: a name typed in is read once, on Enter, not at every keystroke
        "model": widgets.Combobox(
            value=model, options=names, description="model", ensure_option=False, continuous_update=False
        ),
        "gpu": widgets.Dropdown(options=cards, value=gpu if gpu in cards else cards[0], description="card"),
        **{name: _control(widgets, fields[name], start.get(name)) for name in CONTROLS},
    }


def _control(widgets, f, value):
    """One TrainingJob field's control: a checkbox, a slider over its stops, or a choice of its values."""
    meta, label = f.metadata, f.metadata.get("label", f.name)
    if isinstance(f.default, bool):
        return widgets.Checkbox(value=value, description=label)
    if "stops" in meta:  # a value between the stops (seq_len=600) becomes a stop, not a TraitError
        return widgets.SelectionSlider(options=sorted({*meta["stops"], value}), value=value, description=label)
    if f.name == "method":
        return widgets.ToggleButtons(options=meta["choices"], value=value, description=label)
    if f.name == "precision":
        return widgets.Dropdown(
            options=(CARD_PRECISION, *meta["choices"]), value=value or CARD_PRECISION, description=label
        )
    shown = list(meta.get("shown", meta["choices"]))
    if value not in shown:
        shown.append(value)
    options = [(f"{OPTIMIZER_LABELS[o]} ({o})", o) for o in shown] if f.name == "optimizer" else shown
    return widgets.Dropdown(options=options, value=value, description=label)


def _widgets(widgets, model, gpu, start: dict):
    """The controls and the output area they redraw."""
    from IPython.display import Image, clear_output, display

    controls = _controls(widgets, model, gpu, start)
    output = widgets.Output()
    shapes: dict = {}  # name -> its Shape, or why not: a Hub id is fetched once, not at every slider move

    def shape(name: str):
        if name not in shapes:
            try:
                shapes[name] = shape_of(name)
            except ValueError as error:
                shapes[name] = error
        return shapes[name]

    def redraw(_=None):
        values = {name: c.value for name, c in controls.items()}
        card, name = values.pop("gpu"), values.pop("model").strip()
        controls["lora_r"].disabled = values["method"] == "full"  # no adapters in a full fine-tune
        with output:
            clear_output(wait=True)
            try:
                read = shape(name)
                if isinstance(read, ValueError):
                    raise read
                steps = _plan(read, card, values)
            except ValueError as error:  # an unknown model, a Hub that does not answer, a bad mix
                print(f"cannot estimate this: {error}")
                return
            png = io.BytesIO()
            _figure(steps[0].estimate, name, card).savefig(png, format="png", dpi=90)
            display(Image(data=png.getvalue()))
            print(_said(name, card, steps, read))

    for control in controls.values():
        control.style.description_width = "initial"  # "per-device batch" whole, not cut to fit
        control.observe(redraw, names="value")
    redraw()
    box = widgets.VBox([*controls.values(), output])
    display(box)
    return box
