"""helpers.manifest: a manifest beside every checkpoint, read back, with no secret in it.

A real Trainer with real peft and bitsandbytes on the embedded model, no wandb (tests/test_tracking.py
runs the same callback under a wandb run). The Hub cache is built in its own on-disk layout.
"""

import pytest
import torch
from transformers import Trainer, TrainingArguments

from helpers import _secrets
from helpers import manifest as manifest_module
from helpers._checksums import rows_sha256
from helpers.data import pack_course_data
from helpers.manifest import MANIFEST_NAME, ManifestCallback, load_manifest, register_secret, scrub_secrets
from helpers.qlora import load_qlora

FAKE_HF_TOKEN = "hf_plantedFakeTokenForTheManifestTest012345"
FAKE_PASSWORD = "planted-db-password-5521"


@pytest.fixture
def registered(monkeypatch):
    """An empty register of secrets for this test; the module's own one comes back afterwards."""
    monkeypatch.setattr(_secrets, "_registered", set())  # the register helpers.manifest scrubs


def test_every_checkpoint_gets_a_manifest_with_the_settings_behind_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", FAKE_HF_TOKEN)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", FAKE_PASSWORD)
    model, tokenizer = load_qlora("embedded", r=4, alpha=8)
    train = pack_course_data(tokenizer, 32).select(range(16))
    args = TrainingArguments(
        str(tmp_path / "out"),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=1,
        seed=7,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    # secrets where a careless notebook might put them: scrubbed by value and by field name
    extra = {"note": f"token is {FAKE_HF_TOKEN}", "api_key": "abcdefgh12345678", "lr_sweep": [1e-3, 2e-3]}
    callback = ManifestCallback(dataset=train, seq_len=32, extra=extra)
    Trainer(model=model, args=args, train_dataset=train, callbacks=[callback]).train()

    for step in (2, 4):
        path = tmp_path / "out" / f"checkpoint-{step}" / MANIFEST_NAME
        assert path.is_file()
        text = path.read_text()
        assert FAKE_HF_TOKEN not in text and FAKE_PASSWORD not in text
    manifest = load_manifest(tmp_path / "out" / "checkpoint-4")
    assert manifest == load_manifest(tmp_path / "out" / "checkpoint-4" / MANIFEST_NAME)  # the folder or the file
    training = manifest["training"]
    assert (training["seed"], training["effective_batch"]) == (7, 4 * 2 * 1)
    assert (training["per_device_batch"], training["grad_accum_steps"], training["num_devices"]) == (4, 2, 1)
    assert training["args"]["learning_rate"] == 1e-3 and training["args"]["save_steps"] == 2
    assert manifest["step"] == 4 and manifest["checkpoint"] == "checkpoint-4"
    assert manifest["model"]["id"] == "embedded" and manifest["model"]["embedded"] is True
    assert manifest["model"]["revision"] is None and manifest["model"]["commit"] is None
    assert manifest["model"]["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert manifest["model"]["adapters"]["default"]["r"] == 4
    assert manifest["data"] == {
        "fingerprint": train._fingerprint,
        "sha256": rows_sha256(train),  # the rows by content, for helpers.runs (tests/test_runs.py)
        "num_rows": 16,
        "type": "Dataset",
        "seq_len": 32,
    }
    assert set(manifest["packages"]) == set(manifest_module.PACKAGES)
    assert manifest["packages"]["torch"] == torch.__version__
    assert manifest["kit"]["version"] and "commit" in manifest["kit"]
    assert manifest["machine"]["platform"] == "local" and manifest["machine"]["precision"]["name"] == "fp32"
    assert manifest["memory"]["peak_bytes"] > 50 * 2**20  # bytes; a Python process with torch loaded
    assert manifest["metrics"]["last_train_log"]["step"] == 4
    assert manifest["tracking"] is None  # no wandb run
    assert manifest["extra"] == {"note": "token is <redacted>", "api_key": "<redacted>", "lr_sweep": [1e-3, 2e-3]}
    assert callback.last_manifest["step"] == 4


def test_secrets_are_scrubbed_by_value_by_field_name_and_when_registered(monkeypatch, registered):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "token-value-12345")
    monkeypatch.setenv("MY_SERVICE_TOKEN_PREFIX", "token-value")  # inside the other: the longer goes whole
    monkeypatch.setenv("USE_TOKEN", "1")  # a flag, too short to be a secret: left alone
    register_secret("from-a-secret-store-0042")
    found = scrub_secrets(
        {
            "note": "a token-value-12345 and from-a-secret-store-0042; USE_TOKEN=1",
            "wandb_api_key": "anything at all",
            "hub_token": "<HUB_TOKEN>",  # already a placeholder, as TrainingArguments.to_dict writes it
            "steps": [1, "token-value-12345", {"password": "x"}],
            "lr": 1e-3,
        }
    )
    assert found == {
        "note": "a <redacted> and <redacted>; USE_TOKEN=1",
        "wandb_api_key": "<redacted>",
        "hub_token": "<HUB_TOKEN>",
        "steps": [1, "<redacted>", {"password": "<redacted>"}],
        "lr": 1e-3,
    }
    assert scrub_secrets("plain text") == "plain text"


def test_the_models_hub_commit_is_read_from_the_local_cache(tmp_path):
    # the Hub cache's own layout (what huggingface_hub writes on download): refs/<branch> names the
    # commit, snapshots/<commit>/ holds the files; no network involved
    commit, repo = "0123456789abcdef0123456789abcdef01234567", tmp_path / "models--kit--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    assert manifest_module._hub_commit("kit/tiny", None, cache_dir=tmp_path) == commit
    assert manifest_module._hub_commit("kit/tiny", "main", cache_dir=tmp_path) == commit
    assert manifest_module._hub_commit(str(repo / "snapshots" / commit), None) == commit  # loaded from the snapshot
    assert manifest_module._hub_commit("kit/absent", None, cache_dir=tmp_path) is None
    assert manifest_module._hub_commit(str(tmp_path), None) is None  # a plain local folder has no commit


def test_a_missing_manifest_says_how_to_get_one(tmp_path):
    (tmp_path / "checkpoint-5").mkdir()
    with pytest.raises(FileNotFoundError, match=r"No manifest at .*checkpoint-5.*ManifestCallback\(\)"):
        load_manifest(tmp_path / "checkpoint-5")
