#!/usr/bin/env bash
# Builds a real Kubernetes control plane from the Go modules pinned in tools/kube:
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler, into OUTDIR
# (default: .kube-bin in the repository root). No prebuilt binary is downloaded; the
# Go module proxy serves the sources.
#
# A second run with the same pins is a no-op: OUTDIR/.build-stamp holds a hash of the
# go.mod/go.sum/tools.go files, this script and the Go version, and the build is skipped
# while it matches and every binary is there.
#
# Environment: GO (the go command; default: go on PATH, else /usr/local/go/bin/go),
# KUBE_BUILD_P (parallel compile jobs, default 2), KUBE_BUILD_NICE (default 15: the build
# shares a small machine with test suites), SOURCE_DATE_EPOCH (fixes the reported buildDate).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mods="$repo/tools/kube"
out=${1:-"$repo/.kube-bin"}
mkdir -p "$out"
out=$(cd "$out" && pwd)

go=${GO:-}
if [[ -z "$go" ]]; then
  if command -v go >/dev/null 2>&1; then go=$(command -v go)
  elif [[ -x /usr/local/go/bin/go ]]; then go=/usr/local/go/bin/go
  else echo "build-kube: no go command (set GO=/path/to/go)" >&2; exit 1
  fi
fi
# A too-old Go must fail here, not fetch another toolchain.
export GOTOOLCHAIN=local
# Kubernetes links these servers statically (KUBE_STATIC_BINARIES), and so does etcd's build.
export CGO_ENABLED=0
jobs=${KUBE_BUILD_P:-2}
niceness=${KUBE_BUILD_NICE:-15}

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler)
stamp_file="$out/.build-stamp"
stamp=$(
  cd "$repo"
  sha256sum tools/kube/go.mod tools/kube/go.sum tools/kube/tools.go \
    tools/kube/etcd/go.mod tools/kube/etcd/go.sum tools/kube/etcd/tools.go scripts/build-kube.sh
  "$go" version
)

all_there=1
for b in "${binaries[@]}"; do [[ -x "$out/$b" ]] || all_there=0; done
if [[ $all_there == 1 && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp" ]]; then
  echo "build-kube: up to date in $out (${binaries[*]})"
  exit 0
fi
rm -f "$stamp_file"

kube_version=$(sed -n 's|^require k8s.io/kubernetes \(v[0-9.]*\)$|\1|p' "$mods/go.mod")
etcd_version=$(sed -n 's|^require go.etcd.io/etcd/server/v3 \(v[0-9.]*\)$|\1|p' "$mods/etcd/go.mod")
if [[ -z "$kube_version" || -z "$etcd_version" ]]; then
  echo "build-kube: cannot read the pinned versions from tools/kube/go.mod and tools/kube/etcd/go.mod" >&2
  exit 1
fi
major=${kube_version#v}; major=${major%%.*}
minor=${kube_version#v*.}; minor=${minor%%.*}
if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
  build_date=$(date -u --date="@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
else
  build_date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
fi

# The version variables that Kubernetes' hack/lib/version.sh sets, in both packages it sets
# them in; without them the servers report v0.0.0-master. gitCommit and gitTreeState are left
# alone, as Kubernetes does when it has no git commit: a module zip carries none.
kube_ldflags=""
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  kube_ldflags+=" -X '$pkg.gitVersion=$kube_version'"
  kube_ldflags+=" -X '$pkg.gitMajor=$major' -X '$pkg.gitMinor=$minor'"
  kube_ldflags+=" -X '$pkg.buildDate=$build_date'"
done
# As hack/lib/golang.sh builds a non-debug release: no symbol table or DWARF, trimmed paths,
# and the tags it always sets.
kube_flags=(-trimpath -buildvcs=false -p "$jobs" -tags=selinux,notest,grpcnotrace
  "-ldflags=all=${kube_ldflags# } -s -w")
etcd_flags=(-trimpath -buildvcs=false -p "$jobs" "-ldflags=-s -w")

build() {  # build NAME MODULE_DIR PACKAGE FLAGS...
  local name=$1 dir=$2 pkg=$3
  shift 3
  local start=$SECONDS
  echo "build-kube: building $name ($pkg) ..."
  (cd "$dir" && nice -n "$niceness" "$go" build "$@" -o "$out/$name" "$pkg")
  echo "build-kube: $name done in $((SECONDS - start)) s, $(du -h "$out/$name" | cut -f1)"
}

echo "build-kube: Kubernetes $kube_version, etcd $etcd_version, $("$go" version | cut -d' ' -f3), -p $jobs, into $out"
build etcd "$mods/etcd" go.etcd.io/etcd/server/v3 "${etcd_flags[@]}"
for b in kube-apiserver kube-controller-manager kube-scheduler; do
  build "$b" "$mods" "k8s.io/kubernetes/cmd/$b" "${kube_flags[@]}"
done
echo "$stamp" > "$stamp_file"
echo "build-kube: all built in $out"
