#!/usr/bin/env bash
# Builds argocd-diff (main.go here) against Argo CD v3.2.11, pinned in go.mod, into OUTDIR (default:
# .kube-bin in the repository root, beside the control plane). The Go module proxy serves the
# sources; nothing prebuilt is downloaded.
#
# Argo CD's controller package keeps normalizeTargetResources (the RespectIgnoreDifferences step of a
# sync) and shouldBeDeleted (the Application deletion filter) unexported, gitops-engine's sync package
# keeps pruneObject unexported, and the go tool will not overlay files in the module cache, so the build
# copies the verified argo-cd and gitops-engine modules into a scratch folder, adds the files of
# _overlay/ (exported wrappers, nothing of Argo CD's changed) and points a scratch copy of go.mod at them.
#
# A second run with the same pins is a no-op: OUTDIR/.argocd-diff-stamp holds a hash of the files
# here, this script and the Go version.
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
  else echo "build-argocd-diff: no go command (set GO=/path/to/go)" >&2; exit 1
  fi
fi
export GOTOOLCHAIN=local
export CGO_ENABLED=0
jobs=${KUBE_BUILD_P:-2}
niceness=${KUBE_BUILD_NICE:-15}

binary="$out/argocd-diff"
stamp_file="$out/.argocd-diff-stamp"
stamp=$(
  cd "$repo"
  sha256sum tools/argocd-diff/go.mod tools/argocd-diff/go.sum tools/argocd-diff/*.go \
    tools/argocd-diff/_overlay/controller/*.go tools/argocd-diff/_overlay/gitops-engine/pkg/sync/*.go \
    tools/argocd-diff/build.sh
  "$go" version
)
if [[ -x "$binary" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
  echo "build-argocd-diff: up to date in $out"
  exit 0
fi
rm -f "$stamp_file"

module=github.com/argoproj/argo-cd/v3
version=$(sed -n "s|^[[:space:]]*$module \(v[0-9.]*\)$|\1|p" "$here/go.mod")
if [[ -z "$version" ]]; then
  echo "build-argocd-diff: cannot read the pinned version from tools/argocd-diff/go.mod" >&2
  exit 1
fi

start=$SECONDS
echo "build-argocd-diff: $module $version, $("$go" version | cut -d' ' -f3), -p $jobs, into $out"
(cd "$here" && "$go" mod download && "$go" mod verify >/dev/null)
src=$(cd "$here" && "$go" list -m -f '{{.Dir}}' "$module")
engine=github.com/argoproj/gitops-engine
engine_src=$(cd "$here" && "$go" list -m -f '{{.Dir}}' "$engine")

scratch=$(mktemp -d)
trap 'chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"' EXIT
cp -r "$src" "$scratch/argo-cd"
chmod -R u+w "$scratch/argo-cd"
cp "$here"/_overlay/controller/*.go "$scratch/argo-cd/controller/"
cp -r "$engine_src" "$scratch/gitops-engine"
chmod -R u+w "$scratch/gitops-engine"
cp "$here"/_overlay/gitops-engine/pkg/sync/*.go "$scratch/gitops-engine/pkg/sync/"
cp "$here/go.mod" "$scratch/build.mod"
cp "$here/go.sum" "$scratch/build.sum"
(cd "$here" && "$go" mod edit -modfile="$scratch/build.mod" -replace "$module=$scratch/argo-cd" \
  -replace "$engine=$scratch/gitops-engine")

(cd "$here" && nice -n "$niceness" "$go" build -modfile="$scratch/build.mod" -trimpath -buildvcs=false \
  -p "$jobs" -ldflags="-s -w" -o "$binary" .)
echo "build-argocd-diff: built in $((SECONDS - start)) s, $(du -h "$binary" | cut -f1)"
echo "$stamp" > "$stamp_file"
