"""helpers.record: what a notebook measured, saved as JSON where the runner reads it."""

import json

import pytest

import helpers
from helpers.results import load_results, results_path


@pytest.fixture
def results_env(tmp_path, monkeypatch):
    monkeypatch.setenv("HELPERS_RESULTS_DIR", str(tmp_path / "results"))
    monkeypatch.setenv("HELPERS_NOTEBOOK", "03_gradient_checkpointing")
    return tmp_path / "results" / "03_gradient_checkpointing.json"


def test_record_writes_and_merges(results_env):
    assert helpers.record("peak_mb", 12.5) is None  # silent: a notebook prints what it shows
    helpers.record("steps", 4)
    helpers.record("peak_mb", 11.0)  # a re-run cell overwrites its own key only
    assert results_path() == results_env
    assert json.loads(results_env.read_text()) == {"peak_mb": 11.0, "steps": 4}
    assert load_results(results_env) == {"peak_mb": 11.0, "steps": 4}


def test_record_keeps_nested_values(results_env):
    helpers.record("seq_len_vs_mb", {"128": [1.0, 2.0], "256": [3.5, None]})
    assert load_results(results_env)["seq_len_vs_mb"]["256"] == [3.5, None]


def test_tensor_value_gets_a_fix_and_the_file_is_untouched(results_env):
    import torch

    helpers.record("before", 1)
    with pytest.raises(TypeError, match=r"record\('loss', \.\.\.\) got Tensor.*\.item\(\)"):
        helpers.record("loss", torch.tensor(2.0))
    assert load_results(results_env) == {"before": 1}


def test_nan_is_refused(results_env):
    with pytest.raises(TypeError, match="JSON cannot hold"):
        helpers.record("loss", float("nan"))


def test_key_must_be_a_string(results_env):
    with pytest.raises(TypeError, match="non-empty string key"):
        helpers.record(3, 1.0)


def test_default_location_outside_the_runner(tmp_path, monkeypatch):
    monkeypatch.delenv("HELPERS_RESULTS_DIR", raising=False)
    monkeypatch.delenv("HELPERS_NOTEBOOK", raising=False)
    monkeypatch.chdir(tmp_path)
    helpers.record("x", 1)
    assert load_results(tmp_path / "build" / "results" / "notebook.json") == {"x": 1}
