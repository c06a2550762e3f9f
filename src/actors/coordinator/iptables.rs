//! iptables mode's dataplane: the iptables planner, the iptables actor and
//! the conntrack actor.
//!
//! Each sync is one restore: a full one (every chain of every service port)
//! on the first sync, once an hour (not in large-cluster mode, as upstream),
//! after a reload, when the node's topology labels change, after a failed
//! restore and after drift (the iptables actor's check); otherwise a partial
//! one with the changed service ports' chains and the top-level chains. A
//! partial sync with nothing changed (the syncPeriod's sync of a quiet
//! cluster) writes nothing: the kernel still holds the last restore, which
//! the iptables actor's drift check vouches for. Conntrack flushes follow a
//! successful restore (upstream's order: the rules no longer lead to a
//! removed endpoint when its entries go); after a failed one they wait for
//! the next sync.

use futures::FutureExt;

use super::{batch, AddrSource, Dataplane, Finished, Planned, Target};
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::*;
use crate::plan::conntrack::conntrack_ops;
use crate::plan::context::LocalAddr;
use crate::plan::iptables::{IptablesContext, IptablesPlanner};
use crate::schedule::SyncKind;

/// Builds the planner's context from the Node and the node's addresses. The
/// daemon's closure also sets route_localnet when the context needs it.
pub type ContextBuilder = Box<dyn Fn(&NodeInfo, &[LocalAddr]) -> IptablesContext + Send>;

/// The actors of iptables mode.
pub struct IptablesTargets {
    pub iptables: Target<IptablesOp>,
    pub conntrack: Target<ConntrackOp>,
}

/// iptables mode: plans with [`IptablesPlanner`], one restore per sync.
pub struct IptablesDataplane {
    planner: IptablesPlanner,
    targets: IptablesTargets,
    addrs: AddrSource,
    context: ContextBuilder,
    /// The last restore failed (or was never acked): the next sync is full.
    needs_full: bool,
    /// The sync in flight is a partial one.
    partial: bool,
    deferred_conntrack: Vec<ConntrackOp>,
    /// The node's addresses of the last full sync (nodePortAddresses rules
    /// name them): read again at each periodic sync.
    last_addrs: Vec<LocalAddr>,
}

impl IptablesDataplane {
    /// `kernel_chains`: per-service chains found in the kernel at start
    /// (an earlier run's or upstream kube-proxy's); the first sync deletes
    /// those the model does not use.
    pub fn new(
        targets: IptablesTargets,
        addrs: AddrSource,
        context: ContextBuilder,
        kernel_chains: &[String],
    ) -> IptablesDataplane {
        let ctx = context(&NodeInfo::default(), &[]);
        let mut planner = IptablesPlanner::new(ctx);
        planner.note_kernel_chains(kernel_chains.iter().map(String::as_str));
        IptablesDataplane {
            planner,
            targets,
            addrs,
            context,
            needs_full: false,
            partial: false,
            deferred_conntrack: Vec::new(),
            last_addrs: Vec::new(),
        }
    }
}

/// The acks of one sync (None: the actor could not be reached).
pub struct Outcome {
    restore: Option<Ack<IptablesOp>>,
    conntrack: Option<Option<Ack<ConntrackOp>>>,
    deferred: Vec<ConntrackOp>,
}

impl Dataplane for IptablesDataplane {
    type Outcome = Outcome;
    type Config = ContextBuilder;

    fn sync(&mut self, model: &Model, changes: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<Outcome> {
        let mut full = kind == SyncKind::Full || std::mem::take(&mut self.needs_full);
        let addrs = (full || kind == SyncKind::Periodic).then(|| (self.addrs)());
        if kind == SyncKind::Periodic && !full && addrs.as_ref() != Some(&self.last_addrs) {
            tracing::info!(generation, "the node's addresses changed: full resync");
            full = true;
        }
        self.partial = !full;
        let mut conntrack = std::mem::take(&mut self.deferred_conntrack);
        conntrack.extend(conntrack_ops(model, changes));
        if !full && changes.ports.is_empty() && !self.planner.has_stale_chains() && conntrack.is_empty() {
            // Nothing to write: the top-level chains would come out as the
            // last successful restore wrote them.
            let run =
                async move { Outcome { restore: Some(Ack::ok(generation)), conntrack: None, deferred: Vec::new() } };
            return Planned { full, ops: 0, run: run.boxed_local() };
        }
        let text = if let (true, Some(addrs)) = (full, addrs) {
            let ctx = (self.context)(model.node(), &addrs);
            self.last_addrs = addrs;
            self.planner.full_input(model, ctx)
        } else {
            self.planner.partial_input(model, &changes.ports)
        };
        let ops = 1 + conntrack.len();
        let mode = if full { SyncMode::Full } else { SyncMode::Incremental };
        let restore = batch(generation, mode, vec![IptablesOp::Restore(text)]);
        let (iptables, conntrack_target) = (self.targets.iptables.clone(), self.targets.conntrack.clone());
        let run = async move {
            let restore = iptables.send(restore).await;
            let ok = restore.as_ref().is_some_and(|a| a.is_ok());
            let (conntrack, deferred) = if ok && !conntrack.is_empty() {
                (Some(conntrack_target.send(batch(generation, SyncMode::Incremental, conntrack)).await), Vec::new())
            } else {
                (None, conntrack)
            };
            Outcome { restore, conntrack, deferred }
        };
        Planned { full, ops, run: run.boxed_local() }
    }

    fn finished(&mut self, o: Outcome) -> Finished {
        let mut failed = 0;
        let restore_ok = o.restore.as_ref().is_some_and(|a| a.is_ok());
        if restore_ok {
            self.planner.confirm_applied();
        } else {
            failed += 1;
            self.needs_full = true;
            if self.partial {
                tracing::warn!("partial iptables restore failed: the next sync is a full one");
            }
        }
        if let Some(ack) = o.conntrack {
            failed += ack.map_or(1, |a| a.failed.len());
        }
        self.deferred_conntrack.extend(o.deferred);
        Finished {
            failed,
            resync: failed > 0,
            iptables_restore_failed: !restore_ok,
            partial_restore_failed: !restore_ok && self.partial,
            rules: restore_ok.then(|| self.planner.rule_counts()),
            ..Finished::default()
        }
    }

    fn hourly_full_sync(&self) -> bool {
        !self.planner.large_cluster_mode()
    }

    fn reconfigure(&mut self, context: ContextBuilder) {
        self.context = context;
    }
}
