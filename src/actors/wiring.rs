//! Starts the subsystem actors of a mode over a set of kernel handles
//! (real ones in the daemon, in-memory ones in tests).

use std::collections::BTreeMap;

use actix::prelude::*;

use super::conntrack::ConntrackActor;
use super::coordinator::{ConntrackTarget, IptablesTargets, NftablesTargets, Target, Targets};
use super::kernel_actor::KernelActor;
#[cfg(any(test, feature = "testkit"))]
use crate::kernel::mem::{Journal, MemConntrack, MemIpset, MemIptables, MemIpvs, MemLink};
use crate::kernel::nftables::{NfTables, NftablesTable};
use crate::kernel::{ConntrackKernel, IpsetKernel, IptablesKernel, IpvsKernel, LinkKernel, Subsystem};
use crate::msgs::DriftDetected;
use crate::net::IpFamily;
use crate::plan::ipvs::IpvsSet;
use crate::stats::StatsRegistry;

/// The kernel handles of IPVS mode, one per actor.
pub struct IpvsKernels<I, S, L, T, C> {
    pub ipvs: I,
    pub sets: BTreeMap<IpvsSet, S>,
    pub link: L,
    pub iptables: T,
    pub conntrack: C,
}

#[cfg(any(test, feature = "testkit"))]
impl IpvsKernels<MemIpvs, MemIpset, MemLink, MemIptables, MemConntrack> {
    /// IPVS mode's kernels of `family` in memory, every one recording to
    /// `journal` (tests and benchmarks).
    pub fn in_memory(journal: &Journal, family: IpFamily) -> Self {
        IpvsKernels {
            ipvs: MemIpvs::new(journal),
            sets: IpvsSet::ALL.iter().map(|s| (*s, MemIpset::new(journal, s.spec(family)))).collect(),
            link: MemLink::new(journal),
            iptables: MemIptables::new(journal),
            conntrack: MemConntrack::new(journal),
        }
    }
}

/// Starts one actor; drift its periodic check finds goes to `drift`.
fn start<K: Subsystem>(
    kernel: K,
    name: &str,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> Target<K::Op> {
    start_actor(kernel, name, registry, drift).1
}

/// [`start`], with the actor's address.
fn start_actor<K: Subsystem>(
    kernel: K,
    name: &str,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> (Addr<KernelActor<K>>, Target<K::Op>) {
    let stats = registry.register(name);
    let addr = KernelActor::new(kernel, stats.clone(), drift).start();
    (addr.clone(), Target { addr: addr.recipient(), stats })
}

/// Starts the conntrack actor over `kernel`.
fn start_conntrack<C: ConntrackKernel>(kernel: C, registry: &StatsRegistry) -> ConntrackTarget {
    let stats = registry.register("conntrack");
    ConntrackTarget { addr: ConntrackActor::new(kernel, stats.clone()).start().recipient(), stats }
}

/// Starts one actor per kernel handle, registering each one's stats. Every
/// actor reports the drift its periodic check finds (the iptables canary
/// vanished) to `drift`: the coordinator, which then resyncs in full.
pub fn start_ipvs_actors<I, S, L, T, C>(
    k: IpvsKernels<I, S, L, T, C>,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> Targets
where
    I: IpvsKernel,
    S: IpsetKernel,
    L: LinkKernel,
    T: IptablesKernel,
    C: ConntrackKernel,
{
    let sets = k
        .sets
        .into_iter()
        .map(|(set, kernel)| {
            let name = format!("ipset/{}", kernel.spec().name);
            (set, start(kernel, &name, registry, drift.clone()))
        })
        .collect();
    Targets {
        ipvs: start(k.ipvs, "ipvs", registry, drift.clone()),
        sets,
        link: start(k.link, "dummy-link", registry, drift.clone()),
        iptables: start(k.iptables, "iptables", registry, drift),
        conntrack: start_conntrack(k.conntrack, registry),
    }
}

/// Starts iptables mode's two actors, reporting drift (the iptables
/// canary vanished) to `drift`: the coordinator, which then resyncs in full.
pub fn start_iptables_actors<T: IptablesKernel, C: ConntrackKernel>(
    iptables: T,
    conntrack: C,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> IptablesTargets {
    IptablesTargets {
        iptables: start(iptables, "iptables", registry, drift),
        conntrack: start_conntrack(conntrack, registry),
    }
}

/// Starts nftables mode's two actors: `family`'s `kube-proxy` table over
/// `nft` (the kernel's nf_tables, or an in-memory one; its actor reports
/// drift to `drift`, as every kernel actor), and conntrack.
pub fn start_nftables_actors<N: NfTables, C: ConntrackKernel>(
    nft: N,
    family: IpFamily,
    conntrack: C,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> NftablesTargets {
    let (table, nftables) = start_actor(NftablesTable::new(nft, family), "nftables", registry, drift);
    NftablesTargets { nftables, list: table.recipient(), conntrack: start_conntrack(conntrack, registry) }
}
