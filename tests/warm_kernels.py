"""Jupyter kernels forked from one process that has already imported torch and transformers: the suite's
background notebook runs start 22 kernels, the unit tests about as many (the runner's, gpu-proof's, the quick
checks'), and a cold one spends about 5 of its 11 CPU seconds importing.

Not a fake: every kernel is a real ipykernel in a process of its own, running the notebook's cells as
Jupyter runs them. Only the imports below are done once, before the fork, instead of once a kernel. A
student's kernel starts cold; nothing the notebooks measure includes the import time.

Two roles, one file (tests/conftest.py starts the first with `start`, once for the unit tests and once, through
`Shared`, for the notebook runs while any is running, and points their kernels at the second):

    python tests/warm_kernels.py serve SOCKET     the warm process: imports, then forks a kernel per request
    python tests/warm_kernels.py connect -f CONNECTION_FILE
                                                  what Jupyter starts as "the kernel" (`kernelspec`): asks the
                                                  warm process for one, passes its stdio, signals and exit code

A request whose environment differs from the warm process's in anything the imports may have read (any
variable but those the kit and wandb read at run time, RUNTIME_PREFIXES) gets a cold kernel instead, and
so does every request when the warm process is not there: `connect` then execs `python -m
ipykernel_launcher` itself, so a kernel never depends on this file working. What the warm process did is
counted (`served`), and each refusal's variables are in its log.

The warm process freezes what it imported out of the garbage collector's view (`gc.freeze`, as servers that
fork workers do): a kernel's full collections then walk only what it made. Its last one, at exit, is part
of the shutdown Jupyter waits for: 2.4 s a notebook with the imports in view, 0.5 s without.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

SOCKET_VARIABLE = "KIT_WARM_KERNELS"  # the warm process's socket; unset: every kernel starts cold
# Read when a kernel's code runs, never while the preloaded libraries import: these may differ per kernel.
RUNTIME_PREFIXES = (
    "HELPERS_",
    "WANDB_",
    "JPY_",
    "PYDEVD_",
    "KIT_WARM_",
    "PYTEST_",
    "COLUMNS",
    "LINES",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
)
# What every notebook imports (through helpers, peft and bitsandbytes), less what a notebook may look for
# in sys.modules: peft, bitsandbytes, helpers and pyplot are left to each kernel. torch._inductor's
# compile_fx is what bitsandbytes' torch.compile wrappers pull in (1.5 s of its 2 s).
PRELOAD = ("torch", "torch._inductor.compile_fx", "transformers", "transformers.models.llama.modeling_llama",
           "datasets", "ipykernel.kernelapp")  # fmt: skip


def kernelspec(folder: Path) -> dict[str, str]:
    """Write a "python3" kernelspec that starts kernels through `connect`; the variables that make Jupyter use it."""
    spec = folder / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(Path(__file__).resolve()), "connect", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    return {"JUPYTER_PATH": str(folder)}


def start(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen, dict[str, str]]:
    """Start a warm process for kernels started with `env`, its socket and log in `folder`; returns it and the
    variables that point a kernel at it (a kernel that starts before it listens starts cold)."""
    variables = kernelspec(folder) | {SOCKET_VARIABLE: str(folder / "socket")}
    with (folder / "log.txt").open("w") as log:
        process = subprocess.Popen([sys.executable, __file__, "serve", str(folder / "socket")],
                                   env=env | variables, stdout=log, stderr=log)  # fmt: skip
    return process, variables


def wait_listening(folder: Path, process: subprocess.Popen, seconds: float = 120) -> None:
    """Return once the warm process in `folder` listens, has died, or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while not (folder / "socket").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)


def served(variables: dict[str, str]) -> dict[str, int]:
    """How many kernels the warm process `variables` point at forked, and how many it sent to start cold."""
    counts = Path(variables.get(SOCKET_VARIABLE, "none") + ".served")
    return json.loads(counts.read_text()) if counts.exists() else {"warm": 0, "cold": 0}


class Shared:
    """A warm process for the kernels of several runs (tests/conftest.py's notebook runs): started by the first run
    that needs it, killed once the last is done (its memory back). `variables` point a kernel at it."""

    def __init__(self):
        self.lock, self.runs_left, self.process, self.tried = threading.Lock(), 0, None, False
        self.variables: dict[str, str] = {}

    def expect(self, runs: int) -> None:
        """`runs` more runs will start kernels: the process stays until they are done."""
        with self.lock:
            self.runs_left += runs

    @contextlib.contextmanager
    def serving(self, environment: Callable[[Path], dict[str, str]]):
        """Around one run: the process started first if none was (`environment(folder)` gives its variables)."""
        with self.lock:  # a second run waits here while the first waits for the process to listen
            if not self.tried:
                self.tried = True
                with contextlib.suppress(OSError):  # kernels then start cold, each saying why on its stderr
                    self._start(environment)
        try:
            yield
        finally:
            with self.lock:
                self.runs_left -= 1
                if not self.runs_left:
                    self.stop()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _start(self, environment: Callable[[Path], dict[str, str]]) -> None:
        """Start the process and wait (at most 2 minutes) until it listens. If it never does, every kernel starts
        cold, as in Jupyter, and says so on its stderr: slower, never wrong."""
        folder = Path(tempfile.mkdtemp(prefix="kit-warm-kernels-"))
        self.process, variables = start(folder, environment(folder))
        wait_listening(folder, self.process)
        self.variables.update(variables)


def _differs(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The variables, other than RUNTIME_PREFIXES', that one environment has and the other lacks or sets otherwise."""
    names = {n for n in mine.keys() | theirs.keys() if not n.startswith(RUNTIME_PREFIXES)}
    return sorted(n for n in names if mine.get(n) != theirs.get(n))


def serve(path: str) -> dict:
    """Import PRELOAD, then fork a kernel per request; returns only in a forked child, with its request."""
    import importlib
    import selectors
    import threading

    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    added = {k: v for k, v in os.environ.items() if k not in before}  # e.g. inductor's TORCHINDUCTOR_CACHE_DIR
    gc.freeze()  # the imports out of the collector's view (the module docstring)
    assert threading.active_count() == 1, "a fork copies one thread: the imports must not start any"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # kernel pid -> its `connect`'s connection
    served = {"warm": 0, "cold": 0}
    while True:
        for key, _ in selector.select(timeout=0.2):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
                while not message.endswith(b"\n"):  # the request is one line; a long one comes in parts
                    message += connection.recv(1 << 16) or b"\n"
                request = json.loads(message)
                differs = _differs(before, request["env"])
                served["cold" if differs else "warm"] += 1
                Path(path + ".served").write_text(json.dumps(served))  # for the suite's closing line
                if differs:
                    print(f"cold: its {', '.join(differs)} differ", flush=True)  # the log: why, for whoever reads it
                    connection.sendall(json.dumps({"refused": f"its {', '.join(differs)} differ"}).encode())
                    connection.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:  # the kernel: drop the server's state, take the caller's stdio, environment and folder
                    selector.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    connection.close()
                    for fd, target in zip(fds, (0, 1, 2), strict=True):
                        os.dup2(fd, target)
                        os.close(fd)
                    return request | {"env": {**added, **request["env"]}}  # as if its own imports had set them
                for fd in fds:
                    os.close(fd)
                children[pid] = connection
                selector.register(connection, selectors.EVENT_READ, pid)
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            elif not key.fileobj.recv(1):  # its `connect` is gone (killed by Jupyter): so is the kernel
                with contextlib.suppress(OSError, ValueError):
                    os.kill(key.data, signal.SIGKILL)
                selector.unregister(key.fileobj)
        while children:  # reap: tell each `connect` how its kernel ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            with contextlib.suppress(OSError, ValueError):
                connection.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            with contextlib.suppress(OSError, ValueError):
                selector.unregister(connection)
            connection.close()


def run_kernel(request: dict) -> None:
    """In a forked child: become the kernel Jupyter asked for, as `python -m ipykernel_launcher` would."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [sys.executable, *request["argv"]]
    del sys.path[0]  # this file's folder; ipykernel puts the kernel's working folder there, as for any kernel
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS; so does this one
        sys.modules["numpy"].random.seed()
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=request["argv"])


def connect(argv: list[str]) -> None:
    """Jupyter's kernel process: a forked kernel if the warm process serves one, else a cold kernel."""
    cold = [sys.executable, "-m", "ipykernel_launcher", *argv]
    path = os.environ.get(SOCKET_VARIABLE)
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(path)
        request = {"env": dict(os.environ), "cwd": os.getcwd(), "argv": argv}
        socket.send_fds(client, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        replies = client.makefile()
        reply = json.loads(replies.readline() or "{}")
    except (OSError, TypeError, ValueError) as error:
        reply = {"refused": f"the warm process did not answer ({error})"}
    if "pid" not in reply:
        print(f"warm_kernels: a cold kernel: {reply.get('refused', reply)}", file=sys.stderr)
        os.execv(sys.executable, cold)
    kernel = reply["pid"]
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, lambda sig, _frame: os.kill(kernel, sig))  # Jupyter interrupts and stops "the kernel"
    line = replies.readline()
    sys.exit(json.loads(line)["exit"] if line else 1)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        run_kernel(serve(sys.argv[2]))  # only a forked kernel returns from serve
    else:
        connect(sys.argv[2:])
