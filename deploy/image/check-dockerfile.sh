#!/usr/bin/env bash
# deploy/image/check-dockerfile.sh: builds deploy/Dockerfile with podman on
# a machine with no registry, and checks that its image holds the same
# files as deploy/image/build.sh's: the packages of deploy/image/packages
# (same versions, and each file they installed but documentation, locales
# and gconv), the iptables alternatives, the binary and the entrypoint.
# A manual check (about 5 minutes the first time), not part of CI.
#
#   deploy/image/check-dockerfile.sh --bin PATH [PODMAN_GLOBAL_OPTION...] [-- PODMAN_RUN_OPTION...]
#   e.g. --bin target/release/kube-proxy-rs --runtime runc -- --ulimit nofile=20000:20000 --ulimit nproc=32768:32768
#
# The Dockerfile's two base images come from Debian's archive instead of a
# registry: debian:bookworm-slim is stood in for by `mmdebstrap
# --variant=apt` (what the official image is made of, less its slimming),
# imported as localhost/debian:bookworm-slim; rust:1-bookworm by that plus
# binutils and a `cargo` that hands over --bin's binary (tagged
# localhost/rust:1-bookworm). Both shadow registry images of those names in
# this machine's podman storage: remove them afterwards (podman rmi) if a
# registry is ever reachable here.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${KPR_IMAGE_CACHE:-/var/cache/kube-proxy-rs-image}
bin=
global=()
run=()
while [ $# -gt 0 ]; do
    case $1 in
        --bin) bin=$(realpath "$2"); shift 2 ;;
        --) shift; run=("$@"); break ;;
        *) global+=("$1"); shift ;;
    esac
done
[ -x "$bin" ] || { echo "check-dockerfile.sh: --bin PATH (a kube-proxy-rs binary) is required" >&2; exit 2; }
podman() { command podman "${global[@]}" "$@"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$cache"
slim=$cache/stand-in-bookworm-slim.tar
if ! podman image exists localhost/debian:bookworm-slim; then
    [ -s "$slim" ] || mmdebstrap --variant=apt --format=tar bookworm "$slim" >"$work/mmdebstrap.log" 2>&1 ||
        { tail -n 20 "$work/mmdebstrap.log" >&2; exit 1; }
    podman import "$slim" localhost/debian:bookworm-slim >/dev/null
fi
cp "$bin" "$work/kube-proxy-rs"
cat >"$work/Containerfile" <<'EOF'
FROM localhost/debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends binutils && rm -rf /var/lib/apt/lists/*
COPY kube-proxy-rs /opt/prebuilt/kube-proxy-rs
RUN printf '#!/bin/sh\nset -e\nmkdir -p target/release\ncp /opt/prebuilt/kube-proxy-rs target/release/\n' >/usr/local/bin/cargo \
    && chmod +x /usr/local/bin/cargo
EOF
podman build "${run[@]}" --network host -q -t localhost/rust:1-bookworm "$work" >/dev/null
podman build "${run[@]}" --network host -q -f "$repo/deploy/Dockerfile" \
    --build-arg REVISION="$(git -C "$repo" rev-parse HEAD)" -t localhost/kube-proxy-rs:dockerfile "$repo" >/dev/null
"$here/build.sh" --bin "$bin" --tag localhost/kube-proxy-rs:check --oci "$work/check.oci.tar" >/dev/null

packages=$(sed 's/#.*//' "$here/packages" | xargs)
for image in localhost/kube-proxy-rs:dockerfile localhost/kube-proxy-rs:check; do
    {
        echo "entrypoint $(podman image inspect --format '{{.Config.Entrypoint}}' "$image")"
        podman run "${run[@]}" --rm --network none --entrypoint sh "$image" -c "
            dpkg-query -W -f '\${Package} \${Version}\n' $packages
            for p in $packages; do
                dpkg -L \$p | while read -r f; do [ -e \"\$f\" ] && [ ! -d \"\$f\" ] && echo \"file \$f\"; done
            done | grep -v -E '/usr/share/(doc|man|locale|info|lintian)/|/gconv/' | sort -u
            for t in iptables ip6tables; do for s in '' -save -restore; do
                echo \"alternative \$t\$s -> \$(readlink -f /usr/sbin/\$t\$s)\"
            done; done
            echo \"binary \$(sha256sum /usr/local/bin/kube-proxy-rs | cut -d' ' -f1)\"
        "
    } >"$work/${image##*:}.txt"
done
if diff -u "$work/dockerfile.txt" "$work/check.txt"; then
    echo "check-dockerfile.sh: the same $(grep -c '^file ' "$work/check.txt") files of $(echo "$packages" | wc -w) packages, alternatives, binary and entrypoint"
else
    echo "check-dockerfile.sh: deploy/Dockerfile's image differs from deploy/image/build.sh's (diff above)" >&2
    exit 1
fi
