"""The estimator against bytes measured on CPU: no GPU, tiny random models of every family.

Two checks, each printed by scripts/bench_estimator.py (`--cpu`, `--allocator`) and held by the tests
(tests/test_estimate_families.py, tests/test_estimate.py, tests/test_estimate_allocator.py):
- the CPU grid: the activations against the bytes autograd saves for backward, over every family
  and setting the estimator takes;
- the allocator check: a whole training step's peak against what torch's CPU allocator hands out.
Needs torch, transformers, peft and bitsandbytes (imported where used: the published cases need none).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench_cases import error

from helpers._util import MIB
from helpers.estimate import estimate_training_memory

# --- the CPU grid: the estimator against the bytes autograd saves, measured ---------------------
# A tiny random model of every family, built with the real transformers class (no download), in
# every setting the estimator takes; activations measured with saved-tensor hooks
# (helpers.saved_tensors.track_saved_tensors). Needs torch, transformers, peft, bitsandbytes.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4)
CPU_FAMILIES = {  # model_type -> what its tiny config changes
    "llama": dict(num_key_value_heads=2),
    "mistral": dict(num_key_value_heads=2),
    "qwen2": dict(num_key_value_heads=2),
    "qwen3": dict(num_key_value_heads=2, head_dim=16),
    "gemma": dict(num_key_value_heads=2, head_dim=16),
    "gemma2": dict(num_key_value_heads=2, head_dim=16),
    "gemma3_text": dict(num_key_value_heads=2, head_dim=16),
    "phi3": dict(num_key_value_heads=4, pad_token_id=0),  # Phi-3-mini: as many key/value heads as query heads
    "gpt_neox": {},
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=256),
    "bert": dict(max_position_embeddings=256),
}
# where each family applies dropout (its config's names); "on" sets them all to 0.1
DROPOUT_KEYS = {
    "gpt2": ("attn_pdrop", "resid_pdrop", "embd_pdrop"),
    "bert": ("attention_probs_dropout_prob", "hidden_dropout_prob"),
    "phi3": ("attention_dropout", "resid_pdrop", "embd_pdrop"),
    "gpt_neox": ("attention_dropout", "hidden_dropout"),
}
QV_NAMES = {"phi3": ["qkv_proj"], "gpt_neox": ["query_key_value"], "gpt2": ["c_attn"], "bert": ["query", "value"]}
# precision mode -> (the model's dtype, autocast, estimator precision for full, for LoRA, LoRA's weights)
MODES = {
    "fp32": ("float32", False, "fp32", "fp32", "fp32"),
    "bf16 autocast": ("float32", True, "bf16", "bf16", "fp32"),
    "pure bf16": ("bfloat16", False, "bf16-true", "bf16", "bf16"),
}
CPU_SIZES = ((1, 32), (2, 64))  # (per_device_batch, seq_len)


def tiny_config(kind: str, dropout: bool):
    from transformers import AutoConfig

    values = dict(CPU_FAMILIES[kind]) if kind == "gpt2" else dict(TINY, **CPU_FAMILIES[kind])
    values.update({k: 0.1 if dropout else 0.0 for k in DROPOUT_KEYS.get(kind, ("attention_dropout",))})
    return AutoConfig.for_model(kind, **values)


def _build(kind: str, impl: str, dtype: str, dropout: bool, method: str, checkpointing: bool, tmp: Path):
    """The model to train (a peft model for LoRA and QLoRA), and the transformers model under it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BertForSequenceClassification

    torch.manual_seed(0)
    config = tiny_config(kind, dropout)
    cls = BertForSequenceClassification if kind == "bert" else AutoModelForCausalLM
    build = cls._from_config if kind == "bert" else cls.from_config
    model = build(config, attn_implementation=impl).to(getattr(torch, dtype))
    if method == "full":
        return model.train(), model
    targets = "all-linear" if dropout else QV_NAMES.get(kind, ["q_proj", "v_proj"])
    if method == "qlora":
        return _qlora(
            model,
            getattr(torch, dtype),
            tmp / kind,
            r=8,
            dropout=0.1 * dropout,
            targets=targets,
            checkpointing=checkpointing,
        )
    adapter = LoraConfig(
        r=8,
        target_modules=targets,
        lora_dropout=0.1 * dropout,
        fan_in_fan_out=kind == "gpt2",
        task_type="SEQ_CLS" if kind == "bert" else None,
    )
    return get_peft_model(model, adapter).train(), model


def _qlora(model, compute, folder: Path, *, r: int, dropout: float, targets, checkpointing: bool):
    """The course's QLoRA recipe on CPU: `model` saved to `folder` and loaded back in nf4 with double
    quantization, computing in `compute` (fp32 on CPU; bf16 for autocast, as on a card), then peft's
    k-bit preparation and LoRA (helpers.qlora). Returns the peft model, in training mode, and its base."""
    from transformers import BitsAndBytesConfig

    from helpers.qlora import add_adapter, disable_cpu_repacking

    model.save_pretrained(folder)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute
    )
    impl = model.config._attn_implementation
    base = type(model).from_pretrained(folder, quantization_config=nf4, dtype=compute, attn_implementation=impl)
    disable_cpu_repacking(base)
    trained = add_adapter(base, r=r, alpha=2 * r, dropout=dropout, target_modules=targets, checkpointing=checkpointing)
    return trained.train(), base


def measure_saved(trained, model, batch: int, seq_len: int, autocast: bool, checkpointing: bool | None) -> int:
    """Bytes saved for backward by one forward (checkpointing None: as the model was built)."""
    import torch

    from helpers.saved_tensors import track_saved_tensors

    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif checkpointing is not None:
        model.activation_checkpointing_disable()
        if hasattr(model, "_require_grads_hook"):  # checkpointing made the inputs require grad; undo it
            model.disable_input_require_grads()
    ids = torch.randint(3, model.config.vocab_size, (batch, seq_len))
    labels = torch.randint(0, 2, (batch,)) if model.config.model_type == "bert" else ids
    with track_saved_tensors(trained) as saved, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        trained(input_ids=ids, labels=labels)
    # no backward: the forward saved all there is to count, and the output, dropped here, takes its graph along
    # (the hooks hold detached aliases: nothing else keeps it alive); a backward was a quarter of the grid's time
    return saved.bytes


def cpu_grid(kinds=None, impls=("eager", "sdpa"), modes=None, methods=("full", "lora", "qlora"), sizes=CPU_SIZES):
    """Rows (settings, measured bytes, predicted bytes) over every family and setting asked for."""
    import itertools
    import tempfile
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()  # no progress bars or notices for 200 tiny models
    logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's deprecation notices, not ours
        for kind, impl, dropout, method, mode in itertools.product(
            kinds or CPU_FAMILIES, impls, (False, True), methods, modes or MODES
        ):
            dtype, autocast, full, lora, weights = MODES[mode]
            if (kind == "gemma2" and impl == "sdpa") or (
                method == "qlora" and (mode == "pure bf16" or kind in ("gpt2", "bert"))
            ):
                continue  # Gemma 2 has no sdpa path; QLoRA: peft's k-bit preparation keeps fp32 norms, on decoders
            if method == "qlora":  # the 4-bit base computes in bf16 under autocast
                dtype = "bfloat16" if autocast else "float32"
            built = None
            for checkpointing in (False, True):
                if built is None or method == "qlora":  # peft's k-bit preparation sets checkpointing itself
                    built = _build(kind, impl, dtype, dropout, method, checkpointing, Path(tmp))
                trained, model = built
                for batch, seq_len in sizes:
                    measured = measure_saved(
                        trained, model, batch, seq_len, autocast, None if method == "qlora" else checkpointing
                    )
                    predicted = estimate_training_memory(
                        model.config,
                        per_device_batch=batch,
                        seq_len=seq_len,
                        checkpointing=checkpointing,
                        precision=full if method == "full" else lora,
                        weights=None if method != "lora" else weights,
                        method=method,
                        lora_r=8,
                        lora_targets="all-linear" if dropout else QV_NAMES.get(kind, ["q_proj", "v_proj"]),
                        lora_dropout=0.1 if dropout and method != "full" else 0.0,
                        device="cpu",
                    ).activations
                    settings = (
                        kind,
                        impl,
                        "dropout" if dropout else "-",
                        method,
                        mode,
                        "ckpt" if checkpointing else "-",
                    )
                    rows.append((settings + (batch, seq_len), measured, predicted))
    return rows


def print_grid(rows) -> None:
    """Median and worst error of the CPU grid, overall and by family and method."""
    errors = [(r[0], error(r[2], r[1])) for r in rows]
    print(f"\nCPU grid: {len(rows)} configurations, activations against saved-tensor bytes")
    for label, index in (("family", 0), ("method", 3)):
        for key in dict.fromkeys(s[index] for s, _ in errors):
            mine = [abs(e) for s, e in errors if s[index] == key]
            median, most = 100 * statistics.median(mine), 100 * max(mine)
            print(f"  {label} {key:12} n={len(mine):3}  median {median:.2f}%  worst {most:.2f}%")
    worst = max(errors, key=lambda r: abs(r[1]))
    print(
        f"  all: median {100 * statistics.median(abs(e) for _, e in errors):.2f}%, worst {100 * abs(worst[1]):.2f}% "
        f"({' '.join(map(str, worst[0]))})"
    )


# --- the allocator check: the whole step's peak against what torch's CPU allocator hands out -----
# Saved-tensor hooks miss what is not saved: transients (a dequantized 4-bit weight, the loss's
# backward), tensors kept on an autograd ctx, the moment inside backward when the most is alive.
# helpers/_cpu_peak.py reads every allocation and free from torch's profiler. Two shapes of a tiny
# random Llama (2 layers, 8 heads, 4 key/value heads, untied head, sdpa): one where the logits and
# the loss set the peak, as in small LMs; one where the weights are wide beside the vocabulary and
# the tokens few, as in a 7B at a short sequence, so that a layer's backward sets it.
ALLOCATOR_SHAPES = {  # name -> (the config's sizes, (per_device_batch, seq_len))
    "vocab-bound": (dict(hidden_size=256, intermediate_size=704, vocab_size=2048), (2, 128)),
    "weight-bound": (dict(hidden_size=512, intermediate_size=1536, vocab_size=1024), (2, 64)),
}
# (method, estimator precision): fp32 throughout, or a 4-bit base computing in bf16 under autocast
ALLOCATOR_RUNS = (("full", "fp32"), ("lora", "fp32"), ("qlora", "fp32"), ("qlora", "bf16"))
ALLOCATOR_LORA_R = 16  # all-linear adapters, no dropout (peft's default)
ALLOCATOR_LOOPS = ("trainer", "custom")  # what the loop keeps of the output (estimate_training_memory's `loop`)


def _allocator_model(sizes: dict, method: str, precision: str, checkpointing: bool, tmp: Path):
    """The model a step trains, and the transformers model under it, for one allocator run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4, **sizes)
    config.tie_word_embeddings = False
    model = LlamaForCausalLM(config)
    if method == "qlora":  # saved in bf16, as checkpoints ship; loaded in the compute dtype
        compute = torch.bfloat16 if precision == "bf16" else torch.float32
        return _qlora(
            model.to(torch.bfloat16),
            compute,
            tmp / f"{sizes['hidden_size']}-{precision}",
            r=ALLOCATOR_LORA_R,
            dropout=0.0,
            targets="all-linear",
            checkpointing=checkpointing,
        )
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if method == "full":
        return model.train(), model
    adapter = LoraConfig(r=ALLOCATOR_LORA_R, lora_alpha=2 * ALLOCATOR_LORA_R, target_modules="all-linear")
    return get_peft_model(model, adapter).train(), model


def measure_step(trained, batch: int, seq_len: int, autocast: bool, loop: str = "trainer", reserved: bool = False):
    """Peak bytes of one training step (forward, backward, fused AdamW's step, gradients set to None)
    above the resident weights: the allocator's peak above the step's start, plus the optimizer
    states already there. A first step creates the states and any lazy buffer; the next two are measured.

    loop: "trainer" lets the output go before the optimizer's step, as the Trainer does; "custom"
    is the Hugging Face course's loop, `outputs = model(**batch); outputs.loss.backward()`: the name
    holds the output through backward and the step, and the previous one through the next forward."""
    import torch

    from helpers._cpu_peak import track_allocations

    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(3, trained.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(0))
    held = []  # the loop's `outputs` variable, bound again when the next forward returns

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            outputs = trained(input_ids=ids, labels=ids)
        held[:] = [outputs] if loop == "custom" else []
        loss = outputs.loss
        del outputs  # the Trainer's compute_loss returns the loss alone: the output goes before backward
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    held.clear()  # what the first step left is freed before the block: the block sees all it holds
    states = sum(t.nbytes for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
    with track_allocations() as allocated:
        step()  # a custom loop's first step binds its output; the second runs its forward beside it
        step()
    held.clear()
    if reserved:  # and what torch.cuda's caching allocator would reserve above the step's start, plus the states
        return allocated.peak + states, allocated.reserved + states
    return allocated.peak + states


def allocator_grid(shapes=None, runs=ALLOCATOR_RUNS, loops=ALLOCATOR_LOOPS) -> list:
    """Rows ((shape, method, precision, checkpointing, loop), measured, predicted): step bytes above the weights."""
    import itertools
    import tempfile
    import warnings

    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' and peft's deprecation notices, not ours
        for name in shapes or ALLOCATOR_SHAPES:
            sizes, (batch, seq_len) = ALLOCATOR_SHAPES[name]
            for (method, precision), checkpointing in itertools.product(runs, (False, True)):
                # one model for every loop: a step's memory does not depend on the weights' values, and each
                # measure_step starts its own optimizer and lets it go
                trained, model = _allocator_model(sizes, method, precision, checkpointing, Path(tmp))
                for loop in loops:
                    measured = measure_step(trained, batch, seq_len, autocast=precision != "fp32", loop=loop)
                    e = estimate_training_memory(
                        model.config,
                        per_device_batch=batch,
                        seq_len=seq_len,
                        precision=precision,
                        method=method,
                        lora_r=ALLOCATOR_LORA_R,
                        checkpointing=checkpointing,
                        optimizer="adamw",  # fused: its step builds nothing
                        loop=loop,
                        device="cpu",
                    )
                    rows.append(((name, method, precision, checkpointing, loop), measured, e.allocated - e.weights))
    return rows


def print_allocator(rows) -> None:
    """The step peak above the weights: torch's CPU allocator against the estimator."""
    print("\nstep peak above the weights (forward, backward, fused AdamW step), CPU allocator vs estimator")
    print(
        f"{'shape':13} {'method':6} {'precision':13} {'ckpt':5} {'loop':8} {'measured MiB':>12} {'estimate MiB':>12} "
        f"{'error':>7}"
    )
    for (name, method, precision, checkpointing, loop), measured, predicted in rows:
        label = "bf16 autocast" if precision == "bf16" else precision
        print(
            f"{name:13} {method:6} {label:13} {'on' if checkpointing else 'off':5} {loop:8} {measured / MIB:12.3f} "
            f"{predicted / MIB:12.3f} {100 * error(predicted, measured):+6.1f}%"
        )
