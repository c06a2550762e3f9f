//! Model → desired kernel state, and desired-before vs desired-after →
//! deltas. Pure: no I/O, no async.

pub mod chains;
pub mod claims;
pub mod conntrack;
pub mod context;
pub mod iptables;
pub mod ipvs;
pub mod render;
pub mod rules_ipvs;
pub mod sets;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use claims::{Claims, Moved, Owner};
pub use ipvs::{Contribution, PlanContext};
pub use sets::IpvsSet;

use crate::model::{Model, ServicePortName};
use crate::msgs::{DestKey, DestSpec, IpsetOp, IpvsOp, LinkOp, SetEntry, VsKey, VsSpec};
use crate::net::Protocol;

/// The ops one IPVS-mode sync sends, per actor.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IpvsDeltas {
    pub ipvs: Vec<IpvsOp>,
    pub sets: BTreeMap<IpvsSet, Vec<IpsetOp>>,
    pub link: Vec<LinkOp>,
}

impl IpvsDeltas {
    pub fn is_empty(&self) -> bool {
        self.ipvs.is_empty() && self.sets.is_empty() && self.link.is_empty()
    }

    /// Number of kernel objects touched.
    pub fn len(&self) -> usize {
        self.ipvs.len() + self.sets.values().map(Vec::len).sum::<usize>() + self.link.len()
    }
}

/// The complete desired IPVS-mode state (for full resyncs and --dry-run).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct IpvsDesired {
    /// AddService and AddDest ops, sorted.
    pub ipvs: Vec<IpvsOp>,
    /// Members of every set (every set present, possibly empty).
    pub sets: BTreeMap<IpvsSet, Vec<SetEntry>>,
    /// Addresses bound to kube-ipvs0, sorted.
    pub addresses: Vec<IpAddr>,
}

/// The IPVS-mode planner: remembers what each service port claimed, so a
/// change replans only the service ports it touches.
#[derive(Debug)]
pub struct IpvsPlanner {
    ctx: PlanContext,
    owners: HashMap<ServicePortName, Owner>,
    next_owner: Owner,
    contributions: HashMap<Owner, Contribution>,
    services: Claims<VsKey, VsSpec>,
    dests: Claims<(VsKey, DestKey), DestSpec>,
    entries: Claims<(IpvsSet, SetEntry), ()>,
    addresses: Claims<IpAddr, ()>,
    set_sizes: HashMap<IpvsSet, usize>,
    no_node_access: Claims<(IpAddr, Protocol, u16), ()>,
}

impl IpvsPlanner {
    pub fn new(ctx: PlanContext) -> IpvsPlanner {
        IpvsPlanner {
            ctx,
            owners: HashMap::new(),
            next_owner: 0,
            contributions: HashMap::new(),
            services: Claims::default(),
            dests: Claims::default(),
            entries: Claims::default(),
            addresses: Claims::default(),
            set_sizes: HashMap::new(),
            no_node_access: Claims::default(),
        }
    }

    pub fn context(&self) -> &PlanContext {
        &self.ctx
    }

    fn owner(&mut self, spn: &ServicePortName) -> Owner {
        if let Some(o) = self.owners.get(spn) {
            return *o;
        }
        let o = self.next_owner;
        self.next_owner += 1;
        self.owners.insert(spn.clone(), o);
        o
    }

    /// Replans `ports` against the model and returns the deltas.
    pub fn update<'a>(&mut self, model: &Model, ports: impl IntoIterator<Item = &'a ServicePortName>) -> IpvsDeltas {
        let mut d = IpvsDeltas::default();
        for spn in ports {
            let new = match model.service_port(spn) {
                Some(sp) => ipvs::contribution(&self.ctx, sp, model.endpoints(spn)),
                None => Contribution::default(),
            };
            let owner = self.owner(spn);
            let old = self.contributions.remove(&owner).unwrap_or_default();
            self.replace(owner, &old, &new, &mut d);
            if model.service_port(spn).is_some() {
                self.contributions.insert(owner, new);
            } else {
                self.owners.remove(spn);
            }
        }
        d.ipvs.sort();
        for ops in d.sets.values_mut() {
            ops.sort();
        }
        d.link.sort();
        d
    }

    /// Replans every service port with a new context (config or node
    /// addresses changed, or a full resync).
    pub fn replan_all(&mut self, model: &Model, ctx: PlanContext) -> IpvsDeltas {
        self.ctx = ctx;
        let mut ports: Vec<ServicePortName> = self.owners.keys().cloned().collect();
        ports.extend(model.service_ports().map(|sp| sp.name.clone()));
        ports.sort();
        ports.dedup();
        self.update(model, &ports)
    }

    fn replace(&mut self, owner: Owner, old: &Contribution, new: &Contribution, d: &mut IpvsDeltas) {
        for (k, m) in self.services.replace(owner, &old.services, &new.services) {
            d.ipvs.push(match m {
                Moved::Added(s) => IpvsOp::AddService(k, s),
                Moved::Changed(s) => IpvsOp::EditService(k, s),
                Moved::Removed => IpvsOp::DelService(k),
            });
        }
        for ((vs, dest), m) in self.dests.replace(owner, &old.dests, &new.dests) {
            d.ipvs.push(match m {
                Moved::Added(s) => IpvsOp::AddDest(vs, dest, s),
                Moved::Changed(s) => IpvsOp::EditDest(vs, dest, s),
                Moved::Removed => IpvsOp::DelDest(vs, dest),
            });
        }
        for ((set, entry), m) in self.entries.replace(owner, &old.entries, &new.entries) {
            let size = self.set_sizes.entry(set).or_default();
            let op = match m {
                Moved::Added(()) | Moved::Changed(()) => {
                    *size += 1;
                    IpsetOp::Add(entry)
                }
                Moved::Removed => {
                    *size = size.saturating_sub(1);
                    IpsetOp::Del(entry)
                }
            };
            d.sets.entry(set).or_default().push(op);
        }
        self.no_node_access.replace(owner, &old.lb_no_node_access, &new.lb_no_node_access);
        for (addr, m) in self.addresses.replace(owner, &old.addresses, &new.addresses) {
            d.link.push(match m {
                Moved::Added(()) | Moved::Changed(()) => LinkOp::Bind(addr),
                Moved::Removed => LinkOp::Unbind(addr),
            });
        }
    }

    /// Whether a set currently has members (upstream writes some iptables
    /// rules only for non-empty sets).
    pub fn set_has_members(&self, set: IpvsSet) -> bool {
        self.set_sizes.get(&set).is_some_and(|n| *n > 0)
    }

    /// LB (vip, protocol, port) the node itself may not reach, sorted.
    pub fn lb_no_node_access(&self) -> Vec<(IpAddr, Protocol, u16)> {
        let mut v: Vec<_> = self.no_node_access.iter().map(|(k, ())| *k).collect();
        v.sort();
        v
    }

    /// The IPVS-mode iptables rules for the current plan.
    pub fn rules(&self, cfg: &rules_ipvs::IpvsRulesConfig) -> String {
        rules_ipvs::render(cfg, &|s| self.set_has_members(s), &self.lb_no_node_access())
    }

    /// The complete desired state.
    pub fn desired(&self) -> IpvsDesired {
        let mut ipvs: Vec<IpvsOp> = self.services.iter().map(|(k, s)| IpvsOp::AddService(*k, s.clone())).collect();
        ipvs.extend(self.dests.iter().map(|((vs, d), s)| IpvsOp::AddDest(*vs, *d, *s)));
        ipvs.sort();
        let mut sets: BTreeMap<IpvsSet, Vec<SetEntry>> = IpvsSet::ALL.iter().map(|s| (*s, Vec::new())).collect();
        for ((set, entry), ()) in self.entries.iter() {
            sets.entry(*set).or_default().push(*entry);
        }
        for v in sets.values_mut() {
            v.sort();
        }
        let mut addresses: Vec<IpAddr> = self.addresses.iter().map(|(a, ())| *a).collect();
        addresses.sort();
        IpvsDesired { ipvs, sets, addresses }
    }

    /// Counts of planned objects: (virtual servers, real servers, set entries, addresses).
    pub fn sizes(&self) -> (usize, usize, usize, usize) {
        (self.services.len(), self.dests.len(), self.entries.len(), self.addresses.len())
    }
}
