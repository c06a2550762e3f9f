//! IPVS mode's dataplane: the IPVS planner and its five kinds of actors.
//!
//! Ordering between actors is explicit, in two stages:
//!
//! 1. IPVS (virtual servers before their real servers: op order within the
//!    batch), every ipset, and address binds on kube-ipvs0 (a full batch of
//!    addresses, which also unbinds, only once IPVS acked without failure);
//! 2. once stage 1 has acked: iptables (rules name sets that now exist),
//!    the conntrack reconcile ([`ConntrackPlanner`]; only after the IPVS
//!    actor acked the real-server removals, else it waits for the next
//!    sync), and address unbinds (after their virtual servers are gone).
//!
//! An op the kernel refused is retried alone, with a backoff, in the
//! actor's next batches ([`Retries`]) until it goes through or a newer op
//! decides its key; the periodic checks leave those keys out. An actor
//! whose ack leaves the kernel's state unknown (no reply, a failed read, an
//! unreachable actor) gets a full batch (reconcile against the kernel) at
//! the next sync; the others carry on incrementally.
//!
//! The syncPeriod's sync adds a cheap check per actor (a `Verify` batch after
//! its deltas): IPVS compares its virtual servers (one dump, no real servers
//! read) and asks for a full batch when they differ; each set compares its
//! member count and reconciles when it differs; the dummy link reconciles
//! its addresses (one dump), after the address unbinds of stage 2. Full
//! resyncs of every actor come at start, on reload, drift of the iptables
//! canary, topology changes, and once an hour.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;
use futures::FutureExt;
use tokio::time::Instant;

use super::retry::Retries;
use super::{
    batch, conntrack_finished, AddrSource, ConntrackAnswer, ConntrackTarget, Dataplane, Finished, Planned, Target,
};
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::*;
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::context::{LocalAddr, PlanSettings};
use crate::plan::ipvs::context::{node_addrs, plan_context};
use crate::plan::ipvs::{IpvsDesired, IpvsPlanner, IpvsSet};
use crate::schedule::SyncKind;
use crate::stats::{FailingKey, FAILING_LISTED};

/// Renders the iptables-restore input for IPVS mode from the current plan
/// and the Node (its pod CIDR for detect-local NodeCIDR).
pub type RulesRenderer = Box<dyn Fn(&IpvsPlanner, &NodeInfo) -> String + Send>;

/// The subsystem actors of IPVS mode.
pub struct Targets {
    pub ipvs: Target<IpvsOp>,
    pub sets: BTreeMap<IpvsSet, Target<IpsetOp>>,
    pub link: Target<LinkOp>,
    pub iptables: Target<IptablesOp>,
    pub conntrack: ConntrackTarget,
}

/// Which actor, for needs-full bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ActorId {
    Ipvs,
    Set(IpvsSet),
    Link,
    Iptables,
}

/// IPVS mode: plans with [`IpvsPlanner`], sends to [`Targets`].
pub struct IpvsDataplane {
    settings: PlanSettings,
    planner: IpvsPlanner,
    targets: Targets,
    addrs: AddrSource,
    rules: RulesRenderer,
    needs_full: BTreeSet<ActorId>,
    waiting: Waiting,
    last_rules: Option<String>,
    conntrack: ConntrackPlanner,
    /// The node's addresses the plan was made with (NodePort virtual
    /// servers are per address): read again at each periodic sync.
    last_addrs: Vec<LocalAddr>,
}

impl IpvsDataplane {
    pub fn new(settings: PlanSettings, targets: Targets, addrs: AddrSource, rules: RulesRenderer) -> IpvsDataplane {
        let ctx = plan_context(&settings, &NodeInfo::default(), &[]);
        IpvsDataplane {
            conntrack: ConntrackPlanner::new(settings.family),
            settings,
            planner: IpvsPlanner::new(ctx),
            targets,
            addrs,
            rules,
            needs_full: BTreeSet::new(),
            waiting: Waiting::default(),
            last_rules: None,
            last_addrs: Vec::new(),
        }
    }

    fn plan_full(&mut self, model: &Model, generation: u64, addrs: Vec<LocalAddr>) -> Stage {
        let ctx = plan_context(&self.settings, model.node(), &addrs);
        self.last_addrs = addrs;
        self.planner.replan_for_full_sync(model, ctx);
        self.needs_full.clear();
        self.waiting.all_in_flight();
        let mut stage = Stage::full(generation, self.planner.desired());
        stage.rules = Some(self.render_rules(model));
        stage.rules_full = true;
        stage
    }

    fn plan_partial(&mut self, model: &Model, generation: u64, changes: &ModelChanges) -> Stage {
        let mut d = self.planner.update(model, &changes.ports);
        let desired = (!self.needs_full.is_empty()).then(|| self.planner.desired());
        let full_of = |id: ActorId| desired.as_ref().filter(|_| self.needs_full.contains(&id));
        let now = Instant::now();
        let w = &mut self.waiting;
        let mut stage = Stage::new(generation);
        stage.ipvs = match full_of(ActorId::Ipvs) {
            Some(des) => {
                w.ipvs.all_in_flight();
                Some(batch(generation, SyncMode::Full, des.ipvs.clone()))
            }
            None => incremental(generation, with_retries(&mut w.ipvs, d.ipvs, now)),
        };
        for set in IpvsSet::ALL {
            let waiting = w.sets.entry(set).or_default();
            let b = match full_of(ActorId::Set(set)) {
                Some(des) => {
                    waiting.all_in_flight();
                    Some(batch(generation, SyncMode::Full, adds(des.sets.get(&set))))
                }
                None => incremental(generation, with_retries(waiting, d.sets.remove(&set).unwrap_or_default(), now)),
            };
            if let Some(b) = b {
                stage.sets.insert(set, b);
            }
        }
        match full_of(ActorId::Link) {
            Some(des) => {
                w.link.all_in_flight();
                stage.binds = Some(batch(generation, SyncMode::Full, binds(&des.addresses)));
            }
            None => {
                let link = with_retries(&mut w.link, d.link, now);
                let (b, u): (Vec<LinkOp>, Vec<LinkOp>) = link.into_iter().partition(|o| matches!(o, LinkOp::Bind(_)));
                stage.binds = (!b.is_empty()).then(|| batch(generation, SyncMode::Incremental, b));
                stage.unbinds = (!u.is_empty()).then(|| batch(generation, SyncMode::Incremental, u));
            }
        }
        let rules = self.render_rules(model);
        stage.rules_full = self.needs_full.contains(&ActorId::Iptables);
        if stage.rules_full || self.last_rules.as_ref() != Some(&rules) {
            stage.rules = Some(rules);
        }
        for id in std::mem::take(&mut self.needs_full) {
            tracing::info!(?id, generation, "actor gets a full resync after a failure or drift");
        }
        stage
    }

    /// The syncPeriod's checks, for the actors not already getting a full
    /// batch. Keys waiting for a retry are left out: what the kernel refused
    /// is not drift, and its retry is already planned. The IPVS check skips
    /// such a virtual server on the kernel's side too (a `DelService` in its
    /// batch, [`crate::kernel::ipvs_services_differ`]): a refused delete or
    /// edit leaves it in the kernel, unplanned or with its old spec.
    fn add_checks(&self, stage: &mut Stage) {
        let generation = stage.generation;
        let w = &self.waiting;
        if !is_full(stage.ipvs.as_ref()) {
            let mut services = self.planner.desired_services();
            services.retain(|op| !w.ipvs.is_pending(&op.key()));
            let pending = w.ipvs.iter().filter(|p| p.op.key().1.is_none());
            services.extend(pending.map(|p| IpvsOp::DelService(*p.op.vs())));
            stage.check_ipvs = Some(batch(generation, SyncMode::Verify, services));
        }
        for (set, mut members) in self.planner.desired_sets() {
            if !is_full(stage.sets.get(&set)) {
                if let Some(waiting) = w.sets.get(&set) {
                    members.retain(|e| !waiting.is_pending(e));
                }
                stage.check_sets.insert(set, batch(generation, SyncMode::Verify, adds(Some(&members))));
            }
        }
        if !is_full(stage.binds.as_ref()) {
            let mut addresses = self.planner.desired_addresses();
            addresses.retain(|a| !w.link.is_pending(a));
            stage.check_link = Some(batch(generation, SyncMode::Verify, binds(&addresses)));
        }
    }

    fn render_rules(&self, model: &Model) -> String {
        (self.rules)(&self.planner, model.node())
    }

    /// Sends the stages, in order; returns every ack.
    fn run_stages(&self, stage: Stage) -> impl std::future::Future<Output = Outcome> + 'static {
        let t = &self.targets;
        let ipvs = stage.ipvs.map(|b| t.ipvs.send(b));
        let sets: Vec<_> =
            stage.sets.into_iter().filter_map(|(s, b)| t.sets.get(&s).map(|tg| (s, tg.send(b)))).collect();
        // Each actor's check queues behind its deltas (mailboxes are FIFO).
        let check_ipvs = stage.check_ipvs.map(|b| t.ipvs.send(b));
        let check_sets: Vec<_> =
            stage.check_sets.into_iter().filter_map(|(s, b)| t.sets.get(&s).map(|tg| (s, tg.send(b)))).collect();
        // A full batch of addresses also unbinds what is not desired: it goes
        // after IPVS acked (virtual servers deleted first), and not at all
        // when IPVS failed (an address stays while its virtual server may).
        let (binds, full_binds) = match stage.binds {
            Some(b) if b.mode == SyncMode::Full => (None, Some(b)),
            other => (other.map(|b| t.link.send(b)), None),
        };
        let (iptables, conntrack_target, link) = (t.iptables.clone(), t.conntrack.clone(), t.link.clone());
        let (generation, rules, conntrack, unbinds) = (stage.generation, stage.rules, stage.conntrack, stage.unbinds);
        let (rules_full, check_link) = (stage.rules_full, stage.check_link);
        async move {
            let mut out = Outcome::default();
            if let Some(f) = ipvs {
                out.ipvs.push(f.await);
            }
            if let Some(f) = check_ipvs {
                out.ipvs.push(f.await);
            }
            let (names, futs): (Vec<IpvsSet>, Vec<_>) = check_sets.into_iter().unzip();
            for (set, ack) in names.into_iter().zip(join_all(futs).await) {
                out.sets.push((set, ack));
            }
            let (names, futs): (Vec<IpvsSet>, Vec<_>) = sets.into_iter().unzip();
            for (set, ack) in names.into_iter().zip(join_all(futs).await) {
                out.sets.push((set, ack));
            }
            if let Some(f) = binds {
                out.link.push(f.await);
            }
            if let Some(b) = full_binds {
                if out.ipvs.iter().all(|a| a.as_ref().is_some_and(|a| a.is_ok())) {
                    out.link.push(link.send(b).await);
                } else {
                    tracing::warn!(generation, "IPVS failed: kube-ipvs0's full resync waits for the next sync");
                    out.link.push(None);
                }
            }
            if let Some(text) = rules {
                // A full batch makes the handle check the jumps from the built-in chains too.
                let mode = if rules_full { SyncMode::Full } else { SyncMode::Incremental };
                let b = batch(generation, mode, vec![IptablesOp::Restore(RestoreInput::new(text.clone()))]);
                out.iptables = Some((text, iptables.send(b).await));
            }
            let ipvs_ok = out.ipvs.iter().all(|a| a.as_ref().is_some_and(|a| a.is_ok()));
            if let Some(rc) = conntrack.filter(|_| ipvs_ok) {
                out.conntrack = Some(conntrack_target.send(rc).await);
            }
            if let Some(b) = unbinds {
                out.link.push(link.send(b).await);
            }
            if let Some(b) = check_link {
                out.link.push(link.send(b).await);
            }
            out
        }
    }
}

impl Dataplane for IpvsDataplane {
    type Outcome = Outcome;
    type Config = (PlanSettings, RulesRenderer);

    fn sync(&mut self, model: &Model, changes: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<Outcome> {
        let mut full = kind == SyncKind::Full;
        let addrs = (full || kind == SyncKind::Periodic).then(|| node_addrs((self.addrs)()));
        if kind == SyncKind::Periodic && addrs.as_ref() != Some(&self.last_addrs) {
            tracing::info!(generation, "the node's addresses changed: full resync");
            full = true;
        }
        let mut stage = match addrs {
            Some(addrs) if full => self.plan_full(model, generation, addrs),
            _ => self.plan_partial(model, generation, changes),
        };
        stage.conntrack = self.conntrack.plan(model, changes, generation);
        if kind == SyncKind::Periodic && !full {
            self.add_checks(&mut stage);
        }
        Planned { full, ops: stage.ops(), run: self.run_stages(stage).boxed_local() }
    }

    fn finished(&mut self, o: Outcome) -> Finished {
        let now = Instant::now();
        let mut tally = Tally::default();
        let mut refused = Vec::new();
        for a in o.ipvs {
            tally.sort(ActorId::Ipvs, a, &mut refused);
        }
        settle(&mut self.waiting.ipvs, refused, &self.targets.ipvs, now);
        let mut by_set: BTreeMap<IpvsSet, Vec<_>> = BTreeMap::new();
        for (set, a) in o.sets {
            tally.sort(ActorId::Set(set), a, by_set.entry(set).or_default());
        }
        for set in IpvsSet::ALL {
            if let Some(target) = self.targets.sets.get(&set) {
                let waiting = self.waiting.sets.entry(set).or_default();
                settle(waiting, by_set.remove(&set).unwrap_or_default(), target, now);
            }
        }
        let mut refused = Vec::new();
        for a in o.link {
            tally.sort(ActorId::Link, a, &mut refused);
        }
        settle(&mut self.waiting.link, refused, &self.targets.link, now);
        let Tally { mut failed, drift, mut needs } = tally;
        let mut iptables_restore_failed = false;
        if let Some((text, a)) = o.iptables {
            match a {
                Some(a) if a.is_ok() => self.last_rules = Some(text),
                _ => {
                    failed += 1;
                    iptables_restore_failed = true;
                    needs.insert(ActorId::Iptables);
                }
            }
        }
        // A failed reconcile is done again by the next sync: soon, with the scheduler's backoff.
        let conntrack_failed = conntrack_finished(&mut self.conntrack, o.conntrack);
        failed += conntrack_failed;
        let resync = !needs.is_empty() || conntrack_failed > 0;
        self.needs_full.extend(needs);
        Finished { failed, resync, iptables_restore_failed, drift, ..Finished::default() }
    }

    fn next_retry(&self) -> Option<Instant> {
        self.waiting.next_due()
    }

    fn reconfigure(&mut self, (settings, rules): Self::Config) {
        self.settings = settings;
        self.rules = rules;
    }
}

/// Refused ops waiting for their retry, per actor.
#[derive(Default)]
struct Waiting {
    ipvs: Retries<IpvsOp>,
    sets: BTreeMap<IpvsSet, Retries<IpsetOp>>,
    link: Retries<LinkOp>,
}

impl Waiting {
    /// Every actor gets a full batch: it carries every waiting key.
    fn all_in_flight(&mut self) {
        self.ipvs.all_in_flight();
        self.sets.values_mut().for_each(Retries::all_in_flight);
        self.link.all_in_flight();
    }

    fn next_due(&self) -> Option<Instant> {
        let sets = self.sets.values().filter_map(Retries::next_due);
        [self.ipvs.next_due(), self.link.next_due()].into_iter().flatten().chain(sets).min()
    }
}

/// The planner's new ops for an actor, after the retries due (older, so
/// first); the retries those ops decide are dropped.
fn with_retries<Op: Keyed + Clone + Ord>(waiting: &mut Retries<Op>, delta: Vec<Op>, now: Instant) -> Vec<Op> {
    waiting.superseded_by(&delta);
    let mut ops = waiting.take_due(now);
    ops.extend(delta);
    ops
}

fn incremental<Op>(generation: u64, ops: Vec<Op>) -> Option<Batch<Op>> {
    (!ops.is_empty()).then(|| batch(generation, SyncMode::Incremental, ops))
}

/// Takes an actor's refused ops into its retries and shows the keys still
/// failing on its stats (metrics and dashboard).
fn settle<Op: Keyed + Clone + Ord + std::fmt::Display + Send>(
    waiting: &mut Retries<Op>,
    refused: Vec<(Op, KernelError)>,
    target: &Target<Op>,
    now: Instant,
) {
    let went_through = waiting.settle(refused, now);
    target.stats.retried(went_through);
    let listed = waiting
        .iter()
        .take(FAILING_LISTED)
        .map(|p| FailingKey {
            op: p.op.to_string(),
            attempts: p.attempts,
            retry_in_ms: p.due.saturating_duration_since(now).as_millis() as u64,
            error: p.error.to_string(),
        })
        .collect();
    target.stats.set_failing(waiting.len(), listed);
}

/// What the acks of a sync said, over all actors.
#[derive(Default)]
struct Tally {
    failed: usize,
    drift: bool,
    /// Actors whose kernel state is unknown: they get a full batch.
    needs: BTreeSet<ActorId>,
}

impl Tally {
    /// Counts an ack's failures: refused ops go to `refused` (retried
    /// alone); a failure of unknown outcome, a failed read, drift or no ack
    /// at all sends the actor a full batch next time.
    fn sort<Op>(&mut self, id: ActorId, ack: Option<Ack<Op>>, refused: &mut Vec<(Op, KernelError)>) {
        let Some(ack) = ack else {
            self.failed += 1;
            self.needs.insert(id);
            return;
        };
        self.failed += ack.failed.len();
        if ack.drift {
            self.drift = true;
            self.needs.insert(id);
        }
        for (op, err) in ack.failed {
            match op {
                Some(op) if err.outcome_known() => refused.push((op, err)),
                _ => {
                    self.needs.insert(id);
                }
            }
        }
    }
}

fn is_full<Op>(b: Option<&Batch<Op>>) -> bool {
    b.is_some_and(|b| b.mode == SyncMode::Full)
}

fn adds(entries: Option<&Vec<SetEntry>>) -> Vec<IpsetOp> {
    entries.into_iter().flatten().map(|e| IpsetOp::Add(*e)).collect()
}

fn binds(addrs: &[std::net::IpAddr]) -> Vec<LinkOp> {
    addrs.iter().map(|a| LinkOp::Bind(*a)).collect()
}

/// What one sync sends.
struct Stage {
    generation: u64,
    ipvs: Option<Batch<IpvsOp>>,
    sets: BTreeMap<IpvsSet, Batch<IpsetOp>>,
    binds: Option<Batch<LinkOp>>,
    rules: Option<String>,
    /// Send the rules as a full batch (first sync, resyncs, after a failure).
    rules_full: bool,
    conntrack: Option<ReconcileConntrack>,
    unbinds: Option<Batch<LinkOp>>,
    /// The syncPeriod's checks (not counted as ops: they write only what drifted).
    check_ipvs: Option<Batch<IpvsOp>>,
    check_sets: BTreeMap<IpvsSet, Batch<IpsetOp>>,
    check_link: Option<Batch<LinkOp>>,
}

impl Stage {
    /// Kernel ops planned: IPVS ops, set entries, address binds/unbinds,
    /// one for a conntrack reconcile, and one for an iptables restore.
    fn ops(&self) -> usize {
        self.ipvs.as_ref().map_or(0, |b| b.ops.len())
            + self.sets.values().map(|b| b.ops.len()).sum::<usize>()
            + self.binds.as_ref().map_or(0, |b| b.ops.len())
            + self.unbinds.as_ref().map_or(0, |b| b.ops.len())
            + usize::from(self.conntrack.is_some())
            + usize::from(self.rules.is_some())
    }

    fn new(generation: u64) -> Stage {
        Stage {
            generation,
            ipvs: None,
            sets: BTreeMap::new(),
            binds: None,
            rules: None,
            rules_full: false,
            conntrack: None,
            unbinds: None,
            check_ipvs: None,
            check_sets: BTreeMap::new(),
            check_link: None,
        }
    }

    /// Every actor gets its complete desired state.
    fn full(generation: u64, d: IpvsDesired) -> Stage {
        let mut s = Stage::new(generation);
        s.ipvs = Some(batch(generation, SyncMode::Full, d.ipvs));
        for set in IpvsSet::ALL {
            s.sets.insert(set, batch(generation, SyncMode::Full, adds(d.sets.get(&set))));
        }
        s.binds = Some(batch(generation, SyncMode::Full, binds(&d.addresses)));
        s
    }
}

/// The acks of one sync (None: the actor could not be reached).
#[derive(Default)]
pub struct Outcome {
    ipvs: Vec<Option<Ack<IpvsOp>>>,
    sets: Vec<(IpvsSet, Option<Ack<IpsetOp>>)>,
    link: Vec<Option<Ack<LinkOp>>>,
    iptables: Option<(String, Option<Ack<IptablesOp>>)>,
    conntrack: ConntrackAnswer,
}
