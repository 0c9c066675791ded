"""Session-wide settings for the tests and for the kernels nbval and papermill start (they inherit them)."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

# The session and every process it starts write the bytecode of what they import, even where the caller's
# environment says not to (PYTHONDONTWRITEBYTECODE, set on this CI's machines), as make's recipes do: the venv
# is installed without it, and otherwise each of the suite's processes compiles torch again (importing torch,
# transformers and peft: 13.7 s without bytecode, 5.3 s with).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

SCRATCH_PREFIX = "kit-tests-"
SCRATCH_KEPT = 3  # sessions' folders kept for reading after a run, this one included


def pytest_configure(config):
    scratch_folder()
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


def scratch_folder() -> Path:
    """One folder per session for every temporary file the session and the processes it starts write: TMPDIR.

    A run of the suite wrote about 150 MB to the system's temporary folder beside pytest's own `tmp_path`s (the
    lane's notebook runs and background fixtures, the warm kernels' sockets, a hundred `torchelastic_*` folders
    from torch's launcher), and nothing removed them: 5 GB after one day's runs. Now they, and pytest's
    `tmp_path`s, go to `kit-tests-<pid>-<random>`, and earlier sessions' folders are removed once the newest
    `SCRATCH_KEPT` are kept, unless the session that made one is still running (its pid is in the name)."""
    root = Path(tempfile.gettempdir())
    earlier = sorted(root.glob(f"{SCRATCH_PREFIX}*"), key=_modified, reverse=True)
    for folder in earlier[SCRATCH_KEPT - 1 :]:
        if not _running(folder):
            shutil.rmtree(folder, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # tempfile reads TMPDIR again at its next call
    return folder


def _modified(folder: Path) -> float:
    try:
        return folder.stat().st_mtime
    except OSError:  # another session removed it meanwhile
        return 0.0


def _running(folder: Path) -> bool:
    """Whether the session that made `folder` is still running."""
    try:
        pid = int(folder.name.removeprefix(SCRATCH_PREFIX).split("-")[0])
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
