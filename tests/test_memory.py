"""helpers.memory on CPU: exact accounting against hand computations, readouts side by side.
torch.cuda and NVML are faked where a GPU would be needed."""

import subprocess
import sys
import threading
import time

import matplotlib
import pytest
import torch
from fake_nvml import FakeCard, FakeNVML
from torch import nn

from helpers import _probes
from helpers.memory import (
    Readout,
    compare,
    measure,
    plot,
    read_gpu_memory,
    track_saved_tensors,
)

GIB = 2**30
MIB = 2**20
FP32 = 4  # bytes per float32 value


def small_model(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to(dtype)


N_PARAMS = 16 * 32 + 32 + 32 * 4 + 4  # 676: two weights and two biases
X = torch.randn(8, 16)  # (batch, features); needs no grad, so the first Linear saves only X
# what autograd saves through the small model, in bytes:
X_BYTES = 8 * 16 * FP32  # 512: the first Linear's input, for its weight's gradient
RELU_BYTES = 8 * 32 * FP32  # 1024: ReLU's output, which the second Linear saves again as its input
W2_BYTES = 32 * 4 * FP32  # 512: the second Linear's weight, saved for its input's gradient


# ----------------------------------------------------------------------------------------------
# exact accounting


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_gradients_and_adamw_states_are_exact_bytes(dtype):
    model = small_model(dtype)
    optimizer = torch.optim.AdamW(model.parameters())
    with measure("one step", model=model, optimizer=optimizer) as r:
        model(X.to(dtype)).sum().backward()
        optimizer.step()
    size = torch.finfo(dtype).bits // 8
    assert r["weights"] == r["gradients"] == N_PARAMS * size
    # exp_avg and exp_avg_sq in the parameters' dtype, and a float32 `step` per parameter tensor
    assert r["optimizer"] == 2 * N_PARAMS * size + 4 * FP32
    assert r.total == r["weights"] + r["gradients"] + r["optimizer"] + r["activations"]
    assert r.device == "cpu" and r.seconds > 0
    assert all(f.how for f in r.figures.values())
    assert set(r.figures) == {"weights", "gradients", "optimizer", "activations", "rss_delta", "rss_peak_delta"}


def test_gradients_that_do_not_exist_count_zero():
    model = small_model()
    with measure("forward only", model=model) as r:
        model(X)
    assert r["gradients"] == 0 and "optimizer" not in r
    assert r["activations"] == X_BYTES + RELU_BYTES  # the graph is held: nothing was freed


def test_activations_are_what_each_op_saves():
    model = small_model()
    with track_saved_tensors(model) as saved:
        model(X).sum().backward()
    # X once, ReLU's output once although two ops save it, the second weight excluded
    assert saved.bytes == X_BYTES + RELU_BYTES and saved.count == 2
    assert saved.by_dtype == {"float32": X_BYTES + RELU_BYTES}
    assert saved.peak_bytes == saved.bytes
    with track_saved_tensors() as unfiltered:  # no model given: its weight counts
        model(X).sum().backward()
    assert unfiltered.bytes == X_BYTES + RELU_BYTES + W2_BYTES


def test_views_of_a_saved_tensor_count_once():
    a = torch.randn(64, requires_grad=True)
    with track_saved_tensors() as saved:
        b = a.exp()  # saves its output: 64 floats
        c = b[:32] * b[32:]  # saves both operands, two views of b's storage: nothing new
        c.sum().backward()
    assert saved.bytes == 64 * FP32 and saved.count == 1


def test_peak_is_what_the_graphs_hold_at_once_not_the_sum_of_steps():
    model = small_model()
    with track_saved_tensors(model) as steps:
        for _ in range(3):  # each backward frees its graph before the next forward
            model(X).sum().backward()
    assert steps.peak_bytes == X_BYTES + RELU_BYTES
    with track_saved_tensors(model) as two:
        first, second = model(X).sum(), model(X).sum()  # two graphs alive, X shared by both
        assert two.peak_bytes == X_BYTES + 2 * RELU_BYTES
        (first + second).backward()
    with measure("three steps", model=model) as r:
        for _ in range(3):
            model(X).sum().backward()
    assert r["activations"] == X_BYTES + RELU_BYTES


def test_a_block_that_raises_still_fills_its_readout():
    model = small_model()
    with pytest.raises(torch.OutOfMemoryError):
        with measure("too big", model=model) as r:
            model(X)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    assert r["weights"] == N_PARAMS * FP32 and r["activations"] == X_BYTES + RELU_BYTES


def test_readout_reads_as_a_table_and_a_dict():
    model = small_model()
    with measure("small", model=model) as r:
        model(X).sum().backward()
    text = str(r)
    assert text.startswith("small (cpu, ") and "activations" in text and "saved-tensor hooks" in text
    assert "KiB" in text.splitlines()[1]  # bytes this small read in KiB, not 0.00 MiB
    d = r.as_dict()
    assert d["label"] == "small" and d["weights"] == N_PARAMS * FP32 and d["total"] == r.total
    with pytest.raises(KeyError, match="no figure 'optimizer'.*weights"):
        r["optimizer"]


def test_rss_peak_sees_a_transient_allocation():
    with measure("transient") as r:
        block = torch.ones(64 * MIB // FP32)  # written, so resident: 64 MiB
        del block
    assert r["rss_peak_delta"] >= 60 * MIB > r["rss_delta"]
    assert "VmHWM" in r.figures["rss_peak_delta"].how
    assert "activations" in r and "weights" not in r  # no model given
    assert "no model given" in r.figures["activations"].how


def test_rss_peak_is_sampled_where_the_kernel_peak_cannot_be_reset(monkeypatch):
    monkeypatch.setattr(_probes, "reset_peak_rss", lambda: False)  # not Linux, or /proc read-only
    monkeypatch.setattr(_probes, "RSS_INTERVAL_S", 0.001)
    with measure("transient") as r:
        block = torch.ones(64 * MIB // FP32)
        time.sleep(0.05)  # held for many sampling periods
        del block
    assert r["rss_peak_delta"] >= 60 * MIB > r["rss_delta"]
    assert "sampled every 1 ms" in r.figures["rss_peak_delta"].how


# ----------------------------------------------------------------------------------------------
# fp32 vs bf16 vs checkpointing on the embedded model, side by side


@pytest.fixture(scope="module")
def readouts():
    from helpers.models import load_model

    model, tokenizer = load_model("embedded")
    model.train()
    batch = tokenizer(
        ["Effective batch = per-device x accumulation x devices."] * 4,
        return_tensors="pt",
        padding="max_length",
        max_length=32,
    )
    batch["labels"] = batch["input_ids"].clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(autocast=False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    step()  # optimizer states exist in every measured block
    with measure("fp32", model=model, optimizer=optimizer) as fp32:
        step()
    with measure("bf16 autocast", model=model, optimizer=optimizer) as bf16:
        step(autocast=True)
    model.activation_checkpointing_enable()
    with measure("checkpointing", model=model, optimizer=optimizer) as checkpointed:
        step()
    with track_saved_tensors(model) as saved:  # measure's figure is this count
        model(**batch).loss.backward()
    model.zero_grad()
    return [fp32, bf16, checkpointed], saved


def test_bf16_and_checkpointing_cut_activations_not_the_rest(readouts):
    (fp32, bf16, checkpointed), saved = readouts
    assert bf16["activations"] < fp32["activations"]
    assert "bfloat16" in bf16.saved.by_dtype and "bfloat16" not in fp32.saved.by_dtype
    assert checkpointed["activations"] < fp32["activations"] / 2
    assert checkpointed["activations"] == saved.bytes
    for name in ("weights", "gradients", "optimizer"):
        assert fp32[name] == bf16[name] == checkpointed[name] > 0


def test_compare_lines_up_the_readouts_with_ratios(readouts):
    rs, _ = readouts
    text = compare(rs)
    lines = text.splitlines()
    assert all(r.label in lines[0] for r in rs)
    row = next(line for line in lines if line.startswith("activations"))
    assert f"{rs[0]['activations'] / MIB:,.2f} MiB" in row
    assert f"{rs[1]['activations'] / rs[0]['activations']:5.2f}x" in row
    assert f"{rs[2]['activations'] / rs[0]['activations']:5.2f}x" in row
    names = [line.split()[0] for line in lines[2:] if line and not line.startswith(" ")]
    assert names[:7] == ["weights", "gradients", "optimizer", "activations", "total", "rss_delta", "rss_peak_delta"]
    assert "how each figure was measured:" in text and "saved-tensor hooks" in text


def test_plot_stacks_the_components_of_each_readout(readouts):
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs, _ = readouts
    ax = plot(rs)
    try:
        assert len(ax.patches) == len(rs) * 4  # weights, gradients, optimizer, activations
        tops = [
            max(p.get_y() + p.get_height() for p in ax.patches if abs(p.get_x() + p.get_width() / 2 - i) < 0.01)
            for i in range(len(rs))
        ]
        assert tops == pytest.approx([r.total / MIB for r in rs])
        assert [t.get_text() for t in ax.get_xticklabels()] == [r.label for r in rs]
        assert ax.get_ylabel() == "MiB"
    finally:
        plt.close(ax.figure)


def test_compare_and_plot_say_what_they_take():
    with pytest.raises(TypeError, match=r"compare\(\) takes a list of Readouts.*compare\(\[fp32, bf16\]\)"):
        compare([])
    with pytest.raises(TypeError, match="plot"):
        plot(["fp32"])


# ----------------------------------------------------------------------------------------------
# GPUs, faked: torch.cuda for measure, NVML for the cards


def test_measure_on_cuda_reads_the_allocator_peaks(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d: calls.append(("sync", d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda d: 4 * GIB)
    model = small_model()
    with measure("gpu", model=model, device="cuda") as r:
        calls.append("block")
        model(X).sum().backward()
    assert calls == [("reset", "cuda:0"), "block", ("sync", "cuda:0")]
    assert r.device == "cuda:0" and r["peak_allocated"] == 3 * GIB and r["peak_reserved"] == 4 * GIB
    assert "torch.cuda.max_memory_allocated(cuda:0)" in r.figures["peak_allocated"].how
    assert r["activations"] == X_BYTES + RELU_BYTES  # the exact count works on any device
    matplotlib.use("Agg")
    ax = plot([r])  # the allocator's peak is marked on the bar
    (marker,) = [c for c in ax.collections if c.get_label() == "peak allocated (torch.cuda)"]
    assert marker.get_offsets()[0][1] == pytest.approx(3 * GIB / MIB)
    matplotlib.pyplot.close(ax.figure)


def test_measure_on_cuda_without_a_gpu_says_what_to_do():
    with pytest.raises(ValueError, match="no CUDA GPU.*device='cpu'.*T4"):
        with measure("gpu", device="cuda"):
            pass


@pytest.fixture
def no_cuda(monkeypatch):
    for name in ("is_available", "device_count", "current_device", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _name=name: pytest.fail(f"torch.cuda.{_name} touched"))


def test_read_gpu_memory_reads_every_card_through_nvml_only(monkeypatch, no_cuda):
    nvml = FakeNVML([FakeCard("Tesla T4", 15 * GIB, used=1 * GIB), FakeCard("Tesla T4", 15 * GIB, used=3 * GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cards = read_gpu_memory()
    assert [(c.index, c.name, c.used_bytes, c.total_bytes) for c in cards] == [
        (0, "Tesla T4", 1 * GIB, 15 * GIB),
        (1, "Tesla T4", 3 * GIB, 15 * GIB),
    ]
    assert str(cards[1]) == "gpu 1 Tesla T4: 3.00 of 15.00 GiB used (20%)"
    assert nvml.open == 0


def test_read_gpu_memory_without_a_driver_is_empty(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], driver=False))
    assert read_gpu_memory() == []


def test_measure_through_nvml_keeps_each_cards_peak(monkeypatch, no_cuda):
    nvml = FakeNVML([FakeCard("Tesla T4", 15 * GIB, used=1 * GIB), FakeCard("Tesla T4", 15 * GIB, used=2 * GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(_probes, "NVML_INTERVAL_S", 0.001)
    with measure("two cards", device="nvml") as r:
        nvml.cards[0].used = 9 * GIB  # what a worker process on card 0 reaches for a moment
        reads = nvml.reads
        deadline = time.monotonic() + 10
        while nvml.reads < reads + 4 and time.monotonic() < deadline:  # the sampler read both cards twice
            time.sleep(0.001)
        nvml.cards[0].used = 1 * GIB
    assert r["gpu0_peak_used"] == 9 * GIB and r["gpu1_peak_used"] == 2 * GIB
    assert "NVML" in r.figures["gpu0_peak_used"].how and nvml.open == 0


def test_measure_through_nvml_without_a_driver_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], driver=False))
    with pytest.raises(ValueError, match="no NVIDIA driver.*device='cpu'"):
        with measure("cards", device="nvml"):
            pass


def test_the_nvml_sampler_keeps_each_cards_first_reading_and_its_peak(monkeypatch, no_cuda):
    """The kit's one NVML sampler: measure(device="nvml") reads its peaks, gpu-proof's notebook rows its
    first reading (the idle card) too."""
    nvml = FakeNVML([FakeCard("Tesla T4", 15 * GIB, used=1 * GIB)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with _probes.nvml_peaks(0.001) as cards:
        nvml.cards[0].used = 5 * GIB  # a notebook's peak, for a moment
        reads, deadline = nvml.reads, time.monotonic() + 10
        while nvml.reads < reads + 2 and time.monotonic() < deadline:  # the sampler read it twice
            time.sleep(0.001)
        nvml.cards[0].used = 2 * GIB
    assert cards.first == [1 * GIB] and cards.peak == [5 * GIB] and nvml.open == 0
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], driver=False))
    with _probes.nvml_peaks(0.001) as cards:
        assert cards is None  # no driver: nothing to sample


def test_a_read_that_hangs_does_not_hold_the_sampler_when_it_stops(monkeypatch):
    monkeypatch.setattr(_probes, "STOP_WAIT_S", 0.01)
    answering, reads = threading.Event(), []

    def read():  # a driver that stops answering after its second reading
        reads.append(len(reads))
        if len(reads) > 2:
            answering.wait(10)
        return [len(reads)]

    sampler = _probes.PeakSampler(read, 0.001)
    deadline = time.monotonic() + 10
    while len(reads) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    peak = sampler.stop()
    hung = len(reads)
    answering.set()
    assert hung == 3 and peak == [2], "stop() returned the peaks so far, read nothing behind the hung read"


def test_importing_the_module_loads_neither_torch_nor_transformers():
    code = (
        "import sys, helpers.memory; "
        "assert not {'torch', 'transformers', 'matplotlib'} & set(sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_readouts_are_plain_data():
    r = Readout("empty")
    assert r.total == 0 and r.as_dict() == {"label": "empty", "device": "cpu", "seconds": 0.0, "total": 0}


def test_a_forward_without_backward_does_not_keep_its_graph_alive():
    """Saved tensors are held detached: an output's grad_fn must not cycle back through the hook."""
    import gc
    import weakref

    import torch

    model = torch.nn.Linear(64, 64)
    with track_saved_tensors(model):
        out = torch.sigmoid(model(torch.randn(32, 64)))  # sigmoid saves its own output
    probe = weakref.ref(out)
    del out
    gc.collect()
    assert probe() is None, "the forward's graph outlived the block"
