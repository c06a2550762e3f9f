//! How traffic from pods is told from other traffic (detectLocalMode,
//! upstream's LocalTrafficDetector): the detector every mode's rules use,
//! and its matches in iptables' syntax (nftables mode writes its own).

use ipnet::IpNet;

/// How "traffic from outside the cluster" is recognised (detectLocalMode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDetector {
    None,
    /// ClusterCIDR or NodeCIDR: `! -s <cidr>`.
    Cidr(IpNet),
    BridgeInterface(String),
    InterfacePrefix(String),
}

/// The detector's "not from a pod" match (upstream's IfNotLocal).
pub fn if_not_local(d: &LocalDetector) -> Option<String> {
    match d {
        LocalDetector::None => None,
        LocalDetector::Cidr(c) => Some(format!("! -s {c}")),
        LocalDetector::BridgeInterface(b) => Some(format!("! -i {b}")),
        LocalDetector::InterfacePrefix(p) => Some(format!("! -i {p}+")),
    }
}

/// The detector's "from a pod" match (upstream's IfLocal).
pub fn if_local(d: &LocalDetector) -> Option<String> {
    match d {
        LocalDetector::None => None,
        LocalDetector::Cidr(c) => Some(format!("-s {c}")),
        LocalDetector::BridgeInterface(b) => Some(format!("-i {b}")),
        LocalDetector::InterfacePrefix(p) => Some(format!("-i {p}+")),
    }
}
