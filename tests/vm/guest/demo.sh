#!/bin/bash
# The README demo in IPVS mode, in the VM (a kernel with IPVS):
#   cargo build
#   tests/vm/run-vm-test.sh --bin target/debug/kube-proxy-rs --bin target/debug/kpr-demo-backends \
#       --file deploy/demo --file config tests/vm/guest/demo.sh
# deploy/demo/netns.sh up, `run ipvs` in the background, `try` every target
# `help` lists (web from the node too), the node's IPVS table, `down`.
# Runs as /test.sh inside the VM (bash, root). Exit 0 = PASS.
set -euo pipefail

export KPR_DEMO_BIN=/usr/local/bin/kube-proxy-rs KPR_DEMO_BACKENDS_BIN=/usr/local/bin/kpr-demo-backends
# The guest's CPU is emulated: a backend's handler (bash reading netns.sh)
# takes seconds to answer.
export KPR_DEMO_TIMEOUT=20
S=deploy/demo/netns.sh
STEP=
step() { STEP=$*; echo "==== step $STEP"; }
fail() {
  echo "==== FAIL $STEP: $*"
  [ ! -e /tmp/daemon.log ] || tail -n 40 /tmp/daemon.log
  exit 1
}

step "the demo's files and binaries"
[ -x "$S" ] || fail "no $S here ($PWD): pass --file deploy/demo --file config"
for b in "$KPR_DEMO_BIN" "$KPR_DEMO_BACKENDS_BIN"; do
  [ -x "$b" ] || fail "no $b: pass --bin target/debug/${b##*/}"
done

# netns.sh reads process substitutions, which bash opens as /dev/fd/N.
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd

step "up"
"$S" up || fail "up"

step "run ipvs"
"$S" run ipvs >/tmp/daemon.log 2>&1 &
for i in $(seq 120); do
  if "$S" try web >/dev/null 2>&1; then break; fi
  kill -0 $! 2>/dev/null || fail "the daemon exited"
  [ "$i" -lt 120 ] || fail "web does not answer after 2 minutes"
  sleep 1
done

targets=$("$S" help | sed -n '/^try targets/,$p' | tail -n +2 | while read -r t _; do
  case $t in *:*) ;; *) echo "$t" ;; esac
done)
for t in $targets; do
  step "try $t"
  "$S" try "$t" || fail "try $t"
done
step "try web node"
"$S" try web node || fail "try web node"

step "the node's IPVS table"
ip netns exec kpr-demo ipvsadm -S -n | grep -q -- '-A -t 10.96.0.20:80' || fail "no virtual server for web"
ip netns exec kpr-demo ipvsadm -S -n | head -n 20

step "down"
"$S" down || fail "down"
[ -z "$(ip netns list)" ] || fail "namespaces left: $(ip netns list)"
echo "==== PASS: the demo in IPVS mode, every target answered"
