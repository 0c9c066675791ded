"""The GPU proof's preflight: in seconds, whether the lent machine can give the proof at all.

    python3 scripts/device_preflight.py          # on the GPU machine: exit 2 on any failure
    python3 scripts/device_preflight.py --cpu    # the device simulation here: the CUDA checks skipped

scripts/device_gpu_proof.sh runs it after installing the wheelhouse and before anything slow, so a
machine that cannot give the proof costs a minute of the lease, not ten. It checks, and prints a
line for each:

1. the libraries the wheelhouse brought are the ones imported (transformers at requirements.txt's
   pin, with the activation_checkpointing_* API the proof calls; peft, bitsandbytes, datasets,
   papermill, ipykernel), the kit found as installed (the install cell then runs no pip), and
   `helpers` imported from the checkout;
2. CUDA: torch sees a GPU, its CUDA version, the card's compute capability;
3. bitsandbytes loaded the library built for torch's CUDA (not the CPU one), and a 4-bit layer runs
   forward and backward on the card with finite gradients.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = ("transformers", "tokenizers", "peft", "bitsandbytes", "datasets", "accelerate", "wandb")
IMPORTED = ("papermill", "ipykernel", "nbclient", "wandb")


def pins() -> dict[str, str]:
    """{name: version} of requirements.txt's pins, read as the kit reads them (the checkout is on PYTHONPATH)."""
    from helpers._requirements import read_pins

    return {name: version for name, (version, _) in read_pins(ROOT / "requirements.txt").items()}


def check_libraries() -> list[str]:
    """What was imported against requirements.txt: a failure each."""
    failures, wanted, modules = [], pins(), {}
    for name in dict.fromkeys(PINNED + IMPORTED):
        try:
            modules[name] = importlib.import_module(name)
        except Exception as e:  # a wheel missing from the list: the closure is wrong
            failures.append(f"import {name} failed ({type(e).__name__}: {e}): add it to scripts/device-wheels.txt")
    for name in PINNED:
        if name in modules:
            version = getattr(modules[name], "__version__", "?")
            print(f"{name} {version} from {Path(modules[name].__file__).parent}")
            if version != wanted[name]:
                failures.append(f"{name} {version} imported, requirements.txt pins {wanted[name]}: wheels not first")
    transformers = modules.get("transformers")
    if transformers and not hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable"):
        failures.append("transformers has no activation_checkpointing_enable: the image's copy was imported")
    if not any(metadata.distributions(name="compute-realities-kit")):
        failures.append("the kit is not installed as a distribution: every install cell would run pip offline")
    import helpers

    if Path(helpers.__file__).resolve().parents[1] != ROOT:
        failures.append(f"helpers imported from {helpers.__file__}, not this checkout ({ROOT})")
    return failures


def check_cuda() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return [f"torch {torch.__version__} sees no CUDA GPU"]
    p = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {p.name}, capability {p.major}.{p.minor}")
    return []


def check_bitsandbytes(device: str) -> list[str]:
    """The native library bitsandbytes loaded, and a 4-bit layer's forward and backward on `device`."""
    import torch
    from bitsandbytes import cextension
    from bitsandbytes.nn import Linear4bit

    try:  # the CDLL bitsandbytes loaded; a mock stands in when none could be loaded
        library = cextension.lib.__dict__["_lib"]._name
    except (KeyError, AttributeError):
        library = f"none ({type(cextension.lib).__name__})"
    print(f"bitsandbytes backend {cextension.BNB_BACKEND}, library {library}")
    failures = []
    if device == "cuda":
        expected = cextension.get_cuda_bnb_library_path(cextension.get_cuda_specs()).name
        if Path(library).name != expected:
            failures.append(f"bitsandbytes loaded {library}, not {expected} for torch's CUDA {torch.version.cuda}")
    torch.manual_seed(0)
    layer = Linear4bit(64, 64, bias=False, compute_dtype=torch.float32, quant_type="nf4").to(device)
    x = torch.randn(4, 64, device=device, requires_grad=True)
    layer(x).square().sum().backward()
    if x.grad is None or not torch.isfinite(x.grad).all() or not x.grad.abs().sum() > 0:
        failures.append(f"a 4-bit layer's backward on {device} gave no finite, non-zero gradient")
    else:
        print(f"a 4-bit NF4 layer ran forward and backward on {device}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="the device simulation: skip the CUDA checks, say so")
    args = parser.parse_args(argv)
    failures = check_libraries()
    if args.cpu:
        print("simulation on a CPU: the CUDA checks are skipped; the 4-bit layer runs on the CPU")
    else:
        failures += check_cuda()
    if not failures:  # a library or CUDA problem makes this one meaningless
        failures += check_bitsandbytes("cpu" if args.cpu else "cuda")
    for failure in failures:
        print(f"PREFLIGHT FAILED: {failure}")
    print("preflight: " + ("failed" if failures else "ok"))
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
