#!/usr/bin/env bash
# deploy/demo/netns.sh — the README demo: kube-proxy-rs in iptables mode on
# the embedded demo cluster (config/demo.yaml, config/demo/) on a node made
# of network namespaces. Everything it creates lives in those namespaces: the
# host's own rules, routes, links and sysctls are never touched.
#
#   sudo deploy/demo/netns.sh up                  create the namespaces, start the backends
#   sudo deploy/demo/netns.sh run [FLAG...]       run the daemon in the node namespace (foreground)
#   sudo deploy/demo/netns.sh try TARGET [FROM]   one request to a service, print the answer
#   sudo deploy/demo/netns.sh forward [PORT]      serve the node's metrics/dashboard on the host's 127.0.0.1:PORT
#   sudo deploy/demo/netns.sh down                stop every process in the namespaces, delete them
#        deploy/demo/netns.sh list                the backends: pod IP, node, pod name, ports
#
# The lab (P is $KPR_DEMO_PREFIX, default kpr-demo):
#
#   P-client (the LAN and a client)          P (demo-node: the daemon runs here)
#     br0 192.168.50.10/24 ──veth── eth0 192.168.50.2/24
#     10.96.0.0/12, 192.168.60.0/24           cbr0 10.244.0.1/24 ──veth── P-10.244.0.N (pods on demo-node)
#       via 192.168.50.2                      10.244.1.0/24 via 192.168.50.3, default via 192.168.50.10
#                          ──veth── P-other (other-node; no proxy)
#                                     eth0 192.168.50.3/24
#                                     cbr0 10.244.1.1/24 ──veth── P-10.244.1.N (pods on other-node)
#
# Every endpoint address of config/demo's EndpointSlices is a pod namespace
# running socat on its ports (TCP; UDP too for DNS) that answers with its pod
# name, address, node and the client address it saw, e.g.
#   web-5d8f7c9b6-a1b2c 10.244.0.11:8080/tcp on demo-node, client 10.244.0.1:40312
# HTTP requests get an HTTP/1.0 answer, anything else that one line.
#
# TARGET is a name (see `usage`) or [udp:|tcp:]IP:PORT (default: an HTTP GET);
# FROM is `client` (default) or `node`.
#
# Environment:
#   KPR_DEMO_PREFIX   namespace names (default kpr-demo); tests use their own
#   KPR_DEMO_BIN      the daemon (default ${CARGO_TARGET_DIR:-target}/debug/kube-proxy-rs)
#   KPR_DEMO_TIMEOUT  seconds `try` waits for an answer (default 3)
#
# Needs root, bash, iproute2 (ip, ss), socat, util-linux (setsid), procps
# (sysctl), coreutils and, for the daemon, iptables: all in
# .ci/install-deps.sh.
set -eu
set -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SELF="$ROOT/deploy/demo/$(basename "$0")"
P=${KPR_DEMO_PREFIX:-kpr-demo}
BIN=${KPR_DEMO_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/debug/kube-proxy-rs}
TIMEOUT=${KPR_DEMO_TIMEOUT:-3}
NODE_NS=$P
CLIENT_NS=$P-client
OTHER_NS=$P-other

# Every endpoint address of config/demo's EndpointSlices (tests/demo.rs
# checks this table against the manifests): address, node, pod, ports.
# Pod names come from the slices' targetRef where they have one.
BACKENDS='
10.244.0.5  demo-node  coredns-76f75df574-x7k2m     tcp:53 udp:53
10.244.0.11 demo-node  web-5d8f7c9b6-a1b2c          tcp:8080
10.244.0.12 demo-node  web-5d8f7c9b6-d3e4f          tcp:8080
10.244.0.13 demo-node  web-lb-7f6b9c8d4-h7j8k       tcp:8080
10.244.0.14 demo-node  web-external-5c4d8f6b7-x2y3z tcp:8080
10.244.0.15 demo-node  sticky-6d9c7b5f8-s1t2u       tcp:8080
10.244.0.16 demo-node  local-only-8b7c6d5f4-l1m2n   tcp:8080
10.244.0.17 demo-node  headless-7c5b9d8f6-p1q2r     tcp:8080
10.244.0.23 demo-node  web-lb-7f6b9c8d4-t9u8v       tcp:8080
10.244.0.31 demo-node  web-nodeport-9d8c7b6f5-n3p4q tcp:8080
10.244.1.5  other-node coredns-76f75df574-q9p4r     tcp:53 udp:53
10.244.1.21 other-node web-5d8f7c9b6-g5h6i          tcp:8080
10.244.1.23 other-node web-lb-7f6b9c8d4-w5x6y       tcp:8080
10.244.1.25 other-node sticky-6d9c7b5f8-v3w4x       tcp:8080
10.244.1.26 other-node local-only-8b7c6d5f4-o3p4q   tcp:8080
10.244.1.31 other-node web-nodeport-9d8c7b6f5-r5s6t tcp:8080
'

usage() {
  cat <<EOF
usage: $0 up|run [FLAG...]|try TARGET [client|node]|forward [PORT]|down|list

try targets (as in config/demo/):
  web           http 10.96.0.20:80      ClusterIP: 2 pods on demo-node, 1 on other-node
  sticky        http 10.96.0.60:8080    ClusterIP, sessionAffinity ClientIP
  local-only    http 10.96.0.70:80      ClusterIP, internalTrafficPolicy Local
  no-endpoints  http 10.96.0.80:80      no endpoints: rejected
  web-nodeport  http 10.96.0.30:80      ClusterIP of the NodePort service
  nodeport      http 192.168.50.2:30080 its NodePort
  lb            http 192.168.60.10:80   LoadBalancer IP (externalTrafficPolicy Local)
  lb-nodeport   http 192.168.50.2:31080 its NodePort
  external      http 192.168.60.20:80   externalIP of web-external
  dns           udp  10.96.0.10:53      kube-dns (not real DNS: any datagram gets the line)
  dns-tcp       tcp  10.96.0.10:53
  [udp:|tcp:]IP:PORT
EOF
}

die() {
  echo "netns.sh: $*" >&2
  exit 1
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (sudo $0 ${1:-})"
  for t in ip ss socat setsid sysctl timeout; do
    command -v "$t" >/dev/null || die "'$t' not found (bash .ci/install-deps.sh installs it)"
  done
}

check_prefix() {
  case $P in
    '' | *[!A-Za-z0-9_.-]* | -*) die "KPR_DEMO_PREFIX '$P': use letters, digits, '.', '_' and '-'" ;;
  esac
}

# backends: the table without blank lines.
backends() {
  printf '%s\n' "$BACKENDS" | grep -v '^$'
}

pod_ns() {
  echo "$P-$1"
}

# Every namespace of the lab, pods first (down deletes in this order).
all_ns() {
  backends | while read -r ip _; do pod_ns "$ip"; done
  echo "$OTHER_NS"
  echo "$CLIENT_NS"
  echo "$NODE_NS"
}

ns_exists() {
  [ -e "/run/netns/$1" ]
}

in_ns() {
  local ns=$1
  shift
  ip netns exec "$ns" "$@"
}

# --- up ---------------------------------------------------------------------

# Whether every namespace exists and every backend still has its listeners.
complete() {
  local ns ip ports n
  while read -r ns; do ns_exists "$ns" || return 1; done < <(all_ns)
  while read -r ip _ _ ports; do
    n=$(ip netns pids "$(pod_ns "$ip")" | wc -l)
    # shellcheck disable=SC2086 # ports is a word list
    set -- $ports
    [ "$n" -ge $# ] || return 1
  done < <(backends)
}

new_ns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
}

start_server() { # ns pod ip node proto port
  local ns=$1 pod=$2 ip=$3 node=$4 proto=$5 port=$6 listen
  case $proto in
    tcp) listen="TCP-LISTEN:$port,fork,reuseaddr" ;;
    udp) listen="UDP-RECVFROM:$port,fork" ;;
    *) die "bad protocol $proto" ;;
  esac
  # socat runs the handler (this script's `serve`) per connection or
  # datagram; the variables reach it through the environment.
  # shellcheck disable=SC2016 # expanded by socat's shell, not here
  KPR_DEMO_POD=$pod KPR_DEMO_ADDR=$ip:$port/$proto KPR_DEMO_NODE=$node KPR_DEMO_SELF=$SELF \
    setsid ip netns exec "$ns" socat "$listen" 'SYSTEM:exec "$KPR_DEMO_SELF" serve' \
    </dev/null >/dev/null 2>&1 &
}

wait_listening() { # ns proto port
  local flag=-Hltn i
  [ "$2" = udp ] && flag=-Hlun
  for i in $(seq 50); do
    [ -z "$(in_ns "$1" ss "$flag" "sport = :$3")" ] || return 0
    sleep 0.1
  done
  die "no $2 listener on port $3 in namespace $1 after 5 s"
}

up() {
  need_root up
  check_prefix
  if complete; then
    echo "netns.sh: $NODE_NS is already up"
    return
  fi
  local ns
  while read -r ns; do
    if ns_exists "$ns"; then
      echo "netns.sh: a partial lab exists: removing it first" >&2
      down >/dev/null
      break
    fi
  done < <(all_ns)

  new_ns "$NODE_NS"
  new_ns "$CLIENT_NS"
  new_ns "$OTHER_NS"

  # The LAN: a bridge in the client namespace, one port per node.
  ip -n "$CLIENT_NS" link add br0 type bridge
  ip -n "$CLIENT_NS" addr add 192.168.50.10/24 dev br0
  ip -n "$CLIENT_NS" link set br0 up
  ip -n "$NODE_NS" link add eth0 type veth peer name node netns "$CLIENT_NS"
  ip -n "$OTHER_NS" link add eth0 type veth peer name other netns "$CLIENT_NS"
  for port in node other; do
    ip -n "$CLIENT_NS" link set "$port" master br0 up
  done
  # The client reaches service addresses through demo-node, as a router
  # in front of a cluster would.
  ip -n "$CLIENT_NS" route add 10.96.0.0/12 via 192.168.50.2
  ip -n "$CLIENT_NS" route add 192.168.60.0/24 via 192.168.50.2

  # The two nodes: uplink, pod bridge, a route to the other node's pods.
  local ns addr cidr peer peer_cidr
  for spec in "$NODE_NS 192.168.50.2 10.244.0.1/24 192.168.50.3 10.244.1.0/24" \
    "$OTHER_NS 192.168.50.3 10.244.1.1/24 192.168.50.2 10.244.0.0/24"; do
    read -r ns addr cidr peer peer_cidr <<<"$spec"
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link add cbr0 type bridge
    ip -n "$ns" addr add "$cidr" dev cbr0
    ip -n "$ns" link set cbr0 up
    ip -n "$ns" route add "$peer_cidr" via "$peer"
    in_ns "$ns" sysctl -qw net.ipv4.ip_forward=1
    # The LAN is one subnet: a node would answer a packet it forwards back
    # out of eth0 (to a service IP without endpoints) with an ICMP redirect,
    # and the per-host ICMP rate limit would then swallow the REJECT's
    # port-unreachable that should follow.
    in_ns "$ns" sysctl -qw net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.eth0.send_redirects=0
  done
  # The node's default route (a node has one; locally sent traffic to
  # service IPs needs a route before the nat OUTPUT chain sees it).
  ip -n "$NODE_NS" route add default via 192.168.50.10

  # The pods.
  local ip node pod ports pns host gw p
  while read -r ip node pod ports; do
    pns=$(pod_ns "$ip")
    if [ "$node" = demo-node ]; then host=$NODE_NS gw=10.244.0.1; else host=$OTHER_NS gw=10.244.1.1; fi
    new_ns "$pns"
    ip -n "$pns" link add eth0 type veth peer name "veth${ip##*.}" netns "$host"
    ip -n "$host" link set "veth${ip##*.}" master cbr0 up
    ip -n "$pns" addr add "$ip/24" dev eth0
    ip -n "$pns" link set eth0 up
    ip -n "$pns" route add default via "$gw"
    for p in $ports; do
      start_server "$pns" "$pod" "$ip" "$node" "${p%%:*}" "${p#*:}"
    done
  done < <(backends)
  while read -r ip _ _ ports; do
    for p in $ports; do
      wait_listening "$(pod_ns "$ip")" "${p%%:*}" "${p#*:}"
    done
  done < <(backends)
  echo "netns.sh: up: node $NODE_NS (192.168.50.2), client $CLIENT_NS (192.168.50.10), other-node $OTHER_NS, $(backends | wc -l) pods"
}

# --- down -------------------------------------------------------------------

down() {
  need_root down
  check_prefix
  local ns pids i
  # Every process in our namespaces: the backends, the daemon, shells.
  for i in $(seq 50); do
    pids=$(while read -r ns; do if ns_exists "$ns"; then ip netns pids "$ns"; fi; done < <(all_ns) | sort -u)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086 # a list of pids
    if [ "$i" -lt 30 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
    sleep 0.1
  done
  [ -z "$pids" ] || die "processes $pids in the lab's namespaces do not exit"
  while read -r ns; do
    if ns_exists "$ns"; then ip netns del "$ns"; fi
  done < <(all_ns)
  echo "netns.sh: down: no namespace of $NODE_NS left"
}

# --- run --------------------------------------------------------------------

run() {
  need_root run
  check_prefix
  ns_exists "$NODE_NS" || die "no namespace $NODE_NS: run '$0 up' first"
  [ -x "$BIN" ] || die "no daemon binary at $BIN: run 'cargo build' first (or set KPR_DEMO_BIN)"
  exec ip netns exec "$NODE_NS" "$BIN" --config "$ROOT/config/demo.yaml" --manifests "$ROOT/config/demo" "$@"
}

# --- try --------------------------------------------------------------------

try_target() {
  need_root try
  check_prefix
  [ $# -ge 1 ] || {
    usage >&2
    exit 2
  }
  local target=$1 from=${2:-client} ns proto hostport out
  case $from in
    client) ns=$CLIENT_NS ;;
    node) ns=$NODE_NS ;;
    *) die "FROM is client or node, not '$from'" ;;
  esac
  ns_exists "$ns" || die "no namespace $ns: run '$0 up' first"
  case $target in
    web) proto=http hostport=10.96.0.20:80 ;;
    sticky) proto=http hostport=10.96.0.60:8080 ;;
    local-only) proto=http hostport=10.96.0.70:80 ;;
    no-endpoints) proto=http hostport=10.96.0.80:80 ;;
    web-nodeport) proto=http hostport=10.96.0.30:80 ;;
    nodeport) proto=http hostport=192.168.50.2:30080 ;;
    lb) proto=http hostport=192.168.60.10:80 ;;
    lb-nodeport) proto=http hostport=192.168.50.2:31080 ;;
    external) proto=http hostport=192.168.60.20:80 ;;
    dns) proto=udp hostport=10.96.0.10:53 ;;
    dns-tcp) proto=tcp hostport=10.96.0.10:53 ;;
    udp:*:* | tcp:*:*) proto=${target%%:*} hostport=${target#*:} ;;
    *:*) proto=http hostport=$target ;;
    *) die "unknown target '$target' (see '$0 help')" ;;
  esac
  local host=${hostport%:*} port=${hostport##*:}
  case $proto in
    http)
      if ! out=$(printf 'GET / HTTP/1.0\r\nHost: %s\r\nUser-Agent: netns.sh\r\n\r\n' "$host" |
        in_ns "$ns" timeout "$((TIMEOUT + 1))" socat -t "$TIMEOUT" -T "$TIMEOUT" - \
          "TCP:$hostport,connect-timeout=$TIMEOUT" 2>&1); then
        # A service without endpoints is rejected (upstream's REJECT rule): that is the point.
        if [ "$target" = no-endpoints ] && [[ $out == *"Connection refused"* ]]; then
          echo "refused, as expected: a service without endpoints rejects connections (Connection refused)"
          return 0
        fi
        die "no answer from $proto://$hostport (from $ns): ${out:-none within ${TIMEOUT}s}"
      fi
      [ "$target" != no-endpoints ] || die "no-endpoints answered, but it has no endpoints: $out"
      case $out in
        HTTP/*) out=$(printf '%s\n' "$out" | sed '1,/^\r*$/d') ;;
      esac
      ;;
    tcp)
      out=$(echo hello | in_ns "$ns" timeout "$((TIMEOUT + 1))" socat -t "$TIMEOUT" -T "$TIMEOUT" - \
        "TCP:$hostport,connect-timeout=$TIMEOUT" 2>&1) || die "no answer from tcp://$hostport (from $ns): ${out:-none within ${TIMEOUT}s}"
      ;;
    udp)
      # bash's /dev/udp (a connected socket) and one read of one datagram:
      # returns with the answer (socat would wait out its timeout).
      # shellcheck disable=SC2016 # expanded by the inner bash
      out=$(in_ns "$ns" timeout "$TIMEOUT" bash -c \
        'exec 3<>"/dev/udp/$0/$1" && echo hello >&3 && dd bs=65536 count=1 status=none <&3' \
        "$host" "$port" 2>&1) || die "no answer from udp://$hostport (from $ns): ${out:-none within ${TIMEOUT}s}"
      ;;
  esac
  [ -n "$out" ] || die "empty answer from $proto://$hostport (from $ns)"
  printf '%s\n' "$out"
}

# --- serve (the backends' handler, run by socat in a pod namespace) ---------

serve() {
  local msg="$KPR_DEMO_POD $KPR_DEMO_ADDR on $KPR_DEMO_NODE, client ${SOCAT_PEERADDR:-?}:${SOCAT_PEERPORT:-?}"
  case $KPR_DEMO_ADDR in
    */udp)
      printf '%s\n' "$msg"
      return
      ;;
  esac
  local first='' line
  IFS= read -r -t 2 first || true
  case ${first%$'\r'} in
    *' HTTP/1.'?)
      while IFS= read -r -t 2 line; do
        line=${line%$'\r'}
        [ -n "$line" ] || break
      done
      printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n' \
        "$((${#msg} + 1))" "$msg"
      ;;
    *) printf '%s\n' "$msg" ;;
  esac
}

# --- forward ----------------------------------------------------------------

forward() {
  need_root forward
  check_prefix
  local port=${1:-10249}
  ns_exists "$NODE_NS" || die "no namespace $NODE_NS: run '$0 up' first"
  echo "netns.sh: http://127.0.0.1:$port/dashboard and /metrics on this host reach the daemon's metrics server in $NODE_NS; Ctrl-C stops"
  exec socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "EXEC:ip netns exec $NODE_NS socat STDIO TCP\:127.0.0.1\:10249"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  run)
    shift
    run "$@"
    ;;
  try | curl)
    shift
    try_target "$@"
    ;;
  forward)
    shift
    forward "$@"
    ;;
  list) backends ;;
  serve) serve ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
