"""Helpers for the compute-realities course kit: fine-tuning on the GPUs students can get.

One concept a module; each module's docstring names the notebook that teaches it.

notebook                    module (what it holds)
00 where to get GPUs        env (platform, cards, precision), models (load, embedded fallback), data
01 memory anatomy           memory (readouts), estimate (what fits), plan, catalog (models, cards)
02 mixed precision          training (precision, TrainingArguments), saved_tensors, audit
03 gradient checkpointing   oom (pretend card, free_memory, fit_batch), live (live readout), audit
04 gradient accumulation    training (effective batch), oom (fit_batch)
05 QLoRA                    qlora (4-bit + LoRA in one call, footprint), plan
06 experiment tracking      tracking (wandb without prompts), seeds, manifest
07 Kaggle T4 x2             memory (read_gpu_memory: NVML, CUDA untouched)
08 capstone                 resume (after a disconnect), manifest, live, qlora
every notebook              results (`record`), quickcheck/ (quick checks, grading)
the install cell            install (what pip changed in the runtime; what it broke, mended or named)

Maintainer tooling (`maintainer/`: the notebook builder, the Colab/Kaggle badges, the headless
runner) and the command line (`python -m helpers`) sit apart from what students import. Modules
whose names start with "_" are private to the package.

Importing `helpers` is cheap: torch and transformers load only when a function needs them.
"""

from helpers._util import GIB, MIB
from helpers.results import record

__all__ = ["GIB", "MIB", "record"]
__version__ = "0.1.0"
