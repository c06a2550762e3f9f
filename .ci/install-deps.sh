#!/usr/bin/env bash
# .ci/install-deps.sh — install what kube-proxy-rs's tests need on a fresh
# Debian bookworm machine (run as root).  Idempotent: when every package is
# already installed it does no apt work at all.
#
#   bash .ci/install-deps.sh      install; prints the PATH line for cargo if needed
#   . .ci/install-deps.sh         same, and also puts cargo on the caller's PATH
#   bash .ci/install-deps.sh --demo   only what the README's demo needs
#                                 (deploy/demo/netns.sh: no qemu, no chromium)
#
# The VM harness (tests/vm/run-vm-test.sh) needs qemu + the network tools that
# it copies into the guest's initramfs; the guest kernel itself is fetched by
# the harness with `apt-get download` (never installed on the host).
# tests/dashboard.rs drives Debian's headless chromium through chromedriver.
# tests/image.rs builds the container image with mmdebstrap and buildah and
# runs it with podman.
# Set INSTALL_DEPS_VERBOSE=1 to see apt's output.

_kprs_install_deps() (
  set -euo pipefail
  demo=(iproute2 iptables nftables ipset conntrack socat procps kmod curl)
  pkgs=(
    qemu-system-x86     # qemu-system-x86_64 (TCG; KVM where real VT-x/AMD-V exists)
    busybox-static      # guest userland (sh applets, httpd, nc, wget, modprobe, ...)
    bash                # guest /bin/sh
    iproute2            # ip, ss, genl, tc, bridge (host-side copies go into the guest)
    ipvsadm ipset conntrack nftables iptables socat
    kmod                # depmod / modprobe --show-depends against the guest kernel tree
    cpio lz4 xz-utils zstd gzip   # initramfs + extracting vmlinux from the bzImage
    coreutils util-linux tar grep libc-bin dpkg apt   # timeout, flock, ldd, dpkg -x ...
    procps              # sysctl, kill (deploy/demo/netns.sh and the tests that stop the daemon)
    curl                # the demo's documented metrics request (tests/docs.rs runs it)
    binutils            # strip --strip-debug for binaries copied into the guest
    gcc make libc6-dev  # the linker, and jemalloc's build (tikv-jemalloc-sys runs configure + make)
    chromium chromium-driver   # headless browser + WebDriver for tests/dashboard.rs
    # The container image (deploy/image/build.sh) and tests/image.rs: a root
    # filesystem from Debian's packages, the image, rootful podman running
    # it (runc where crun refuses the host's cgroups), its OCI archive read back.
    mmdebstrap buildah podman crun runc skopeo
  )
  if [ "${1:-}" = --demo ]; then pkgs=("${demo[@]}"); fi
  missing=()
  for p in "${pkgs[@]}"; do
    [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" = "ii " ] || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#pkgs[@]} packages present"
    exit 0
  fi
  [ "$(id -u)" = 0 ] || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  echo "install-deps: installing ${missing[*]}"
  log=$(mktemp /tmp/install-deps.XXXXXX.log)
  quiet() {
    if [ "${INSTALL_DEPS_VERBOSE:-0}" = 1 ]; then "$@"; return; fi
    "$@" >>"$log" 2>&1 || { rc=$?; echo "install-deps: '$*' failed (rc=$rc):" >&2; tail -n 30 "$log" >&2; return $rc; }
  }
  export DEBIAN_FRONTEND=noninteractive
  # A failing third-party source makes `apt-get update` exit non-zero even
  # though Debian's lists were refreshed: go on, the install below is the judge.
  quiet apt-get update -q || echo "install-deps: apt-get update reported errors, trying anyway" >&2
  quiet apt-get install -y -q --no-install-recommends "${missing[@]}"
  rm -f "$log"
  echo "install-deps: done"
)

_kprs_install_deps "$@"
_kprs_rc=$?
if [ $_kprs_rc -eq 0 ] && ! command -v cargo >/dev/null 2>&1; then
  if [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    # Executed rather than sourced: the caller's PATH cannot be changed from here.
    if [ "${BASH_SOURCE[0]}" = "$0" ]; then
      echo "install-deps: cargo is not on PATH; run: export PATH=\"${CARGO_HOME:-$HOME/.cargo}/bin:\$PATH\""
      [ -z "${GITHUB_PATH:-}" ] || echo "${CARGO_HOME:-$HOME/.cargo}/bin" >>"$GITHUB_PATH"
    fi
  else
    echo "install-deps: warning: no cargo found (expected ${CARGO_HOME:-$HOME/.cargo}/bin/cargo)" >&2
  fi
fi
if [ "${BASH_SOURCE[0]}" = "$0" ]; then exit $_kprs_rc; else unset -f _kprs_install_deps; return $_kprs_rc; fi
