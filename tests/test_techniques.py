"""The claims notebooks 02-04 teach, proved against a reference computation.

Each technique gets an equivalence test in the minGPT manner (the technique against the plain
computation it replaces); the figures the notebooks record are checked in their own test files
(tests/test_mixed_precision_notebook.py, ...).
"""

import math

import pytest
import torch
from random_models import tiny_llama

from helpers.estimate import estimate_training_memory
from helpers.saved_tensors import track_saved_tensors


@pytest.fixture(scope="module")
def model():
    """A tiny Llama (2 layers, grouped-query attention) in fp32, training mode."""
    return tiny_llama(pad_token_id=0)


def gradients(model):
    """Every parameter's gradient as one vector; clears them."""
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return g


def padded(lengths, vocab=128, seed=1):
    """Sequences of the given lengths, right-padded as a collator pads them; padding labelled -100."""
    gen = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    ids = torch.zeros(len(lengths), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=gen)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def trim(batch):
    """A sub-batch padded only to its own longest sequence, as a collator would."""
    n = int(batch["attention_mask"].sum(1).max())
    return {k: v[:, :n] for k, v in batch.items()}


# ---------------------------------------------------------------- 04: gradient accumulation


def test_accumulated_gradients_equal_the_large_batch(model):
    batch = torch.randint(0, 128, (8, 16), generator=torch.Generator().manual_seed(2))
    model(input_ids=batch, labels=batch).loss.backward()
    g_big = gradients(model)
    accum = 4
    for micro in batch.split(2):
        (model(input_ids=micro, labels=micro).loss / accum).backward()
    g_accum = gradients(model)
    assert (g_accum - g_big).abs().max().item() < 1e-6


def test_variable_lengths_need_the_token_sum_not_the_mean_of_means(model):
    lengths = [3, 4, 9, 10, 15, 16, 16, 16]
    whole = padded(lengths)
    micros = [trim({k: v[i : i + 2] for k, v in whole.items()}) for i in range(0, 8, 2)]
    total = sum(int((m["labels"][:, 1:] != -100).sum()) for m in micros)

    model(**whole).loss.backward()  # the reference: one mean over every labelled token
    g_ref = gradients(model)
    for m in micros:
        (model(**m).loss / len(micros)).backward()  # the trap
    g_naive = gradients(model)
    for m in micros:
        model(**m, num_items_in_batch=total).loss.backward()  # sum over tokens / tokens of the whole batch
    g_tokens = gradients(model)
    for m in micros:  # the same, written out: the reference computation for num_items_in_batch
        logits = model(input_ids=m["input_ids"], attention_mask=m["attention_mask"]).logits
        losses = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), m["labels"][:, 1:].flatten(), ignore_index=-100, reduction="sum"
        )
        (losses / total).backward()
    g_manual = gradients(model)

    assert (g_tokens - g_ref).abs().max().item() < 1e-6
    assert (g_manual - g_ref).abs().max().item() < 1e-6
    assert ((g_naive - g_ref).norm() / g_ref.norm()).item() > 0.01  # wrong by more than 1 %


def test_the_trainer_counts_tokens_across_the_micro_batches_of_a_step(model, tmp_path):
    """transformers 5.23: one optimizer step over variable-length micro-batches gets the whole batch's gradient."""
    from transformers import Trainer, TrainerCallback

    from helpers.training import training_args

    lengths = [3, 16, 4, 15, 9, 10, 16, 5]
    whole = padded(lengths)
    model(**whole).loss.backward()
    g_ref = gradients(model)

    rows = [{k: v[i][: lengths[i]] for k, v in whole.items()} for i in range(len(lengths))]

    def collate(items):
        return trim(
            {
                k: torch.nn.utils.rnn.pad_sequence(
                    [it[k] for it in items], batch_first=True, padding_value=-100 if k == "labels" else 0
                )
                for k in items[0]
            }
        )

    class Grab(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.g = torch.cat([p.grad.flatten() for p in model.parameters()]).clone()

    grab = Grab()
    args = training_args(
        str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=4,
        max_steps=1,
        learning_rate=0.0,
        max_grad_norm=0.0,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        quiet=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows, data_collator=collate, callbacks=[grab])
    trainer.train()
    model.zero_grad(set_to_none=True)
    assert trainer.model_accepts_loss_kwargs
    assert (grab.g - g_ref).abs().max().item() < 1e-6


# ---------------------------------------------------------------- 03: gradient checkpointing


def test_checkpointing_gives_the_same_gradients_and_saves_what_the_estimator_says(model):
    batch = torch.randint(0, 128, (2, 64), generator=torch.Generator().manual_seed(3))
    saved, grads = {}, {}
    for on in (False, True):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        with track_saved_tensors(model) as saved[on]:
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        grads[on] = gradients(model)
    model.activation_checkpointing_disable()
    assert (grads[True] - grads[False]).abs().max().item() < 1e-6
    assert saved[True].peak_bytes < saved[False].peak_bytes / 2
    for on in (False, True):
        e = estimate_training_memory(
            model.config, batch_size=2, seq_len=64, precision="fp32", checkpointing=on, device="cpu"
        )
        assert saved[on].peak_bytes == e.activations


# ---------------------------------------------------------------- 02: mixed precision


def test_bf16_halves_the_saved_bytes_of_the_layers_it_covers(model):
    import copy

    mlp = model.model.layers[0].mlp
    h = torch.randn(2, 64, 32, requires_grad=True)
    mlp_bf16 = copy.deepcopy(mlp).to(torch.bfloat16)
    with track_saved_tensors(mlp) as fp32:
        out = mlp(h)
    out.sum().backward()  # frees the graph (a forward-only block would keep it alive)
    with track_saved_tensors(mlp_bf16) as bf16:
        out = mlp_bf16(h.to(torch.bfloat16))
    out.sum().backward()
    model.zero_grad(set_to_none=True)
    assert bf16.bytes * 2 == fp32.bytes
    assert set(bf16.by_dtype) == {"bfloat16"}

    batch = torch.randint(0, 128, (2, 64))
    with track_saved_tensors(model) as full:
        model(input_ids=batch, labels=batch).loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16), track_saved_tensors(model) as mixed:
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    assert mixed.bytes < full.bytes  # less, not half: norms, softmax and the loss stay fp32


def test_fp16_overflows_and_bf16_does_not():
    assert torch.isinf(torch.tensor(70000.0).half())
    assert torch.tensor(70000.0).bfloat16().item() == 70144.0
    assert torch.finfo(torch.float16).max == 65504.0


def test_loss_scaling_recovers_a_gradient_that_underflows_in_fp16():
    x = torch.full((4,), 1e-4, dtype=torch.float16)
    grads = {}
    for dtype, scale in ((torch.float32, 1.0), (torch.float16, 1.0), (torch.float16, 2.0**16)):
        w = torch.ones(4, dtype=dtype, requires_grad=True)
        ((w * x.to(dtype)).float().sum() * 1e-4 * scale).backward()
        grads[(dtype, scale)] = w.grad[0].float().item() / scale
    reference = grads[(torch.float32, 1.0)]
    assert grads[(torch.float16, 1.0)] == 0.0  # underflow
    assert math.isclose(grads[(torch.float16, 2.0**16)], reference, rel_tol=1e-3)


def test_grad_scaler_skips_an_overflowing_step_and_halves_its_scale():
    w = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([w], lr=1.0)
    taken = []
    optimizer.register_step_post_hook(lambda *_: taken.append(1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for activation, expect_step, expect_scale in ((1e-4, True, 2.0**16), (3e4, False, 2.0**15)):
        before = len(taken)
        loss = (w.half() * torch.full((4,), activation, dtype=torch.float16)).float().sum() * 1e-4
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        assert (len(taken) > before) == expect_step and scaler.get_scale() == expect_scale
