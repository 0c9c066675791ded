"""Notebook 01 (memory anatomy): the bill, the estimate and the plan point the way its text says.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="01"` runs only
this one) and check directions and identities between the recorded figures, never a typed-in result.
"""

import re

from notebook_results import outputs_text, source_cells

NOTEBOOKS = ("01_memory_anatomy",)


def test_01_plan_text_names_the_plan_steps_in_the_order_of_its_table(figures):
    r = figures["01_memory_anatomy"]
    text = " ".join(next(t for _, _, t in source_cells(NOTEBOOKS[0]) if "`plan` starts from" in t).split())
    named = r["plan_steps"][1:] + r["plan_skipped"]
    positions = {s: text.find(s) for s in named}
    assert all(p >= 0 for p in positions.values()), positions
    taken = [positions[s] for s in r["plan_steps"][1:]]
    assert taken == sorted(taken), "the text lists the techniques in the order the table shows them"


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


def test_01_a_hand_written_loop_holds_more_and_the_estimator_says_at_least_as_much(figures):
    held = figures["01_memory_anatomy"]["loop_held_mib"]
    assert held["measured"] > 0, "keeping `outputs` through backward holds the logits"
    # the same grid's tolerance as tests/test_estimate_allocator.py: never more than 3 % below
    assert held["predicted"] >= 0.97 * held["measured"], held


def test_01_each_plan_step_is_said_to_raise_or_lower_the_bill_as_its_estimates_do(ran):
    """The words follow the figures: "more" where a step raised the predicted total (mixed precision on a
    7B: 16-bit copies beside fp32 tensors), "less" where it lowered it."""
    figures, out = ran
    changes = figures["01_memory_anatomy"]["plan_changes_gib"]
    assert list(changes) == figures["01_memory_anatomy"]["plan_steps"][1:]
    printed = outputs_text(out / "notebooks" / "01_memory_anatomy.ipynb")
    for technique, change in changes.items():
        word = "more" if change > 0 else "less" if change < 0 else "no change"
        assert re.search(rf"^{re.escape(technique)} +[\d.]+ GiB {word} ", printed, re.M), (technique, change)
