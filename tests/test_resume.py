"""Surviving a disconnect (notebook 08): a run killed with SIGKILL resumes to the same loss and weights.

A real Trainer in a subprocess (scripts/train_embedded.py) on the embedded model, killed with
SIGKILL after its first checkpoint, then resumed from `latest_valid_checkpoint`: every logged loss,
the final loss and every final weight must equal those of a run that was never interrupted.
Corrupt and partial checkpoints, as a kill during a save leaves them, are detected and skipped
with a message that names the folder and the reason.
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from background import background
from safetensors.torch import load_file

from helpers.manifest import MANIFEST_NAME, load_manifest
from helpers.resume import CheckpointsRejected, check_checkpoint, latest_valid_checkpoint, list_checkpoints

SLOW_FIXTURES = ("interrupted",)  # the capstone recipe run three times, in the background lane (conftest: slow)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "train_embedded.py"
TIMEOUT_S = 240  # seconds for one training subprocess, generous for a loaded CI machine


def train(out: Path, *flags: str, env: dict[str, str], log: Path | None = None):
    """Start scripts/train_embedded.py in `env`; returns (process, out, log)."""
    log = log or out.with_suffix(".log")
    with open(log, "w") as log_file:  # a file, not a pipe: a full pipe would stall the run
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out", str(out), *flags],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=env,
        )
    return process, out, log


def finish(run) -> dict:
    """Wait for a run started by `train`; its result.json."""
    process, out, log = run
    try:
        process.wait(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, log.read_text()[-3000:]
    return json.loads((out / "result.json").read_text())


@background(seconds=25)
def interrupted(base: Path, env: dict[str, str]):
    """The capstone's recipe (QLoRA on the embedded model) run three times, two at once.

    1. the reference: 12 steps, never interrupted;
    2. the same run, killed with SIGKILL right after its checkpoint-4 is complete;
    3. a partial checkpoint-8 put where the kill would have left one had it come during the next
       save (the reference's, weights truncated to half);
    4. the killed run restarted with --resume: it must skip checkpoint-8, go on from checkpoint-4
       and end exactly where the reference ended.
    """
    reference = train(base / "reference", "--qlora", env=env)
    doomed, _, _ = train(base / "killed", "--qlora", "--step-delay", "0.3", env=env)
    marker = base / "killed" / "checkpoint-4" / MANIFEST_NAME  # written after trainer_state.json, atomically
    deadline = time.monotonic() + TIMEOUT_S
    while not marker.exists():
        if doomed.poll() is not None or time.monotonic() > deadline:
            doomed.kill()
            log = (base / "killed.log").read_text()[-3000:]
            pytest.fail(f"no checkpoint-4 before the run ended or timed out:\n{log}")
        time.sleep(0.02)
    os.kill(doomed.pid, signal.SIGKILL)  # what a Colab disconnect does to the kernel: no cleanup at all
    doomed.wait()
    left = sorted(p.name for p in (base / "killed").iterdir())
    expected = finish(reference)
    partial = base / "killed" / "checkpoint-8"
    shutil.rmtree(partial, ignore_errors=True)  # in case the kill came late: the partial one replaces it
    shutil.copytree(base / "reference" / "checkpoint-8", partial)
    truncate(partial / "adapter_model.safetensors", 0.5)
    resumed = train(base / "killed", "--qlora", "--resume", env=env, log=base / "resumed.log")
    return expected, finish(resumed), doomed.returncode, left, base


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_loss_and_weights(interrupted):
    reference, resumed, returncode, left, base = interrupted
    assert returncode == -signal.SIGKILL
    assert "checkpoint-4" in left and "checkpoint-12" not in left and "result.json" not in left, left
    log = (base / "resumed.log").read_text()
    assert f"skipping {base / 'killed' / 'checkpoint-8'}: adapter_model.safetensors is truncated" in log
    assert resumed["resumed_from"] == str(base / "killed" / "checkpoint-4")
    assert resumed["global_step"] == reference["global_step"] == 12
    assert resumed["losses"] == reference["losses"], "every logged loss, step by step, exactly"
    assert resumed["final_loss"] == reference["final_loss"]
    print(f"\nfinal loss {reference['final_loss']!r} uninterrupted, {resumed['final_loss']!r} killed and resumed")
    expected = load_file(base / "reference" / "final" / "adapter_model.safetensors")
    got = load_file(base / "killed" / "final" / "adapter_model.safetensors")
    assert expected.keys() == got.keys() and len(expected) > 0
    assert all(torch.equal(expected[k], got[k]) for k in expected), "every final adapter weight, bit for bit"


def test_every_checkpoint_carries_its_manifest(interrupted):
    reference, _, _, _, base = interrupted
    folders = list_checkpoints(base / "reference")
    assert [f.name for f in folders] == ["checkpoint-12", "checkpoint-8", "checkpoint-4"]
    for folder in folders:
        manifest = load_manifest(folder)
        step = int(folder.name.split("-")[1])
        assert manifest["step"] == step and manifest["checkpoint"] == folder.name
        assert manifest["training"]["effective_batch"] == 4 and manifest["training"]["seed"] == 0
        assert manifest["metrics"]["last_train_log"]["loss"] == reference["losses"][str(step)]
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert manifest["kit"]["commit"] == head.stdout.strip()


# ---------------------------------------------------------------------------------------------
# what makes a checkpoint unusable, each named


def truncate(path: Path, keep: float):
    os.truncate(path, int(path.stat().st_size * keep))


def weights(folder: Path) -> Path:
    return next(folder.glob("*.safetensors"))


def zero_tensor_data(path: Path):
    """Zero every tensor byte of a safetensors file, header kept: same size, same structure."""
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start:] = bytes(len(data) - start)
    path.write_bytes(data)


def zero_middle(path: Path):
    """Zero 64 bytes in the middle of a file (a bad sector, a bad copy): same size, zip directory intact."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(data)


SAME_SIZE = r"\.{} does not match the SHA-256 recorded when it was saved"
# what a kill during a save (or a full disk, or a bad copy) leaves, and what the message must say
CORRUPTIONS = {
    "truncated weights": (lambda c: truncate(weights(c), 0.5), r"\.safetensors is truncated: [\d,]+ of [\d,]+ bytes"),
    "no trainer state": (
        lambda c: (c / "trainer_state.json").unlink(),
        r"no trainer_state\.json \(the save was cut off",
    ),
    "half-written trainer state": (
        lambda c: truncate(c / "trainer_state.json", 0.3),
        r"trainer_state\.json does not parse",
    ),
    "truncated optimizer": (lambda c: truncate(c / "optimizer.pt", 0.4), r"optimizer\.pt is not a complete torch file"),
    "no optimizer": (lambda c: (c / "optimizer.pt").unlink(), r"no optimizer\.pt \(saved with save_only_model=True"),
    "truncated rng state": (
        lambda c: truncate(c / "rng_state.pth", 0.5),
        r"rng_state\.pth is not a complete torch file",
    ),
    "weights header overwritten": (
        lambda c: weights(c).write_bytes(b"\xff" * 8 + weights(c).read_bytes()[8:]),
        r"header alone needs",
    ),
    "no weights": (lambda c: weights(c).unlink(), r"no weights file"),
    # damage at the file's own size: only the checksums in run_manifest.json can tell
    "weights zeroed at the same size": (lambda c: zero_tensor_data(weights(c)), SAME_SIZE.format("safetensors")),
    "optimizer state overwritten at the same size": (lambda c: zero_middle(c / "optimizer.pt"), SAME_SIZE.format("pt")),
    "rng state overwritten at the same size": (lambda c: zero_middle(c / "rng_state.pth"), SAME_SIZE.format("pth")),
    "trainer state edited at the same size": (
        lambda c: (c / "trainer_state.json").write_text((c / "trainer_state.json").read_text().replace("0", "1")),
        SAME_SIZE.format("json"),
    ),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_bad_newest_checkpoint_is_named_and_the_previous_one_used(interrupted, tmp_path, capsys, corruption):
    base = interrupted[-1]
    for step in (8, 12):
        shutil.copytree(base / "reference" / f"checkpoint-{step}", tmp_path / f"checkpoint-{step}")
    assert check_checkpoint(tmp_path / "checkpoint-12") == []
    damage, why = CORRUPTIONS[corruption]
    damage(tmp_path / "checkpoint-12")
    assert latest_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-8")
    out = capsys.readouterr().out
    assert re.search(rf"skipping {re.escape(str(tmp_path / 'checkpoint-12'))}: .*{why}", out), out
    assert f"resuming from {tmp_path / 'checkpoint-8'} (step 8): its " in out
    assert "files match the SHA-256 checksums in its run_manifest.json" in out


@pytest.mark.parametrize("corruption", [c for c in CORRUPTIONS if "same size" in c])
def test_damage_at_the_same_size_passes_every_structural_check(interrupted, tmp_path, corruption):
    """Why the checksums: without them (a checkpoint saved without ManifestCallback) this damage passes."""
    base = interrupted[-1]
    shutil.copytree(base / "reference" / "checkpoint-12", tmp_path / "checkpoint-12")
    CORRUPTIONS[corruption][0](tmp_path / "checkpoint-12")
    assert check_checkpoint(tmp_path / "checkpoint-12") != []
    (tmp_path / "checkpoint-12" / MANIFEST_NAME).unlink()
    assert check_checkpoint(tmp_path / "checkpoint-12") == []


def test_without_checksums_the_pick_says_it_checked_the_structure_only(interrupted, tmp_path, capsys):
    base = interrupted[-1]
    shutil.copytree(base / "reference" / "checkpoint-12", tmp_path / "checkpoint-12")
    (tmp_path / "checkpoint-12" / MANIFEST_NAME).unlink()
    assert latest_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-12")
    out = capsys.readouterr().out
    assert "(step 12): structure checked only: no run_manifest.json with checksums (saved without Manifest" in out


def test_the_manifest_records_a_checksum_of_every_file(interrupted):
    folder = interrupted[-1] / "reference" / "checkpoint-12"
    recorded = load_manifest(folder)["checksums"]
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != MANIFEST_NAME)
    assert recorded["algorithm"] == "sha256" and sorted(recorded["files"]) == on_disk
    assert {"adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(
        on_disk
    )
    for name, entry in recorded["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name


# a malformed file of every kind is a reason to skip, never an exception
def set_header(path: Path, header):
    """Replace a safetensors file's JSON header, keeping its data."""
    data = path.read_bytes()
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + int.from_bytes(data[:8], "little") :])


def sharded(folder: Path, index: str):
    weights(folder).unlink()
    (folder / "model.safetensors.index.json").write_text(index)


MALFORMED = {
    "header is a list": (lambda c: set_header(weights(c), [1, 2]), "not a table of tensors with data offsets"),
    "tensor without offsets": (lambda c: set_header(weights(c), {"w": {"dtype": "F32"}}), "with data offsets"),
    "offsets as text": (lambda c: set_header(weights(c), {"w": {"data_offsets": ["0", "4"]}}), "with data offsets"),
    "index map is a list": (lambda c: sharded(c, '{"weight_map": [1]}'), "weight_map that is not a table"),
    "index names lists": (lambda c: sharded(c, '{"weight_map": {"a": [1]}}'), "weight_map that is not a table"),
    "index is a list": (lambda c: sharded(c, "[1]"), r"index\.json does not parse \(TypeError\)"),
    "index points outside": (
        lambda c: sharded(c, '{"weight_map": {"a": "../../etc/passwd"}}'),
        "names a shard outside the checkpoint",
    ),
    "state is binary": (lambda c: (c / "trainer_state.json").write_bytes(b"\xff\xfe\x00"), "does not parse"),
    "optimizer is not a zip": (lambda c: (c / "optimizer.pt").write_bytes(b"PK\x03\x04" + b"\0" * 64), "optimizer"),
    "manifest cut off": (
        lambda c: truncate(c / MANIFEST_NAME, 0.5),
        r"run_manifest\.json does not parse .*delete run_manifest\.json to resume",
    ),
    "checksums malformed": (
        lambda c: (c / MANIFEST_NAME).write_text(json.dumps({"checksums": {"algorithm": "sha256", "files": [1]}})),
        "the checksums in run_manifest.json are malformed",
    ),
}


@pytest.mark.parametrize("malformed", MALFORMED)
def test_a_malformed_checkpoint_is_skipped_never_raised_on(interrupted, tmp_path, capsys, malformed):
    base = interrupted[-1]
    for step in (8, 12):
        shutil.copytree(base / "reference" / f"checkpoint-{step}", tmp_path / f"checkpoint-{step}")
    damage, why = MALFORMED[malformed]
    damage(tmp_path / "checkpoint-12")
    assert latest_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-8")
    out = capsys.readouterr().out
    assert re.search(rf"skipping {re.escape(str(tmp_path / 'checkpoint-12'))}: .*{why}", out), out


def test_weights_only_checkpoints_load_but_do_not_resume(interrupted, tmp_path):
    base = interrupted[-1]
    shutil.copytree(base / "reference" / "checkpoint-12", tmp_path / "checkpoint-12")
    (tmp_path / "checkpoint-12" / "optimizer.pt").unlink()
    assert check_checkpoint(tmp_path / "checkpoint-12", for_resume=False) == []
    assert latest_valid_checkpoint(tmp_path, for_resume=False) == str(tmp_path / "checkpoint-12")
    with pytest.raises(CheckpointsRejected, match="checkpoint-12: no optimizer.pt"):
        latest_valid_checkpoint(tmp_path)


def test_no_checkpoint_means_start_from_scratch(tmp_path, capsys):
    assert latest_valid_checkpoint(tmp_path / "never-written") is None
    assert "no usable checkpoint" in capsys.readouterr().out
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 9}))
    assert check_checkpoint(tmp_path / "checkpoint-3", for_resume=False) == [
        "trainer_state.json says step 2 but the folder is checkpoint-3",
        "no weights file (one of model.safetensors, "
        "adapter_model.safetensors, model.safetensors.index.json, pytorch_model.bin, adapter_model.bin)",
    ]


def test_a_sharded_model_is_checked_shard_by_shard(tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 2}))
    save_file({"a": torch.zeros(4)}, folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_checkpoint(folder, for_resume=False) == [
        "shard model-00002-of-00002.safetensors named in model.safetensors.index.json is missing"
    ]
    save_file({"b": torch.zeros(4)}, folder / "model-00002-of-00002.safetensors")
    assert check_checkpoint(folder, for_resume=False) == []
    with open(folder / "model-00002-of-00002.safetensors", "ab") as f:
        f.write(b"\0" * 10)
    assert check_checkpoint(folder, for_resume=False) == [
        "model-00002-of-00002.safetensors has 10 bytes more than its header describes (written over?)"
    ]


# ---------------------------------------------------------------------------------------------
# never train over what could be resumed: all rejected stops, another model's checkpoint is skipped


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_checkpoint_rejected_stops_and_names_each_deleting_nothing(interrupted, tmp_path, capsys):
    """A manifest cut short beside intact weights is a repair away: starting afresh there would lose it."""
    base = interrupted[-1]
    for step in (8, 12):
        shutil.copytree(base / "reference" / f"checkpoint-{step}", tmp_path / f"checkpoint-{step}")
        truncate(tmp_path / f"checkpoint-{step}" / MANIFEST_NAME, 0.5)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointsRejected) as raised:
        latest_valid_checkpoint(tmp_path)
    message = str(raised.value)
    assert f"no checkpoint in {tmp_path} can be resumed, so none was loaded and none deleted" in message
    assert re.search(r"checkpoint-12: run_manifest\.json does not parse .*\n  checkpoint-8: run_manifest", message)
    assert f"mv {tmp_path} {tmp_path}.rejected" in message
    assert list(raised.value.rejected) == [tmp_path / "checkpoint-12", tmp_path / "checkpoint-8"]
    assert snapshot(tmp_path) == before, "nothing moved, deleted or rewritten"
    assert "training starts from scratch" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ({"global_step": 12}, "trainer_state.json has no max_steps (the Trainer always writes it)"),
        ({"global_step": 12, "max_steps": "12"}, "has max_steps = '12', where the Trainer writes int"),
        (
            {"global_step": 12, "max_steps": 12, "log_history": {}},
            "has log_history = {}, where the Trainer writes list",
        ),
        ({"global_step": 12, "max_steps": 0}, "says step 12 of 0: not a run's position"),
        ([12], "trainer_state.json is a JSON list, not the Trainer's table of its state"),
        ({"global_step": 12, "max_steps": 12, "future_field": 1}, "fields this transformers' TrainerState cannot load"),
    ],
)
def test_a_trainer_state_a_resume_cannot_read_is_a_reason_not_an_exception(interrupted, tmp_path, state, why):
    base = interrupted[-1]
    for step in (8, 12):
        shutil.copytree(base / "reference" / f"checkpoint-{step}", tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-12" / MANIFEST_NAME).unlink()  # the state's checksum would name it first
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text(json.dumps(state))
    assert any(why in problem for problem in check_checkpoint(tmp_path / "checkpoint-12")), why
    assert latest_valid_checkpoint(tmp_path) == str(tmp_path / "checkpoint-8")


@pytest.fixture(scope="module")
def adapters():
    """The embedded model under three adapters: the one the runs trained (r=4, alpha=8), another r, another alpha."""
    from helpers.qlora import load_qlora

    return {(r, alpha): load_qlora("embedded", r=r, alpha=alpha)[0] for r, alpha in ((4, 8), (8, 16), (4, 16))}


def test_a_checkpoint_fits_the_model_it_was_saved_from(interrupted, adapters, tmp_path):
    base = interrupted[-1]
    assert check_checkpoint(base / "reference" / "checkpoint-12", model=adapters[4, 8]) == []


def test_a_checkpoint_of_another_shape_is_skipped_with_both_shapes_named(interrupted, adapters, tmp_path, capsys):
    """Notebook 08's switch to another model under the same run name: the Trainer would stop on a size mismatch."""
    base = interrupted[-1]
    shutil.copytree(base / "reference" / "checkpoint-12", tmp_path / "checkpoint-12")
    problems = check_checkpoint(tmp_path / "checkpoint-12", model=adapters[8, 16])
    assert "adapter_config.json has r = 4, this model's adapter 8" in problems
    shapes = [p for p in problems if "tensor(s) of another shape than this model's" in p]
    assert len(shapes) == 1 and re.search(r"is \(4, \d+\) in the checkpoint, \(8, \d+\) in this model", shapes[0])
    with pytest.raises(CheckpointsRejected, match="another shape"):
        latest_valid_checkpoint(tmp_path, model=adapters[8, 16])


def test_an_adapter_of_another_alpha_is_skipped_though_its_shapes_fit(interrupted, adapters, tmp_path):
    """Same shapes, another scale: the Trainer would load it and go on training something else, silently."""
    base = interrupted[-1]
    assert check_checkpoint(base / "reference" / "checkpoint-12", model=adapters[4, 16]) == [
        "adapter_config.json has lora_alpha = 8, this model's adapter 16"
    ]


def test_a_checkpoint_that_lacks_or_adds_tensors_is_skipped(interrupted, adapters, tmp_path):
    from safetensors.torch import save_file

    base = interrupted[-1]
    folder = tmp_path / "checkpoint-12"
    shutil.copytree(base / "reference" / "checkpoint-12", folder)
    (folder / MANIFEST_NAME).unlink()
    tensors = load_file(folder / "adapter_model.safetensors")
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped} | {"extra.weight": torch.zeros(2)},
              folder / "adapter_model.safetensors")  # fmt: skip
    problems = check_checkpoint(folder, model=adapters[4, 8])
    assert any(f"lacks 1 tensor(s) this model has, e.g. {dropped}" in p for p in problems), problems
    assert any("holds 1 tensor(s) this model does not have, e.g. extra.weight" in p for p in problems), problems


@pytest.mark.parametrize(
    ("base", "fits"),
    [("/content/elsewhere/tiny-llama/", True), ("Org/TINY-LLAMA", True), ("Qwen/Qwen2.5-0.5B-Instruct", False)],
)
def test_the_base_model_is_compared_by_its_name_not_its_folder(interrupted, adapters, tmp_path, base, fits):
    """The same model in another folder (a checkout, site-packages, another machine) resumes; another model not."""
    folder = tmp_path / "checkpoint-12"
    shutil.copytree(interrupted[-1] / "reference" / "checkpoint-12", folder)
    (folder / MANIFEST_NAME).unlink()
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | {"base_model_name_or_path": base}))
    problems = check_checkpoint(folder, model=adapters[4, 8])
    assert problems == ([] if fits else [f"adapter_config.json has base_model_name_or_path = {base!r}, " +
                                         f"this model's adapter {config['base_model_name_or_path']!r}"])  # fmt: skip
