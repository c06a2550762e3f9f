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
//! the iptables actor's drift check vouches for. The conntrack reconcile
//! ([`ConntrackPlanner`]) follows a successful restore (upstream's order:
//! the rules lead nowhere near a removed endpoint by the time its entries go);
//! after a failed one it waits for the next sync.

use futures::FutureExt;

use super::{
    batch, conntrack_finished, AddrSource, ConntrackAnswer, ConntrackTarget, Dataplane, Finished, Planned, Target,
};
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::*;
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::context::LocalAddr;
use crate::plan::iptables::{IptablesContext, IptablesPlanner};
use crate::schedule::SyncKind;

/// Builds the planner's context from the Node and the node's addresses. The
/// daemon's closure also sets route_localnet when the context needs it.
pub type ContextBuilder = Box<dyn Fn(&NodeInfo, &[LocalAddr]) -> IptablesContext + Send>;

/// The actors of iptables mode.
pub struct IptablesTargets {
    pub iptables: Target<IptablesOp>,
    pub conntrack: ConntrackTarget,
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
    conntrack: ConntrackPlanner,
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
        let conntrack = ConntrackPlanner::new(ctx.family);
        let mut planner = IptablesPlanner::new(ctx);
        planner.note_kernel_chains(kernel_chains.iter().map(String::as_str));
        IptablesDataplane {
            planner,
            targets,
            addrs,
            context,
            needs_full: false,
            partial: false,
            conntrack,
            last_addrs: Vec::new(),
        }
    }
}

/// The acks of one sync (None: the actor could not be reached).
pub struct Outcome {
    restore: Option<Ack<IptablesOp>>,
    conntrack: ConntrackAnswer,
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
        let reconcile = self.conntrack.plan(model, changes, generation);
        if !full && changes.ports.is_empty() && !self.planner.has_stale_chains() && reconcile.is_none() {
            // Nothing to write: the top-level chains would come out as the
            // last successful restore wrote them.
            let run = async move { Outcome { restore: Some(Ack::ok(generation)), conntrack: None } };
            return Planned { full, ops: 0, run: run.boxed_local() };
        }
        let text = if let (true, Some(addrs)) = (full, addrs) {
            let ctx = (self.context)(model.node(), &addrs);
            self.last_addrs = addrs;
            self.planner.full_input(model, ctx)
        } else {
            self.planner.partial_input(model, &changes.ports)
        };
        let ops = 1 + usize::from(reconcile.is_some());
        let mode = if full { SyncMode::Full } else { SyncMode::Incremental };
        let restore = batch(generation, mode, vec![IptablesOp::Restore(text)]);
        let (iptables, conntrack_target) = (self.targets.iptables.clone(), self.targets.conntrack.clone());
        let run = async move {
            let restore = iptables.send(restore).await;
            let ok = restore.as_ref().is_some_and(|a| a.is_ok());
            let conntrack = match reconcile {
                Some(rc) if ok => Some(conntrack_target.send(rc).await),
                _ => None,
            };
            Outcome { restore, conntrack }
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
        failed += conntrack_finished(&mut self.conntrack, o.conntrack);
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
