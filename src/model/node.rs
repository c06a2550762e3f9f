//! What the proxy uses of its own Node object.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

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
    pub fn from_node(node: &Node) -> NodeInfo {
        let spec = node.spec.as_ref();
        let mut pod_cidrs: Vec<IpNet> =
            spec.and_then(|s| s.pod_cidrs.as_ref()).into_iter().flatten().filter_map(|c| c.parse().ok()).collect();
        if pod_cidrs.is_empty() {
            pod_cidrs.extend(spec.and_then(|s| s.pod_cidr.as_deref()).and_then(|c| c.parse::<IpNet>().ok()));
        }
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .into_iter()
            .flatten()
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .filter_map(|a| parse_ip_sloppy(&a.address))
            .collect();
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default().into_iter().collect(),
            pod_cidrs,
            addresses,
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
