//! The Node changes that end the daemon so its DaemonSet restarts it
//! (upstream 1.37's NodeManager, `pkg/proxy/nodemanager`): the proxy was
//! started with the Node's IPs (its primary IP family, its node IPs) and,
//! in NodeCIDR detect-local mode, its pod CIDRs. When a Node event carries
//! other IPs, or other pod CIDRs in that mode, or the Node is deleted, the
//! daemon logs old and new and exits with code 1, as upstream.
//!
//! The comparison is with what the daemon started with, not with the
//! previous event: the first event of a watch that lists the same Node is
//! no change; a Node that was not found at start and then appears with IPs
//! is one (upstream restarts to plan with them).

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Node;

use crate::msgs::{Change, SourceEvent};
use crate::net::parse_ip_sloppy;

/// The Node's host IPs as upstream's `GetNodeHostIPs` reads them: the first
/// InternalIP (else ExternalIP), and the first address of the other family
/// after it, InternalIPs before ExternalIPs; empty without one.
pub fn host_ips(node: &Node) -> Vec<IpAddr> {
    let addresses = node.status.as_ref().and_then(|s| s.addresses.as_deref()).unwrap_or_default();
    let of_type =
        |t: &'static str| addresses.iter().filter(move |a| a.type_ == t).filter_map(|a| parse_ip_sloppy(&a.address));
    let mut all = of_type("InternalIP").chain(of_type("ExternalIP"));
    let Some(first) = all.next() else { return Vec::new() };
    let other = all.find(|ip| ip.is_ipv6() != first.is_ipv6());
    std::iter::once(first).chain(other).collect()
}

/// The Node's `spec.podCIDRs`, as written.
pub fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec.as_ref().and_then(|s| s.pod_cidrs.clone()).unwrap_or_default()
}

/// What the daemon started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBaseline {
    name: String,
    host_ips: Vec<IpAddr>,
    /// In NodeCIDR detect-local mode: the pod CIDRs at start.
    pod_cidrs: Option<Vec<String>>,
}

/// A change that needs a restart, with what it was and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRestart {
    PodCidrs { node: String, old: Vec<String>, new: Vec<String> },
    Ips { node: String, old: Vec<IpAddr>, new: Vec<IpAddr> },
    Deleted { node: String },
}

impl NodeBaseline {
    /// `node` as found at start (`None`: not found in time) of the Node
    /// named `name`; `watch_pod_cidrs` in NodeCIDR detect-local mode.
    pub fn new(name: &str, node: Option<&Node>, watch_pod_cidrs: bool) -> NodeBaseline {
        NodeBaseline {
            name: name.to_string(),
            host_ips: node.map(host_ips).unwrap_or_default(),
            pod_cidrs: watch_pod_cidrs.then(|| node.map(pod_cidrs).unwrap_or_default()),
        }
    }

    /// The first of `events` that needs a restart, if one does. Pod CIDRs
    /// are compared before IPs, as upstream.
    pub fn check(&self, events: &[SourceEvent]) -> Option<NodeRestart> {
        events.iter().find_map(|e| match e {
            SourceEvent::Node(change) if change.object().metadata.name.as_deref() == Some(&self.name) => {
                self.check_node(change)
            }
            _ => None,
        })
    }

    fn check_node(&self, change: &Change<Node>) -> Option<NodeRestart> {
        let node = match change {
            Change::Deleted(_) => return Some(NodeRestart::Deleted { node: self.name.clone() }),
            Change::Applied(node) => node,
        };
        if let Some(old) = &self.pod_cidrs {
            let new = pod_cidrs(node);
            if *old != new {
                return Some(NodeRestart::PodCidrs { node: self.name.clone(), old: old.clone(), new });
            }
        }
        let new = host_ips(node);
        (new != self.host_ips).then(|| NodeRestart::Ips { node: self.name.clone(), old: self.host_ips.clone(), new })
    }
}

impl NodeRestart {
    /// Logs it as upstream's NodeManager does, before the exit.
    pub fn log(&self) {
        let list = |v: &[String]| v.join(",");
        match self {
            NodeRestart::PodCidrs { node, old, new } => tracing::warn!(
                node,
                old_pod_cidrs = %list(old),
                new_pod_cidrs = %list(new),
                "PodCIDRs changed for the node; exiting for a restart"
            ),
            NodeRestart::Ips { node, old, new } => {
                let ips = |v: &[IpAddr]| list(&v.iter().map(ToString::to_string).collect::<Vec<_>>());
                tracing::warn!(
                    node,
                    old_node_ips = %ips(old),
                    new_node_ips = %ips(new),
                    "NodeIPs changed for the node; exiting for a restart"
                )
            }
            NodeRestart::Deleted { node } => tracing::warn!(node, "Node is being deleted; exiting for a restart"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};
    use std::sync::Arc;

    fn node(name: &str, addresses: &[(&str, &str)], cidrs: &[&str]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.spec =
            Some(NodeSpec { pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()), ..NodeSpec::default() });
        let addresses = addresses.iter().map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() });
        n.status = Some(NodeStatus { addresses: Some(addresses.collect()), ..NodeStatus::default() });
        n
    }

    fn internal(ips: &[&str]) -> Node {
        node("node-a", &ips.iter().map(|ip| ("InternalIP", *ip)).collect::<Vec<_>>(), &[])
    }

    fn applied(n: Node) -> Vec<SourceEvent> {
        vec![SourceEvent::Node(Change::Applied(Arc::new(n)))]
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn host_ips_are_upstreams_internal_first_one_per_family() {
        assert_eq!(host_ips(&internal(&["192.168.1.1", "fd00:1:2:3::1"])), ips(&["192.168.1.1", "fd00:1:2:3::1"]));
        let mixed = node(
            "n",
            &[("ExternalIP", "203.0.113.5"), ("Hostname", "n"), ("InternalIP", "10.0.0.5"), ("InternalIP", "10.0.0.6")],
            &[],
        );
        assert_eq!(host_ips(&mixed), ips(&["10.0.0.5"]), "InternalIP first; one per family");
        let ext6 = node("n", &[("InternalIP", "10.0.0.5"), ("ExternalIP", "2001:db8::5")], &[]);
        assert_eq!(host_ips(&ext6), ips(&["10.0.0.5", "2001:db8::5"]));
        assert_eq!(host_ips(&node("n", &[("InternalIP", "010.000.000.005")], &[])), ips(&["10.0.0.5"]), "sloppy");
        assert!(host_ips(&node("n", &[("Hostname", "n")], &[])).is_empty());
    }

    /// Upstream's `TestNodeManagerOnNodeChange` and `TestNodeManagerOnNodeDelete`.
    #[test]
    fn changes_against_the_start_follow_upstreams_table() {
        let start = node(
            "node-a",
            &[("InternalIP", "192.168.1.1"), ("InternalIP", "fd00:1:2:3::1")],
            &["10.0.0.0/8", "fd01:2345::/64"],
        );
        let same = start.clone();
        let other_ips = node(
            "node-a",
            &[("InternalIP", "10.0.1.1"), ("InternalIP", "fd00:3:2:1::2")],
            &["10.0.0.0/8", "fd01:2345::/64"],
        );
        let other_cidrs = node(
            "node-a",
            &[("InternalIP", "192.168.1.1"), ("InternalIP", "fd00:1:2:3::1")],
            &["172.16.10.0/24", "fd01:5422::/64"],
        );
        let ips_only = NodeBaseline::new("node-a", Some(&start), false);
        let with_cidrs = NodeBaseline::new("node-a", Some(&start), true);
        assert_eq!(ips_only.check(&applied(same.clone())), None);
        assert_eq!(
            ips_only.check(&applied(other_ips)),
            Some(NodeRestart::Ips {
                node: "node-a".into(),
                old: ips(&["192.168.1.1", "fd00:1:2:3::1"]),
                new: ips(&["10.0.1.1", "fd00:3:2:1::2"]),
            })
        );
        assert_eq!(ips_only.check(&applied(other_cidrs.clone())), None, "pod CIDRs count only in NodeCIDR mode");
        assert_eq!(with_cidrs.check(&applied(same)), None);
        assert_eq!(
            with_cidrs.check(&applied(other_cidrs)),
            Some(NodeRestart::PodCidrs {
                node: "node-a".into(),
                old: vec!["10.0.0.0/8".into(), "fd01:2345::/64".into()],
                new: vec!["172.16.10.0/24".into(), "fd01:5422::/64".into()],
            })
        );
        let deleted = vec![SourceEvent::Node(Change::Deleted(Arc::new(node("node-a", &[], &[]))))];
        assert_eq!(ips_only.check(&deleted), Some(NodeRestart::Deleted { node: "node-a".into() }));
    }

    #[test]
    fn other_nodes_labels_and_the_first_listing_are_no_change() {
        let start = internal(&["192.168.1.1"]);
        let base = NodeBaseline::new("node-a", Some(&start), false);
        let mut labelled = start.clone();
        labelled.metadata.labels = Some([("topology.kubernetes.io/zone".to_string(), "z2".to_string())].into());
        assert_eq!(base.check(&applied(labelled)), None);
        let other = node("node-b", &[("InternalIP", "10.9.9.9")], &[]);
        assert_eq!(base.check(&applied(other)), None);
        let listing = vec![SourceEvent::Synced(crate::msgs::ResourceKind::Service), applied(start).remove(0)];
        assert_eq!(base.check(&listing), None);
    }

    /// Upstream keeps going without a Node at start; one appearing later
    /// without IPs changes nothing, with IPs it restarts the proxy.
    #[test]
    fn a_node_missing_at_start_restarts_the_proxy_once_it_has_ips() {
        let base = NodeBaseline::new("node-a", None, false);
        assert_eq!(base.check(&applied(node("node-a", &[], &[]))), None);
        assert!(matches!(base.check(&applied(internal(&["192.168.1.1"]))), Some(NodeRestart::Ips { .. })));
    }
}
