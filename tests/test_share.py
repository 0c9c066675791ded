"""helpers.share: notebook 08's push of the adapter, bounded in time, each failure said with its cause.

The Hub cannot be reached from here: a stand-in Hub on 127.0.0.1 (`StandInHub`, named as one) answers
the three requests huggingface_hub's real `create_repo` and `upload_folder` send (create the repo,
ask how to upload each file, commit them inline), or answers 401 / 403, or never answers the commit.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import share
from helpers.share import push_adapter

pytestmark = pytest.mark.waits  # a stand-in Hub that stops answering, waited out (conftest: first)
FAKE_TOKEN = "hf_standInTokenForThePushTest0123456789ab"
REPO = "student/course-adapter"


@contextmanager
def stand_in_hub(create_status: int = 200, commit_hangs: bool = False):
    """STAND-IN for huggingface.co: yields (its URL, the files committed to it, by path)."""
    committed: dict[str, bytes] = {}
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, answer: dict):
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_HEAD(self):  # helpers.models.hub_reachable: any answer counts
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self):
            self._send(404, {"error": "not served by the stand-in"})

        def do_POST(self):
            request = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/api/repos/create" and create_status != 200:
                return self._send(create_status, {"error": "stand-in: refused"})
            if self.path == "/api/repos/create":
                return self._send(200, {"url": f"{url}/{REPO}"})
            if "/preupload/" in self.path:  # every file inline (the real Hub sends weights through LFS or Xet)
                asked = json.loads(request)["files"]
                files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in asked]
                return self._send(200, {"files": files})
            if "/commit/" in self.path and commit_hangs:
                release.wait(30)
                return None
            for line in request.decode().splitlines():
                operation = json.loads(line)
                if operation["key"] == "file":
                    committed[operation["value"]["path"]] = base64.b64decode(operation["value"]["content"])
            self._send(200, {"commitUrl": f"{url}/{REPO}/commit/{'0' * 40}", "commitOid": "0" * 40})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield url, committed
    finally:
        release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def adapter(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
    (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 16)
    return folder


@pytest.fixture
def online(monkeypatch, tmp_path):
    """huggingface_hub allowed on the network (the suite sets HF_HUB_OFFLINE), with no token anywhere."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-login"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "KAGGLE_KERNEL_RUN_TYPE", "COLAB_GPU"):
        monkeypatch.delenv(name, raising=False)  # a local machine, no token
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)
    return monkeypatch


def test_a_push_sends_the_adapters_files_with_the_token_and_never_prints_it(adapter, online, capsys):
    online.setenv("HF_TOKEN", FAKE_TOKEN)
    with stand_in_hub() as (url, committed):
        online.setenv("HF_ENDPOINT", url)
        assert push_adapter(adapter, REPO) == f"{url}/{REPO}"
    assert committed == {p.name: p.read_bytes() for p in adapter.iterdir()}
    out = capsys.readouterr().out
    token_line = "token: HF_TOKEN from the HF_TOKEN environment variable"
    assert out == f"pushed the adapter to {url}/{REPO} (private if new; {token_line})\n"
    assert FAKE_TOKEN not in out


@pytest.mark.parametrize(
    "status, cause",
    [
        (401, "the Hub refused the token (HF_TOKEN from the HF_TOKEN environment variable): it is wrong or expired"),
        (403, f"may not write to {REPO} (403): give it the Write role"),
    ],
)
def test_a_token_refused_or_without_write_access_is_named(adapter, online, capsys, status, cause):
    online.setenv("HF_TOKEN", FAKE_TOKEN)
    with stand_in_hub(create_status=status) as (url, committed):
        online.setenv("HF_ENDPOINT", url)
        assert push_adapter(adapter, REPO) is None
    assert committed == {}
    out = capsys.readouterr().out
    assert out.startswith(f"not pushed to {REPO}: ") and cause in out and FAKE_TOKEN not in out


@pytest.mark.slow
def test_a_hub_that_stops_answering_mid_push_is_given_up_at_its_bound(adapter, online, capsys):
    online.setenv("HF_TOKEN", FAKE_TOKEN)
    online.setattr(share, "PUSH_TIMEOUT_S", 1.0)
    with stand_in_hub(commit_hangs=True) as (url, _):
        online.setenv("HF_ENDPOINT", url)
        assert push_adapter(adapter, REPO) is None
    out = capsys.readouterr().out
    assert "the Hub did not finish in time (upload_folder did not return within 1 s)" in out, out


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed on exit: refused at once


@pytest.mark.parametrize(
    "repo_id, setting, said",
    [
        ("", {}, 'not pushed: hub_repo is empty. To share the adapter, set hub_repo = "your-username/a-name"'),
        ("student/bad..name", {"HF_TOKEN": FAKE_TOKEN}, "not pushed: 'student/bad..name' is not a Hub repo id"),
        (REPO, {}, f"not pushed to {REPO}: no HF_TOKEN found (no HF_TOKEN or HUGGING_FACE_HUB_TOKEN variable;"),
        (REPO, {"HF_TOKEN": FAKE_TOKEN, "HF_HUB_OFFLINE": "1"}, f"not pushed to {REPO}: HF_HUB_OFFLINE is set"),
        (REPO, {"HF_TOKEN": FAKE_TOKEN, "HF_ENDPOINT": closed_port_url()}, "could not be reached (no HTTP answer"),
    ],
)
def test_what_is_missing_is_said_before_anything_is_sent(adapter, online, capsys, repo_id, setting, said):
    for name, value in setting.items():
        online.setenv(name, value)
    assert push_adapter(adapter, repo_id) is None
    out = capsys.readouterr().out
    assert out.startswith("not pushed") and said in out, out
    assert FAKE_TOKEN not in out and out.count("\n") == 1


def test_a_folder_without_an_adapter_is_named(tmp_path, online, capsys):
    online.setenv("HF_TOKEN", FAKE_TOKEN)
    assert push_adapter(tmp_path / "nothing-here", REPO) is None
    assert "holds no adapter_config.json; save the adapter there first" in capsys.readouterr().out
