"""helpers.runs: a run resumes only where its checkpoints' manifest records the same settings.

Two real runs of the capstone's recipe (QLoRA on the embedded model, the real Trainer with
`ManifestCallback`, two steps each) are trained into `capstone` and `capstone-2` at two learning rates;
`choose_run_folder` is then asked, with real models and datasets, where a third job goes.
Notebook 08 runs twice in one folder in tests/test_capstone_notebook.py; the exported train.py in
tests/test_export.py.
"""

import json
import os
import shutil
import time

import pytest
from datasets import load_dataset
from transformers import Trainer, TrainingArguments

from helpers._checksums import rows_sha256
from helpers.data import DATASET_PATH, pack_course_data
from helpers.manifest import MANIFEST_NAME, ManifestCallback, load_manifest
from helpers.qlora import load_qlora
from helpers.resume import list_checkpoints
from helpers.run_folder import RunFolderError, check_run_folder
from helpers.runs import RESULT_SETTINGS, choose_run_folder, recorded_settings
from helpers.training import training_args

SEQ_LEN = 32  # tokens per row
SETTINGS = dict(
    model_id="embedded", seq_len=SEQ_LEN, learning_rate=1e-3, max_steps=2, num_train_epochs=3,
    per_device_batch=4, grad_accum_steps=1, seed=7,
)  # fmt: skip


def train_run(output_dir, model, train, learning_rate):
    """Two steps of the recipe into `output_dir`, a checkpoint (with its manifest) after each."""
    args = TrainingArguments(
        str(output_dir),
        learning_rate=learning_rate,
        max_steps=SETTINGS["max_steps"],
        seed=SETTINGS["seed"],
        num_train_epochs=SETTINGS["num_train_epochs"],
        per_device_train_batch_size=SETTINGS["per_device_batch"],
        gradient_accumulation_steps=SETTINGS["grad_accum_steps"],
        save_steps=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    manifest = ManifestCallback(model_id="embedded", dataset=train, seq_len=SEQ_LEN)
    Trainer(model=model, args=args, train_dataset=train, callbacks=[manifest]).train()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """(runs folder, the model, its training rows): `capstone` trained at 1e-3, `capstone-2` at 2e-3."""
    runs = tmp_path_factory.mktemp("runs")
    model, tokenizer = load_qlora("embedded", r=4, alpha=8)
    train = pack_course_data(tokenizer, SEQ_LEN).select(range(8))
    train_run(runs / "capstone", model, train, 1e-3)
    train_run(runs / "capstone-2", model, train, 2e-3)
    return runs, model, train


def choose(job, base="capstone", **changed):
    runs, model, train = job
    return choose_run_folder(runs / base, model, changed.pop("dataset", train), **(SETTINGS | changed))


def test_the_manifest_records_every_setting_that_decides_the_result(job):
    runs, model, train = job
    recorded = recorded_settings(load_manifest(runs / "capstone" / "checkpoint-2"))
    assert set(recorded) == set(RESULT_SETTINGS)
    expected = SETTINGS | {"lora_r": 4, "lora_alpha": 8, "data": rows_sha256(train)}
    assert recorded == expected


def test_the_same_settings_go_on_with_their_run(job, capsys):
    runs, _, _ = job
    assert choose(job) == runs / "capstone"
    assert f"this run trains in {runs / 'capstone'}: the same settings as its checkpoints\n" in capsys.readouterr().out


def test_a_changed_setting_is_named_and_finds_the_run_it_was_changed_to(job, capsys):
    runs, _, _ = job
    assert choose(job, learning_rate=2e-3) == runs / "capstone-2"
    printed = capsys.readouterr().out
    assert "capstone holds a run with other settings: learning_rate 0.001 -> 0.002\n" in printed
    assert f"this run trains in {runs / 'capstone-2'}: the same settings as its checkpoints" in printed


@pytest.mark.parametrize(
    "changed, named",
    [
        ({"max_steps": 8}, "max_steps 2 -> 8"),  # the exercise's change on a finished run: another run
        ({"seq_len": 64}, "seq_len 32 -> 64"),
        ({"seed": 8, "grad_accum_steps": 2}, "grad_accum_steps 1 -> 2; seed 7 -> 8"),
    ],
)
def test_another_run_gets_the_first_free_folder_beside_them(job, capsys, changed, named):
    runs, _, _ = job
    assert choose(job, **changed) == runs / "capstone-3"
    printed = capsys.readouterr().out
    assert f"capstone holds a run with other settings: {named}\n" in printed
    assert f"this run trains in {runs / 'capstone-3'}: a new run (no checkpoint there yet)" in printed
    assert not (runs / "capstone-3").exists(), "choosing creates nothing"


def test_other_rows_are_another_run_though_every_number_is_the_same(job, capsys):
    runs, _, train = job
    assert choose(job, dataset=train.select(range(1, 8))) == runs / "capstone-3"
    assert "capstone holds a run with other settings: data (the tokenized rows' SHA-256) " in capsys.readouterr().out


def test_another_lora_rank_is_another_run(job, capsys):
    runs, _, train = job
    other, _ = load_qlora("embedded", r=8, alpha=8)
    assert choose_run_folder(runs / "capstone", other, train, **SETTINGS) == runs / "capstone-3"
    assert "capstone holds a run with other settings: lora_r 4 -> 8\n" in capsys.readouterr().out


def test_a_folder_without_checkpoints_is_a_new_run(job, tmp_path, capsys):
    _, model, train = job
    (tmp_path / "fresh" / "adapter").mkdir(parents=True)  # what a run leaves besides its checkpoints is no run
    assert choose_run_folder(tmp_path / "fresh", model, train, **SETTINGS) == tmp_path / "fresh"
    assert "a new run (no checkpoint there yet)" in capsys.readouterr().out
    absent = tmp_path / "absent" / "capstone"  # not even its parent yet: a first run on a fresh Drive
    assert choose_run_folder(absent, model, train, **SETTINGS) == absent


def test_without_a_readable_manifest_the_folder_is_kept_for_resume_to_judge(job, tmp_path, capsys):
    runs, model, train = job
    shutil.copytree(runs / "capstone", tmp_path / "capstone")
    for checkpoint in list_checkpoints(tmp_path / "capstone"):
        (checkpoint / MANIFEST_NAME).write_text("{")  # cut off while it was written
    chosen = choose_run_folder(tmp_path / "capstone", model, train, **(SETTINGS | {"learning_rate": 5e-3}))
    assert chosen == tmp_path / "capstone", "latest_valid_checkpoint names the damage and the repair"
    assert f"no readable {MANIFEST_NAME}, so their settings cannot be compared" in capsys.readouterr().out


def test_an_older_manifest_is_compared_on_what_it_records(job, tmp_path, capsys):
    runs, model, train = job
    shutil.copytree(runs / "capstone", tmp_path / "capstone")
    for checkpoint in list_checkpoints(tmp_path / "capstone"):
        manifest = load_manifest(checkpoint)
        del manifest["data"]["sha256"], manifest["data"]["seq_len"]  # as the kit wrote them before
        (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert choose_run_folder(tmp_path / "capstone", model, train, **SETTINGS) == tmp_path / "capstone"
    assert "(data, seq_len: not in its manifest, not compared)" in capsys.readouterr().out
    assert choose_run_folder(tmp_path / "capstone", model, train, **(SETTINGS | {"max_steps": 3})) == (
        tmp_path / "capstone-2"
    )


def test_the_rows_digest_ignores_the_files_date_where_datasets_fingerprint_does_not(tmp_path):
    """A fresh Colab runtime installs the kit again: the same course file, a new modification time."""
    path = tmp_path / "course.jsonl"
    shutil.copy(DATASET_PATH, path)
    first = load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    later = time.time() + 3600
    os.utime(path, (later, later))
    again = load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert first._fingerprint != again._fingerprint
    assert rows_sha256(first) == rows_sha256(again) is not None
    assert rows_sha256(list(first)) == rows_sha256(list(again)), "a list of rows too"
    assert rows_sha256(first.select(range(1, len(first)))) != rows_sha256(first)


# the folder a run trains in: checked before training (check_run_folder)


@pytest.mark.parametrize("copy", ["checkpoint-1 - Copy", "checkpoint-1 copy", "checkpoint-1.bak", "checkpoint-12-old"])
def test_the_trainers_rotation_would_delete_a_copy_of_a_checkpoint_so_the_run_is_refused_first(job, tmp_path, copy):
    runs, model, train = job
    folder = tmp_path / "capstone"
    shutil.copytree(runs / "capstone", folder)
    shutil.copytree(folder / "checkpoint-1", folder / copy)  # the user's own copy, made in a file manager
    # what the Trainer's rotation does with it (transformers.trainer_utils.sort_checkpoints): a checkpoint
    from transformers.trainer_utils import sort_checkpoints

    assert str(folder / copy) in sort_checkpoints(str(folder))
    with pytest.raises(RunFolderError) as refused:
        choose(job, base=str(folder))
    said = str(refused.value)
    assert f"holds {copy!r}, which the Trainer's save_total_limit rotation takes for checkpoints" in said
    assert f"e.g. 'copy of {copy}'" in said
    with pytest.raises(RunFolderError, match="rotation"):
        training_args(str(folder), save_total_limit=2, quiet=True)
    assert (folder / copy).is_dir() and (folder / "checkpoint-1").is_dir(), "nothing moved, nothing deleted"


def test_folders_the_rotation_ignores_and_runs_without_rotation_are_left_alone(job, tmp_path, capsys):
    runs, model, train = job
    folder = tmp_path / "capstone"
    shutil.copytree(runs / "capstone", folder)
    for name in ("checkpoint-notes", "old checkpoint-1", "final"):
        (folder / name).mkdir()
    assert choose(job, base=str(folder)) == folder
    assert training_args(str(folder), save_strategy="no", save_total_limit=2, quiet=True)  # no saving: no rotation


def test_a_folder_that_cannot_be_written_is_refused_before_training(tmp_path, monkeypatch):
    # a read-only file system cannot be made here (the tests run as root, which writes through any mode
    # bits): a stand-in tempfile.TemporaryFile raises what a read-only mount raises (EROFS)
    import errno
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    with pytest.raises(RunFolderError) as refused:
        check_run_folder(tmp_path / "runs" / "capstone")
    said = str(refused.value)
    assert f"{tmp_path / 'runs' / 'capstone'} cannot be written ({tmp_path}: Read-only file system)" in said
    assert "Train in a writable folder (on Kaggle under /kaggle/working" in said


def test_a_file_where_the_run_folder_should_be_is_named(tmp_path):
    (tmp_path / "runs").write_text("not a folder")
    with pytest.raises(RunFolderError, match=r"runs is a file, so .*capstone cannot be a run folder"):
        check_run_folder(tmp_path / "runs" / "capstone")
