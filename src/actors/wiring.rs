//! Starts the subsystem actors of a mode over a set of kernel handles
//! (real ones in the daemon, in-memory ones in tests).

use std::collections::BTreeMap;

use actix::prelude::*;

use super::conntrack::ConntrackActor;
use super::coordinator::{ConntrackTarget, IptablesTargets, NftablesTargets, Target, Targets};
use super::kernel_actor::KernelActor;
use super::nftables::NftablesTarget;
use crate::kernel::nftables::NetlinkNftables;
use crate::kernel::{ConntrackKernel, IpsetKernel, IptablesKernel, IpvsKernel, LinkKernel, Subsystem};
use crate::msgs::DriftDetected;
use crate::net::IpFamily;
use crate::plan::IpvsSet;
use crate::stats::StatsRegistry;

/// The kernel handles of IPVS mode, one per actor.
pub struct IpvsKernels<I, S, L, T, C> {
    pub ipvs: I,
    pub sets: BTreeMap<IpvsSet, S>,
    pub link: L,
    pub iptables: T,
    pub conntrack: C,
}

/// Starts one actor; drift its periodic check finds goes to `drift`.
fn start<K: Subsystem>(
    kernel: K,
    name: &str,
    registry: &StatsRegistry,
    drift: Recipient<DriftDetected>,
) -> Target<K::Op> {
    let stats = registry.register(name);
    let actor = KernelActor::new(kernel, stats.clone(), drift);
    Target { addr: actor.start().recipient(), stats }
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
/// `nft`, and conntrack.
pub fn start_nftables_actors<C: ConntrackKernel>(
    nft: NetlinkNftables,
    family: IpFamily,
    conntrack: C,
    registry: &StatsRegistry,
) -> NftablesTargets {
    NftablesTargets {
        nftables: NftablesTarget::start(nft, family, registry.register("nftables")),
        conntrack: start_conntrack(conntrack, registry),
    }
}
