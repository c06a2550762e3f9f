//! Removing what a proxy mode left in the kernel: `--cleanup` (every
//! mode's state, both families: [`cleanup`]) and, at every start, what
//! the node's earlier mode left, after the new mode's first sync
//! ([`switch_modes`], in the steps of [`crate::plan::switch`]).

use std::future::Future;

use crate::config::ProxyMode;
use crate::kernel::ipset::netlink::{IpsetError, NetlinkIpset};
use crate::kernel::iptables::chains::ChainProfile;
use crate::kernel::iptables::IptablesHandle;
use crate::kernel::ipvs::netlink::{IpvsError, NetlinkIpvs};
use crate::kernel::link::DummyLink;
use crate::kernel::netlink::Errno;
use crate::kernel::nftables::{NetlinkNftables, NftOp, TransactionError};
use crate::kernel::KernelError;
use crate::net::IpFamily;
use crate::plan::iptables::PROFILE as IPTABLES_PROFILE;
use crate::plan::ipvs::rules::PROFILE as IPVS_PROFILE;
use crate::plan::ipvs::IpvsSet;
use crate::plan::nftables::names::TABLE as NFT_TABLE;
use crate::plan::nftables::ruleset::nft_family;
use crate::plan::switch::{switch_steps, Found, SwitchStep};

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
            if let Err(source) = IptablesHandle::new(family).cleanup_modes(&both).await {
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

/// A node switching modes: finds what the other modes left in `family`
/// and logs the switch's steps ([`switch_steps`]); once `first_sync` says
/// the new mode's first sync succeeded, removes it (upstream's
/// CleanupLeftovers of the inactive proxiers, which upstream runs before
/// its first sync). Only what is there, so a plain restart touches
/// nothing; what cannot be removed is logged. Nothing goes when
/// `first_sync` ends without a sync (the daemon stopped first).
pub async fn switch_modes(mode: ProxyMode, family: IpFamily, first_sync: impl Future<Output = bool>) {
    let steps = switch_steps(mode, find_other_modes(mode, family).await);
    if steps.is_empty() {
        return;
    }
    for step in &steps {
        tracing::info!(family = ?family, %step, "switching proxy mode");
    }
    if !first_sync.await {
        tracing::info!(family = ?family, "stopped before the first sync: the earlier mode's state stays");
        return;
    }
    for step in steps {
        for e in remove(step, family).await {
            tracing::warn!(error = %e, "cleaning up the other mode");
        }
    }
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
async fn remove(step: SwitchStep, family: IpFamily) -> Vec<LeftoverError> {
    match step {
        SwitchStep::FirstSync(_) => Vec::new(),
        SwitchStep::RemoveChains { modes, keep } => {
            for mode in &modes {
                tracing::info!(mode = mode.as_str(), "removing what the node's earlier proxy mode left");
            }
            let profiles: Vec<&ChainProfile> = modes.into_iter().filter_map(chain_profile).collect();
            let keep = keep.and_then(chain_profile);
            // The modes' chains in one restore: they share chains that the other's may reference.
            match IptablesHandle::new(family).cleanup_modes_keeping(&profiles, keep).await {
                Ok(()) => Vec::new(),
                Err(source) => vec![LeftoverError::Iptables { what: "iptables", family, source }],
            }
        }
        SwitchStep::RemoveIpvsState => cleanup_ipvs_state(family).await,
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

/// IPVS mode's state besides its rules: the sets, IPVS (flushed, as
/// upstream) and kube-ipvs0.
async fn cleanup_ipvs_state(family: IpFamily) -> Vec<LeftoverError> {
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
    if family == IpFamily::V4 {
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
