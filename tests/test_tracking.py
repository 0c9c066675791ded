"""helpers.tracking: wandb without prompts, the run manifest, no secret anywhere, variance across seeds.

Real wandb (offline, or online against a local server that fails), real Trainer, real peft and
bitsandbytes. Fakes only for what cannot exist here, each named as one: Colab's and Kaggle's
secret stores (modules put in sys.modules). wandb.ai is unreachable from this machine, so
"online" is exercised against a local HTTP server that answers 500 to everything.
"""

import base64
import io
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import torch
from transformers import Trainer, TrainingArguments

from helpers import tracking
from helpers.data import load_course_data
from helpers.models import load_model, load_qlora
from helpers.seeds import plot_seeds, run_seeds
from helpers.tracking import MANIFEST_NAME, ManifestCallback, init_tracking, load_manifest

FAKE_KEY = "local-secret-" + "3f9c2a7e1b" * 4  # the shape of a wandb key (a prefix and 40+ characters)
FAKE_HF_TOKEN = "hf_plantedFakeTokenForTheLeakTest0123456789"
FAKE_PASSWORD = "planted-db-password-8841"
WANDB_VARS = ("WANDB_MODE", "WANDB_SILENT", "WANDB_DIR", "WANDB_PROJECT", "WANDB_API_KEY", "WANDB_BASE_URL",
              "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")


def forms_of(secret: str) -> list[bytes]:
    """The secret as text, and as it travels in an HTTP Basic header (base64 of "api:<key>")."""
    return [secret.encode(), base64.b64encode(f"api:{secret}".encode()), base64.b64encode(secret.encode())]


def files_containing(root: Path, secrets) -> list[str]:
    """Every file under `root` (binary-safe, recursively) holding any form of any secret."""
    needles = [form for s in secrets for form in forms_of(s)]
    return [str(p) for p in root.rglob("*") if p.is_file() and any(n in p.read_bytes() for n in needles)]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused at once


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Every wandb variable restored after the test, every wandb folder under tmp_path, a fresh wandb."""
    for name in WANDB_VARS:
        monkeypatch.setenv(name, "x")  # recorded, so what init_tracking sets is undone afterwards
        monkeypatch.delenv(name)
    for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")  # wandb.ai is unreachable anyway
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import wandb

    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()  # the next test starts its own wandb service with its own settings


class FailingServer:
    """A local HTTP server that answers 500 to everything and remembers the Authorization headers."""

    def __init__(self):
        seen = self.auth = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                seen.append(self.headers.get("Authorization", ""))
                self.send_response(500)
                self.end_headers()

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()


def fake_colab(monkeypatch, get):
    """A fake `google.colab.userdata` (Colab's secret store), with `get` as its lookup."""
    userdata = types.ModuleType("google.colab.userdata")  # FAKE: Colab's module
    userdata.get = get
    colab = types.ModuleType("google.colab")  # FAKE
    colab.userdata = userdata
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab.userdata", userdata)


def fake_kaggle(monkeypatch, get_secret):
    """A fake `kaggle_secrets` (Kaggle's secret store), with `get_secret` as the client's lookup."""
    module = types.ModuleType("kaggle_secrets")  # FAKE: Kaggle's module

    class UserSecretsClient:
        def get_secret(self, label):
            return get_secret(label)

    module.UserSecretsClient = UserSecretsClient
    monkeypatch.setitem(sys.modules, "kaggle_secrets", module)


class SecretNotFoundError(Exception):  # what Colab raises for a secret that is not there
    pass


def tokenized(tokenizer, rows=16, seq_len=32):
    data = load_course_data().select(range(rows))
    text = [f"{i}\n{r}" for i, r in zip(data["instruction"], data["response"])]
    enc = tokenizer(text, padding="max_length", truncation=True, max_length=seq_len)
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                              "labels": enc["input_ids"]})


# ---------------------------------------------------------------------------------------------
# choosing online or offline, never prompting


def test_no_key_goes_offline_at_once_and_prints_the_sync_command(sandbox, capsys):
    start = time.perf_counter()
    run = init_tracking("kit-test", {"lr": 1e-3})  # stdin is unreadable under pytest: a prompt would fail
    seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert run.mode == "offline" and run.key_source is None and run.report_to == "wandb"
    assert "no W&B key found" in run.reason and "WANDB_API_KEY" in run.reason
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_PROJECT"] == "kit-test"
    assert run.run_dir.is_dir() and run.run_dir.parent == sandbox.resolve() / "wandb"
    assert run.sync_command in out
    assert seconds < 60
    assert run.finish() == run.sync_command
    # the printed command is the right one: wandb itself accepts it (a dry run needs no network)
    dry = subprocess.run([*shlex.split(run.sync_command), "--dry-run"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, executable=str(Path(sys.executable).with_name("wandb")))
    assert dry.returncode == 0 and "Would sync 1 run" in dry.stdout + dry.stderr, dry.stdout + dry.stderr


def test_wandb_mode_offline_in_the_environment_is_honoured(sandbox, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = init_tracking("kit-test")
    assert run.mode == "offline" and "WANDB_MODE=offline" in run.reason
    run.finish()


def test_disabled_records_nothing(sandbox):
    run = init_tracking("kit-test", mode="disabled")
    assert (run.mode, run.report_to, run.run_dir, run.sync_command) == ("disabled", "none", None, None)
    assert run.finish() is None


def test_colab_secret_is_used_in_memory_then_offline_when_the_server_fails(sandbox, monkeypatch, capfd):
    server = FailingServer()
    monkeypatch.setenv("WANDB_BASE_URL", server.url)
    monkeypatch.setattr(tracking, "ONLINE_INIT_TIMEOUT_S", 5.0)  # seconds before wandb gives up online
    fake_colab(monkeypatch, lambda name: FAKE_KEY if name == "WANDB_API_KEY" else None)
    try:
        run = init_tracking("kit-test", {"lr": 1e-3})
    finally:
        server.close()
    assert run.key_source == "Colab secrets"
    assert run.mode == "offline" and "could not start online" in run.reason
    assert server.auth and all(a == "Basic " + base64.b64encode(f"api:{FAKE_KEY}".encode()).decode()
                               for a in server.auth), "the key from the secret store reached the server"
    assert "WANDB_API_KEY" not in os.environ, "the key is passed in memory, not through the environment"
    run.finish()
    out = capfd.readouterr()
    assert not any(form.decode() in out.out + out.err for form in forms_of(FAKE_KEY))
    assert files_containing(sandbox, [FAKE_KEY]) == []
    assert not (Path.home() / ".netrc").exists() or FAKE_KEY not in (Path.home() / ".netrc").read_text()


def test_kaggle_secret_is_found_when_there_is_no_colab(sandbox, monkeypatch):
    fake_kaggle(monkeypatch, lambda label: FAKE_KEY)
    run = init_tracking("kit-test")
    assert run.key_source == "Kaggle secrets"
    assert run.mode == "offline" and "cannot be reached" in run.reason and "Internet > On" in run.reason
    run.finish()


def test_secret_stores_that_raise_or_hang_never_stop_the_run(sandbox, monkeypatch):
    def colab_get(name):
        raise SecretNotFoundError(f"Secret {name} does not exist.")

    def kaggle_get(label):
        time.sleep(30)  # a store that never answers (no internet on Kaggle)

    fake_colab(monkeypatch, colab_get)
    fake_kaggle(monkeypatch, kaggle_get)
    monkeypatch.setattr(tracking, "SECRET_TIMEOUT_S", 0.5)
    start = time.perf_counter()
    run = init_tracking("kit-test")
    assert run.mode == "offline" and run.key_source is None
    assert "Colab secrets: no WANDB_API_KEY secret" in run.reason and "SecretNotFoundError" in run.reason
    assert "Kaggle secrets: no answer within 0.5 s" in run.reason
    assert time.perf_counter() - start < 30
    run.finish()


@pytest.mark.parametrize("kwargs, match", [(dict(project=""), "project must be a non-empty string"),
                                           (dict(project="p", mode="maybe"), "mode must be one of 'auto'")])
def test_bad_arguments_say_what_works(kwargs, match):
    with pytest.raises(ValueError, match=match):
        init_tracking(**kwargs)


# ---------------------------------------------------------------------------------------------
# a real training run: manifests in every checkpoint, and no secret anywhere


def test_training_run_writes_manifests_and_leaks_no_secret(sandbox, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("HF_TOKEN", FAKE_HF_TOKEN)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", FAKE_PASSWORD)
    run = init_tracking("kit-test", {"experiment": "leak test"}, dir=sandbox / "wandb-dir")
    assert run.mode == "offline" and run.key_source == "the WANDB_API_KEY environment variable"

    model, tokenizer = load_qlora("embedded", r=4, alpha=8)
    train = tokenized(tokenizer)
    args = TrainingArguments(str(sandbox / "out"), max_steps=4, save_steps=2, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, logging_steps=1, seed=7, learning_rate=1e-3,
                             report_to=run.report_to, use_cpu=True, disable_tqdm=True)
    # secrets where a careless notebook might put them: scrubbed by value and by field name
    extra = {"note": f"key is {FAKE_KEY}", "api_key": "abcdefgh12345678", "lr_sweep": [1e-3, 2e-3]}
    callback = ManifestCallback(dataset=train, extra=extra)
    Trainer(model=model, args=args, train_dataset=train, callbacks=[callback]).train()
    run.finish()

    # 1. a manifest in every checkpoint, read back
    for step in (2, 4):
        assert (sandbox / "out" / f"checkpoint-{step}" / MANIFEST_NAME).is_file()
    manifest = load_manifest(sandbox / "out" / "checkpoint-4")
    training = manifest["training"]
    assert (training["seed"], training["effective_batch"]) == (7, 4 * 2 * 1)
    assert training["args"]["learning_rate"] == 1e-3 and training["args"]["save_steps"] == 2
    assert manifest["step"] == 4 and manifest["checkpoint"] == "checkpoint-4"
    assert manifest["model"]["id"] == "embedded" and manifest["model"]["embedded"] is True
    assert manifest["model"]["revision"] is None and manifest["model"]["commit"] is None
    assert manifest["model"]["quantization"]["bnb_4bit_quant_type"] == "nf4"
    assert manifest["model"]["adapters"]["default"]["r"] == 4
    assert manifest["data"] == {"fingerprint": train._fingerprint, "num_rows": 16, "type": "Dataset"}
    assert set(manifest["packages"]) == set(tracking.PACKAGES) and manifest["packages"]["torch"] == torch.__version__
    assert manifest["kit"]["version"] and "commit" in manifest["kit"]
    assert manifest["machine"]["platform"] == "local" and manifest["machine"]["precision"]["name"] == "fp32"
    assert manifest["memory"]["peak_bytes"] > 50 * 2**20  # bytes; a Python process with torch loaded
    assert manifest["metrics"]["last_train_log"]["step"] == 4
    assert manifest["tracking"]["mode"] == "offline" and manifest["tracking"]["run_id"] == run.run.id
    assert manifest["extra"] == {"note": "key is <redacted>", "api_key": "<redacted>", "lr_sweep": [1e-3, 2e-3]}
    assert callback.last_manifest["step"] == 4

    # 2. logged to the tracker: the manifest in the run's config, the peak memory in its summary
    records = b"".join(p.read_bytes() for p in run.run_dir.glob("*.wandb"))
    assert b"effective_batch" in records and b"peak_memory_bytes" in records

    # 3. no secret in any file the run wrote, nor in anything it printed
    secrets = [FAKE_KEY, FAKE_HF_TOKEN, FAKE_PASSWORD]
    written = [p for p in sandbox.rglob("*") if p.is_file()]
    assert len(written) > 20 and any(p.suffix == ".wandb" for p in written)
    assert files_containing(sandbox, secrets) == []
    out = capfd.readouterr()
    assert not any(form.decode() in out.out + out.err for s in secrets for form in forms_of(s))


def test_the_models_hub_commit_is_read_from_the_local_cache(tmp_path):
    # the Hub cache's own layout (what huggingface_hub writes on download): refs/<branch> names the
    # commit, snapshots/<commit>/ holds the files; no network involved
    commit, repo = "0123456789abcdef0123456789abcdef01234567", tmp_path / "models--kit--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text("{}")
    assert tracking._hub_commit("kit/tiny", None, cache_dir=tmp_path) == commit
    assert tracking._hub_commit("kit/tiny", "main", cache_dir=tmp_path) == commit
    assert tracking._hub_commit(str(repo / "snapshots" / commit), None) == commit  # loaded from the snapshot folder
    assert tracking._hub_commit("kit/absent", None, cache_dir=tmp_path) is None
    assert tracking._hub_commit(str(tmp_path), None) is None  # a plain local folder has no commit


def test_a_missing_manifest_says_how_to_get_one(tmp_path):
    (tmp_path / "checkpoint-5").mkdir()
    with pytest.raises(FileNotFoundError, match=r"No manifest at .*checkpoint-5.*ManifestCallback\(\)"):
        load_manifest(tmp_path / "checkpoint-5")


# ---------------------------------------------------------------------------------------------
# variance across seeds


@pytest.fixture(scope="module")
def short_training(tmp_path_factory):
    """train(seed) -> the training loss of 3 real Trainer steps on the embedded model."""
    out = tmp_path_factory.mktemp("seeds")
    _, tokenizer = load_model("embedded")
    train = tokenized(tokenizer, rows=32)

    def train_fn(seed):
        model, _ = load_model("embedded")
        args = TrainingArguments(str(out), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3, seed=seed,
                                 report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True)
        return Trainer(model=model, args=args, train_dataset=train).train().training_loss

    return train_fn


def test_same_seed_same_loss_bit_for_bit_other_seeds_spread(short_training):
    runs = run_seeds(short_training, seeds=[0, 1, 2], metric="train_loss")
    again = run_seeds(short_training, seeds=[0])
    assert again.values[0] == runs.values[0], "same seed on CPU: bit-identical loss"
    assert len(set(runs.values)) == 3 and runs.std > 0, "other seeds: another data order, another loss"
    assert runs.mean == pytest.approx(sum(runs.values) / 3)
    assert runs.std == pytest.approx(torch.tensor(runs.values, dtype=torch.float64).std().item())  # n - 1
    assert "3 seeds: train_loss" in str(runs) and again.std == 0.0

    import matplotlib

    matplotlib.use("Agg")
    ax = plot_seeds(runs)
    assert [round(y, 12) for y in ax.lines[-1].get_ydata()] == [round(v, 12) for v in runs.values]
    buffer = io.BytesIO()
    ax.figure.savefig(buffer, format="png")
    assert buffer.getvalue()[:4] == b"\x89PNG"


def test_run_seeds_says_what_to_return():
    with pytest.raises(ValueError, match=r"returned a dict with keys \['epoch', 'eval_loss'\].*key='eval_loss'"):
        run_seeds(lambda seed: {"eval_loss": 1.0, "epoch": 1}, seeds=[0])
    assert run_seeds(lambda seed: {"eval_loss": 1.0 + seed}, seeds=[0, 1], key="eval_loss").values == [1.0, 2.0]
    assert run_seeds(lambda seed: torch.tensor(0.5), seeds=[0]).values == [0.5]
    with pytest.raises(TypeError, match="must return a number"):
        run_seeds(lambda seed: "low", seeds=[0])
    with pytest.raises(ValueError, match="seeds is empty"):
        run_seeds(lambda seed: 1.0, seeds=[])
