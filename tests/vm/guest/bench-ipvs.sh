#!/bin/bash
# kpr-bench ipvs inside the VM, as /test.sh (started by tests/vm/bench-ipvs.sh).
# Its arguments go to `kpr-bench ipvs`. Leaves in /out: ipvs.md (the table),
# ipvs.json (the same figures) and guest.txt (the guest and its tools).
set -u
BIN=${KPR_BENCH:-/usr/local/bin/kpr-bench}
{
  echo "kernel $(uname -r); $(nproc) vCPUs; $(awk '/MemTotal/ {printf "%d MB", $2 / 1024}' /proc/meminfo) RAM"
  grep -m1 'model name' /proc/cpuinfo
  ipvsadm --version 2>&1 | head -1
  ipset --version 2>&1 | head -1
  iptables --version 2>&1 | head -1
  ip -V 2>&1 | head -1
} | tee /out/guest.txt
# The bench's progress lines go to the console as they come.
"$BIN" ipvs --json-out /out/ipvs.json "$@" >/out/ipvs.md
rc=$?
cat /out/ipvs.md
echo "kpr-bench ipvs: exit $rc"
exit $rc
