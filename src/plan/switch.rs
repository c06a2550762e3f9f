//! A mode switch as its steps: what the node's earlier proxy modes left and
//! the order it goes in ([`switch_steps`]), and the rounds of IPVS mode's
//! drain ([`drain_round`]). Pure.
//!
//! The new mode's first sync comes first, complete and committed; only then
//! do the earlier modes' pieces go: their iptables jumps and chains (except
//! those the new mode writes too), IPVS mode's sets, virtual servers and
//! kube-ipvs0, and nftables mode's `kube-proxy` table. Connections already
//! open through iptables or nftables rules keep their conntrack entries (NAT
//! is decided on a connection's first packet), so no packet of theirs needs
//! the old rules. Connections open through IPVS are different: IPVS itself
//! rewrites each of their packets, which reach it only while the virtual
//! server's address is local (kube-ipvs0) and which it drops once their
//! virtual server is gone (`expire_nodest_conn`). So leaving IPVS mode
//! drains first: each virtual server goes once IPVS tracks no connection
//! through it, every one once the drain timeout passed, and IPVS mode's
//! chains, sets and kube-ipvs0 after the last. New connections meet the new
//! mode's rules from its first sync on (they DNAT before IPVS would see
//! the packet), so they never add to the drain.

use std::fmt;
use std::time::Duration;

use crate::config::{GoDuration, ProxyMode};
use crate::msgs::VsKey;

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
    /// IPVS mode's virtual servers, each removed once IPVS tracks no
    /// connection through it, all once `timeout` passed (`None`: no limit);
    /// the other pieces of IPVS mode stay meanwhile.
    DrainIpvs { timeout: Option<Duration> },
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
            SwitchStep::DrainIpvs { timeout } => {
                write!(
                    f,
                    "then: drain IPVS mode's virtual servers, each removed when IPVS has no connection through it"
                )?;
                match timeout {
                    Some(t) => write!(f, ", all after {}", GoDuration::from(*t))?,
                    None => write!(f, ", with no time limit")?,
                }
                write!(f, "; kube-ipvs0, IPVS mode's chains and ipsets stay until then")
            }
            SwitchStep::RemoveIpvsState => write!(f, "then: remove IPVS mode's ipsets, virtual servers and kube-ipvs0"),
            SwitchStep::DeleteNftablesTable => write!(f, "then: delete nftables mode's kube-proxy table"),
        }
    }
}

/// The steps of a start in `new` mode on a node where `found` was left:
/// nothing when nothing of another mode is there (a restart in the same
/// mode), else the new mode's first sync, then (leaving IPVS mode) the
/// drain of its virtual servers, limited to `drain_timeout`, then each
/// leftover's removal.
pub fn switch_steps(new: ProxyMode, found: Found, drain_timeout: Option<Duration>) -> Vec<SwitchStep> {
    let leaving_ipvs = found.ipvs_chains && new != ProxyMode::Ipvs;
    let mut after = Vec::new();
    if leaving_ipvs {
        after.push(SwitchStep::DrainIpvs { timeout: drain_timeout });
    }
    let chains: Vec<ProxyMode> = [(ProxyMode::Iptables, found.iptables_chains), (ProxyMode::Ipvs, found.ipvs_chains)]
        .into_iter()
        .filter(|&(mode, there)| there && mode != new)
        .map(|(mode, _)| mode)
        .collect();
    if !chains.is_empty() {
        let keep = (new != ProxyMode::Nftables).then_some(new);
        after.push(SwitchStep::RemoveChains { modes: chains, keep });
    }
    if leaving_ipvs {
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

/// One round of IPVS mode's drain: which virtual servers go now and what
/// stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainRound {
    /// Removed now: those without connections, or every one once the
    /// timeout passed.
    pub delete: Vec<VsKey>,
    /// Virtual servers that stay, and the connections IPVS tracks through them.
    pub remaining_servers: usize,
    pub remaining_connections: u64,
    /// Connections cut by removing their virtual servers when the timeout
    /// passed (0 before).
    pub cut_connections: u64,
}

impl DrainRound {
    /// Nothing stays: the rest of IPVS mode's state can go.
    pub fn done(&self) -> bool {
        self.remaining_servers == 0
    }
}

/// A virtual server with the connections IPVS tracks through it.
type Draining = (VsKey, u64);

/// A round of the drain over `servers` (each virtual server with the
/// connections IPVS tracks through it: its real servers' active and
/// inactive counts), `elapsed` into a drain limited to `timeout`.
pub fn drain_round(servers: &[(VsKey, u64)], elapsed: Duration, timeout: Option<Duration>) -> DrainRound {
    let expired = timeout.is_some_and(|t| elapsed >= t);
    let (delete, keep): (Vec<&Draining>, Vec<&Draining>) =
        servers.iter().partition(|(_, connections)| expired || *connections == 0);
    DrainRound {
        remaining_servers: keep.len(),
        remaining_connections: keep.iter().map(|(_, c)| c).sum(),
        cut_connections: delete.iter().map(|(_, c)| c).sum(),
        delete: delete.into_iter().map(|(vs, _)| *vs).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::SwitchStep::*;
    use super::*;
    use crate::config::ProxyMode::{Iptables, Ipvs, Nftables};
    use crate::net::Protocol;

    const DRAIN: Option<Duration> = Some(Duration::from_secs(900));

    const IPTABLES: Found = Found { iptables_chains: true, ipvs_chains: false, nftables_table: false };
    const IPVS: Found = Found { iptables_chains: false, ipvs_chains: true, nftables_table: false };
    const NFTABLES: Found = Found { iptables_chains: false, ipvs_chains: false, nftables_table: true };

    #[test]
    fn every_pair_syncs_the_new_mode_first_then_removes_the_old() {
        let chains = |old, keep| RemoveChains { modes: vec![old], keep };
        let table: [(&str, ProxyMode, Found, Vec<SwitchStep>); 6] = [
            ("iptables → nftables", Nftables, IPTABLES, vec![FirstSync(Nftables), chains(Iptables, None)]),
            ("nftables → iptables", Iptables, NFTABLES, vec![FirstSync(Iptables), DeleteNftablesTable]),
            (
                "ipvs → nftables",
                Nftables,
                IPVS,
                vec![FirstSync(Nftables), DrainIpvs { timeout: DRAIN }, chains(Ipvs, None), RemoveIpvsState],
            ),
            ("nftables → ipvs", Ipvs, NFTABLES, vec![FirstSync(Ipvs), DeleteNftablesTable]),
            (
                "ipvs → iptables",
                Iptables,
                IPVS,
                vec![FirstSync(Iptables), DrainIpvs { timeout: DRAIN }, chains(Ipvs, Some(Iptables)), RemoveIpvsState],
            ),
            ("iptables → ipvs", Ipvs, IPTABLES, vec![FirstSync(Ipvs), chains(Iptables, Some(Ipvs))]),
        ];
        for (name, new, found, want) in table {
            assert_eq!(switch_steps(new, found, DRAIN), want, "{name}");
        }
    }

    #[test]
    fn a_restart_in_the_same_mode_has_no_steps() {
        assert_eq!(switch_steps(Iptables, IPTABLES, DRAIN), []);
        assert_eq!(switch_steps(Ipvs, IPVS, DRAIN), []);
        assert_eq!(switch_steps(Nftables, NFTABLES, DRAIN), []);
        assert_eq!(switch_steps(Nftables, Found::default(), DRAIN), []);
    }

    #[test]
    fn every_earlier_mode_found_goes_after_the_first_sync() {
        let all = Found { iptables_chains: true, ipvs_chains: true, nftables_table: true };
        let steps = switch_steps(Nftables, all, None);
        assert_eq!(
            steps,
            [
                FirstSync(Nftables),
                DrainIpvs { timeout: None },
                RemoveChains { modes: vec![Iptables, Ipvs], keep: None },
                RemoveIpvsState
            ]
        );
        let steps = switch_steps(Iptables, all, DRAIN);
        assert_eq!(
            steps,
            [
                FirstSync(Iptables),
                DrainIpvs { timeout: DRAIN },
                RemoveChains { modes: vec![Ipvs], keep: Some(Iptables) },
                RemoveIpvsState,
                DeleteNftablesTable
            ]
        );
    }

    #[test]
    fn steps_read_as_a_plan() {
        let text: Vec<String> = switch_steps(Iptables, IPVS, DRAIN).iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "first: iptables mode's first sync, complete and committed",
                "then: drain IPVS mode's virtual servers, each removed when IPVS has no connection through it, \
                 all after 15m0s; kube-ipvs0, IPVS mode's chains and ipsets stay until then",
                "then: remove ipvs mode's iptables jumps and chains (keeping those iptables mode writes too)",
                "then: remove IPVS mode's ipsets, virtual servers and kube-ipvs0",
            ]
        );
    }

    #[test]
    fn only_leaving_ipvs_mode_drains() {
        let drains = |new, found| switch_steps(new, found, DRAIN).iter().any(|s| matches!(s, DrainIpvs { .. }));
        assert!(drains(Nftables, IPVS));
        assert!(drains(Iptables, IPVS));
        assert!(!drains(Ipvs, IPVS), "a restart in IPVS mode");
        assert!(!drains(Nftables, IPTABLES));
        assert!(!drains(Iptables, NFTABLES));
        assert!(!drains(Ipvs, NFTABLES));
        let unlimited = switch_steps(Nftables, IPVS, None)[1].to_string();
        assert!(unlimited.contains("with no time limit"), "{unlimited}");
    }

    fn vs(last: u8) -> VsKey {
        VsKey { addr: std::net::Ipv4Addr::new(10, 96, 0, last).into(), protocol: Protocol::Tcp, port: 80 }
    }

    #[test]
    fn a_drain_round_removes_the_servers_without_connections_and_keeps_the_rest() {
        let servers = [(vs(1), 0), (vs(2), 3), (vs(3), 0), (vs(4), 1)];
        let round = drain_round(&servers, Duration::from_secs(10), DRAIN);
        assert_eq!(round.delete, [vs(1), vs(3)]);
        assert_eq!((round.remaining_servers, round.remaining_connections), (2, 4));
        assert_eq!(round.cut_connections, 0);
        assert!(!round.done());
    }

    #[test]
    fn a_drain_ends_when_the_last_connection_is_gone() {
        let round = drain_round(&[(vs(2), 0), (vs(4), 0)], Duration::from_secs(500), DRAIN);
        assert_eq!(round.delete, [vs(2), vs(4)]);
        assert!(round.done());
        assert_eq!(round.cut_connections, 0, "nothing was cut");
        assert!(drain_round(&[], Duration::ZERO, DRAIN).done(), "nothing to drain");
    }

    #[test]
    fn the_timeout_removes_every_server_and_says_it_cut_connections() {
        let servers = [(vs(1), 0), (vs(2), 3)];
        let before = drain_round(&servers, Duration::from_secs(899), DRAIN);
        assert_eq!(before.delete, [vs(1)]);
        let at = drain_round(&servers, Duration::from_secs(900), DRAIN);
        assert_eq!(at.delete, [vs(1), vs(2)]);
        assert!(at.done());
        assert_eq!((at.remaining_connections, at.cut_connections), (0, 3));
        let idle = drain_round(&[(vs(1), 0)], Duration::from_secs(900), DRAIN);
        assert_eq!(idle.cut_connections, 0, "no connection was cut");
    }

    #[test]
    fn without_a_timeout_connections_are_waited_for_however_long() {
        let round = drain_round(&[(vs(2), 1)], Duration::from_secs(86_400 * 30), None);
        assert!(round.delete.is_empty());
        assert_eq!(round.remaining_connections, 1);
    }
}
