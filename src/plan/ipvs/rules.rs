//! The iptables rules of IPVS mode, as upstream's IPVS proxier writes them
//! (writeIptablesRules and createAndLinkKubeChain in pkg/proxy/ipvs/proxier.go):
//! the same chains, the same rule text, the same order, so a node can switch
//! between upstream and us. Rules that match a set are written only while
//! that set has members, as upstream does.
//!
//! Beyond upstream: a `KUBE-PROXY-CANARY` chain in mangle, nat and filter, so
//! the iptables actor can notice an external flush (upstream's IPVS mode has
//! no canary and relies on its periodic full sync).

use std::fmt::Write;
use std::net::IpAddr;

use super::IpvsSet;
use crate::net::{IpFamily, Protocol};
use crate::plan::context::mark;
use crate::plan::local::{if_not_local, LocalDetector};

/// The chain vocabulary IPVS mode shares with the iptables handle.
pub use crate::kernel::iptables::chains::{
    CANARY, IPVS_FILTER_CHAINS as FILTER_CHAINS, IPVS_JUMPS as JUMPS, IPVS_NAT_CHAINS as NAT_CHAINS,
    IPVS_PROFILE as PROFILE,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsRulesConfig {
    pub family: IpFamily,
    pub masquerade_all: bool,
    pub masquerade_bit: u32,
    pub local: LocalDetector,
    /// The iptables binary supports MASQUERADE --random-fully.
    pub random_fully: bool,
}

/// Renders the iptables-restore input (for `--noflush`) of one IPVS-mode sync.
/// `has` tells which sets have members; `no_node_access` lists LB
/// (vip, protocol, port) whose source ranges exclude the node itself.
pub fn render(
    cfg: &IpvsRulesConfig,
    has: &dyn Fn(IpvsSet) -> bool,
    no_node_access: &[(IpAddr, Protocol, u16)],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "*mangle\n:{CANARY} - [0:0]\nCOMMIT");
    out.push_str("*nat\n");
    for c in NAT_CHAINS.iter().chain([&CANARY]) {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    nat_rules(&mut out, cfg, has);
    out.push_str("COMMIT\n*filter\n");
    for c in FILTER_CHAINS.iter().chain([&CANARY]) {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    filter_rules(&mut out, cfg, has, no_node_access);
    out.push_str("COMMIT\n");
    out
}

fn set_rule(out: &mut String, chain: &str, proto: &str, set: IpvsSet, cfg: &IpvsRulesConfig, dirs: &str, target: &str) {
    let _ = writeln!(
        out,
        "-A {chain}{proto} -m comment --comment \"{}\" -m set --match-set {} {dirs} -j {target}",
        set.comment(),
        set.name(cfg.family)
    );
}

fn nat_rules(out: &mut String, cfg: &IpvsRulesConfig, has: &dyn Fn(IpvsSet) -> bool) {
    let loopback = match cfg.family {
        IpFamily::V4 => "127.0.0.0/8",
        IpFamily::V6 => "::1/128",
    };
    let name = |s: IpvsSet| s.name(cfg.family);
    let _ = writeln!(out, "-A KUBE-SERVICES -s {loopback} -j RETURN");
    // upstream's ipsetWithIptablesChain, in its order
    let table: [(IpvsSet, &str, &str, &str, &str); 9] = [
        (IpvsSet::LoopBack, "KUBE-POSTROUTING", "", "dst,dst,src", "MASQUERADE"),
        (IpvsSet::LoadBalancer, "KUBE-SERVICES", "", "dst,dst", "KUBE-LOAD-BALANCER"),
        (IpvsSet::LoadBalancerLocal, "KUBE-LOAD-BALANCER", "", "dst,dst", "RETURN"),
        (IpvsSet::NodePortLocalTcp, "KUBE-NODE-PORT", " -p tcp", "dst", "RETURN"),
        (IpvsSet::NodePortTcp, "KUBE-NODE-PORT", " -p tcp", "dst", "KUBE-MARK-MASQ"),
        (IpvsSet::NodePortLocalUdp, "KUBE-NODE-PORT", " -p udp", "dst", "RETURN"),
        (IpvsSet::NodePortUdp, "KUBE-NODE-PORT", " -p udp", "dst", "KUBE-MARK-MASQ"),
        (IpvsSet::NodePortLocalSctp, "KUBE-NODE-PORT", " -p sctp", "dst,dst", "RETURN"),
        (IpvsSet::NodePortSctp, "KUBE-NODE-PORT", " -p sctp", "dst,dst", "KUBE-MARK-MASQ"),
    ];
    for (set, chain, proto, dirs, target) in table {
        if has(set) {
            set_rule(out, chain, proto, set, cfg, dirs, target);
        }
    }
    if has(IpvsSet::ClusterIp) {
        let prefix = format!(
            "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {}",
            IpvsSet::ClusterIp.comment(),
            name(IpvsSet::ClusterIp)
        );
        match (cfg.masquerade_all, if_not_local(&cfg.local)) {
            (true, _) => writeln!(out, "{prefix} dst,dst -j KUBE-MARK-MASQ"),
            (false, Some(not_local)) => writeln!(out, "{prefix} dst,dst {not_local} -j KUBE-MARK-MASQ"),
            (false, None) => writeln!(out, "{prefix} src,dst -j KUBE-MARK-MASQ"),
        }
        .ok();
    }
    for (set, masq) in [(IpvsSet::ExternalIp, true), (IpvsSet::ExternalIpLocal, false)] {
        if !has(set) {
            continue;
        }
        let prefix = format!(
            "-A KUBE-SERVICES -m comment --comment \"{}\" -m set --match-set {} dst,dst",
            set.comment(),
            name(set)
        );
        if masq {
            let _ = writeln!(out, "{prefix} -j KUBE-MARK-MASQ");
        }
        let _ = writeln!(out, "{prefix} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT");
        let _ = writeln!(out, "{prefix} -m addrtype --dst-type LOCAL -j ACCEPT");
    }
    out.push_str("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n");
    out.push_str("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n");
    for set in [IpvsSet::ClusterIp, IpvsSet::LoadBalancer] {
        if has(set) {
            let _ = writeln!(out, "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT", name(set));
        }
    }
    let m = mark(cfg.masquerade_bit);
    let _ = writeln!(out, "-A KUBE-POSTROUTING -m mark ! --mark {m}/{m} -j RETURN");
    let _ = writeln!(out, "-A KUBE-POSTROUTING -j MARK --xor-mark {m}");
    let random = if cfg.random_fully { " --random-fully" } else { "" };
    let _ = writeln!(
        out,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{random}"
    );
    let _ = writeln!(out, "-A KUBE-MARK-MASQ -j MARK --or-mark {m}");
}

fn filter_rules(
    out: &mut String,
    cfg: &IpvsRulesConfig,
    has: &dyn Fn(IpvsSet) -> bool,
    no_node_access: &[(IpAddr, Protocol, u16)],
) {
    let name = |s: IpvsSet| s.name(cfg.family);
    let table: [(IpvsSet, &str, &str, &str); 3] = [
        (IpvsSet::LoadBalancerFw, "KUBE-PROXY-FIREWALL", "dst,dst", "KUBE-SOURCE-RANGES-FIREWALL"),
        (IpvsSet::LoadBalancerSourceCidr, "KUBE-SOURCE-RANGES-FIREWALL", "dst,dst,src", "RETURN"),
        (IpvsSet::LoadBalancerSourceIp, "KUBE-SOURCE-RANGES-FIREWALL", "dst,dst,src", "RETURN"),
    ];
    for (set, chain, dirs, target) in table {
        if has(set) {
            set_rule(out, chain, "", set, cfg, dirs, target);
        }
    }
    out.push_str("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n");
    for (vip, proto, port) in no_node_access {
        let _ = writeln!(
            out,
            "-A KUBE-IPVS-OUT-FILTER -s {vip} -m ipvs --vaddr {vip} --vproto {} --vport {port} -j DROP",
            proto.lower()
        );
    }
    let m = mark(cfg.masquerade_bit);
    let _ = writeln!(
        out,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {m}/{m} -j ACCEPT"
    );
    out.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    let hc = IpvsSet::HealthCheckNodePort;
    let _ = writeln!(
        out,
        "-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {} dst -j ACCEPT",
        name(hc)
    );
    for (set, dirs) in [
        (IpvsSet::LoadBalancer, "dst,dst"),
        (IpvsSet::ClusterIp, "dst,dst"),
        (IpvsSet::ExternalIp, "dst,dst"),
        (IpvsSet::ExternalIpLocal, "dst,dst"),
        (IpvsSet::HealthCheckNodePort, "dst"),
    ] {
        let _ = writeln!(out, "-A KUBE-IPVS-FILTER -m set --match-set {} {dirs} -j RETURN", name(set));
    }
    let _ = writeln!(
        out,
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        name(IpvsSet::IpvsIps)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The research notes' worked example (docs/upstream/ipvs.md d.5), plus our canary.
    #[test]
    fn matches_upstreams_rules_for_the_worked_example() {
        let cfg = IpvsRulesConfig {
            family: IpFamily::V4,
            masquerade_all: false,
            masquerade_bit: 14,
            local: LocalDetector::Cidr("10.244.0.0/16".parse().unwrap()),
            random_fully: true,
        };
        let non_empty = [
            IpvsSet::LoopBack,
            IpvsSet::ClusterIp,
            IpvsSet::LoadBalancer,
            IpvsSet::LoadBalancerLocal,
            IpvsSet::LoadBalancerFw,
            IpvsSet::LoadBalancerSourceCidr,
            IpvsSet::NodePortTcp,
            IpvsSet::NodePortLocalTcp,
            IpvsSet::HealthCheckNodePort,
            IpvsSet::IpvsIps,
        ];
        let has = |s: IpvsSet| non_empty.contains(&s);
        let got = render(&cfg, &has, &[("203.0.113.10".parse().unwrap(), Protocol::Tcp, 443)]);
        let want = include_str!("testdata/ipvs-rules.txt");
        assert_eq!(got, want);
    }

    #[test]
    fn masquerade_all_and_no_detector_variants() {
        let mut cfg = IpvsRulesConfig {
            family: IpFamily::V4,
            masquerade_all: true,
            masquerade_bit: 14,
            local: LocalDetector::None,
            random_fully: false,
        };
        let has = |s: IpvsSet| s == IpvsSet::ClusterIp;
        let r = render(&cfg, &has, &[]);
        assert!(r.contains("--match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ\n"), "{r}");
        assert!(r.contains("-j MASQUERADE\n"));
        cfg.masquerade_all = false;
        let r = render(&cfg, &has, &[]);
        assert!(r.contains("--match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ\n"), "{r}");
        assert!(!r.contains("KUBE-LOAD-BALANCER dst,dst -j ACCEPT"));
        assert_eq!(mark(14), "0x00004000");
    }
}
