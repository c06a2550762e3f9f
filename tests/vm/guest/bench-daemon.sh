#!/bin/bash
# kpr-bench daemon inside the VM, as /test.sh: the real daemon binary in
# IPVS mode (the host kernel has no IPVS) on a generated cluster. Its
# arguments go to `kpr-bench daemon`; the table goes to /out/daemon.md.
# Run from the host:
#   cargo build --release --bins
#   tests/vm/run-vm-test.sh --mem 3072 --timeout 3600 --outdir target/bench-daemon \
#     --bin target/release/kpr-bench --bin target/release/kube-proxy-rs \
#     tests/vm/guest/bench-daemon.sh -- --mode ipvs --services 1000,10000 --idle 30
# KPR_DAEMON (--env) replaces the daemon binary, e.g. by a wrapper that runs
# it under `heaptrack -r` (README "Performance", where the memory goes).
set -u
# The daemon raises nf_conntrack_max to its configured floor, which it
# cannot write from the bench's network namespace: set it here first.
modprobe nf_conntrack 2>/dev/null
sysctl -qw net.netfilter.nf_conntrack_max=1048576
kpr-bench daemon --binary "${KPR_DAEMON:-/usr/local/bin/kube-proxy-rs}" "$@" >/out/daemon.md
rc=$?
cat /out/daemon.md
echo "kpr-bench daemon: exit $rc"
exit $rc
