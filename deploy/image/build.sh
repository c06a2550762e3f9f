#!/usr/bin/env bash
# deploy/image/build.sh: builds the kube-proxy-rs container image from
# Debian's packages, with no container registry. Run as root from anywhere:
#
#   deploy/image/build.sh                   release binary -> localhost/kube-proxy-rs:dev
#                                           + $CARGO_TARGET_DIR/image/kube-proxy-rs-dev.oci.tar
#   deploy/image/build.sh --bin PATH --tag localhost/kube-proxy-rs:test
#   deploy/image/build.sh --rootfs-only     prints the cached root filesystem tar's path
#
# Two layers:
# 1. a Debian bookworm root filesystem made by mmdebstrap from the packages
#    in deploy/image/packages (and their dependencies, nothing else; no
#    documentation but copyrights, no locales, no package manager caches),
#    finished by deploy/image/setup.sh (the iptables backend wrapper). It is
#    cached as a tar in $KPR_IMAGE_CACHE (default
#    /var/cache/kube-proxy-rs-image), keyed by a hash of the package list,
#    the recipe below, setup.sh and the wrapper, and as the image
#    localhost/kube-proxy-rs-base:<that hash> in the container storage;
#    --refresh builds it again (newer Debian updates);
# 2. the binary (`cargo build --release --locked`, or --bin), its debug
#    information stripped, at the path deploy/Dockerfile's ENTRYPOINT names,
#    which is also this image's entrypoint.
#
# The image is labelled with the commit it was built from
# (org.opencontainers.image.revision, "-dirty" when tracked files differ
# from it). Needs mmdebstrap, buildah and objcopy (.ci/install-deps.sh) and
# Debian's archive (deb.debian.org, security.debian.org).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=${CARGO_TARGET_DIR:-$repo/target}
cache=${KPR_IMAGE_CACHE:-/var/cache/kube-proxy-rs-image}
tag=localhost/kube-proxy-rs:dev
bin=
oci=
rootfs_only=0
refresh=0

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    cat <<EOF
Options:
  --bin PATH      put this binary in the image instead of building the release one
  --tag NAME      the image's name (default $tag)
  --oci PATH      the OCI archive to write (default \$CARGO_TARGET_DIR/image/<name>-<tag>.oci.tar)
  --rootfs-only   build (or reuse) the root filesystem tar only, and print its path
  --refresh       build the root filesystem again even if cached
EOF
}

while [ $# -gt 0 ]; do
    case $1 in
        --bin) bin=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --oci) oci=$2; shift 2 ;;
        --rootfs-only) rootfs_only=1; shift ;;
        --refresh) refresh=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "build.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

log() { echo "build.sh: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap and buildah write /var/lib/containers as root)"
for tool in mmdebstrap buildah objcopy sha256sum flock; do
    command -v "$tool" >/dev/null || die "$tool not found: run .ci/install-deps.sh"
done

# The entrypoint is deploy/Dockerfile's: one for both ways of building.
entrypoint=$(sed -n 's/^ENTRYPOINT \(\[.*\]\)$/\1/p' "$repo/deploy/Dockerfile")
[ "$(printf '%s\n' "$entrypoint" | grep -c .)" = 1 ] || die "deploy/Dockerfile: expected one ENTRYPOINT [...], found: $entrypoint"
binary_path=$(printf '%s\n' "$entrypoint" | sed -n 's/^\["\([^"]*\)".*/\1/p')
[ -n "$binary_path" ] || die "deploy/Dockerfile: cannot read the binary's path from ENTRYPOINT $entrypoint"

# --- 1. the root filesystem ------------------------------------------------
packages=$(sed 's/#.*//' "$here/packages" | xargs | tr ' ' ,)
[ -n "$packages" ] || die "deploy/image/packages lists no package"
recipe=(
    --variant=custom
    --format=tar
    # No device nodes: the container runtime makes /dev.
    --skip=output/dev
    # setup.sh removes apt's lists and cache, lock files and all (apt is
    # not installed: nothing needs them).
    --skip=cleanup/apt/lists
    --skip=cleanup/apt/cache
    --include="$packages"
    # /usr merged without the usrmerge package (and the perl it pulls in).
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    # Nothing a daemon reads: documentation but the copyrights, locales,
    # glibc's character set converters.
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*'
    --customize-hook="copy-in $repo/deploy/iptables-wrapper /usr/sbin"
    --customize-hook="copy-in $here/setup.sh /"
    --customize-hook='chroot "$1" sh /setup.sh'
    --customize-hook='rm "$1/setup.sh"'
    bookworm
)
key=$(
    {
        printf '%s\n' "${recipe[@]}" | sed "s|$repo|.|g"
        cat "$here/setup.sh" "$repo/deploy/iptables-wrapper"
    } | sha256sum | cut -c1-16
)
rootfs=$cache/rootfs-$key.tar
mkdir -p "$cache"
exec 8>"$cache/.lock"
flock 8
if [ "$refresh" = 1 ] || [ ! -s "$rootfs" ]; then
    log "root filesystem $key: mmdebstrap bookworm ($packages)"
    start=$SECONDS
    if ! mmdebstrap "${recipe[@]}" "$rootfs.part" >"$cache/mmdebstrap.log" 2>&1; then
        tail -n 40 "$cache/mmdebstrap.log" >&2
        die "mmdebstrap failed; its whole output: $cache/mmdebstrap.log"
    fi
    mv "$rootfs.part" "$rootfs"
    log "root filesystem built in $((SECONDS - start)) s: $rootfs"
    refresh=1
else
    log "root filesystem $key: cached $rootfs"
fi
if [ "$rootfs_only" = 1 ]; then
    echo "$rootfs"
    exit 0
fi

work=$(mktemp -d)
ctr=
cleanup() {
    [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

base=localhost/kube-proxy-rs-base:$key
if [ "$refresh" = 1 ] || ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$rootfs" / >/dev/null
    buildah commit --quiet --rm --format oci "$ctr" "$base" >/dev/null
    ctr=
    log "base image $base"
fi
exec 8>&-

# --- 2. the binary ---------------------------------------------------------
if [ -z "$bin" ]; then
    log "cargo build --release --locked --bin kube-proxy-rs"
    (cd "$repo" && cargo build --release --locked --bin kube-proxy-rs) >&2
    bin=$target/release/kube-proxy-rs
fi
[ -x "$bin" ] || die "no executable binary at $bin"
objcopy --strip-debug "$bin" "$work/kube-proxy-rs"

revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git -C "$repo" diff --quiet HEAD -- 2>/dev/null; then
    revision=$revision-dirty
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/Cargo.toml" | head -n1)

ctr=$(buildah from "$base")
buildah copy --quiet --chmod 0755 "$ctr" "$work/kube-proxy-rs" "$binary_path" >/dev/null
buildah config \
    --entrypoint "$entrypoint" --cmd '' --workingdir / \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label org.opencontainers.image.title=kube-proxy-rs \
    --label org.opencontainers.image.description="kube-proxy-rs on Debian bookworm (deploy/image/packages)" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$revision" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label org.opencontainers.image.base.name="$base" \
    "$ctr"
previous=$(buildah inspect --type image --format '{{.FromImageID}}' "$tag" 2>/dev/null || true)
id=$(buildah commit --quiet --rm --format oci "$ctr" "$tag")
ctr=
# The image this tag named before, now untagged: gone, unless a container uses it.
if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
    buildah rmi "$previous" >/dev/null 2>&1 || true
fi

name=${tag##*/}
: "${oci:=$target/image/${name//:/-}.oci.tar}"
mkdir -p "$(dirname "$oci")"
rm -f "$oci"
buildah push --quiet "$tag" "oci-archive:$oci:$tag" >&2
log "image $tag ($id), revision $revision"
log "OCI archive $oci ($(du -m "$oci" | cut -f1) MB)"
echo "$tag"
