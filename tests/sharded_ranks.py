"""Run under `python -m torch.distributed.run --nproc-per-node 2`: train the embedded model a few steps in each
configuration of tests/test_sharding.py (data parallel or sharded, full or LoRA, with or without checkpointing),
measure this process's weights, gradients, AdamW state and step peak, and (rank 0) print one JSON line per
configuration with the estimate beside each figure. Two CPU processes over gloo stand in for two GPUs.
"""

import contextlib
import datetime
import io
import json
import sys

import torch
import torch.distributed as dist

from helpers.estimate import estimate_training_memory
from helpers.memory import measure
from helpers.models import load_model
from helpers.sharding import shard, step_peak

BATCH, SEQ_LEN, STEPS = 4, 64, 7  # the first step allocates AdamW's state: the six after it are compared


def run(method: str, sharding: str, checkpointing: bool) -> dict:
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        model, _ = load_model("embedded", smoke=True, dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))
        if checkpointing:
            model.enable_input_require_grads()
    config = model.config.to_dict()
    model = shard(model, sharding)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, foreach=True)
    peaks = []
    with measure("rank", model=model, optimizer=optimizer) as bill:
        for step in range(STEPS):
            batch = torch.randint(
                0, config["vocab_size"], (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(step)
            )
            optimizer.zero_grad()
            with step_peak() as peak:
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                optimizer.step()
            del loss
            peaks.append(peak.bytes)
    e = estimate_training_memory(
        config, per_device_batch=BATCH, seq_len=SEQ_LEN, precision="fp32", method=method, lora_r=8,
        optimizer="adamw_foreach", checkpointing=checkpointing, world_size=dist.get_world_size(), sharding=sharding,
        device="cpu",
    )  # fmt: skip
    measured = bill.as_dict()
    return {
        "config": f"{method}, {sharding}, checkpointing {'on' if checkpointing else 'off'}",
        "weights": [measured["weights"], e.weights],
        "gradients": [measured["gradients"], e.gradients],
        "optimizer": [measured["optimizer"], e.optimizer + 4 * len(trainable)],  # AdamW's step counts, 4 bytes each
        "peak": [peaks[1:], e.allocated - e.weights - e.optimizer],  # every step after the first, and the estimate
    }


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    for spec in sys.argv[1:]:  # method:sharding:checkpointing, e.g. lora:grad_op:1
        method, sharding, checkpointing = spec.split(":")
        row = run(method, sharding, checkpointing == "1")
        if dist.get_rank() == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
