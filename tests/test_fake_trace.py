"""The estimator at 7B-8B sizes without a GPU (issue 36): helpers/maintainer/fake_trace.py.

The tracker is first proven against two references: PyTorch's own MemTracker on fake tensors (one
step without checkpointing: MemTracker refuses a module called twice), and the profiler's view of
torch's CPU allocator (helpers/_cpu_peak.py) on real tensors of the embedded tiny model. Then it
holds the estimator's `allocated` to the real transformers model's peak over two training steps
(scripts/bench_fake.py's grid: Llama-2-7B, Mistral-7B, Llama-3.1-8B, Qwen2.5-7B; full fine-tuning
in pure bf16 and under bf16 autocast, LoRA; checkpointing off and on): at 2 decoder layers of full
width and vocabulary here, at all 32 layers in the slow tier. `pytest -s` prints the tables.
"""

import contextlib
import dataclasses

import pytest
import torch
from bench_script import script

from helpers.catalog import load_catalog
from helpers.estimate import estimate_training_memory, shape_of
from helpers.job import JobSettingError, TrainingJob
from helpers.maintainer.fake_trace import (
    AllocationTrace,
    FakeModel,
    fake_model,
    model_config,
    trace_training,
    train_step,
)
from helpers.models import EMBEDDED_DIR

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
BENCH = script("bench_fake")

# How far the estimate may fall below the tracker's peak. The largest shortfall measured (run of
# 2026-12-06, every case of the grid) is the gradient of the embeddings' output, alive beside every
# other gradient and AdamW's states while the embeddings' gradient is made at the end of the second
# step's backward (per_device_batch x seq_len x hidden: 8 MiB at 1 x 1024 x 4096 in bf16): -0.16 % of
# the peak at 2 layers, -0.02 % at 32. 0.5 % is three times the first, far inside the 8 % a verdict
# keeps for the estimator's known error (helpers.estimate.SAFETY_MARGIN).
UNDER = 0.005
# How far above it: 0.5 % too (every LoRA and every full run without checkpointing lands within
# 0.00 %), plus what the estimator knowingly over-counts in a checkpointed full fine-tune: it puts the
# recomputed layer (recompute + backward_transient) beside every gradient, but when the first layer
# is recomputed its own gradients and the embeddings' are not made yet, so the real peak is the
# optimizer's moment, with no activations: +1.3 to +5.1 % at 2 layers, +0.25 to +0.56 % at 32.
OVER = 0.005
FAST_LAYERS = 2
# the slow tier at full depth: a 32k and a 128k vocabulary, each full and LoRA, checkpointing off and on
# once (all four models at full depth: scripts/bench_fake.py, about 2 minutes; the suite keeps to these)
FULL_DEPTH = [
    ("Llama-2-7B", "full, pure bf16", False),
    ("Llama-2-7B", "LoRA r16, bf16 base", True),
    ("Llama-3.1-8B", "full, bf16 autocast", True),
    ("Llama-3.1-8B", "LoRA r16, bf16 base", False),
]
# the fast tier: grouped heads with a 32k vocabulary (Mistral-7B); Qwen2.5-7B (biases, a 152k vocabulary),
# Llama-2-7B (no grouping) and Llama-3.1-8B (a 128k vocabulary) at 2 layers in the slow tier
GRID = [(m, run, c) for m in BENCH.MODELS for run in BENCH.RUNS for c in (False, True)]
FAST_MODELS = ("Mistral-7B",)
TINY_GQA = dict(model_type="llama", hidden_size=256, intermediate_size=704, num_hidden_layers=2, vocab_size=2048)
TINY_GQA.update(num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False)


def assert_within(row) -> None:
    e, peak = row.estimate, row.peak
    known = e.recompute + e.backward_transient if row.checkpointing and e.settings["method"] == "full" else 0
    print(BENCH.table([row]).splitlines()[-1])
    assert e.allocated >= peak * (1 - UNDER), f"{100 * row.error:+.2f}% under the tracked peak"
    assert e.allocated <= peak * (1 + OVER) + known, f"{100 * row.error:+.2f}% over the tracked peak"


def test_the_trackers_peak_is_pytorchs_memtracker_peak():
    """Full fine-tuning: MemTracker hooks every parameter's gradient, so it refuses a frozen one (LoRA)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    settings = dict(per_device_batch=2, precision="fp32")
    ours = trace_training(TINY_GQA, lengths=[128], **settings)
    built = fake_model(TINY_GQA, seq_len=128, **settings)
    with built.mode:
        tracker = MemTracker()
        tracker.track_external(built.model, built.optimizer)
        with tracker:
            train_step(built)
    theirs = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert ours.peak == theirs and ours.peak > ours.weights


@pytest.mark.parametrize("precision", ["fp32", "bf16-true", "bf16", "fp32 checkpointed"])
def test_the_tracker_on_real_tensors_sees_what_the_cpu_allocator_hands_out(precision):
    """The same step on real tensors of the embedded model: the dispatch-level trace is the profiler's
    peak to the byte. Checkpointed, the profiler also sees the CPU random-number state each checkpointed
    layer stashes (torch.get_rng_state(), made outside the dispatcher): host memory on a card, not the GPU's."""
    from transformers import AutoModelForCausalLM

    from helpers._cpu_peak import track_allocations

    checkpointing, precision = precision.endswith("checkpointed"), precision.split()[0]
    built = fake_model(str(EMBEDDED_DIR), per_device_batch=2, seq_len=64, precision=precision)
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(EMBEDDED_DIR, dtype=dtype)
    model.config.use_cache = False
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.train().parameters(), lr=1e-4, fused=True)
    real = FakeModel(model, optimizer, contextlib.nullcontext(), built.job, built.config)
    train_step(real)  # AdamW's states: made before the block, as the profiler needs
    trace = AllocationTrace()
    trace.add(*model.parameters(), *model.buffers(), *(t for s in optimizer.state.values() for t in s.values()))
    start = trace.level
    with track_allocations() as measured, trace.recording():
        train_step(real)
        train_step(real)
    stashed = model.config.num_hidden_layers * torch.get_rng_state().nbytes if checkpointing else 0
    assert measured.peak == trace.peak - start + stashed
    assert measured.end == trace.level - start == 0


def test_a_run_of_varying_lengths_records_every_free_and_each_steps_peak():
    lengths = [256, 1024, 512]
    run = trace_training("Mistral-7B", lengths=lengths, layers=FAST_LAYERS, precision="bf16-true")
    assert run.lengths == tuple(lengths) and run.job.seq_len == 1024 and len(run.step_peaks) == 3
    assert run.step_starts[0] > 0 and run.step_starts == sorted(run.step_starts)
    allocated = {}
    for handle, nbytes in run.events:  # each free follows its own allocation, once
        if nbytes > 0:
            assert handle not in allocated
            allocated[handle] = nbytes
        else:
            assert allocated.pop(handle) == -nbytes
    # what is left is the weights and AdamW's states: two moments and a 4-byte fp32 step count a tensor
    tensors = len(list(fake_model(run.config, run.job).model.parameters()))
    e = estimate_training_memory(run.config, run.job, device="cpu")
    assert sum(allocated.values()) == sum(n for _, n in run.events) == run.weights + e.optimizer + 4 * tensors
    for length, peak in zip(lengths, run.step_peaks):
        allocated = estimate_training_memory(run.config, run.job, seq_len=length, device="cpu").allocated
        assert peak * (1 - UNDER) <= allocated <= peak * (1 + OVER)
    assert run.reserved() >= run.peak and run.reserved(expandable=True) >= run.peak


def test_a_job_traces_one_step_of_its_seq_len_and_reads_back_as_the_same_job():
    job = TrainingJob(per_device_batch=2, seq_len=256, method="lora", lora_r=8)
    run = trace_training("Qwen2.5-7B", job, layers=1)
    assert run.lengths == (256,) and len(run.step_peaks) == 1
    assert run.job == dataclasses.replace(job, precision="bf16", weights="bf16")  # the estimator's defaults, resolved


@pytest.mark.parametrize(
    "model, run, checkpointing",
    [pytest.param(*case, marks=() if case[0] in FAST_MODELS else pytest.mark.slow) for case in GRID],
    ids=[f"{m}, {r}, ckpt {c}" for m, r, c in GRID],
)
def test_the_estimate_is_the_real_models_peak_at_full_width(model, run, checkpointing):
    """2 decoder layers at the model's hidden size, heads and vocabulary: its head, embeddings and
    grouped heads at full size; the estimator reads the same 2-layer config."""
    assert_within(BENCH.cross_check(model, run, checkpointing, layers=FAST_LAYERS))


@pytest.mark.slow
@pytest.mark.parametrize("model, run, checkpointing", FULL_DEPTH, ids=[f"{m}, {r}, ckpt {c}" for m, r, c in FULL_DEPTH])
def test_the_estimate_is_the_real_models_peak_at_full_depth(model, run, checkpointing):
    row = BENCH.cross_check(model, run, checkpointing)
    inv_freq = 2 * 4 * shape_of(model).head_dim // 2  # the rotary embedding's two fp32 buffers, not in the estimate
    assert row.weights == row.estimate.weights + inv_freq
    assert_within(row)


@pytest.mark.parametrize("name", sorted(load_catalog("models")))
def test_a_catalog_models_config_reads_back_as_its_shape(name):
    built = shape_of(model_config(name))
    assert dataclasses.replace(built, attn_impl=shape_of(name).attn_impl) == shape_of(name)


@pytest.mark.parametrize(
    "model, settings, message",
    [
        ("Mistral-7B", dict(method="qlora"), "bitsandbytes' kernels, which do not run on fake tensors"),
        ("Mistral-7B", dict(optimizer="adamw_8bit"), "optimizer='adamw_8bit' is not walked: pass one of"),
        ("Mistral-7B", dict(loop="custom"), "pass loop='trainer'"),
        ("Mistral-7B", dict(grad_accum_steps=4), "pass grad_accum_steps=1"),
        ("bert-large", {}, "the walk builds causal LMs: pass a decoder"),
        ("Mistral-7B", dict(lengths=[512, 0]), "lengths=[512, 0]: pass the tokens of each step's sequences"),
        ("Mistral-7B", dict(lengths=[512], seq_len=512), "pass only lengths, one a step"),
        ("Mistral-7B", dict(layers=0), "layers=0: pass a whole number of decoder layers"),
        ("Mistrall-7B", {}, "unknown model 'Mistrall-7B'"),
    ],
)
def test_what_the_walk_cannot_build_is_refused_with_the_fix(model, settings, message):
    settings = {"lengths": [512]} | settings if "seq_len" not in settings else settings
    with pytest.raises((JobSettingError, ValueError)) as refused:
        trace_training(model, **settings)
    assert message in str(refused.value)
