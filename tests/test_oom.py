"""helpers.oom: going on after an out-of-memory error (on CPU, in a real IPython shell), recognising
one, fit_batch on a fake out-of-memory error, and activation_budget, a pretend card."""

import contextlib
import dataclasses
import gc
import io
import subprocess
import sys
import weakref

import psutil
import pytest
import torch
from random_models import tiny_llama

from helpers.oom import BatchFitError, activation_budget, fit_batch, free_memory, is_oom_error
from helpers.saved_tensors import track_saved_tensors
from helpers.training import effective_batch_size, training_args

# training_args may warn about precision mistakes (helpers.audit): keep them out of the warnings summary
pytestmark = pytest.mark.filterwarnings("ignore::helpers.audit.AuditWarning")

MIB = 2**20
FP32 = 4  # bytes per float32 value


# ----------------------------------------------------------------------------------------------
# going on after an out-of-memory error


BIG = 64 * MIB  # bytes of the activations a failing forward leaves behind


def forward_that_runs_out(refs):
    """A forward pass that fills memory, then fails the way CUDA does."""
    activations = torch.ones(BIG // FP32)  # written, so resident
    refs.append(weakref.ref(activations))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has 14.74 GiB in total")


@pytest.fixture
def last_error():
    yield
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)


def test_free_memory_releases_what_a_notebook_error_keeps(last_error):
    refs = []
    try:
        forward_that_runs_out(refs)
    except torch.OutOfMemoryError as e:  # what IPython does with an error a cell raised: keep it
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
    gc.collect()
    assert refs[0]() is not None, "the traceback keeps the failed forward's tensors; gc alone cannot free them"
    rss = psutil.Process().memory_info().rss
    assert free_memory() == []
    assert refs[0]() is None
    assert not hasattr(sys, "last_value") and not hasattr(sys, "last_traceback")
    assert rss - psutil.Process().memory_info().rss > 0.9 * BIG  # handed back to the system
    again = torch.ones(BIG // FP32)  # and the same memory can be taken again
    assert again.sum() == BIG // FP32


def test_free_memory_inside_the_except_block_and_for_a_kept_exception():
    refs = []
    try:
        forward_that_runs_out(refs)
    except torch.OutOfMemoryError as e:
        kept = e
        free_memory()  # the error being handled
        assert refs[0]() is None
    try:
        forward_that_runs_out(refs)
    except torch.OutOfMemoryError as e:
        kept = e  # the variable outlives the except block
    gc.collect()
    assert refs[1]() is not None
    (kept,) = free_memory(kept)
    assert kept is None and refs[1]() is None


def test_free_memory_in_a_real_ipython_shell(last_error):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    try:
        shell.run_cell(
            "import torch, weakref\nfrom helpers.oom import free_memory\n"
            f"from {__name__} import forward_that_runs_out\nrefs = []"
        )
        with contextlib.redirect_stdout(io.StringIO()):
            failed = shell.run_cell("forward_that_runs_out(refs)")  # the cell that runs out of memory
            shell.run_cell("model = torch.nn.Linear(256, 256)\nmodel_ref = weakref.ref(model)")
            shell.run_cell("model")  # shows the model: IPython's output cache keeps it
        assert isinstance(failed.error_in_exec, torch.OutOfMemoryError)
        ns = shell.user_ns
        gc.collect()
        assert ns["refs"][0]() is not None and ns["model_ref"]() is not None
        shell.run_cell("model, = free_memory(model)")
        assert ns["refs"][0]() is None, "the failed cell's activations are freed"
        assert ns["model_ref"]() is None, "Out[n] and _ no longer keep the model"
        assert ns["model"] is None and callable(ns["forward_that_runs_out"])  # the rest of the namespace stays
    finally:
        InteractiveShell.clear_instance()


def test_free_memory_empties_the_cuda_cache_only_once_cuda_is_in_use(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert free_memory(object(), object()) == [None, None]
    assert emptied == []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    free_memory()
    assert emptied == [True]


def _cpu_oom():
    try:
        torch.empty(2**60, dtype=torch.uint8)  # a real allocation failure: an exabyte
    except RuntimeError as e:
        return e
    pytest.fail("allocating 2**60 bytes succeeded")


def _chained():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        except torch.OutOfMemoryError as inner:
            raise RuntimeError("training step 12 failed") from inner
    except RuntimeError as e:
        return e


@pytest.mark.parametrize(
    "exc, oom",
    [
        (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (_cpu_oom(), True),
        (_chained(), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x16 and 32x4)"), False),
        (ValueError("out of memory"), False),
        (KeyboardInterrupt(), False),
    ],
)
def test_is_oom_error(exc, oom):
    assert is_oom_error(exc) is oom


# ---------------------------------------------------------------- fit_batch on a fake out-of-memory error


def fake_train(fits_up_to, error=lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")):
    """A train(args) that fails like a GPU for per-device batches above `fits_up_to`."""
    seen = []

    def train(args):
        b = args["per_device_train_batch_size"] if isinstance(args, dict) else args.per_device_train_batch_size
        seen.append(b)
        if b > fits_up_to:
            raise error()
        return f"trained at {b}"

    return train, seen


def test_fit_batch_halves_the_batch_and_keeps_the_effective_batch(capsys):
    train, seen = fake_train(fits_up_to=2)
    fitted = fit_batch(train, {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}, num_devices=1)
    assert fitted.tried == [(8, 2), (4, 4), (2, 8)] and seen == [8, 4, 2]
    assert fitted.result == "trained at 2"
    assert fitted.args == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8}
    out = capsys.readouterr().out
    assert (
        "out of memory at per_device_batch 8 x grad_accum_steps 2: retrying with 4 x 4 (effective batch 16 kept)"
    ) in out
    assert "fits at per_device_batch 2 x grad_accum_steps 8: effective batch 16" in out


def test_fit_batch_with_an_odd_batch_keeps_the_product_exact():
    train, _ = fake_train(fits_up_to=1)
    fitted = fit_batch(train, {"per_device_train_batch_size": 6, "gradient_accumulation_steps": 1}, num_devices=1)
    assert fitted.tried == [(6, 1), (3, 2), (1, 6)]


def test_fit_batch_works_on_training_arguments(tmp_path):
    args = training_args(
        str(tmp_path),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        gradient_checkpointing=True,
        quiet=True,
    )
    train, _ = fake_train(fits_up_to=1, error=lambda: RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    fitted = fit_batch(train, args)
    assert fitted.tried == [(4, 4), (2, 8), (1, 16)]
    assert dataclasses.is_dataclass(fitted.args) and fitted.args.activation_checkpointing is True
    assert effective_batch_size(fitted.args) == effective_batch_size(args) == 16


def test_fit_batch_passes_other_errors_through_at_once():
    train, seen = fake_train(fits_up_to=0, error=lambda: ValueError("labels are missing"))
    with pytest.raises(ValueError, match="labels are missing"):
        fit_batch(train, {"per_device_train_batch_size": 8})
    assert seen == [8]


def test_fit_batch_at_batch_one_says_what_to_try_next():
    train, _ = fake_train(fits_up_to=0)
    with pytest.raises(BatchFitError) as caught:
        fit_batch(train, {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}, num_devices=1)
    message = str(caught.value)
    assert "tried per_device_batch x grad_accum_steps: 4 x 2, 2 x 4, 1 x 8; effective batch 8" in message
    assert "activation_checkpointing=True" in message and "paged_adamw_8bit" in message and "QLoRA" in message
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)
    with pytest.raises(BatchFitError) as again:
        fit_batch(train, {"per_device_train_batch_size": 1, "activation_checkpointing": True})
    assert "activation_checkpointing=True" not in str(again.value)  # already on: not offered again


# ---------------------------------------------------------------- activation_budget: a pretend card


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()


def step(model, batch):
    model(input_ids=batch, labels=batch).loss.backward()
    model.zero_grad(set_to_none=True)


def test_activation_budget_admits_exactly_what_saved_tensor_hooks_count(tiny_model):
    model, batch = tiny_model, torch.randint(0, 128, (2, 16))
    with track_saved_tensors(model) as saved:
        step(model, batch)
    with activation_budget(saved.peak_bytes, model):
        step(model, batch)
        step(model, batch)  # each backward frees its graph: a second step fits the same budget
    with pytest.raises(torch.OutOfMemoryError, match="simulated out of memory") as caught:
        with activation_budget(saved.peak_bytes - 1, model):
            step(model, batch)
    assert is_oom_error(caught.value)


def test_activation_budget_frees_a_failed_step(tiny_model):
    model = tiny_model
    small, big = torch.randint(0, 128, (1, 16)), torch.randint(0, 128, (4, 16))
    with track_saved_tensors(model) as saved:
        step(model, small)
    with activation_budget(2 * saved.peak_bytes, model):
        with pytest.raises(torch.OutOfMemoryError):
            step(model, big)
        step(model, small)  # the failed step's graph is gone once its frames are


def test_fit_batch_on_a_pretend_card_finds_the_batch_that_fits(tiny_model):
    model, data = tiny_model, torch.randint(0, 128, (8, 16))
    with track_saved_tensors(model) as saved:
        step(model, data[:2])

    def train(args):  # one optimizer step, accumulated over micro-batches
        for micro in data.split(args["per_device_train_batch_size"]):
            (model(input_ids=micro, labels=micro).loss / args["gradient_accumulation_steps"]).backward()
        model.zero_grad(set_to_none=True)

    with activation_budget(saved.peak_bytes * 5 // 4, model):
        fitted = fit_batch(train, {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}, num_devices=1)
    assert fitted.tried == [(8, 1), (4, 2), (2, 4)]


def test_importing_the_module_loads_neither_torch_nor_transformers():
    code = "import sys, helpers.oom; assert not {'torch', 'transformers'} & set(sys.modules), sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
