"""Notebook 03 (gradient checkpointing), run once headless: each claim points the right way.

They read the suite's one smoke run of every notebook (tests/conftest.py; `KIT_ONLY="03"` runs only
this one). Every assertion checks a direction or an identity from the recorded figures, never a
number typed in from a run: the embedded model's weights may be trained again.
"""

from notebook_results import learned

NOTEBOOKS = ("03_gradient_checkpointing",)


def test_03_checkpointing_trades_activations_for_time(figures):
    r = figures["03_gradient_checkpointing"]
    off, on = r["activations_mib_off"], r["activations_mib_on"]
    assert r["seq_lens"] == [128, 256, 512]  # the embedded model's 512 positions cap the sweep
    assert all(a < b for a, b in zip(on, off)), "checkpointing saves activation memory at every length"
    assert off == sorted(off) and on == sorted(on), "activations grow with the sequence"
    assert r["activation_ratio_at_longest"] < 0.5 and r["activations_predicted_mib_on"] == on
    # timings on shared CPUs: recorded for the plot at every length, their size not judged
    assert len(r["step_ms_off"]) == len(r["step_ms_on"]) == len(r["seq_lens"])
    assert all(t > 0 for t in r["step_ms_off"] + r["step_ms_on"])
    assert r["time_ratio"] > 0 and r["time_ratio_expected"] > 1
    # the cost as work done, the same on every machine: a backward is two forwards' worth of matrix
    # products, and checkpointing recomputes every layer but not the head: less than one more forward
    forwards = r["step_forwards"]
    assert forwards["off"] == 3.0 and 3.0 < forwards["on"] < 4.0
    assert r["checkpointing_work_ratio"] == round(forwards["on"] / forwards["off"], 4)


def test_03_the_t4_error_is_the_activations_and_checkpointing_fixes_it(figures):
    r = figures["03_gradient_checkpointing"]
    assert r["t4_fits_off"] is False and r["t4_fits_on"] is True and r["t4_total_gib_on"] < r["t4_total_gib_off"]
    assert r["audit_codes"] == ["checkpointing_off"]
    assert r["oom_without_checkpointing"] is True and r["fits_with_checkpointing"] is True


def test_03_plain_training_arguments_equal_the_shortcut_and_the_model_learns(figures):
    r = figures["03_gradient_checkpointing"]
    assert r["args_differ_from_shortcut"] == []
    learned(r, steps=20)
    assert r["live_readout_steps"] == len(r["train_losses"]), "the live readout followed every step"


def test_03_a_runs_order_of_lengths_reserves_past_one_step_unless_segments_expand(figures):
    r = figures["03_gradient_checkpointing"]
    assert r["run_one_step_verdict"] == "fits"
    assert r["run_verdicts"]["expandable"] == "fits" and r["run_verdicts"]["default"] in ("borderline", "does not fit")
    history, reserved = r["run_history_gib"], r["run_reserved_gib"]
    assert history["default"] > 1 > history["expandable"], "the default allocator strands gigabytes, expandable not"
    assert reserved["default"] > r["run_one_step_reserved_gib"] > reserved["expandable"]
    assert r["course_run_reserved_mib"] is None, "no CUDA allocator to read on a CPU: nothing measured, nothing shown"
