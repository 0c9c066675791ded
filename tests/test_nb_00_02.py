"""Notebooks 00 (where to get GPUs), 01 (memory anatomy) and 02 (mixed precision): what each says is what it measured.

The figure tests read the suite's one smoke run of every notebook (tests/conftest.py) and check the
direction of each claim the notebook's text makes, never a typed-in result. The shape tests read the
notebook sources: one folded cell records the figures, every notebook plots, ends with a recap and two
exercises, and speaks to a student (no maintainer words). The model tests check the embedded model the
notebooks fine-tune: pre-trained far below chance on the responses, with the fine-tuning format still
new to it.

    KIT_ONLY="00 01 02" .venv/bin/python -m pytest tests/test_nb_00_02.py   # runs only these three
"""

import ast
import math
import re

import pytest
import torch

from helpers.maintainer.notebooks import SOURCES_DIR
from helpers.models import load_model
from helpers.quickcheck.bank import load_bank

NOTEBOOKS = ("00_where_to_get_gpus", "01_memory_anatomy", "02_mixed_precision")
MAX_MARKDOWN_WORDS = 930  # the issue's ~900 words, plus the pipes of a sources table
MAINTAINER_WORDS = re.compile(r"smoke run|--smoke|the runner|embedded tiny model", re.I)


def cells(stem):
    """(kind, tags, text) per cell of a notebook source; markdown text without its '# ' prefixes."""
    parts = re.split(r"(?m)^# %%", (SOURCES_DIR / f"{stem}.py").read_text())[1:]
    out = []
    for part in parts:
        header, _, body = part.partition("\n")
        kind = "markdown" if "[markdown]" in header else "code"
        tags = re.findall(r'"(\w+)"', header)
        if kind == "markdown":
            body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
        out.append((kind, tags, body))
    return out


@pytest.fixture(scope="module")
def figures(notebook_run):
    assert notebook_run.returncode == 0, notebook_run.printed
    return {nb: notebook_run.results[nb] for nb in NOTEBOOKS}


# ---------------------------------------------------------------- shape, read from the sources


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_one_folded_record_cell_is_the_last_code_cell_and_the_recap_ends_it(stem):
    nb = cells(stem)
    recording = [i for i, (kind, _, text) in enumerate(nb) if kind == "code" and "helpers.record(" in text]
    (record,) = [i for i, (_, tags, _) in enumerate(nb) if "record" in tags]
    assert recording == [record], "every helpers.record(...) call lives in the one cell tagged record"
    assert record == max(i for i, (kind, _, _) in enumerate(nb) if kind == "code")
    assert "saves this run's figures" in nb[record - 1][2], "a one-line markdown says what the record cell is"
    recap = nb[-1][2]
    assert "In this notebook we:" in recap and "Change this, predict, run" in recap
    exercises = re.findall(r"(?m)^\d\. (.*(?:\n   .*)*)", recap.split("Change this, predict, run")[1])
    assert len(exercises) == 2
    params = next(text for _, tags, text in nb if "parameters" in tags)
    names = {t.id for node in ast.parse(params).body for t in getattr(node, "targets", [])}
    for exercise in exercises:  # each one changes a parameter of the parameters cell
        assert any(f"`{name} =" in exercise for name in names), exercise


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_a_student_reads_short_prose_in_student_words_with_a_plot_that_says_what_to_see(stem):
    nb = cells(stem)
    markdown = "\n".join(text for kind, _, text in nb if kind == "markdown")
    assert len(markdown.split()) <= MAX_MARKDOWN_WORDS
    comments = "\n".join(line for kind, _, text in nb if kind == "code" for line in text.splitlines() if "#" in line)
    assert not MAINTAINER_WORDS.search(markdown + comments), MAINTAINER_WORDS.search(markdown + comments)
    plots = [i for i, (kind, _, text) in enumerate(nb) if kind == "code" and re.search(r"plt\.show\(\)|= plot\(", text)]
    assert plots, "at least one plot"
    for i in plots:
        assert "What to see" in nb[i + 1][2], f"the markdown after the plot in cell {i} says what to see in it"


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_every_quick_check_cell_has_its_question_and_there_are_at_least_three(stem):
    asked = re.findall(r'check\("(q\d\d_\d)"', (SOURCES_DIR / f"{stem}.py").read_text())
    bank = [q.id for q in load_bank(stem[:2])]
    assert len(asked) >= 3 and asked == bank


def test_00_cites_a_source_and_a_date_for_each_way_to_get_a_gpu():
    table = next(text for _, _, text in cells(NOTEBOOKS[0]) if "## Where the GPU time comes from" in text)
    rows = [r for r in table.splitlines() if r.startswith("|") and not r.startswith("|---")][1:]
    assert len(rows) == 4
    for row in rows[:3]:  # the last row, a university cluster, points to the student's own institution
        source = row.split("|")[-2]
        assert "](https://" in source and re.search(r"\b20\d\d\b", source), row


def test_01_plan_text_names_the_plan_steps_in_the_order_of_its_table(figures):
    r = figures["01_memory_anatomy"]
    text = " ".join(next(t for _, _, t in cells(NOTEBOOKS[1]) if "`plan` starts from" in t).split())
    named = r["plan_steps"][1:] + r["plan_skipped"]
    positions = {s: text.find(s) for s in named}
    assert all(p >= 0 for p in positions.values()), positions
    taken = [positions[s] for s in r["plan_steps"][1:]]
    assert taken == sorted(taken), "the text lists the techniques in the order the table shows them"


# ---------------------------------------------------------------- figures of the smoke run


def test_00_gib_and_gb_and_what_fits_a_t4(figures):
    r = figures["00_where_to_get_gpus"]
    assert r["platform"] == "local" and r["gpu_count"] == 0 and r["precision"] == "fp32" and r["four_bit_ok"]
    for where in ("nvidia_smi", "pytorch"):  # the same bytes are more GB than GiB (10^9 < 2^30)
        assert r["t4_gb"][where] > r["t4_gib"][where]
    assert r["t4_gib"]["pytorch"] < r["t4_gib"]["nvidia_smi"] and r["budget_gib"] == r["t4_gib"]["pytorch"]
    assert r["bytes_per_param"]["bf16"] * 2 == r["bytes_per_param"]["fp32"]
    assert r["bytes_per_param"]["nf4"] * 8 == pytest.approx(r["nf4_bits_per_param"], abs=1e-3)
    full, lora, qlora = r["max_params_b"].values()
    assert full < 1 < lora and 7 < lora < qlora, "the text: full under 1B, LoRA about 8B, QLoRA past a 7B"
    assert lora / full == pytest.approx((8 + r["adamw_bytes_per_param"]) / 2, rel=0.02)  # figures rounded to 0.01


def test_00_plain_transformers_loads_the_same_model_which_sits_far_below_chance(figures):
    r = figures["00_where_to_get_gpus"]
    assert r["model"] == "embedded" and r["plain_load_same_weights"] is True
    assert r["chance_loss"] == pytest.approx(math.log(2048), abs=1e-3)
    assert r["base_loss"] < r["chance_loss"] - 1, "the pre-trained model knows the course text"


def test_01_bill_estimate_and_techniques(figures):
    r = figures["01_memory_anatomy"]
    bill = r["bill_mib"]
    for line in ("weights", "gradients", "optimizer"):  # techniques leave the per-parameter lines alone
        assert bill["fp32"][line] == bill["mixed"][line] == bill["checkpointed"][line]
    assert (
        bill["fp32"]["gradients"] == bill["fp32"]["weights"]
        and bill["fp32"]["optimizer"] >= 2 * bill["fp32"]["weights"]
    )
    a = {k: v["activations"] for k, v in bill.items()}
    assert a["checkpointed"] < a["mixed"] < a["fp32"] and a["mixed"] > a["fp32"] / 2, "trims, does not halve"
    assert r["activation_error_pct_worst"] < 1 and r["weight_error_pct"] == 0
    assert set(r["step_seconds"]) == {"bf16", "bf16 + checkpointing"} and r["checkpointing_time_ratio"] > 0


def test_01_plan_only_4_bit_weights_get_under_the_card(figures):
    r = figures["01_memory_anatomy"]
    steps, totals, fits = r["plan_steps"], r["plan_totals_gib"], r["plan_fits"]
    assert steps[0] == "as asked" and steps[1] == "mixed precision" and steps[-1] == "QLoRA"
    assert fits == [False] * (len(steps) - 1) + [True]
    assert totals[1] >= totals[0], "mixed precision does not shrink a 7B job's total"
    assert totals[steps.index("LoRA")] > r["plan_card_gib"] > totals[-1]
    assert totals[steps.index("8-bit optimizer")] < totals[steps.index("gradient checkpointing")]


def test_02_fine_tune_lowers_the_held_out_loss_with_the_plain_recipe_equal_to_the_shortcut(figures):
    r = figures["02_mixed_precision"]
    assert r["loss_after"] < r["loss_before"] < math.log(2048)
    assert len(r["train_losses"]) == 4 and all(math.isfinite(x) for x in r["train_losses"])  # the smoke run's 4 steps
    assert r["args_differ_from_shortcut"] == [] and r["trained_in"] == r["precision"]
    ratio = r["activations_mib"]["bf16"] / r["activations_mib"]["fp32"]
    assert 0.5 < ratio < 1, "16 bits shrink the activations by less than half"


@pytest.mark.parametrize("simulated", ("T4", "T4x2"))
def test_a_simulated_t4_trains_02_in_fp16_and_00_plans_for_its_memory(simulated_runs, simulated):
    run = simulated_runs[simulated]
    assert run.returncode == 0, run.printed
    r00, r02 = run.results["00_where_to_get_gpus"], run.results["02_mixed_precision"]
    assert r00["budget_gib"] == pytest.approx(r00["gpu_memory_gib"], abs=0.01)
    assert r02["trained_in"] == "fp16" and r02["args_differ_from_shortcut"] == []


# ---------------------------------------------------------------- the embedded model they fine-tune


def test_embedded_model_is_pretrained_on_the_responses_and_the_fine_tune_format_is_new_to_it():
    from helpers.data import load_course_data

    torch.manual_seed(0)
    model, tokenizer = load_model("embedded")
    rows = load_course_data().select(range(16))
    chance = math.log(len(tokenizer))

    def loss(texts):
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        with torch.no_grad():
            return model(**batch, labels=labels).loss.item()

    responses = loss(list(rows["response"]))
    formatted = loss([i + "\n" + r for i, r in zip(rows["instruction"], rows["response"])])
    assert responses < chance / 2, "pre-trained on the responses: far below chance"
    assert responses < formatted < chance, "the instruction -> response format is left for the fine-tune"
