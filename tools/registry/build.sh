#!/usr/bin/env bash
# Builds the CNCF distribution registry (github.com/distribution/distribution/v3/cmd/registry), pinned in
# go.mod here, into OUTDIR (default: .kube-bin in the repository root, beside the control plane), for
# tests/gitops/test_oci_chart.py: a real OCI registry to `helm push` the chart to and install it from.
# The Go module proxy serves the sources; nothing prebuilt is downloaded.
#
# A second run with the same pins is a no-op: OUTDIR/.registry-stamp holds a hash of the files here,
# this script and the Go version.
#
# Environment: GO (default: go on PATH, else /usr/local/go/bin/go), KUBE_BUILD_P (parallel compile
# jobs, default 2), KUBE_BUILD_NICE (default 15).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-"$repo/.kube-bin"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

go=${GO:-}
if [[ -z "$go" ]]; then
  if command -v go >/dev/null 2>&1; then go=$(command -v go)
  elif [[ -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go
  else echo "build-registry: no go command (set GO=/path/to/go)" >&2; exit 1
  fi
fi
export GOTOOLCHAIN=local
# Upstream's Dockerfile builds it static.
export CGO_ENABLED=0
jobs=${KUBE_BUILD_P:-2}
niceness=${KUBE_BUILD_NICE:-15}

binary="$out/registry"
stamp_file="$out/.registry-stamp"
stamp=$(
  cd "$repo"
  sha256sum tools/registry/go.mod tools/registry/go.sum tools/registry/tools.go tools/registry/build.sh
  "$go" version
)
if [[ -x "$binary" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
  echo "build-registry: up to date in $out"
  exit 0
fi
rm -f "$stamp_file"

module=github.com/distribution/distribution/v3
version=$(sed -n "s|^require $module \(v[0-9.]*\)$|\1|p" "$here/go.mod")
if [[ -z "$version" ]]; then
  echo "build-registry: cannot read the pinned version from tools/registry/go.mod" >&2
  exit 1
fi
# The variables upstream's Makefile sets (GO_LDFLAGS), so `registry --version` names the release rather
# than "v3.x.y+unknown". A module zip carries no git revision.
ldflags="-s -w -X $module/version.version=$version -X $module/version.revision=module"
ldflags+=" -X $module/version.mainpkg=$module"

start=$SECONDS
echo "build-registry: $module $version, $("$go" version | cut -d' ' -f3), -p $jobs, into $out"
(cd "$here" && nice -n "$niceness" "$go" build -trimpath -buildvcs=false -p "$jobs" \
  "-ldflags=$ldflags" -o "$binary" "$module/cmd/registry")
echo "build-registry: built in $((SECONDS - start)) s, $(du -h "$binary" | cut -f1)"
"$binary" --version
echo "$stamp" > "$stamp_file"
