//! What shapes the iptables-mode rules besides the model: the configuration,
//! what the host supports, and the node's addresses. Follows upstream's
//! NewProxier (pkg/proxy/iptables/proxier.go) and NewNodePortAddresses /
//! GetNodeIPs (pkg/proxy/util/nodeport_addresses.go).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::NodeInfo;
use crate::net::IpFamily;
use crate::plan::context::mark;
use crate::plan::context::{node_ip, LocalAddr, NodePortFilter};
use crate::plan::local::LocalDetector;

/// The sysctl that lets NodePorts answer on 127.0.0.0/8 (upstream's
/// sysctlRouteLocalnet): the runtime must set it to 1 when
/// [`IptablesContext::localhost_node_ports`] is true, before the first sync.
pub const SYSCTL_ROUTE_LOCALNET: &str = "net/ipv4/conf/all/route_localnet";
/// Read (not written) at start-up: non-zero means no INVALID-drop rule
/// (upstream's sysctlNFConntrackTCPBeLiberal).
pub const SYSCTL_TCP_BE_LIBERAL: &str = "net/netfilter/nf_conntrack_tcp_be_liberal";
/// nfacct counter of packets dropped as conntrack INVALID.
pub const NFACCT_CT_STATE_INVALID: &str = "ct_state_invalid_dropped_pkts";
/// nfacct counter of packets accepted for localhost NodePorts.
pub const NFACCT_LOCALHOST_NODEPORTS: &str = "localhost_nps_accepted_pkts";

/// Settings from the configuration and from probing the host
/// (`settings::FamilySettings::iptables_settings`, again when the config or
/// the Node's pod CIDR changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesSettings {
    pub family: IpFamily,
    pub node_name: String,
    pub masquerade_all: bool,
    pub masquerade_bit: u32,
    /// How pod traffic is recognised (settings::FamilySettings::local_detector).
    pub local: LocalDetector,
    /// The iptables binary supports MASQUERADE `--random-fully`.
    pub random_fully: bool,
    /// `iptables.localhostNodePorts` as configured (default true).
    pub localhost_node_ports: bool,
    /// `nodePortAddresses`.
    pub node_ports: NodePortFilter,
    /// `net/netfilter/nf_conntrack_tcp_be_liberal` is readable and non-zero.
    pub conntrack_tcp_liberal: bool,
    /// The nfacct counter [`NFACCT_CT_STATE_INVALID`] exists.
    pub nfacct_ct_state_invalid: bool,
    /// The nfacct counter [`NFACCT_LOCALHOST_NODEPORTS`] exists.
    pub nfacct_localhost_node_ports: bool,
}

/// What the runtime probes on the host before the first sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostFeatures {
    /// `iptables --version` >= 1.6.2 (MASQUERADE `--random-fully`).
    pub random_fully: bool,
    /// [`SYSCTL_TCP_BE_LIBERAL`] is readable and non-zero.
    pub conntrack_tcp_liberal: bool,
    /// The nfacct counter [`NFACCT_CT_STATE_INVALID`] exists (created on full syncs).
    pub nfacct_ct_state_invalid: bool,
    /// The nfacct counter [`NFACCT_LOCALHOST_NODEPORTS`] exists.
    pub nfacct_localhost_node_ports: bool,
}

/// Where the `KUBE-SERVICES` tail sends traffic to `KUBE-NODEPORTS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortDestinations {
    /// nodePortAddresses matches everything: one `-m addrtype --dst-type LOCAL` rule.
    All,
    /// One `-d <ip>` rule per node address inside the CIDRs (may be empty:
    /// then NodePorts are unreachable, as upstream).
    Ips(Vec<IpAddr>),
}

/// Everything the renderer needs besides the model. Build it with
/// [`iptables_context`]; a change of any field needs a full sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesContext {
    pub family: IpFamily,
    pub node_name: String,
    /// The node's `topology.kubernetes.io/zone` label (topology hints).
    pub zone: String,
    /// The node's primary IP: a source range containing it lets the node
    /// reach the LB VIP (upstream's allowFromNode).
    pub node_ip: Option<IpAddr>,
    pub masquerade_all: bool,
    /// The masquerade mark, as upstream formats it (`0x00004000`).
    pub mark: String,
    pub local: LocalDetector,
    pub random_fully: bool,
    /// Effective localhost NodePorts: IPv4, configured, and nodePortAddresses
    /// covering 127.0.0.0 (upstream's NewProxier). True means the runtime
    /// must set [`SYSCTL_ROUTE_LOCALNET`] to 1.
    pub localhost_node_ports: bool,
    pub node_ports: NodePortDestinations,
    pub conntrack_tcp_liberal: bool,
    pub nfacct_ct_state_invalid: bool,
    pub nfacct_localhost_node_ports: bool,
}

impl IptablesContext {
    /// Whether `net/ipv4/conf/all/route_localnet` must be 1 (see [`SYSCTL_ROUTE_LOCALNET`]).
    pub fn needs_route_localnet(&self) -> bool {
        self.localhost_node_ports
    }
}

/// nodePortAddresses as CIDRs of `family` (upstream's NewNodePortAddresses
/// after `primary` was replaced by the node IP's host CIDR). `None` means
/// match all: no CIDR of this family, or one of them is the zero CIDR.
pub(crate) fn node_port_cidrs(
    family: IpFamily,
    filter: &NodePortFilter,
    primary: Option<IpAddr>,
) -> Option<Vec<IpNet>> {
    let cidrs: Vec<IpNet> = match filter {
        NodePortFilter::All => return None,
        NodePortFilter::Primary => primary
            .filter(|ip| !ip.is_loopback())
            .and_then(|ip| IpNet::new(ip, family.host_bits()).ok())
            .into_iter()
            .collect(),
        NodePortFilter::Cidrs(c) => c.iter().copied().filter(|n| family.matches(&n.addr())).collect(),
    };
    if cidrs.is_empty() || cidrs.iter().any(|n| n.prefix_len() == 0) {
        return None;
    }
    Some(cidrs)
}

/// Upstream's ContainsIPv4Loopback on the family's node-port CIDRs.
fn contains_ipv4_loopback(cidrs: Option<&[IpNet]>) -> bool {
    let start: IpAddr = [127, 0, 0, 0].into();
    match cidrs {
        None => true,
        Some(c) => c.iter().any(|n| n.addr().is_ipv4() && (n.addr().is_loopback() || n.contains(&start))),
    }
}

/// Builds the context from settings, the Node and the node's interface
/// addresses (read by the caller; no I/O here).
pub fn iptables_context(s: &IptablesSettings, node: &NodeInfo, addrs: &[LocalAddr]) -> IptablesContext {
    let primary = node_ip(s.family, node, addrs);
    let cidrs = node_port_cidrs(s.family, &s.node_ports, primary);
    let localhost_node_ports =
        s.family == IpFamily::V4 && s.localhost_node_ports && contains_ipv4_loopback(cidrs.as_deref());
    let node_ports = match &cidrs {
        None => NodePortDestinations::All,
        Some(c) => {
            let mut ips: Vec<IpAddr> = addrs
                .iter()
                .map(|a| a.ip)
                .filter(|ip| s.family.matches(ip) && c.iter().any(|n| n.contains(ip)))
                .collect();
            ips.sort();
            ips.dedup();
            NodePortDestinations::Ips(ips)
        }
    };
    IptablesContext {
        family: s.family,
        node_name: s.node_name.clone(),
        zone: node.zone().to_string(),
        node_ip: primary,
        masquerade_all: s.masquerade_all,
        mark: mark(s.masquerade_bit),
        local: s.local.clone(),
        random_fully: s.random_fully,
        localhost_node_ports,
        node_ports,
        conntrack_tcp_liberal: s.conntrack_tcp_liberal,
        nfacct_ct_state_invalid: s.nfacct_ct_state_invalid,
        nfacct_localhost_node_ports: s.nfacct_localhost_node_ports,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(ifname: &str, ip: &str) -> LocalAddr {
        LocalAddr { ifname: ifname.into(), ip: ip.parse().unwrap() }
    }

    fn settings(family: IpFamily, node_ports: NodePortFilter) -> IptablesSettings {
        crate::fixtures::iptables_settings(family, "node-a", node_ports)
    }

    fn cidrs(list: &[&str]) -> NodePortFilter {
        NodePortFilter::Cidrs(list.iter().map(|c| c.parse().unwrap()).collect())
    }

    const ADDRS: [(&str, &str); 4] =
        [("lo", "127.0.0.1"), ("eth0", "192.168.50.2"), ("eth1", "172.16.0.2"), ("eth0", "fd00::2")];

    fn ctx(family: IpFamily, f: NodePortFilter) -> IptablesContext {
        let addrs: Vec<LocalAddr> = ADDRS.iter().map(|(i, ip)| a(i, ip)).collect();
        iptables_context(&settings(family, f), &NodeInfo::default(), &addrs)
    }

    #[test]
    fn all_addresses_match_all_and_allow_localhost_node_ports() {
        let c = ctx(IpFamily::V4, NodePortFilter::All);
        assert_eq!(c.node_ports, NodePortDestinations::All);
        assert!(c.localhost_node_ports && c.needs_route_localnet());
        assert_eq!(c.mark, "0x00004000");
        assert_eq!(c.node_ip, Some("192.168.50.2".parse().unwrap()));
    }

    #[test]
    fn cidrs_without_loopback_disable_localhost_node_ports() {
        let c = ctx(IpFamily::V4, cidrs(&["172.16.0.0/16"]));
        assert_eq!(c.node_ports, NodePortDestinations::Ips(vec!["172.16.0.2".parse().unwrap()]));
        assert!(!c.localhost_node_ports);
        let c = ctx(IpFamily::V4, cidrs(&["127.0.0.0/8", "172.16.0.0/16"]));
        let want = vec!["127.0.0.1".parse().unwrap(), "172.16.0.2".parse().unwrap()];
        assert_eq!(c.node_ports, NodePortDestinations::Ips(want));
        assert!(c.localhost_node_ports);
    }

    #[test]
    fn zero_cidr_or_only_other_family_cidrs_match_all() {
        assert_eq!(ctx(IpFamily::V4, cidrs(&["0.0.0.0/0", "10.0.0.0/8"])).node_ports, NodePortDestinations::All);
        let c = ctx(IpFamily::V4, cidrs(&["fd00::/64"]));
        assert_eq!(c.node_ports, NodePortDestinations::All);
        assert!(c.localhost_node_ports);
    }

    #[test]
    fn ipv6_never_has_localhost_node_ports() {
        let c = ctx(IpFamily::V6, NodePortFilter::All);
        assert!(!c.localhost_node_ports);
        assert_eq!(c.node_ip, Some("fd00::2".parse().unwrap()));
    }

    #[test]
    fn primary_means_the_node_ip() {
        let c = ctx(IpFamily::V4, NodePortFilter::Primary);
        assert_eq!(c.node_ports, NodePortDestinations::Ips(vec!["192.168.50.2".parse().unwrap()]));
        assert!(!c.localhost_node_ports);
    }

    #[test]
    fn configured_off_stays_off() {
        let mut s = settings(IpFamily::V4, NodePortFilter::All);
        s.localhost_node_ports = false;
        assert!(!iptables_context(&s, &NodeInfo::default(), &[]).localhost_node_ports);
    }
}
