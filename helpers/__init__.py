"""Helpers for the compute-realities course kit: fine-tuning on the GPUs students can get.

One concept a module; each module's docstring names the notebook that teaches it.

notebook                    module (what it holds)
00 where to get GPUs        env (platform, cards, precision), models (load, embedded fallback), data
01 memory anatomy           memory (readouts), job (a job's settings, checked), estimate (what fits), plan,
                            planner (with controls), catalog
02 mixed precision          training (precision, TrainingArguments), saved_tensors, audit
03 gradient checkpointing   oom (pretend card, free_memory, fit_batch), live (live readout), audit,
                            estimate (estimate_run_memory: a whole run's reserve), session (expandable segments)
04 gradient accumulation    training (effective batch), oom (fit_batch)
05 QLoRA                    qlora (4-bit + LoRA in one call), footprint (what it holds), plan, capstone (the
                            7B job of 05 and 08)
06 experiment tracking      tracking (wandb without prompts), seeds, manifest
07 Kaggle T4 x2             memory (read_gpu_memory: NVML, CUDA untouched), sharding (FSDP2 per rank, the traffic,
                            the fewest cards), estimate (world_size, sharding)
08 capstone                 runs (which run folder: the same run, or a new one), resume (after a
                            disconnect), manifest, live, qlora, footprint, planner
06 and 08 (secrets)         tokens (HF_TOKEN, WANDB_API_KEY: env, login, Colab, Kaggle), share (push the adapter)
online (the Hub, wandb)     network (every call that leaves the machine, bounded in total time)
every notebook              session (`start`: one GPU, expandable segments, the seed, the machine), results (`record`),
                            quickcheck/ (quick checks, grading)
the install cell            install (what pip changed in the runtime; what it broke, mended or named)

Maintainer tooling (`maintainer/`: the notebook builder, the Colab/Kaggle badges, the headless
runner) and the command line (`python -m helpers`) sit apart from what students import. Modules
whose names start with "_" are private to the package.

Importing `helpers` is cheap: torch and transformers load only when a function needs them.
"""

from helpers._util import GIB, MIB, quiet_libraries
from helpers.results import record
from helpers.session import start

__all__ = ["GIB", "MIB", "record", "start"]
__version__ = "0.1.0"

# before bitsandbytes is imported: on a CPU with AVX512-BF16 its CPU backend warns, once per process,
# that an optional faster kernel package is missing, and a student would take that red line for an error
# (peft's use of a deprecated transformers name too: _util.quiet_libraries says which)
quiet_libraries()
