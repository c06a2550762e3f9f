//! A mode switch as its steps: what the node's earlier proxy modes left and
//! the order it goes in. Pure.
//!
//! The new mode's first sync comes first, complete and committed; only then
//! do the earlier modes' pieces go: their iptables jumps and chains (except
//! those the new mode writes too), IPVS mode's sets, virtual servers and
//! kube-ipvs0, and nftables mode's `kube-proxy` table. Connections already
//! open keep their conntrack entries (NAT is decided on a connection's first
//! packet), so no packet of theirs needs the old rules; new connections meet
//! the new mode's rules from the first sync on.

use std::fmt;

use crate::config::ProxyMode;

/// What the earlier modes left in one family, as found in the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found {
    /// iptables mode's chains (its markers: KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES).
    pub iptables_chains: bool,
    /// IPVS mode's chains (its markers: KUBE-NODE-PORT, KUBE-IPVS-FILTER, ...).
    pub ipvs_chains: bool,
    /// nftables mode's `kube-proxy` table.
    pub nftables_table: bool,
}

/// One step of a switch, in the order [`switch_steps`] gives them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchStep {
    /// The new mode's first sync, complete and committed.
    FirstSync(ProxyMode),
    /// The iptables jumps and chains of `modes`, except those `keep` (the
    /// new mode, when it writes iptables rules too) writes as well.
    RemoveChains { modes: Vec<ProxyMode>, keep: Option<ProxyMode> },
    /// IPVS mode's sets, virtual servers and kube-ipvs0.
    RemoveIpvsState,
    /// nftables mode's `kube-proxy` table.
    DeleteNftablesTable,
}

impl fmt::Display for SwitchStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SwitchStep::FirstSync(mode) => write!(f, "first: {mode} mode's first sync, complete and committed"),
            SwitchStep::RemoveChains { modes, keep } => {
                let modes: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
                write!(f, "then: remove {} mode's iptables jumps and chains", modes.join(" and "))?;
                match keep {
                    Some(keep) => write!(f, " (keeping those {keep} mode writes too)"),
                    None => Ok(()),
                }
            }
            SwitchStep::RemoveIpvsState => write!(f, "then: remove IPVS mode's ipsets, virtual servers and kube-ipvs0"),
            SwitchStep::DeleteNftablesTable => write!(f, "then: delete nftables mode's kube-proxy table"),
        }
    }
}

/// The steps of a start in `new` mode on a node where `found` was left:
/// nothing when nothing of another mode is there (a restart in the same
/// mode), else the new mode's first sync, then each leftover's removal.
pub fn switch_steps(new: ProxyMode, found: Found) -> Vec<SwitchStep> {
    let mut after = Vec::new();
    let chains: Vec<ProxyMode> = [(ProxyMode::Iptables, found.iptables_chains), (ProxyMode::Ipvs, found.ipvs_chains)]
        .into_iter()
        .filter(|&(mode, there)| there && mode != new)
        .map(|(mode, _)| mode)
        .collect();
    if !chains.is_empty() {
        let keep = (new != ProxyMode::Nftables).then_some(new);
        after.push(SwitchStep::RemoveChains { modes: chains, keep });
    }
    if found.ipvs_chains && new != ProxyMode::Ipvs {
        after.push(SwitchStep::RemoveIpvsState);
    }
    if found.nftables_table && new != ProxyMode::Nftables {
        after.push(SwitchStep::DeleteNftablesTable);
    }
    if after.is_empty() {
        return after;
    }
    let mut steps = vec![SwitchStep::FirstSync(new)];
    steps.extend(after);
    steps
}

#[cfg(test)]
mod tests {
    use super::SwitchStep::*;
    use super::*;
    use crate::config::ProxyMode::{Iptables, Ipvs, Nftables};

    const IPTABLES: Found = Found { iptables_chains: true, ipvs_chains: false, nftables_table: false };
    const IPVS: Found = Found { iptables_chains: false, ipvs_chains: true, nftables_table: false };
    const NFTABLES: Found = Found { iptables_chains: false, ipvs_chains: false, nftables_table: true };

    #[test]
    fn every_pair_syncs_the_new_mode_first_then_removes_the_old() {
        let chains = |old, keep| RemoveChains { modes: vec![old], keep };
        let table: [(&str, ProxyMode, Found, Vec<SwitchStep>); 6] = [
            ("iptables → nftables", Nftables, IPTABLES, vec![FirstSync(Nftables), chains(Iptables, None)]),
            ("nftables → iptables", Iptables, NFTABLES, vec![FirstSync(Iptables), DeleteNftablesTable]),
            ("ipvs → nftables", Nftables, IPVS, vec![FirstSync(Nftables), chains(Ipvs, None), RemoveIpvsState]),
            ("nftables → ipvs", Ipvs, NFTABLES, vec![FirstSync(Ipvs), DeleteNftablesTable]),
            (
                "ipvs → iptables",
                Iptables,
                IPVS,
                vec![FirstSync(Iptables), chains(Ipvs, Some(Iptables)), RemoveIpvsState],
            ),
            ("iptables → ipvs", Ipvs, IPTABLES, vec![FirstSync(Ipvs), chains(Iptables, Some(Ipvs))]),
        ];
        for (name, new, found, want) in table {
            assert_eq!(switch_steps(new, found), want, "{name}");
        }
    }

    #[test]
    fn a_restart_in_the_same_mode_has_no_steps() {
        assert_eq!(switch_steps(Iptables, IPTABLES), []);
        assert_eq!(switch_steps(Ipvs, IPVS), []);
        assert_eq!(switch_steps(Nftables, NFTABLES), []);
        assert_eq!(switch_steps(Nftables, Found::default()), []);
    }

    #[test]
    fn every_earlier_mode_found_goes_after_the_first_sync() {
        let all = Found { iptables_chains: true, ipvs_chains: true, nftables_table: true };
        let steps = switch_steps(Nftables, all);
        assert_eq!(
            steps,
            [FirstSync(Nftables), RemoveChains { modes: vec![Iptables, Ipvs], keep: None }, RemoveIpvsState]
        );
        let steps = switch_steps(Iptables, all);
        assert_eq!(
            steps,
            [
                FirstSync(Iptables),
                RemoveChains { modes: vec![Ipvs], keep: Some(Iptables) },
                RemoveIpvsState,
                DeleteNftablesTable
            ]
        );
    }

    #[test]
    fn steps_read_as_a_plan() {
        let text: Vec<String> = switch_steps(Iptables, IPVS).iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "first: iptables mode's first sync, complete and committed",
                "then: remove ipvs mode's iptables jumps and chains (keeping those iptables mode writes too)",
                "then: remove IPVS mode's ipsets, virtual servers and kube-ipvs0",
            ]
        );
    }
}
