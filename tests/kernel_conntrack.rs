//! `NetlinkConntrack` against the real kernel: a reconcile deletes exactly
//! the stale UDP entries of its family's table, and nothing else.
//!
//! Conntrack tables are per network namespace, so every test works in one it
//! creates (`ip netns add`, removed on drop) and sends traffic only there:
//! - setup runs through `ip netns exec`: the node, service and endpoint
//!   addresses go on `lo`, and `iptables`/`ip6tables -t nat -A OUTPUT ...
//!   -j DNAT` rules (one per flow, matched on the client's source port) send
//!   service traffic to an endpoint, so the reply source differs from the
//!   original destination. The nat table also makes the namespace track
//!   connections at all. The UDP timeout is raised to 600 s so entries
//!   cannot expire mid-test;
//! - traffic and the handle run on a thread that first `setns(2)`es into
//!   `/run/netns/NAME` (`Netns::run`/`block_on` in tests/common): the
//!   sockets it opens, the flows' and the handle's netlink socket (on a
//!   current-thread Tokio runtime), live in the namespace, while the rest
//!   of the test binary stays where it was. Chosen over re-exec'ing the
//!   test under `ip netns exec`: a failure reports directly, with its
//!   assertion, and nothing depends on libtest's command line;
//! - the result is read back with `conntrack -L` (conntrack-tools), through
//!   `ip netns exec`.
//!
//! Needs root, iproute2, iptables/ip6tables with the nat table and the
//! conntrack CLI (`.ci/install-deps.sh`); a missing one fails the test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::Netns;
use kube_proxy_rs::kernel::conntrack::NetlinkConntrack;
use kube_proxy_rs::msgs::{Frontends, ReconcileConntrack, Reconciled, ServingFrontends};
use kube_proxy_rs::net::{IpFamily, Protocol};

/// The node's address, the clients' source.
const NODE4: &str = "10.0.0.1";
const NODE6: &str = "fd00::1";

/// One connection: from the node at `sport` to `dst`, DNATed to `to`
/// when set (otherwise answered by `dst` itself).
#[derive(Debug, Clone, Copy)]
struct Flow {
    protocol: Protocol,
    sport: u16,
    dst: SocketAddr,
    to: Option<SocketAddr>,
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn udp(sport: u16, dst: &str, to: &str) -> Flow {
    Flow { protocol: Protocol::Udp, sport, dst: addr(dst), to: (!to.is_empty()).then(|| addr(to)) }
}

fn tcp(sport: u16, dst: &str, to: &str) -> Flow {
    Flow { protocol: Protocol::Tcp, ..udp(sport, dst, to) }
}

/// IPv4 flows. 4000x: ClusterIP 10.96.0.10:53 to a serving and a removed
/// endpoint, and to the serving endpoint's old target port; its port 54 to
/// the same endpoint (another Service port); NodePort 30053 on two node
/// addresses, to the serving and the removed endpoint; a gone frontend
/// (10.96.0.20:53) with and without DNAT, a gone NodePort (30054); a plain
/// flow without NAT; TCP to the ClusterIP.
fn flows_v4() -> Vec<Flow> {
    vec![
        udp(40001, "10.96.0.10:53", "10.244.1.1:5353"),
        udp(40002, "10.96.0.10:53", "10.244.1.2:5353"),
        udp(40003, "10.96.0.10:53", "10.244.1.1:5300"),
        udp(40004, "10.96.0.10:54", "10.244.1.1:5354"),
        udp(40005, "10.0.0.1:30053", "10.244.1.1:5353"),
        udp(40006, "10.0.0.1:30053", "10.244.1.2:5353"),
        udp(40007, "10.0.0.2:30053", "10.244.1.2:5353"),
        udp(40008, "10.96.0.20:53", "10.244.1.1:5353"),
        udp(40009, "10.96.0.20:53", ""),
        udp(40010, "10.0.0.1:30054", "10.244.1.1:5353"),
        udp(40011, "10.96.0.12:53", ""),
        tcp(40012, "10.96.0.10:53", "10.244.1.2:5353"),
    ]
}

/// The IPv4 entries a reconcile with [`frontends`] deletes.
const STALE_V4: [u16; 6] = [40002, 40003, 40006, 40007, 40008, 40010];

/// IPv6 flows: ClusterIP [fd00:96::10]:53 to a serving and a removed
/// endpoint, NodePort 30053 to the removed one, a gone frontend.
fn flows_v6() -> Vec<Flow> {
    vec![
        udp(41001, "[fd00:96::10]:53", "[fd00:244::1]:5353"),
        udp(41002, "[fd00:96::10]:53", "[fd00:244::2]:5353"),
        udp(41003, "[fd00::1]:30053", "[fd00:244::2]:5353"),
        udp(41004, "[fd00:96::20]:53", "[fd00:244::1]:5353"),
    ]
}

/// The IPv6 entries a reconcile with [`frontends`] deletes.
const STALE_V6: [u16; 3] = [41002, 41003, 41004];

/// The reconcile of `family`: ClusterIP 10.96.0.10:53 ([fd00:96::10]:53)
/// and NodePort 30053 served by 10.244.1.1:5353 ([fd00:244::1]:5353),
/// 10.96.0.10:54 by 10.244.1.1:5354; 10.96.0.20:53 ([fd00:96::20]:53) and
/// NodePort 30054 gone.
fn frontends(family: IpFamily) -> ReconcileConntrack {
    let set = |list: &[&str]| Arc::new(list.iter().map(|a| addr(a)).collect::<BTreeSet<SocketAddr>>());
    let eps = set(&["10.244.1.1:5353", "[fd00:244::1]:5353"]);
    let mut serving = ServingFrontends::default();
    serving.ips.insert(addr("10.96.0.10:53"), eps.clone());
    serving.ips.insert(addr("[fd00:96::10]:53"), eps.clone());
    serving.ips.insert(addr("10.96.0.10:54"), set(&["10.244.1.1:5354"]));
    serving.node_ports.insert(30053, eps);
    let mut gone = Frontends::default();
    gone.ips.extend([addr("10.96.0.20:53"), addr("[fd00:96::20]:53")]);
    gone.node_ports.insert(30054);
    ReconcileConntrack { generation: 1, family, serving: Arc::new(serving), gone: Arc::new(gone) }
}

fn sports(flows: &[Flow], protocol: Protocol, except: &[u16]) -> BTreeSet<u16> {
    flows.iter().filter(|f| f.protocol == protocol && !except.contains(&f.sport)).map(|f| f.sport).collect()
}

/// A namespace with the addresses and DNAT rules of `flows`.
struct Lab {
    ns: Netns,
    flows: Vec<Flow>,
}

impl Lab {
    fn new(prefix: &str, flows: Vec<Flow>) -> Lab {
        let lab = Lab { ns: Netns::new(prefix), flows };
        let mut addrs: BTreeSet<IpAddr> = [ip(NODE4), ip(NODE6)].into();
        addrs.extend(lab.flows.iter().flat_map(|f| [Some(f.dst.ip()), f.to.map(|t| t.ip())]).flatten());
        for a in &addrs {
            let cidr = format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
            let mut args = vec!["ip", "addr", "add", &cidr, "dev", "lo"];
            if a.is_ipv6() {
                args.push("nodad");
            }
            lab.exec(&args);
        }
        for f in &lab.flows {
            lab.dnat(f);
        }
        // After the rules: they load nf_conntrack, which brings the sysctl.
        lab.exec(&["sh", "-c", "echo 600 > /proc/sys/net/netfilter/nf_conntrack_udp_timeout"]);
        lab
    }

    fn exec(&self, args: &[&str]) -> String {
        self.ns.ok(args)
    }

    fn dnat(&self, f: &Flow) {
        let Some(to) = f.to else { return };
        let tool = if f.dst.is_ipv4() { "iptables" } else { "ip6tables" };
        let (dst, dport, sport, to) =
            (f.dst.ip().to_string(), f.dst.port().to_string(), f.sport.to_string(), to.to_string());
        let proto = f.protocol.lower();
        self.exec(&[
            tool,
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            proto,
            "-d",
            &dst,
            "--dport",
            &dport,
            "--sport",
            &sport,
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ]);
    }

    /// The table as `conntrack -L` shows it: original source port ->
    /// (original destination, reply source).
    fn table(&self, family: IpFamily, protocol: Protocol) -> BTreeMap<u16, (SocketAddr, IpAddr)> {
        let f = if family == IpFamily::V4 { "ipv4" } else { "ipv6" };
        let out = self.exec(&["conntrack", "-L", "-f", f, "-p", protocol.lower()]);
        out.lines().filter_map(parse_conntrack_line).collect()
    }

    fn sports(&self, family: IpFamily, protocol: Protocol) -> BTreeSet<u16> {
        self.table(family, protocol).into_keys().collect()
    }

    /// Sends every flow (from inside the namespace) and checks that each
    /// has its entry, NATed as planned. Returns the TCP sockets, to keep
    /// those connections established while they live.
    fn start_flows(&self) -> Vec<std::net::TcpStream> {
        let flows = self.flows.clone();
        let streams = self.ns.run(|| flows.iter().filter_map(send).collect());
        for family in [IpFamily::V4, IpFamily::V6] {
            for protocol in [Protocol::Udp, Protocol::Tcp] {
                let table = self.table(family, protocol);
                for f in self.flows.iter().filter(|f| f.protocol == protocol && family.matches(&f.dst.ip())) {
                    let reply_src = f.to.unwrap_or(f.dst).ip();
                    assert_eq!(table.get(&f.sport), Some(&(f.dst, reply_src)), "entry for {f:?} in {table:?}");
                }
            }
        }
        streams
    }

    /// Runs `rc` through a fresh handle, inside the namespace.
    fn reconcile(&self, rc: ReconcileConntrack) -> Applied {
        self.ns.block_on(|| async move {
            let reported = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
            let seen = reported.clone();
            let report = Arc::new(move |_: std::time::Duration, deleted: u64| seen.store(deleted, Ordering::Relaxed));
            let ct = NetlinkConntrack::new().expect("ctnetlink socket").with_report(report);
            let done = ct.clean_stale(&rc).await.expect("the reconcile succeeds");
            // What the reconciler metrics are fed: the entries this reconcile deleted.
            assert_eq!(reported.load(Ordering::Relaxed), ct.entries_deleted(), "the reconcile is reported");
            assert_eq!(done.deleted, ct.entries_deleted());
            Applied { messages: ct.messages_sent(), datagrams: ct.datagrams_sent(), done }
        })
    }
}

/// What one reconcile did and cost.
#[derive(Debug, PartialEq, Eq)]
struct Applied {
    messages: u64,
    datagrams: u64,
    done: Reconciled,
}

/// `udp 17 599 src=A dst=B sport=P dport=Q [UNREPLIED] src=C dst=A sport=...`:
/// the first src/dst/sport/dport are the original direction, the second
/// `src=` is the reply's source.
fn parse_conntrack_line(line: &str) -> Option<(u16, (SocketAddr, IpAddr))> {
    let values = |key: &str| -> Vec<&str> { line.split_whitespace().filter_map(|t| t.strip_prefix(key)).collect() };
    let (src, dst, sport, dport) = (values("src="), values("dst="), values("sport="), values("dport="));
    let orig_dst = SocketAddr::new(dst.first()?.parse().ok()?, dport.first()?.parse().ok()?);
    Some((sport.first()?.parse().ok()?, (orig_dst, src.get(1)?.parse().ok()?)))
}

/// Sends one flow from the current thread's namespace; a TCP flow's
/// established stream is returned.
fn send(f: &Flow) -> Option<std::net::TcpStream> {
    let node = if f.dst.is_ipv4() { ip(NODE4) } else { ip(NODE6) };
    let local = SocketAddr::new(node, f.sport);
    match f.protocol {
        Protocol::Udp => {
            let sock = UdpSocket::bind(local).unwrap_or_else(|e| panic!("bind {local}: {e}"));
            sock.send_to(b"ping", f.dst).unwrap_or_else(|e| panic!("send {f:?}: {e}"));
            None
        }
        _ => {
            let server = f.to.unwrap_or(f.dst);
            let listener = TcpListener::bind(server).unwrap_or_else(|e| panic!("listen {server}: {e}"));
            let sock = tokio::net::TcpSocket::new_v4().expect("tcp socket");
            sock.bind(local).unwrap_or_else(|e| panic!("bind {local}: {e}"));
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            let stream = rt.block_on(sock.connect(f.dst)).unwrap_or_else(|e| panic!("connect {f:?}: {e}"));
            let _accepted = listener.accept().expect("accept");
            Some(stream.into_std().expect("std stream"))
        }
    }
}

/// Reconciles the lab of `flows` for `family` and checks that exactly the
/// `stale` UDP entries went: TCP entries and the other family's table stay.
fn check(prefix: &str, family: IpFamily, stale: &[u16]) -> Applied {
    let mut flows = flows_v4();
    flows.extend(flows_v6());
    let lab = Lab::new(prefix, flows.clone());
    let _tcp = lab.start_flows();
    let applied = lab.reconcile(frontends(family));
    let left = |family, protocol| lab.sports(family, protocol);
    let (v4_gone, v6_gone): (&[u16], &[u16]) = if family == IpFamily::V4 { (stale, &[]) } else { (&[], stale) };
    assert_eq!(left(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, v4_gone), "IPv4 UDP entries left");
    assert_eq!(left(IpFamily::V4, Protocol::Tcp), sports(&flows_v4(), Protocol::Tcp, &[]), "IPv4 TCP entries left");
    assert_eq!(left(IpFamily::V6, Protocol::Udp), sports(&flows_v6(), Protocol::Udp, v6_gone), "IPv6 UDP entries left");
    assert_eq!(applied.done.deleted, stale.len() as u64, "{applied:?}");
    applied
}

/// Upstream's rule, by address and port and target-port aware (entries to
/// a removed endpoint, to the serving endpoint's old target port, not
/// DNATed to an endpoint; to the NodePort on any address), and the gone
/// frontends' DNATed entries: one dump, then the deletes in one datagram.
#[test]
fn a_reconcile_deletes_the_stale_udp_entries_and_nothing_else() {
    let applied = check("ct-v4", IpFamily::V4, &STALE_V4);
    assert_eq!((applied.messages, applied.datagrams), (1 + STALE_V4.len() as u64, 2));
    assert_eq!(applied.done.udp_entries, 11);
}

#[test]
fn an_ipv6_reconcile_cleans_the_ipv6_table() {
    let applied = check("ct-v6", IpFamily::V6, &STALE_V6);
    assert_eq!(applied.done, Reconciled { udp_entries: 4, deleted: 3 });
}

#[test]
fn a_repeated_reconcile_finds_nothing_and_costs_one_dump() {
    let lab = Lab::new("ct-again", flows_v4());
    let _tcp = lab.start_flows();
    let first = lab.reconcile(frontends(IpFamily::V4));
    assert_eq!(first.done.deleted, STALE_V4.len() as u64);
    let again = lab.reconcile(frontends(IpFamily::V4));
    assert_eq!((again.messages, again.datagrams, again.done.deleted), (1, 1, 0));
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, &STALE_V4));
}

#[test]
fn more_entries_than_one_datagram_holds_go_in_several_batches() {
    let mut flows = flows_v4(); // their DNAT rules make the namespace track
    flows.extend((42000..42150).map(|sport| udp(sport, "10.96.0.10:53", "")));
    let lab = Lab::new("ct-many", flows);
    let _tcp = lab.start_flows();
    let applied = lab.reconcile(frontends(IpFamily::V4));
    // One dump, then 156 deletes in datagrams of 64, 64 and 28.
    assert_eq!((applied.messages, applied.datagrams, applied.done.deleted), (157, 4, 156));
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, &STALE_V4));
}
