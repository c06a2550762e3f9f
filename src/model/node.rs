//! What the proxy uses of its own Node object.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::addresses::{cidr_list, BadValue, SKIPPED};
use crate::net::parse_ip_sloppy;

/// The node label naming its zone (topology hints).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub pod_cidrs: Vec<IpNet>,
    pub addresses: Vec<IpAddr>,
    /// metadata.deletionTimestamp is set (healthz reports unhealthy).
    pub deleting: bool,
}

impl NodeInfo {
    /// The values that do not parse are left out; `model::notice` names them.
    pub fn from_node(node: &Node) -> NodeInfo {
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default().into_iter().collect(),
            pod_cidrs: pod_cidrs(node).0,
            addresses: addresses(node).0,
            deleting: node.metadata.deletion_timestamp.is_some(),
        }
    }

    pub fn zone(&self) -> &str {
        self.labels.get(LABEL_ZONE).map(String::as_str).unwrap_or("")
    }

    /// The labels whose change forces a full resync (topology).
    pub fn topology_labels(&self) -> BTreeMap<&str, &str> {
        self.labels
            .iter()
            .filter(|(k, _)| k.starts_with("topology.kubernetes.io/") || k.as_str() == "kubernetes.io/hostname")
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// The podCIDRs (upstream's `MapCIDRsByIPFamily` of them), else the
/// podCIDR, and the values that do not parse.
fn pod_cidrs(node: &Node) -> (Vec<IpNet>, Vec<BadValue>) {
    let spec = node.spec.as_ref();
    let (mut cidrs, mut bad) =
        cidr_list("spec.podCIDRs", spec.and_then(|s| s.pod_cidrs.as_deref()).unwrap_or_default(), SKIPPED);
    if cidrs.is_empty() {
        let single: Vec<String> = spec.and_then(|s| s.pod_cidr.clone()).into_iter().collect();
        let (one, bad_one) = cidr_list("spec.podCIDR", &single, SKIPPED);
        cidrs = one;
        bad.extend(bad_one.into_iter().map(|b| BadValue { path: b.field.to_string(), ..b }));
    }
    (cidrs, bad)
}

/// The InternalIP and ExternalIP addresses (upstream's `GetNodeHostIPs`
/// reads these two types), and those that do not parse.
fn addresses(node: &Node) -> (Vec<IpAddr>, Vec<BadValue>) {
    let all = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for (i, a) in all.into_iter().flatten().enumerate() {
        if a.type_ != "InternalIP" && a.type_ != "ExternalIP" {
            continue;
        }
        match parse_ip_sloppy(&a.address) {
            Some(ip) => good.push(ip),
            None if a.address.trim().is_empty() => {}
            None => bad.push(BadValue {
                field: "status.addresses.address",
                path: format!("status.addresses[{i}].address"),
                value: a.address.clone(),
                wanted: "an IP address",
                effect: SKIPPED,
            }),
        }
    }
    (good, bad)
}

/// The Node's addresses and pod CIDRs that do not parse.
pub fn bad_values(node: &Node) -> Vec<BadValue> {
    let mut bad = addresses(node).1;
    bad.extend(pod_cidrs(node).1);
    bad
}
