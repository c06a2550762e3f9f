#!/usr/bin/env bash
# bench-ipvs.sh — `kpr-bench ipvs` (IPVS mode end to end on a real kernel) in
# the qemu VM: builds the release kpr-bench, boots the VM with it (holding
# /tmp/kpr-vm.lock, so only one VM runs at a time), runs
# tests/vm/guest/bench-ipvs.sh there and prints the table. A benchmark, not a
# test: it is not part of `cargo test`.
#
# Usage: tests/vm/bench-ipvs.sh [--mem MB] [--smp N] [--timeout S] [--out DIR] [-- KPR_BENCH_IPVS_ARGS...]
#   tests/vm/bench-ipvs.sh                                  N = 1,000 and 10,000, 500 changes each
#   tests/vm/bench-ipvs.sh -- --services 100 --changes 50   smoke run (about a minute)
#
# Defaults: --mem 3072 (N = 10,000 needs about 1 GB in the guest), --smp 2,
# --timeout 7200, --out target/bench-ipvs. DIR receives ipvs.md (the table),
# ipvs.json, guest.txt (guest kernel and tool versions), host.txt and
# console.log. The VM is TCG-emulated: compare ratios, not absolute times.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MEM=3072 SMP=2 TIMEOUT=7200 OUT=$ROOT/target/bench-ipvs
while [ $# -gt 0 ]; do
  case "$1" in
    --mem) MEM=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "bench-ipvs: unknown option $1 (see --help)" >&2; exit 3 ;;
  esac
done
cd "$ROOT"
cargo build --release --locked --features testkit --bin kpr-bench
TARGET=${CARGO_TARGET_DIR:-target}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
mkdir -p "$OUT"
rm -f "$OUT/ipvs.md" "$OUT/ipvs.json"
{
  echo "host: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(free -g | awk '/Mem:/ {print $2}') GiB, Linux $(uname -r)"
  echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "guest: --mem $MEM --smp $SMP; kpr-bench ipvs $*"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+ local changes)')"
} | tee "$OUT/host.txt"
rc=0
flock /tmp/kpr-vm.lock "$ROOT/tests/vm/run-vm-test.sh" --timeout "$TIMEOUT" --mem "$MEM" --smp "$SMP" \
  --bin "$TARGET/release/kpr-bench" --outdir "$OUT" --log "$OUT/console.log" \
  "$ROOT/tests/vm/guest/bench-ipvs.sh" -- "$@" || rc=$?
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/host.txt"
if [ -s "$OUT/ipvs.md" ]; then
  echo "bench-ipvs: results in $OUT (ipvs.md, ipvs.json, console.log)"
else
  echo "bench-ipvs: no results (exit $rc); see $OUT/console.log" >&2
fi
exit "$rc"
