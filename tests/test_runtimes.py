"""The runtime matrix's inputs (noxfile.py, tests/runtimes/*.txt): the runtimes students have, named and sourced.

`make test-runtimes` runs the matrix itself (minutes per session, several GB of torch); these
tests check, in seconds, that what it builds is what the runtimes ship and that it finds its Pythons.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

nox = pytest.importorskip("nox", reason="nox drives the matrix from the kit's venv (requirements-dev.txt)")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import noxfile  # noqa: E402

# what every runtime file must pin: what the kit's dependencies touch, or the install cell can break
MUST_HOLD = (
    "torch",
    "torchao",
    "traitlets",
    "ipython",
    "ipykernel",
    "setuptools",
    "huggingface-hub",
    "gradio",
    "diffusers",
    "transformers",
    "peft",
    "protobuf",
    "grpcio-status",
)


@pytest.mark.parametrize("runtime", sorted(noxfile.RUNTIMES))
def test_each_runtime_file_names_its_source_and_pins_what_the_install_cell_touches(runtime):
    path = noxfile.RUNTIMES_DIR / f"{runtime}.txt"
    text = path.read_text()
    assert re.search(r"Source:[\s\S]{0,300}github\.com/\S+", text), f"{path.name} names the snapshot it copies"
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"{path.name} dates its snapshot"
    pins = noxfile.pins(path)
    missing = [name for name in MUST_HOLD if name not in pins]
    assert not missing, f"{path.name} must pin {missing}: the kit's install touches them on {runtime}"
    assert all("+" not in line for line in pins.values()), "PyPI has no local versions such as +cu128"


def test_the_runtimes_are_colabs_and_kaggles_pythons_and_torch():
    python = {name: version for name, (version, _) in noxfile.RUNTIMES.items()}
    assert python == {"colab": "3.13", "kaggle": "3.12"}
    torch = {name: noxfile.pins(noxfile.RUNTIMES_DIR / f"{name}.txt")["torch"] for name in noxfile.RUNTIMES}
    assert torch == {"colab": "torch==2.11.0", "kaggle": "torch==2.10.0"}


@pytest.mark.parametrize("runtime", sorted(noxfile.RUNTIMES))
def test_the_test_tools_never_move_a_runtime_library(runtime):
    tools = [re.match(r"[\w.-]+", line).group(0).lower() for line in noxfile.tools(runtime)]
    runtime_pins = noxfile.pins(noxfile.RUNTIMES_DIR / f"{runtime}.txt")
    assert {"pytest", "nbval", "papermill"} <= set(tools) and "nox" not in tools
    assert not set(tools) & set(runtime_pins), "a tool the runtime ships is taken at the runtime's version"


def test_a_venv_is_rebuilt_when_its_runtime_file_changes(tmp_path, monkeypatch):
    for name in ("requirements.txt", "requirements-dev.txt"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "runtimes").mkdir()
    (tmp_path / "runtimes" / "colab.txt").write_text("torch==2.11.0\n")
    monkeypatch.setattr(noxfile, "ROOT", tmp_path)
    monkeypatch.setattr(noxfile, "RUNTIMES_DIR", tmp_path / "runtimes")
    before = noxfile.key("colab")
    (tmp_path / "runtimes" / "colab.txt").write_text("torch==2.12.0\n")
    assert noxfile.key("colab") != before


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_matrix_finds_a_python_that_runs(version):
    found = noxfile.find_python(version)
    if found == version:
        pytest.skip(f"no Python {version} on this machine: make test-runtimes says how to install one")
    done = subprocess.run([found, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert done.stdout.strip() == str(tuple(int(n) for n in version.split(".")))
