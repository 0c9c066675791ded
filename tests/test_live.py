"""helpers.live: the live Trainer readout, headless and in a faked notebook, on CPU and on a faked GPU."""

import subprocess
import sys
import types

import pytest
import torch

from helpers import live as live_module
from helpers.live import LiveMemoryCallback

GIB = 2**30


@pytest.fixture(scope="module")
def tiny_training():
    from helpers.models import load_model

    model, tokenizer = load_model("embedded")
    texts = [f"Batch {i}: effective batch = per-device x accumulation x devices." for i in range(16)]
    rows = tokenizer(texts, padding="max_length", max_length=16, truncation=True)
    data = [
        {"input_ids": ids, "attention_mask": m, "labels": ids}
        for ids, m in zip(rows["input_ids"], rows["attention_mask"])
    ]
    return model, data


def test_live_callback_prints_lines_headless_and_a_summary(tiny_training, capsys, tmp_path):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    model, data = tiny_training
    live = LiveMemoryCallback(every_n_steps=2)
    assert isinstance(live, TrainerCallback)
    args = TrainingArguments(
        str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        logging_steps=2,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[live])
    trainer.train()
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("step ")]
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(lines) == 2 and lines[0].startswith("step 2/4 | ") and lines[1].startswith("step 4/4 | ")
    # the loss the Trainer logged at that very step, although it logs after on_step_end
    assert f"loss {losses[0]:.4f} (step 2)" in lines[0] and f"loss {losses[1]:.4f} (step 4)" in lines[1]
    assert "RSS" in lines[0] and "RAM" in lines[0] and ("MiB" in lines[0] or "GiB" in lines[0]) and "s/step" in lines[0]
    (done,) = [line for line in out if line.startswith("done: ")]
    assert done.startswith("done: 4 steps in ") and "peak RSS" in done and "mean loss" in done
    assert live.summary["steps"] == 4 and live.summary["device"] == "cpu"
    assert 0 < live.summary["peak_bytes"] < live.summary["capacity_bytes"]
    assert live.summary["loss"] == pytest.approx(losses[1])


class FakeHandle:
    def __init__(self, bundle, kwargs):
        self.shown = [(bundle, kwargs)]

    def update(self, bundle, **kwargs):
        self.shown.append((bundle, kwargs))


def test_live_callback_updates_one_output_area_in_a_notebook(monkeypatch, capsys):
    from IPython import display
    from transformers import TrainerControl, TrainerState

    handles = []

    def fake_display(bundle, **kwargs):
        assert kwargs.get("display_id") is True
        handles.append(FakeHandle(bundle, kwargs))
        return handles[-1]

    monkeypatch.setattr(display, "display", fake_display)
    monkeypatch.setattr(live_module, "_in_notebook", lambda: True)
    live = LiveMemoryCallback(every_n_steps=2)  # output="auto" finds the (faked) notebook
    args, state, control = types.SimpleNamespace(device="cpu"), TrainerState(max_steps=6), TrainerControl()
    live.on_train_begin(args, state, control)
    for step in range(1, 7):
        state.global_step = step
        live.on_step_end(args, state, control)
    live.on_train_end(args, state, control)

    assert len(handles) == 1, "one output area, updated in place, not one per update"
    shown = handles[0].shown
    assert len(shown) == 4  # steps 2, 4, 6, then the summary
    assert all(set(bundle) == {"text/plain"} and kwargs.get("raw") for bundle, kwargs in shown)
    assert [b["text/plain"].split(" |")[0] for b, _ in shown[:3]] == ["step 2/6", "step 4/6", "step 6/6"]
    last_status, summary = shown[3][0]["text/plain"].splitlines()
    assert last_status == shown[2][0]["text/plain"] and summary.startswith("done: 6 steps")
    assert capsys.readouterr().out == ""


def test_live_callback_on_a_gpu_reads_the_allocator_against_the_card(monkeypatch, capsys):
    from transformers import TrainerControl, TrainerState

    resets = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=15 * GIB))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: resets.append(d))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 1 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 2 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("a readout must not synchronize"))
    live = LiveMemoryCallback(every_n_steps=5, output="text")
    args, state, control = types.SimpleNamespace(device="cuda:0"), TrainerState(max_steps=5), TrainerControl()
    live.on_train_begin(args, state, control)
    assert resets == ["cuda:0"]  # the peak is this run's
    state.global_step = 5
    live.on_step_end(args, state, control)
    live.on_train_end(args, state, control)
    status, done = capsys.readouterr().out.splitlines()
    assert status.startswith(
        "step 5/5 | loss - | cuda:0 1.00 GiB allocated, peak 2.00 GiB (peak reserved 3.00 GiB = 20% of 15.00 GiB) | "
    )
    assert done.endswith("peak cuda:0 2.00 GiB allocated, 3.00 GiB reserved = 20% of 15.00 GiB")
    assert live.summary["peak_bytes"] == 2 * GIB and live.summary["capacity_bytes"] == 15 * GIB


def test_live_callback_shows_nothing_on_other_processes(capsys):
    from transformers import TrainerControl, TrainerState

    live = LiveMemoryCallback(every_n_steps=1, output="text")
    args = types.SimpleNamespace(device="cpu")
    state = TrainerState(max_steps=2, is_world_process_zero=False)
    live.on_train_begin(args, state, TrainerControl())
    state.global_step = 1
    live.on_step_end(args, state, TrainerControl())
    live.on_train_end(args, state, TrainerControl())
    assert capsys.readouterr().out == ""


def test_notebook_detection_needs_a_kernel(monkeypatch):
    import IPython

    assert live_module._in_notebook() is False  # pytest: no kernel
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace(kernel=object()))
    assert live_module._in_notebook() is True
    monkeypatch.setattr(IPython, "get_ipython", lambda: types.SimpleNamespace())  # terminal IPython
    assert live_module._in_notebook() is False


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_live_callback_says_what_every_n_steps_takes(bad):
    with pytest.raises(ValueError, match=r"every_n_steps must be an int >= 1.*LiveMemoryCallback\(10\)"):
        LiveMemoryCallback(every_n_steps=bad)


def test_live_callback_takes_a_log_before_any_training():
    """trainer.evaluate() on a Trainer that never trained logs before on_train_begin."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    callback = LiveMemoryCallback(output="text")
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    callback.on_log(args, TrainerState(), TrainerControl(), logs={"eval_loss": 1.0})


def test_importing_the_module_loads_neither_torch_nor_transformers():
    code = (
        "import sys, helpers.live; "
        "assert not {'torch', 'transformers', 'IPython'} & set(sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
