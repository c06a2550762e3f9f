#!/usr/bin/env bash
# deploy/demo/quickstart.sh [MODE] [FLAG...] — the demo from a fresh clone,
# in one command, as root on Debian 12 with the Rust toolchain:
#
#   1. .ci/install-deps.sh --demo   the packages the demo needs (none when present)
#   2. cargo build                  the daemon and kpr-demo-backends
#   3. deploy/demo/netns.sh up      the lab's namespaces and backends
#   4. what to try next, printed
#   5. deploy/demo/netns.sh run MODE FLAG...   the daemon, in the foreground
#
# MODE is iptables (the default), nftables or ipvs, as for `netns.sh run`.
# With KPR_DEMO_BIN and KPR_DEMO_BACKENDS_BIN both set, those binaries are
# used and nothing is built. The other KPR_DEMO_* variables of netns.sh
# apply (KPR_DEMO_PREFIX, KPR_DEMO_MANIFESTS, KPR_DEMO_FORWARD_PORT, ...).
# `deploy/demo/netns.sh down` stops everything and deletes the namespaces.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

die() {
  echo "quickstart.sh: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "run it as root"
case ${1:-} in
  '' | -* | iptables | nftables | ipvs) ;;
  *) die "unknown mode '$1': iptables, nftables or ipvs" ;;
esac

# Sourced, so that a cargo under ~/.cargo/bin is on PATH below.
# shellcheck source=../../.ci/install-deps.sh
. .ci/install-deps.sh --demo

if [ -n "${KPR_DEMO_BIN:-}" ] && [ -n "${KPR_DEMO_BACKENDS_BIN:-}" ]; then
  echo "quickstart.sh: KPR_DEMO_BIN and KPR_DEMO_BACKENDS_BIN are set: building nothing"
else
  command -v cargo >/dev/null || die "no cargo on PATH: install the Rust toolchain first (README.md, Quick start)"
  cargo build
fi

deploy/demo/netns.sh up

port=${KPR_DEMO_FORWARD_PORT:-10249}
cat <<EOF

quickstart.sh: the daemon runs below, in the foreground (Ctrl-C stops it).
In another terminal, as root, from $ROOT:
  deploy/demo/netns.sh try web        # ClusterIP 10.96.0.20:80 from the client namespace
  deploy/demo/netns.sh try nodeport   # NodePort 192.168.50.2:30080
  deploy/demo/netns.sh help           # every target: lb, external, dns (UDP), no-endpoints, ...
  deploy/demo/netns.sh forward        # the dashboard on this host: http://127.0.0.1:$port/dashboard
  deploy/demo/netns.sh down           # stops everything, deletes the namespaces
More in docs/demo.md.

EOF

exec deploy/demo/netns.sh run "$@"
