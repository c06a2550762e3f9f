//! Starts the subsystem actors of a mode over a set of kernel handles
//! (real ones in the daemon, in-memory ones in tests).

use std::collections::BTreeMap;

use actix::prelude::*;

use super::coordinator::{IptablesTargets, Target, Targets};
use super::kernel_actor::KernelActor;
use crate::kernel::{ConntrackKernel, IpsetKernel, IptablesKernel, IpvsKernel, LinkKernel, Subsystem};
use crate::msgs::DriftDetected;
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

fn start<K: Subsystem>(kernel: K, name: &str, registry: &StatsRegistry) -> Target<K::Op> {
    start_reporting(kernel, name, registry, None)
}

/// Starts one actor; drift its periodic check finds goes to `drift`.
fn start_reporting<K: Subsystem>(
    kernel: K,
    name: &str,
    registry: &StatsRegistry,
    drift: Option<Recipient<DriftDetected>>,
) -> Target<K::Op> {
    let stats = registry.register(name);
    let mut actor = KernelActor::new(kernel, stats.clone());
    if let Some(sink) = drift {
        actor = actor.with_drift_sink(sink);
    }
    Target { addr: actor.start().recipient(), stats }
}

/// Starts one actor per kernel handle, registering each one's stats.
pub fn start_ipvs_actors<I, S, L, T, C>(k: IpvsKernels<I, S, L, T, C>, registry: &StatsRegistry) -> Targets
where
    I: IpvsKernel,
    S: IpsetKernel,
    L: LinkKernel,
    T: IptablesKernel,
    C: ConntrackKernel,
{
    start_ipvs_actors_with_drift(k, registry, None)
}

/// [`start_ipvs_actors`], every actor reporting the drift its periodic
/// check finds (the iptables canary vanished) to `drift`: the coordinator,
/// which then resyncs in full.
pub fn start_ipvs_actors_with_drift<I, S, L, T, C>(
    k: IpvsKernels<I, S, L, T, C>,
    registry: &StatsRegistry,
    drift: Option<Recipient<DriftDetected>>,
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
            (set, start_reporting(kernel, &name, registry, drift.clone()))
        })
        .collect();
    Targets {
        ipvs: start_reporting(k.ipvs, "ipvs", registry, drift.clone()),
        sets,
        link: start_reporting(k.link, "dummy-link", registry, drift.clone()),
        iptables: start_reporting(k.iptables, "iptables", registry, drift.clone()),
        conntrack: start_reporting(k.conntrack, "conntrack", registry, drift),
    }
}

/// Starts iptables mode's two actors.
pub fn start_iptables_actors<T: IptablesKernel, C: ConntrackKernel>(
    iptables: T,
    conntrack: C,
    registry: &StatsRegistry,
) -> IptablesTargets {
    start_iptables_actors_with_drift(iptables, conntrack, registry, None)
}

/// [`start_iptables_actors`], the iptables actor reporting drift (its
/// canary vanished) to `drift`: the coordinator, which then resyncs in full.
pub fn start_iptables_actors_with_drift<T: IptablesKernel, C: ConntrackKernel>(
    iptables: T,
    conntrack: C,
    registry: &StatsRegistry,
    drift: Option<Recipient<DriftDetected>>,
) -> IptablesTargets {
    IptablesTargets {
        iptables: start_reporting(iptables, "iptables", registry, drift),
        conntrack: start(conntrack, "conntrack", registry),
    }
}
