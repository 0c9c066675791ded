"""Measure what the notebooks' install cell would download on a runtime that already has torch.

    python scripts/measure_install.py                 # the figures; exit 1 if torch or a CUDA wheel would come
    python scripts/measure_install.py --json          # the same as JSON (tests/test_install_cell.py reads it)
    python scripts/measure_install.py --install-torch torch==2.13.0   # a real torch install (slower)
    python scripts/measure_install.py --runtime-torch 2.6.0+cu124     # a runtime whose torch is older
    python scripts/measure_install.py --runtime-has psutil==5.9.5     # a runtime that ships psutil 5.9.5
    python scripts/measure_install.py --run-in VENV/bin/python        # install for real there, as on Colab

Colab and Kaggle ship torch, so what matters is what the cell adds on top of it. How:

1. make an empty venv and give it torch, as the runtimes have it: by default by linking this
   environment's torch and the packages torch needs into it (pip reads the same dist-info files
   it would after an install, in a second instead of twenty); with `--install-torch SPEC`, by a
   real pip install; with `--runtime-torch VERSION`, by torch's metadata alone at that version
   (Colab's or Kaggle's of the day), which is all pip reads, to see whether the pins accept it;
   with `--runtime-has NAME==VERSION` (repeatable), other libraries the runtime ships, the same way;
2. run `helpers.maintainer.notebooks.INSTALL_CELL` itself in that venv, with two substitutions: the GitHub
   URLs become this checkout (its requirements.txt and folder: the same requirement set, and GitHub
   is out of reach from the test machines), and pip gets `--dry-run --report`;
3. read pip's report (every package it would install, with the file's URL) and size each file: a
   local file by its size, a remote one by a HEAD request to the index (the report carries no
   sizes);
4. fail when torch, a package built against one torch (torchvision, triton, ...) or an NVIDIA CUDA
   wheel is among them;
5. list what pip would replace: packages the venv already had, at another version. Where the
   kernel has imported one of them, the install cell asks the student to restart.

The download figure is an upper bound: the venv holds only torch and what torch needs, while Colab
and Kaggle already ship many of the packages listed (numpy, pandas, pyarrow, requests, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/_args.py, also when loaded by path

from _args import existing_file  # noqa: E402

from helpers._requirements import canonical_name  # noqa: E402
from helpers.maintainer.notebooks import BRANCH, DISTRIBUTION, INSTALL_CELL, REPOSITORY  # noqa: E402

# Packages the cell must never install: torch and what is built against one torch version, and
# NVIDIA's CUDA runtime wheels (nvidia-ml-py is only the NVML bindings, 60 kB of Python).
TORCH_BOUND = re.compile(r"^(torch|torchvision|torchaudio|triton|pytorch-triton.*|xformers)$")
CUDA_WHEEL = re.compile(r"^(nvidia-(?!ml-py$).+|cuda-.+|cupy.*)$")

# What the harness does in the venv: run the cell as it is, pointing pip at this checkout.
HARNESS = r"""
import json, subprocess, sys

spec = json.load(open(sys.argv[1]))
real_run, seen = subprocess.run, set()

def run(args, *a, **kw):
    if list(args[:3]) != [sys.executable, "-m", "pip"]:
        sys.exit(f"the install cell ran {args[:3]}, not pip: update scripts/measure_install.py")
    seen.update(x for x in args if x in spec["urls"])
    args = spec["pip"] + [spec["urls"].get(x, x) for x in args[3:]] + spec["extra"]
    return real_run(args, *a, **kw)

subprocess.run = run
exec(compile(spec["cell"], "<install cell>", "exec"), {"__name__": "__main__"})
if set(spec["urls"]) - seen:
    sys.exit(f"the install cell no longer names {sorted(set(spec['urls']) - seen)}: update scripts/measure_install.py")
"""


def make_venv(folder: Path) -> Path:
    """An empty venv (no pip: the harness runs this environment's pip with --python)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip())


def requirement_closure(name: str) -> list[metadata.Distribution]:
    """`name` and every installed distribution it needs, found through this environment."""
    from packaging.requirements import Requirement

    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [(name, "")]
    while todo:
        key, extra = todo.pop()
        key = canonical_name(key)
        if (key, extra) in done:
            continue
        done.add((key, extra))
        try:
            dist = found.get(key) or metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # an optional need this environment lacks; the runtime may lack it too
        found[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            # an extra asked for ("cuda-toolkit[cublas]", as PyPI's CUDA torch needs) brings its own needs
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, ""), *((req.name, e) for e in req.extras)]
    return list(found.values())


def link_torch(site: Path, as_version: str | None = None) -> str:
    """Make this environment's torch (and what it needs) visible in `site`; return torch's version.

    With `as_version`, torch itself is only a dist-info that says that version (with the real
    one's requirements): enough for pip, which reads nothing else of an installed package.
    """
    try:
        torch = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        sys.exit(
            "this Python has no torch to link: run from the kit's venv (`make setup`), "
            "or pass --install-torch torch==2.13.0"
        )
    for dist in requirement_closure("torch"):
        if as_version and dist.metadata["Name"] == "torch":
            continue
        tops = {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}
        for top in sorted(tops):
            target = Path(dist.locate_file(top))
            if target.exists() and not (site / top).exists():
                (site / top).symlink_to(target)
    if not as_version:
        return torch.version
    info = site / f"torch-{as_version}.dist-info"
    info.mkdir()
    needs = "".join(f"Requires-Dist: {r}\n" for r in torch.requires or [])
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {as_version}\n{needs}")
    (info / "INSTALLER").write_text("pip\n")
    return as_version


def pretend_installed(site: Path, spec: str) -> None:
    """Make `site` say NAME==VERSION is installed: its dist-info alone, which is all pip reads of it."""
    name, _, version = spec.partition("==")
    if not (name and version):
        sys.exit(f"--runtime-has takes NAME==VERSION, e.g. psutil==5.9.5, not {spec!r}")
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")


def installed(python: Path) -> dict[str, str]:
    """{canonical name: version} of every distribution the venv's Python sees."""
    code = "import importlib.metadata as m, json; print(json.dumps({d.name: d.version for d in m.distributions()}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return {canonical_name(name): version for name, version in json.loads(out).items()}


def install_torch(python: Path, spec: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", spec], capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.exit(f"pip install {spec} failed:\n{done.stdout}{done.stderr}")
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def run_cell(python: Path, work: Path, pip: list[str], extra: list[str], env: dict | None = None):
    """Run the install cell in `python`, GitHub pointed at this checkout; pip: `pip` + the cell's args + `extra`."""
    spec = {
        "cell": INSTALL_CELL,
        "urls": {
            f"https://raw.githubusercontent.com/{REPOSITORY}/{BRANCH}/requirements.txt": str(ROOT / "requirements.txt"),
            f"git+https://github.com/{REPOSITORY}.git@{BRANCH}": str(ROOT),
        },
        "pip": pip,
        "extra": extra,
    }
    (work / "spec.json").write_text(json.dumps(spec))
    (work / "harness.py").write_text(HARNESS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAGGLE_")} | (env or {})  # no Kaggle probe
    return subprocess.run(
        [str(python), str(work / "harness.py"), str(work / "spec.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
    )


def dry_run(python: Path, work: Path) -> dict:
    """Run the install cell in the venv with pip in --dry-run mode; return pip's JSON report."""
    report = work / "report.json"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    # a dry run installs no kit: the cell's step after pip imports helpers from this checkout, through
    # a folder that holds only the package (the checkout itself may hold the kit's egg-info, which
    # would tell the cell the kit is installed)
    (work / "kit").mkdir()
    (work / "kit" / "helpers").symlink_to(ROOT / "helpers")
    done = run_cell(python, work, pip, ["--dry-run", "--report", str(report)], {"PYTHONPATH": str(work / "kit")})
    if done.returncode != 0 or not report.exists():
        sys.exit(f"the install cell's dry run failed (exit {done.returncode}):\n" + without_noise(done))
    return json.loads(report.read_text())


def without_noise(done: subprocess.CompletedProcess) -> str:
    noise = re.compile(r"^WARNING: Location .* is ignored", re.M)  # a local mirror's harmless chatter
    return "\n".join(line for line in (done.stdout + done.stderr).splitlines() if not noise.match(line))


def install_into(python: Path) -> int:
    """Run the install cell for real in `python`'s environment, as a student's runtime runs it; print what it said."""
    with tempfile.TemporaryDirectory(prefix="kit-install-") as tmp:
        start = time.perf_counter()
        done = run_cell(python, Path(tmp), [str(python), "-m", "pip"], [])
    print(without_noise(done))
    print(f"the install cell took {time.perf_counter() - start:.1f} s in {python} (exit {done.returncode})")
    return done.returncode


def file_size(url: str) -> int | None:
    """Bytes of the file at `url`: a local file's size, or Content-Length from a HEAD request."""
    if url.startswith("file:"):
        path = Path(unquote(urlparse(url).path))
        return path.stat().st_size if path.is_file() else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30) as r:
            length = r.headers.get("Content-Length")
            return int(length) if length else None
    except OSError:
        return None


def measure(
    install_torch_spec: str | None = None, runtime_torch: str | None = None, runtime_has: tuple[str, ...] = ()
) -> dict:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kit-install-") as tmp:
        work = Path(tmp)
        python = make_venv(work / "venv")
        if install_torch_spec:
            torch_version, how = install_torch(python, install_torch_spec), f"pip install {install_torch_spec}"
        elif runtime_torch:
            torch_version, how = link_torch(site_packages(python), runtime_torch), "its metadata only"
        else:
            torch_version, how = link_torch(site_packages(python)), "linked from this environment"
        for spec in runtime_has:
            pretend_installed(site_packages(python), spec)
        present = installed(python)
        torch_ready = time.perf_counter()
        report = dry_run(python, work)
    done = time.perf_counter()
    packages = []
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if canonical_name(name) == canonical_name(DISTRIBUTION):
            continue  # the kit itself: a clone of the repository on Colab, this folder here
        packages.append({"name": name, "version": version, "url": item["download_info"]["url"]})
    with ThreadPoolExecutor(8) as pool:
        for p, size in zip(packages, pool.map(file_size, [p["url"] for p in packages]), strict=True):
            p["bytes"] = size
    packages.sort(key=lambda p: -(p["bytes"] or 0))
    replaces = [
        f"{p['name']} {present[canonical_name(p['name'])]} -> {p['version']}"
        for p in packages
        if canonical_name(p["name"]) in present
    ]
    forbidden = [
        f"{p['name']} {p['version']}"
        for p in packages
        if TORCH_BOUND.match(canonical_name(p["name"])) or CUDA_WHEEL.match(canonical_name(p["name"]))
    ]
    return {
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
        "torch": torch_version,
        "torch_from": how,
        "packages": packages,
        "count": len(packages),
        "download_mb": round(sum(p["bytes"] or 0 for p in packages) / 1e6, 1),
        "unsized": [p["name"] for p in packages if p["bytes"] is None],
        "forbidden": forbidden,
        "runtime_has": list(runtime_has),
        "replaces": replaces,
        "seconds": {
            "torch_venv": round(torch_ready - start, 1),
            "dry_run": round(done - torch_ready, 1),
            "total": round(time.perf_counter() - start, 1),
        },
    }


def describe(m: dict, top: int = 12) -> str:
    lines = [
        f"install cell on Python {m['python']} ({m['platform']}), torch {m['torch']} already there ({m['torch_from']})",
        f"pip would install {m['count']} packages besides the kit, {m['download_mb']:.1f} MB to download:",
    ]
    lines += [f"  {(p['bytes'] or 0) / 1e6:7.1f} MB  {p['name']} {p['version']}" for p in m["packages"][:top]]
    rest = m["packages"][top:]
    if rest:
        lines.append(
            f"  {sum(p['bytes'] or 0 for p in rest) / 1e6:7.1f} MB  {len(rest)} more, each under "
            f"{(rest[0]['bytes'] or 0) / 1e6:.1f} MB"
        )
    if m["unsized"]:
        lines.append(f"  (no size found for {', '.join(m['unsized'])}: the figure leaves them out)")
    if m["replaces"]:
        lines.append(f"it would replace what the runtime has: {', '.join(m['replaces'])}")
    if m["forbidden"]:
        lines.append(
            f"FAIL: the cell would install {', '.join(m['forbidden'])}: it must keep the runtime's "
            "torch and never bring CUDA wheels"
        )
    else:
        lines.append("ok: no torch, nothing built against torch, no NVIDIA CUDA wheel")
    s = m["seconds"]
    lines.append(f"took {s['total']:.1f} s (venv with torch {s['torch_venv']:.1f} s, dry run {s['dry_run']:.1f} s)")
    return "\n".join(lines)


def _version(text: str) -> str:
    """An argparse type for --runtime-torch: a version pip reads (2.6.0+cu124)."""
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version: pass e.g. --runtime-torch 2.6.0+cu124") from None
    return text


def _pinned(text: str) -> str:
    """An argparse type for --runtime-has: NAME==VERSION."""
    name, _, version = text.partition("==")
    try:
        _version(version)
    except argparse.ArgumentTypeError:
        version = ""
    if not (re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and version):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME==VERSION: pass e.g. --runtime-has psutil==5.9.5")
    return text


def _requirement(text: str) -> str:
    """An argparse type for --install-torch: a requirement pip reads (torch==2.13.0)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        requirement = None
    # older packaging (Colab's) reads "torch===" as arbitrary equality with no version: pip does not
    if requirement is None or requirement.name.lower() != "torch" or not all(s.version for s in requirement.specifier):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a requirement pip reads: pass e.g. --install-torch torch==2.13.0"
        ) from None
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the measurement as JSON")
    how = parser.add_mutually_exclusive_group()
    how.add_argument(
        "--install-torch",
        metavar="SPEC",
        type=_requirement,
        help="pip install SPEC into the venv instead of linking torch",
    )
    how.add_argument(
        "--runtime-torch",
        metavar="VERSION",
        type=_version,
        help="pretend the runtime's torch is VERSION (e.g. 2.6.0+cu124): only its metadata",
    )
    parser.add_argument(
        "--runtime-has",
        action="append",
        default=[],
        type=_pinned,
        metavar="NAME==VERSION",
        help="a library the runtime ships (e.g. psutil==5.9.5): only its metadata; repeatable",
    )
    how.add_argument(
        "--run-in",
        metavar="PYTHON",
        type=existing_file("--run-in", ".venv/bin/python"),
        help="run the install cell for real in PYTHON's environment (the runtime matrix does: noxfile.py)",
    )
    args = parser.parse_args(argv)
    if args.run_in:
        return install_into(args.run_in)
    m = measure(args.install_torch, args.runtime_torch, tuple(args.runtime_has))
    print(json.dumps(m, indent=2) if args.json else describe(m))
    return 1 if m["forbidden"] else 0


if __name__ == "__main__":
    sys.exit(main())
