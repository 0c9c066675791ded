"""Build the wheelhouse that travels to the lent GPU machine: what the kit needs that its image lacks.

    python3 scripts/build_device_wheels.py                 # build/device-wheels/, then a table and the total
    python3 scripts/build_device_wheels.py --out DIR       # elsewhere
    python3 scripts/build_device_wheels.py --check         # no download: the list against requirements.txt

The lent machine (one H200, Python 3.12, torch 2.11.0+cu130, no internet) takes at most 64 MiB with
the working tree, so the kit's libraries travel as wheels (scripts/device-wheels.txt, each pin with
its reason) and scripts/device_gpu_proof.sh installs them there. How:

1. check the list: one line a package, each with its reason, no name twice, every pin of
   requirements.txt that the image (scripts/device-image.txt) lacks or has at another version
   listed at requirements.txt's version;
2. download each pin for CPython 3.12 on manylinux x86_64, without its dependencies (the list is
   the closure: a missing one shows in `pip check` there, and in the device simulation here);
3. repack bitsandbytes to the two libraries it can load there: the CPU one, and the one built for
   torch's CUDA (13.0: `libbitsandbytes_cuda130.so`), 43 MB -> about 4 MB;
4. write a wheel of the kit's metadata alone, so that every notebook's install cell finds the kit
   installed and runs no pip (the code itself travels as the checkout, on PYTHONPATH), and the
   commit the wheelhouse was built from (`COMMIT`);
5. refuse two wheels of one package and a set that, with the working tree, passes the 64 MiB the
   machine takes; print a table of every wheel, its size and its reason.

It never deletes a wheel it did not write. `MANIFEST` in the output folder lists, as `sha256sum`
writes it, every wheel a build put there; the next build replaces only those (a wheel left from an
older list would be a second version there). A folder holding any other wheel (yours, or one changed
since) is refused before anything is downloaded, naming each and what to do (exit 2).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from helpers._requirements import canonical_name, read_pins  # noqa: E402
from helpers.quickcheck.escaping import md_cell  # noqa: E402

WHEELS_LIST = ROOT / "scripts" / "device-wheels.txt"
IMAGE = ROOT / "scripts" / "device-image.txt"
OUT = ROOT / "build" / "device-wheels"
MANIFEST = "MANIFEST"  # in the output folder: "sha256  name" for each wheel this script wrote there
MIB = 2**20
CARRY_LIMIT = 64 * MIB  # what the device tool carries: the working tree and the carried paths together
PYTHON = "3.12"  # the image's Python (3.12.3)
# pip matches a manylinux tag exactly: every glibc from the oldest wheels' to the image's (Ubuntu 24.04: 2.39)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]
# bitsandbytes loads the library built for torch's CUDA version (torch.version.cuda "13.0" -> cuda130)
BNB_KEEP = ("libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so")
DISTRIBUTION = "compute-realities-kit"


def missing_pins(requirements: Path, image: Path, wheels: Path) -> list[str]:
    """requirements.txt's pins that the image lacks or has at another version, and the list does not carry
    at requirements.txt's version: each as the line to add."""
    image_pins, listed = read_pins(image), read_pins(wheels, reasons=True)
    wrong = []
    for name, (version, _) in read_pins(requirements).items():
        if image_pins.get(name, (None,))[0] == version:
            continue  # the image has it at the pin
        if listed.get(name, (None,))[0] != version:
            had = f"the list has {listed[name][0]}" if name in listed else "the list lacks it"
            wrong.append(f"{name}=={version} ({had})")
    return wrong


def download(pins: dict[str, tuple[str, str]], dest: Path) -> None:
    """Every pin's wheel for CPython 3.12 on manylinux x86_64, its dependencies not followed."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", PYTHON, "--implementation", "cp", "--abi", "cp312", *platforms, "-d", str(dest)]
    done = subprocess.run(command + [f"{name}=={version}" for name, (version, _) in pins.items()])
    if done.returncode != 0:  # pip said why above: no index reached, or a pin with no cp312 manylinux wheel
        raise SystemExit(
            f"pip could not download the wheels (exit {done.returncode}, its reason above): build them on a machine"
            f" that reaches PyPI, or fix the pin it names in {WHEELS_LIST.name}"
        )


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(wheel: Path, keep: tuple[str, ...] = BNB_KEEP) -> list[str]:
    """Rewrite `wheel` without the native libraries not in `keep` (RECORD to match); the names dropped.

    A wheel holding none of `keep` is refused: the machine could not load it."""
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        libraries = [n for n in names if Path(n).name.startswith("libbitsandbytes_")]
        dropped = [n for n in libraries if Path(n).name not in keep]
        if not any(Path(n).name in keep for n in libraries):
            raise SystemExit(f"{wheel.name} holds none of {', '.join(keep)}: the GPU machine could not load it")
        kept = {n: source.read(n) for n in names if n not in dropped and not n.endswith(".dist-info/RECORD")}
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    lines = [_record_line(n, data) for n, data in kept.items()] + [f"{record},,"]
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
        for name, data in kept.items():
            target.writestr(name, data)
        target.writestr(record, "\n".join(lines) + "\n")
    partial.replace(wheel)  # a repack cut short never leaves half a wheel under the real name
    return dropped


def kit_metadata_wheel(dest: Path) -> Path:
    """A wheel of the kit's metadata alone: the install cell sees the kit installed; the code is the checkout."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    info = f"{DISTRIBUTION.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n"
        "Summary: metadata only: the kit's code travels as the checkout, on PYTHONPATH (scripts/device_gpu_proof.sh)\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: build_device_wheels\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    path = dest / f"{DISTRIBUTION.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        lines = []
        for name, text in files.items():
            wheel.writestr(name, text)
            lines.append(_record_line(name, text.encode()))
        wheel.writestr(f"{info}/RECORD", "\n".join(lines + [f"{info}/RECORD,,"]) + "\n")
    return path


def wheel_name(path: Path) -> str:
    """The canonical distribution name of a wheel file (`Foo_Bar-1.0-py3-none-any.whl` -> `foo-bar`)."""
    return canonical_name(path.name.split("-")[0])


def check_set(wheels: list[Path], tree_bytes: int, limit: int = CARRY_LIMIT) -> int:
    """The set's size in bytes; SystemExit when a package comes twice or the set and the tree pass `limit`."""
    by_name: dict[str, list[str]] = {}
    for path in wheels:
        by_name.setdefault(wheel_name(path), []).append(path.name)
    twice = {name: files for name, files in by_name.items() if len(files) > 1}
    if twice:
        listed = "; ".join(", ".join(files) for files in twice.values())
        raise SystemExit(f"two wheels of one package stop the whole install there: {listed}. Keep one version.")
    total = sum(p.stat().st_size for p in wheels)
    if total + tree_bytes > limit:
        raise SystemExit(
            f"the wheels ({total / MIB:.1f} MiB) and the working tree ({tree_bytes / MIB:.1f} MiB) come to "
            f"{(total + tree_bytes) / MIB:.1f} MiB, past the {limit / MIB:.0f} MiB the GPU machine takes: "
            "drop a wheel the image has (scripts/device-image.txt), or repack a large one as bitsandbytes is"
        )
    return total


def tree_bytes() -> int:
    """What travels besides the wheels: the tracked files and those git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    paths = [ROOT / p for p in listed.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


class UsageError(ValueError):
    """An --out this script must not write to; the message names the fix (exit 2)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def written_before(out: Path) -> list[Path]:
    """The wheels in `out` this script wrote (listed in its MANIFEST, unchanged since); UsageError naming any other.

    Example:
        >>> written_before(Path("build/device-wheels"))  # doctest: +SKIP
        [PosixPath('build/device-wheels/accelerate-1.15.0-py3-none-any.whl'), ...]
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file: name a folder for the wheels, e.g. --out {_shown(OUT)}")
    listed = {}
    if (out / MANIFEST).is_file():
        for line in (out / MANIFEST).read_text().splitlines():
            digest, _, name = line.partition("  ")
            listed[name] = digest
    wheels = sorted(out.glob("*.whl")) if out.is_dir() else []
    others = [w for w in wheels if listed.get(w.name) != _sha256(w)]
    if others:
        names = ", ".join(w.name for w in others[:10]) + (f" and {len(others) - 10} more" if len(others) > 10 else "")
        raise UsageError(
            f"--out {out} holds {len(others)} wheel{'s' if len(others) != 1 else ''} this script did not write "
            f"(not in its {MANIFEST}, or changed since): {names}. A build replaces the wheels in --out, and never "
            f"deletes one it did not write: name a folder of its own, e.g. --out {shlex.quote(str(out / 'device'))}, "
            "or move those wheels out of it"
            + (
                f" (if an older build of this script wrote them, before it kept a {MANIFEST}, delete them: "
                f"rm {shlex.quote(str(out))}/*.whl)"
                if (out / "COMMIT").is_file() and not listed
                else ""
            )
        )
    return wheels


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def build(out: Path) -> int:
    written_before(out)  # refused before the download: a folder holding wheels this script did not write
    pins = read_pins(WHEELS_LIST, reasons=True)
    wrong = missing_pins(ROOT / "requirements.txt", IMAGE, WHEELS_LIST)
    if wrong:
        raise SystemExit(f"{WHEELS_LIST.name} must carry, at requirements.txt's version: {'; '.join(wrong)}")
    with tempfile.TemporaryDirectory(prefix="device-wheels-") as scratch:
        download(pins, Path(scratch))
        for wheel in Path(scratch).glob("bitsandbytes-*.whl"):
            before = wheel.stat().st_size
            dropped = repack(wheel)
            print(
                f"bitsandbytes repacked: {before / MIB:.1f} -> {wheel.stat().st_size / MIB:.1f} MiB, "
                f"{len(dropped)} CUDA libraries dropped, kept {', '.join(BNB_KEEP)}"
            )
        kit_metadata_wheel(Path(scratch))
        wheels = sorted(Path(scratch).glob("*.whl"))
        total = check_set(wheels, tree_bytes())
        out.mkdir(parents=True, exist_ok=True)
        for stale in written_before(out):  # a wheel left from an older list would be a second version there
            stale.unlink()
        (out / MANIFEST).write_text("".join(f"{_sha256(w)}  {w.name}\n" for w in wheels))
        for wheel in wheels:
            shutil.move(wheel, out / wheel.name)
    (out / "COMMIT").write_text(commit() + "\n")
    _table(sorted(out.glob("*.whl")), pins, total)
    return 0


def _table(wheels: list[Path], pins: dict[str, tuple[str, str]], total: int) -> None:
    print("\n| wheel | MiB | why it travels |\n|---|---:|---|")
    for path in sorted(wheels, key=lambda p: -p.stat().st_size):
        reason = pins.get(wheel_name(path), ("", "the kit's metadata: the install cell finds it installed"))[1]
        print(f"| {md_cell(path.name)} | {path.stat().st_size / MIB:.2f} | {md_cell(reason)} |")
    print(
        f"\n{len(wheels)} wheels, {total / MIB:.1f} MiB; with the working tree {(total + tree_bytes()) / MIB:.1f}"
        f" of {CARRY_LIMIT / MIB:.0f} MiB. Carry {OUT.relative_to(ROOT)} (scripts/device_gpu_proof.sh)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the wheelhouse (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--check", action="store_true", help="check the list against requirements.txt; no download")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            written_before(args.out)  # a bad --out is a usage error (exit 2), found before anything else
    except UsageError as e:
        parser.error(str(e))
    try:
        if args.check:
            wrong = missing_pins(ROOT / "requirements.txt", IMAGE, WHEELS_LIST)
            print("; ".join(wrong) or f"{WHEELS_LIST.name} carries every pin the image lacks")
            return 1 if wrong else 0
        return build(args.out)
    except ValueError as e:  # a line of the list or the image file that cannot be read: its number and the fix
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
