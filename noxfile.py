"""The runtime matrix: the kit on the Python, torch and libraries students have (`make test-runtimes`).

One session per runtime, each built from its file in tests/runtimes/ (which names its source):

    colab    Python 3.13, torch 2.11.0, Colab's libraries;  notebooks under a simulated T4
    kaggle   Python 3.12, torch 2.10.0, Kaggle's libraries; notebooks under a simulated T4 x2
    device   the lent GPU machine's image on the CPU (scripts/device-image.txt: Python 3.12,
             torch 2.11.0, transformers 5.17.0) with the wheelhouse that travels to it
             (scripts/build_device_wheels.py) installed as scripts/device_gpu_proof.sh installs it
             there; then its preflight, gpu-proof's tests and every notebook through it. Skipped,
             saying why, where the wheels cannot be downloaded.

Each session, in order:
1. a venv from that Python, found on PATH or among pyenv's builds (never downloaded: a missing one
   fails the session with the command that installs it);
2. the runtime's libraries at their versions, installed by uv (torch is PyPI's CUDA build, several GB; it
   runs on the CPU), then the test tools the runtime lacks, at requirements-dev.txt's pins, constrained by
   the runtime file so that none of them moves a runtime library;
3. the kit, installed by the notebooks' own install cell (scripts/measure_install.py --run-in),
   exactly as a student's Run all does it: it must leave the runtime working;
4. the unit tests (`-m "not notebooks"`) and, beside them on the other core, every notebook
   headless in its two configurations: the smoke run under the runtime's simulated card
   (`helpers run --smoke --simulate`), then the committed notebooks as a student's Run All on this
   CPU, default parameters, through nbval (`pytest --nbval-lax notebooks`: `make test` runs the
   smoke run only, since on a CPU the two differ only in step counts); the session ends with a line
   of what each step took.

Steps 1-2 are kept between runs: the venvs live outside the clone, in $KIT_RUNTIMES_DIR (default
~/.cache/compute-realities-kit/runtimes), and are rebuilt only when their runtime file,
requirements.txt or requirements-dev.txt changes. The kit is installed afresh every run.

    make test-runtimes                         # both sessions (what .ci/run runs last)
    .venv/bin/python -m nox -s colab           # one
    .venv/bin/python -m nox --install-only     # build (or check) the venvs, run nothing: before a CI run
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nox

from helpers._requirements import read_pins  # the kit is installed in the venv that runs nox

ROOT = Path(__file__).resolve().parent
RUNTIMES_DIR = ROOT / "tests" / "runtimes"
DEVICE_IMAGE = ROOT / "scripts" / "device-image.txt"  # the lent GPU machine's image, as far as the kit touches it
# runtime -> (its Python, the card its notebooks run under: helpers run --simulate)
RUNTIMES = {"colab": ("3.13", "T4"), "kaggle": ("3.12", "T4x2")}
DISTRIBUTION = "compute-realities-kit"  # pyproject.toml's name, as helpers.maintainer.notebooks.DISTRIBUTION
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two lanes on two cores: each process keeps to its own

# set the folder with KIT_RUNTIMES_DIR, not nox's --envdir: the venvs' stamps are read from here
nox.options.envdir = os.environ.get("KIT_RUNTIMES_DIR") or str(Path.home() / ".cache/compute-realities-kit/runtimes")
nox.options.reuse_venv = "yes"  # unless the session says otherwise: see built()
nox.options.error_on_missing_interpreters = True  # a runtime not tested is a failure, not a skip
nox.options.download_python = "never"  # Pythons come from pyenv or the system, never from the network
nox.options.sessions = [*RUNTIMES, "device"]


def find_python(version: str) -> str:
    """The newest Python `version` (e.g. "3.13") here: on PATH, else among pyenv's builds; else `version` itself.

    nox's own lookup sees only pyenv's active versions. A shim for an inactive version is on PATH
    but fails when run, so a candidate counts only once it runs. Where none is found nox fails
    the session, and `make test-runtimes` has already said how to install one.
    """
    on_path = shutil.which(f"python{version}")
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    builds = sorted(
        root.glob(f"versions/{version}.*/bin/python{version}"),
        key=lambda p: [int(n) if n.isdigit() else -1 for n in p.parts[-3].split(".")],
        reverse=True,
    )
    for candidate in [on_path, *map(str, builds)]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return version


def pins(path: Path) -> dict[str, str]:
    """{canonical name: `name==version`} of every pin in a requirements file, read as the kit reads them."""
    return {name: f"{name}=={version}" for name, (version, _) in read_pins(path).items()}


def runtime_file(runtime: str) -> Path:
    """The file a session's venv is built from: tests/runtimes/NAME.txt, or the device's image."""
    return DEVICE_IMAGE if runtime == "device" else RUNTIMES_DIR / f"{runtime}.txt"


def key(runtime: str) -> str:
    """What a runtime's venv is built from: its runtime file and the kit's two requirements files."""
    files = [runtime_file(runtime), ROOT / "requirements.txt", ROOT / "requirements-dev.txt"]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]


def stamp(runtime: str) -> Path:
    return Path(nox.options.envdir) / runtime / ".kit-runtime-key"


def built(runtime: str) -> bool:
    """Whether the runtime's venv holds what today's files ask for (its stamp says their key)."""
    path = stamp(runtime)
    return path.exists() and path.read_text() == key(runtime)


def tools(runtime: str) -> list[str]:
    """requirements-dev.txt's pins for what the runtime does not ship (pytest, nbval, papermill, ruff; not nox)."""
    kit, runtime_pins = pins(ROOT / "requirements.txt"), pins(RUNTIMES_DIR / f"{runtime}.txt")
    dev = pins(ROOT / "requirements-dev.txt")
    return [line for name, line in dev.items() if name not in kit and name not in runtime_pins and name != "nox"]


def install(session: nox.Session, *args: str) -> None:
    """Install into the session's venv with uv (the Makefile's pin, in the venv that runs nox), byte-compiled:
    the venv is built once and kept. A cold build of all three took 5 min 35 s with pip, most of it unpacking
    and compiling on one core. The venv keeps the pip the runtime has, which the install cell runs."""
    python = str(Path(session.bin) / "python")
    session.run_install(sys.executable, "-m", "uv", "pip", "install", "-q", "--compile-bytecode", "--python", python,
                        *args, external=True)  # fmt: skip


def installing_only(session: nox.Session) -> bool:
    """Whether nox was asked only to build the venvs (`nox --install-only`): session.run then runs nothing."""
    return session.run("python", "-c", "pass", silent=True) is None


def run_runtime(session: nox.Session, runtime: str, card: str) -> None:
    runtime_file, times = str(RUNTIMES_DIR / f"{runtime}.txt"), {}
    start = time.perf_counter()
    if not built(runtime):
        install(session, "-r", runtime_file)
        install(session, "-c", runtime_file, *tools(runtime))
        stamp(runtime).write_text(key(runtime))
        times["runtime venv built"] = time.perf_counter() - start
    if installing_only(session):
        return
    session.run("python", "-m", "pip", "uninstall", "-q", "-y", DISTRIBUTION)  # the install cell brings it
    python = str(Path(session.bin) / "python")
    mark = time.perf_counter()
    session.run("python", "scripts/measure_install.py", "--run-in", python)
    times["install cell"] = time.perf_counter() - mark
    session.run("python", "-m", "pip", "check", success_codes=[0, 1])  # printed for the record: runtimes have conflicts
    versions = (
        "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
    )
    session.run("python", "-c", versions)
    # the notebooks on one core (a process of their own), the unit tests on the other, as in make test
    out = ROOT / "build" / "runtimes" / runtime
    out.mkdir(parents=True, exist_ok=True)
    # the notebooks' two configurations: the smoke run under the runtime's card, then the committed
    # notebooks as a student's Run All on this CPU (default parameters) through nbval, one test a cell
    smoke = [python, "-m", "helpers", "run", "--smoke", "--simulate", card, "--out", str(out)]
    committed = [python, "-m", "pytest", "-q", "--nbval-lax", "notebooks"]
    lane = f"{shlex.join(smoke)} && {shlex.join(committed)}"
    session.log(f"{lane} > {out}/run.log, beside the unit tests")
    mark = time.perf_counter()
    with open(out / "run.log", "w") as log:
        environment = os.environ | ONE_THREAD
        beside = subprocess.Popen(["bash", "-c", lane], stdout=log, stderr=subprocess.STDOUT, env=environment, cwd=ROOT)
    try:
        # KIT_RUNTIME: the tests that check installed versions read this runtime's file, not requirements-dev.txt
        tests = ["-m", "pytest", "-m", "not notebooks", "tests", "-q", *session.posargs]
        session.run("python", *tests, env={"KIT_RUNTIME": runtime, **ONE_THREAD})
        times["unit tests"] = time.perf_counter() - mark
    finally:
        code = beside.wait()
        times["notebooks (beside them)"] = time.perf_counter() - mark
        print((out / "run.log").read_text())
    times["session"] = time.perf_counter() - start
    session.log(f"{runtime}: " + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in times.items()))
    if code != 0:
        session.error(f"a notebook failed under {runtime}'s runtime: {out}/run.log (and {out}/summary.md) says which")


def _define(runtime: str, python: str, card: str) -> None:
    def session(s: nox.Session) -> None:
        run_runtime(s, runtime, card)

    session.__doc__ = f"Python {python} and {runtime.capitalize()}'s libraries; notebooks under a simulated {card}"
    # reuse_venv None: reused (nox.options.reuse_venv); False: rebuilt from scratch, its old libraries gone
    nox.session(name=runtime, python=find_python(python), reuse_venv=None if built(runtime) else False)(session)


for _runtime, (_python, _card) in RUNTIMES.items():
    _define(_runtime, _python, _card)


@nox.session(python=find_python("3.12"), reuse_venv=None if built("device") else False)
def device(session: nox.Session) -> None:
    """The lent GPU machine on the CPU: its image, the wheelhouse installed as there, its tests, the notebooks."""
    times, start = {}, time.perf_counter()
    if not built("device"):
        install(session, "-r", str(DEVICE_IMAGE))
        stamp("device").write_text(key("device"))
        times["image venv built"] = time.perf_counter() - start
    if installing_only(session):
        return
    mark = time.perf_counter()
    build = [sys.executable, "scripts/build_device_wheels.py"]
    wheels = subprocess.run(build, cwd=ROOT, capture_output=True, text=True)
    print(wheels.stdout[-3000:])
    if wheels.returncode != 0:  # no package index, or a pin gone from it: nothing here can stand in for them
        session.skip(f"the device wheels cannot be had here: {(wheels.stderr.strip().splitlines() or ['?'])[-1]}")
    times["wheelhouse built"] = time.perf_counter() - mark
    python, site = str(Path(session.bin) / "python"), str(Path(session.virtualenv.location) / "kit-site")
    out = ROOT / "build" / "runtimes" / "device"
    mark = time.perf_counter()
    script_env = {"DEVICE_PYTHON": python, "DEVICE_MODE": "cpu", "DEVICE_SITE": site}
    session.run("bash", "scripts/device_gpu_proof.sh", str(out), env=script_env, external=True)
    times["install and preflight"] = time.perf_counter() - mark
    # everything below imports what the script installed, first on the path, as the machine's kernels do
    env = {"PYTHONPATH": f"{site}:{ROOT}", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", **ONE_THREAD}
    mark = time.perf_counter()
    tests = ["tests/test_gpu_proof.py", "tests/test_device_wheels.py", *session.posargs]
    session.run("python", "-m", "pytest", "-o", "addopts=-p no:cacheprovider", "-q", *tests, env=env)
    times["gpu-proof's tests"] = time.perf_counter() - mark
    mark = time.perf_counter()
    # every notebook, as gpu-proof's last section runs them there (00 alone is the floor)
    session.run("python", "-m", "helpers", "run", "--smoke", "--out", str(out / "notebooks"), env=env)
    times["the notebooks"] = time.perf_counter() - mark
    times["session"] = time.perf_counter() - start
    session.log("device: " + ", ".join(f"{what} {seconds:.0f} s" for what, seconds in times.items()))
