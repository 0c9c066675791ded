"""Session-wide settings for the tests and for the kernels nbval and papermill start (they inherit them)."""

import os
import tempfile


def pytest_configure(config):
    os.environ["HF_HUB_OFFLINE"] = "1"  # no test may reach for the Hub; the fallback is what runs
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["WANDB_MODE"] = "offline"
    os.environ["MPLBACKEND"] = "Agg"
    # ipykernel 6 on Python 3.12+ (nbval's kernels in the runtime matrix): no debugpy warning at every start
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    os.environ["HELPERS_HEADLESS"] = "1"  # kernels no front end shows: widgets print instead (helpers._util.headless)
    # one thread per process: the tiny model's ops are too small to share out, and on a 2-core CI
    # machine the kernels and workers the tests start would otherwise wait on each other's cores
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # record() calls from notebooks executed in place by nbval land here, not in the tree
    os.environ["HELPERS_RESULTS_DIR"] = tempfile.mkdtemp(prefix="kit-results-")
