"""tests/warm_kernels.py: the background runs' kernels are forked warm, each in its own environment, and fall
back to a cold kernel rather than run in an environment the preloaded libraries did not see."""

from __future__ import annotations

import os
import subprocess
import sys

import warm_kernels


def test_only_variables_read_at_run_time_may_differ():
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    per_kernel = {"HELPERS_NOTEBOOK": "03_x", "WANDB_DIR": "/tmp/w", "JPY_PARENT_PID": "7", "KIT_WARM_KERNELS": "s"}
    assert warm_kernels._differs(base, base | per_kernel) == []
    assert warm_kernels._differs(base, base | {"OMP_NUM_THREADS": "2"}) == ["OMP_NUM_THREADS"]
    assert warm_kernels._differs(base, {"PATH": "/bin", "OMP_NUM_THREADS": "1"}) == ["HF_HUB_OFFLINE"]
    assert warm_kernels._differs(base, base | {"TRANSFORMERS_VERBOSITY": "info"}) == ["TRANSFORMERS_VERBOSITY"]


def test_without_the_warm_process_the_kernel_starts_cold_and_says_why(tmp_path):
    env = os.environ | {warm_kernels.SOCKET_VARIABLE: str(tmp_path / "nobody-listens")}
    done = subprocess.run(
        [sys.executable, warm_kernels.__file__, "connect", "--version"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "warm_kernels: a cold kernel: the warm process did not answer" in done.stderr
    assert done.stdout.strip()[0].isdigit(), "ipykernel_launcher --version: ipykernel's own version, exec'd cold"


def test_the_kernelspec_points_jupyter_at_connect(tmp_path):
    from jupyter_client.kernelspec import KernelSpecManager

    variables = warm_kernels.kernelspec(tmp_path)
    manager = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    spec = manager.get_kernel_spec("python3")
    assert spec.argv[1:3] == [warm_kernels.__file__, "connect"] and "{connection_file}" in spec.argv
    assert variables == {"JUPYTER_PATH": str(tmp_path)}


def test_every_background_kernel_was_forked_warm(background_kernels, notebook_run, simulated_runs, capstone_reruns):
    """All 22 kernels of the suite's runs: a cold one costs its run about 5 s of imports (its stderr says why)."""
    kernels = len(notebook_run.summary()) + sum(len(run.summary()) for run in simulated_runs.values())
    assert background_kernels == {"warm": kernels + len(capstone_reruns), "cold": 0}
