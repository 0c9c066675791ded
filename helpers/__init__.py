"""Helpers for the compute-realities course kit: fine-tuning on the GPUs students can get.

One concept a module (see each module's docstring for the notebook that teaches it):
env (where am I running), models (load a model or the embedded one), data (the course dataset),
training (seeds, precision), results (`record`), notebooks and runner (the headless runs).
Importing `helpers` is cheap: torch and transformers load only when a function needs them.
"""

from helpers.results import record

__all__ = ["record"]
__version__ = "0.1.0"
