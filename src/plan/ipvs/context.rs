//! Builds the IPVS planner's [`PlanContext`] from settings, the Node
//! object and the node's interface addresses (read by the caller).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::PlanContext;
use crate::model::NodeInfo;
use crate::msgs::link::DUMMY_LINK;
use crate::plan::context::{node_ip, LocalAddr, NodePortFilter, PlanSettings};

/// The addresses the IPVS plan depends on: every interface's but
/// kube-ipvs0's (the Service addresses bound there are the plan's output,
/// not its input; upstream reads node addresses except the dummy device's).
pub fn node_addrs(addrs: Vec<LocalAddr>) -> Vec<LocalAddr> {
    addrs.into_iter().filter(|a| a.ifname != DUMMY_LINK).collect()
}

pub fn plan_context(s: &PlanSettings, node: &NodeInfo, addrs: &[LocalAddr]) -> PlanContext {
    let ours: Vec<&LocalAddr> = addrs.iter().filter(|a| s.family.matches(&a.ip)).collect();
    let node_addresses: BTreeSet<IpAddr> = ours.iter().filter(|a| a.ifname != DUMMY_LINK).map(|a| a.ip).collect();
    let primary = node_ip(s.family, node, addrs);
    let mut node_port_ips: Vec<IpAddr> = node_addresses
        .iter()
        .copied()
        .filter(|ip| !ip.is_loopback())
        .filter(|ip| match &s.node_ports {
            NodePortFilter::All => true,
            NodePortFilter::Primary => Some(*ip) == primary || node.addresses.contains(ip),
            NodePortFilter::Cidrs(nets) => nets.iter().any(|n| n.contains(ip)),
        })
        .collect();
    node_port_ips.sort();
    PlanContext {
        family: s.family,
        scheduler: if s.scheduler.is_empty() { "rr".into() } else { s.scheduler.clone() },
        node_name: s.node_name.clone(),
        zone: node.zone().to_string(),
        node_port_ips,
        node_addresses,
        node_ip: primary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::IpFamily;

    fn a(ifname: &str, ip: &str) -> LocalAddr {
        LocalAddr { ifname: ifname.into(), ip: ip.parse().unwrap() }
    }

    #[test]
    fn node_addrs_leave_out_the_service_addresses_on_kube_ipvs0() {
        let addrs = vec![a("lo", "127.0.0.1"), a("kube-ipvs0", "10.96.0.10"), a("eth0", "192.168.50.2")];
        assert_eq!(node_addrs(addrs), vec![a("lo", "127.0.0.1"), a("eth0", "192.168.50.2")]);
    }

    fn settings(f: NodePortFilter) -> PlanSettings {
        PlanSettings { family: IpFamily::V4, node_name: "n".into(), scheduler: String::new(), node_ports: f }
    }

    #[test]
    fn node_ports_skip_loopback_kube_ipvs0_and_other_families() {
        let addrs =
            [a("lo", "127.0.0.1"), a("eth0", "192.168.50.2"), a("kube-ipvs0", "10.96.0.10"), a("eth0", "fd00::2")];
        let c = plan_context(&settings(NodePortFilter::All), &NodeInfo::default(), &addrs);
        assert_eq!(c.node_port_ips, vec!["192.168.50.2".parse::<IpAddr>().unwrap()]);
        assert!(c.node_addresses.contains(&"127.0.0.1".parse().unwrap()));
        assert!(!c.node_addresses.contains(&"10.96.0.10".parse().unwrap()));
        assert_eq!(c.scheduler, "rr");
        assert_eq!(c.node_ip, Some("192.168.50.2".parse().unwrap()));
    }

    #[test]
    fn node_port_addresses_cidrs_filter() {
        let addrs = [a("eth0", "192.168.50.2"), a("eth1", "172.16.0.2")];
        let c = plan_context(
            &settings(NodePortFilter::Cidrs(vec!["172.16.0.0/16".parse().unwrap()])),
            &NodeInfo::default(),
            &addrs,
        );
        assert_eq!(c.node_port_ips, vec!["172.16.0.2".parse::<IpAddr>().unwrap()]);
    }
}
