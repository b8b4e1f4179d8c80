#!/usr/bin/env bash
# Builds the real Prometheus Operator from the Go module pinned in tools/prometheus-operator, into
# OUTDIR (default: .kube-bin in the repository root, beside the control plane), and copies the
# release's own CRDs (monitoring.coreos.com, example/prometheus-operator-crd/ in the module) into
# OUTDIR/prometheus-operator-crds/. No prebuilt binary is downloaded; the Go module proxy serves
# the sources.
#
# A second run with the same pins is a no-op: OUTDIR/.prometheus-operator-stamp holds a hash of
# the go.mod/go.sum/tools.go files, this script and the Go version.
#
# Environment: GO (default: go on PATH, else /usr/local/go/bin/go), KUBE_BUILD_P (parallel compile
# jobs, default 2), KUBE_BUILD_NICE (default 15), SOURCE_DATE_EPOCH (fixes the reported build date).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mods="$repo/tools/prometheus-operator"
out=${1:-"$repo/.kube-bin"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

go=${GO:-}
if [[ -z "$go" ]]; then
  if command -v go >/dev/null 2>&1; then go=$(command -v go)
  elif [[ -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go
  else echo "build-prometheus-operator: no go command (set GO=/path/to/go)" >&2; exit 1
  fi
fi
export GOTOOLCHAIN=local
# Upstream's Makefile builds it static (CGO_ENABLED=0).
export CGO_ENABLED=0
jobs=${KUBE_BUILD_P:-2}
niceness=${KUBE_BUILD_NICE:-15}

binary="$out/prometheus-operator"
crds="$out/prometheus-operator-crds"
stamp_file="$out/.prometheus-operator-stamp"
stamp=$(
  cd "$repo"
  sha256sum tools/prometheus-operator/go.mod tools/prometheus-operator/go.sum \
    tools/prometheus-operator/tools.go scripts/build-prometheus-operator.sh
  "$go" version
)
if [[ -x "$binary" && -d "$crds" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
  echo "build-prometheus-operator: up to date in $out"
  exit 0
fi
rm -f "$stamp_file"

module=github.com/prometheus-operator/prometheus-operator
version=$(sed -n "s|^require $module \(v[0-9.]*\)$|\1|p" "$mods/go.mod")
if [[ -z "$version" ]]; then
  echo "build-prometheus-operator: cannot read the pinned version from tools/prometheus-operator/go.mod" >&2
  exit 1
fi
if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
  build_date=$(date -u --date="@$SOURCE_DATE_EPOCH" +%Y%m%d-%H:%M:%S)
else
  build_date=$(date -u +%Y%m%d-%H:%M:%S)
fi
# The version variables upstream's Makefile sets (GO_BUILD_LDFLAGS), so `--version` and the
# operator's build_info say v0.85.0 rather than nothing. A module zip carries no git revision.
common=github.com/prometheus/common/version
ldflags="-s -w -X $common.Version=${version#v} -X $common.BuildDate=$build_date"
ldflags+=" -X $common.BuildUser=kvoffload -X $common.Branch=module -X $common.Revision=module"

start=$SECONDS
echo "build-prometheus-operator: $module $version, $("$go" version | cut -d' ' -f3), -p $jobs, into $out"
(cd "$mods" && nice -n "$niceness" "$go" build -trimpath -buildvcs=false -p "$jobs" \
  "-ldflags=$ldflags" -o "$binary" "$module/cmd/operator")
echo "build-prometheus-operator: built in $((SECONDS - start)) s, $(du -h "$binary" | cut -f1)"

# The CRDs of the same release, from the module's own files (the zip the build just used).
src=$(cd "$mods" && "$go" list -m -f '{{.Dir}}' "$module")
rm -rf "$crds"
mkdir -p "$crds"
cp "$src"/example/prometheus-operator-crd/monitoring.coreos.com_*.yaml "$crds/"
chmod u+w "$crds"/*.yaml
echo "$stamp" > "$stamp_file"
echo "build-prometheus-operator: $(ls "$crds" | wc -l) CRDs in $crds"
