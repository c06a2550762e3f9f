//! Which dumped entries a [`ReconcileConntrack`] deletes. Pure: the handle
//! dumps the family's table once and asks [`is_stale`] about each entry, a
//! few hash lookups each, whatever the number of frontends.
//!
//! Only UDP entries are considered (upstream's reconciler skips every
//! other protocol). An entry is read as its original destination (address
//! and port: the frontend it was sent to) and its reply source (address
//! and port: where it went, the endpoint and target port when DNATed).
//! It is stale when:
//! - its original destination is a serving frontend's address and port and
//!   its reply source is none of that frontend's endpoints;
//! - its original destination port is a serving NodePort (any address of
//!   the family) and its reply source is none of that NodePort's endpoints;
//! - its original destination is a gone frontend (address and port, or a
//!   NodePort on any address) and it was DNATed: its reply source differs
//!   from its original destination.
//!
//! The first two are upstream's (1.34+: keyed by address and port, and
//! target-port aware), so an entry to another port of the same endpoint
//! stays. The third is kube-proxy-rs's (see [`ReconcileConntrack`]).

use std::net::SocketAddr;

use super::codec::Entry;
use crate::msgs::ReconcileConntrack;
use crate::net::Protocol;

/// Whether the reconcile `rc` deletes `entry`.
pub fn is_stale(rc: &ReconcileConntrack, entry: &Entry) -> bool {
    if entry.orig.protocol != Protocol::Udp.number() {
        return false;
    }
    let (Some(dport), Some(sport)) = (entry.orig.dst_port, entry.reply.src_port) else {
        return false;
    };
    let orig_dst = SocketAddr::new(entry.orig.dst, dport);
    let reply_src = SocketAddr::new(entry.reply.src, sport);
    let not_served_by = |backends: Option<&crate::msgs::Backends>| backends.is_some_and(|b| !b.contains(&reply_src));
    if not_served_by(rc.serving.ips.get(&orig_dst)) || not_served_by(rc.serving.node_ports.get(&dport)) {
        return true;
    }
    let dnat = reply_src != orig_dst;
    dnat && (rc.gone.ips.contains(&orig_dst) || rc.gone.node_ports.contains(&dport))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::msgs::{Backends, Frontends, ServingFrontends};
    use crate::net::IpFamily;

    const UDP: Protocol = Protocol::Udp;
    const TCP: Protocol = Protocol::Tcp;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("test address and port")
    }

    /// A connection from a client at port 40000 to `dst`, answered by `reply_src`.
    fn entry(protocol: Protocol, dst: &str, reply_src: &str) -> Entry {
        let dst = sa(dst);
        let client = if dst.is_ipv6() { "[fd00::1]:40000" } else { "10.0.0.1:40000" };
        Entry::connection(protocol, sa(client), dst, sa(reply_src))
    }

    fn backends(list: &[&str]) -> Backends {
        Arc::new(list.iter().map(|s| sa(s)).collect::<BTreeSet<_>>())
    }

    /// ClusterIP 10.96.0.10:53 and NodePort 30053 served by 10.244.1.1:5353;
    /// 10.96.0.20:53 and NodePort 30054 gone; the same in IPv6.
    fn reconcile() -> ReconcileConntrack {
        let eps = backends(&["10.244.1.1:5353", "[fd00:244::1]:5353"]);
        let mut serving = ServingFrontends::default();
        serving.ips.insert(sa("10.96.0.10:53"), eps.clone());
        serving.ips.insert(sa("[fd00:96::10]:53"), eps.clone());
        serving.node_ports.insert(30053, eps);
        let mut gone = Frontends::default();
        gone.ips.extend([sa("10.96.0.20:53"), sa("[fd00:96::20]:53")]);
        gone.node_ports.insert(30054);
        ReconcileConntrack { generation: 1, family: IpFamily::V4, serving: Arc::new(serving), gone: Arc::new(gone) }
    }

    #[test]
    fn each_rule_deletes_its_entries_and_only_those() {
        let cases: [(&str, Entry, bool); 17] = [
            ("to a serving endpoint", entry(UDP, "10.96.0.10:53", "10.244.1.1:5353"), false),
            ("to a removed endpoint", entry(UDP, "10.96.0.10:53", "10.244.1.2:5353"), true),
            ("to the endpoint's old target port", entry(UDP, "10.96.0.10:53", "10.244.1.1:8053"), true),
            ("not DNATed", entry(UDP, "10.96.0.10:53", "10.96.0.10:53"), true),
            ("another port of the service IP", entry(UDP, "10.96.0.10:54", "10.244.1.2:5353"), false),
            ("TCP", entry(TCP, "10.96.0.10:53", "10.244.1.2:5353"), false),
            ("node port to a serving endpoint", entry(UDP, "192.168.1.5:30053", "10.244.1.1:5353"), false),
            ("node port to a removed endpoint", entry(UDP, "192.168.1.5:30053", "10.244.1.2:5353"), true),
            ("node port on another address", entry(UDP, "10.0.0.9:30053", "10.0.0.9:30053"), true),
            ("gone frontend, DNATed", entry(UDP, "10.96.0.20:53", "10.244.1.1:5353"), true),
            ("gone frontend, not DNATed", entry(UDP, "10.96.0.20:53", "10.96.0.20:53"), false),
            ("gone frontend, another port", entry(UDP, "10.96.0.20:54", "10.244.1.1:5353"), false),
            ("gone node port, DNATed", entry(UDP, "192.168.1.5:30054", "10.244.1.1:5353"), true),
            ("gone node port, not DNATed", entry(UDP, "192.168.1.5:30054", "192.168.1.5:30054"), false),
            ("IPv6 to a serving endpoint", entry(UDP, "[fd00:96::10]:53", "[fd00:244::1]:5353"), false),
            ("IPv6 to a removed endpoint", entry(UDP, "[fd00:96::10]:53", "[fd00:244::2]:5353"), true),
            ("IPv6 gone, DNATed", entry(UDP, "[fd00:96::20]:53", "[fd00:244::1]:5353"), true),
        ];
        let rc = reconcile();
        for (name, e, stale) in cases {
            assert_eq!(is_stale(&rc, &e), stale, "{name}: {e:?}");
        }
    }

    #[test]
    fn entries_without_ports_are_never_stale() {
        let mut portless = entry(UDP, "10.96.0.10:53", "10.244.1.2:5353");
        portless.orig.dst_port = None;
        assert!(!is_stale(&reconcile(), &portless));
        let mut no_reply_port = entry(UDP, "10.96.0.20:53", "10.244.1.1:5353");
        no_reply_port.reply.src_port = None;
        assert!(!is_stale(&reconcile(), &no_reply_port));
    }
}
