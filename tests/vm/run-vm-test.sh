#!/usr/bin/env bash
# run-vm-test.sh — run a test inside a throw-away VM that boots Debian's cloud
# kernel (IPVS, dummy links, ipset, conntrack, iptables, nf_tables as modules)
# under qemu from an initramfs, and report PASS/FAIL as the exit status.
#
# Why: the host and CI kernels have no IPVS and no dummy link type and cannot
# load modules.  Debian's kernel has both, so we boot it with no disk and no
# NIC: the root filesystem is an initramfs, all test traffic stays inside the
# guest (veth pairs, network namespaces, loopback).
#
# Usage:
#   run-vm-test.sh [options] GUEST_SCRIPT [-- ARGS...]   run a bash script as the test
#   run-vm-test.sh [options] --exec HOST_BINARY [ARGS...]
#       copy HOST_BINARY (and its ldd libraries) in and run it as the test.  All
#       words after it go to the binary verbatim, so this is a cargo runner:
#         CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/tests/vm/run-vm-test.sh --exec" \
#           cargo test --test vm_ipvs
#   run-vm-test.sh --shell                               interactive bash on the console
#
# Options (all before GUEST_SCRIPT / --exec):
#   --bin PATH        host binary to put in the guest's /usr/local/bin (repeatable);
#                     its ldd libraries come too.  Debug info is stripped (see --no-strip).
#   --file SRC[:DST]  copy a host file or directory into the guest (repeatable).
#                     DST defaults to SRC's absolute host path; a relative DST is
#                     relative to the guest's working directory (see below).
#   --env NAME=VALUE  export in the guest (repeatable).  RUST_BACKTRACE, RUST_LOG,
#                     RUST_TEST_THREADS, RUST_TEST_NOCAPTURE, RUST_MIN_STACK are
#                     forwarded from the host when set.  The guest always has VMTEST=1.
#   --outdir DIR      files the test leaves in the guest's /out are copied to host
#                     DIR (a tar written onto a raw virtio disk).
#   --timeout S       kill qemu after S seconds (default 300, or $VMTEST_TIMEOUT).
#   --retries N       boots that end with no result line (hang, panic, timeout) are
#                     retried N times (default 1).  A FAIL is never retried.
#   --log FILE|DIR/   also write the console log to FILE, or to a new file in DIR/.
#                     $VMTEST_LOG does the same.
#   -q, --quiet       don't echo the console; print its tail only when not PASS
#                     ($VMTEST_QUIET=1).  Don't use it as a cargo runner: libtest's
#                     output would be hidden too.
#   --modules "a b"   extra kernel modules to modprobe before the test.
#   --iptables MODE   what plain `iptables*`/`ip6tables*` run: legacy (default) or nft.
#                     iptables-legacy* and iptables-nft* always exist by name.
#   --accel A         tcg | kvm | auto (default auto: KVM only if /dev/kvm is usable,
#                     the CPU shows vmx/svm and it is not the kvm_pvm software kind).
#   --mem MB          guest RAM (default 512, raised for big payloads).  --smp N (default 2).
#   --no-strip        keep debug info in --bin/--exec binaries.
#   --append "ARGS"   extra kernel command-line arguments.
#   --rebuild         rebuild the cached base initramfs now.
#
# Exit status: 0 PASS (guest printed "VMTEST-RESULT: PASS"), 1 FAIL, 2 no result
# line (boot failure, panic, timeout; after the retries), 3 usage or host setup error.
#
# Guest: /bin/sh is bash (busybox's ash would run its own `ip` applet); busybox
# supplies the small tools (httpd, nc, wget, ...); iproute2, ipvsadm, ipset,
# conntrack, nft, iptables (legacy + nft, all extensions) and socat are the host's
# Debian binaries.  The test runs as root in the initial netns, in the guest
# directory named like the host's current directory (empty unless --file put
# something there), with stdin from /dev/null.
#
# Cache: $VMTEST_CACHE, default /var/cache/kube-proxy-rs-vmtest (else
# ~/.cache/kube-proxy-rs-vmtest when that is not writable).  It holds the kernel
# .deb, its unpacked tree, the extracted vmlinux and the base initramfs (rebuilt
# when this script or the host tools change).  Safe to delete.
# Kernel: the dependency of the metapackage linux-image-cloud-amd64 (needs apt
# lists; `apt-get update` is run once when they are missing), or $KERNEL_PKG,
# e.g. KERNEL_PKG=linux-image-6.1.0-56-cloud-amd64.  Never installed on the host.
# $QEMU_CPU overrides -cpu (TCG default qemu64: host binaries must be built for
# baseline x86-64, not target-cpu=native).
# Host packages: see .ci/install-deps.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF=$HERE/$(basename "${BASH_SOURCE[0]}")
ACCEL=auto MEM= SMP=2 TIMEOUT=${VMTEST_TIMEOUT:-300} RETRIES=1 IPT=legacy
OUTDIR= LOG=${VMTEST_LOG:-} QUIET=${VMTEST_QUIET:-0} SHELL_MODE=0 REBUILD=0
APPEND= EXTRA_MODULES= STRIP=1
BINS=() FILES=() ENVS=() TEST= EXEC= TEST_ARGS=()

die() { echo "run-vm-test: $*" >&2; exit 3; }
need_arg() { [ $# -ge 2 ] || die "$1 needs an argument"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --bin) need_arg "$@"; BINS+=("$2"); shift 2 ;;
    --file) need_arg "$@"; FILES+=("$2"); shift 2 ;;
    --env) need_arg "$@"; [[ $2 == [A-Za-z_]*=* ]] || die "--env wants NAME=VALUE"; ENVS+=("$2"); shift 2 ;;
    --outdir) need_arg "$@"; OUTDIR=$2; shift 2 ;;
    --timeout) need_arg "$@"; TIMEOUT=$2; shift 2 ;;
    --retries) need_arg "$@"; RETRIES=$2; shift 2 ;;
    --log) need_arg "$@"; LOG=$2; shift 2 ;;
    -q|--quiet) QUIET=1; shift ;;
    --modules) need_arg "$@"; EXTRA_MODULES="$EXTRA_MODULES $2"; shift 2 ;;
    --iptables) need_arg "$@"; IPT=$2; shift 2 ;;
    --accel) need_arg "$@"; ACCEL=$2; shift 2 ;;
    --mem) need_arg "$@"; MEM=$2; shift 2 ;;
    --smp) need_arg "$@"; SMP=$2; shift 2 ;;
    --no-strip) STRIP=0; shift ;;
    --append) need_arg "$@"; APPEND="$APPEND $2"; shift 2 ;;
    --rebuild) REBUILD=1; shift ;;
    --shell) SHELL_MODE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --exec) need_arg "$@"; EXEC=$2; shift 2; TEST_ARGS=("$@"); break ;;
    --) shift; TEST_ARGS=("$@"); break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$TEST" ] || die "only one guest script (put its arguments after --)"; TEST=$1; shift ;;
  esac
done
if [ -n "$EXEC" ]; then
  [ -z "$TEST" ] || die "give either a guest script or --exec, not both"
  [ -f "$EXEC" ] || die "no such binary: $EXEC"
  BINS+=("$EXEC")
fi
[ "$SHELL_MODE" = 1 ] || [ -n "$TEST$EXEC" ] || die "need a guest script, --exec BINARY or --shell (see --help)"
[ -z "$TEST" ] || [ -f "$TEST" ] || die "no such guest script: $TEST"
case "$IPT" in legacy|nft) ;; *) die "--iptables must be legacy or nft" ;; esac
case "$ACCEL" in auto|tcg|kvm) ;; *) die "--accel must be auto, tcg or kvm" ;; esac
for n in "$TIMEOUT" "$RETRIES" "$SMP" ${MEM:+"$MEM"}; do
  [[ $n =~ ^[0-9]+$ ]] || die "not a number: $n"
done
for t in qemu-system-x86_64 busybox cpio depmod modprobe ldd apt-get dpkg timeout flock; do
  command -v "$t" >/dev/null || die "missing host tool: $t (run .ci/install-deps.sh)"
done
[ -x /bin/busybox ] || die "missing /bin/busybox (package busybox-static)"

# ----------------------------------------------------------------- cache ----
CACHE=${VMTEST_CACHE:-/var/cache/kube-proxy-rs-vmtest}
if [ -z "${VMTEST_CACHE:-}" ] && ! mkdir -p "$CACHE" 2>/dev/null; then
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kube-proxy-rs-vmtest
fi
mkdir -p "$CACHE" || die "cannot create cache directory $CACHE"
# Serialise cache population between concurrent runs (fd 9 is held until the
# cache is ready; the boots themselves may run in parallel).
exec 9>"$CACHE/.lock"
flock 9

# ---------------------------------------------------------------- kernel ----
if [ -z "${KERNEL_PKG:-}" ]; then
  resolve() { { apt-cache depends linux-image-cloud-amd64 2>/dev/null || true; } | awk '/Depends: linux-image-/ {print $2; exit}'; }
  # apt-cache costs ~1 s: reuse the last answer while the apt lists are unchanged.
  RESOLVED=$CACHE/kernel-pkg
  if [ -s "$RESOLVED" ] && [ -z "$(find /var/lib/apt/lists -maxdepth 1 -newer "$RESOLVED" 2>/dev/null | head -1)" ]; then
    KERNEL_PKG=$(cat "$RESOLVED")
  else
    KERNEL_PKG=$(resolve)
  fi
  if [ -z "$KERNEL_PKG" ]; then
    [ "$(id -u)" = 0 ] || die "apt-cache does not know linux-image-cloud-amd64; run 'apt-get update' as root or set KERNEL_PKG"
    echo "run-vm-test: no apt lists, running apt-get update" >&2
    apt-get update -qq >/dev/null 2>&1 || true
    KERNEL_PKG=$(resolve)
  fi
  [ -n "$KERNEL_PKG" ] || die "cannot resolve linux-image-cloud-amd64 (apt lists?); set KERNEL_PKG"
  echo "$KERNEL_PKG" >"$RESOLVED"
fi
KVER=${KERNEL_PKG#linux-image-}
KROOT=$CACHE/kernel/$KVER
MODDIR=$KROOT/lib/modules/$KVER
if [ ! -f "$KROOT/.unpacked" ]; then
  deb=$(ls -t "$CACHE"/debs/"${KERNEL_PKG}"_*.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    echo "run-vm-test: downloading $KERNEL_PKG" >&2
    mkdir -p "$CACHE/debs"
    # As root, apt warns that _apt cannot write to this directory: harmless.
    (cd "$CACHE/debs" && apt-get download -q "$KERNEL_PKG" 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true)
    deb=$(ls -t "$CACHE"/debs/"${KERNEL_PKG}"_*.deb 2>/dev/null | head -1 || true)
    [ -n "$deb" ] || die "apt-get download $KERNEL_PKG failed"
  fi
  echo "run-vm-test: unpacking $(basename "$deb")" >&2
  rm -rf "$KROOT"; mkdir -p "$KROOT"
  dpkg -x "$deb" "$KROOT"
  depmod -b "$KROOT" "$KVER"      # the .deb ships no modules.dep (postinst makes it)
  touch "$KROOT/.unpacked"
fi

# Boot the uncompressed ELF vmlinux through qemu's PVH entry (CONFIG_PVH=y)
# rather than the bzImage: it skips the kernel's self-decompression, slow under
# TCG.  Found like linux/scripts/extract-vmlinux: try each compressor's magic.
extract_vmlinux() {  # IN OUT
  local in=$1 out=$2 pair magic tool off
  for pair in '\x02\x21\x4c\x18|lz4 -dc' '\xfd\x37\x7a\x58\x5a\x00|xz -dc' \
              '\x28\xb5\x2f\xfd|zstd -dc' '\x1f\x8b\x08|gzip -dc'; do
    magic=${pair%%|*} tool=${pair#*|}
    command -v "${tool%% *}" >/dev/null || continue
    for off in $(LC_ALL=C grep -obUaP "$magic" "$in" | cut -d: -f1 | head -5); do
      tail -c +$((off + 1)) "$in" | $tool >"$out.tmp" 2>/dev/null || true
      if [ "$(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
        mv "$out.tmp" "$out"; return 0
      fi
    done
  done
  rm -f "$out.tmp"; return 1
}
KERNEL=$KROOT/vmlinux
if [ ! -s "$KERNEL" ] && ! extract_vmlinux "$KROOT/boot/vmlinuz-$KVER" "$KERNEL"; then
  echo "run-vm-test: could not extract vmlinux, booting the bzImage (slower)" >&2
  KERNEL=$KROOT/boot/vmlinuz-$KVER
fi

# ------------------------------------------------------- base initramfs ----
# Everything that does not depend on the test: busybox, the network tools with
# their libraries, kernel modules, /init.  The per-run payload is a second cpio
# appended to it (the kernel unpacks concatenated archives; later files win).
# Keyed by a hash of this script and of the host packages copied into it.
GUEST_PKGS="busybox-static bash iproute2 ipvsadm ipset conntrack nftables iptables socat libc6"
KEY=$( { cat "$SELF"; dpkg-query -W $GUEST_PKGS 2>/dev/null || true; } | sha256sum | cut -c1-12)
BASE=$CACHE/base-$KVER-$KEY.cpio

# copy_with_libs ROOT FILE [DEST]: copy a host ELF file and its ldd closure.
copy_with_libs() {
  local root=$1 f=$2 dest=${3:-$2} lib
  mkdir -p "$root$(dirname "$dest")"
  cp -L "$f" "$root$dest"
  # ldd prints "libx.so => /path (addr)" or "/lib64/ld-linux... (addr)";
  # static binaries print "not a dynamic executable"/"statically linked".
  for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$root$lib" ] && continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}

build_base() {
  local R a b m name x sel
  R=$(mktemp -d "$CACHE/base.XXXXXX")
  echo "run-vm-test: building the base initramfs for $KVER" >&2
  mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,usr/local/sbin,lib,lib64,proc,sys,dev,run,tmp,etc,root,out,srv,var}
  ln -s /run "$R/var/run"

  # busybox-static: all small tools, incl. modprobe (for the kernel's on-demand
  # module loading), httpd, nc, wget.
  cp /bin/busybox "$R/bin/busybox"
  for a in $(/bin/busybox --list-full); do
    [ -e "$R/$a" ] || ln -s /bin/busybox "$R/$a"
  done
  # /bin/sh is bash, NOT busybox: Debian's busybox-static ash prefers its own
  # applets (e.g. its tiny `ip`) even when a real binary comes first in PATH.
  rm -f "$R/bin/sh" "$R/bin/bash"
  copy_with_libs "$R" /bin/bash /bin/bash
  ln -s bash "$R/bin/sh"
  # The real iproute2 (busybox's ip knows no netns/veth/dummy).
  for b in ip tc ss bridge genl; do
    rm -f "$R/bin/$b" "$R/sbin/$b" "$R/usr/bin/$b" "$R/usr/sbin/$b"
    if [ -x "/usr/bin/$b" ]; then copy_with_libs "$R" "/usr/bin/$b"
    elif [ -x "/usr/sbin/$b" ]; then copy_with_libs "$R" "/usr/sbin/$b"
    else echo "run-vm-test: warning: $b not installed on the host, skipped" >&2; fi
  done
  for b in ipvsadm ipset conntrack nft xtables-legacy-multi xtables-nft-multi socat; do
    x=$(command -v "$b" || true)
    [ -z "$x" ] && [ -x "/usr/sbin/$b" ] && x=/usr/sbin/$b
    if [ -n "$x" ]; then copy_with_libs "$R" "$x" "/usr/sbin/$b"
    else echo "run-vm-test: warning: $b not installed on the host, skipped" >&2; fi
  done
  # iptables dlopen()s its match/target extensions: copy them all, with the
  # libraries they need themselves (ldd of the binary does not show them).
  x=/usr/lib/x86_64-linux-gnu/xtables
  if [ -d "$x" ]; then
    mkdir -p "$R$x"; cp -a "$x/." "$R$x/"
    for b in "$x"/*.so; do copy_with_libs "$R" "$b"; done
  fi
  # The names Debian's iptables package has (multi-call binaries look at argv[0]).
  for b in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf xtables-legacy-multi "$R/usr/sbin/${b/tables/tables-legacy}"
    ln -sf xtables-nft-multi "$R/usr/sbin/${b/tables/tables-nft}"
  done
  for b in xtables-monitor iptables-translate ip6tables-translate iptables-restore-translate; do
    ln -sf xtables-nft-multi "$R/usr/sbin/$b"
  done
  cp /etc/protocols /etc/services "$R/etc/" 2>/dev/null || true
  [ -d /etc/iproute2 ] && cp -a /etc/iproute2 "$R/etc/" || true
  [ -d /usr/share/iproute2 ] && mkdir -p "$R/usr/share" && cp -a /usr/share/iproute2 "$R/usr/share/" || true
  echo 'root:x:0:0:root:/root:/bin/sh' >"$R/etc/passwd"
  echo 'root:x:0:' >"$R/etc/group"
  echo 'hosts: files' >"$R/etc/nsswitch.conf"
  printf '127.0.0.1 localhost\n::1 localhost ip6-localhost\n' >"$R/etc/hosts"

  # Kernel modules: the netfilter/IPVS/ipset/bridge/sched trees and a few
  # drivers, with their dependency closure *including softdeps* (asked from
  # the host's kmod against the unpacked tree), then depmod, so that busybox
  # modprobe works in the guest, also for the kernel's own request_module()
  # (e.g. `ipset create ... hash:ip,port,ip`, `iptables -m set`, nft chains).
  sel=$(mktemp)
  (cd "$MODDIR" && find kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter \
      kernel/net/bridge kernel/net/sched -name '*.ko*' 2>/dev/null) >"$sel"
  for m in dummy veth macvlan ipvlan vxlan tun nf_conntrack_netlink virtio_pci virtio_blk overlay; do
    (cd "$MODDIR" && find kernel -name "$m.ko*") >>"$sel"
  done
  for name in $(sed 's|.*/||; s|\.ko.*||' "$sel" | sort -u); do
    modprobe -d "$KROOT" -S "$KVER" --show-depends --ignore-install "$name" 2>/dev/null || true
  done | awk '$1 == "insmod" {print $2}' | sed "s|^.*/lib/modules/$KVER/||" | cat - "$sel" | sort -u >"$sel.all"
  local dst=$R/lib/modules/$KVER
  mkdir -p "$dst"
  (cd "$MODDIR" && cpio -pdm --quiet "$dst" <"$sel.all")
  cp "$MODDIR"/modules.order "$MODDIR"/modules.builtin "$MODDIR"/modules.builtin.modinfo "$dst/" 2>/dev/null || true
  # busybox modprobe may not read compressed modules (Debian 6.1's are plain).
  find "$dst" -name '*.ko.xz' -exec xz -d {} + 2>/dev/null || true
  find "$dst" -name '*.ko.zst' -exec zstd -q -d --rm {} + 2>/dev/null || true
  depmod -b "$R" "$KVER"
  rm -f "$sel" "$sel.all"

  mkdir -p "$R/etc/vmtest" "$R/etc/modprobe.d"
  # No stray dummy0: tests create the dummy links they want (kube-ipvs0).
  echo "options dummy numdummies=0" >"$R/etc/modprobe.d/vmtest.conf"
  # The modules kube-proxy's IPVS proxier checks for, plus dummy and veth.
  echo "ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack dummy veth" >"$R/etc/vmtest/modules"
  cat >"$R/init" <<'EOF'
#!/bin/bash
# vmtest /init (PID 1): mount pseudo filesystems, load modules, run /test.sh,
# print "VMTEST-RESULT: PASS|FAIL", power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=${TERM:-vt100}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=0755 tmpfs /run
chmod 1777 /tmp    # stays on the rootfs: --file may have put things there
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mkdir -p /run/netns /out
hostname vmtest
echo /sbin/modprobe >/proc/sys/kernel/modprobe
ip link set lo up

SHELL_MODE=0 OUTDISK=0
MODS=$(cat /etc/vmtest/modules /etc/vmtest/modules-extra 2>/dev/null)
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vmtest.shell=1) SHELL_MODE=1 ;;
    vmtest.outdisk=1) OUTDISK=1 ;;
  esac
done
for m in $MODS; do modprobe "$m" || echo "vmtest: modprobe $m FAILED"; done

if [ "$SHELL_MODE" = 1 ]; then
  echo "vmtest: interactive shell; leave with 'poweroff -f'"
  setsid cttyhack /bin/bash -l    # full path: a bare "sh" would be busybox ash
else
  ARGS=(); [ -f /etc/vmtest/args ] && mapfile -d '' -t ARGS </etc/vmtest/args
  export VMTEST=1
  [ -f /etc/vmtest/env ] && . /etc/vmtest/env
  CWD=$(cat /etc/vmtest/cwd 2>/dev/null || echo /)
  mkdir -p "$CWD"; cd "$CWD"
  echo "vmtest: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime)s, running the test"
  /test.sh "${ARGS[@]}" </dev/null
  rc=$?
  cd /
  echo "vmtest: test finished at uptime $(cut -d' ' -f1 /proc/uptime)s"
  if [ "$OUTDISK" = 1 ]; then
    # /out goes back to the host as a plain tar written onto the raw virtio disk
    modprobe virtio_pci; modprobe virtio_blk
    for i in $(seq 50); do [ -b /dev/vda ] && break; sleep 0.1; done
    tar -C /out -cf /dev/vda . && sync || echo "vmtest: writing /out to /dev/vda FAILED"
  fi
  if [ $rc -eq 0 ]; then echo "VMTEST-RESULT: PASS"; else echo "VMTEST-RESULT: FAIL rc=$rc"; fi
fi
sync
poweroff -f
echo o >/proc/sysrq-trigger    # fallback: sysrq power-off
sleep 10
EOF
  chmod 755 "$R/init"

  # Uncompressed on purpose: under TCG the kernel's gunzip costs more than
  # qemu reading ~30 MB from the page cache.
  (cd "$R" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >"$BASE.tmp"
  mv "$BASE.tmp" "$BASE"
  rm -rf "$R"
  # Bases of older versions of this script are no longer needed.
  find "$CACHE" -maxdepth 1 -name 'base-*.cpio' ! -name "$(basename "$BASE")" -delete
}

if [ "$REBUILD" = 1 ] || [ ! -s "$BASE" ]; then build_base; fi
flock -u 9

# ------------------------------------------------------------- payload ----
P=$(mktemp -d "${TMPDIR:-/tmp}/vmtest.XXXXXX")
cleanup() {   # on Ctrl-C / TERM: stop our qemu (by its pid file), drop the payload
  [ ! -s "$P/qemu.pid" ] || kill "$(cat "$P/qemu.pid")" 2>/dev/null || true
  rm -rf "$P"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
R=$P/root
mkdir -p "$R/etc/vmtest" "$R/usr/local/bin" "$R/usr/sbin"
if [ -n "$TEST" ]; then
  cp "$TEST" "$R/test.sh"
elif [ -n "$EXEC" ]; then
  printf '#!/bin/bash\nexec /usr/local/bin/%q "$@"\n' "$(basename "$EXEC")" >"$R/test.sh"
fi
[ ! -f "$R/test.sh" ] || chmod 755 "$R/test.sh"
for b in "${BINS[@]}"; do
  [ -f "$b" ] || die "no such binary: $b"
  copy_with_libs "$R" "$b" "/usr/local/bin/$(basename "$b")"
  if [ "$STRIP" = 1 ] && command -v strip >/dev/null; then
    strip --strip-debug "$R/usr/local/bin/$(basename "$b")" 2>/dev/null || true
  fi
done
GCWD=$PWD
for f in "${FILES[@]}"; do
  src=${f%%:*}
  if [ "$src" = "$f" ]; then dst=$(realpath -m "$src"); else dst=${f#*:}; fi
  case "$dst" in /*) ;; *) dst=$GCWD/$dst ;; esac
  [ -e "$src" ] || die "no such file: $src"
  if [ -d "$src" ]; then mkdir -p "$R$dst"; cp -a "$src/." "$R$dst/"
  else mkdir -p "$R$(dirname "$dst")"; cp -a "$src" "$R$dst"; fi
done
for b in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -s "${b/tables/tables-$IPT}" "$R/usr/sbin/$b"
done
echo "$EXTRA_MODULES" >"$R/etc/vmtest/modules-extra"
echo "$GCWD" >"$R/etc/vmtest/cwd"
[ ${#TEST_ARGS[@]} -eq 0 ] || printf '%s\0' "${TEST_ARGS[@]}" >"$R/etc/vmtest/args"  # NUL-separated
for v in RUST_BACKTRACE RUST_LOG RUST_TEST_THREADS RUST_TEST_NOCAPTURE RUST_MIN_STACK; do
  [ -z "${!v:-}" ] || ENVS=("$v=${!v}" "${ENVS[@]}")
done
for e in "${ENVS[@]}"; do printf 'export %s=%q\n' "${e%%=*}" "${e#*=}"; done >"$R/etc/vmtest/env"
INITRD=$P/initrd.img
cp "$BASE" "$INITRD"
(cd "$R" && find . -print0 | cpio --null -o -H newc -R 0:0 --quiet) >>"$INITRD"
# The initramfs lives in guest RAM (archive + unpacked copy): grow RAM with it.
if [ -z "$MEM" ]; then
  MEM=$(( $(stat -c %s "$INITRD") / 1048576 * 2 + 384 ))
  [ "$MEM" -ge 512 ] || MEM=512
fi

# ---------------------------------------------------------------- boot ----
if [ "$ACCEL" = auto ]; then
  # KVM only with real hardware virtualisation.  Some sandboxes expose a
  # /dev/kvm that is kvm_pvm (software PVM): an unmodified kernel crawls under
  # it and dies with "KVM internal error", so TCG is faster there.
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo \
     && [ ! -d /sys/module/kvm_pvm ]; then ACCEL=kvm; else ACCEL=tcg; fi
fi
if [ -n "${QEMU_CPU:-}" ]; then CPU=$QEMU_CPU
elif [ "$ACCEL" = kvm ]; then CPU=host
else CPU=qemu64; fi   # TCG: qemu64 boots ~25% faster than max
# panic=-1 with -no-reboot: a guest panic ends qemu at once.
CMDLINE="console=ttyS0 quiet panic=-1 mitigations=off cryptomgr.notests$APPEND"
QEMU=(qemu-system-x86_64 -accel "$ACCEL" -cpu "$CPU" -m "$MEM" -smp "$SMP"
      -nodefaults -no-user-config -display none -no-reboot
      -serial stdio -kernel "$KERNEL" -initrd "$INITRD")
if [ -n "$OUTDIR" ]; then
  QEMU+=(-drive "file=$P/out.img,format=raw,if=virtio,cache=unsafe")
  CMDLINE="$CMDLINE vmtest.outdisk=1"
fi
[ "$SHELL_MODE" = 1 ] && CMDLINE="$CMDLINE vmtest.shell=1"
QEMU+=(-append "$CMDLINE")

echo "run-vm-test: kernel $KVER, accel $ACCEL, ${MEM} MB, initrd $(du -h "$INITRD" | cut -f1)" >&2
if [ "$SHELL_MODE" = 1 ]; then "${QEMU[@]}"; exit 0; fi

OUT=$P/console.log
if [ -n "$LOG" ] && { [ -d "$LOG" ] || [[ $LOG == */ ]]; }; then
  mkdir -p "$LOG"
  LOG=$LOG/$(basename "${TEST:-$EXEC}")-$(date +%Y%m%d-%H%M%S)-$$.log
fi

boot_once() {  # -> 0 PASS, 1 FAIL, 2 no result
  local start secs qrc line
  rm -f "$P/out.img" "$P/qemu.pid" "$P/qemu.rc"
  [ -z "$OUTDIR" ] || truncate -s 512M "$P/out.img"   # sparse; the guest writes a tar onto it
  start=$(date +%s%N)
  set +e
  # The loop strips the console's CRs, echoes it live unless --quiet, and kills
  # qemu on a KVM internal error (qemu would otherwise sit paused).  It runs in
  # the background so that `wait` returns at once when we get INT/TERM (the
  # trap then kills qemu); a foreground pipeline would defer the trap.
  ( timeout --foreground -k 5 "$TIMEOUT" "${QEMU[@]}" -pidfile "$P/qemu.pid" </dev/null 2>&1
    echo $? >"$P/qemu.rc" ) |
    while IFS= read -r line || [ -n "$line" ]; do
      line=${line%$'\r'}
      printf '%s\n' "$line" >>"$OUT"
      # (the kernel's own "reboot: Power down" is noise: kept in the log only)
      [ "$QUIET" = 1 ] || [[ $line == "["*"] reboot: Power down" ]] || printf '%s\n' "$line"
      case "$line" in *"KVM internal error"*)
        sleep 1; kill "$(cat "$P/qemu.pid" 2>/dev/null)" 2>/dev/null ;; esac
    done &
  wait $!
  qrc=$(cat "$P/qemu.rc" 2>/dev/null || echo '?')
  set -e
  rm -f "$P/qemu.pid"
  secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN {printf "%.1f", (b-a)/1e9}')
  if [ -n "$LOG" ]; then mkdir -p "$(dirname "$LOG")"; cp "$OUT" "$LOG"; fi
  if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    tar -C "$OUTDIR" -xf "$P/out.img" 2>/dev/null || echo "run-vm-test: no /out archive from the guest" >&2
  fi
  if grep -q '^VMTEST-RESULT: PASS' "$OUT"; then
    echo "run-vm-test: PASS (${secs}s in qemu, accel $ACCEL)" >&2; return 0
  fi
  [ "$QUIET" = 0 ] || tail -n 40 "$OUT" >&2
  if grep -q '^VMTEST-RESULT: FAIL' "$OUT"; then
    echo "run-vm-test: FAIL: $(grep -m1 '^VMTEST-RESULT: FAIL' "$OUT" | cut -d' ' -f3-) (${secs}s in qemu, accel $ACCEL)" >&2
    return 1
  fi
  echo "run-vm-test: NO RESULT (qemu rc=$qrc, ${secs}s in qemu, timeout ${TIMEOUT}s)" >&2
  return 2
}
# A boot with no result line at all (seen about once in 150 TCG boots: a hang
# before /init) is retried; a FAIL never is.
attempt=0
while :; do
  : >"$OUT"
  rc=0; boot_once || rc=$?
  [ "$rc" = 2 ] && [ "$attempt" -lt "$RETRIES" ] || exit "$rc"
  attempt=$((attempt + 1)); echo "run-vm-test: retrying ($attempt/$RETRIES)" >&2
done
