//! What each proxy mode owns in the kernel's iptables: its chains, the
//! jumps from the built-in chains to them, the canary chain and the
//! per-service chain prefixes. The planner renders rules into these chains;
//! the iptables handle ensures a mode's jumps before its first restore and on
//! full resyncs, watches the canary, and removes a mode's chains on cleanup.

/// A jump from a built-in chain to one of ours (upstream's iptablesJumpChain).
/// On every full sync, before the restore, each missing jump is inserted at
/// position [`JUMP_POSITION`] in [`ChainProfile::jumps`] order (upstream's EnsureRule
/// Prepend, after EnsureChain of `to`), so on a fresh node the last one
/// listed for a chain ends up first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Jump {
    pub table: &'static str,
    /// The built-in chain.
    pub from: &'static str,
    /// Matches before the comment (`-m conntrack --ctstate NEW`), or "".
    pub extra: &'static str,
    /// The comment, or "" for none.
    pub comment: &'static str,
    /// Our chain.
    pub to: &'static str,
}

/// Where a missing jump is inserted (`-I <from> 1 ...`).
pub const JUMP_POSITION: u32 = 1;

impl Jump {
    /// The rule as `iptables-save` prints it, without `-A <from>`.
    pub fn spec(&self) -> String {
        let mut s = String::new();
        if !self.extra.is_empty() {
            s.push_str(self.extra);
            s.push(' ');
        }
        if !self.comment.is_empty() {
            s.push_str(&format!("-m comment --comment \"{}\" ", self.comment));
        }
        s.push_str("-j ");
        s.push_str(self.to);
        s
    }

    /// The `iptables-save` line (`-A <from> <spec>`).
    pub fn save_line(&self) -> String {
        format!("-A {} {}", self.from, self.spec())
    }

    /// The restore line that inserts it (`-I <from> 1 <spec>`).
    pub fn insert_line(&self) -> String {
        format!("-I {} {JUMP_POSITION} {}", self.from, self.spec())
    }
}

/// Builds a [`Jump`].
pub const fn jump(
    table: &'static str,
    from: &'static str,
    extra: &'static str,
    comment: &'static str,
    to: &'static str,
) -> Jump {
    Jump { table, from, extra, comment, to }
}

/// What one proxy mode owns in iptables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainProfile {
    pub mode: &'static str,
    /// Ensured before the first restore and on every full one, in order;
    /// removed by cleanup.
    pub jumps: &'static [Jump],
    /// Ensured after `jumps`, never removed (kubelet's, which kube-proxy keeps).
    pub kept_jumps: &'static [Jump],
    /// nat chains cleanup flushes and deletes if present.
    pub nat_chains: &'static [&'static str],
    /// filter chains cleanup flushes and deletes if present.
    pub filter_chains: &'static [&'static str],
    /// The per-service chains (`KUBE-SVC-...`, [`is_service_chain`])
    /// in nat are this mode's too.
    pub service_chains: bool,
    /// (table, chain) only this mode writes: finding one means the node ran it.
    pub markers: &'static [(&'static str, &'static str)],
}

/// The canary chain, in mangle, nat and filter: the planner declares it on
/// full syncs, the iptables handle notices an external flush by its absence.
pub const CANARY: &str = "KUBE-PROXY-CANARY";

/// Prefix of the chain holding a service port's Cluster-policy endpoints.
pub const SVC_PREFIX: &str = "KUBE-SVC-";
/// Prefix of the chain holding a service port's Local-policy endpoints.
pub const SVL_PREFIX: &str = "KUBE-SVL-";
/// Prefix of the chain for external destinations (NodePort, LB, externalIPs).
pub const EXT_PREFIX: &str = "KUBE-EXT-";
/// Prefix of the loadBalancerSourceRanges chain.
pub const FW_PREFIX: &str = "KUBE-FW-";
/// Prefix of a per-endpoint chain.
pub const SEP_PREFIX: &str = "KUBE-SEP-";

/// The five per-service prefixes (upstream's isServiceChainName).
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [SVC_PREFIX, SVL_PREFIX, SEP_PREFIX, FW_PREFIX, EXT_PREFIX];

/// Whether `chain` is a per-service chain of ours (upstream's isServiceChainName).
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

// iptables mode (upstream's pkg/proxy/iptables/proxier.go).

pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// kubelet's anti-martian chain; kube-proxy keeps a copy of its rule.
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";

const NEW: &str = "-m conntrack --ctstate NEW";

/// Upstream's iptablesJumpChains, in its order; `--cleanup` removes these.
pub const IPTABLES_JUMPS: [Jump; 12] = [
    jump("filter", "INPUT", NEW, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
    jump("filter", "FORWARD", NEW, "kubernetes externally-visible service portals", KUBE_EXTERNAL_SERVICES),
    jump("filter", "INPUT", "", "kubernetes health check service ports", KUBE_NODEPORTS),
    jump("filter", "FORWARD", NEW, "kubernetes service portals", KUBE_SERVICES),
    jump("filter", "OUTPUT", NEW, "kubernetes service portals", KUBE_SERVICES),
    jump("filter", "FORWARD", "", "kubernetes forwarding rules", KUBE_FORWARD),
    jump("filter", "INPUT", NEW, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
    jump("filter", "OUTPUT", NEW, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
    jump("filter", "FORWARD", NEW, "kubernetes load balancer firewall", KUBE_PROXY_FIREWALL),
    jump("nat", "OUTPUT", "", "kubernetes service portals", KUBE_SERVICES),
    jump("nat", "PREROUTING", "", "kubernetes service portals", KUBE_SERVICES),
    jump("nat", "POSTROUTING", "", "kubernetes postrouting rules", KUBE_POSTROUTING),
];

/// Upstream's iptablesKubeletJumpChains: ensured after [`IPTABLES_JUMPS`] on
/// full syncs, never removed. Their target `KUBE-FIREWALL` is only in the
/// restore input when localhost NodePorts are on; otherwise the runtime
/// creates it empty if missing (EnsureChain) and must not flush it.
pub const KUBELET_JUMPS: [Jump; 2] =
    [jump("filter", "INPUT", "", "", KUBE_FIREWALL), jump("filter", "OUTPUT", "", "", KUBE_FIREWALL)];

/// nat chains cleanup flushes and deletes if present, besides every
/// per-service chain ([`is_service_chain`]) (upstream's cleanupLeftoversForFamily).
pub const CLEANUP_NAT_CHAINS: [&str; 4] = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];
/// filter chains cleanup flushes and deletes if present (KUBE-FIREWALL stays).
pub const CLEANUP_FILTER_CHAINS: [&str; 5] =
    [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL];

/// What iptables mode owns in the kernel, for the iptables handle.
pub const IPTABLES_PROFILE: ChainProfile = ChainProfile {
    mode: "iptables",
    jumps: &IPTABLES_JUMPS,
    kept_jumps: &KUBELET_JUMPS,
    nat_chains: &CLEANUP_NAT_CHAINS,
    filter_chains: &CLEANUP_FILTER_CHAINS,
    service_chains: true,
    markers: &[("nat", KUBE_NODEPORTS), ("filter", KUBE_EXTERNAL_SERVICES), ("filter", KUBE_NODEPORTS)],
};

// IPVS mode (upstream's pkg/proxy/ipvs/proxier.go).

/// The jumps from built-in chains to ours (upstream's iptablesJumpChain of
/// IPVS mode). Upstream inserts these at position 1 if missing (EnsureRule Prepend).
pub const IPVS_JUMPS: [Jump; 9] = [
    jump("nat", "OUTPUT", "", "kubernetes service portals", "KUBE-SERVICES"),
    jump("nat", "PREROUTING", "", "kubernetes service portals", "KUBE-SERVICES"),
    jump("nat", "POSTROUTING", "", "kubernetes postrouting rules", "KUBE-POSTROUTING"),
    jump("filter", "FORWARD", "", "kubernetes forwarding rules", "KUBE-FORWARD"),
    jump("filter", "INPUT", "", "kubernetes health check rules", "KUBE-NODE-PORT"),
    jump("filter", "INPUT", "", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"),
    jump("filter", "FORWARD", "", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"),
    jump("filter", "INPUT", "", "kubernetes ipvs access filter", "KUBE-IPVS-FILTER"),
    jump("filter", "OUTPUT", "", "kubernetes ipvs access filter", "KUBE-IPVS-OUT-FILTER"),
];

/// IPVS mode's chains per table, in upstream's order.
pub const IPVS_NAT_CHAINS: [&str; 5] =
    ["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"];
pub const IPVS_FILTER_CHAINS: [&str; 6] = [
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// What IPVS mode owns in iptables, for the iptables handle.
pub const IPVS_PROFILE: ChainProfile = ChainProfile {
    mode: "ipvs",
    jumps: &IPVS_JUMPS,
    kept_jumps: &[],
    nat_chains: &IPVS_NAT_CHAINS,
    filter_chains: &IPVS_FILTER_CHAINS,
    service_chains: false,
    markers: &[
        ("nat", "KUBE-NODE-PORT"),
        ("nat", "KUBE-LOAD-BALANCER"),
        ("filter", "KUBE-NODE-PORT"),
        ("filter", "KUBE-IPVS-FILTER"),
        ("filter", "KUBE-IPVS-OUT-FILTER"),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_chains_are_known_by_their_prefix() {
        assert!(is_service_chain("KUBE-SEP-X") && is_service_chain("KUBE-FW-X"));
        assert!(is_service_chain("KUBE-SVC-X") && is_service_chain("KUBE-SVL-X") && is_service_chain("KUBE-EXT-X"));
        assert!(!is_service_chain("KUBE-SERVICES") && !is_service_chain("KUBE-NODEPORTS"));
    }
}
