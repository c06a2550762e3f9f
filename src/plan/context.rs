//! What every mode's planner takes besides the model: the settings the
//! coordinator plans with, the node's addresses and primary IP, and the
//! masquerade mark.

use std::net::IpAddr;

use crate::model::NodeInfo;
use crate::net::IpFamily;

pub use crate::net::LocalAddr;

pub use crate::config::NodePortAddresses as NodePortFilter;

/// What the coordinator knows that shapes the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSettings {
    pub family: IpFamily,
    pub node_name: String,
    /// IPVS mode's scheduler.
    pub scheduler: String,
    pub node_ports: NodePortFilter,
}

/// The node's primary IP of `family`: the Node's first address of that
/// family, else the first non-loopback interface address.
pub fn node_ip(family: IpFamily, node: &NodeInfo, addrs: &[LocalAddr]) -> Option<IpAddr> {
    node.addresses
        .iter()
        .copied()
        .find(|ip| family.matches(ip))
        .or_else(|| addrs.iter().map(|a| a.ip).find(|ip| family.matches(ip) && !ip.is_loopback()))
}

/// The masquerade mark of `bit`, as upstream formats it with Go's
/// `%#08x`: 1<<14 is `0x00004000`.
pub fn mark(bit: u32) -> String {
    format!("{:#010x}", 1u32 << bit.min(31))
}
