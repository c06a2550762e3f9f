//! The coordinator: the only place that knows the whole model.
//!
//! Receives source events and records them in the [`Model`]; decides when
//! to sync ([`SyncScheduler`]); at each sync folds the pending changes and
//! hands them to the mode's [`Dataplane`], which plans and sends each
//! subsystem actor a [`Batch`] of its ops, in the order its kernel needs
//! ([`ipvs::IpvsDataplane`], [`iptables::IptablesDataplane`]). One sync is in
//! flight at a time; events keep being recorded meanwhile and join the next.

pub mod iptables;
pub mod ipvs;
pub mod nftables;
pub mod retry;
#[cfg(test)]
mod tests;
pub mod turns;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use tokio::time::Instant;

use crate::model::{Model, ModelChanges, ModelGates};
use crate::msgs::*;
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::context::{LocalAddr, PlanSettings};
use crate::plan::iptables::RuleCounts;
use crate::schedule::{SyncKind, SyncScheduler, FULL_SYNC_PERIOD};
use crate::stats::ActorStats;
pub use crate::stats::SyncRecord;

pub use self::iptables::{ContextBuilder, IptablesDataplane, IptablesTargets};
pub use self::ipvs::{IpvsDataplane, RulesRenderer, Targets};
pub use self::nftables::{NftContextBuilder, NftablesDataplane, NftablesTargets};
pub use self::turns::SyncTurns;
use self::turns::Turn;

/// Reads the node's interface addresses (I/O, done by the caller's closure).
pub type AddrSource = Box<dyn Fn() -> Vec<LocalAddr> + Send>;

/// What a dataplane reads from the kernel before it plans a sync: resolves
/// to what to record in the dataplane ([`Dataplane::prepare`]).
pub type Prepare<D> = LocalBoxFuture<'static, Box<dyn FnOnce(&mut D)>>;

/// A mode's planner and actors, as the coordinator drives them.
pub trait Dataplane: Unpin + 'static {
    /// The acks of one sync.
    type Outcome: 'static;
    /// What a configuration reload replaces.
    type Config: Send + 'static;

    /// What sync `kind` must read from the kernel before it is planned
    /// (nftables mode lists its table before a full sync); `None`: plan at
    /// once. Called at the start of every sync, after the model's changes
    /// were taken; the sync's plan follows when the read is recorded.
    fn prepare(&mut self, _kind: SyncKind) -> Option<Prepare<Self>>
    where
        Self: Sized,
    {
        None
    }

    /// Plans sync `generation` of `kind` (a full one also if the dataplane
    /// needs one after a failure; a periodic one adds each actor's cheap
    /// drift check) and returns the sends, to be run in order.
    fn sync(
        &mut self,
        model: &Model,
        changes: &ModelChanges,
        kind: SyncKind,
        generation: u64,
    ) -> Planned<Self::Outcome>;

    /// Takes the acks of the sync: refused ops wait for their retry,
    /// actors whose state is unknown get a full batch next time.
    fn finished(&mut self, outcome: Self::Outcome) -> Finished;

    /// When the next refused op is due for its retry (a partial sync then).
    fn next_retry(&self) -> Option<Instant> {
        None
    }

    /// Whether a full resync comes once per [`FULL_SYNC_PERIOD`] (upstream
    /// turns that off in iptables mode's large-cluster mode).
    fn hourly_full_sync(&self) -> bool {
        true
    }

    fn reconfigure(&mut self, config: Self::Config);
}

/// Who hears what the coordinator did (metrics, health, the service
/// health checks): three calls, at the points where upstream's proxier
/// reports the same.
pub trait SyncObserver: 'static {
    /// A source batch was recorded into `model`.
    fn events_recorded(&self, events: &[SourceEvent], model: &Model);
    /// A sync starts, after `model.apply()` returned `changes`.
    fn sync_started(&mut self, model: &Model, changes: &ModelChanges, full: bool);
    /// The sync's acks are in.
    fn sync_finished(&mut self, outcome: SyncOutcome);
}

/// How a sync ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SyncOutcome {
    /// The sync as the coordinator's history keeps it.
    pub record: SyncRecord,
    pub took: Duration,
    /// Every actor acked without failures.
    pub ok: bool,
    /// The iptables actor's restore failed (or it was unreachable).
    pub iptables_restore_failed: bool,
    /// That restore was a partial one (iptables mode).
    pub partial_restore_failed: bool,
    /// iptables mode: the rules of the restore that succeeded.
    pub rules: Option<RuleCounts>,
    /// nftables mode: the sync's transaction failed.
    pub nftables_sync_failed: bool,
    /// nftables mode: deleting stale chains failed.
    pub nftables_cleanup_failed: bool,
}

/// A planned sync.
pub struct Planned<O> {
    /// Whether it is a full sync.
    pub full: bool,
    /// Kernel ops planned (see the sync record).
    pub ops: usize,
    /// Sends the batches and collects the acks.
    pub run: LocalBoxFuture<'static, O>,
}

/// How the acks of a sync went.
#[derive(Debug, Default)]
pub struct Finished {
    /// Failed ops (an unreachable actor counts one).
    pub failed: usize,
    /// A failure that only a later sync repairs (an unknown outcome, a
    /// failed read or restore, an unreachable actor): the scheduler retries
    /// with its backoff. Refused ops retry on their own ([`Dataplane::next_retry`]).
    pub resync: bool,
    /// The iptables restore failed (for `kubeproxy_sync_proxy_rules_iptables_restore_failures_total`).
    pub iptables_restore_failed: bool,
    /// It was a partial restore (iptables mode's `..._partial_restore_failures_total`).
    pub partial_restore_failed: bool,
    /// iptables mode: the rules after a successful restore.
    pub rules: Option<RuleCounts>,
    /// A periodic check found drift that the actor's full batch repairs:
    /// sync again soon.
    pub drift: bool,
    /// nftables mode: the sync's transaction failed.
    pub nftables_sync_failed: bool,
    /// nftables mode: deleting stale chains failed.
    pub nftables_cleanup_failed: bool,
}

/// Sync timing and planning settings.
pub struct Settings {
    pub plan: PlanSettings,
    pub min_sync: Duration,
    pub max_sync: Duration,
    pub burst: u32,
    /// What the feature gates change in the model.
    pub model_gates: ModelGates,
}

/// An actor's address for messages `M`, with its stats (mailbox depth is
/// counted at send).
pub struct Mailbox<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    pub addr: Recipient<M>,
    pub stats: Arc<ActorStats>,
}

/// A subsystem actor's address: it takes [`Batch`]es of `Op`.
pub type Target<Op> = Mailbox<Batch<Op>>;

/// The conntrack actor's address.
pub type ConntrackTarget = Mailbox<ReconcileConntrack>;

impl<M> Clone for Mailbox<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    fn clone(&self) -> Self {
        Mailbox { addr: self.addr.clone(), stats: self.stats.clone() }
    }
}

impl<M> Mailbox<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
{
    /// The actor's answer; `None` (logged) if it could not be reached.
    fn send(&self, msg: M) -> impl std::future::Future<Output = Option<M::Result>> {
        self.stats.enqueued();
        let name = self.stats.name.clone();
        let fut = self.addr.send(msg);
        async move {
            match fut.await {
                Ok(answer) => Some(answer),
                Err(e) => {
                    tracing::error!(actor = %name, error = %e, "actor unreachable");
                    None
                }
            }
        }
    }
}

/// How many recent syncs the coordinator remembers.
const SYNC_HISTORY: usize = 64;

pub struct Coordinator<D: Dataplane = IpvsDataplane> {
    model: Model,
    settings: Settings,
    dataplane: D,
    sched: SyncScheduler,
    generation: u64,
    timer: Option<SpawnHandle>,
    history: VecDeque<SyncRecord>,
    observer: Option<Box<dyn SyncObserver>>,
    /// Set by [`Shutdown`]: no more events, no more syncs; answered when
    /// the sync in flight (if any) is done.
    stopping: Option<Vec<tokio::sync::oneshot::Sender<()>>>,
    /// Shared with the other family's coordinator: a large sync waits for
    /// its turn before it is planned ([`turns`]).
    turns: Option<SyncTurns>,
    /// The turn the sync in flight holds, given back when it is done.
    turn: Option<Turn>,
}

impl Coordinator<IpvsDataplane> {
    /// IPVS mode over its actors.
    pub fn new(settings: Settings, targets: Targets, addrs: AddrSource, rules: RulesRenderer) -> Self {
        let dataplane = IpvsDataplane::new(settings.plan.clone(), targets, addrs, rules);
        Coordinator::with_dataplane(settings, dataplane)
    }
}

impl<D: Dataplane> Coordinator<D> {
    /// This coordinator's family, as its log lines name it.
    fn ip_family(&self) -> &'static str {
        crate::net::ip_family_label(self.settings.plan.family)
    }

    pub fn with_dataplane(settings: Settings, dataplane: D) -> Coordinator<D> {
        Coordinator {
            sched: SyncScheduler::new(settings.min_sync, settings.max_sync, settings.burst),
            model: Model::new(settings.plan.family, &settings.plan.node_name).with_gates(settings.model_gates),
            settings,
            dataplane,
            generation: 0,
            timer: None,
            history: VecDeque::new(),
            observer: None,
            stopping: None,
            turns: None,
            turn: None,
        }
    }

    /// Takes turns for large syncs with the coordinators sharing `turns`
    /// (the other family's).
    pub fn with_turns(mut self, turns: SyncTurns) -> Coordinator<D> {
        self.turns = Some(turns);
        self
    }

    /// Who hears of each event batch and sync (metrics, health and the
    /// service health checks).
    pub fn with_observer(mut self, observer: impl SyncObserver) -> Coordinator<D> {
        self.observer = Some(Box::new(observer));
        self
    }

    /// Re-arms the one timer at the scheduler's next wake-up.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let now = Instant::now();
        // A due retry is a requested sync (rate-limited as any other).
        let retry = match self.dataplane.next_retry() {
            Some(at) if at <= now => {
                self.sched.request();
                None
            }
            other => other,
        };
        let wakeup = match (self.sched.next_wakeup(now), retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match wakeup {
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
        let changes = self.model.apply();
        let kind = if changes.topology_changed { SyncKind::Full } else { kind };
        match self.turns.as_ref().filter(|_| turns::is_large(kind == SyncKind::Full, changes.ports.len())) {
            // The model's applied state stays as it is meanwhile (events are
            // recorded as pending), and the scheduler counts this sync as running.
            Some(turns) => {
                ctx.spawn(turns.take().into_actor(self).map(move |turn, act, ctx| {
                    act.turn = turn;
                    act.prepare_sync(kind, generation, changes, ctx);
                }));
            }
            None => self.prepare_sync(kind, generation, changes, ctx),
        }
    }

    fn prepare_sync(&mut self, kind: SyncKind, generation: u64, changes: ModelChanges, ctx: &mut Context<Self>) {
        let started = Instant::now();
        if let Some(h) = self.observer.as_mut() {
            h.sync_started(&self.model, &changes, kind == SyncKind::Full);
        }
        match self.dataplane.prepare(kind) {
            // As while waiting for a turn: events meanwhile are pending.
            Some(read) => {
                ctx.spawn(read.into_actor(self).map(move |record, act, ctx| {
                    record(&mut act.dataplane);
                    act.run_sync(kind, generation, started, changes, ctx);
                }));
            }
            None => self.run_sync(kind, generation, started, changes, ctx),
        }
    }

    fn run_sync(
        &mut self,
        kind: SyncKind,
        generation: u64,
        started: Instant,
        changes: ModelChanges,
        ctx: &mut Context<Self>,
    ) {
        let planned = self.dataplane.sync(&self.model, &changes, kind, generation);
        let (full, ports_changed, planned_ops) = (planned.full, changes.ports.len(), planned.ops);
        let periodic = kind == SyncKind::Periodic;
        tracing::debug!(
            ip_family = self.ip_family(),
            generation,
            full,
            periodic,
            ports = ports_changed,
            "sync started"
        );
        let fut = planned.run;
        ctx.spawn(fut.into_actor(self).map(move |outcome, act, ctx| {
            act.sync_done(generation, (full, periodic), started, (ports_changed, planned_ops), outcome);
            if let Some(waiters) = act.stopping.as_mut() {
                for w in waiters.drain(..) {
                    let _ = w.send(());
                }
                return;
            }
            act.arm(ctx);
        }));
    }

    fn sync_done(
        &mut self,
        generation: u64,
        (full, periodic): (bool, bool),
        started: Instant,
        counts: (usize, usize),
        o: D::Outcome,
    ) {
        let (ports_changed, ops) = counts;
        let f = self.dataplane.finished(o);
        let failed = f.failed;
        let ok = failed == 0;
        let took = started.elapsed();
        self.sched.finished(Instant::now(), !f.resync);
        self.sched.set_full_period(self.dataplane.hourly_full_sync().then_some(FULL_SYNC_PERIOD));
        if f.drift {
            self.sched.request();
        }
        let rec = SyncRecord {
            generation,
            full,
            periodic,
            duration_ms: (took.as_secs_f64() * 1e6).round() / 1000.0,
            ports_changed,
            ops,
            failed,
        };
        if let Some(h) = self.observer.as_mut() {
            h.sync_finished(SyncOutcome {
                record: rec.clone(),
                took,
                ok,
                iptables_restore_failed: f.iptables_restore_failed,
                partial_restore_failed: f.partial_restore_failed,
                rules: f.rules,
                nftables_sync_failed: f.nftables_sync_failed,
                nftables_cleanup_failed: f.nftables_cleanup_failed,
            });
        }
        tracing::info!(
            ip_family = self.ip_family(),
            generation,
            full,
            periodic,
            ms = rec.duration_ms,
            ports = ports_changed,
            failed,
            "sync finished"
        );
        if self.history.len() == SYNC_HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(rec);
        if turns::is_large(full, ports_changed) {
            // What a large sync planned and sent is freed by now: give it back.
            crate::heap::trim_in_background();
        }
        // The next family's large sync may be planned now.
        self.turn = None;
    }
}

/// The conntrack reconcile's answer: `None` if none was sent (none was
/// due, or the dataplane failed first), `Some(None)` if the actor could
/// not be reached.
pub type ConntrackAnswer = Option<Option<Result<Reconciled, KernelError>>>;

/// Takes a sync's conntrack answer into `planner`; returns the failures to count.
fn conntrack_finished(planner: &mut ConntrackPlanner, answer: ConntrackAnswer) -> usize {
    planner.finished(matches!(answer, Some(Some(Ok(_)))));
    usize::from(matches!(answer, Some(None) | Some(Some(Err(_)))))
}

fn batch<Op>(generation: u64, mode: SyncMode, ops: Vec<Op>) -> Batch<Op> {
    Batch { generation, mode, ops }
}

impl<D: Dataplane> Actor for Coordinator<D> {
    type Context = Context<Self>;
}

/// Time to check whether a sync is due.
#[derive(Message)]
#[rtype(result = "()")]
struct Tick;

impl<D: Dataplane> Handler<Tick> for Coordinator<D> {
    type Result = ();

    fn handle(&mut self, _: Tick, ctx: &mut Context<Self>) {
        self.tick(ctx);
    }
}

impl<D: Dataplane> Handler<SourceBatch> for Coordinator<D> {
    type Result = ();

    fn handle(&mut self, SourceBatch(events): SourceBatch, ctx: &mut Context<Self>) {
        if self.stopping.is_some() {
            return;
        }
        for ev in &events {
            if let Err(e) = self.model.record(ev) {
                tracing::error!(ip_family = self.ip_family(), error = %e, "skipping invalid object");
            }
        }
        if let Some(h) = &self.observer {
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

impl<D: Dataplane> Handler<DriftDetected> for Coordinator<D> {
    type Result = ();

    fn handle(&mut self, msg: DriftDetected, ctx: &mut Context<Self>) {
        tracing::info!(ip_family = self.ip_family(), actor = %msg.actor, "drift detected: scheduling a full resync");
        self.sched.request_full();
        if !self.sched.is_running() {
            self.arm(ctx);
        }
    }
}

/// A reloaded configuration's live part (SIGHUP): new periods and the
/// dataplane's new settings; followed by a full resync.
pub struct Reconfigure<D: Dataplane> {
    pub settings: Settings,
    pub dataplane: D::Config,
}

impl<D: Dataplane> Message for Reconfigure<D> {
    type Result = ();
}

impl<D: Dataplane> Handler<Reconfigure<D>> for Coordinator<D> {
    type Result = ();

    fn handle(&mut self, msg: Reconfigure<D>, ctx: &mut Context<Self>) {
        self.sched.set_periods(msg.settings.min_sync, msg.settings.max_sync);
        self.settings = msg.settings;
        self.dataplane.reconfigure(msg.dataplane);
        tracing::info!(ip_family = self.ip_family(), "configuration reloaded: full resync");
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

impl<D: Dataplane> Handler<Shutdown> for Coordinator<D> {
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

impl<D: Dataplane> Handler<GetSyncHistory> for Coordinator<D> {
    type Result = MessageResult<GetSyncHistory>;

    fn handle(&mut self, _: GetSyncHistory, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.history.iter().cloned().collect())
    }
}
