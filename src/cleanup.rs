//! Removing what a proxy mode left in the kernel: `--cleanup` (every
//! mode's state, both families: [`cleanup`]) and, at every start, what
//! the node's earlier mode left ([`clean_other_modes`], upstream's
//! CleanupLeftovers of the inactive proxiers).

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

/// A node switching modes: removes what the other modes left (upstream's
/// CleanupLeftovers of the inactive proxiers: iptables and IPVS mode's
/// rules, sets and IPVS state when switching to nftables mode; our
/// nftables table when switching to iptables or IPVS mode). Only what is
/// there, so a plain restart touches nothing; what cannot be removed is
/// logged.
pub async fn clean_other_modes(mode: ProxyMode, family: IpFamily) {
    let others: &[&'static ChainProfile] = match mode {
        ProxyMode::Iptables => &[&IPVS_PROFILE],
        ProxyMode::Ipvs => &[&IPTABLES_PROFILE],
        ProxyMode::Nftables => &[&IPTABLES_PROFILE, &IPVS_PROFILE],
    };
    let mut found: Vec<&'static ChainProfile> = Vec::new();
    for other in others {
        match IptablesHandle::new(family).for_mode(other).has_leftovers().await {
            Ok(false) => {}
            Ok(true) => found.push(other),
            Err(e) => tracing::warn!(error = %e, mode = other.mode, "cannot check for the other mode's rules"),
        }
    }
    for other in &found {
        tracing::info!(mode = other.mode, "removing what the node's earlier proxy mode left");
    }
    let errors = match (mode, found.as_slice()) {
        (_, []) => Vec::new(),
        (ProxyMode::Iptables, _) => cleanup_ipvs_mode(family).await,
        (ProxyMode::Ipvs, _) => cleanup_iptables_mode(family).await,
        (ProxyMode::Nftables, found) => {
            // Both modes' chains in one restore when both are there: they share chains.
            let mut errors = match IptablesHandle::new(family).cleanup_modes(found).await {
                Ok(()) => Vec::new(),
                Err(source) => vec![LeftoverError::Iptables { what: "iptables", family, source }],
            };
            if found.iter().any(|p| p.mode == IPVS_PROFILE.mode) {
                errors.extend(cleanup_ipvs_state(family).await);
            }
            errors
        }
    };
    for e in errors {
        tracing::warn!(error = %e, "cleaning up the other mode");
    }
    if mode != ProxyMode::Nftables {
        match delete_nftables_table(family).await {
            Ok(true) => tracing::info!(table = NFT_TABLE, "removed what the node's earlier nftables mode left"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "cleaning up nftables mode's table"),
        }
    }
}

/// iptables mode's jumps and chains (per-service ones included).
async fn cleanup_iptables_mode(family: IpFamily) -> Vec<LeftoverError> {
    match IptablesHandle::new(family).for_mode(&IPTABLES_PROFILE).cleanup().await {
        Ok(()) => Vec::new(),
        Err(source) => vec![LeftoverError::Iptables { what: "iptables mode's rules", family, source }],
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
