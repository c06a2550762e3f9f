#!/bin/bash
# IPVS-mode scenarios on a real kernel, run inside the VM as /test.sh.
#
# The VM's root netns is node "node-a", where the daemon runs. Around it:
#   client   192.168.50.10  external client on the node's LAN (in the LB source range)
#   outsider 192.168.52.10  external client outside the source range
#   cpod     10.244.0.50    a pod on node-a, used as an in-cluster client
#   pod1     10.244.0.11    local backend          pod2 10.244.0.12  local backend
#   nodeb    10.244.1.21/22 two "pods" on another node, reached through nodeb
#            (172.30.0.2); nodeb answers the client directly over its own link
#            (192.168.51.0/24), as a remote node would: replies that were not
#            masqueraded never come back through node-a.
# Every backend answers HTTP on :8080 and UDP on :5000 with its own name, and
# echoes TCP on :7000.
#
# Each scenario prints "SCENARIO <name>: PASS" or "SCENARIO <name>: FAIL: <what it saw>".
# Exit status 1 if any failed. KPR_BIN runs the daemon (default
# /usr/local/bin/kube-proxy-rs), KPR_SCENARIOS (names) selects scenarios.
set -u
BIN=${KPR_BIN:-/usr/local/bin/kube-proxy-rs}
M=/tmp/manifests
SRC=${KPR_MANIFESTS:-/scenarios/manifests}
LOG=/tmp/daemon.log
SYNC_PERIOD=5
FAILED=()
T0=$(cut -d' ' -f1 /proc/uptime)

say() { echo "---- [$(awk -v t0="$T0" '{printf "%.1f", $1 - t0}' /proc/uptime)s] $*"; }
in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# ------------------------------------------------------------- topology ----
veth() { # veth HOST_IF NS NS_IF
  ip link add "$1" type veth peer name "$3" netns "$2"
  ip link set "$1" up
  in_ns "$2" ip link set "$3" up
}

pod_on_node() { # pod_on_node NAME IP
  local ns=$1 ip=$2 hif="v$1"
  ip netns add "$ns"; in_ns "$ns" ip link set lo up
  veth "$hif" "$ns" eth0
  ip addr add 10.244.0.1/32 dev "$hif"
  ip route add "$ip/32" dev "$hif"
  in_ns "$ns" ip addr add "$ip/32" dev eth0
  in_ns "$ns" ip route add 10.244.0.1/32 dev eth0
  in_ns "$ns" ip route add default via 10.244.0.1
}

serve() { # serve NS IP NAME: HTTP :8080, UDP :5000 and TCP echo :7000 answering as NAME
  local ns=$1 ip=$2 name=$3
  mkdir -p "/srv/$name"; echo "$name" >"/srv/$name/index.html"
  in_ns "$ns" busybox httpd -p "$ip:8080" -h "/srv/$name"
  in_ns "$ns" socat -T2 "UDP4-RECVFROM:5000,bind=$ip,reuseaddr,fork" "SYSTEM:echo $name" &
  in_ns "$ns" socat "TCP4-LISTEN:7000,bind=$ip,reuseaddr,fork" PIPE &
}

topology() {
  sysctl -qw net.ipv4.ip_forward=1
  ip netns add client; ip netns add outsider; ip netns add nodeb
  for ns in client outsider nodeb; do in_ns $ns ip link set lo up; done
  # LAN: node-a <-> client
  veth lan0 client eth0
  ip addr add 192.168.50.2/24 dev lan0
  in_ns client ip addr add 192.168.50.10/24 dev eth0
  in_ns client ip route add default via 192.168.50.2
  in_ns client sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
  # another LAN: node-a <-> outsider
  veth lan1 outsider eth0
  ip addr add 192.168.52.2/24 dev lan1
  in_ns outsider ip addr add 192.168.52.10/24 dev eth0
  in_ns outsider ip route add default via 192.168.52.2
  # node-a <-> node-b, and node-b's own link to the client
  veth tonodeb nodeb eth0
  ip addr add 172.30.0.1/30 dev tonodeb
  in_ns nodeb ip addr add 172.30.0.2/30 dev eth0
  in_ns nodeb ip route add default via 172.30.0.1
  in_ns nodeb ip addr add 10.244.1.21/32 dev lo
  in_ns nodeb ip addr add 10.244.1.22/32 dev lo
  ip route add 10.244.1.0/24 via 172.30.0.2
  ip link add nbcl type veth peer name eth1 netns client
  ip link set nbcl netns nodeb
  in_ns nodeb ip link set nbcl up; in_ns client ip link set eth1 up
  in_ns nodeb ip addr add 192.168.51.2/24 dev nbcl
  in_ns client ip addr add 192.168.51.10/24 dev eth1
  in_ns nodeb ip route add 192.168.50.0/24 via 192.168.51.10
  in_ns client sysctl -qw net.ipv4.conf.eth1.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0
  # pods on node-a
  pod_on_node pod1 10.244.0.11
  pod_on_node pod2 10.244.0.12
  pod_on_node cpod 10.244.0.50
  serve pod1 10.244.0.11 pod1
  serve pod2 10.244.0.12 pod2
  serve nodeb 10.244.1.21 remote1
  serve nodeb 10.244.1.22 remote2
}

# -------------------------------------------------------------- helpers ----
http() { # http NS IP PORT -> body (empty on failure)
  in_ns "$1" timeout 3 wget -q -O - "http://$2:$3/" 2>/dev/null | tr -d '\r'
}
udp() { # udp NS IP PORT [SRCPORT] -> reply
  local sp=${4:+,sourceport=$4}
  echo x | in_ns "$1" timeout 3 socat -T1 - "UDP4:$2:$3$sp" 2>/dev/null | tr -d '\r'
}
udp_retry() { # udp_retry NS IP PORT SRCPORT: up to 3 tries (a busy TCG host can miss the 1 s wait)
  local i out
  for i in 1 2 3; do
    out=$(udp "$@")
    if [ -n "$out" ]; then echo "$out"; return 0; fi
  done
}
distinct() { # distinct N CMD... -> sorted distinct outputs of N runs
  local n=$1; shift; local i
  for ((i = 0; i < n; i++)); do "$@"; echo; done | grep -v '^$' | sort -u | tr '\n' ' '
}
wait_for() { # wait_for SECONDS CMD... : poll until CMD succeeds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
ipvs_has() { ipvsadm -S -n | grep -qF -- "$1"; }
ipvs_lacks() { ! ipvsadm -S -n | grep -qF -- "$1"; }

run() { # run NAME FUNCTION (in this shell: scenarios may restart the daemon)
  local name=$1 out=/tmp/scenario.out
  # KPR_SCENARIOS="a b ...": only those (tests/vm/guest/image-ipvs.sh).
  if [ -n "${KPR_SCENARIOS:-}" ] && [[ " $KPR_SCENARIOS " != *" $name "* ]]; then return 0; fi
  say "scenario $name"
  if "$2" >"$out" 2>&1; then
    echo "SCENARIO $name: PASS"
  else
    echo "SCENARIO $name: FAIL: $(tail -5 "$out" | tr '\n' ' ')"
    FAILED+=("$name")
  fi
}
expect() { # expect DESC GOT WANT
  if [ "$2" != "$3" ]; then echo "$1: got '$2', want '$3'"; return 1; fi
}

start_daemon() {
  export KUBE_PROXY_RS_RS_CHECK_INTERVAL=2s
  "$BIN" --proxy-mode ipvs --manifests "$M" --hostname-override node-a \
    --cluster-cidr 10.244.0.0/16 --ipvs-sync-period ${SYNC_PERIOD}s --ipvs-min-sync-period 0s \
    --ipvs-exclude-cidrs 10.99.0.0/16 --v 2 >>"$LOG" 2>&1 &
  DAEMON=$!
}

# ------------------------------------------------------------ scenarios ----
s_takeover_start() {
  # What an earlier run (or upstream kube-proxy) may have left: stale state to
  # remove, and a virtual server in --ipvs-exclude-cidrs to keep.
  ip link add kube-ipvs0 type dummy
  ip addr add 10.96.9.9/32 dev kube-ipvs0
  ipvsadm -A -t 10.96.9.9:80 -s rr
  ipvsadm -A -t 10.99.0.1:80 -s rr
  ipset create KUBE-CLUSTER-IP hash:ip,port
  ipset add KUBE-CLUSTER-IP 10.96.9.9,tcp:80
  # iptables mode's chains (this node ran it before): removed at start, as
  # upstream's CleanupLeftovers of the inactive proxier; a foreign chain stays.
  iptables-restore --noflush <<'RULES'
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:FOREIGN - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.9.8/32 -p tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.244.9.9:80
-A FOREIGN -j RETURN
COMMIT
*filter
:KUBE-EXTERNAL-SERVICES - [0:0]
-A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
COMMIT
RULES
  start_daemon
  wait_for 30 ipvs_has "-A -t 10.96.0.20:80 -s rr" || { echo "no sync: $(tail -5 $LOG)"; return 1; }
  wait_for 10 ipvs_lacks "10.96.9.9" || { echo "stale VS kept"; return 1; }
  ipvs_has "-A -t 10.99.0.1:80" || { echo "excluded VS deleted"; return 1; }
  # The ipset actors run beside the IPVS one: their first sync may end after it.
  wait_for 10 sh -c '! ipset list KUBE-CLUSTER-IP | grep -q 10.96.9.9' || { echo "stale set entry kept"; return 1; }
  # Unbinds go once every set actor acked (stage 2): wait for them too.
  wait_for 10 sh -c '! ip addr show dev kube-ipvs0 | grep -q 10.96.9.9' || { echo "stale address kept"; return 1; }
  ip -d link show kube-ipvs0 | grep -q 'state DOWN' || { echo "kube-ipvs0 is up"; return 1; }
  wait_for 10 sh -c 'iptables-save -t nat | grep -q "^:KUBE-LOAD-BALANCER"' || { echo "no IPVS-mode rules"; return 1; }
  # iptables mode's chains go once IPVS mode's first sync is in.
  wait_for 10 sh -c "! iptables-save -t nat | grep -qE 'KUBE-SVC-|KUBE-SEP-|KUBE-NODEPORTS'" \
    || { echo "iptables mode's chains kept: $(iptables-save -t nat | grep -E 'KUBE-SVC-|KUBE-SEP-|KUBE-NODEPORTS' | head -3)"; return 1; }
  local nat; nat=$(iptables-save -t nat)
  echo "$nat" | grep -q '^:FOREIGN' || { echo "a foreign chain was removed"; return 1; }
  ! iptables-save -t filter | grep -q KUBE-EXTERNAL-SERVICES || { echo "iptables mode's filter chain kept"; return 1; }
  expect "nat PREROUTING jumps to KUBE-SERVICES" "$(echo "$nat" | grep -c -- '-A PREROUTING .*-j KUBE-SERVICES')" 1 || return 1
  expect "vs/conntrack" "$(cat /proc/sys/net/ipv4/vs/conntrack)" 1
  expect "expire_nodest_conn" "$(cat /proc/sys/net/ipv4/vs/expire_nodest_conn)" 1
}

s_clusterip_tcp() {
  local got; got=$(distinct 30 http cpod 10.96.0.20 80)
  expect "backends reached" "$got" "pod1 pod2 remote1 "
}

s_clusterip_udp() {
  local got; got=$(distinct 15 udp cpod 10.96.0.30 5000)
  expect "backends reached" "$got" "pod1 pod2 remote1 "
}

s_hairpin() {
  local got; got=$(distinct 12 http pod1 10.96.0.20 80)
  case "$got" in *pod1*) ;; *) echo "pod1 never reached itself through the service: $got"; return 1 ;; esac
}

s_nodeport() {
  local got; got=$(distinct 20 http client 192.168.50.2 30080)
  expect "backends via NodePort" "$got" "pod1 pod2 remote1 "
}

s_load_balancer() {
  local got; got=$(distinct 20 http client 192.168.60.10 80)
  expect "backends via LB VIP" "$got" "pod1 pod2 remote1 "
}

s_source_ranges() {
  [ -n "$(http client 192.168.60.10 80)" ] || { echo "client in range refused"; return 1; }
  local got; got=$(http outsider 192.168.60.10 80)
  expect "client outside loadBalancerSourceRanges" "$got" ""
}

s_external_ip() {
  local got; got=$(distinct 20 http client 192.168.60.20 80)
  expect "backends via externalIP" "$got" "pod1 pod2 remote1 "
}

s_affinity() {
  local got; got=$(distinct 15 http cpod 10.96.0.60 80)
  [ "$(echo "$got" | wc -w)" = 1 ] || { echo "ClientIP affinity spread over: $got"; return 1; }
}

# Per-service schedulers (manifests/sched.yaml): one client address, many
# new connections. sh and mh (no port flag) hash the source address, so
# every connection lands on one backend; rr spreads them.
s_service_scheduler() {
  ipvs_has "-A -t 10.96.0.150:80 -s sh" || { echo "no sh: $(ipvsadm -S -n | grep 10.96.0.15)"; return 1; }
  ipvs_has "-A -t 10.96.0.151:80 -s mh" || { echo "no mh: $(ipvsadm -S -n | grep 10.96.0.15)"; return 1; }
  ipvs_has "-A -t 10.96.0.152:80 -s rr" || { echo "no rr"; return 1; }
  local got
  for vip in 10.96.0.150 10.96.0.151; do
    got=$(distinct 8 http cpod $vip 80)
    [ "$(echo "$got" | wc -w)" = 1 ] || { echo "$vip spread one client over: $got"; return 1; }
  done
  got=$(distinct 8 http cpod 10.96.0.152 80)
  expect "rr spreads one client" "$got" "pod1 pod2 remote1 " || return 1
  # An unknown scheduler: refused with a warning naming the Service, the default used.
  ipvs_has "-A -t 10.96.0.153:80 -s rr" || { echo "refused annotation not on rr: $(ipvsadm -S -n | grep 10.96.0.153)"; return 1; }
  grep -q "IPVS scheduler.*default/typo.*ipvs.kube-proxy-rs.io/scheduler.*fastest" "$LOG" \
    || { echo "no warning naming default/typo: $(grep -i scheduler $LOG | tail -3)"; return 1; }
}

# rr -> sh on a Service with an open TCP connection: the virtual server is
# edited in place (ipvsadm -E), so the connection keeps working.
s_scheduler_change_live() {
  coproc LIVE { in_ns cpod socat - TCP4:10.96.0.154:7000; }
  echo one >&"${LIVE[1]}"
  local line; read -r -t 3 line <&"${LIVE[0]}"
  expect "echo before the change" "$line" one || return 1
  sed -i 's|^metadata: {namespace: default, name: live}$|metadata: {namespace: default, name: live, annotations: {"ipvs.kube-proxy-rs.io/scheduler": sh, "ipvs.kube-proxy-rs.io/scheduler-flags": fallback}}|' "$M/sched.yaml"
  wait_for 15 ipvs_has "-A -t 10.96.0.154:7000 -s sh -b sh-fallback" \
    || { echo "not changed to sh: $(ipvsadm -S -n | grep 10.96.0.154)"; return 1; }
  [ "$(ipvsadm -L -n -t 10.96.0.154:7000 | grep -c Masq)" = 3 ] || { echo "real servers changed: $(ipvsadm -L -n -t 10.96.0.154:7000)"; return 1; }
  echo two >&"${LIVE[1]}"
  read -r -t 3 line <&"${LIVE[0]}"
  expect "echo after the change, same connection" "$line" two || return 1
  exec {LIVE[1]}>&-
  kill "$LIVE_PID" 2>/dev/null; wait "$LIVE_PID" 2>/dev/null
  return 0
}

s_local_policy_without_local_endpoint() {
  # Only endpoint remote, externalTrafficPolicy Local: not masqueraded, so the
  # reply leaves node-b straight to the client, which drops it (upstream).
  local got; got=$(http client 192.168.60.11 80)
  expect "external client through Local LB with no local endpoint" "$got" ""
  got=$(http cpod 10.96.0.41 80)
  expect "in-cluster client via its cluster IP (policy Cluster)" "$got" "remote2"
}

s_no_endpoints() {
  local t0 t1; t0=$(date +%s)
  local got; got=$(http cpod 10.96.0.70 80)
  t1=$(date +%s)
  expect "service without endpoints" "$got" ""
  [ $((t1 - t0)) -lt 3 ] || { echo "not refused, timed out"; return 1; }
}

s_udp_flow_moves() {
  local first second
  first=$(udp_retry cpod 10.96.0.30 5000 40000)
  [ -n "$first" ] || { echo "no UDP reply"; return 1; }
  [ "$(udp_retry cpod 10.96.0.30 5000 40000)" = "$first" ] || { echo "flow not sticky before the change"; return 1; }
  local ip; case $first in pod1) ip=10.244.0.11 ;; pod2) ip=10.244.0.12 ;; remote1) ip=10.244.1.21 ;; esac
  sed -i "/- addresses: \[\"$ip\"\]/,+2d" "$M/echo.yaml"
  wait_for 10 ipvs_lacks "-r $ip:5000" || { echo "real server $ip kept"; return 1; }
  second=$(udp_retry cpod 10.96.0.30 5000 40000)
  [ -n "$second" ] && [ "$second" != "$first" ] || { echo "flow stayed on '$first' (now '$second')"; return 1; }
}

# A UDP NodePort Service to pod1 only (manifests/udp-np.yaml) is deleted:
# the conntrack entry of a flow to its NodePort (one source port, DNATed to
# pod1) goes at the sync that deletes its virtual server, and the same
# source port is answered by nobody after.
ct_to_pod1() { conntrack -L -p udp --sport 40700 2>/dev/null | grep -q "src=10.244.0.11 "; }
ct_gone() { ! ct_to_pod1; }
s_udp_service_deleted_entries_go() {
  local first; first=$(udp_retry client 192.168.50.2 30500 40700)
  expect "flow to the UDP NodePort" "$first" pod1 || return 1
  ct_to_pod1 || { echo "no entry DNATed to pod1: $(conntrack -L -p udp --sport 40700 2>&1)"; return 1; }
  rm "$M/udp-np.yaml"
  wait_for 10 ipvs_lacks ":30500" || { echo "VS left behind"; return 1; }
  wait_for 10 ct_gone || { echo "entry to pod1 left: $(conntrack -L -p udp --sport 40700 2>&1)"; return 1; }
  expect "the flow after the Service went" "$(udp client 192.168.50.2 30500 40700)" ""
}

s_service_deleted() {
  rm "$M/sticky.yaml"
  wait_for 10 ipvs_lacks "10.96.0.60" || { echo "VS left behind"; return 1; }
  sleep 0.5
  ! ipset list | grep -q "10.96.0.60" || { echo "set entry left behind"; return 1; }
  ! ip addr show dev kube-ipvs0 | grep -q "10.96.0.60" || { echo "address left behind"; return 1; }
}

s_graceful_termination() {
  coproc CONN { in_ns cpod socat - TCP4:10.96.0.90:7000; }
  echo hello >&"${CONN[1]}"
  local line; read -r -t 3 line <&"${CONN[0]}"
  expect "echo before" "$line" hello || return 1
  local busy; busy=$(ipvsadm -L -n -t 10.96.0.90:7000 | awk '/->.*Masq/ && $5 + 0 > 0 {print $2}' | head -1)
  [ -n "$busy" ] || { echo "no active connection seen: $(ipvsadm -L -n -t 10.96.0.90:7000)"; return 1; }
  local ip=${busy%:*}
  sed -i "/- addresses: \[\"$ip\"\]/,+2d" "$M/drain.yaml"
  wait_for 10 sh -c "ipvsadm -L -n -t 10.96.0.90:7000 | grep -q '$busy *Masq *0 '" \
    || { echo "not weight 0: $(ipvsadm -L -n -t 10.96.0.90:7000)"; return 1; }
  echo again >&"${CONN[1]}"
  read -r -t 3 line <&"${CONN[0]}"
  expect "open connection still works while draining" "$line" again || return 1
  exec {CONN[1]}>&-
  kill "$CONN_PID" 2>/dev/null; wait "$CONN_PID" 2>/dev/null
  # It stays (weight 0) until IPVS forgets the closed connection: InActConn
  # covers TIME_WAIT, 2 minutes in IPVS. Upstream waits for that as well.
  ipvsadm -L -n -t 10.96.0.90:7000 | grep -q "$busy" || { echo "deleted while connections remained"; return 1; }
  wait_for 150 sh -c "! ipvsadm -L -n -t 10.96.0.90:7000 | grep -q '$busy'" \
    || { echo "drained real server not deleted: $(ipvsadm -L -n -t 10.96.0.90:7000)"; return 1; }
}

# Periodic syncs are partial: the repair comes from each actor's cheap check
# at the syncPeriod (IPVS: its virtual servers; sets: member counts; the
# dummy link: its addresses) and the iptables actor's check, not from a full
# resync of everything.
s_drift_repaired() {
  ipvsadm -C
  ipset flush KUBE-CLUSTER-IP
  ip addr del 10.96.0.20/32 dev kube-ipvs0
  iptables -t nat -F
  wait_for $((SYNC_PERIOD + 5)) ipvs_has "-A -t 10.96.0.20:80 -s rr" || { echo "IPVS not repaired"; return 1; }
  wait_for 5 sh -c "ipset list KUBE-CLUSTER-IP | grep -q 10.96.0.20,tcp:80" || { echo "ipset not repaired"; return 1; }
  wait_for 5 sh -c "ip addr show dev kube-ipvs0 | grep -q 10.96.0.20/32" || { echo "address not repaired"; return 1; }
  # The flushed nat table: the iptables actor's check every 10 s, then a full resync.
  wait_for 20 sh -c "iptables -t nat -S KUBE-SERVICES | grep -q KUBE-CLUSTER-IP" || { echo "nat rules not repaired"; return 1; }
  wait_for 5 sh -c "iptables -t nat -S PREROUTING | grep -q KUBE-SERVICES" || { echo "jump not repaired"; return 1; }
  [ -n "$(http client 192.168.50.2 30080)" ] || { echo "NodePort broken after repair"; return 1; }
  grep -q 'periodic=true' "$LOG" || { echo "no periodic sync logged"; return 1; }
}

write_config() { # write_config SCHEDULER MODE SYNC_PERIOD
  cat >/tmp/kp.yaml <<EOC
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $2
hostnameOverride: node-a
clusterCIDR: 10.244.0.0/16
ipvs:
  scheduler: $1
  syncPeriod: $3
  minSyncPeriod: 0s
  excludeCIDRs: [10.99.0.0/16]
EOC
}

s_sighup_reload() {
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  write_config rr ipvs ${SYNC_PERIOD}s
  local started; started=$(grep -c "sync finished" "$LOG")
  "$BIN" --config /tmp/kp.yaml --manifests "$M" --v 2 >>"$LOG" 2>&1 &
  DAEMON=$!
  wait_for 60 sh -c "[ \$(grep -c 'sync finished' $LOG) -gt $started ]" || { echo "not started with --config: $(tail -3 $LOG)"; return 1; }
  ipvs_has "-A -t 10.96.0.20:80 -s rr" || { echo "not rr: $(ipvsadm -S -n | head -3)"; return 1; }
  # A live change: the scheduler.
  write_config wrr ipvs ${SYNC_PERIOD}s
  kill -HUP "$DAEMON"
  wait_for 15 ipvs_has "-A -t 10.96.0.20:80 -s wrr" || { echo "scheduler not reloaded: $(tail -5 $LOG)"; return 1; }
  # A change that needs a restart: named in the log, left as it was.
  write_config wrr iptables ${SYNC_PERIOD}s
  kill -HUP "$DAEMON"
  wait_for 10 grep -q "need a restart and were not applied.*mode" "$LOG" || { echo "mode change not named: $(tail -5 $LOG)"; return 1; }
  sleep 1
  ipvs_has "-A -t 10.96.0.20:80 -s wrr" || { echo "mode change was applied"; return 1; }
  # An invalid file: refused, the running config stays, the daemon lives on.
  write_config wrr ipvs 30x
  kill -HUP "$DAEMON"
  wait_for 10 grep -q "config reload refused.*syncPeriod" "$LOG" || { echo "bad file not refused by field: $(tail -5 $LOG)"; return 1; }
  kill -0 "$DAEMON" || { echo "daemon died on a bad file"; return 1; }
  rm "$M/np.yaml"
  wait_for 15 ipvs_lacks "10.96.0.35" || { echo "daemon stopped syncing after a refused reload"; return 1; }
  cp "$SRC/np.yaml" "$M/np.yaml"
  wait_for 15 ipvs_has "-A -t 10.96.0.35:80 -s wrr" || return 1
}

s_restart_keeps_connections() {
  coproc KEEP { in_ns cpod socat - TCP4:10.96.0.20:7000; }
  echo one >&"${KEEP[1]}"
  local line; read -r -t 3 line <&"${KEEP[0]}"
  expect "echo before restart" "$line" one || return 1
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  start_daemon
  sleep 2
  wait_for 20 ipvs_has "-A -t 10.96.0.20:80 -s rr" || return 1
  echo two >&"${KEEP[1]}"
  read -r -t 3 line <&"${KEEP[0]}"
  expect "echo after restart" "$line" two || return 1
  exec {KEEP[1]}>&-
  kill "$KEEP_PID" 2>/dev/null; wait "$KEEP_PID" 2>/dev/null
  return 0
}

iptables_mode_rules() { { iptables-save; ip6tables-save; } | grep -E 'KUBE-SVC-|KUBE-SEP-|KUBE-NODEPORTS|KUBE-EXTERNAL-SERVICES'; }
iptables_mode_gone() { ! iptables_mode_rules >/dev/null; }
s_switch_modes() {
  # IPVS mode -> iptables mode: IPVS mode's state goes, iptables mode serves.
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  # (A 1 s drain: what earlier scenarios' connections left in IPVS goes.)
  "$BIN" --proxy-mode iptables --manifests "$M" --hostname-override node-a \
    --cluster-cidr 10.244.0.0/16 --iptables-min-sync-period 0s --ipvs-switch-drain-timeout 1s --v 2 >>"$LOG" 2>&1 &
  DAEMON=$!
  wait_for 30 sh -c 'iptables-save -t nat | grep -q KUBE-SVC-' || { echo "iptables mode never synced: $(tail -5 $LOG)"; return 1; }
  wait_for 15 sh -c '[ -z "$(ipvsadm -S -n)" ]' || { echo "virtual servers left: $(ipvsadm -S -n | head -3)"; return 1; }
  wait_for 5 sh -c '! ip link show kube-ipvs0' || { echo "kube-ipvs0 left"; return 1; }
  ! ipset list -n | grep -q '^KUBE-' || { echo "sets left: $(ipset list -n | tr '\n' ' ')"; return 1; }
  ! iptables-save | grep -qE 'KUBE-NODE-PORT |KUBE-LOAD-BALANCER|KUBE-IPVS-FILTER' || { echo "IPVS mode's chains left"; return 1; }
  local got; got=$(distinct 20 http cpod 10.96.0.20 80)
  expect "iptables mode: backends reached" "$got" "pod1 pod2 remote1 " || return 1
  # ... and back: iptables mode's chains go, IPVS serves again.
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  SYNC_PERIOD=120 start_daemon
  wait_for 30 ipvs_has "-A -t 10.96.0.20:80 -s rr" || { echo "IPVS mode never synced: $(tail -5 $LOG)"; return 1; }
  # iptables mode's chains go once IPVS mode's first sync is in, in each
  # family; the virtual servers show before that sync ends (the iptables
  # actor's restore takes longest), so wait for the removal.
  wait_for 30 iptables_mode_gone || { echo "iptables mode's chains left: $(iptables_mode_rules | head -3)"; return 1; }
  got=$(distinct 20 http cpod 10.96.0.20 80)
  expect "IPVS mode: backends reached" "$got" "pod1 pod2 remote1 " || return 1
  # The canary (syncPeriod is 2 min now): deleting it is seen by the iptables
  # actor's 10 s check, which has the coordinator resync in full.
  local before; before=$(grep -c 'drift detected' "$LOG")
  iptables -t filter -X KUBE-PROXY-CANARY
  wait_for 15 sh -c "[ \$(grep -c 'drift detected' $LOG) -gt $before ]" || { echo "canary loss not reported"; return 1; }
  wait_for 10 iptables -t filter -S KUBE-PROXY-CANARY || { echo "canary not restored"; return 1; }
}

s_cleanup() {
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  "$BIN" --cleanup --proxy-mode ipvs >>"$LOG" 2>&1 || { echo "--cleanup failed: $(tail -3 $LOG)"; return 1; }
  local left; left=$(ipvsadm -S -n | grep -v 10.99.0.1)
  expect "virtual servers left" "$left" "" || return 1
  ! ip link show kube-ipvs0 >/dev/null 2>&1 || { echo "kube-ipvs0 left"; return 1; }
  ! ipset list -n | grep -q '^KUBE-' || { echo "sets left: $(ipset list -n | tr '\n' ' ')"; return 1; }
  # KUBE-FIREWALL and its jumps are kubelet's (iptables mode ensured them): upstream's cleanup keeps them too.
  local rules; rules=$(iptables-save | grep 'KUBE-' | grep -v 'KUBE-FIREWALL')
  expect "rules left" "$rules" "" || return 1
  rules=$(ip6tables-save | grep 'KUBE-' | grep -v 'KUBE-FIREWALL')
  expect "IPv6 rules left" "$rules" ""
}

diff_run() { # diff_run MANIFESTS MODE [--diff]: the dry run with the daemon's flags
  "$BIN" --dry-run ${3:-} --proxy-mode "$2" --manifests "$1" --hostname-override node-a \
    --cluster-cidr 10.244.0.0/16 --ipvs-exclude-cidrs 10.99.0.0/16 2>>"$LOG"
}
sect() { awk -v h="$1" '$0 == h {on = 1; next} /^# / {on = 0} on'; }
summary_has() { # summary_has TEXT LINE-PREFIX WANT: the summary line for a section
  local got; got=$(echo "$1" | sed -n '/^# summary$/,$p' | grep "^$2: ")
  [ "$got" = "$2: $3" ] || { echo "summary '$2': got '$got', want '$3'"; return 1; }
}
s_dry_run_diff() {
  # On a clean node (the daemon stopped, --cleanup run; again here when run
  # alone): the state a node running upstream's IPVS mode holds, written by
  # the tools (ipvsadm -R, ipset restore, ip addr, iptables-restore) from the
  # dry run's own upstream-format sections, both families.
  if [ -n "${DAEMON:-}" ]; then kill -TERM "$DAEMON" 2>/dev/null; wait "$DAEMON" 2>/dev/null; fi
  "$BIN" --cleanup >>"$LOG" 2>&1
  flows_service
  local plan; plan=$(diff_run "$M" ipvs) || { echo "dry run failed: $(tail -3 $LOG)"; return 1; }
  ip link add kube-ipvs0 type dummy
  local fam sfx
  for sfx in "" " ipv6"; do
    echo "$plan" | sect "# ipvs$sfx" | ipvsadm -R || { echo "ipvsadm -R$sfx failed"; return 1; }
    echo "$plan" | sect "# ipset$sfx" | ipset restore || { echo "ipset restore$sfx failed"; return 1; }
    for a in $(echo "$plan" | sect "# addresses kube-ipvs0$sfx"); do
      case $a in *:*) ip addr add "$a/128" dev kube-ipvs0 nodad ;; *) ip addr add "$a/32" dev kube-ipvs0 ;; esac
    done
  done
  echo "$plan" | sect "# iptables" | iptables-restore --noflush || { echo "iptables-restore failed"; return 1; }
  echo "$plan" | sect "# iptables ipv6" | ip6tables-restore --noflush || { echo "ip6tables-restore failed"; return 1; }
  local before; before=$(ipvsadm -S -n; ipset save; ip -o addr show dev kube-ipvs0; iptables-save | grep -v '^#')
  # The same objects in the same mode: nothing to add or remove in any section.
  local same; same=$(diff_run "$M" ipvs --diff) || { echo "--diff failed: $(tail -3 $LOG)"; return 1; }
  # (conntrack: entries earlier scenarios left may well be stale for this plan.)
  local bad; bad=$(echo "$same" | sed -n '/^# summary$/,$p' | grep -v '^# summary$' | grep -v '^conntrack' | grep -v ': 0 to add, 0 to remove,')
  expect "sections that would change" "$bad" "" || { echo "$same" | head -40; return 1; }
  summary_has "$same" "ipvs" "0 to add, 0 to remove, $(echo "$plan" | sect "# ipvs" | wc -l) kept" || return 1
  # One endpoint of echo gone (whichever earlier scenarios left first):
  # exactly its real server removed (and its KUBE-LOOP-BACK member if local).
  rm -rf /tmp/m-diff; cp -r "$M" /tmp/m-diff
  local ip; ip=$(grep -o '"10\.244\.[0-9]*\.[0-9]*"' /tmp/m-diff/echo.yaml | head -1 | tr -d '"')
  [ -n "$ip" ] || { echo "echo.yaml has no endpoint left"; return 1; }
  sed -i "/- addresses: \[\"$ip\"\]/,+2d" /tmp/m-diff/echo.yaml
  local one removed; one=$(diff_run /tmp/m-diff ipvs --diff)
  removed=$(echo "$one" | grep '^-')
  echo "$removed" | grep -qxF -- "--a -u 10.96.0.30:5000 -r $ip:5000 -m -w 1" || { echo "removed: got '$removed' for $ip"; return 1; }
  expect "removals naming other addresses" "$(echo "$removed" | grep -vF -- "$ip")" "" || return 1
  expect "added" "$(echo "$one" | grep -c '^+')" 0 || return 1
  # A switch to iptables mode: IPVS mode's servers, sets, addresses and chains go.
  local sw; sw=$(diff_run "$M" iptables --diff)
  echo "$sw" | grep -q '^# IPVS mode.s virtual servers: removed by the switch' || { echo "$sw" | head; return 1; }
  echo "$sw" | grep -qx -- '--A -t 10.96.0.20:80 -s rr' || { echo "no VS removal"; return 1; }
  echo "$sw" | grep -q -- '^-create KUBE-CLUSTER-IP' || { echo "no set removal"; return 1; }
  echo "$sw" | grep -qx -- '-10.96.0.20' || { echo "no address removal"; return 1; }
  echo "$sw" | grep -qx -- '-:KUBE-LOAD-BALANCER' || { echo "no chain removal"; return 1; }
  echo "$sw" | grep -q -- '^+:KUBE-SVC-' || { echo "no iptables-mode chains"; return 1; }
  # Read-only: the kernel state is as the tools left it.
  local after; after=$(ipvsadm -S -n; ipset save; ip -o addr show dev kube-ipvs0; iptables-save | grep -v '^#')
  [ "$before" = "$after" ] || { echo "the preview changed the kernel state"; return 1; }
  # Take-over and mode change at once: from that state, which no daemon of
  # ours wrote, to our nftables mode under traffic; nothing may fail.
  DAEMON=
  switch_under_flows ipvs nftables || return 1
  kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null
  "$BIN" --cleanup >>"$LOG" 2>&1
}

# ------------------------------------------------------------ dual-stack ----
# IPv6 beside the IPv4 lab: the node and the client on fd00:50::/64, pod1 and
# pod2 at fd00:244::11/12 (host routes, as their IPv4 addresses), each
# answering its name on TCP 9090 and UDP 9091 in both families.
dual_topology() {
  sysctl -qw net.ipv6.conf.all.forwarding=1
  ip -6 addr add fd00:50::2/64 dev lan0 nodad
  in_ns client ip -6 addr add fd00:50::10/64 dev eth0 nodad
  in_ns client ip -6 route add default via fd00:50::2
  local p n
  for p in pod1:11 pod2:12; do
    n=${p#*:}; p=${p%:*}
    in_ns "$p" ip -6 addr add "fd00:244::$n/128" dev eth0 nodad
    ip -6 addr add fd00:244::1/128 dev "v$p" nodad 2>/dev/null
    ip -6 route add "fd00:244::$n/128" dev "v$p"
    in_ns "$p" ip -6 route add fd00:244::1/128 dev eth0
    in_ns "$p" ip -6 route add default via fd00:244::1
    in_ns "$p" socat TCP4-LISTEN:9090,bind=10.244.0.$n,reuseaddr,fork "SYSTEM:echo $p" &
    in_ns "$p" socat "TCP6-LISTEN:9090,bind=[fd00:244::$n],reuseaddr,fork" "SYSTEM:echo $p" &
    udp_name_server "$p" 4 "10.244.0.$n" "$p"
    udp_name_server "$p" 6 "[fd00:244::$n]" "$p"
  done
  sleep 0.5
}
# udp_name_server NS FAM ADDR NAME: answers every datagram to ADDR:9091 with
# NAME. One process per flow (UDP-LISTEN's fork connects the child to the
# sender) reads every datagram of its flow and answers each line of it; it
# ends after 30 s without one. (A RECVFROM fork child answers one datagram
# and exits: a datagram of the same flow that arrives while it ends is read
# by it and goes unanswered, or its write hits the exited echo's pipe.)
udp_name_server() {
  in_ns "$1" socat -T30 "UDP$2-LISTEN:9091,bind=$3,reuseaddr,fork" "SYSTEM:while read -r _; do echo $4; done" &
}
at() { # at NS CMD...: in NS, or on the node itself for NS "node"
  local ns=$1; shift
  if [ "$ns" = node ]; then "$@"; else in_ns "$ns" "$@"; fi
}
tcp_name() { # tcp_name NS ADDR PORT (ADDR bracketed for IPv6) -> the answering pod
  local fam=TCP4; case $2 in \[*) fam=TCP6 ;; esac
  at "$1" timeout 4 socat -t2 -T3 - "$fam:$2:$3" </dev/null 2>/dev/null | tr -d '\r'
}
udp_name() { # udp_name NS ADDR PORT [SRCPORT] -> the answering pod
  local fam=UDP4 sp=${4:+,sourceport=$4}; case $2 in \[*) fam=UDP6 ;; esac
  echo x | at "$1" timeout 3 socat -T1 - "$fam:$2:$3$sp" 2>/dev/null | tr -d '\r'
}

s_dual_stack() {
  dual_topology
  grep -q 'dual-stack mode' "$LOG" || { echo "the daemon is not dual-stack: $(grep -m3 -i 'stack\|support for' $LOG)"; return 1; }
  cp /scenarios/dual/dual.yaml "$M/"
  wait_for 15 ipvs_has "-A -t [fd00:96::30]:80" || { echo "no IPv6 virtual server: $(ipvsadm -S -n | grep fd00)"; return 1; }
  wait_for 10 ipvs_has "-a -t [fd00:96::31]:80 -r [fd00:244::11]:9090" || { echo "no IPv6-only service"; return 1; }
  local to ns got
  for ns in client node; do
    for to in 10.96.0.130:80 "[fd00:96::30]:80" 192.168.50.2:30300 "[fd00:50::2]:30300"; do
      got=$(distinct 16 tcp_name "$ns" "${to%:*}" "${to##*:}")
      expect "TCP from $ns to $to" "$got" "pod1 pod2 " || return 1
    done
  done
  got=$(distinct 12 udp_name client "[fd00:96::30]" 81)
  expect "UDP from client to [fd00:96::30]:81" "$got" "pod1 pod2 " || return 1
  got=$(distinct 12 udp_name client "[fd00:50::2]" 30301)
  expect "UDP from client to [fd00:50::2]:30301" "$got" "pod1 pod2 " || return 1
  got=$(distinct 8 tcp_name client "[fd00:96::31]" 80)
  expect "IPv6-only service" "$got" "pod1 " || return 1
  # Kernel state of the IPv6 proxier, beside the IPv4 one's.
  ip -6 addr show dev kube-ipvs0 | grep -q 'fd00:96::30/128' || { echo "no IPv6 address on kube-ipvs0"; return 1; }
  ! ip -6 addr show dev kube-ipvs0 | grep -q tentative || { echo "tentative: $(ip -6 addr show dev kube-ipvs0)"; return 1; }
  ip addr show dev kube-ipvs0 | grep -q '10.96.0.130/32' || { echo "IPv4 address missing"; return 1; }
  ipset list -t KUBE-6-CLUSTER-IP | grep -q 'family inet6' || { echo "no KUBE-6-CLUSTER-IP inet6: $(ipset list -n | tr '\n' ' ')"; return 1; }
  ipset list KUBE-6-CLUSTER-IP | grep -q 'fd00:96::30,tcp:80' || { echo "no member: $(ipset list KUBE-6-CLUSTER-IP)"; return 1; }
  ! ipset list KUBE-CLUSTER-IP | grep -q 'fd00' || { echo "IPv6 in the IPv4 set"; return 1; }
  ip6tables-save -t nat | grep -q -- '-A KUBE-SERVICES .*KUBE-6-CLUSTER-IP' || { echo "no ip6tables rules: $(ip6tables-save -t nat | head -20)"; return 1; }
  ! iptables-save | grep -q 'KUBE-6-' || { echo "IPv6 sets in iptables"; return 1; }
}

s_dual_stack_udp_flow_moves() {
  local first second ip
  first=$(udp_name client "[fd00:96::30]" 81 40600)
  [ -n "$first" ] || first=$(udp_name client "[fd00:96::30]" 81 40600)
  [ -n "$first" ] || { echo "no UDP reply"; return 1; }
  [ "$(udp_name client "[fd00:96::30]" 81 40600)" = "$first" ] || { echo "flow not sticky before the change"; return 1; }
  case $first in pod1) ip=fd00:244::11 ;; pod2) ip=fd00:244::12 ;; esac
  sed -i "/- addresses: \[\"$ip\"\]/,+2d" "$M/dual.yaml"
  wait_for 10 ipvs_lacks "-a -u [fd00:96::30]:81 -r [$ip]:9091" || { echo "real server $ip kept"; return 1; }
  second=$(udp_name client "[fd00:96::30]" 81 40600)
  [ -n "$second" ] || second=$(udp_name client "[fd00:96::30]" 81 40600)
  [ -n "$second" ] && [ "$second" != "$first" ] || { echo "flow stayed on '$first' (now '$second')"; return 1; }
  # IPv4 untouched.
  got=$(distinct 12 tcp_name client 10.96.0.130 80)
  expect "IPv4 side after the IPv6 change" "$got" "pod1 pod2 "
}

# ------------------------------------------------- switches under traffic ----
# From the client, in both families, through ClusterIPs (dual/flows.yaml,
# dual/dual.yaml) while the daemon restarts in another mode: a long-lived TCP
# echo flow (a numbered line every 0.3 s, each echoed), a UDP flow (one
# socket, a datagram every 0.3 s, the same pod answering each) and a new
# TCP connection every 0.1 s (0.1 s after the previous one answered).
# Every failure is a line in $FLOWS/fail.
export FLOWS
DRAIN=30
# One probe, run in the client's namespace: probe.sh udp FAM ADDR (a UDP
# flow: one socket, a datagram every 0.3 s, each answer awaited 5 s) or
# probe.sh new FAM ADDR (a new TCP connection every 0.1 s, reading the
# answering pod's name without closing first).
cat >/tmp/probe.sh <<'PROBE'
kind=$1 fam=$2 addr=$3 dir=$FLOWS
paused() { while [ -e "$dir/pause" ]; do sleep 0.2; done; }
if [ "$kind" = udp ]; then
  exec 5<>"/dev/udp/$addr/5000"
  while [ ! -e "$dir/stop" ]; do
    # One read takes one whole datagram (bash's read would take one byte of each).
    got=$(echo x >&5 && timeout 5 dd bs=512 count=1 <&5 2>/dev/null | tr -d '\r\n')
    got=${got:-NONE}
    echo "$(date +%T) $got" >>"$dir/udp$fam.log"; echo "$got" >>"$dir/udp$fam"
    sleep 0.3; paused
  done
else
  while [ ! -e "$dir/stop" ]; do
    got=NONE
    { read -r -t 5 got <&6; } 6<>"/dev/tcp/$addr/80"
    echo "$(date +%T) $got" >>"$dir/new$fam.log"; echo "$got" >>"$dir/new$fam"
    [ "$got" != NONE ] || echo "new TCP$fam connection failed at $(date +%T)" >>"$dir/fail"
    sleep 0.1; paused
  done
fi
PROBE
flows_start() { # flows_start NAME: the flows, their files in /tmp/flows-NAME
  FLOWS=/tmp/flows-$1; rm -rf "$FLOWS"; mkdir -p "$FLOWS"; : >"$FLOWS/fail"
  local fam vip
  for fam in 4 6; do
    vip=10.96.0.140
    [ $fam = 6 ] && vip="[fd00:96::40]"
    ( i=0
      while [ ! -e "$FLOWS/stop" ]; do i=$((i + 1)); echo "$i" || exit; echo "$i" >"$FLOWS/tcp$fam.sent"; sleep 0.3; done
      touch "$FLOWS/tcp$fam.done"
    ) 2>/dev/null | in_ns client socat -t3 - "TCP$fam:$vip:7000" >"$FLOWS/tcp$fam.echo" 2>>"$FLOWS/fail" &
  done
  in_ns client bash /tmp/probe.sh udp 4 10.96.0.140 &
  in_ns client bash /tmp/probe.sh udp 6 fd00:96::40 &
  in_ns client bash /tmp/probe.sh new 4 10.96.0.130 &
  in_ns client bash /tmp/probe.sh new 6 fd00:96::30 &
}
flows_stop() { # stops the flows; prints what failed and returns 1 if anything did
  say "$(date +%T) stopping the flows"
  touch "$FLOWS/stop"; sleep 10
  local fam sent echoed answers
  for fam in 4 6; do
    sent=$(cat "$FLOWS/tcp$fam.sent" 2>/dev/null)
    echoed=$(grep -c . "$FLOWS/tcp$fam.echo")
    [ -e "$FLOWS/tcp$fam.done" ] && [ "$sent" = "$echoed" ] && [ "$(tail -1 "$FLOWS/tcp$fam.echo")" = "$sent" ] \
      || echo "TCP$fam flow: $sent lines sent, $echoed echoed, writer done: $([ -e "$FLOWS/tcp$fam.done" ] && echo yes || echo no)" >>"$FLOWS/fail"
    # The UDP flow: one pod answers every datagram, before, during and after the switch.
    answers=$(grep -v NONE "$FLOWS/udp$fam" | sort -u | tr '\n' ' ')
    [ "$(echo $answers | wc -w)" = 1 ] || echo "UDP$fam flow answered by: '$answers'" >>"$FLOWS/fail"
    ! grep -q NONE "$FLOWS/udp$fam" \
      || echo "UDP$fam flow: $(grep -c NONE "$FLOWS/udp$fam") datagrams unanswered, given up at $(grep NONE "$FLOWS/udp$fam.log" | cut -d' ' -f1 | tr '\n' ' ')" >>"$FLOWS/fail"
    say "flows IPv$fam: TCP $echoed of $sent echoed; UDP $(grep -vc NONE "$FLOWS/udp$fam") of $(wc -l <"$FLOWS/udp$fam") answered, by $answers; $(wc -l <"$FLOWS/new$fam") new connections"
  done
  [ "$(wc -l <"$FLOWS/new4")" -ge 10 ] || echo "too few new connections tried: $(wc -l <"$FLOWS/new4")" >>"$FLOWS/fail"
  if [ -s "$FLOWS/fail" ]; then
    cat "$FLOWS/fail"; say "$(wc -l <"$FLOWS/fail") failures, the first: $(head -3 "$FLOWS/fail" | tr '\n' ';')"
    return 1
  fi
}
start_mode() { # start_mode MODE: the daemon in MODE (IPVS: start_daemon's flags)
  if [ "$1" = ipvs ]; then start_daemon; return; fi
  "$BIN" --proxy-mode "$1" --manifests "$M" --hostname-override node-a --cluster-cidr 10.244.0.0/16 \
    --iptables-min-sync-period 0s --ipvs-switch-drain-timeout ${DRAIN}s --v 2 >>"$LOG" 2>&1 &
  DAEMON=$!
}
metric() { wget -q -O - http://127.0.0.1:10249/metrics 2>/dev/null | grep -F -- "$1"; }
switch_under_flows() { # switch_under_flows FROM TO: restart the daemon from FROM mode in TO mode; nothing may fail
  local from=$1 to=$2 before servers
  servers=$(ipvsadm -S -n | grep -c '^-A')
  flows_start "$from-$to-${RANDOM}"; sleep 3
  if [ "$from" = ipvs ]; then
    # The preview names the drain and the flows' virtual servers it waits for
    # (the flows paused meanwhile: the dry run keeps the TCG guest busy).
    touch "$FLOWS/pause"
    local preview; preview=$(diff_run "$M" "$to" --diff)
    rm -f "$FLOWS/pause"
    echo "$preview" | grep -q "^then: drain IPVS mode's virtual servers" || { flows_stop; echo "no drain step: $(echo "$preview" | head -8)"; return 1; }
    echo "$preview" | grep -q "^  drains: -t 10.96.0.140:7000 ([1-9][0-9]* connections)" \
      || { flows_stop; echo "the flow's server not listed: $(echo "$preview" | grep -A3 'then: drain')"; return 1; }
  fi
  say "$(date +%T) switching from $from to $to mode"
  if [ -n "${DAEMON:-}" ]; then kill -TERM "$DAEMON"; wait "$DAEMON" 2>/dev/null; fi
  before=$(grep -c 'sync finished' "$LOG")
  start_mode "$to"
  wait_for 60 sh -c "[ \$(grep -c 'sync finished' $LOG) -gt $before ]" || { flows_stop; echo "$to mode never synced: $(tail -5 $LOG)"; return 1; }
  sleep 4
  say "$(date +%T) $to mode synced"
  if [ "$from" = ipvs ]; then
    # Draining: the flows' virtual servers and addresses stay, those without connections went.
    local bad=""
    ipvs_has "-A -t 10.96.0.140:7000" || bad="$bad; the TCP flow's virtual server went"
    ipvs_has "-A -u [fd00:96::40]:5000" || bad="$bad; the IPv6 UDP flow's virtual server went"
    ip addr show dev kube-ipvs0 2>/dev/null | grep -q '10.96.0.140/32' || bad="$bad; the flow's address went"
    [ "$(ipvsadm -S -n | grep -c '^-A')" -lt "$servers" ] || bad="$bad; no idle virtual server went ($servers)"
    grep -q "draining IPVS mode's virtual servers" "$LOG" || bad="$bad; no drain logged"
    metric 'kube_proxy_rs_mode_switch_draining{mode="ipvs",ip_family="IPv4"} 1' >/dev/null || bad="$bad; metric: $(metric mode_switch)"
    [ "$(metric 'kube_proxy_rs_mode_switch_remaining_connections{mode="ipvs",ip_family="IPv6"}' | awk '{print $2}')" -gt 0 ] \
      || bad="$bad; no IPv6 connections counted: $(metric mode_switch)"
    wget -q -O - http://127.0.0.1:10249/dashboard/data 2>/dev/null | grep -q '"draining":true' || bad="$bad; not on the dashboard"
    if [ -n "$bad" ]; then flows_stop; echo "while draining$bad"; return 1; fi
  fi
  flows_stop || { echo "$from -> $to"; return 1; }
  [ "$from" = ipvs ] || return 0
  # The drain ends at its timeout (the closed flows linger in IPVS's TIME_WAIT), then IPVS mode's state goes.
  wait_for $((DRAIN + 20)) sh -c '[ -z "$(ipvsadm -S -n)" ]' || { echo "virtual servers left: $(ipvsadm -S -n | head -3)"; return 1; }
  wait_for 10 sh -c '! ip link show kube-ipvs0' || { echo "kube-ipvs0 left"; return 1; }
  wait_for 10 sh -c '! ipset list -n | grep -q "^KUBE-"' || { echo "sets left: $(ipset list -n | tr '\n' ' ')"; return 1; }
  wait_for 10 sh -c '! iptables-save | grep -qE "KUBE-LOAD-BALANCER|KUBE-IPVS-FILTER"' || { echo "IPVS mode's chains left"; return 1; }
  grep -q "IPVS mode's drain timed out" "$LOG" || { echo "no timeout logged"; return 1; }
  metric 'kube_proxy_rs_mode_switch_draining{mode="ipvs",ip_family="IPv4"} 0' >/dev/null || { echo "metric after: $(metric mode_switch)"; return 1; }
}
flows_service() { # the flows' service and the pods' IPv6 echo (once; after s_dual_stack's topology)
  [ -e "$M/flows.yaml" ] && return 0
  cp /scenarios/dual/flows.yaml "$M/"
  local p n
  for p in pod1:11 pod2:12; do
    n=${p#*:}; p=${p%:*}
    in_ns "$p" socat "TCP6-LISTEN:7000,bind=[fd00:244::$n],reuseaddr,fork" PIPE &
  done
}
s_switch_under_traffic() {
  flows_service
  wait_for 15 ipvs_has "-A -t [fd00:96::40]:7000" || { echo "no flows service"; return 1; }
  switch_under_flows ipvs nftables || return 1
  switch_under_flows nftables ipvs || return 1
  switch_under_flows ipvs iptables || return 1
  switch_under_flows iptables ipvs
}

# ----------------------------------------------------------------- main ----
say "kernel $(uname -r)"
mkdir -p "$M" && cp "$SRC"/*.yaml "$M"/
topology
run takeover-start s_takeover_start
if [ ${#FAILED[@]} -eq 0 ]; then
  run clusterip-tcp-every-backend s_clusterip_tcp
  run clusterip-udp-every-backend s_clusterip_udp
  run hairpin s_hairpin
  run nodeport-on-node-ip s_nodeport
  run lb-ingress-ip s_load_balancer
  run lb-source-ranges s_source_ranges
  run external-ip s_external_ip
  run dual-stack-both-families s_dual_stack
  run dual-stack-ipv6-udp-flow-moves s_dual_stack_udp_flow_moves
  run client-ip-affinity s_affinity
  run per-service-scheduler-sh-mh-stick-rr-spreads s_service_scheduler
  run scheduler-change-keeps-established-tcp s_scheduler_change_live
  run local-policy-no-local-endpoint-drops s_local_policy_without_local_endpoint
  run no-endpoints-refused s_no_endpoints
  run udp-flow-moves-after-endpoint-removal s_udp_flow_moves
  run service-deleted-leaves-nothing s_service_deleted
  run udp-service-deleted-conntrack-entries-go s_udp_service_deleted_entries_go
  run graceful-termination s_graceful_termination
  run drift-repaired-within-sync-period s_drift_repaired
  run sighup-reload s_sighup_reload
  run restart-keeps-established-tcp s_restart_keeps_connections
  run switch-modes-under-traffic-drops-nothing s_switch_under_traffic
  run switch-modes-cleans-the-other-modes-state s_switch_modes
  run cleanup-removes-everything s_cleanup
  run dry-run-diff-previews-the-first-sync s_dry_run_diff
fi
[ -d /out ] && cp -r "$LOG" /tmp/flows-* /out/ 2>/dev/null
say "daemon log (last 30 lines):"
tail -30 "$LOG"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED SCENARIOS: ${FAILED[*]}"
  exit 1
fi
echo "ALL SCENARIOS PASSED"
