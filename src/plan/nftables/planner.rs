//! The nftables-mode planner's state between syncs: what the kernel holds
//! (after an acknowledged transaction), the sync planned and not yet
//! acknowledged, and the stale chains waiting to be deleted. Pure: time is
//! an argument (any monotonic clock, e.g. the time since start).
//!
//! A sync is planned ([`NftablesPlanner::full`] or
//! [`NftablesPlanner::partial`]), sent, and then either confirmed
//! ([`NftablesPlanner::confirm_applied`]: the kernel holds it) or failed
//! ([`NftablesPlanner::failed`]: unknown, the next sync must be full, as
//! upstream's needFullSync). A partial sync renders, compares and commits
//! the changed service ports only: its cost follows the change, not the
//! cluster. Chains a confirmed sync left stale are deleted by
//! [`NftablesPlanner::delete_due`] once [`STALE_CHAIN_DELAY`] has passed,
//! unless a later sync used them again (upstream's staleChains).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::context::NftablesContext;
use super::maps_names::PickClass;
use super::ruleset::{Objects, Origin, Ruleset};
use super::staging::Staged;
use super::transactions::{
    changed_parts, delete_stale, element_refs, full_sync, groups_sync, partial_sync, stale_chains, Delta, ElementRefs,
    KernelObjects,
};
use crate::model::{Model, ServicePortName};
use crate::msgs::nftables::Transaction;

/// How long a flushed chain waits before it is deleted (upstream: a
/// second; kernels before 6.2 notice late that a deleted map element
/// pointed to a chain).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

/// What the last planned sync changes, until it is confirmed.
#[derive(Debug, Default)]
enum Pending {
    #[default]
    Nothing,
    /// The whole table (shared with the [`Staged`] sync sending it).
    Full(Arc<Ruleset>),
    /// These service ports' objects (`None`: gone) with the objects they
    /// replace as the plan rendered them again ([`Objects::again`]: `None`
    /// when held whole), and the shared objects when a service port
    /// brought an endpoint class they did not serve.
    Ports(Vec<(ServicePortName, Option<Objects>, Option<Objects>)>, Option<Objects>),
}

#[derive(Debug)]
pub struct NftablesPlanner {
    /// Shared with the [`Origin`]s of the held service ports it rendered.
    ctx: Arc<NftablesContext>,
    /// What the kernel holds: `None` until a full sync is confirmed, and
    /// after a failure. Its service ports are held ([`Objects::hold`]: rules
    /// dropped, a digest kept).
    applied: Option<Arc<Ruleset>>,
    /// How many service ports (or the top level) hold each element of `applied`.
    refs: ElementRefs,
    pending: Pending,
    /// The last planned sync's chains: stale ones, and those a partial
    /// sync writes (a full one writes those of its ruleset).
    planned_stale: Vec<String>,
    planned_chains: Vec<String>,
    /// Flushed chains and when they were flushed.
    stale: BTreeMap<String, Duration>,
    /// The base chains were re-created once (upstream does it once per process).
    recreated_base: bool,
}

impl NftablesPlanner {
    pub fn new(ctx: NftablesContext) -> NftablesPlanner {
        NftablesPlanner {
            ctx: Arc::new(ctx),
            applied: None,
            refs: ElementRefs::new(),
            pending: Pending::Nothing,
            planned_stale: vec![],
            planned_chains: vec![],
            stale: BTreeMap::new(),
            recreated_base: false,
        }
    }

    pub fn context(&self) -> &NftablesContext {
        &self.ctx
    }

    /// What the kernel holds after the last confirmed sync, its service
    /// ports held ([`Objects::hold`]).
    pub fn applied(&self) -> Option<&Ruleset> {
        self.applied.as_deref()
    }

    /// Whether the next sync must be full (none confirmed yet, or one failed).
    pub fn needs_full(&self) -> bool {
        self.applied.is_none()
    }

    /// A full sync of `model` with `ctx` over a kernel holding `kernel`
    /// (listed by the caller). The first one also re-creates the base chains.
    pub fn full(&mut self, model: &Model, ctx: NftablesContext, kernel: &KernelObjects) -> Delta {
        self.ctx = Arc::new(ctx);
        let desired = self.pend_full(super::desired(model, &self.ctx), kernel);
        let delta = full_sync(&desired, kernel, !self.recreated_base);
        self.recreated_base = true;
        delta
    }

    /// [`Self::full`] as the transactions the nftables actor sends
    /// ([`Staged`], per-service transactions of at least `chunk` ops), each
    /// built when it is sent. The ruleset is planned held
    /// ([`super::desired_held`]): each service port's rules are rendered
    /// again when its chains are written, so the sync never holds the
    /// rules of the whole table.
    pub fn full_staged(&mut self, model: &Model, ctx: NftablesContext, kernel: &KernelObjects, chunk: usize) -> Staged {
        self.ctx = Arc::new(ctx);
        let (desired, sources) = super::desired_held(model, &self.ctx);
        let desired = self.pend_full(desired, kernel);
        let staged = Staged::held(desired, sources, kernel, !self.recreated_base, chunk);
        self.recreated_base = true;
        staged
    }

    /// `desired`, a full sync's ruleset over `kernel`, pending until confirmed.
    fn pend_full(&mut self, desired: Ruleset, kernel: &KernelObjects) -> Arc<Ruleset> {
        let desired = Arc::new(desired);
        self.planned_stale = stale_chains(&desired, kernel);
        self.planned_chains.clear();
        self.pending = Pending::Full(desired.clone());
        desired
    }

    /// A partial sync of the `changed` service ports over the confirmed
    /// state. The `maps` ruleset's shared objects only grow: an endpoint
    /// class they do not serve yet is added (its set, chain and pick rule,
    /// nothing else rewritten), one no service port uses any more stays
    /// until a full sync. `None` when the next sync must be full.
    pub fn partial<'a>(
        &mut self,
        model: &Model,
        changed: impl IntoIterator<Item = &'a ServicePortName>,
    ) -> Option<Delta> {
        let applied = self.applied.as_ref()?;
        let ports: Vec<(ServicePortName, Option<Objects>)> = changed
            .into_iter()
            .map(|spn| {
                let objects = model.service_port(spn).map(|sp| {
                    let origin = Origin::new(self.ctx.clone(), sp.clone(), model.endpoint_list(spn).cloned());
                    origin.render().with_origin(origin)
                });
                (spn.clone(), objects)
            })
            .collect();
        // The replaced objects, rendered once: for the delta now and the
        // element counts when the sync is confirmed.
        let olds: Vec<Option<Objects>> =
            ports.iter().map(|(spn, _)| applied.services.get(spn).and_then(Objects::again)).collect();
        let empty = Objects::default();
        let served = &applied.shared.classes;
        let mut classes: BTreeSet<PickClass> = ports
            .iter()
            .flat_map(|(_, o)| o.iter().flat_map(|o| &o.classes))
            .filter(|c| served.binary_search(c).is_err())
            .copied()
            .collect();
        let shared = (!classes.is_empty()).then(|| {
            classes.extend(served);
            super::shared(&self.ctx, &classes)
        });
        let shared_parts = shared.as_ref().map(|s| changed_parts(&applied.shared, s));
        let port_pairs = ports.iter().zip(&olds).filter_map(|((spn, new), again)| {
            let old = again.as_ref().or_else(|| applied.services.get(spn)).unwrap_or(&empty);
            let new = new.as_ref().unwrap_or(&empty);
            (!old.same_as(new)).then_some((old, new))
        });
        let pairs = shared_parts.iter().map(|(o, n)| (o, n)).chain(port_pairs);
        let delta = groups_sync(self.ctx.family, pairs, &self.refs);
        self.planned_stale = delta.stale_chains.clone();
        let written = ports.iter().flat_map(|(_, o)| o.iter()).chain(shared.iter());
        self.planned_chains = written.flat_map(|o| o.chains.iter().map(|c| c.name.clone())).collect();
        let ports = ports.into_iter().zip(olds).map(|((spn, new), old)| (spn, new, old)).collect();
        self.pending = Pending::Ports(ports, shared);
        Some(delta)
    }

    /// A partial sync after the context changed (the ServiceCIDRs): the
    /// whole desired state rendered with `ctx` and compared group by group
    /// with what the kernel holds; only the groups that differ are written
    /// (for a ServiceCIDR change the top level's chains, `cluster-ips-check`
    /// among them, plus any changed service port). Costs a render of the
    /// cluster, not a full transaction. `None` when the next sync must be full.
    pub fn partial_with(&mut self, model: &Model, ctx: NftablesContext) -> Option<Delta> {
        let applied = self.applied.as_ref()?;
        let desired = super::desired_keeping(model, &ctx, &applied.shared.classes);
        let delta = partial_sync(applied, &desired);
        self.ctx = Arc::new(ctx);
        self.planned_stale = delta.stale_chains.clone();
        self.planned_chains.clear();
        self.pending = Pending::Full(Arc::new(desired));
        Some(delta)
    }

    /// The last planned sync is in the kernel (acknowledged at `now`).
    pub fn confirm_applied(&mut self, now: Duration) {
        match std::mem::take(&mut self.pending) {
            Pending::Nothing => {}
            Pending::Full(mut rs) => {
                self.refs = element_refs(&rs);
                if !self.stale.is_empty() {
                    let written: BTreeSet<&str> = rs.chains().map(|c| c.name.as_str()).collect();
                    self.stale.retain(|c, _| !written.contains(c.as_str()));
                }
                // The staged sync that shared the ruleset is done with it: held in place, no copy.
                if let Some(rs) = Arc::get_mut(&mut rs) {
                    rs.hold();
                }
                self.applied = Some(rs);
            }
            Pending::Ports(ports, shared) => {
                // The staged sync that shared the ruleset is done with it: no copy.
                if let Some(applied) = self.applied.as_mut().map(Arc::make_mut) {
                    if let Some(objects) = shared {
                        self.refs.remove(&applied.shared);
                        self.refs.add(&objects);
                        applied.shared = objects;
                    }
                    for (spn, objects, rendered) in ports {
                        let old = match objects {
                            Some(o) => {
                                self.refs.add(&o);
                                applied.services.insert(spn, o.hold())
                            }
                            None => applied.services.remove(&spn),
                        };
                        if let Some(old) = rendered.or(old) {
                            self.refs.remove(&old);
                        }
                    }
                }
            }
        }
        for c in std::mem::take(&mut self.planned_chains) {
            self.stale.remove(&c);
        }
        for c in std::mem::take(&mut self.planned_stale) {
            self.stale.entry(c).or_insert(now);
        }
    }

    /// Forgets the stale chains waiting for deletion that `listed` (a
    /// full sync's listing of the kernel's chains) does not show.
    pub fn forget_unlisted_stale(&mut self, listed: &[String]) {
        if self.stale.is_empty() {
            return;
        }
        let listed: std::collections::HashSet<&str> = listed.iter().map(String::as_str).collect();
        self.stale.retain(|c, _| listed.contains(c.as_str()));
    }

    /// The last planned sync failed or its outcome is unknown: the next
    /// one is full, and stale chains are found again from the kernel.
    pub fn failed(&mut self) {
        self.applied = None;
        self.refs.clear();
        self.pending = Pending::Nothing;
        self.planned_stale.clear();
        self.planned_chains.clear();
        self.stale.clear();
    }

    /// How many chains the last planned sync flushes as stale.
    pub fn planned_stale(&self) -> usize {
        self.planned_stale.len()
    }

    /// Chains waiting to be deleted.
    pub fn stale_chains(&self) -> Vec<String> {
        self.stale.keys().cloned().collect()
    }

    /// When the first stale chain is due for deletion ([`Self::delete_due`]).
    pub fn next_delete_due(&self) -> Option<Duration> {
        self.stale.values().min().map(|at| *at + STALE_CHAIN_DELAY)
    }

    /// A transaction deleting the stale chains flushed at least
    /// [`STALE_CHAIN_DELAY`] before `now` (forgotten here: if it fails they
    /// are found again by the next full sync, as upstream).
    pub fn delete_due(&mut self, now: Duration) -> Option<Transaction> {
        let due: Vec<String> = self
            .stale
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= STALE_CHAIN_DELAY)
            .map(|(c, _)| c.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        for c in &due {
            self.stale.remove(c);
        }
        Some(delete_stale(self.ctx.family, &due))
    }
}
