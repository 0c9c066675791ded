"""helpers.tokens: one lookup for the Hub's token and W&B's key, in this process and in a real kernel.

Stand-ins for what cannot exist here, each named as one in its docstring: Colab's
`google.colab.userdata` and Kaggle's `kaggle_secrets`, written as modules into a temp folder that
goes on sys.path (this process) or PYTHONPATH (the kernel's). Each is importable only where its
variable is set (STANDIN_COLAB, STANDIN_KAGGLE: the secrets it holds, as JSON), as the real ones
exist only on their platform; "<denied>" and "<hangs>" make a secret raise as when this notebook
may not read it, or never answer. The real huggingface_hub reads a login file the test writes.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import tokens
from helpers.manifest import scrub_secrets
from helpers.tokens import HUB_TOKEN, WANDB_KEY, find_token, hub_token, where_to_add

pytestmark = pytest.mark.waits  # secret stores that hang, waited out; kernels started (conftest: first)
ROOT = Path(__file__).resolve().parents[1]
FAKE = {HUB_TOKEN: "hf_standInTokenForTheLookupTest0123456789", WANDB_KEY: "standin-" + "5e1a9c3f7b" * 4}
NAMES = (HUB_TOKEN, WANDB_KEY)
STANDINS = {
    "google/colab/__init__.py": '''
        """STAND-IN for Colab's `google.colab` (tests/test_tokens.py): importable only where STANDIN_COLAB is set."""
        import os

        if "STANDIN_COLAB" not in os.environ:
            raise ImportError("the stand-in google.colab exists on (stand-in) Colab only")
    ''',
    "google/colab/userdata.py": '''
        """STAND-IN for Colab's `google.colab.userdata` (tests/test_tokens.py): Colab's names and errors."""
        import json
        import os
        import time


        class NotebookAccessError(Exception):  # Colab: the secret exists, its "Notebook access" is off
            def __init__(self, key):
                super().__init__(f"Notebook does not have access to secret {key}")


        class SecretNotFoundError(Exception):
            def __init__(self, key):
                super().__init__(f"Secret {key} does not exist.")


        def get(key):
            answer = json.loads(os.environ.get("STANDIN_COLAB", "{}")).get(key)
            if answer is None:
                raise SecretNotFoundError(key)
            if answer == "<denied>":
                raise NotebookAccessError(key)
            if answer == "<hangs>":
                time.sleep(60)  # a vault that does not answer
            return answer
    ''',
    "kaggle_secrets.py": '''
        """STAND-IN for Kaggle's `kaggle_secrets` (tests/test_tokens.py): Kaggle's names and errors."""
        import json
        import os
        import time

        if "STANDIN_KAGGLE" not in os.environ:
            raise ImportError("the stand-in kaggle_secrets exists on (stand-in) Kaggle only")


        class BackendError(Exception):
            pass


        class UserSecretsClient:
            def get_secret(self, label):
                answer = json.loads(os.environ.get("STANDIN_KAGGLE", "{}")).get(label)
                if answer is None or answer == "<denied>":  # Kaggle answers alike: not added, or not attached here
                    raise BackendError("Unexpected response from the service.")
                if answer == "<hangs>":
                    time.sleep(60)
                return answer
    ''',
}
STANDIN_MODULES = ("google.colab", "google.colab.userdata", "kaggle_secrets")
# the variables that say which platform this is, and where a secret could already be
PLATFORM_VARS = ("COLAB_RELEASE_TAG", "COLAB_GPU", "KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE")
SECRET_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "WANDB_BASE_URL", "HF_OIDC_RESOURCE")
# each platform as its variables say it (Kaggle's image is Colab's base: it sets COLAB_RELEASE_TAG too)
ON = {
    "local": {},
    "colab": {"COLAB_RELEASE_TAG": "release-colab_20260514"},
    "kaggle": {"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "COLAB_RELEASE_TAG": "release-colab_20260514"},
}


@pytest.fixture(scope="module")
def standin_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("standins")
    for name, source in STANDINS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(source).lstrip())
    return folder


@pytest.fixture
def session(standin_dir, tmp_path, monkeypatch):
    """A student's session with no secret anywhere, the stand-ins on sys.path; `session(platform, env)` sets one up."""
    import huggingface_hub.constants

    for name in PLATFORM_VARS + SECRET_VARS + ("STANDIN_COLAB", "STANDIN_KAGGLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf-token"))  # no login
    monkeypatch.syspath_prepend(str(standin_dir))
    for module in STANDIN_MODULES:
        monkeypatch.delitem(sys.modules, module, raising=False)  # each test imports its own, afresh

    def start(platform="local", **variables):
        for name, value in {**ON[platform], **variables}.items():
            monkeypatch.setenv(name, value if isinstance(value, str) else json.dumps(value))
        return tmp_path

    yield start
    for module in STANDIN_MODULES:
        sys.modules.pop(module, None)


# ---------------------------------------------------------------------------------------------
# where each store's secret is found, for both names


@pytest.mark.parametrize("name", NAMES)
def test_the_environment_comes_first(session, name):
    session("colab", **{name: FAKE[name], "STANDIN_COLAB": {name: "colab-value-not-this-one"}})
    found = find_token(name)
    assert (found.value, found.source, found.misses) == (FAKE[name], f"the {name} environment variable", ())


def test_the_hubs_older_variable_counts(session):
    session(HUGGING_FACE_HUB_TOKEN=FAKE[HUB_TOKEN])
    assert find_token(HUB_TOKEN).source == "the HUGGING_FACE_HUB_TOKEN environment variable"


@pytest.mark.parametrize("name", NAMES)
def test_a_colab_secret(session, name):
    session("colab", STANDIN_COLAB={name: FAKE[name]})
    found = find_token(name)
    assert (found.value, found.source) == (FAKE[name], "Colab secrets")
    assert found.misses[0].startswith(f"no {name}") and str(found) == f"{name} from Colab secrets"


@pytest.mark.parametrize("name", NAMES)
def test_a_kaggle_secret_and_colabs_package_on_kaggle_is_not_asked(session, name):
    # Kaggle's image is built on Colab's: its google.colab may import, but no Colab page answers it
    session("kaggle", STANDIN_KAGGLE={name: FAKE[name]}, STANDIN_COLAB={name: "<hangs>"})
    found = find_token(name)
    assert (found.value, found.source, found.platform) == (FAKE[name], "Kaggle secrets", "kaggle")
    assert not any("Colab" in miss for miss in found.misses)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("platform", ["local", "colab", "kaggle"])
def test_none_says_why_and_where_to_add_it_on_this_platform(session, name, platform):
    session(platform, **{"local": {}, "colab": {"STANDIN_COLAB": {}}, "kaggle": {"STANDIN_KAGGLE": {}}}[platform])
    found = find_token(name)
    assert found.value is None and found.source is None and not found
    assert found.message.startswith(f"no {name} found (") and found.message.endswith("then run this cell again.") == (
        platform != "local"
    )
    where = {"local": "Here: run `", "colab": "On Colab: click the key icon", "kaggle": "On Kaggle: Add-ons > Secrets"}
    assert where[platform] in found.message and where_to_add(name, platform) in found.message
    store = {"colab": f"Colab secrets: no {name} secret (SecretNotFoundError)"}
    store["kaggle"] = f"Kaggle secrets: no {name} secret attached to this notebook (BackendError)"
    assert platform == "local" or store[platform] in found.misses


@pytest.mark.parametrize("name", NAMES)
def test_a_denied_secret_says_so_and_how_to_allow_it(session, name):
    session("colab", STANDIN_COLAB={name: "<denied>"})
    found = find_token(name)
    assert found.value is None
    assert f"Colab secrets: {name} is there, but its Notebook access is off" in found.message
    assert "(NotebookAccessError)" in found.message and 'turn its "Notebook access" on' in found.message


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_a_store_that_never_answers_is_given_up_at_its_bound(session, monkeypatch, name):
    monkeypatch.setattr(tokens, "SECRET_TIMEOUT_S", 0.5)
    session("colab", STANDIN_COLAB={name: "<hangs>"})  # the stand-in sleeps 60 s
    found = find_token(name)
    assert found.value is None and "Colab secrets: no answer within 0.5 s" in found.misses
    assert 'turn its "Notebook access" on' in found.message


def test_the_hub_login_and_the_wandb_login_are_found(session):
    home = session()
    (home / "hf-token").write_text(FAKE[HUB_TOKEN] + "\n")  # what `hf auth login` saves
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {FAKE[WANDB_KEY]}\n")
    (home / ".netrc").chmod(0o600)
    hub, wandb = find_token(HUB_TOKEN), find_token(WANDB_KEY)
    assert (hub.value, hub.source) == (FAKE[HUB_TOKEN], "the `hf auth login` saved on this machine")
    assert (wandb.value, wandb.source) == (FAKE[WANDB_KEY], "a `wandb login` saved in ~/.netrc")
    assert hub_token() == FAKE[HUB_TOKEN]


# ---------------------------------------------------------------------------------------------
# the value never shows


def test_the_value_is_masked_everywhere_once_found(session):
    value = "hf_aVaultOnlyTokenNeverInTheEnvironment42"
    session("colab", STANDIN_COLAB={HUB_TOKEN: value})
    found = find_token(HUB_TOKEN)
    assert found.value == value and value not in repr(found) + str(found) + found.message
    assert "value=<hidden>" in repr(found)
    assert scrub_secrets({"note": f"pushed with {value}"}) == {"note": "pushed with <redacted>"}


@pytest.mark.parametrize("name", ["", "HF TOKEN", None])
def test_a_bad_name_says_what_works(name):
    with pytest.raises(ValueError, match="such as 'HF_TOKEN'"):
        find_token(name)


# ---------------------------------------------------------------------------------------------
# in a real Jupyter kernel, as a student's cell runs it (ipykernel 6 and 7: only execute and iopub)

STUDENT_CELL = """
from helpers.tokens import find_token
print(find_token("HF_TOKEN"))
print(find_token("WANDB_API_KEY"))
find_token("HF_TOKEN")
"""
# (platform, what the stores hold) -> the row of the token table
KERNEL_CASES = {
    "environment": ("local", {"HF_TOKEN": FAKE[HUB_TOKEN], "WANDB_API_KEY": FAKE[WANDB_KEY]}),
    "Colab secret": ("colab", {"STANDIN_COLAB": json.dumps(FAKE)}),
    "Kaggle secret": ("kaggle", {"STANDIN_KAGGLE": json.dumps(FAKE), "STANDIN_COLAB": json.dumps(FAKE)}),
    "none (Colab)": ("colab", {"STANDIN_COLAB": "{}"}),
    "denied (Colab)": ("colab", {"STANDIN_COLAB": json.dumps(dict.fromkeys(FAKE, "<denied>"))}),
    "no answer (Colab)": ("colab", {"STANDIN_COLAB": json.dumps(dict.fromkeys(FAKE, "<hangs>"))}),
}


def setup_cell(platform: str, variables: dict) -> str:
    """A fresh session on `platform`: its variables, the stand-ins not imported yet; a short bound for a hang."""
    names = PLATFORM_VARS + SECRET_VARS + ("STANDIN_COLAB", "STANDIN_KAGGLE")
    bound = 0.5 if "<hangs>" in str(variables) else 10.0  # seconds: no wait on a loaded machine misses an answer
    return (
        f"import os, sys\nfor name in {names!r}: os.environ.pop(name, None)\n"
        f"os.environ.update({ {**ON[platform], **variables}!r})\n"
        f"for module in {STANDIN_MODULES!r}: sys.modules.pop(module, None)\n"
        f"import helpers.tokens; helpers.tokens.SECRET_TIMEOUT_S = {bound}\n"
    )


def run_cell(client, code: str, timeout: float = 60) -> str:
    """Execute `code` in the kernel; what the student sees: streams, the result's text, a traceback."""
    msg_id, shown = client.execute(code), []
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            shown.append(content["text"])
        elif kind in ("execute_result", "display_data"):
            shown.append(content["data"].get("text/plain", "") + "\n")
        elif kind == "error":
            shown.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(shown)


@pytest.mark.slow
def test_in_a_real_kernel_the_student_sees_where_each_token_came_from_and_never_its_value(standin_dir, tmp_path):
    from jupyter_client.manager import start_new_kernel

    environment = {k: v for k, v in os.environ.items() if k not in PLATFORM_VARS + SECRET_VARS}
    environment.update(
        PYTHONPATH=os.pathsep.join([str(standin_dir), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        HF_TOKEN_PATH=str(tmp_path / "hf-token"),  # no `hf auth login`
        HOME=str(tmp_path),  # no ~/.netrc
        PYDEVD_DISABLE_FILE_VALIDATION="1",  # ipykernel 6 on Python 3.12+: no debugpy warning at start
    )
    manager, client = start_new_kernel(kernel_name="python3", env=environment, startup_timeout=120)
    try:
        seen = {}
        for case, (platform, variables) in KERNEL_CASES.items():
            assert "Error" not in run_cell(client, setup_cell(platform, variables))
            seen[case] = run_cell(client, STUDENT_CELL).splitlines()
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)

    everything = "\n".join(line for lines in seen.values() for line in lines)
    assert not any(value in everything for value in FAKE.values()), "a token's value reached the student's screen"
    assert seen["environment"][:2] == [
        "HF_TOKEN from the HF_TOKEN environment variable",
        "WANDB_API_KEY from the WANDB_API_KEY environment variable",
    ]
    assert seen["Colab secret"][:2] == ["HF_TOKEN from Colab secrets", "WANDB_API_KEY from Colab secrets"]
    assert seen["Kaggle secret"][:2] == ["HF_TOKEN from Kaggle secrets", "WANDB_API_KEY from Kaggle secrets"]
    assert seen["Colab secret"][2] == (
        "FoundToken(name='HF_TOKEN', source='Colab secrets', value=<hidden>, misses=['no HF_TOKEN or "
        "HUGGING_FACE_HUB_TOKEN variable', 'huggingface_hub: no `hf auth login` saved on this machine'])"
    )
    for case, why in [
        ("none (Colab)", "Colab secrets: no {name} secret (SecretNotFoundError)"),
        ("denied (Colab)", "Colab secrets: {name} is there, but its Notebook access is off (NotebookAccessError)"),
        ("no answer (Colab)", "Colab secrets: no answer within 0.5 s"),
    ]:
        for name, line in zip(NAMES, seen[case]):
            assert line.startswith(f"no {name} found (") and why.format(name=name) in line, (case, line)
            assert line.endswith(f"{where_to_add(name, 'colab')}."), line
    for case, lines in seen.items():  # the token table, printed for the record (pytest -s)
        print(f"\n{case:18} | {lines[0]} | {lines[1]}")
