"""The session's scratch folder (the repository's conftest.py): earlier sessions' folders are removed beyond the
newest three, never one whose session is still running, and every temporary file goes to the new one."""

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _root_conftest():
    spec = importlib.util.spec_from_file_location("kit_root_conftest", ROOT_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_earlier_sessions_beyond_the_newest_three_go_unless_still_running(tmp_path, monkeypatch):
    settings = _root_conftest()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, alive = int(ended.stdout), os.getpid()  # a process that has exited, and this one
    made = {}
    for age, (name, pid) in enumerate([("new", dead), ("newer-old", dead), ("old", dead), ("running", alive)]):
        folder = tmp_path / f"{settings.SCRATCH_PREFIX}{pid}-{name}"
        folder.mkdir()
        (folder / "file").write_text("x")
        os.utime(folder, (1_000_000 - age * 1000, 1_000_000 - age * 1000))  # listed newest first
        made[name] = folder
    unrelated = tmp_path / "kit-notebooks-cpu-abc"
    unrelated.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    folder = settings.scratch_folder()

    assert folder.parent == tmp_path and folder.name.startswith(f"{settings.SCRATCH_PREFIX}{os.getpid()}-")
    assert made["new"].exists() and made["newer-old"].exists(), "the two newest earlier sessions are kept"
    assert not made["old"].exists(), "an ended session beyond the newest three is removed"
    assert made["running"].exists(), "a session still running keeps its folder, however old"
    assert unrelated.exists(), "only the sessions' folders are touched"
    assert os.environ["TMPDIR"] == str(folder) and Path(tempfile.mkdtemp()).parent == folder
