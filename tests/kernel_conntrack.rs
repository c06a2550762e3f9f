//! `NetlinkConntrack` against the real kernel: each op deletes exactly the
//! conntrack entries it names, and nothing else.
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

use common::Netns;
use kube_proxy_rs::kernel::conntrack::NetlinkConntrack;
use kube_proxy_rs::kernel::Subsystem;
use kube_proxy_rs::msgs::ConntrackOp;
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

/// IPv4 flows. 4000x: ClusterIP 10.96.0.10:53 (to two endpoints), another
/// service to the same endpoint, NodePort 30053 on two node addresses,
/// NodePort 30054, a plain flow without NAT, and TCP to the same service.
fn flows_v4() -> Vec<Flow> {
    vec![
        udp(40001, "10.96.0.10:53", "10.244.1.1:5353"),
        udp(40002, "10.96.0.10:53", "10.244.1.2:5353"),
        udp(40003, "10.96.0.11:53", "10.244.1.1:5353"),
        udp(40004, "10.0.0.1:30053", "10.244.1.1:5353"),
        udp(40005, "10.0.0.1:30053", "10.244.1.2:5353"),
        udp(40006, "10.0.0.1:30054", "10.244.1.1:5353"),
        tcp(40007, "10.96.0.10:53", "10.244.1.1:5353"),
        udp(40008, "10.96.0.12:53", ""),
        udp(40009, "10.0.0.2:30053", "10.244.1.2:5353"),
    ]
}

/// IPv6 flows, the same shapes as the first IPv4 ones.
fn flows_v6() -> Vec<Flow> {
    vec![
        udp(41001, "[fd00:96::10]:53", "[fd00:244::1]:5353"),
        udp(41002, "[fd00:96::10]:53", "[fd00:244::2]:5353"),
        udp(41003, "[fd00:96::11]:53", "[fd00:244::1]:5353"),
        udp(41004, "[fd00::1]:30053", "[fd00:244::1]:5353"),
        udp(41005, "[fd00::1]:30054", "[fd00:244::2]:5353"),
    ]
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

    /// Runs `ops` through a fresh handle for `family`, inside the namespace.
    fn apply(&self, family: IpFamily, ops: Vec<ConntrackOp>) -> Applied {
        self.ns.block_on(|| async move {
            let reported = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
            let seen = reported.clone();
            let report =
                std::sync::Arc::new(move |_: std::time::Duration, deleted: u64| seen.store(deleted, Ordering::Relaxed));
            let ct = NetlinkConntrack::new(family).expect("ctnetlink socket").with_report(report);
            let results = ct.apply(ops).await;
            assert!(results.iter().all(Result::is_ok), "every op succeeds: {results:?}");
            // What the reconciler metrics are fed: the entries this batch deleted.
            assert_eq!(reported.load(Ordering::Relaxed), ct.entries_deleted(), "the batch is reported");
            Applied { messages: ct.messages_sent(), datagrams: ct.datagrams_sent(), deleted: ct.entries_deleted() }
        })
    }
}

/// What one `apply` cost.
#[derive(Debug, PartialEq, Eq)]
struct Applied {
    messages: u64,
    datagrams: u64,
    deleted: u64,
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

fn flush_service_ip(ip_: &str, protocol: Protocol) -> ConntrackOp {
    ConntrackOp::FlushServiceIp { ip: ip(ip_), protocol }
}

fn flush_endpoint(service: &str, endpoint: &str) -> ConntrackOp {
    ConntrackOp::FlushEndpoint { service_ip: ip(service), endpoint_ip: ip(endpoint), protocol: Protocol::Udp }
}

fn flush_node_port(port: u16) -> ConntrackOp {
    ConntrackOp::FlushNodePort { port, protocol: Protocol::Udp }
}

fn flush_node_port_endpoint(port: u16, endpoint: &str) -> ConntrackOp {
    ConntrackOp::FlushNodePortEndpoint { port, endpoint_ip: ip(endpoint), protocol: Protocol::Udp }
}

/// Applies `ops` to the IPv4 lab and checks which UDP entries are left; the
/// TCP entry and the IPv6 table are never touched by UDP IPv4 ops.
fn check_v4(prefix: &str, ops: Vec<ConntrackOp>, gone: &[u16]) -> Applied {
    let mut flows = flows_v4();
    flows.extend(flows_v6());
    let lab = Lab::new(prefix, flows.clone());
    let _tcp = lab.start_flows();
    let applied = lab.apply(IpFamily::V4, ops);
    let left = |family, protocol| lab.sports(family, protocol);
    assert_eq!(left(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, gone), "IPv4 UDP entries left");
    assert_eq!(left(IpFamily::V4, Protocol::Tcp), sports(&flows_v4(), Protocol::Tcp, &[]), "IPv4 TCP entries left");
    assert_eq!(left(IpFamily::V6, Protocol::Udp), sports(&flows_v6(), Protocol::Udp, &[]), "IPv6 UDP entries left");
    assert_eq!(applied.deleted, gone.len() as u64, "{applied:?}");
    applied
}

#[test]
fn flush_service_ip_deletes_the_udp_entries_to_that_ip() {
    check_v4("ct-svc", vec![flush_service_ip("10.96.0.10", Protocol::Udp)], &[40001, 40002]);
}

#[test]
fn flush_endpoint_deletes_only_entries_natted_to_that_endpoint() {
    check_v4("ct-ep", vec![flush_endpoint("10.96.0.10", "10.244.1.1")], &[40001]);
}

#[test]
fn flush_node_port_deletes_entries_to_that_port_on_every_address() {
    check_v4("ct-np", vec![flush_node_port(30053)], &[40004, 40005, 40009]);
}

#[test]
fn flush_node_port_endpoint_deletes_only_entries_natted_to_that_endpoint() {
    check_v4("ct-npep", vec![flush_node_port_endpoint(30053, "10.244.1.2")], &[40005, 40009]);
}

#[test]
fn a_batch_is_one_dump_then_one_pipelined_delete_per_entry() {
    let ops = vec![
        flush_service_ip("10.96.0.11", Protocol::Udp),
        flush_endpoint("10.96.0.10", "10.244.1.2"),
        flush_node_port(30054),
        flush_node_port_endpoint(30053, "10.244.1.1"),
        flush_service_ip("10.96.0.99", Protocol::Udp), // matches nothing: still Ok
        flush_endpoint("10.96.0.11", "10.244.1.1"),    // the same entry as the first op
    ];
    let applied = check_v4("ct-batch", ops.clone(), &[40002, 40003, 40004, 40006]);
    // One dump, then the four deletes in one datagram.
    assert_eq!(applied, Applied { messages: 5, datagrams: 2, deleted: 4 });
}

#[test]
fn a_repeated_batch_finds_nothing_and_costs_one_dump() {
    let lab = Lab::new("ct-again", flows_v4());
    let _tcp = lab.start_flows();
    let ops = vec![flush_service_ip("10.96.0.10", Protocol::Udp), flush_node_port(30053)];
    assert_eq!(lab.apply(IpFamily::V4, ops.clone()), Applied { messages: 6, datagrams: 2, deleted: 5 });
    assert_eq!(lab.apply(IpFamily::V4, ops), Applied { messages: 1, datagrams: 1, deleted: 0 });
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), BTreeSet::from([40003, 40006, 40008]));
}

#[test]
fn the_protocol_of_the_op_decides_which_entries_go() {
    let lab = Lab::new("ct-proto", flows_v4());
    let _tcp = lab.start_flows();
    let applied = lab.apply(IpFamily::V4, vec![flush_service_ip("10.96.0.10", Protocol::Tcp)]);
    assert_eq!(applied.deleted, 1);
    assert!(lab.sports(IpFamily::V4, Protocol::Tcp).is_empty());
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, &[]));
}

#[test]
fn ipv6_ops_clean_the_ipv6_table_and_port_ops_follow_the_handle_family() {
    let mut flows = flows_v6();
    flows.extend(flows_v4());
    let lab = Lab::new("ct-v6", flows);
    let _tcp = lab.start_flows();
    let ops = vec![
        flush_endpoint("fd00:96::10", "fd00:244::1"),
        flush_service_ip("fd00:96::11", Protocol::Udp),
        flush_node_port(30053), // the handle is IPv6: IPv4 :30053 entries stay
        flush_node_port_endpoint(30054, "fd00:244::2"),
        flush_service_ip("10.96.0.11", Protocol::Udp), // an IPv4 op too: a second dump
    ];
    let applied = lab.apply(IpFamily::V6, ops);
    assert_eq!(lab.sports(IpFamily::V6, Protocol::Udp), BTreeSet::from([41002]));
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, &[40003]));
    // Two dumps, four IPv6 deletes in one datagram, one IPv4 delete in another.
    assert_eq!(applied, Applied { messages: 7, datagrams: 4, deleted: 5 });
}

#[test]
fn more_entries_than_one_datagram_holds_go_in_several_batches() {
    let mut flows = flows_v4(); // their DNAT rules make the namespace track
    flows.extend((42000..42150).map(|sport| udp(sport, "10.96.0.20:53", "")));
    let lab = Lab::new("ct-many", flows);
    let _tcp = lab.start_flows();
    let applied = lab.apply(IpFamily::V4, vec![flush_service_ip("10.96.0.20", Protocol::Udp)]);
    // One dump, then 150 deletes in datagrams of 64, 64 and 22.
    assert_eq!(applied, Applied { messages: 151, datagrams: 4, deleted: 150 });
    assert_eq!(lab.sports(IpFamily::V4, Protocol::Udp), sports(&flows_v4(), Protocol::Udp, &[]));
}
