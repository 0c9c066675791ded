"""helpers.seeds: the same seed gives the same loss bit for bit; other seeds spread, and the spread is reported.

Real Trainer runs on the embedded model, on CPU.
"""

import io
import os

import pytest
import torch
from transformers import Trainer, TrainingArguments

from helpers.data import pack_course_data
from helpers.models import load_model
from helpers.seeds import plot_seeds, run_seeds


@pytest.fixture(scope="module")
def short_training(tmp_path_factory):
    """train(seed) -> the training loss of 3 real Trainer steps on the embedded model."""
    out = tmp_path_factory.mktemp("seeds")
    _, tokenizer = load_model("embedded")
    train = pack_course_data(tokenizer, 32).select(range(32))

    def train_fn(seed):
        model, _ = load_model("embedded")
        args = TrainingArguments(
            str(out),
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            seed=seed,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            disable_tqdm=True,
        )
        return Trainer(model=model, args=args, train_dataset=train).train().training_loss

    return train_fn


@pytest.mark.slow
def test_same_seed_same_loss_bit_for_bit_other_seeds_spread(short_training):
    runs = run_seeds(short_training, seeds=[0, 1, 2], metric="train_loss")
    again = run_seeds(short_training, seeds=[0])
    assert again.values[0] == runs.values[0], "same seed on CPU: bit-identical loss"
    assert len(set(runs.values)) == 3 and runs.std > 0, "other seeds: another data order, another loss"
    assert runs.mean == pytest.approx(sum(runs.values) / 3)
    assert runs.std == pytest.approx(torch.tensor(runs.values, dtype=torch.float64).std().item())  # n - 1
    assert "3 seeds: train_loss" in str(runs) and again.std == 0.0

    import matplotlib

    matplotlib.use("Agg")
    ax = plot_seeds(runs)
    assert [round(y, 12) for y in ax.lines[-1].get_ydata()] == [round(v, 12) for v in runs.values]
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG"


def test_run_seeds_says_what_to_return():
    with pytest.raises(ValueError, match=r"returned a dict with keys \['epoch', 'eval_loss'\].*key='eval_loss'"):
        run_seeds(lambda seed: {"eval_loss": 1.0, "epoch": 1}, seeds=[0])
    assert run_seeds(lambda seed: {"eval_loss": 1.0 + seed}, seeds=[0, 1], key="eval_loss").values == [1.0, 2.0]
    assert run_seeds(lambda seed: torch.tensor(0.5), seeds=[0]).values == [0.5]
    with pytest.raises(TypeError, match="must return a number"):
        run_seeds(lambda seed: "low", seeds=[0])
    with pytest.raises(ValueError, match="seeds is empty"):
        run_seeds(lambda seed: 1.0, seeds=[])


def test_seed_everything_is_transformers_set_seed(monkeypatch):
    """Delegates to transformers' set_seed (what the Trainer itself calls), not a copy of it."""
    import random

    import numpy as np
    import transformers

    from helpers.seeds import seed_everything

    def draws():
        return random.random(), np.random.rand(), torch.rand(1).item()

    transformers.set_seed(7)
    expected = draws()
    assert seed_everything(7) == 7 and draws() == expected

    calls = []
    monkeypatch.setattr(transformers, "set_seed", lambda seed, deterministic=False: calls.append(("set_seed", seed)))
    monkeypatch.setattr(transformers, "enable_full_determinism", lambda seed: calls.append(("full", seed)))
    seed_everything(3)
    seed_everything(4, deterministic=True)
    assert calls == [("set_seed", 3), ("full", 4)]


def test_deterministic_turns_on_torchs_deterministic_kernels(monkeypatch):
    from helpers.seeds import seed_everything

    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC"):
        monkeypatch.delenv(name, raising=False)  # enable_full_determinism sets them: undone after the test
    monkeypatch.delenv("FLASH_ATTENTION_DETERMINISTIC", raising=False)
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    try:
        seed_everything(5, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and os.environ["PYTHONHASHSEED"] == "5"
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, before[1]
    with pytest.raises(ValueError, match=r"in \[0, 2\*\*32\), got -1; pass a whole number such as seed=42"):
        seed_everything(-1)


def test_the_setup_call_seeds_a_rerun_the_same_and_refuses_a_bad_seed_in_its_own_words(capsys):
    from helpers import start

    start(seed=3)
    first = torch.rand(4)
    start(seed=3)
    assert torch.equal(torch.rand(4), first)
    assert "seed       : 3 (Python, NumPy and torch)" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"got '3'; pass a whole number such as seed=42"):
        start(seed="3")
