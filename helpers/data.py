"""The course dataset that ships with the kit: instruction/response pairs about training on a budget.

Written for the kit (helpers/assets/data/course.jsonl, one JSON object a line with "topic",
"instruction" and "response"), so every notebook can train offline. Loaded in notebook 00 and
used by every notebook that trains.
"""

from __future__ import annotations

from pathlib import Path

DATASET_PATH = Path(__file__).parent / "assets" / "data" / "course.jsonl"


def load_course_data():
    """Load the course dataset as a `datasets.Dataset` through `load_dataset("json", ...)`.

    Example:
        >>> ds = load_course_data()  # doctest: +SKIP
        >>> ds[0]["instruction"]  # doctest: +SKIP
    """
    from datasets import load_dataset

    if not DATASET_PATH.is_file():
        raise FileNotFoundError(
            f"The course dataset {DATASET_PATH} is missing. Reinstall the kit "
            "(pip install -e . from the repository, or the notebook's install cell)."
        )
    return load_dataset("json", data_files=str(DATASET_PATH), split="train")
