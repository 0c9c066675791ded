"""Helpers for the compute-realities course kit: fine-tuning on the GPUs students can get.

One concept a module (each module's docstring names the notebook that teaches it):
env (where am I running), models (load a model, QLoRA in one call, the embedded fallback),
data (the course dataset), training (seeds, precision, TrainingArguments, effective batch, audit,
auto-fit), memory (readouts, live callback, free_memory), estimate (what fits before it runs),
tracking (wandb without prompts, run manifests, seeds), checkpoints (resume after a disconnect),
results (`record`), quickcheck (quick checks and grading), notebooks, runner and badges (the
headless runs and the Colab/Kaggle links).

Importing `helpers` is cheap: torch and transformers load only when a function needs them.
"""

from helpers.results import record

__all__ = ["record"]
__version__ = "0.1.0"
