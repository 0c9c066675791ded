"""The course's 7B QLoRA job on a T4: the job notebook 05 plans and notebook 08 runs, defined once.

Both notebooks estimate it through `capstone_estimate`, each passing its own parameters, so the two
print one figure for one job; their parameters cells hold the values of `CAPSTONE_JOB`
(tests/test_qlora_notebook.py checks it, and that the figures the two record agree). Pure Python:
no torch, no network.
"""

from __future__ import annotations

from types import MappingProxyType

from helpers.estimate import Estimate, estimate_training_memory

__all__ = ["CAPSTONE_JOB", "capstone_estimate"]

# what notebook 08 trains with: its model_id's shape, one sequence of 512 tokens a micro-batch, 16
# micro-batches a step, load_qlora's adapters, checkpointing, and the Trainer's default optimizer on them
CAPSTONE_JOB = MappingProxyType(
    {
        "model": "Qwen2.5-7B",  # the shape of unsloth/Qwen2.5-7B-bnb-4bit, 08's model_id
        "gpu": "T4",  # 14.75 GiB to PyTorch
        "per_device_batch": 1,
        "grad_accum_steps": 16,  # effective batch = 1 x 16 x 1 = 16
        "seq_len": 512,  # tokens kept per example
        "method": "qlora",
        "lora_r": 16,  # load_qlora's defaults: rank 16, dropout 0.05
        "lora_dropout": 0.05,
        "optimizer": "adamw_torch_fused",  # TrainingArguments' default `optim`
        "checkpointing": True,
    }
)


def capstone_estimate(**changes) -> Estimate:
    """Estimate the course's 7B QLoRA job on a T4 (`CAPSTONE_JOB`), with any of its settings changed.

    Args:
        changes: any key of `CAPSTONE_JOB` (a notebook's own parameters: `model=plan_model`,
            `seq_len=seq_len`) or any other setting of `estimate_training_memory`. The precision
            follows the card as 08's Trainer picks it (bf16 from compute capability 8.0, fp16 below,
            so fp16 on a T4) unless `precision` is given.

    Example:
        >>> e = capstone_estimate()
        >>> e.settings["method"], e.settings["precision"], e.fits("T4")
        ('qlora', 'fp16', True)
    """
    settings = dict(CAPSTONE_JOB, **changes)  # the estimator takes the card's precision when none is given
    return estimate_training_memory(settings.pop("model"), **settings)
