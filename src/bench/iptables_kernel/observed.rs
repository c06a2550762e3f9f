//! What the bench observes of the daemon: each sync's timing through a
//! dataplane wrapper ([`Probed`]), and each restore's input and outcome
//! through a recording iptables handle ([`Recording`]).

use super::*;

/// What [`Probed`] tells about the last finished sync (cumulative counts).
#[derive(Debug, Clone, Default)]
pub struct SyncSignal {
    pub generation: u64,
    pub full: bool,
    /// When the dataplane was asked to plan (after the model folded the changes).
    pub started: Option<Instant>,
    /// When the coordinator had every ack.
    pub finished: Option<Instant>,
    /// Planning (the dataplane's `sync`: iptables planner, conntrack frontends).
    pub plan: Duration,
    /// Sending the batches to the acks (iptables actor, then the conntrack reconcile).
    pub run: Duration,
    pub failed: usize,
    /// The service-level chains (SVC, SVL, EXT, FW) of the changed service ports.
    pub expected_chains: Vec<String>,
    pub syncs: u64,
    pub full_syncs: u64,
    pub plan_total: Duration,
    pub run_total: Duration,
}

/// The daemon's dataplane, timed: signals every finished sync.
pub struct Probed<D: Dataplane> {
    pub(super) inner: D,
    pub(super) done: watch::Sender<SyncSignal>,
    pub(super) totals: SyncSignal,
}

impl<D: Dataplane> Dataplane for Probed<D> {
    type Outcome = (D::Outcome, SyncSignal);
    type Config = D::Config;

    fn sync(
        &mut self,
        model: &Model,
        changes: &ModelChanges,
        kind: SyncKind,
        generation: u64,
    ) -> Planned<Self::Outcome> {
        let started = Instant::now();
        let planned = self.inner.sync(model, changes, kind, generation);
        let plan = started.elapsed();
        let expected_chains = if planned.full {
            Vec::new()
        } else {
            changes
                .ports
                .iter()
                .flat_map(|spn| {
                    let c = ServiceChains::new(spn);
                    [c.svc, c.svl, c.ext, c.fw]
                })
                .collect()
        };
        let full = planned.full;
        let run = planned.run;
        let run = async move {
            let t = Instant::now();
            let outcome = run.await;
            let sig = SyncSignal {
                generation,
                full,
                started: Some(started),
                plan,
                run: t.elapsed(),
                expected_chains,
                ..SyncSignal::default()
            };
            (outcome, sig)
        };
        Planned { full, ops: planned.ops, run: run.boxed_local() }
    }

    fn finished(&mut self, (outcome, mut sig): Self::Outcome) -> Finished {
        let f = self.inner.finished(outcome);
        sig.finished = Some(Instant::now());
        sig.failed = f.failed;
        let t = &mut self.totals;
        t.syncs += 1;
        t.full_syncs += u64::from(sig.full);
        t.plan_total += sig.plan;
        t.run_total += sig.run;
        (sig.syncs, sig.full_syncs, sig.plan_total, sig.run_total) = (t.syncs, t.full_syncs, t.plan_total, t.run_total);
        self.done.send_replace(sig);
        f
    }

    fn hourly_full_sync(&self) -> bool {
        self.inner.hourly_full_sync()
    }

    fn reconfigure(&mut self, config: D::Config) {
        self.inner.reconfigure(config);
    }
}

/// One batch the iptables handle applied.
#[derive(Debug, Clone)]
pub struct Captured {
    pub full: bool,
    /// The restore input as the coordinator sent it (empty unless capturing).
    pub text: String,
    /// The handle's apply: for a full batch also the jump check (two
    /// `iptables-save`), and on the first one `iptables --version`.
    pub apply: Duration,
    /// Copying the text (a cost of this bench, not of the daemon).
    pub copy: Duration,
    pub ok: bool,
    /// The first error, if any.
    pub error: Option<String>,
}

/// The iptables handle, recording what it was given and how long it took.
#[derive(Clone)]
pub struct Recording {
    pub(super) inner: IptablesHandle,
    pub(super) capture: Arc<AtomicBool>,
    pub(super) log: Arc<Mutex<Vec<Captured>>>,
    /// The handle's periodic canary checks (`iptables -S` in mangle, nat
    /// and filter): when each started and how long it took. The actor
    /// handles no batch meanwhile.
    pub(super) canary: Arc<Mutex<Vec<(Instant, Duration)>>>,
}

impl Recording {
    fn texts(&self, ops: &[IptablesOp]) -> (String, Duration) {
        let t = Instant::now();
        if !self.capture.load(Ordering::Relaxed) {
            return (String::new(), Duration::ZERO);
        }
        let text = ops.iter().map(|IptablesOp::Restore(r)| r.text()).collect();
        (text, t.elapsed())
    }

    fn record(&self, c: Captured) {
        lock(&self.log).push(c);
    }

    pub(super) fn take(&self) -> Vec<Captured> {
        std::mem::take(&mut *lock(&self.log))
    }

    pub(super) fn take_canary(&self) -> Vec<(Instant, Duration)> {
        std::mem::take(&mut *lock(&self.canary))
    }
}

impl Subsystem for Recording {
    type Op = IptablesOp;

    fn apply(&self, ops: Vec<IptablesOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move {
            let (text, copy) = me.texts(&ops);
            let t = Instant::now();
            let res = me.inner.apply(ops).await;
            let apply = t.elapsed();
            let error = res.iter().find_map(|r| r.as_ref().err().map(ToString::to_string));
            me.record(Captured { full: false, text, apply, copy, ok: error.is_none(), error });
            res
        }
    }

    fn reconcile(&self, desired: Vec<IptablesOp>) -> impl Future<Output = Applied<IptablesOp>> + 'static {
        let me = self.clone();
        async move {
            let (text, copy) = me.texts(&desired);
            let t = Instant::now();
            let res = me.inner.reconcile(desired).await;
            let apply = t.elapsed();
            let error = match &res {
                Ok((_, r)) => r.iter().find_map(|r| r.as_ref().err().map(ToString::to_string)),
                Err(e) => Some(e.to_string()),
            };
            me.record(Captured { full: true, text, apply, copy, ok: error.is_none(), error });
            res
        }
    }

    fn periodic(&self) -> Option<Duration> {
        self.inner.periodic()
    }

    fn run_periodic(&self) -> impl Future<Output = bool> + 'static {
        let me = self.clone();
        async move {
            let started = Instant::now();
            let drifted = me.inner.run_periodic().await;
            lock(&me.canary).push((started, started.elapsed()));
            drifted
        }
    }
}

impl IptablesKernel for Recording {}
