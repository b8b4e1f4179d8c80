#!/usr/bin/env bash
# Build the operator image from the Dockerfile with buildah (Debian's `buildah`: no daemon), for one or more
# architectures, and print each image's size.
#
#   scripts/build-image.sh [BASE=default|debian|IMAGE] [ARCHES="amd64 arm64"] [IMAGE=kvoffload:VERSION]
#                          [VERSION=...] [STORAGE_ROOT=DIR] [STORAGE_DRIVER=overlay|vfs] [CACHE=build/image]
#
# BASE=default builds FROM the Dockerfile's pinned python:3.11-slim (it must be pullable). BASE=debian first makes a
# local base from Debian bookworm's own packages (mmdebstrap: python3, python3-venv, ca-certificates), cached as a
# tarball under CACHE and imported as localhost/kvoffload-base:bookworm-ARCH-KEY; any other value is used as the base
# image itself. An architecture other than the host's runs its build steps under qemu-user-static through binfmt_misc
# (the kernel's, registered by the qemu-user-static package); without it that architecture fails with a message.
# One architecture is tagged IMAGE; several are tagged IMAGE-ARCH and gathered in a manifest list named IMAGE.
# STORAGE_ROOT keeps the images out of the machine's containers storage (the tests use a temporary one).
# Needs: apt-get install buildah mmdebstrap (debian base); qemu-user-static binfmt-support arch-test (other arches).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-default}
ARCHES=${ARCHES:-}
VERSION=${VERSION:-}
IMAGE=${IMAGE:-}
STORAGE_ROOT=${STORAGE_ROOT:-}
STORAGE_DRIVER=${STORAGE_DRIVER:-}
CACHE=${CACHE:-build/image}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
for arg in "$@"; do
    case $arg in
        BASE=* | ARCHES=* | VERSION=* | IMAGE=* | STORAGE_ROOT=* | STORAGE_DRIVER=* | CACHE=* | DEBIAN_MIRROR=*)
            declare "$arg" ;;
        *) echo "build-image.sh: unknown argument '$arg' (see the header of $0)" >&2; exit 2 ;;
    esac
done

host_arch=$(dpkg --print-architecture)
ARCHES=${ARCHES:-$host_arch}
VERSION=${VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
IMAGE=${IMAGE:-kvoffload:$VERSION}
command -v buildah >/dev/null || { echo "build-image.sh: buildah not found (apt-get install buildah)" >&2; exit 1; }

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
# As root, podman and buildah raise RLIMIT_NOFILE to 1048576 unless containers.conf names the limits; where the
# hard limit is lower (20000 here) runc refuses: "error setting rlimit type 7: operation not permitted".
if [[ -z ${CONTAINERS_CONF:-} ]]; then
    printf '[containers]\ndefault_ulimits = []\n' >"$CACHE/containers.conf"
    export CONTAINERS_CONF=$CACHE/containers.conf
fi
store=()
[[ -z $STORAGE_ROOT ]] || store+=(--root "$STORAGE_ROOT" --runroot "$STORAGE_ROOT/run")
[[ -z $STORAGE_DRIVER ]] || store+=(--storage-driver "$STORAGE_DRIVER")

foreign_ready() {  # whether this kernel runs ARCH's binaries (natively or through a registered qemu)
    local arch=$1 qemu
    [[ $arch == "$host_arch" ]] && return 0
    case $arch in arm64) qemu=aarch64 ;; armhf) qemu=arm ;; ppc64el) qemu=ppc64le ;; *) qemu=$arch ;; esac
    [[ -f /proc/sys/fs/binfmt_misc/qemu-$qemu ]] && grep -qx enabled "/proc/sys/fs/binfmt_misc/qemu-$qemu"
}

# essential, not minbase: no apt at run time. merged-usr by mmdebstrap's hook, not by the usrmerge package, which
# would bring the whole of perl (54 MB). Docs, man pages and locales stay out.
MMDEBSTRAP_OPTIONS=(--variant=essential "--include=python3,python3-venv,ca-certificates"
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*')
# The cached tarball and the base image are named after these options, so changing them makes a new base.
BASE_KEY=$(printf '%s\n' "${MMDEBSTRAP_OPTIONS[@]}" | sha256sum | cut -c1-12)

debian_base() {  # ARCH: sets $base to the local base's name, built if missing
    local arch=$1 tar=$CACHE/base-bookworm-$1-$BASE_KEY.tar ctr=kvoffload-base-$1 start
    base=localhost/kvoffload-base:bookworm-$arch-$BASE_KEY
    buildah "${store[@]}" inspect --type image "$base" >/dev/null 2>&1 && return 0
    if [[ ! -s $tar ]]; then
        command -v mmdebstrap >/dev/null \
            || { echo "build-image.sh: mmdebstrap not found (apt-get install mmdebstrap)" >&2; exit 1; }
        echo "== base: mmdebstrap bookworm for $arch"
        start=$SECONDS
        mmdebstrap --quiet --architectures="$arch" --format=tar "${MMDEBSTRAP_OPTIONS[@]}" \
            bookworm "$tar.part" "$DEBIAN_MIRROR"
        mv "$tar.part" "$tar"
        echo "== base tarball for $arch in $((SECONDS - start)) s"
    fi
    buildah "${store[@]}" rm "$ctr" >/dev/null 2>&1 || true
    buildah "${store[@]}" from --name "$ctr" scratch >/dev/null
    buildah "${store[@]}" add "$ctr" "$tar" / >/dev/null
    buildah "${store[@]}" config --arch "$arch" --os linux \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 "$ctr"
    buildah "${store[@]}" commit --rm --quiet "$ctr" "$base" >/dev/null
}

build_args=(--build-arg "VERSION=$VERSION")
mounts=()
# Behind a TLS-intercepting proxy pip needs the host's CA bundle: mounted for the build steps, never copied in.
if [[ -n ${PIP_CERT:-} && -f $PIP_CERT ]]; then
    mounts+=(--volume "$(realpath "$PIP_CERT"):/run/kvoffload-build-ca.crt:ro")
    build_args+=(--build-arg PIP_CERT=/run/kvoffload-build-ca.crt)
fi

read -r -a arches <<<"${ARCHES//,/ }"
built=()
for arch in "${arches[@]}"; do
    foreign_ready "$arch" || {
        echo "build-image.sh: cannot run $arch binaries here: no enabled binfmt_misc entry for it (apt-get install" \
            "qemu-user-static binfmt-support arch-test; in a container, as root: mount -t binfmt_misc binfmt_misc" \
            "/proc/sys/fs/binfmt_misc && update-binfmts --enable)" >&2
        exit 1
    }
    base_args=()
    case $BASE in
        default) ;;
        debian) debian_base "$arch"
            base_args=(--pull=never --build-arg "PYTHON_IMAGE=$base" --build-arg "BASE_NAME=$base") ;;
        *) base_args=(--build-arg "PYTHON_IMAGE=$BASE" --build-arg "BASE_NAME=${BASE%@*}") ;;
    esac
    tag=$IMAGE
    ((${#arches[@]} == 1)) || tag=$IMAGE-$arch
    echo "== image: $tag ($arch, base $BASE)"
    start=$SECONDS
    buildah "${store[@]}" bud --isolation chroot --layers --arch "$arch" --os linux \
        "${base_args[@]}" "${build_args[@]}" "${mounts[@]}" -t "$tag" .
    echo "== built $tag in $((SECONDS - start)) s"
    built+=("$tag")
done

if ((${#built[@]} > 1)); then
    # The name may hold an older list, or a single-architecture image from an earlier build: free it either way.
    buildah "${store[@]}" manifest rm "$IMAGE" >/dev/null 2>&1 \
        || buildah "${store[@]}" rmi "$IMAGE" >/dev/null 2>&1 || true
    buildah "${store[@]}" manifest create "$IMAGE" >/dev/null
    for tag in "${built[@]}"; do buildah "${store[@]}" manifest add "$IMAGE" "$tag" >/dev/null; done
    echo "== manifest list $IMAGE: ${built[*]}"
fi
for tag in "${built[@]}"; do
    # The image's layers, uncompressed, as containers storage counts them.
    echo "== size $tag: $(buildah "${store[@]}" images --format '{{.Size}}' "$tag")"
done
