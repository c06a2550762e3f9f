//! Starts the subsystem actors of a mode over a set of kernel handles
//! (real ones in the daemon, in-memory ones in tests).

use std::collections::BTreeMap;

use actix::prelude::*;

use super::coordinator::{IptablesTargets, Target, Targets};
use super::kernel_actor::KernelActor;
use super::stats::StatsRegistry;
use crate::kernel::{ConntrackKernel, IpsetKernel, IptablesKernel, IpvsKernel, LinkKernel, Subsystem};
use crate::plan::IpvsSet;

/// The kernel handles of IPVS mode, one per actor.
pub struct IpvsKernels<I, S, L, T, C> {
    pub ipvs: I,
    pub sets: BTreeMap<IpvsSet, S>,
    pub link: L,
    pub iptables: T,
    pub conntrack: C,
}

fn start<K: Subsystem>(kernel: K, name: &str, registry: &StatsRegistry) -> Target<K::Op> {
    let stats = registry.register(name);
    let addr = KernelActor::new(kernel, stats.clone()).start();
    Target { addr: addr.recipient(), stats }
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
    let sets = k
        .sets
        .into_iter()
        .map(|(set, kernel)| {
            let name = format!("ipset/{}", kernel.spec().name);
            (set, start(kernel, &name, registry))
        })
        .collect();
    Targets {
        ipvs: start(k.ipvs, "ipvs", registry),
        sets,
        link: start(k.link, "dummy-link", registry),
        iptables: start(k.iptables, "iptables", registry),
        conntrack: start(k.conntrack, "conntrack", registry),
    }
}

/// Starts iptables mode's two actors.
pub fn start_iptables_actors<T: IptablesKernel, C: ConntrackKernel>(
    iptables: T,
    conntrack: C,
    registry: &StatsRegistry,
) -> IptablesTargets {
    IptablesTargets {
        iptables: start(iptables, "iptables", registry),
        conntrack: start(conntrack, "conntrack", registry),
    }
}
