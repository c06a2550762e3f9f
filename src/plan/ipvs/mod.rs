//! IPVS mode's planner: what each service port wants (virtual servers,
//! real servers, set entries, kube-ipvs0 addresses; [`service`]), kept with
//! the service ports that claim it ([`claims`]; real servers planned again
//! from their claimants' inputs when needed, [`dests`]), so replanning one
//! service port yields only its deltas; upstream's ipsets ([`sets`]), the
//! mode's iptables rules ([`rules`]), the planner's context ([`context`])
//! and `--dry-run`'s text ([`render`]).

pub mod claims;
pub mod context;
pub mod dests;
pub mod render;
pub mod rules;
pub mod service;
pub mod sets;

#[cfg(test)]
mod tests;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use claims::{Claims, Moved, Owner};
use dests::{DestMove, Dests};
pub use service::{Contribution, PlanContext};
pub use sets::IpvsSet;

use crate::model::{EndpointList, Model, ServicePort, ServicePortName};
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

    /// Each actor's ops in order, without spare room. A key one service
    /// port released and another claimed in the same update (a port
    /// renamed, or its protocol changed: the Service's cluster IP and its
    /// `KUBE-IPVS-IPS` member stay) comes as a delete then an add; sorted,
    /// the add would run first and the delete undo it, so such a pair
    /// becomes what it nets to: nothing for an address or a set member, an
    /// edit for a virtual or real server.
    fn sorted(mut self) -> IpvsDeltas {
        let unbind = |op: &LinkOp| matches!(op, LinkOp::Unbind(_)).then_some(*op.addr());
        let bind = |op: &LinkOp| matches!(op, LinkOp::Bind(_)).then_some(*op.addr());
        let rebound = net_pairs(&mut self.link, unbind, bind);
        self.link.retain(|op| bind(op).is_none_or(|a| !rebound.contains(&a)));
        for ops in self.sets.values_mut() {
            let del = |op: &IpsetOp| if let IpsetOp::Del(e) = op { Some(*e) } else { None };
            let add = |op: &IpsetOp| if let IpsetOp::Add(e) = op { Some(*e) } else { None };
            let readded = net_pairs(ops, del, add);
            ops.retain(|op| add(op).is_none_or(|e| !readded.contains(&e)));
        }
        let deleted = |op: &IpvsOp| match op {
            IpvsOp::DelService(k) => Some((*k, None)),
            IpvsOp::DelDest(k, d) => Some((*k, Some(*d))),
            _ => None,
        };
        let added = |op: &IpvsOp| match op {
            IpvsOp::AddService(k, _) => Some((*k, None)),
            IpvsOp::AddDest(k, d, _) => Some((*k, Some(*d))),
            _ => None,
        };
        let back = net_pairs(&mut self.ipvs, deleted, added);
        if !back.is_empty() {
            let edit = |op: IpvsOp| match op {
                IpvsOp::AddService(k, s) if back.contains(&(k, None)) => IpvsOp::EditService(k, s),
                IpvsOp::AddDest(k, d, s) if back.contains(&(k, Some(d))) => IpvsOp::EditDest(k, d, s),
                other => other,
            };
            self.ipvs = std::mem::take(&mut self.ipvs).into_iter().map(edit).collect();
        }
        // Equal ops are identical: an unstable sort needs no scratch buffer.
        // A large sync's deltas live until every actor has applied them.
        self.ipvs.sort_unstable();
        self.ipvs.shrink_to_fit();
        for ops in self.sets.values_mut() {
            ops.sort_unstable();
            ops.shrink_to_fit();
        }
        self.link.sort_unstable();
        self.link.shrink_to_fit();
        self
    }
}

/// Drops each delete of `ops` whose key an add of `ops` claims again;
/// returns those keys (the callers decide what their adds become).
fn net_pairs<Op, K: Hash + Eq>(
    ops: &mut Vec<Op>,
    deleted: impl Fn(&Op) -> Option<K>,
    added: impl Fn(&Op) -> Option<K>,
) -> HashSet<K> {
    let gone: HashSet<K> = ops.iter().filter_map(&deleted).collect();
    if gone.is_empty() {
        return HashSet::new();
    }
    let back: HashSet<K> = ops.iter().filter_map(&added).filter(|k| gone.contains(k)).collect();
    ops.retain(|op| deleted(op).is_none_or(|k| !back.contains(&k)));
    back
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

/// What the planner remembers of one service port: its owner id and the
/// inputs it was last planned from, the model's own shared values (two
/// pointers, nothing copied). Planning the same inputs with the same context
/// gives the same [`Contribution`], so that is how the planner knows what
/// the port claims without storing it a second time beside the claims.
///
/// Identified by the port's name: a set of these is a map by name.
#[derive(Debug)]
struct Planned {
    owner: Owner,
    /// The planner's epoch it was planned in: during a replan of every
    /// port, an older epoch means planned with the context before it.
    epoch: u32,
    port: Arc<ServicePort>,
    endpoints: Option<EndpointList>,
}

impl Planned {
    fn contribution(&self, ctx: &PlanContext) -> Contribution {
        service::contribution(ctx, &self.port, self.endpoints.as_deref().unwrap_or_default())
    }

    /// Whether the model still holds exactly these inputs.
    fn same_inputs(&self, port: &Arc<ServicePort>, endpoints: Option<&EndpointList>) -> bool {
        Arc::ptr_eq(&self.port, port)
            && match (&self.endpoints, endpoints) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

impl Borrow<ServicePortName> for Planned {
    fn borrow(&self) -> &ServicePortName {
        &self.port.name
    }
}

impl PartialEq for Planned {
    fn eq(&self, other: &Planned) -> bool {
        self.port.name == other.port.name
    }
}

impl Eq for Planned {}

impl Hash for Planned {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.port.name.hash(state)
    }
}

/// The IPVS-mode planner: remembers what each service port claimed, so a
/// change replans only the service ports it touches. Real servers, ten
/// times as many as virtual servers, are not kept: a virtual server's
/// claimants' inputs give them again ([`dests`]).
#[derive(Debug)]
pub struct IpvsPlanner {
    ctx: PlanContext,
    planned: HashSet<Planned>,
    next_owner: Owner,
    /// Counts replans of every port (see [`Planned`]'s `epoch`).
    epoch: u32,
    /// Each planned owner's port (the `Arc` its [`Planned`] holds): a
    /// shared virtual server's other claimants by owner.
    ports: HashMap<Owner, Arc<ServicePort>>,
    services: Claims<VsKey, VsSpec>,
    /// Planned real servers, distinct (virtual server, real server) keys.
    dest_count: usize,
    entries: Claims<(IpvsSet, SetEntry), ()>,
    addresses: Claims<IpAddr, ()>,
    set_sizes: HashMap<IpvsSet, usize>,
    no_node_access: Claims<(IpAddr, Protocol, u16), ()>,
}

impl IpvsPlanner {
    pub fn new(ctx: PlanContext) -> IpvsPlanner {
        IpvsPlanner {
            ctx,
            planned: HashSet::new(),
            next_owner: 0,
            epoch: 0,
            ports: HashMap::new(),
            services: Claims::default(),
            dest_count: 0,
            entries: Claims::default(),
            addresses: Claims::default(),
            set_sizes: HashMap::new(),
            no_node_access: Claims::default(),
        }
    }

    pub fn context(&self) -> &PlanContext {
        &self.ctx
    }

    fn new_owner(&mut self) -> Owner {
        let o = self.next_owner;
        self.next_owner += 1;
        o
    }

    /// Replans `ports` against the model and returns the deltas.
    pub fn update<'a>(&mut self, model: &Model, ports: impl IntoIterator<Item = &'a ServicePortName>) -> IpvsDeltas {
        let mut d = IpvsDeltas::default();
        self.plan(model, ports, None, Some(&mut d));
        d.sorted()
    }

    /// Replans `ports`; their previous plans were made with `old_ctx`, or
    /// with the current context if `None`. The deltas go to `d` when given.
    fn plan<'a>(
        &mut self,
        model: &Model,
        ports: impl IntoIterator<Item = &'a ServicePortName>,
        old_ctx: Option<&PlanContext>,
        mut d: Option<&mut IpvsDeltas>,
    ) {
        let same_ctx = old_ctx.is_none_or(|c| *c == self.ctx);
        if old_ctx.is_some() {
            self.epoch = self.epoch.wrapping_add(1);
        }
        for spn in ports {
            let sp = model.service_port(spn);
            let endpoints = model.endpoint_list(spn);
            let old = self.planned.take(spn);
            let owner = match &old {
                Some(p) => p.owner,
                None => self.new_owner(),
            };
            let unchanged = matches!((&old, sp), (Some(old), Some(sp)) if same_ctx && old.same_inputs(sp, endpoints));
            if !unchanged {
                let old = old.map(|p| p.contribution(old_ctx.unwrap_or(&self.ctx))).unwrap_or_default();
                let new = sp.map(|sp| service::contribution(&self.ctx, sp, model.endpoints(spn))).unwrap_or_default();
                let dests = self.dest_moves(owner, &old, &new, old_ctx);
                self.replace(owner, &old, &new, dests, d.as_deref_mut());
            }
            if let Some(sp) = sp {
                let epoch = self.epoch;
                self.ports.insert(owner, sp.clone());
                self.planned.insert(Planned { owner, epoch, port: sp.clone(), endpoints: endpoints.cloned() });
            } else {
                self.ports.remove(&owner);
            }
        }
    }

    /// Replans every service port with a new context (config or node
    /// addresses changed, or a full resync).
    pub fn replan_all(&mut self, model: &Model, ctx: PlanContext) -> IpvsDeltas {
        let mut d = IpvsDeltas::default();
        self.replan_every_port(model, ctx, Some(&mut d));
        d.sorted()
    }

    /// [`IpvsPlanner::replan_all`] for a full resync, which sends
    /// [`IpvsPlanner::desired`] instead of deltas: the same plan, no deltas
    /// collected (at 10,000 services they are ≈ 110,000 ops, a few MB held
    /// at the sync's peak only to be dropped).
    pub fn replan_for_full_sync(&mut self, model: &Model, ctx: PlanContext) {
        self.replan_every_port(model, ctx, None);
    }

    /// Replans every service port the model has or the planner had, in
    /// name order, with `ctx`; the deltas go to `d` when given.
    fn replan_every_port(&mut self, model: &Model, ctx: PlanContext, d: Option<&mut IpvsDeltas>) {
        let old_ctx = std::mem::replace(&mut self.ctx, ctx);
        let gone: Vec<ServicePortName> = self
            .planned
            .iter()
            .filter(|p| model.service_port(&p.port.name).is_none())
            .map(|p| p.port.name.clone())
            .collect();
        let mut ports: Vec<&ServicePortName> = model.service_ports().map(|sp| &sp.name).chain(&gone).collect();
        ports.sort();
        self.plan(model, ports, Some(&old_ctx), d);
    }

    /// How the real servers move when `owner`'s contribution goes from
    /// `old` to `new` (before its claims move); other claimants of a shared
    /// virtual server were planned with `old_ctx` if given and planned
    /// before this epoch, else with the current context.
    fn dest_moves(
        &self,
        owner: Owner,
        old: &Contribution,
        new: &Contribution,
        old_ctx: Option<&PlanContext>,
    ) -> Vec<DestMove> {
        let mut groups: Vec<&VsKey> = old.services.iter().chain(&new.services).map(|(k, _)| k).collect();
        groups.sort_unstable();
        groups.dedup();
        let mut moved = Vec::new();
        for vs in groups {
            let (was, now) = (dests::under(&old.dests, vs), dests::under(&new.dests, vs));
            if self.services.owners(vs).all(|o| o == owner) {
                dests::moves(*vs, dests::keyed(was), dests::keyed(now), &mut moved);
            } else {
                let others = self.others_dests(owner, vs, old_ctx);
                let with = |d: &Dests| {
                    dests::effective(
                        others.iter().copied().chain(d.iter().map(|((_, k), v)| (*k, owner, *v))).collect(),
                    )
                };
                dests::moves(*vs, with(was), with(now), &mut moved);
            }
        }
        moved
    }

    /// The real servers of `vs` that its claimants other than `owner` want,
    /// planned again from their inputs.
    fn others_dests(&self, owner: Owner, vs: &VsKey, old_ctx: Option<&PlanContext>) -> Vec<(DestKey, Owner, DestSpec)> {
        let others = self.services.owners(vs).filter(|o| *o != owner);
        let planned = others.filter_map(|o| self.ports.get(&o)).filter_map(|sp| self.planned.get(&sp.name));
        let mut out = Vec::new();
        for p in planned {
            let ctx = match old_ctx {
                Some(c) if p.epoch != self.epoch => c,
                _ => &self.ctx,
            };
            let c = p.contribution(ctx);
            out.extend(dests::under(&c.dests, vs).iter().map(|((_, k), v)| (*k, p.owner, *v)));
        }
        out
    }

    /// Moves `owner`'s claims from `old` to `new`, with its real servers'
    /// moves `dests`; the ops for what moved go to `d` when given.
    fn replace(
        &mut self,
        owner: Owner,
        old: &Contribution,
        new: &Contribution,
        dests: Vec<DestMove>,
        mut d: Option<&mut IpvsDeltas>,
    ) {
        for (k, m) in self.services.replace(owner, &old.services, &new.services) {
            if let Some(d) = d.as_deref_mut() {
                d.ipvs.push(match m {
                    Moved::Added(s) => IpvsOp::AddService(k, s),
                    Moved::Changed(s) => IpvsOp::EditService(k, s),
                    Moved::Removed => IpvsOp::DelService(k),
                });
            }
        }
        for ((vs, dest), m) in dests {
            match m {
                Moved::Added(_) => self.dest_count += 1,
                Moved::Removed => self.dest_count -= 1,
                Moved::Changed(_) => {}
            }
            if let Some(d) = d.as_deref_mut() {
                d.ipvs.push(match m {
                    Moved::Added(s) => IpvsOp::AddDest(vs, dest, s),
                    Moved::Changed(s) => IpvsOp::EditDest(vs, dest, s),
                    Moved::Removed => IpvsOp::DelDest(vs, dest),
                });
            }
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
            if let Some(d) = d.as_deref_mut() {
                d.sets.entry(set).or_default().push(op);
            }
        }
        self.no_node_access.replace(owner, &old.lb_no_node_access, &new.lb_no_node_access);
        for (addr, m) in self.addresses.replace(owner, &old.addresses, &new.addresses) {
            if let Some(d) = d.as_deref_mut() {
                d.link.push(match m {
                    Moved::Added(()) | Moved::Changed(()) => LinkOp::Bind(addr),
                    Moved::Removed => LinkOp::Unbind(addr),
                });
            }
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
    pub fn rules(&self, cfg: &rules::IpvsRulesConfig) -> String {
        rules::render(cfg, &|s| self.set_has_members(s), &self.lb_no_node_access())
    }

    /// The complete desired state (real servers planned again from every
    /// port's inputs).
    pub fn desired(&self) -> IpvsDesired {
        let mut ipvs = Vec::with_capacity(self.services.len() + self.dest_count);
        ipvs.extend(self.services.iter().map(|(k, s)| IpvsOp::AddService(*k, s.clone())));
        for p in &self.planned {
            let c = p.contribution(&self.ctx);
            for (vs, _) in &c.services {
                let mut owners = self.services.owners(vs);
                let lowest = owners.next();
                if owners.next().is_none() {
                    ipvs.extend(dests::under(&c.dests, vs).iter().map(|((vs, d), s)| IpvsOp::AddDest(*vs, *d, *s)));
                } else if lowest == Some(p.owner) {
                    // A shared virtual server: its lowest claimant lists them all.
                    let mut all = self.others_dests(p.owner, vs, None);
                    all.extend(dests::under(&c.dests, vs).iter().map(|((_, k), v)| (*k, p.owner, *v)));
                    ipvs.extend(dests::effective(all).into_iter().map(|(d, s)| IpvsOp::AddDest(*vs, d, s)));
                }
            }
        }
        ipvs.sort_unstable();
        IpvsDesired { ipvs, sets: self.desired_sets(), addresses: self.desired_addresses() }
    }

    /// The virtual servers alone (AddService ops, sorted): what the
    /// syncPeriod's cheap check compares.
    pub fn desired_services(&self) -> Vec<IpvsOp> {
        let mut ipvs: Vec<IpvsOp> = self.services.iter().map(|(k, s)| IpvsOp::AddService(*k, s.clone())).collect();
        ipvs.sort_unstable();
        ipvs
    }

    /// Members of every set (every set present, possibly empty), sorted.
    pub fn desired_sets(&self) -> BTreeMap<IpvsSet, Vec<SetEntry>> {
        let mut sets: BTreeMap<IpvsSet, Vec<SetEntry>> = IpvsSet::ALL
            .iter()
            .map(|s| (*s, Vec::with_capacity(self.set_sizes.get(s).copied().unwrap_or(0))))
            .collect();
        for ((set, entry), ()) in self.entries.iter() {
            sets.entry(*set).or_default().push(*entry);
        }
        for v in sets.values_mut() {
            v.sort_unstable();
        }
        sets
    }

    /// Addresses bound to kube-ipvs0, sorted.
    pub fn desired_addresses(&self) -> Vec<IpAddr> {
        let mut addresses: Vec<IpAddr> = self.addresses.iter().map(|(a, ())| *a).collect();
        addresses.sort_unstable();
        addresses
    }

    /// Counts of planned objects: (virtual servers, real servers, set entries, addresses).
    pub fn sizes(&self) -> (usize, usize, usize, usize) {
        (self.services.len(), self.dest_count, self.entries.len(), self.addresses.len())
    }
}
