//! Which dumped entries a batch of [`ConntrackOp`]s deletes. Pure: the
//! handle dumps a family once per batch and asks [`Matcher::matches`] about
//! each entry, a few hash lookups whatever the batch size.
//!
//! The filters are those of upstream's netlink conntrack helpers:
//! - `FlushServiceIp { ip }`: original destination `ip`;
//! - `FlushEndpoint { service_ip, endpoint_ip }`: original destination
//!   `service_ip` and reply source `endpoint_ip` (DNATed to that endpoint);
//! - `FlushNodePort { port }`: original destination port `port`, any address
//!   of the handle's family;
//! - `FlushNodePortEndpoint { port, endpoint_ip }`: original destination port
//!   `port` and reply source `endpoint_ip`;
//!
//! always for the op's L4 protocol only.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::net::IpAddr;

use super::codec::Entry;
use crate::msgs::ConntrackOp;
use crate::net::IpFamily;

/// Indices of the ops in a batch, by what they match on.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    /// (protocol, original destination).
    service_ip: HashMap<(u8, IpAddr), Vec<usize>>,
    /// (protocol, original destination, reply source).
    endpoint: HashMap<(u8, IpAddr, IpAddr), Vec<usize>>,
    /// (family, protocol, original destination port).
    node_port: HashMap<(IpFamily, u8, u16), Vec<usize>>,
    /// (protocol, original destination port, reply source).
    node_port_endpoint: HashMap<(u8, u16, IpAddr), Vec<usize>>,
    /// The ops of each family, which is one dump each.
    families: BTreeMap<IpFamily, Vec<usize>>,
}

fn push<K: Eq + Hash>(map: &mut HashMap<K, Vec<usize>>, key: K, i: usize) {
    map.entry(key).or_default().push(i);
}

impl Matcher {
    /// Indexes `ops`; port-only ops (`FlushNodePort`) apply to `port_family`.
    pub fn new(ops: &[ConntrackOp], port_family: IpFamily) -> Matcher {
        let mut m = Matcher::default();
        for (i, op) in ops.iter().enumerate() {
            m.families.entry(op_family(op, port_family)).or_default().push(i);
            match *op {
                ConntrackOp::FlushServiceIp { ip, protocol } => push(&mut m.service_ip, (protocol.number(), ip), i),
                ConntrackOp::FlushEndpoint { service_ip, endpoint_ip, protocol } => {
                    push(&mut m.endpoint, (protocol.number(), service_ip, endpoint_ip), i)
                }
                ConntrackOp::FlushNodePort { port, protocol } => {
                    push(&mut m.node_port, (port_family, protocol.number(), port), i)
                }
                ConntrackOp::FlushNodePortEndpoint { port, endpoint_ip, protocol } => {
                    push(&mut m.node_port_endpoint, (protocol.number(), port, endpoint_ip), i)
                }
            }
        }
        m
    }

    /// The families to dump, each with the indices of its ops.
    pub fn families(&self) -> impl Iterator<Item = (IpFamily, &[usize])> {
        self.families.iter().map(|(f, ops)| (*f, ops.as_slice()))
    }

    /// The indices of the ops that delete `entry`, ascending; empty if none.
    pub fn matches(&self, entry: &Entry) -> Vec<usize> {
        let proto = entry.orig.protocol;
        let dst = entry.orig.dst;
        let reply_src = entry.reply.src;
        let mut hits: Vec<usize> = Vec::new();
        let mut add = |v: Option<&Vec<usize>>| hits.extend(v.into_iter().flatten());
        add(self.service_ip.get(&(proto, dst)));
        add(self.endpoint.get(&(proto, dst, reply_src)));
        if let Some(port) = entry.orig.dst_port {
            add(self.node_port.get(&(entry.orig.family(), proto, port)));
            add(self.node_port_endpoint.get(&(proto, port, reply_src)));
        }
        hits.sort_unstable();
        hits.dedup();
        hits
    }
}

/// The family whose table an op is about: its address's, or `port_family`
/// for an op that names only a port.
pub fn op_family(op: &ConntrackOp, port_family: IpFamily) -> IpFamily {
    match op {
        ConntrackOp::FlushServiceIp { ip, .. } => IpFamily::of(ip),
        ConntrackOp::FlushEndpoint { service_ip, .. } => IpFamily::of(service_ip),
        ConntrackOp::FlushNodePort { .. } => port_family,
        ConntrackOp::FlushNodePortEndpoint { endpoint_ip, .. } => IpFamily::of(endpoint_ip),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::conntrack::codec::Tuple;
    use crate::net::Protocol;

    const UDP: u8 = 17;
    const TCP: u8 = 6;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    /// A connection from 10.0.0.1:40000 to `dst:dport`, answered by `reply_src`.
    fn entry(protocol: u8, dst: &str, dport: u16, reply_src: &str) -> Entry {
        let client = ip(if dst.contains(':') { "fd00::1" } else { "10.0.0.1" });
        Entry {
            orig: Tuple { src: client, dst: ip(dst), protocol, src_port: Some(40000), dst_port: Some(dport) },
            reply: Tuple { src: ip(reply_src), dst: client, protocol, src_port: Some(dport), dst_port: Some(40000) },
            zone: None,
            id: Some(7),
        }
    }

    fn service_ip(s: &str) -> ConntrackOp {
        ConntrackOp::FlushServiceIp { ip: ip(s), protocol: Protocol::Udp }
    }

    fn endpoint(svc: &str, ep: &str) -> ConntrackOp {
        ConntrackOp::FlushEndpoint { service_ip: ip(svc), endpoint_ip: ip(ep), protocol: Protocol::Udp }
    }

    fn node_port(port: u16) -> ConntrackOp {
        ConntrackOp::FlushNodePort { port, protocol: Protocol::Udp }
    }

    fn node_port_endpoint(port: u16, ep: &str) -> ConntrackOp {
        ConntrackOp::FlushNodePortEndpoint { port, endpoint_ip: ip(ep), protocol: Protocol::Udp }
    }

    #[test]
    fn each_op_matches_its_entries_and_only_those() {
        let cases: [(&str, ConntrackOp, Entry, bool); 12] = [
            ("service ip: dst", service_ip("10.96.0.10"), entry(UDP, "10.96.0.10", 53, "10.244.1.1"), true),
            ("service ip: other dst", service_ip("10.96.0.10"), entry(UDP, "10.96.0.11", 53, "10.96.0.11"), false),
            ("service ip: tcp", service_ip("10.96.0.10"), entry(TCP, "10.96.0.10", 53, "10.244.1.1"), false),
            (
                "endpoint: natted",
                endpoint("10.96.0.10", "10.244.1.1"),
                entry(UDP, "10.96.0.10", 53, "10.244.1.1"),
                true,
            ),
            (
                "endpoint: other ep",
                endpoint("10.96.0.10", "10.244.1.1"),
                entry(UDP, "10.96.0.10", 53, "10.244.1.2"),
                false,
            ),
            (
                "endpoint: other svc",
                endpoint("10.96.0.10", "10.244.1.1"),
                entry(UDP, "10.96.0.11", 53, "10.244.1.1"),
                false,
            ),
            ("node port: any dst", node_port(30053), entry(UDP, "192.168.1.5", 30053, "10.244.1.1"), true),
            ("node port: other port", node_port(30053), entry(UDP, "192.168.1.5", 30054, "10.244.1.1"), false),
            ("node port: other family", node_port(30053), entry(UDP, "fd00::5", 30053, "fd00:244::1"), false),
            ("np endpoint", node_port_endpoint(30053, "10.244.1.1"), entry(UDP, "10.0.0.5", 30053, "10.244.1.1"), true),
            (
                "np endpoint: other",
                node_port_endpoint(30053, "10.244.1.1"),
                entry(UDP, "10.0.0.5", 30053, "10.244.1.2"),
                false,
            ),
            (
                "np endpoint: v6",
                node_port_endpoint(30053, "fd00:244::1"),
                entry(UDP, "fd00::5", 30053, "fd00:244::1"),
                true,
            ),
        ];
        for (name, op, e, expected) in cases {
            let m = Matcher::new(&[op], IpFamily::V4);
            assert_eq!(!m.matches(&e).is_empty(), expected, "{name}: {op}");
        }
    }

    #[test]
    fn an_entry_hit_by_several_ops_names_each_once() {
        let ops = [service_ip("10.96.0.10"), endpoint("10.96.0.10", "10.244.1.1"), service_ip("10.96.0.10")];
        let m = Matcher::new(&ops, IpFamily::V4);
        assert_eq!(m.matches(&entry(UDP, "10.96.0.10", 53, "10.244.1.1")), vec![0, 1, 2]);
        assert_eq!(m.matches(&entry(UDP, "10.96.0.10", 53, "10.244.1.2")), vec![0, 2]);
    }

    #[test]
    fn ops_are_grouped_by_the_family_they_dump() {
        let ops = [service_ip("fd00::10"), node_port(30053), endpoint("10.96.0.10", "10.244.1.1")];
        let v6 = Matcher::new(&ops, IpFamily::V6);
        let families: Vec<(IpFamily, Vec<usize>)> = v6.families().map(|(f, i)| (f, i.to_vec())).collect();
        assert_eq!(families, vec![(IpFamily::V4, vec![2]), (IpFamily::V6, vec![0, 1])]);
        assert!(!v6.matches(&entry(UDP, "fd00::5", 30053, "fd00:244::1")).is_empty());
        assert!(v6.matches(&entry(UDP, "10.0.0.5", 30053, "10.244.1.1")).is_empty());
    }

    #[test]
    fn entries_without_ports_never_match_port_ops() {
        let mut portless = entry(UDP, "10.96.0.10", 0, "10.244.1.1");
        portless.orig.dst_port = None;
        let ops = [node_port(0), node_port_endpoint(0, "10.244.1.1")];
        assert!(Matcher::new(&ops, IpFamily::V4).matches(&portless).is_empty());
        assert_eq!(Matcher::new(&[service_ip("10.96.0.10")], IpFamily::V4).matches(&portless), vec![0]);
    }
}
