"""helpers.tracking: wandb without prompts, online or offline, and no secret anywhere a tracked run writes.

Real wandb (offline, or online against a local server that fails), real Trainer with the run
manifest (helpers.manifest, tested on its own in tests/test_manifest.py). Fakes only for what
cannot exist here, each named as one: Colab's and Kaggle's secret stores (modules put in
sys.modules). wandb.ai is unreachable from this machine, so "online" is exercised against a local
HTTP server that answers 500 to everything.
"""

import base64
import os
import shlex
import socket
import subprocess
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from fake_servers import silent_server
from transformers import Trainer, TrainingArguments

from helpers import tokens, tracking
from helpers.data import pack_course_data
from helpers.manifest import MANIFEST_NAME, ManifestCallback, load_manifest, scrub_secrets
from helpers.models import load_model
from helpers.tracking import init_tracking

pytestmark = pytest.mark.waits  # wandb servers that fail or never answer, waited out (conftest: first)
FAKE_KEY = "local-secret-" + "3f9c2a7e1b" * 4  # the shape of a wandb key (a prefix and 40+ characters)
FAKE_HF_TOKEN = "hf_plantedFakeTokenForTheLeakTest0123456789"
FAKE_PASSWORD = "planted-db-password-8841"
WANDB_VARS = (
    "WANDB_MODE",
    "WANDB_SILENT",
    "WANDB_DIR",
    "WANDB_PROJECT",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
    "WANDB_CACHE_DIR",
    "WANDB_CONFIG_DIR",
    "WANDB_DATA_DIR",
    "WANDB_ARTIFACT_DIR",
)


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


# ---------------------------------------------------------------------------------------------
# choosing online or offline, never prompting


@pytest.mark.slow
def test_no_key_goes_offline_at_once_and_prints_the_sync_command(sandbox, capsys):
    run = init_tracking("kit-test", {"lr": 1e-3})  # stdin is unreadable under pytest: a prompt would fail
    out = capsys.readouterr().out
    assert run.mode == "offline" and run.key_source is None and run.report_to == "wandb"
    assert "no W&B key found" in run.reason and "WANDB_API_KEY" in run.reason
    assert os.environ["WANDB_MODE"] == "offline" and os.environ["WANDB_PROJECT"] == "kit-test"
    assert run.run_dir.is_dir() and run.run_dir.parent == sandbox.resolve() / "wandb"
    assert str(run.run_dir) in out and run.sync_command not in out, "the upload command comes with finish()"
    assert run.finish() == run.sync_command
    assert run.sync_command in capsys.readouterr().out
    # the printed command is the right one: wandb itself accepts it (a dry run needs no network)
    dry = subprocess.run(
        [*shlex.split(run.sync_command), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        executable=str(Path(sys.executable).with_name("wandb")),
    )
    assert dry.returncode == 0 and "Would sync 1 run" in dry.stdout + dry.stderr, dry.stdout + dry.stderr


@pytest.mark.slow
def test_a_run_per_seed_says_why_it_is_offline_once_then_one_line_a_run(sandbox, capsys):
    """Notebook 06 tracks one run per seed: the reason once, not three times."""
    lines = []
    for seed in (0, 1):
        run = init_tracking("kit-test", {"seed": seed})
        run.finish()
        lines.append(capsys.readouterr().out.splitlines())
    assert sum("no W&B key found" in line for line in lines[0] + lines[1]) <= 1
    assert lines[1][0] == "wandb: offline (why: above)." and len(lines[1]) == 3, lines[1]


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert server.auth and all(
        a == "Basic " + base64.b64encode(f"api:{FAKE_KEY}".encode()).decode() for a in server.auth
    ), "the key from the secret store reached the server"
    assert "WANDB_API_KEY" not in os.environ, "the key is passed in memory, not through the environment"
    assert scrub_secrets(f"key {FAKE_KEY}") == "key <redacted>", "a key from a store is scrubbed like the others"
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


@pytest.mark.slow
def test_secret_stores_that_raise_or_hang_never_stop_the_run(sandbox, monkeypatch):
    def colab_get(name):
        raise SecretNotFoundError(f"Secret {name} does not exist.")

    release, answered = threading.Event(), threading.Event()

    def kaggle_get(label):
        release.wait(30)  # a store that never answers (no internet on Kaggle), until the test lets it go
        answered.set()

    fake_colab(monkeypatch, colab_get)
    fake_kaggle(monkeypatch, kaggle_get)
    monkeypatch.setattr(tokens, "SECRET_TIMEOUT_S", 0.5)  # the lookup is helpers.tokens' (tests/test_tokens.py)
    run = init_tracking("kit-test")
    assert not answered.is_set(), "init_tracking waited for the store instead of giving up at its bound"
    release.set()
    assert run.mode == "offline" and run.key_source is None
    assert "Colab secrets: no WANDB_API_KEY secret" in run.reason and "SecretNotFoundError" in run.reason
    assert "Kaggle secrets: no answer within 0.5 s" in run.reason
    run.finish()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(project=""), "project must be a non-empty string"),
        (dict(project="p", mode="maybe"), "mode must be one of 'auto'"),
    ],
)
def test_bad_arguments_say_what_works(kwargs, match):
    with pytest.raises(ValueError, match=match):
        init_tracking(**kwargs)


# ---------------------------------------------------------------------------------------------
# a real training run: manifests in every checkpoint, and no secret anywhere


def test_a_tracked_run_logs_its_manifests_and_leaks_no_secret(sandbox, monkeypatch, capfd):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("HF_TOKEN", FAKE_HF_TOKEN)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", FAKE_PASSWORD)
    run = init_tracking("kit-test", {"experiment": "leak test"}, dir=sandbox / "wandb-dir")
    assert run.mode == "offline" and run.key_source == "the WANDB_API_KEY environment variable"

    model, tokenizer = load_model("embedded")
    train = pack_course_data(tokenizer, 32).select(range(16))
    args = TrainingArguments(
        str(sandbox / "out"),
        max_steps=4,
        save_steps=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=1,
        seed=7,
        learning_rate=1e-3,
        report_to=run.report_to,
        use_cpu=True,
        disable_tqdm=True,
    )
    extra = {"note": f"key is {FAKE_KEY}"}  # a secret where a careless notebook might put it
    callback = ManifestCallback(dataset=train, extra=extra)
    Trainer(model=model, args=args, train_dataset=train, callbacks=[callback]).train()
    run.finish()

    # 1. every checkpoint's manifest names the tracking run (what notebook 08 continues after a disconnect)
    for step in (2, 4):
        manifest = load_manifest(sandbox / "out" / f"checkpoint-{step}" / MANIFEST_NAME)
        assert manifest["tracking"]["mode"] == "offline" and manifest["tracking"]["run_id"] == run.run.id
        assert manifest["tracking"]["project"] == "kit-test" and manifest["step"] == step
        assert manifest["extra"] == {"note": "key is <redacted>"}

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


# ---------------------------------------------------------------------------------------------
# a server that accepts connections and never answers (tests/fake_servers.py, on 127.0.0.1)


@pytest.mark.slow
def test_a_wandb_server_that_never_answers_means_offline_in_seconds(sandbox, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    with silent_server() as url:
        monkeypatch.setenv("WANDB_BASE_URL", url)
        modes = []
        start_run = tracking._start_run
        monkeypatch.setattr(tracking, "_start_run", lambda *a, **k: modes.append(a[3]) or start_run(*a, **k))
        run = init_tracking("kit-test")
    assert run.mode == "offline" and "cannot be reached (no answer within 3 s" in run.reason, run.reason
    # before: the TCP check passed, and wandb.init waited its whole ONLINE_INIT_TIMEOUT_S online (31 s
    # measured); now the HTTP check gives up at HOST_TIMEOUT_S and wandb.init only ever runs offline
    assert modes == ["offline"]
    run.finish()


class FakeStalledRun:
    """FAKE: an online wandb run whose server took the run's start, then stopped answering."""

    def __init__(self):
        self.release, self.finished = threading.Event(), threading.Event()

    def finish(self):
        self.release.wait(30)  # until the test lets it go
        self.finished.set()


def test_an_online_run_whose_server_stalls_finishes_in_bounded_time(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "FINISH_TIMEOUT_S", 0.5)
    stalled = FakeStalledRun()
    run = tracking.Tracking("kit-test", "online", "W&B key from a test", "a test", stalled, tmp_path)
    assert run.finish() is None
    assert not stalled.finished.is_set(), "finish() waited for the stalled server instead of giving up at its bound"
    stalled.release.set()
    out = capsys.readouterr().out
    assert "did not take the run's last records within 0.5 s" in out and f"wandb sync {tmp_path}" in out
