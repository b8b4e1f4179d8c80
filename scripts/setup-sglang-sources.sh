#!/usr/bin/env bash
# Lays an SGLang release's Python sources over the vLLM-for-CPU venv (.venv-vllm: torch 2.13, transformers,
# pydantic, fastapi, msgspec, prometheus_client, ...), so tests/sglang_argcheck.py checks every rendered SGLang
# command line with that release's own parser and resolution steps (0.5.23).
#
# The sglang wheel pins a newer torch and CUDA kernels (gigabytes); none of that is needed to parse and
# resolve arguments, so the wheel in requirements/sglang-<major.minor>.lock (hash-pinned) goes --no-deps into
# a folder of its own, with the three packages that lock adds: orjson, torchvision (built for torch 2.13.0)
# and gguf, which SGLang imports at module level on those paths and .venv-vllm lacks. Use it with the venv's
# python and the folder first on PYTHONPATH. triton and IPython.display are still missing there:
# tests/sglang_argcheck.py stubs them (its docstring says how).
# Safe to run again: the stamp holds the hash of the lock and of this script.
#
# Usage: scripts/setup-sglang-sources.sh VERSION DIR [VENV_DIR]     (SGLANG_WHEELS a local wheelhouse to
#        try first, default /opt/wheels where it exists)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
sglang_version=${1:?usage: setup-sglang-sources.sh VERSION DIR [VENV_DIR]}
# Absolute, so the check below can compare it with the imported module's path.
dir=$(realpath -m "${2:?usage: setup-sglang-sources.sh VERSION DIR [VENV_DIR]}")
venv=${3:-$root/.venv-vllm}
lock=$root/requirements/sglang-${sglang_version%.*}.lock
stamp=$dir/.kvoffload-setup
wheels=${SGLANG_WHEELS:-/opt/wheels}
me="setup-sglang-sources $sglang_version"

want=$(cat "$lock" "$0" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" && -f $dir/sglang/srt/server_args.py ]]; then
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
# The wheels' console scripts (sglang, killall_sglang, ...) point at no interpreter of ours.
rm -rf "$dir/bin"

# Prove it: the venv's python imports this release's ServerArgs from the folder (through the checker, which
# installs the two stubs first), and the checker runs.
PYTHONPATH=$dir "$venv/bin/python" "$root/tests/sglang_argcheck.py" --where >"$dir/where.json"
"$venv/bin/python" - "$sglang_version" "$dir" "$dir/where.json" <<'PY'
import json, sys
version, folder, where = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
assert where["sglang_version"] == version, where["sglang_version"]
assert where["server_args_file"] == f"{folder}/sglang/srt/server_args.py", where["server_args_file"]
PY
echo "$want" >"$stamp"
echo "$me: SGLang $sglang_version sources ready in $dir (over $venv)"
