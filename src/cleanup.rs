//! Removing what a proxy mode left in the kernel: `--cleanup` (every
//! mode's state, both families: [`cleanup`]) and, at every start, what
//! the node's earlier mode left, after the new mode's first sync and IPVS
//! mode's drain ([`switch_modes`], in the steps of [`crate::plan::switch`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::ProxyMode;
use crate::kernel::ipset::netlink::{IpsetError, NetlinkIpset};
use crate::kernel::iptables::chains::ChainProfile;
use crate::kernel::iptables::IptablesHandle;
use crate::kernel::ipvs::netlink::{IpvsError, NetlinkIpvs};
use crate::kernel::link::DummyLink;
use crate::kernel::netlink::Errno;
use crate::kernel::nftables::{NetlinkNftables, NftOp, TransactionError};
use crate::kernel::KernelError;
use crate::msgs::{IpvsOp, VsKey};
use crate::net::ip_family_label;
use crate::net::IpFamily;
use crate::plan::iptables::PROFILE as IPTABLES_PROFILE;
use crate::plan::ipvs::rules::PROFILE as IPVS_PROFILE;
use crate::plan::ipvs::IpvsSet;
use crate::plan::nftables::names::TABLE as NFT_TABLE;
use crate::plan::nftables::ruleset::nft_family;
use crate::plan::switch::{drain_round, switch_steps, DrainRound, Found, SwitchStep};
use crate::stats::{unix_ms, StatsRegistry, SwitchDrain};

/// One piece of a mode's state that could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum LeftoverError {
    /// Rules and chains of the modes named.
    #[error("{what} ({family:?}): {source}")]
    Iptables {
        what: &'static str,
        family: IpFamily,
        #[source]
        source: KernelError,
    },
    #[error("ipsets ({family:?}): {source}")]
    IpsetSocket {
        family: IpFamily,
        #[source]
        source: KernelError,
    },
    #[error("ipset {name}: {source}")]
    Ipset {
        name: String,
        #[source]
        source: IpsetError,
    },
    #[error("IPVS: {0}")]
    Ipvs(#[source] IpvsError),
    #[error("deleting virtual server {vs}: {source}")]
    IpvsDrain {
        vs: VsKey,
        #[source]
        source: IpvsError,
    },
    #[error("flushing IPVS: {0}")]
    IpvsFlush(#[source] IpvsError),
    #[error("rtnetlink: {0}")]
    Rtnetlink(#[source] KernelError),
    #[error("kube-ipvs0: {0}")]
    DummyLink(#[source] KernelError),
    #[error("nf_tables netlink socket: {0}")]
    NftablesSocket(#[source] std::io::Error),
    #[error("deleting table {family} {}: {source}", NFT_TABLE)]
    NftablesTable {
        family: &'static str,
        #[source]
        source: TransactionError,
    },
}

/// `--cleanup` could not remove everything: each piece's error.
#[derive(Debug, thiserror::Error)]
#[error("cleanup incomplete: {}", join(.0))]
pub struct CleanupError(pub Vec<LeftoverError>);

fn join(errors: &[LeftoverError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// `--cleanup`: removes what any mode installed, in both families: every
/// virtual server, set, rule and address of ours, and nftables mode's
/// `kube-proxy` tables.
pub fn cleanup() -> Result<(), CleanupError> {
    let system = actix_rt::System::new();
    system.block_on(async {
        let mut errors = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            // Both modes' chains in one restore: they share chains that the other's may reference.
            let both = [&IPTABLES_PROFILE, &IPVS_PROFILE];
            if let Err(source) = IptablesHandle::new(family).cleanup_modes(&both, None).await {
                errors.push(LeftoverError::Iptables { what: "iptables", family, source });
            }
            errors.extend(cleanup_ipvs_mode(family).await);
            if let Err(e) = delete_nftables_table(family).await {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            tracing::info!("cleanup done");
            Ok(())
        } else {
            Err(CleanupError(errors))
        }
    })
}

/// How a start treats what the node's earlier mode left, shared by the
/// node's families (IPVS and kube-ipvs0 are one per node: the family that
/// finishes last removes them).
#[derive(Clone)]
pub struct SwitchPolicy {
    /// IPVS mode's drain: its limit (`None`: until the connections end)
    /// and how often IPVS is read meanwhile.
    drain_timeout: Option<Duration>,
    check_every: Duration,
    /// Where the drain is reported (dashboard and metrics).
    report: StatsRegistry,
    node: Arc<NodeShare>,
}

/// The families still switching, and whether one of them left IPVS mode.
struct NodeShare {
    families_left: AtomicUsize,
    ipvs_removed: AtomicBool,
}

impl SwitchPolicy {
    /// A serving daemon's switch over `families` families: IPVS mode's
    /// virtual servers drain (at most `drain_timeout`), read every
    /// `check_every`, reported to `report`.
    pub fn draining(
        families: usize,
        drain_timeout: Option<Duration>,
        check_every: Duration,
        report: StatsRegistry,
    ) -> SwitchPolicy {
        let node = NodeShare { families_left: AtomicUsize::new(families), ipvs_removed: AtomicBool::new(false) };
        SwitchPolicy { drain_timeout, check_every, report, node: Arc::new(node) }
    }

    /// `--init-only`: everything goes at once, as upstream's platformCleanup.
    pub fn at_once(families: usize) -> SwitchPolicy {
        SwitchPolicy::draining(families, Some(Duration::ZERO), Duration::ZERO, StatsRegistry::default())
    }

    /// A family is through; `true` for the last one when a family removed
    /// IPVS mode's state.
    fn family_done(&self, removed_ipvs: bool) -> bool {
        if removed_ipvs {
            self.node.ipvs_removed.store(true, Ordering::SeqCst);
        }
        self.node.families_left.fetch_sub(1, Ordering::SeqCst) == 1 && self.node.ipvs_removed.load(Ordering::SeqCst)
    }
}

/// A node switching modes: finds what the other modes left in `family`
/// and logs the switch's steps ([`switch_steps`]); once `first_sync` says
/// the new mode's first sync succeeded, drains IPVS mode's virtual servers
/// and removes the rest (upstream's CleanupLeftovers of the inactive
/// proxiers, which upstream runs before its first sync). Only what is
/// there, so a plain restart touches nothing; what cannot be removed is
/// logged. Nothing goes when `first_sync` ends without a sync (the daemon
/// stopped first).
pub async fn switch_modes(
    mode: ProxyMode,
    family: IpFamily,
    first_sync: impl Future<Output = bool>,
    policy: SwitchPolicy,
) {
    let steps = switch_steps(mode, find_other_modes(mode, family).await, policy.drain_timeout);
    for step in &steps {
        tracing::info!(family = ?family, %step, "switching proxy mode");
    }
    if !steps.is_empty() && !first_sync.await {
        tracing::info!(family = ?family, "stopped before the first sync: the earlier mode's state stays");
        return;
    }
    let removed_ipvs = steps.contains(&SwitchStep::RemoveIpvsState);
    for step in steps {
        for e in remove(step, family, &policy).await {
            tracing::warn!(error = %e, "cleaning up the other mode");
        }
    }
    if policy.family_done(removed_ipvs) {
        for e in remove_ipvs_node_state().await {
            tracing::warn!(error = %e, "cleaning up the other mode");
        }
    }
}

/// IPVS mode's drain in `family`: each round reads IPVS, removes the
/// virtual servers [`drain_round`] says, logs and reports what stays, until
/// nothing does.
async fn drain_ipvs(family: IpFamily, policy: &SwitchPolicy) -> Vec<LeftoverError> {
    let ipvs = match NetlinkIpvs::connect().await {
        Ok(ipvs) => ipvs,
        Err(IpvsError::NotAvailable) => return Vec::new(),
        Err(e) => return vec![LeftoverError::Ipvs(e)],
    };
    let started = Instant::now();
    let since_ms = unix_ms(SystemTime::now());
    let mut errors = Vec::new();
    let mut said = None;
    loop {
        let round = match connections_through(&ipvs, family).await {
            Ok(servers) => drain_round(&servers, started.elapsed(), policy.drain_timeout),
            Err(e) => {
                tracing::warn!(family = ?family, error = %e, "draining IPVS mode: cannot read IPVS; reading it again later");
                tokio::time::sleep(policy.check_every).await;
                continue;
            }
        };
        let ops: Vec<IpvsOp> = round.delete.iter().map(|vs| IpvsOp::DelService(*vs)).collect();
        for (vs, result) in round.delete.iter().zip(ipvs.apply(&ops).await) {
            if let Err(source) = result {
                errors.push(LeftoverError::IpvsDrain { vs: *vs, source });
            }
        }
        log_round(family, &round, &mut said);
        policy.report.drain_progress(drain_status(family, &round, since_ms, policy.drain_timeout));
        if round.done() {
            return errors;
        }
        tokio::time::sleep(policy.check_every).await;
    }
}

/// One log line per drain step: what went and what stays, when either changed.
fn log_round(family: IpFamily, round: &DrainRound, said: &mut Option<(usize, u64)>) {
    if round.cut_connections > 0 {
        tracing::warn!(
            family = ?family,
            connections = round.cut_connections,
            "IPVS mode's drain timed out: removing the virtual servers that still carry connections"
        );
    }
    let now = (round.remaining_servers, round.remaining_connections);
    if round.delete.is_empty() && *said == Some(now) {
        return;
    }
    *said = Some(now);
    if round.done() {
        tracing::info!(family = ?family, removed = round.delete.len(), "IPVS mode's virtual servers drained");
    } else {
        tracing::info!(
            family = ?family,
            removed = round.delete.len(),
            virtual_servers = round.remaining_servers,
            connections = round.remaining_connections,
            "draining IPVS mode's virtual servers: those with connections stay until they end"
        );
    }
}

fn drain_status(family: IpFamily, round: &DrainRound, since_ms: u64, timeout: Option<Duration>) -> SwitchDrain {
    SwitchDrain {
        mode: ProxyMode::Ipvs.as_str(),
        family: ip_family_label(family),
        draining: !round.done(),
        virtual_servers: round.remaining_servers,
        connections: round.remaining_connections,
        since_ms,
        timeout_s: timeout.map_or(0, |t| t.as_secs()),
    }
}

/// `family`'s virtual servers with the connections IPVS tracks through
/// each, for a preview (read only; nothing when IPVS cannot be read, which
/// is logged).
pub async fn ipvs_connections(family: IpFamily) -> Vec<(VsKey, u64)> {
    let read = async { connections_through(&NetlinkIpvs::connect().await?, family).await };
    read.await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read IPVS's connections");
        Vec::new()
    })
}

/// `family`'s virtual servers with the connections IPVS tracks through
/// each (its real servers' active and inactive counts).
async fn connections_through(ipvs: &NetlinkIpvs, family: IpFamily) -> Result<Vec<(VsKey, u64)>, IpvsError> {
    let mut out = Vec::new();
    for (vs, _) in ipvs.services().await? {
        if !family.matches(&vs.addr) {
            continue;
        }
        let dests = ipvs.dests(&vs).await?;
        let connections = dests.iter().map(|(_, _, active, inactive)| u64::from(*active) + u64::from(*inactive)).sum();
        out.push((vs, connections));
    }
    Ok(out)
}

/// What the other modes than `mode` left in `family` (read only).
pub async fn find_other_modes(mode: ProxyMode, family: IpFamily) -> Found {
    let chains = |other: ProxyMode| async move {
        let Some(profile) = chain_profile(other).filter(|_| other != mode) else { return false };
        match IptablesHandle::new(family).for_mode(profile).has_leftovers().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, mode = profile.mode, "cannot check for the other mode's rules");
                false
            }
        }
    };
    let nftables_table = mode != ProxyMode::Nftables && nftables_table_there(family).await;
    Found {
        iptables_chains: chains(ProxyMode::Iptables).await,
        ipvs_chains: chains(ProxyMode::Ipvs).await,
        nftables_table,
    }
}

/// Whether nftables mode's table of `family` is there (when that cannot be
/// read: assumed there, and its deletion tells).
async fn nftables_table_there(family: IpFamily) -> bool {
    let nft = match NetlinkNftables::new() {
        Ok(nft) => nft,
        Err(e) => {
            tracing::warn!(error = %e, "cannot check for nftables mode's table");
            return true;
        }
    };
    match nft.table_info(family, NFT_TABLE).await {
        Ok(table) => table.is_some(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot check for nftables mode's table");
            true
        }
    }
}

/// The iptables chains `mode` writes (none in nftables mode).
fn chain_profile(mode: ProxyMode) -> Option<&'static ChainProfile> {
    match mode {
        ProxyMode::Iptables => Some(&IPTABLES_PROFILE),
        ProxyMode::Ipvs => Some(&IPVS_PROFILE),
        ProxyMode::Nftables => None,
    }
}

/// Does one removal step of a switch in `family`.
async fn remove(step: SwitchStep, family: IpFamily, policy: &SwitchPolicy) -> Vec<LeftoverError> {
    match step {
        SwitchStep::FirstSync(_) => Vec::new(),
        SwitchStep::DrainIpvs { .. } => drain_ipvs(family, policy).await,
        SwitchStep::RemoveChains { modes, keep } => {
            for mode in &modes {
                tracing::info!(mode = mode.as_str(), "removing what the node's earlier proxy mode left");
            }
            let profiles: Vec<&ChainProfile> = modes.into_iter().filter_map(chain_profile).collect();
            let keep = keep.and_then(chain_profile);
            // The modes' chains in one restore: they share chains that the other's may reference.
            match IptablesHandle::new(family).cleanup_modes(&profiles, keep).await {
                Ok(()) => Vec::new(),
                Err(source) => vec![LeftoverError::Iptables { what: "iptables", family, source }],
            }
        }
        SwitchStep::RemoveIpvsState => destroy_ipvs_sets(family).await,
        SwitchStep::DeleteNftablesTable => match delete_nftables_table(family).await {
            Ok(true) => {
                tracing::info!(table = NFT_TABLE, "removed what the node's earlier nftables mode left");
                Vec::new()
            }
            Ok(false) => Vec::new(),
            Err(e) => vec![e],
        },
    }
}

/// IPVS mode's state: its iptables rules first (they name the sets), then
/// the sets, IPVS (flushed, as upstream) and kube-ipvs0.
async fn cleanup_ipvs_mode(family: IpFamily) -> Vec<LeftoverError> {
    let mut errors = Vec::new();
    if let Err(source) = IptablesHandle::new(family).cleanup().await {
        errors.push(LeftoverError::Iptables { what: "IPVS mode's rules", family, source });
    }
    errors.extend(cleanup_ipvs_state(family).await);
    errors
}

/// IPVS mode's state besides its rules: the sets, and in IPv4 IPVS
/// (flushed, as upstream) and kube-ipvs0.
async fn cleanup_ipvs_state(family: IpFamily) -> Vec<LeftoverError> {
    let mut errors = destroy_ipvs_sets(family).await;
    if family == IpFamily::V4 {
        errors.extend(remove_ipvs_node_state().await);
    }
    errors
}

/// IPVS mode's sets of `family`.
async fn destroy_ipvs_sets(family: IpFamily) -> Vec<LeftoverError> {
    let mut errors = Vec::new();
    match NetlinkIpset::new() {
        Ok(ipset) => {
            for set in IpvsSet::ALL {
                let name = set.name(family);
                if let Err(source) = ipset.destroy(&name).await {
                    errors.push(LeftoverError::Ipset { name, source });
                }
            }
        }
        Err(source) => errors.push(LeftoverError::IpsetSocket { family, source }),
    }
    errors
}

/// What IPVS mode keeps once per node: IPVS (flushed, as upstream) and kube-ipvs0.
async fn remove_ipvs_node_state() -> Vec<LeftoverError> {
    let mut errors = Vec::new();
    match NetlinkIpvs::connect().await {
        Ok(ipvs) => {
            if let Err(e) = ipvs.flush().await {
                errors.push(LeftoverError::IpvsFlush(e));
            }
        }
        Err(IpvsError::NotAvailable) => tracing::debug!("no IPVS in this kernel: nothing to flush"),
        Err(e) => errors.push(LeftoverError::Ipvs(e)),
    }
    match DummyLink::new() {
        Ok(link) => {
            if let Err(e) = link.delete_link().await {
                errors.push(LeftoverError::DummyLink(e));
            }
        }
        Err(e) => errors.push(LeftoverError::Rtnetlink(e)),
    }
    errors
}

/// Deletes nftables mode's `kube-proxy` table of `family` (upstream's
/// nftables CleanupLeftovers): `Ok(false)` when there was none.
async fn delete_nftables_table(family: IpFamily) -> Result<bool, LeftoverError> {
    let nft = NetlinkNftables::new().map_err(LeftoverError::NftablesSocket)?;
    match nft.apply(family, NFT_TABLE, &[NftOp::DeleteTable]).await {
        Ok(()) => Ok(true),
        Err(TransactionError::Refused { errno, .. }) if errno == Errno::ENOENT => Ok(false),
        Err(source) => Err(LeftoverError::NftablesTable { family: nft_family(family), source }),
    }
}
