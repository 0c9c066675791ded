"""Every script under scripts/ answers a bad flag or a bad value as argparse does: exit 2, the fix, no traceback.

Each case calls the script's `main(argv)`; argparse's error exits before the script does any work
(no download, no training), so a case takes milliseconds. The bench_* scripts are measurement
harnesses kept apart (scripts/bench/README.md).
"""

import importlib.util
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"

# (script, arguments, what the error says): a bad flag and at least one bad value for each
CASES = [
    ("build_device_wheels", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("build_device_wheels", ["--out", "{file}"], "is a file: name a folder for the wheels, e.g. --out"),
    ("build_tiny_model", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (
        "build_tiny_model",
        ["--steps", "0"],
        "argument --steps: '0' is not a whole number from 1 to 1,000,000: pass e.g.",
    ),
    ("build_tiny_model", ["--steps", "many"], "argument --steps: 'many' is not a whole number"),
    ("build_tiny_model", ["--out", "{file}"], "argument --out: {file} is a file: name a folder (created if missing)"),
    ("build_tiny_model", ["--losses", "{folder}"], "argument --losses: {folder} is a folder: name a file in it"),
    ("device_preflight", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("device_preflight", ["--cpu=yes"], "argument --cpu: ignored explicit argument 'yes'"),
    ("measure_install", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("measure_install", ["--runtime-has", "psutil"], "'psutil' is not NAME==VERSION: pass e.g. --runtime-has psutil=="),
    ("measure_install", ["--runtime-torch", "banana"], "'banana' is not a version: pass e.g. --runtime-torch 2.6.0"),
    ("measure_install", ["--install-torch", "torch==="], "'torch===' is not a requirement pip reads: pass e.g."),
    ("measure_install", ["--run-in", "{folder}/python"], "argument --run-in: {folder}/python is not there: pass the"),
    ("train_embedded", ["--out", "x", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("train_embedded", [], "the following arguments are required: --out"),
    ("train_embedded", ["--out", "{file}"], "argument --out: {file} is a file: name a folder"),
    ("train_embedded", ["--out", "x", "--max-steps", "0"], "argument --max-steps: '0' is not a whole number from 1"),
    ("train_embedded", ["--out", "x", "--save-steps", "-4"], "argument --save-steps: '-4' is not a whole number"),
    ("train_embedded", ["--out", "x", "--seed", "-1"], "argument --seed: '-1' is not a whole number from 0 to"),
    ("train_embedded", ["--out", "x", "--step-delay", "-1"], "argument --step-delay: '-1' is not a number from 0"),
    ("train_embedded", ["--out", "x", "--step-delay", "nan"], "argument --step-delay: 'nan' is not a number"),
]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script, argv, message", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_argument_exits_2_with_the_fix(tmp_path, capsys, script, argv, message):
    (tmp_path / "afile").write_text("x")
    values = {"file": str(tmp_path / "afile"), "folder": str(tmp_path)}
    with pytest.raises(SystemExit) as e:
        load(script).main([a.format(**values) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert message.format(**values) in err and "Traceback" not in err
    assert (tmp_path / "afile").read_text() == "x"


def test_every_script_has_its_bad_argument_cases():
    scripts = {p.stem for p in SCRIPTS.glob("*.py") if not p.stem.startswith(("bench_", "_"))}
    covered = {script for script, _, _ in CASES}
    assert scripts == covered, f"add a bad flag and a bad value to CASES for {sorted(scripts - covered)}"
