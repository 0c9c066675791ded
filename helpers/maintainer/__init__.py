"""Maintainer tooling: what builds, runs and links the notebooks; students never import it.

- `notebooks`: notebooks/src/*.py (what people edit) -> notebooks/*.ipynb, the one install cell,
  the notebook metadata, and where the kit installs from (`REPOSITORY`, `BRANCH`).
- `badges`: colab_badges.md, one Colab and one Kaggle badge per notebook.
- `runner`: `python -m helpers run` (`make run`): every notebook headless with papermill, on this
  machine or on a simulated card (`--simulate T4`); `execution` runs one notebook, `summary`
  writes the report.
- `publish`: `python -m helpers publish --repo OWNER/NAME --ref REF`: a fork's badges, install
  cells and README retargeted in one command.
- `gpu_proof`: `python -m helpers gpu-proof --out DIR`: the kit proven on one real CUDA card.
- `export`: `python -m helpers export 08 --out DIR [--nodes N] [--gpus G]`: notebook 08 as a cluster
  job, a `train.py` (`train_template`) that resumes from its last valid checkpoint, a torchrun
  `launch.sh` for G GPUs on each of N nodes, an accelerate config for one machine and a Slurm
  `job.sbatch` (`job_scripts`) that runs launch.sh on every node and requeues itself on preemption.
- `fake_trace`: a training run of the real transformers model on fake tensors, every allocation
  recorded: the estimator and the whole-run replay held to a 7B's own requests without a GPU
  (tests/test_fake_trace.py, tests/test_estimate_run.py, scripts/bench_fake.py).
"""
