//! The coordinator: the only place that knows the whole model.
//!
//! Receives source events and records them in the [`Model`]; decides when
//! to sync ([`SyncScheduler`]); at each sync folds the pending changes,
//! plans, and sends each subsystem actor a [`Batch`] of its ops. Ordering
//! between actors is explicit, in two stages:
//!
//! 1. IPVS (virtual servers before their real servers: op order within the
//!    batch), every ipset, and address binds on kube-ipvs0;
//! 2. once stage 1 has acked: iptables (rules name sets that now exist),
//!    conntrack flushes (only after the IPVS actor acked the real-server
//!    removals, else they wait for the next sync), and address unbinds
//!    (after their virtual servers are gone).
//!
//! An actor whose ack reports a failure gets a full batch (reconcile against
//! the kernel) at the next sync; the others carry on incrementally.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::join_all;
use tokio::time::Instant;

use super::stats::ActorStats;
use crate::metrics::hooks::{SyncHooks, SyncOutcome};
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::*;
use crate::plan::context::{plan_context, LocalAddr, PlanSettings};
use crate::plan::{conntrack::conntrack_ops, IpvsDesired, IpvsPlanner, IpvsSet};
use crate::schedule::{SyncKind, SyncScheduler};

/// Reads the node's interface addresses (I/O, done by the caller's closure).
pub type AddrSource = Box<dyn Fn() -> Vec<LocalAddr> + Send>;

/// Renders the iptables-restore input for IPVS mode from the current plan
/// and the Node (its pod CIDR for detect-local NodeCIDR).
pub type RulesRenderer = Box<dyn Fn(&IpvsPlanner, &NodeInfo) -> String + Send>;

/// Sync timing and planning settings.
pub struct Settings {
    pub plan: PlanSettings,
    pub min_sync: Duration,
    pub max_sync: Duration,
    pub burst: u32,
}

/// An actor's address with its stats (mailbox depth is counted at send).
pub struct Target<Op: Send + 'static> {
    pub addr: Recipient<Batch<Op>>,
    pub stats: Arc<ActorStats>,
}

impl<Op: Send + 'static> Target<Op> {
    fn send(&self, batch: Batch<Op>) -> impl std::future::Future<Output = Option<Ack<Op>>> {
        self.stats.enqueued();
        let name = self.stats.name.clone();
        let fut = self.addr.send(batch);
        async move {
            match fut.await {
                Ok(ack) => Some(ack),
                Err(e) => {
                    tracing::error!(actor = %name, error = %e, "actor unreachable");
                    None
                }
            }
        }
    }
}

/// The subsystem actors of IPVS mode.
pub struct Targets {
    pub ipvs: Target<IpvsOp>,
    pub sets: BTreeMap<IpvsSet, Target<IpsetOp>>,
    pub link: Target<LinkOp>,
    pub iptables: Target<IptablesOp>,
    pub conntrack: Target<ConntrackOp>,
}

/// Which actor, for needs-full bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum ActorId {
    Ipvs,
    Set(IpvsSet),
    Link,
    Iptables,
}

/// One finished sync, for logs, metrics and the dashboard.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SyncRecord {
    pub generation: u64,
    pub full: bool,
    pub duration_ms: f64,
    pub ports_changed: usize,
    pub ops: usize,
    pub failed: usize,
}

/// How many recent syncs the coordinator remembers.
const SYNC_HISTORY: usize = 64;

pub struct Coordinator {
    model: Model,
    settings: Settings,
    planner: IpvsPlanner,
    sched: SyncScheduler,
    targets: Targets,
    addrs: AddrSource,
    rules: RulesRenderer,
    generation: u64,
    needs_full: BTreeSet<ActorId>,
    last_rules: Option<String>,
    deferred_conntrack: Vec<ConntrackOp>,
    timer: Option<SpawnHandle>,
    history: VecDeque<SyncRecord>,
    hooks: Option<SyncHooks>,
    /// Set by [`Shutdown`]: no more events, no more syncs; answered when
    /// the sync in flight (if any) is done.
    stopping: Option<Vec<tokio::sync::oneshot::Sender<()>>>,
}

impl Coordinator {
    pub fn new(settings: Settings, targets: Targets, addrs: AddrSource, rules: RulesRenderer) -> Coordinator {
        let model = Model::new(settings.plan.family, &settings.plan.node_name);
        let ctx = plan_context(&settings.plan, model.node(), &[]);
        Coordinator {
            sched: SyncScheduler::new(settings.min_sync, settings.max_sync, settings.burst),
            planner: IpvsPlanner::new(ctx),
            model,
            settings,
            targets,
            addrs,
            rules,
            generation: 0,
            needs_full: BTreeSet::new(),
            last_rules: None,
            deferred_conntrack: Vec::new(),
            timer: None,
            history: VecDeque::new(),
            hooks: None,
            stopping: None,
        }
    }

    /// Metrics, health and service health checks, fed at each event and sync.
    pub fn with_hooks(mut self, hooks: SyncHooks) -> Coordinator {
        self.hooks = Some(hooks);
        self
    }

    /// Re-arms the one timer at the scheduler's next wake-up.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let now = Instant::now();
        match self.sched.next_wakeup(now) {
            // Due now: a message to ourselves, not a timer (tokio rounds
            // timers up to the next millisecond); events already in the
            // mailbox are still recorded first and join this sync.
            Some(at) if at <= now => ctx.notify(Tick),
            Some(at) => {
                self.timer = Some(ctx.run_later(at - now, |act, ctx| {
                    act.timer = None;
                    act.tick(ctx);
                }));
            }
            None => {}
        }
    }

    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.stopping.is_some() {
            return;
        }
        match self.sched.poll(Instant::now()) {
            Some(kind) => self.start_sync(kind, ctx),
            None => self.arm(ctx),
        }
    }

    fn start_sync(&mut self, kind: SyncKind, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let started = Instant::now();
        let changes = self.model.apply();
        let full = kind == SyncKind::Full || changes.topology_changed;
        if let Some(h) = self.hooks.as_mut() {
            h.sync_started(&self.model, &changes, full);
        }
        let stage = if full { self.plan_full(generation) } else { self.plan_partial(generation, &changes) };
        let ports_changed = changes.ports.len();
        let planned_ops = stage.ops();
        tracing::debug!(generation, full, ports = ports_changed, "sync started");
        let fut = self.run_stages(stage);
        ctx.spawn(fut.into_actor(self).map(move |outcome, act, ctx| {
            act.sync_done(generation, full, started, (ports_changed, planned_ops), outcome);
            if let Some(waiters) = act.stopping.as_mut() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                return;
            }
            act.arm(ctx);
        }));
    }

    fn plan_full(&mut self, generation: u64) -> Stage {
        let addrs = (self.addrs)();
        let ctx = plan_context(&self.settings.plan, self.model.node(), &addrs);
        self.planner.replan_all(&self.model, ctx);
        self.needs_full.clear();
        let desired = self.planner.desired();
        let mut stage = Stage::full(generation, &desired);
        stage.rules = Some(self.render_rules());
        stage.rules_full = true;
        stage.conntrack = std::mem::take(&mut self.deferred_conntrack);
        stage
    }

    fn plan_partial(&mut self, generation: u64, changes: &ModelChanges) -> Stage {
        let d = self.planner.update(&self.model, &changes.ports);
        let desired = (!self.needs_full.is_empty()).then(|| self.planner.desired());
        let full_of = |id: ActorId| desired.as_ref().filter(|_| self.needs_full.contains(&id));
        let mut stage = Stage::new(generation);
        stage.ipvs = match full_of(ActorId::Ipvs) {
            Some(des) => Some(batch(generation, SyncMode::Full, des.ipvs.clone())),
            None => (!d.ipvs.is_empty()).then(|| batch(generation, SyncMode::Incremental, d.ipvs)),
        };
        for set in IpvsSet::ALL {
            let b = match full_of(ActorId::Set(set)) {
                Some(des) => Some(batch(generation, SyncMode::Full, adds(des.sets.get(&set)))),
                None => d.sets.get(&set).map(|ops| batch(generation, SyncMode::Incremental, ops.clone())),
            };
            if let Some(b) = b {
                stage.sets.insert(set, b);
            }
        }
        match full_of(ActorId::Link) {
            Some(des) => stage.binds = Some(batch(generation, SyncMode::Full, binds(&des.addresses))),
            None => {
                let (b, u): (Vec<LinkOp>, Vec<LinkOp>) = d.link.into_iter().partition(|o| matches!(o, LinkOp::Bind(_)));
                stage.binds = (!b.is_empty()).then(|| batch(generation, SyncMode::Incremental, b));
                stage.unbinds = (!u.is_empty()).then(|| batch(generation, SyncMode::Incremental, u));
            }
        }
        let rules = self.render_rules();
        stage.rules_full = self.needs_full.contains(&ActorId::Iptables);
        if stage.rules_full || self.last_rules.as_ref() != Some(&rules) {
            stage.rules = Some(rules);
        }
        stage.conntrack = std::mem::take(&mut self.deferred_conntrack);
        stage.conntrack.extend(conntrack_ops(&self.model, changes));
        for id in std::mem::take(&mut self.needs_full) {
            tracing::info!(?id, generation, "actor gets a full resync after a failure");
        }
        stage
    }

    fn render_rules(&self) -> String {
        (self.rules)(&self.planner, self.model.node())
    }

    /// Sends the stages, in order; returns every ack.
    ///
    /// (See [`Stage::ops`] for what the sync record counts.)
    fn run_stages(&self, stage: Stage) -> impl std::future::Future<Output = Outcome> + 'static {
        let t = &self.targets;
        let ipvs = stage.ipvs.map(|b| t.ipvs.send(b));
        let sets: Vec<_> =
            stage.sets.into_iter().filter_map(|(s, b)| t.sets.get(&s).map(|tg| (s, tg.send(b)))).collect();
        let binds = stage.binds.map(|b| t.link.send(b));
        let iptables_addr = (t.iptables.addr.clone(), t.iptables.stats.clone());
        let conntrack_addr = (t.conntrack.addr.clone(), t.conntrack.stats.clone());
        let link_addr = (t.link.addr.clone(), t.link.stats.clone());
        let (generation, rules, conntrack, unbinds) = (stage.generation, stage.rules, stage.conntrack, stage.unbinds);
        let rules_full = stage.rules_full;
        async move {
            let mut out = Outcome::default();
            if let Some(f) = ipvs {
                out.ipvs = Some(f.await);
            }
            let (names, futs): (Vec<IpvsSet>, Vec<_>) = sets.into_iter().unzip();
            for (set, ack) in names.into_iter().zip(join_all(futs).await) {
                out.sets.push((set, ack));
            }
            if let Some(f) = binds {
                out.link.push(f.await);
            }
            if let Some(text) = rules {
                let tg = Target { addr: iptables_addr.0, stats: iptables_addr.1 };
                // A full batch makes the handle check the jumps from the built-in chains too.
                let mode = if rules_full { SyncMode::Full } else { SyncMode::Incremental };
                let b = batch(generation, mode, vec![IptablesOp::Restore(RestoreInput { text: text.clone() })]);
                out.iptables = Some((text, tg.send(b).await));
            }
            let ipvs_ok = out.ipvs.as_ref().is_none_or(|a| a.as_ref().is_some_and(|a| a.is_ok()));
            if ipvs_ok && !conntrack.is_empty() {
                let tg = Target { addr: conntrack_addr.0, stats: conntrack_addr.1 };
                out.conntrack = Some(tg.send(batch(generation, SyncMode::Incremental, conntrack)).await);
            } else {
                out.deferred = conntrack;
            }
            if let Some(b) = unbinds {
                let tg = Target { addr: link_addr.0, stats: link_addr.1 };
                out.link.push(tg.send(b).await);
            }
            out
        }
    }

    fn sync_done(&mut self, generation: u64, full: bool, started: Instant, counts: (usize, usize), o: Outcome) {
        let (ports_changed, ops) = counts;
        let mut failed = 0;
        let mut check = |id: ActorId, ack: Option<usize>, needs: &mut BTreeSet<ActorId>| match ack {
            Some(0) => {}
            Some(f) => {
                failed += f;
                needs.insert(id);
            }
            None => {
                failed += 1;
                needs.insert(id);
            }
        };
        let mut needs = BTreeSet::new();
        if let Some(a) = &o.ipvs {
            check(ActorId::Ipvs, a.as_ref().map(|a| a.failed.len()), &mut needs);
        }
        for (set, a) in &o.sets {
            check(ActorId::Set(*set), a.as_ref().map(|a| a.failed.len()), &mut needs);
        }
        for a in &o.link {
            check(ActorId::Link, a.as_ref().map(|a| a.failed.len()), &mut needs);
        }
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
        if let Some(Some(a)) = &o.conntrack {
            failed += a.failed.len();
        }
        self.deferred_conntrack.extend(o.deferred);
        self.needs_full.extend(needs);
        let ok = failed == 0;
        let took = started.elapsed();
        self.sched.finished(Instant::now(), ok);
        if let Some(h) = self.hooks.as_mut() {
            h.sync_finished(SyncOutcome { full, took, ok, iptables_restore_failed });
        }
        let rec = SyncRecord { generation, full, duration_ms: took.as_secs_f64() * 1000.0, ports_changed, ops, failed };
        tracing::info!(generation, full, ms = rec.duration_ms, ports = ports_changed, failed, "sync finished");
        if self.history.len() == SYNC_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(rec);
    }
}

fn batch<Op>(generation: u64, mode: SyncMode, ops: Vec<Op>) -> Batch<Op> {
    Batch { generation, mode, ops }
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
    conntrack: Vec<ConntrackOp>,
    unbinds: Option<Batch<LinkOp>>,
}

impl Stage {
    /// Kernel ops planned: IPVS ops, set entries, address binds/unbinds,
    /// conntrack flushes, and one for an iptables restore.
    fn ops(&self) -> usize {
        self.ipvs.as_ref().map_or(0, |b| b.ops.len())
            + self.sets.values().map(|b| b.ops.len()).sum::<usize>()
            + self.binds.as_ref().map_or(0, |b| b.ops.len())
            + self.unbinds.as_ref().map_or(0, |b| b.ops.len())
            + self.conntrack.len()
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
            conntrack: Vec::new(),
            unbinds: None,
        }
    }

    /// Every actor gets its complete desired state.
    fn full(generation: u64, d: &IpvsDesired) -> Stage {
        let mut s = Stage::new(generation);
        s.ipvs = Some(batch(generation, SyncMode::Full, d.ipvs.clone()));
        for set in IpvsSet::ALL {
            s.sets.insert(set, batch(generation, SyncMode::Full, adds(d.sets.get(&set))));
        }
        s.binds = Some(batch(generation, SyncMode::Full, binds(&d.addresses)));
        s
    }
}

/// The acks of one sync (None: the actor could not be reached).
#[derive(Default)]
struct Outcome {
    ipvs: Option<Option<Ack<IpvsOp>>>,
    sets: Vec<(IpvsSet, Option<Ack<IpsetOp>>)>,
    link: Vec<Option<Ack<LinkOp>>>,
    iptables: Option<(String, Option<Ack<IptablesOp>>)>,
    conntrack: Option<Option<Ack<ConntrackOp>>>,
    deferred: Vec<ConntrackOp>,
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

/// Time to check whether a sync is due.
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

impl Handler<Tick> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.tick(ctx);
    }
}

impl Handler<SourceBatch> for Coordinator {
    type Result = ();

    fn handle(&mut self, SourceBatch(events): SourceBatch, ctx: &mut Context<Self>) {
        if self.stopping.is_some() {
            return;
        }
        for ev in &events {
            if let Err(e) = self.model.record(ev) {
                tracing::error!(error = %e, "skipping invalid object");
            }
        }
        if let Some(h) = &self.hooks {
            h.events_recorded(&events, &self.model);
        }
        if self.model.is_initialized() {
            self.sched.set_initialized();
        }
        if self.model.has_pending() {
            self.sched.request();
        }
        if !self.sched.is_running() {
            self.arm(ctx);
        }
    }
}

impl Handler<DriftDetected> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: DriftDetected, ctx: &mut Context<Self>) {
        tracing::info!(actor = %msg.actor, "drift detected: scheduling a full resync");
        self.sched.request_full();
        if !self.sched.is_running() {
            self.arm(ctx);
        }
    }
}

/// A reloaded configuration's live part (SIGHUP): new periods and planning
/// settings, a new rules renderer; followed by a full resync.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub settings: Settings,
    pub rules: RulesRenderer,
}

impl Handler<Reconfigure> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Reconfigure, ctx: &mut Context<Self>) {
        self.sched.set_periods(msg.settings.min_sync, msg.settings.max_sync);
        self.settings = msg.settings;
        self.rules = msg.rules;
        tracing::info!("configuration reloaded: full resync");
        self.sched.request_full();
        if !self.sched.is_running() {
            self.arm(ctx);
        }
    }
}

/// SIGTERM: stop taking events and syncing; answered once the sync in
/// flight (if any) has finished, so no batch is cut in the middle.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Handler<Shutdown> for Coordinator {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiters = self.stopping.get_or_insert_with(Vec::new);
        if self.sched.is_running() {
            waiters.push(tx);
        } else {
            let _ = tx.send(());
        }
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// Asks for the recent syncs (newest last).
#[derive(Message)]
#[rtype(result = "Vec<SyncRecord>")]
pub struct GetSyncHistory;

impl Handler<GetSyncHistory> for Coordinator {
    type Result = MessageResult<GetSyncHistory>;

    fn handle(&mut self, _: GetSyncHistory, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.history.iter().cloned().collect())
    }
}
