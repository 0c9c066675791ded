"""Maintainer tooling: what builds, runs and links the notebooks; students never import it.

- `notebooks`: notebooks/src/*.py (what people edit) -> notebooks/*.ipynb, the one install cell,
  the notebook metadata, and where the kit installs from (`REPOSITORY`, `BRANCH`).
- `badges`: colab_badges.md, one Colab and one Kaggle badge per notebook.
- `runner`: `python -m helpers run` (`make run`): every notebook headless with papermill.
"""
