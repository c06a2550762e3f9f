//! The subsystem actor: owns one kernel handle (the IPVS table, one ipset,
//! the dummy link, iptables, an nf_tables table or conntrack), receives [`Batch`]es of its ops
//! from the coordinator, applies them, records stats, and acks with the
//! generation and the ops that failed.
//!
//! Incremental batches are applied as they are; full batches carry the whole
//! desired state and the handle reconciles the kernel against it. Batches
//! never interleave (`AtomicResponse`): one finishes before the next starts.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::kernel::{Applied, Subsystem};
use crate::msgs::{Ack, Batch, DriftDetected, KernelError, SyncMode};
use crate::stats::ActorStats;

pub struct KernelActor<S: Subsystem> {
    kernel: S,
    stats: Arc<ActorStats>,
    /// Where drift found by the handle's periodic check goes (the
    /// coordinator, which then resyncs in full).
    drift: Recipient<DriftDetected>,
}

impl<S: Subsystem> KernelActor<S> {
    /// `drift_sink` hears of drift the handle's periodic check finds.
    pub fn new(kernel: S, stats: Arc<ActorStats>, drift_sink: Recipient<DriftDetected>) -> Self {
        KernelActor { kernel, stats, drift: drift_sink }
    }

    /// The kernel handle (for messages besides batches, such as nftables
    /// mode's listing).
    pub(super) fn kernel(&self) -> &S {
        &self.kernel
    }

    pub(super) fn stats(&self) -> &Arc<ActorStats> {
        &self.stats
    }

    fn finish(&self, generation: u64, started: Instant, res: Applied<S::Op>, drift: bool) -> Ack<S::Op> {
        let actor = self.stats.name.as_str();
        let (applied, failed) = match res {
            Ok((ops, results)) => {
                let n = ops.iter().map(S::kernel_ops).sum();
                let failed: Vec<(Option<S::Op>, KernelError)> =
                    ops.into_iter().zip(results).filter_map(|(op, r)| r.err().map(|e| (Some(op), e))).collect();
                (n, failed)
            }
            Err(e) => (0, vec![(None, e)]),
        };
        for (op, err) in &failed {
            let what = if op.is_some() { "kernel op failed" } else { "reading the kernel's state failed" };
            tracing::warn!(actor, generation, error = %err, outcome_known = err.outcome_known(), "{what}");
        }
        self.stats.applied(generation, applied, failed.len(), started.elapsed());
        tracing::debug!(actor, generation, ops = applied, failed = failed.len(), "batch applied");
        if drift {
            tracing::warn!(actor, generation, "the kernel changed behind our back: this actor resyncs in full");
        }
        Ack { generation, failed, drift }
    }
}

impl<S: Subsystem> Actor for KernelActor<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(every) = self.kernel.periodic() {
            ctx.run_interval(every, |act, ctx| {
                // `wait`: no batch is handled while housekeeping runs.
                ctx.wait(act.kernel.run_periodic().into_actor(act).map(|drifted, act, _| {
                    if drifted {
                        tracing::warn!(actor = %act.stats.name, "kernel state changed behind our back; full resync");
                        act.drift.do_send(DriftDetected { actor: act.stats.name.clone() });
                    }
                }));
            });
        }
    }
}

impl<S: Subsystem> Handler<Batch<S::Op>> for KernelActor<S> {
    type Result = AtomicResponse<Self, Ack<S::Op>>;

    fn handle(&mut self, batch: Batch<S::Op>, _ctx: &mut Context<Self>) -> Self::Result {
        self.stats.dequeued();
        let kernel = self.kernel.clone();
        let started = Instant::now();
        let generation = batch.generation;
        let work = async move {
            match batch.mode {
                SyncMode::Incremental => {
                    let results = kernel.apply(batch.ops.clone()).await;
                    (Ok((batch.ops, results)), false)
                }
                SyncMode::Full => (kernel.reconcile(batch.ops).await, false),
                SyncMode::Verify => match kernel.verify(batch.ops).await {
                    Ok(c) => (Ok((c.applied, c.results)), c.drift),
                    Err(e) => (Err(e), false),
                },
            }
        };
        AtomicResponse::new(Box::pin(
            work.into_actor(self).map(move |(res, drift), act, _| act.finish(generation, started, res, drift)),
        ))
    }
}
