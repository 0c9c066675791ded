#!/usr/bin/env bash
# The GPU proof on the lent GPU machine, in one call (README, "On a real GPU"):
#
#   python3 scripts/build_device_wheels.py          # here: build/device-wheels, under 64 MiB with the tree
#   bash scripts/device_gpu_proof.sh [OUT]          # there, carrying build/device-wheels; OUT defaults to $OUT
#
# In order, each step's output kept under OUT (at most 6 files, none deeper than OUT itself):
# 1. install the wheelhouse into a folder of its own (--target, no index, no dependencies: the list is
#    the closure) and put it, then the checkout, first on PYTHONPATH: the kernels the notebooks run in
#    inherit both, and the kit's metadata wheel tells every install cell the kit is installed;
# 2. preflight.txt: nvidia-smi, the commit the wheels were built from, `pip check`, the versions
#    imported, the bitsandbytes library loaded and a 4-bit layer's backward on the card; exit 2 when
#    transformers, CUDA or bitsandbytes is wrong, within a minute of the start;
# 3. `python -m helpers gpu-proof`: the model sections first (estimator, headline, oom, precision),
#    then the notebooks with the time that is left; the whole script ends within PROOF_LIMIT_S
#    (570 s by default) with its files written, even when the proof has to be cut short;
# 4. gpu-proof.md and gpu-proof.json beside proof.log; the notebooks' executed copies and logs in
#    notebook-runs.tar.gz.
#
# The device simulation (noxfile.py, session device) runs steps 1-2 on a CPU with DEVICE_MODE=cpu.
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:-${OUT:?give the output folder as the first argument, or set OUT}}
wheels=${DEVICE_WHEELS:-build/device-wheels}
site=${DEVICE_SITE:-/tmp/kit-site}
python=${DEVICE_PYTHON:-python3}
mode=${DEVICE_MODE:-gpu}            # cpu: the simulation, which stops after the preflight
limit=${PROOF_LIMIT_S:-570}         # the call's 600 s, less the time to pack and send the files back
mkdir -p "$out"
started=$SECONDS
say() { echo "[$((SECONDS - started)) s] $*"; }

# 1. the wheelhouse
ls "$wheels"/*.whl >/dev/null 2>&1 || { echo "no wheels in $wheels: run python3 scripts/build_device_wheels.py here first and carry $wheels"; exit 2; }
rm -rf "$site"
say "installing $(ls "$wheels"/*.whl | wc -l) wheels into $site"
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
  || { echo "pip could not install the wheelhouse: see above"; exit 2; }
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KIT_COMMIT=$(cat "$wheels/COMMIT" 2>/dev/null || echo unknown)
export HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONUNBUFFERED=1

# 2. the preflight
{
  say "preflight; kit commit $KIT_COMMIT; python $("$python" -c 'import sys; print(sys.version.split()[0])')"
  nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  "$python" -m pip check 2>&1 || true   # recorded: an image has conflicts of its own; the checks below decide
  if [ "$mode" = cpu ]; then "$python" scripts/device_preflight.py --cpu; else "$python" scripts/device_preflight.py; fi
} >"$out/preflight.txt" 2>&1
preflight=$?
cat "$out/preflight.txt"
[ "$preflight" = 0 ] || { say "the preflight failed: $out/preflight.txt says why; nothing else was run"; exit 2; }
[ "$mode" = cpu ] && { say "simulation: the wheelhouse installs and imports; the proof itself needs the card"; exit 0; }

# 3. the proof, inside what is left of the limit (25 s kept to pack the files)
left=$((limit - (SECONDS - started) - 25))
work=$(mktemp -d /tmp/gpu-proof-XXXX)
say "gpu-proof with $left s left"
timeout --kill-after=10 "$left" "$python" -m helpers gpu-proof --out "$work" --time-limit $((left - 15)) \
  >"$out/proof.log" 2>&1
code=$?
tail -n 40 "$out/proof.log"

# 4. at most 6 files under OUT
cp "$work"/gpu-proof.md "$work"/gpu-proof.json "$out"/ 2>/dev/null
[ -d "$work/notebook-run" ] && tar -czf "$out/notebook-runs.tar.gz" -C "$work" notebook-run
say "gpu-proof exited $code; files: $(ls "$out" | tr '\n' ' ')"
exit "$code"
