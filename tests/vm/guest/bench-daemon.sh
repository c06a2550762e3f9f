#!/bin/bash
# kpr-bench daemon inside the VM, as /test.sh: the real daemon binary in
# IPVS mode (the host kernel has no IPVS) on a generated cluster. Its
# arguments go to `kpr-bench daemon`; the table goes to /out/daemon.md.
# Run from the host:
#   cargo build --release --bins
#   tests/vm/run-vm-test.sh --mem 3072 --timeout 3600 --outdir target/bench-daemon \
#     --bin target/release/kpr-bench --bin target/release/kube-proxy-rs \
#     tests/vm/guest/bench-daemon.sh -- --mode ipvs --services 1000,10000 --idle 30
# `--then` between argument lists runs `kpr-bench daemon` once per list, in
# order, in one boot; a run that fails does not stop the next. Run N's
# table goes to /out/daemon-N.md and its daemon's log to /out/daemon-N.log
# (all tables also to /out/daemon.md, and with the log's sync phases to the
# console); a list with its own `--binary` runs that daemon. The exit status
# is the first failing run's.
# KPR_DAEMON (--env) replaces the daemon binary, e.g. by a wrapper that runs
# it under `heaptrack -r` (README "Performance", where the memory goes).
set -u
# The daemon raises nf_conntrack_max to its configured floor, which it
# cannot write from the bench's network namespace: set it here first.
modprobe nf_conntrack 2>/dev/null
sysctl -qw net.netfilter.nf_conntrack_max=1048576

# One `kpr-bench daemon` run with the arguments given, in a work directory
# of its own; the daemon's log is kept in /out.
run() {
  local n=$1
  shift
  local work=/tmp/bench-daemon-$n
  mkdir -p "$work"
  echo "== run $n: kpr-bench daemon $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a /out/daemon.md
  local binary=(--binary "${KPR_DAEMON:-/usr/local/bin/kube-proxy-rs}")
  case " $* " in *" --binary "*) binary=() ;; esac
  TMPDIR=$work kpr-bench daemon "${binary[@]}" --keep-log /out/daemon-"$n".log "$@" >/out/daemon-"$n".md
  local rc=$?
  tee -a /out/daemon.md </out/daemon-"$n".md
  # The daemon's start-up and sync phases, on the console as they are known.
  grep -E 'started|sync finished|running in|drift|WARN|ERROR' /out/daemon-"$n".log 2>/dev/null | head -40 | cut -c1-300
  rm -rf "$work"
  echo "kpr-bench daemon run $n: exit $rc" | tee -a /out/daemon.md
  return $rc
}

: >/out/daemon.md
rc=0 n=1 args=()
for a in "$@" --then; do
  if [ "$a" = --then ]; then
    run "$n" "${args[@]}"
    r=$?
    [ $rc -ne 0 ] || rc=$r
    n=$((n + 1)) args=()
  else
    args+=("$a")
  fi
done
echo "kpr-bench daemon: exit $rc"
exit $rc
