//! The conntrack actor: owns one conntrack handle ([`ConntrackKernel`]),
//! receives [`ReconcileConntrack`] from its family's coordinator after a
//! sync whose dataplane acked (one dump of the family's table, the stale
//! UDP entries deleted) and answers with what it deleted or why it could
//! not. Reconciles never interleave (`AtomicResponse`); the dump and the
//! deletes run on the handle's async netlink socket, so the actor's thread
//! never waits on the kernel.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::kernel::{ConntrackKernel, KResult};
use crate::msgs::{ReconcileConntrack, Reconciled};
use crate::stats::ActorStats;

pub struct ConntrackActor<K: ConntrackKernel> {
    kernel: K,
    stats: Arc<ActorStats>,
}

impl<K: ConntrackKernel> ConntrackActor<K> {
    pub fn new(kernel: K, stats: Arc<ActorStats>) -> ConntrackActor<K> {
        ConntrackActor { kernel, stats }
    }
}

impl<K: ConntrackKernel> Actor for ConntrackActor<K> {
    type Context = Context<Self>;
}

impl<K: ConntrackKernel> Handler<ReconcileConntrack> for ConntrackActor<K> {
    type Result = AtomicResponse<Self, KResult<Reconciled>>;

    fn handle(&mut self, rc: ReconcileConntrack, _: &mut Context<Self>) -> Self::Result {
        self.stats.dequeued();
        let (generation, started) = (rc.generation, Instant::now());
        let family = crate::net::ip_family_label(rc.family);
        let work = self.kernel.reconcile(rc);
        AtomicResponse::new(Box::pin(work.into_actor(self).map(move |res, act, _| {
            let actor = act.stats.name.as_str();
            // Stats count the dump and each entry deleted.
            let ops = match &res {
                Ok(done) => {
                    let (udp_entries, deleted) = (done.udp_entries, done.deleted);
                    tracing::debug!(
                        actor,
                        generation,
                        ip_family = family,
                        udp_entries,
                        deleted,
                        "conntrack reconciled"
                    );
                    1 + done.deleted as usize
                }
                Err(e) => {
                    tracing::warn!(actor, generation, ip_family = family, error = %e, "conntrack reconcile failed");
                    1
                }
            };
            act.stats.applied(generation, ops, usize::from(res.is_err()), started.elapsed());
            res
        })))
    }
}
