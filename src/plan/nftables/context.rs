//! What shapes the nftables-mode ruleset besides the model: settings from
//! the configuration and the node's addresses. Follows upstream's NewProxier
//! (pkg/proxy/nftables/proxier.go) and NewNodePortAddresses / GetNodeIPs
//! (pkg/proxy/util/nodeport_addresses.go).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::NodeInfo;
use crate::msgs::nftables::{Expr, Field, Hex, KeyPart};
use crate::net::{IpFamily, LocalAddr};
use crate::plan::context::{node_ip, NodePortFilter};
use crate::plan::iptables::context::node_port_cidrs;
use crate::plan::local::LocalDetector;

/// Which ruleset nftables mode writes (`--nftables-ruleset`,
/// `nftables.ruleset`: ours, upstream has neither).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NftRuleset {
    /// Upstream kube-proxy's ruleset.
    #[default]
    Upstream,
    /// The same behaviour with the per-Service state as set and map
    /// elements (`docs/nftables-scalable.md`, [`super::maps`]).
    Maps,
}

impl NftRuleset {
    /// Every ruleset, the default first.
    pub const ALL: [NftRuleset; 2] = [NftRuleset::Upstream, NftRuleset::Maps];

    /// The name the flag and the field take.
    pub fn name(self) -> &'static str {
        match self {
            NftRuleset::Upstream => "upstream",
            NftRuleset::Maps => "maps",
        }
    }

    /// The ruleset named `name` (`""`: the default).
    pub fn from_name(name: &str) -> Option<NftRuleset> {
        match name {
            "" => Some(NftRuleset::default()),
            n => NftRuleset::ALL.into_iter().find(|r| r.name() == n),
        }
    }
}

impl std::fmt::Display for NftRuleset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Settings from the configuration (`settings::FamilySettings::nftables_settings`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesSettings {
    pub family: IpFamily,
    pub ruleset: NftRuleset,
    pub node_name: String,
    /// `nftables.masqueradeAll`.
    pub masquerade_all: bool,
    /// `nftables.masqueradeBit`.
    pub masquerade_bit: u32,
    /// How pod traffic is recognised.
    pub local: LocalDetector,
    /// `nodePortAddresses` (nftables mode's default is `primary`).
    pub node_ports: NodePortFilter,
    /// The family's ServiceCIDRs (upstream's OnServiceCIDRsChanged): traffic
    /// to an unallocated address in them is dropped. Empty: no such rule.
    pub service_cidrs: Vec<IpNet>,
}

/// Where NodePorts are accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePorts {
    /// nodePortAddresses matches all: any local address but loopback
    /// (`fib daddr type local`), no `nodeport-ips` set.
    All,
    /// The `nodeport-ips` set's members (loopback left out: no localhost NodePorts).
    Ips(Vec<IpAddr>),
}

/// Everything the ruleset needs besides the model. A change of any field
/// needs a full sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftablesContext {
    pub family: IpFamily,
    pub ruleset: NftRuleset,
    pub node_name: String,
    /// The node's `topology.kubernetes.io/zone` label (topology hints).
    pub zone: String,
    /// The node's primary IP: a source range containing it lets the node
    /// reach the LB VIP (upstream's allowFromNode).
    pub node_ip: Option<IpAddr>,
    pub masquerade_all: bool,
    /// The masquerade mark, printed as upstream formats it (`%#08x`: `0x004000`).
    pub mark: Hex,
    pub local: LocalDetector,
    pub node_ports: NodePorts,
    pub service_cidrs: Vec<IpNet>,
}

/// The mark of `bit`, written as upstream's `fmt.Sprintf("%#08x", 1<<bit)`.
pub fn mark(bit: u32) -> Hex {
    Hex { value: 1u32 << bit.min(31), width: 8 }
}

/// Builds the context from settings, the Node and the node's interface
/// addresses (read by the caller; no I/O here).
pub fn nftables_context(s: &NftablesSettings, node: &NodeInfo, addrs: &[LocalAddr]) -> NftablesContext {
    let primary = node_ip(s.family, node, addrs);
    let node_ports = match node_port_cidrs(s.family, &s.node_ports, primary) {
        None => NodePorts::All,
        Some(cidrs) => {
            let mut ips: Vec<IpAddr> = addrs
                .iter()
                .map(|a| a.ip)
                .filter(|ip| s.family.matches(ip) && !ip.is_loopback() && cidrs.iter().any(|n| n.contains(ip)))
                .collect();
            ips.sort();
            ips.dedup();
            NodePorts::Ips(ips)
        }
    };
    NftablesContext {
        family: s.family,
        ruleset: s.ruleset,
        node_name: s.node_name.clone(),
        zone: node.zone().to_string(),
        node_ip: primary,
        masquerade_all: s.masquerade_all,
        mark: mark(s.masquerade_bit),
        local: s.local.clone(),
        node_ports,
        service_cidrs: s.service_cidrs.iter().copied().filter(|n| s.family.matches(&n.addr())).collect(),
    }
}

/// The detector's "from a pod" match (upstream's IfLocalNFT).
pub fn if_local(family: IpFamily, d: &LocalDetector) -> Option<Expr> {
    detector_match(family, d, false)
}

/// The detector's "not from a pod" match (upstream's IfNotLocalNFT).
pub fn if_not_local(family: IpFamily, d: &LocalDetector) -> Option<Expr> {
    detector_match(family, d, true)
}

fn detector_match(family: IpFamily, d: &LocalDetector, neq: bool) -> Option<Expr> {
    match d {
        LocalDetector::None => None,
        LocalDetector::Cidr(c) => Some(Expr::Cmp { field: Field::Saddr(family), neq, value: KeyPart::Net(*c) }),
        LocalDetector::BridgeInterface(b) => Some(Expr::Iif { name: b.clone(), neq }),
        LocalDetector::InterfacePrefix(p) => Some(Expr::Iif { name: format!("{p}*"), neq }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(ifname: &str, ip: &str) -> LocalAddr {
        LocalAddr { ifname: ifname.into(), ip: ip.parse().unwrap() }
    }

    fn settings(family: IpFamily, node_ports: NodePortFilter) -> NftablesSettings {
        NftablesSettings {
            family,
            ruleset: NftRuleset::Upstream,
            node_name: "node-a".into(),
            masquerade_all: false,
            masquerade_bit: 14,
            local: LocalDetector::None,
            node_ports,
            service_cidrs: vec!["10.96.0.0/16".parse().unwrap(), "fd00:96::/112".parse().unwrap()],
        }
    }

    fn addrs() -> Vec<LocalAddr> {
        vec![a("lo", "127.0.0.1"), a("eth0", "192.168.50.2"), a("eth1", "172.16.0.2"), a("eth0", "fd00::2")]
    }

    #[test]
    fn rulesets_are_named_by_the_flag_and_field_values() {
        assert_eq!(NftRuleset::from_name(""), Some(NftRuleset::Upstream));
        assert_eq!(NftRuleset::from_name("upstream"), Some(NftRuleset::Upstream));
        assert_eq!(NftRuleset::from_name("maps"), Some(NftRuleset::Maps));
        assert_eq!(NftRuleset::from_name("Maps"), None);
        assert_eq!(NftRuleset::Maps.to_string(), "maps");
    }

    #[test]
    fn the_mark_is_formatted_as_upstreams_percent_hash_08x() {
        assert_eq!(mark(14).to_string(), "0x004000");
        assert_eq!(mark(0).to_string(), "0x000001");
        assert_eq!(mark(31).to_string(), "0x80000000");
    }

    #[test]
    fn primary_node_ports_are_the_node_ip_and_never_loopback() {
        let c = nftables_context(&settings(IpFamily::V4, NodePortFilter::Primary), &NodeInfo::default(), &addrs());
        assert_eq!(c.node_ports, NodePorts::Ips(vec!["192.168.50.2".parse().unwrap()]));
        let cidrs = NodePortFilter::Cidrs(vec!["127.0.0.0/8".parse().unwrap(), "172.16.0.0/16".parse().unwrap()]);
        let c = nftables_context(&settings(IpFamily::V4, cidrs), &NodeInfo::default(), &addrs());
        assert_eq!(c.node_ports, NodePorts::Ips(vec!["172.16.0.2".parse().unwrap()]));
        let c = nftables_context(&settings(IpFamily::V4, NodePortFilter::All), &NodeInfo::default(), &addrs());
        assert_eq!(c.node_ports, NodePorts::All);
        assert_eq!(c.mark.to_string(), "0x004000");
    }

    #[test]
    fn service_cidrs_are_those_of_the_family() {
        let c = nftables_context(&settings(IpFamily::V6, NodePortFilter::All), &NodeInfo::default(), &addrs());
        assert_eq!(c.service_cidrs, vec!["fd00:96::/112".parse::<IpNet>().unwrap()]);
        assert_eq!(c.node_ip, Some("fd00::2".parse().unwrap()));
    }

    #[test]
    fn local_detectors_in_nft_syntax() {
        let text = |e: Option<Expr>| e.map(|e| e.to_string());
        let cidr = LocalDetector::Cidr("10.0.0.0/8".parse().unwrap());
        assert_eq!(text(if_not_local(IpFamily::V4, &cidr)).unwrap(), "ip saddr != 10.0.0.0/8");
        assert_eq!(text(if_local(IpFamily::V4, &cidr)).unwrap(), "ip saddr 10.0.0.0/8");
        let v6 = LocalDetector::Cidr("fd00:10::/64".parse().unwrap());
        assert_eq!(text(if_local(IpFamily::V6, &v6)).unwrap(), "ip6 saddr fd00:10::/64");
        assert_eq!(text(if_local(IpFamily::V4, &LocalDetector::BridgeInterface("cbr0".into()))).unwrap(), "iif cbr0");
        let prefix = LocalDetector::InterfacePrefix("veth".into());
        assert_eq!(text(if_not_local(IpFamily::V4, &prefix)).unwrap(), "iif != veth*");
        assert_eq!(if_local(IpFamily::V4, &LocalDetector::None), None);
    }
}
