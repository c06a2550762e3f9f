//! Benchmark support: a deterministic synthetic cluster and churn
//! generator, used by the `kpr-bench` binary and by tests that need a
//! realistic cluster of a given size.

pub mod daemon_run;
pub mod dual;
pub mod gen;
pub mod iptables_kernel;
pub mod ipvs_kernel;
pub mod nftables_kernel;
pub mod soak;
pub mod stats;

use crate::net::IpFamily;
use crate::plan::context::{LocalAddr, NodePortFilter, PlanSettings};
use crate::plan::ipvs::rules::IpvsRulesConfig;
use crate::plan::local::LocalDetector;
use gen::{node_ip, THIS_NODE};

/// The value of field `name` (`ports`, `ms`, ...) in one of the daemon's
/// tracing text lines (` name=value`), as written (quotes kept).
pub fn log_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

const FAMILY: IpFamily = IpFamily::V4;

/// The planner's settings of the bench node ([`gen::THIS_NODE`]).
pub fn plan_settings() -> PlanSettings {
    plan_settings_for(FAMILY)
}

/// [`plan_settings`] of one family's proxier (dual-stack benches).
pub fn plan_settings_for(family: IpFamily) -> PlanSettings {
    PlanSettings { family, node_name: THIS_NODE.into(), scheduler: String::new(), node_ports: NodePortFilter::All }
}

/// This node's interface addresses: one, node-0's InternalIP (NodePort
/// virtual servers are planned on it; IPVS does not need it on a link).
pub fn local_addrs() -> Vec<LocalAddr> {
    vec![LocalAddr { ifname: "eth0".into(), ip: node_ip(0).into() }]
}

/// [`local_addrs`] and their IPv6 twins ([`dual::v6_of`]): the bench
/// node's addresses on a dual-stack cluster.
pub fn local_addrs_dual() -> Vec<LocalAddr> {
    let v4 = node_ip(0);
    vec![
        LocalAddr { ifname: "eth0".into(), ip: v4.into() },
        LocalAddr { ifname: "eth0".into(), ip: dual::v6_of(v4).into() },
    ]
}

/// IPVS mode's iptables rules settings: the generator's pod range is local;
/// `--random-fully` as the iptables at hand supports it.
pub fn rules_config(random_fully: bool) -> IpvsRulesConfig {
    IpvsRulesConfig {
        family: FAMILY,
        masquerade_all: false,
        masquerade_bit: 14,
        local: LocalDetector::Cidr(ipnet::IpNet::V4(ipnet::Ipv4Net::new([10, 0, 0, 0].into(), 8).unwrap_or_default())),
        random_fully,
    }
}
