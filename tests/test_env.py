"""helpers.env and precision_kwargs on the cards students get, faked as torch.cuda and NVML report them."""

import sys
import types

import pytest
import torch
from fake_nvml import FakeCard, FakeNVML
from transformers import TrainingArguments

from helpers import env
from helpers.training import precision_kwargs

GIB = 2**30
# name, total bytes, compute capability: what the driver reports for each card
CARDS = {
    "T4": ("Tesla T4", 15 * GIB, (7, 5)),
    "P100": ("Tesla P100-PCIE-16GB", 16 * GIB, (6, 0)),
    "L4": ("NVIDIA L4", 22 * GIB, (8, 9)),
    "A100": ("NVIDIA A100-SXM4-40GB", 40 * GIB, (8, 0)),
    "H100": ("NVIDIA H100 80GB HBM3", 80 * GIB, (9, 0)),
}
EXPECTED = {"T4": "fp16", "P100": "fp16", "L4": "bf16", "A100": "bf16", "H100": "bf16"}


def fake_torch_cuda(monkeypatch, cards):
    """Make torch.cuda report `cards`; bf16 'supported' everywhere, as torch says on a T4."""
    props = [types.SimpleNamespace(name=n, total_memory=m, major=c[0], minor=c[1]) for n, m, c in cards]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(cards))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(cards))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


@pytest.mark.parametrize("card", sorted(CARDS))
def test_precision_follows_compute_capability_not_is_bf16_supported(monkeypatch, card):
    fake_torch_cuda(monkeypatch, [CARDS[card]])
    gpus = env.detect_gpus()
    assert gpus[0].name == CARDS[card][0] and gpus[0].capability == CARDS[card][2]
    assert env.choose_precision(gpus).name == EXPECTED[card]
    kwargs = precision_kwargs()
    assert kwargs == {"bf16": EXPECTED[card] == "bf16", "fp16": EXPECTED[card] == "fp16"}


def test_t4_reason_names_the_emulation_trap(monkeypatch):
    fake_torch_cuda(monkeypatch, [CARDS["T4"]])
    reason = env.describe().precision.reason
    assert "7.5" in reason and "emulated" in reason and "fp16" in reason


def test_mixed_cards_use_the_weakest():
    gpus = [env.Gpu(0, *CARDS["A100"]), env.Gpu(1, *CARDS["T4"])]
    assert env.choose_precision(gpus).name == "fp16"


def test_cpu_gets_fp32_and_says_fp16_does_nothing(monkeypatch):
    fake_torch_cuda(monkeypatch, [])
    machine = env.describe()
    assert machine.gpus == () and machine.gpu_source == "none" and machine.gpu_memory_bytes == 0
    assert machine.precision.name == "fp32"
    assert "fp16=True does nothing on CPU" in machine.precision.reason
    assert precision_kwargs() == {"bf16": False, "fp16": False}
    # the keywords are accepted as they are by the real TrainingArguments on this CPU
    args = TrainingArguments(output_dir="unused", report_to="none", **precision_kwargs())
    assert not args.bf16 and not args.fp16


def test_nvml_path_reads_cards_without_touching_cuda(monkeypatch):
    nvml = FakeNVML([FakeCard(*CARDS["T4"]), FakeCard(*CARDS["T4"])])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("torch.cuda touched on the NVML path"))
    machine = env.describe(use_nvml=True)
    assert [g.name for g in machine.gpus] == ["Tesla T4", "Tesla T4"]
    assert machine.gpu_source == "nvml" and machine.precision.name == "fp16"
    assert nvml.open == 0  # shut down again


def test_nvml_without_a_driver_means_no_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], driver=False))
    assert env.detect_gpus(use_nvml=True) == ()


@pytest.mark.parametrize(
    "environ, platform",
    [
        ({"COLAB_RELEASE_TAG": "release-colab_20261101"}, "colab"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}, "kaggle"),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "COLAB_RELEASE_TAG": "release-colab_20260514"}, "kaggle"),
        ({}, "local"),
    ],
)
def test_detect_platform(environ, platform):
    assert env.detect_platform(environ) == platform


def test_kaggle_p100_points_to_t4x2():
    notes = env.machine_notes("kaggle", (env.Gpu(0, *CARDS["P100"]),))
    assert len(notes) == 1 and "no longer runs PyTorch on the P100" in notes[0] and "T4 x2" in notes[0]


@pytest.mark.parametrize(
    "platform, fix", [("colab", "Change runtime type"), ("kaggle", "Accelerator"), ("local", "embedded")]
)
def test_no_gpu_note_says_where_to_get_one(platform, fix):
    (note,) = env.machine_notes(platform, ())
    assert fix in note


def test_summary_is_plain_text_with_every_card(monkeypatch):
    fake_torch_cuda(monkeypatch, [CARDS["T4"], CARDS["T4"]])
    text = env.describe().summary()
    assert (
        "gpu 0      : Tesla T4" in text
        and "gpu 1      : Tesla T4" in text
        and "compute capability 7.5" in text
        and "precision  : fp16" in text
    )


def test_check_4bit_round_trips_on_this_cpu():
    ok, message = env.check_4bit("cpu")
    assert ok, message
    assert "NF4 works on cpu" in message


def test_check_4bit_reports_failure_instead_of_raising():
    ok, message = env.check_4bit("no-such-device")
    assert not ok and "failed on no-such-device" in message
