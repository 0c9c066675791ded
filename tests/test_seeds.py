"""helpers.seeds: the same seed gives the same loss bit for bit; other seeds spread, and the spread is reported.

Real Trainer runs on the embedded model, on CPU.
"""

import io

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
