#!/usr/bin/env bash
# deploy/demo/netns.sh — the README demo: kube-proxy-rs on the embedded demo
# cluster (config/demo/) in iptables, nftables or IPVS mode, on a node made
# of network namespaces. Everything it creates lives in those namespaces: the
# host's own rules, routes, links and sysctls are never touched.
# deploy/demo/quickstart.sh installs what it needs, builds, and runs `up`
# and `run` in one go. As root:
#
#   deploy/demo/netns.sh up                   create the namespaces, start the backends
#   deploy/demo/netns.sh run [MODE] [FLAG...] run the daemon in the node namespace (foreground)
#   deploy/demo/netns.sh try TARGET [FROM]    one request to a service, print the answer
#   deploy/demo/netns.sh forward [PORT]       serve the node's metrics/dashboard on the host's 127.0.0.1:PORT
#   deploy/demo/netns.sh down                 stop everything the others started, delete the namespaces
#   deploy/demo/netns.sh list                 the backends: pod IP, node, pod name, ports (no root needed)
#
# MODE is iptables (the default), nftables or ipvs and picks the config file:
# config/demo.yaml, config/demo-nftables.yaml, config/demo-ipvs.yaml (the
# config file wins over mode flags, so the mode is chosen by file;
# `--proxy-mode MODE` among the flags is taken as MODE). IPVS mode needs a
# kernel with IPVS (/proc/net/ip_vs); without one, `run ipvs` says so and
# how to try it in the qemu VM (tests/vm/README.md).
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
# Every IPv4 endpoint address of the manifests' EndpointSlices (as
# kpr-demo-backends reads them with the daemon's manifest reader: `list`)
# is a pod namespace on its node (demo-node or other-node), running socat on
# its ports (TCP, UDP) that answers with its pod name, address, node and
# the client address it saw, e.g.
#   web-5d8f7c9b6-a1b2c 10.244.0.11:8080/tcp on demo-node, client 10.244.0.1:40312
# HTTP requests get an HTTP/1.0 answer, anything else that one line. After
# adding an endpoint address to the manifests, `down` and `up` give it its
# pod.
#
# TARGET is a name (see `usage`) or [udp:|tcp:]IP:PORT (default: an HTTP GET);
# FROM is `client` (default) or `node`.
#
# Environment:
#   KPR_DEMO_PREFIX        namespace names (default kpr-demo); tests use their own
#   KPR_DEMO_BIN           the daemon (default ${CARGO_TARGET_DIR:-target}/debug/kube-proxy-rs)
#   KPR_DEMO_BACKENDS_BIN  the backend lister (default ${CARGO_TARGET_DIR:-target}/debug/kpr-demo-backends)
#   KPR_DEMO_MANIFESTS     the cluster's objects (default config/demo)
#   KPR_DEMO_TIMEOUT       seconds `try` waits for an answer (default 3)
#   KPR_DEMO_FORWARD_PORT  the host port `forward` listens on without PORT (default 10249)
#
# Needs root, bash, iproute2 (ip, ss), socat, util-linux (setsid), procps
# (sysctl), coreutils and, for the daemon, iptables: all in
# .ci/install-deps.sh --demo. `forward` records its pid in
# /run/kpr-demo-lab/ so that `down` stops it.
set -eu
set -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SELF="$ROOT/deploy/demo/$(basename "$0")"
P=${KPR_DEMO_PREFIX:-kpr-demo}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=${KPR_DEMO_BIN:-$TARGET_DIR/debug/kube-proxy-rs}
BACKENDS_BIN=${KPR_DEMO_BACKENDS_BIN:-$TARGET_DIR/debug/kpr-demo-backends}
MANIFESTS=${KPR_DEMO_MANIFESTS:-$ROOT/config/demo}
TIMEOUT=${KPR_DEMO_TIMEOUT:-3}
NODE_NS=$P
CLIENT_NS=$P-client
OTHER_NS=$P-other
# Where `forward` records its pid (it listens in the host's namespace,
# where `down` cannot find it by namespace).
RUN_DIR=/run/kpr-demo-lab
# The demo in IPVS mode in the qemu VM (tests/vm/guest/demo.sh), from the
# repository's root, after `cargo build`.
VM_DEMO='tests/vm/run-vm-test.sh --bin target/debug/kube-proxy-rs --bin target/debug/kpr-demo-backends --file deploy/demo --file config tests/vm/guest/demo.sh'

usage() {
  cat <<EOF
usage: $0 up|run [iptables|nftables|ipvs] [FLAG...]|try TARGET [client|node]|forward [PORT]|down|list

run modes (each with its config file; --proxy-mode MODE is taken as MODE):
  iptables      config/demo.yaml (the default)
  nftables      config/demo-nftables.yaml
  ipvs          config/demo-ipvs.yaml: needs IPVS in the kernel, else the qemu VM:
                $VM_DEMO

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
  [ "$(id -u)" = 0 ] || die "$0 ${1:-}: run it as root"
  for t in ip ss socat setsid sysctl timeout; do
    command -v "$t" >/dev/null || die "'$t' not found (bash .ci/install-deps.sh --demo installs it)"
  done
}

check_prefix() {
  case $P in
    '' | *[!A-Za-z0-9_.-]* | -*) die "KPR_DEMO_PREFIX '$P': use letters, digits, '.', '_' and '-'" ;;
  esac
}

# The backends, one line each (address, node, pod, ports), as
# kpr-demo-backends reads them from the manifests; load_backends reads them
# once into BACKEND_LINES.
BACKEND_LINES=
load_backends() {
  [ -x "$BACKENDS_BIN" ] || die "no kpr-demo-backends at $BACKENDS_BIN: run 'cargo build' first (or set KPR_DEMO_BACKENDS_BIN)"
  BACKEND_LINES=$("$BACKENDS_BIN" "$MANIFESTS") || die "cannot read the backends from $MANIFESTS (above)"
  [ -n "$BACKEND_LINES" ] || die "no endpoint addresses in $MANIFESTS"
}

backends() {
  printf '%s\n' "$BACKEND_LINES"
}

pod_ns() {
  echo "$P-$1"
}

# Every namespace of the lab as the manifests say now, pods first.
all_ns() {
  backends | while read -r ip _; do pod_ns "$ip"; done
  echo "$OTHER_NS"
  echo "$CLIENT_NS"
  echo "$NODE_NS"
}

# Every namespace of the lab that exists, whatever the manifests say now
# (an endpoint removed since `up` keeps its namespace until `down`), pods
# first: P-<IPv4 address>, P-other, P-client, P.
existing_ns() {
  local p=${P//./\\.} ns
  ip netns list | while read -r ns _; do printf '%s\n' "$ns"; done |
    grep -E "^$p-[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+\$" || true
  for ns in "$OTHER_NS" "$CLIENT_NS" "$NODE_NS"; do
    if ns_exists "$ns"; then echo "$ns"; fi
  done
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

# Whether a pod's namespace exists with a listener per port.
pod_complete() { # ns ports...
  local ns=$1
  shift
  ns_exists "$ns" && [ "$(ip netns pids "$ns" | wc -l)" -ge $# ]
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
  # datagram; the variables reach it through the environment. When the
  # client has sent all it sends, socat waits -t seconds for the handler's
  # answer (0.5 s by default; starting bash takes longer on the VM's
  # emulated CPU). `ip` by its path: busybox's setsid (the VM's) would run
  # its own `ip` applet.
  # shellcheck disable=SC2016 # expanded by socat's shell, not here
  KPR_DEMO_POD=$pod KPR_DEMO_ADDR=$ip:$port/$proto KPR_DEMO_NODE=$node KPR_DEMO_SELF=$SELF \
    setsid "$(command -v ip)" netns exec "$ns" socat -t 10 "$listen" 'SYSTEM:exec "$KPR_DEMO_SELF" serve' \
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

# The node namespace and gateway of a pod on `node` with address `ip`;
# dies for a node the lab does not have or an address outside its pod CIDR.
pod_host() { # ip node
  case $2 in
    demo-node) [[ $1 == 10.244.0.* ]] && echo "$NODE_NS 10.244.0.1" && return ;;
    other-node) [[ $1 == 10.244.1.* ]] && echo "$OTHER_NS 10.244.1.1" && return ;;
    *) die "endpoint $1 is on node $2: the lab has demo-node (pods 10.244.0.0/24) and other-node (10.244.1.0/24)" ;;
  esac
  die "endpoint $1 is on $2, outside its pods' range (demo-node 10.244.0.0/24, other-node 10.244.1.0/24)"
}

up() {
  need_root up
  check_prefix
  load_backends
  local ip node
  while read -r ip node _; do pod_host "$ip" "$node" >/dev/null; done < <(backends)
  local base=1
  if ! ns_exists "$NODE_NS" || ! ns_exists "$CLIENT_NS" || ! ns_exists "$OTHER_NS"; then
    base=0
    if [ -n "$(existing_ns)" ]; then
      echo "netns.sh: a partial lab exists: removing it first" >&2
      down >/dev/null
    fi
    up_nodes
  fi
  up_pods "$base"
}

# The two nodes and the client on their LAN.
up_nodes() {
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
}

# One pod: its namespace on its node's bridge, a listener per port.
add_pod() { # ip node pod ports...
  local ip=$1 node=$2 pod=$3 pns host gw p
  shift 3
  pns=$(pod_ns "$ip")
  read -r host gw < <(pod_host "$ip" "$node")
  new_ns "$pns"
  ip -n "$pns" link add eth0 type veth peer name "veth${ip##*.}" netns "$host"
  ip -n "$host" link set "veth${ip##*.}" master cbr0 up
  ip -n "$pns" addr add "$ip/24" dev eth0
  ip -n "$pns" link set eth0 up
  ip -n "$pns" route add default via "$gw"
  for p in "$@"; do
    start_server "$pns" "$pod" "$ip" "$node" "${p%%:*}" "${p#*:}"
  done
}

# Removes pod namespaces (their processes first), waits until the node
# side of each one's veth is gone, so the name can be used again, and
# forgets the pod's MAC address, so a new pod with its address is reached.
remove_pods() { # ns...
  [ $# -gt 0 ] || return 0
  stop_processes "$@"
  local ns ip host i
  for ns in "$@"; do
    ip netns del "$ns"
    ip=${ns##*-}
    for host in "$NODE_NS" "$OTHER_NS"; do
      for i in $(seq 50); do
        ip -n "$host" link show "veth${ip##*.}" >/dev/null 2>&1 || break
        sleep 0.1
      done
      ip -n "$host" neigh flush to "$ip" 2>/dev/null || true
    done
  done
}

# Makes the pods what the manifests say, beside a running daemon: stops
# the pods no longer listed and those missing a listener, starts the
# missing ones. `base` is 1 when the nodes were up already.
up_pods() { # base
  local ip node pod ports ns p stale=() added=()
  local -A want=()
  while read -r ip _ _ ports; do want[$(pod_ns "$ip")]=$ports; done < <(backends)
  while read -r ns; do
    case $ns in "$NODE_NS" | "$CLIENT_NS" | "$OTHER_NS") continue ;; esac
    # shellcheck disable=SC2086 # the ports are a word list
    if [ -z "${want[$ns]+set}" ] || ! pod_complete "$ns" ${want[$ns]}; then stale+=("$ns"); fi
  done < <(existing_ns)
  remove_pods ${stale[@]+"${stale[@]}"}
  while read -r ip node pod ports; do
    ns_exists "$(pod_ns "$ip")" && continue
    # shellcheck disable=SC2086 # the ports are a word list
    add_pod "$ip" "$node" "$pod" $ports
    added+=("$ip $ports")
  done < <(backends)
  for ip in ${added[@]+"${added[@]}"}; do
    read -r ip ports <<<"$ip"
    for p in $ports; do
      wait_listening "$(pod_ns "$ip")" "${p%%:*}" "${p#*:}"
    done
  done
  if [ "$1" = 1 ] && [ ${#added[@]} = 0 ] && [ ${#stale[@]} = 0 ]; then
    echo "netns.sh: $NODE_NS is already up"
    return
  fi
  echo "netns.sh: up: node $NODE_NS (192.168.50.2), client $CLIENT_NS (192.168.50.10), other-node $OTHER_NS, $(backends | wc -l) pods (${#added[@]} started, ${#stale[@]} stopped)"
}

# --- down -------------------------------------------------------------------

# Stops every process in the namespaces: SIGTERM for 3 s, then SIGKILL.
stop_processes() { # ns...
  local ns pids i
  for i in $(seq 50); do
    pids=$(for ns in "$@"; do ip netns pids "$ns"; done | sort -u)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086 # a list of pids
    if [ "$i" -lt 30 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
    sleep 0.1
  done
  die "processes $pids in the lab's namespaces do not exit"
}

# Whether a process runs (exists and is not a zombie its parent has yet to reap).
running() { # pid
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# Stops every `forward` of this lab: the pids it recorded, each checked to
# be that forward (a socat relaying to this lab's node) before the signal.
stop_forwards() {
  local f pid i
  for f in "$RUN_DIR/$P".forward.*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
      grep -qF "EXEC:ip netns exec $NODE_NS socat "; then
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 50); do
        running "$pid" || break
        sleep 0.1
      done
      ! running "$pid" || die "forward (pid $pid) does not exit"
    fi
    rm -f "$f"
  done
}

down() {
  need_root down
  check_prefix
  local ns
  stop_forwards
  # Every process in our namespaces: the backends, the daemon, shells.
  # shellcheck disable=SC2046 # a list of namespaces
  stop_processes $(existing_ns)
  while read -r ns; do
    ip netns del "$ns"
  done < <(existing_ns)
  echo "netns.sh: down: no namespace of $NODE_NS left, no forward"
}

# --- run --------------------------------------------------------------------

# The demo's config file of a mode.
mode_config() {
  case $1 in
    iptables) echo "$ROOT/config/demo.yaml" ;;
    nftables) echo "$ROOT/config/demo-nftables.yaml" ;;
    ipvs) echo "$ROOT/config/demo-ipvs.yaml" ;;
    *) die "unknown mode '$1': iptables, nftables or ipvs" ;;
  esac
}

run() {
  need_root run
  check_prefix
  local mode='' given='' config
  case ${1:-} in
    '' | -*) ;;
    *)
      mode=$1
      shift
      ;;
  esac
  # The config file wins over every mode flag, so the mode picks the file:
  # `--proxy-mode MODE` is taken as MODE, `--config` is refused.
  local flags=()
  while [ $# -gt 0 ]; do
    case $1 in
      --proxy-mode=*) given=${1#*=} ;;
      --proxy-mode)
        [ $# -ge 2 ] || die "--proxy-mode needs a value"
        given=$2
        shift
        ;;
      --config | --config=*) die "run picks the config file by mode (run iptables|nftables|ipvs); for another file run the daemon yourself" ;;
      *) flags+=("$1") ;;
    esac
    shift
  done
  if [ -n "$given" ]; then
    [ -z "$mode" ] || [ "$mode" = "$given" ] || die "mode $mode and --proxy-mode $given: choose one"
    mode=$given
  fi
  mode=${mode:-iptables}
  config=$(mode_config "$mode") || exit 1
  if [ "$mode" = ipvs ] && [ ! -e /proc/net/ip_vs ]; then
    die "no IPVS in this kernel (no /proc/net/ip_vs; 'modprobe ip_vs' where the kernel has the module); IPVS mode runs in the qemu VM: $VM_DEMO (tests/vm/README.md); here: '$0 run iptables' or '$0 run nftables'"
  fi
  ns_exists "$NODE_NS" || die "no namespace $NODE_NS: run '$0 up' first"
  [ -x "$BIN" ] || die "no daemon binary at $BIN: run 'cargo build' first (or set KPR_DEMO_BIN)"
  echo "netns.sh: run: $mode mode (${config#"$ROOT"/}) in namespace $NODE_NS; in another terminal: $0 try web" >&2
  exec ip netns exec "$NODE_NS" "$BIN" --config "$config" --manifests "$MANIFESTS" ${flags[@]+"${flags[@]}"}
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
      # The body: what follows the header's blank line.
      case $out in
        HTTP/*) out=${out#*$'\r\n\r\n'} ;;
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
  local port=${1:-${KPR_DEMO_FORWARD_PORT:-10249}}
  ns_exists "$NODE_NS" || die "no namespace $NODE_NS: run '$0 up' first"
  mkdir -p "$RUN_DIR"
  echo $$ >"$RUN_DIR/$P.forward.$port.pid"
  echo "netns.sh: http://127.0.0.1:$port/dashboard and /metrics on this host reach the daemon's metrics server in $NODE_NS; Ctrl-C or '$0 down' stops"
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
  list)
    load_backends
    backends
    ;;
  serve) serve ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
