#!/bin/bash
# Guest smoke test: proves the VM image has what kube-proxy-rs needs.
#   tests/vm/run-vm-test.sh tests/vm/guest/smoke.sh
# Runs as /test.sh inside the VM (bash, root, initial netns).  Exit 0 = PASS.
#
# Topology (all inside the guest):
#   root netns: kube-ipvs0 (dummy) 10.96.0.10/32 = the ClusterIP
#               veth-be  10.244.1.1/24 <-> backend netns 10.244.1.2 (httpd :8080, UDP echo :9053)
#               veth-cl  10.244.2.1/24 <-> client  netns 10.244.2.2
# busybox pitfalls: wget always with an explicit :port and never -T (1.35
# segfaults); wrap it in `timeout`.  busybox nc has no UDP: socat does UDP.
set -euo pipefail

T0=$EPOCHREALTIME STEP= STEP_T0=
ms() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b-a}'; }
end_step() { [ -z "$STEP" ] || echo "==== ok   $STEP ($(ms "$STEP_T0" "$EPOCHREALTIME")s)"; }
step() { end_step; STEP=$*; STEP_T0=$EPOCHREALTIME; echo "==== step $STEP"; }
fail() { echo "==== FAIL $STEP: $*"; exit 1; }
retry() {  # retry N CMD...: run CMD until it succeeds, N times 0.1 s apart
  local n=$1 i; shift
  for ((i = 0; i < n; i++)); do "$@" && return 0; sleep 0.1; done
  return 1
}

step "kernel $(uname -r): modules loaded by /init"
for m in ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack dummy veth; do
  grep -q "^$m " /proc/modules || fail "module $m not loaded"
done
for t in ip ss genl ipvsadm ipset conntrack nft iptables-legacy iptables-nft socat httpd nc wget; do
  command -v "$t" >/dev/null || fail "missing tool $t"
done
[ "$(readlink -f "$(command -v ip)")" != /bin/busybox ] || fail "ip is busybox's"

step "dummy link kube-ipvs0 with a ClusterIP"
ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
ip link set kube-ipvs0 up    # kube-proxy leaves it DOWN; its addresses are local either way
ip -br addr show kube-ipvs0

step "backend netns behind a veth pair (httpd :8080, socat UDP echo :9053)"
ip netns add backend
ip link add veth-be type veth peer name eth0 netns backend
ip addr add 10.244.1.1/24 dev veth-be
ip link set veth-be up
ip -n backend link set lo up
ip -n backend addr add 10.244.1.2/24 dev eth0
ip -n backend link set eth0 up
ip -n backend route add default via 10.244.1.1
mkdir -p /srv/www
echo hello-from-backend >/srv/www/index.html
ip netns exec backend httpd -p 8080 -h /srv/www
ip netns exec backend socat UDP4-RECVFROM:9053,fork PIPE &
retry 50 ip netns exec backend timeout 2 wget -q -O /dev/null http://127.0.0.1:8080/ || fail "httpd did not start"
[ "$(timeout 5 wget -q -O - http://10.244.1.2:8080/)" = hello-from-backend ] || fail "direct access to the backend"

step "client netns behind a veth pair"
ip netns add client
ip link add veth-cl type veth peer name eth0 netns client
ip addr add 10.244.2.1/24 dev veth-cl
ip link set veth-cl up
ip -n client link set lo up
ip -n client addr add 10.244.2.2/24 dev eth0
ip -n client link set eth0 up
ip -n client route add default via 10.244.2.1
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.ipv4.vs.conntrack=1

step "IPVS: generic netlink family, TCP and UDP virtual services (NAT)"
genl ctrl get name IPVS | grep -m1 "Name: IPVS" || fail "no IPVS generic netlink family"
ipvsadm -A -t 10.96.0.10:80 -s rr
ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m
ipvsadm -A -u 10.96.0.10:53 -s rr
ipvsadm -a -u 10.96.0.10:53 -r 10.244.1.2:9053 -m
ipvsadm -Ln

step "TCP via IPVS from the client netns (forwarded path)"
reply=$(ip netns exec client timeout 5 wget -q -O - http://10.96.0.10:80/) || fail "wget from the client netns"
[ "$reply" = hello-from-backend ] || fail "unexpected reply: $reply"
echo "client -> 10.96.0.10:80 -> $reply"

step "TCP via IPVS from the root netns (node-local path)"
reply=$(timeout 5 wget -q -O - http://10.96.0.10:80/) || fail "wget from the root netns"
[ "$reply" = hello-from-backend ] || fail "unexpected reply: $reply"
echo "root -> 10.96.0.10:80 -> $reply"

step "UDP echo via IPVS from the client netns (socat)"
udp_echo() { ip netns exec client socat -T 2 - UDP4:10.96.0.10:53 <<<"ping-udp-$1"; }
reply=$(retry 3 udp_echo 1) || fail "no UDP reply"
[ "$reply" = ping-udp-1 ] || fail "unexpected UDP reply: $reply"
echo "client -> 10.96.0.10:53/udp -> $reply"
# (ipvsadm --stats lags: the kernel folds its counters in every 2 s; the
# connection table is immediate)
ipvsadm -Lnc
ipvsadm -Lnc | grep -q '^UDP .* 10.96.0.10:53 *10.244.1.2:9053' || fail "no IPVS UDP connection entry"

step "ipset hash:ip,port + iptables -m set (legacy and nft)"
ipset create KUBE-CLUSTER-IP hash:ip,port
ipset add KUBE-CLUSTER-IP 10.96.0.10,tcp:80
ipset create KUBE-LOOP-BACK hash:ip,port,ip
ipset add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2
ipset test KUBE-CLUSTER-IP 10.96.0.10,tcp:80
ipset list -n
for v in legacy nft; do
  # nat OUTPUT (prio -100) sees the ClusterIP before IPVS's LOCAL_OUT hook
  # (-98) rewrites it: that is why kube-proxy matches ClusterIPs in nat.
  iptables-$v-restore --noflush <<'EOR'
*nat
:KUBE-TEST - [0:0]
-A OUTPUT -j KUBE-TEST
-A PREROUTING -j KUBE-TEST
-A POSTROUTING -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE
-A KUBE-TEST -m comment --comment "cluster IPs" -m set --match-set KUBE-CLUSTER-IP dst,dst -j RETURN
COMMIT
EOR
  timeout 5 wget -q -O /dev/null http://10.96.0.10:80/ || fail "$v: wget from the root netns"
  ip netns exec client timeout 5 wget -q -O /dev/null http://10.96.0.10:80/ || fail "$v: wget from the client netns"
  pk=$(iptables-$v -t nat -L KUBE-TEST -n -v -x | awk '/match-set KUBE-CLUSTER-IP/ {print $1}')
  [ "${pk:-0}" -ge 2 ] || fail "$v: the -m set rule matched ${pk:-0} packets, want >= 2"
  echo "iptables-$v: -m set --match-set KUBE-CLUSTER-IP matched $pk packets"
  iptables-$v-restore <<'EOR'
*nat
COMMIT
EOR
done

step "iptables-mode DNAT chains via iptables-restore --noflush (legacy and nft)"
for v in legacy nft; do
  iptables-$v-restore --noflush <<'EOR'
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-TEST - [0:0]
:KUBE-SEP-TEST - [0:0]
:KUBE-MARK-MASQ - [0:0]
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "default/test cluster IP" -m tcp --dport 80 -j KUBE-SVC-TEST
-A KUBE-SVC-TEST -m comment --comment "default/test -> 10.244.1.2:8080" -m statistic --mode random --probability 1.0000000000 -j KUBE-SEP-TEST
-A KUBE-SEP-TEST -s 10.244.1.2/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-TEST -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:8080
COMMIT
*filter
:KUBE-FORWARD - [0:0]
-A FORWARD -j KUBE-FORWARD
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT
COMMIT
EOR
  reply=$(ip netns exec client timeout 5 wget -q -O - http://10.96.0.11:80/) || fail "$v: DNAT wget"
  [ "$reply" = hello-from-backend ] || fail "$v: DNAT reply $reply"
  echo "iptables-$v: client -> 10.96.0.11:80 (DNAT) -> $reply"
  printf '*nat\nCOMMIT\n*filter\nCOMMIT\n' | iptables-$v-restore
done

step "conntrack -L (netlink)"
conntrack -L 2>/dev/null | head -5
n=$(conntrack -L -p tcp --orig-dst 10.96.0.10 2>/dev/null | wc -l)
[ "$n" -gt 0 ] || fail "no conntrack entry for 10.96.0.10"
echo "$n conntrack entries for 10.96.0.10"
conntrack -D -p tcp --orig-dst 10.96.0.11 >/dev/null 2>&1 || fail "conntrack -D"
[ "$(conntrack -L -p tcp --orig-dst 10.96.0.11 2>/dev/null | wc -l)" = 0 ] || fail "entries left after conntrack -D"

step "nftables: set + nat output chain counter (nft -f)"
# A nat chain sees packets only while conntrack is enabled in the netns, i.e.
# while some rule needs it (ct, nat, MASQUERADE...): the `ct state` does that here.
nft -f - <<'EON'
table ip kprs-smoke {
  set cluster-ips { type ipv4_addr; elements = { 10.96.0.10 } }
  chain out {
    type nat hook output priority -100;
    ip daddr @cluster-ips ct state new counter
  }
}
EON
timeout 5 wget -q -O /dev/null http://10.96.0.10:80/ || fail "wget with the nft table"
nft list tables
pk=$(nft list chain ip kprs-smoke out | grep -o 'counter packets [0-9]*' | awk '{print $3}')
[ "${pk:-0}" -gt 0 ] || fail "nft counter did not count"
echo "nft: @cluster-ips counter matched $pk packets"
nft delete table ip kprs-smoke

end_step
echo "SMOKE OK in $(ms "$T0" "$EPOCHREALTIME")s (uptime $(cut -d' ' -f1 /proc/uptime)s)"
