//! nftables mode's dataplane: the nftables planner, the nftables actor (one
//! nf_tables transaction per sync) and the conntrack actor.
//!
//! - A full sync (the first one, after a failed or unanswered transaction,
//!   after a reload or a topology change, when the node's addresses changed
//!   at a periodic sync, after drift, and hourly) first lists the table's
//!   chains and sets ([`Dataplane::prepare`]), then writes the whole table
//!   as upstream's needFullSync: sets and maps reset, every chain
//!   rewritten, per-service chains nobody uses flushed (stale); sent as
//!   bounded transactions, the per-service chains first, each built when
//!   it is sent ([`Staged`]).
//! - Otherwise a partial sync: the changed service ports only; with nothing
//!   changed (the syncPeriod's sync of a quiet cluster) nothing is sent.
//! - A transaction the kernel refused, or whose answer never came, makes the
//!   planner forget what the kernel holds ([`NftablesPlanner::failed`]): the
//!   next sync is full, after the scheduler's backoff.
//! - Stale chains are deleted by a transaction of their own at the start of
//!   the first sync at least [`crate::plan::nftables::STALE_CHAIN_DELAY`]
//!   after the one that flushed them (upstream's order). That sync is asked
//!   for through [`Dataplane::next_retry`], so it comes about a second later
//!   (rate-limited by minSyncPeriod) rather than at the next syncPeriod.
//!   A failed deletion is counted (upstream's cleanup failures) and does not
//!   fail the sync; the chains are found again by the next full sync.
//! - The syncPeriod's sync first asks the nftables actor whether anybody
//!   changed the table since our last transaction (the ruleset's generation,
//!   then the table's handle, use count and flags: two small gets, no
//!   listing); if so, or if the check fails, that sync lists the table and
//!   is a full one.
//! - The conntrack reconcile follows a successful transaction, as in
//!   iptables mode.
//! - ServiceCIDRs: the family's ranges ([`Model::service_cidrs`]) go into the
//!   planner's context, whose `cluster-ips-check` chain then drops traffic to
//!   their unallocated addresses. A change of them is a partial sync over the
//!   whole desired state ([`NftablesPlanner::partial_with`]): the top-level
//!   chains are rewritten, nothing else that did not change; not a full
//!   transaction (at start the ServiceCIDR list may well arrive after the
//!   first sync: a second full sync then cost 17 s at 10,000 services and
//!   13 min at 44,000). Upstream only records the new ranges
//!   (`OnServiceCIDRsChanged` neither syncs nor sets needFullSync), so its
//!   rule changes at its next full sync.

use std::sync::Arc;

use actix::Recipient;
use futures::FutureExt;
use ipnet::IpNet;
use tokio::time::Instant;

use super::{
    batch, conntrack_finished, AddrSource, ConntrackAnswer, ConntrackTarget, Dataplane, Finished, Planned, Prepare,
    Target,
};
use crate::actors::nftables::ListTable;
use crate::kernel::KernelError;
use crate::model::{Model, ModelChanges, NodeInfo};
use crate::msgs::nftables::{NftOp, Transaction};
use crate::msgs::{Ack, SyncMode};
use crate::net::IpFamily;
use crate::plan::conntrack::ConntrackPlanner;
use crate::plan::context::LocalAddr;
use crate::plan::nftables::{KernelObjects, NftablesContext, NftablesPlanner, Staged, STAGE_OPS};
use crate::schedule::SyncKind;

/// Builds the planner's context from the Node, the family's ServiceCIDRs
/// and the node's addresses.
pub type NftContextBuilder = Box<dyn Fn(&NodeInfo, &[IpNet], &[LocalAddr]) -> NftablesContext + Send>;

/// The actors of nftables mode.
#[derive(Clone)]
pub struct NftablesTargets {
    /// The table's actor: its batches carry transactions.
    pub nftables: Target<Arc<Transaction>>,
    /// The same actor, for listings.
    pub list: Recipient<ListTable>,
    pub conntrack: ConntrackTarget,
}

impl NftablesTargets {
    /// Applies `tx` as one transaction.
    fn apply(&self, generation: u64, tx: Transaction) -> impl std::future::Future<Output = Result<(), NftSyncError>> {
        let sent = self.nftables.send(batch(generation, SyncMode::Incremental, vec![Arc::new(tx)]));
        async move { acked(sent.await).map_err(NftSyncError::Apply) }
    }

    /// The syncPeriod's check: `Ok(true)` when somebody changed the table
    /// since our last transaction.
    fn check_drift(&self) -> impl std::future::Future<Output = Result<bool, NftSyncError>> {
        let sent = self.nftables.send(batch(0, SyncMode::Verify, Vec::new()));
        async move {
            let ack = sent.await.ok_or(NftSyncError::Unreachable)?;
            match ack.failed.into_iter().next() {
                Some((_, e)) => Err(NftSyncError::Check(e)),
                None => Ok(ack.drift),
            }
        }
    }

    /// The table's chains and sets, as the planner's full sync takes them.
    fn list(&self) -> impl std::future::Future<Output = Result<KernelObjects, NftSyncError>> {
        self.nftables.stats.enqueued();
        let sent = self.list.send(ListTable);
        async move {
            match sent.await {
                Ok(Ok(l)) => Ok(KernelObjects { chains: l.chains, sets: l.sets }),
                Ok(Err(e)) => Err(NftSyncError::List(e)),
                Err(_) => Err(NftSyncError::Unreachable),
            }
        }
    }
}

/// A transaction's ack: `Ok` when applied.
fn acked(ack: Option<Ack<Arc<Transaction>>>) -> Result<(), KernelError> {
    match ack {
        Some(ack) => ack.failed.into_iter().next().map_or(Ok(()), |(_, e)| Err(e)),
        None => Err(KernelError::unknown("nf_tables transaction", "the nftables actor is unreachable")),
    }
}

/// Why a sync's transaction did not apply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NftSyncError {
    #[error("listing the table before a full sync: {0}")]
    List(#[source] KernelError),
    #[error("checking the table for drift: {0}")]
    Check(#[source] KernelError),
    #[error("{0}")]
    Apply(#[source] KernelError),
    /// A partial sync was asked of a planner that knows no kernel state (a bug).
    #[error("a partial sync without a confirmed full sync")]
    NoConfirmedState,
    #[error("the nftables actor is unreachable")]
    Unreachable,
}

/// What [`Dataplane::prepare`] decided for the sync it prepared.
struct Decision {
    full: bool,
    /// The node's addresses, read for a full or periodic sync.
    addrs: Option<Vec<LocalAddr>>,
}

/// nftables mode: plans with [`NftablesPlanner`], one transaction per sync.
pub struct NftablesDataplane {
    family: IpFamily,
    planner: NftablesPlanner,
    targets: NftablesTargets,
    addrs: AddrSource,
    context: NftContextBuilder,
    /// The planner's clock starts here.
    epoch: Instant,
    decision: Option<Decision>,
    /// The table as listed before the full sync being planned.
    listed: Option<Result<KernelObjects, NftSyncError>>,
    /// The node's addresses of the last full sync (nodePortAddresses):
    /// read again at each periodic sync.
    last_addrs: Vec<LocalAddr>,
    /// The sync in flight is a partial one.
    partial: bool,
    conntrack: ConntrackPlanner,
}

impl NftablesDataplane {
    pub fn new(family: IpFamily, targets: NftablesTargets, addrs: AddrSource, context: NftContextBuilder) -> Self {
        let planner = NftablesPlanner::new(context(&NodeInfo::default(), &[], &[]));
        NftablesDataplane {
            family,
            planner,
            targets,
            addrs,
            context,
            epoch: Instant::now(),
            decision: None,
            listed: None,
            last_addrs: Vec::new(),
            partial: false,
            conntrack: ConntrackPlanner::new(family),
        }
    }

    fn decide(&mut self, kind: SyncKind) -> Decision {
        let mut full = kind == SyncKind::Full || self.planner.needs_full();
        let addrs = (full || kind == SyncKind::Periodic).then(|| (self.addrs)());
        if kind == SyncKind::Periodic && !full && addrs.as_ref() != Some(&self.last_addrs) {
            tracing::info!(ip_family = self.label(), "the node's addresses changed: full resync");
            full = true;
        }
        Decision { full, addrs }
    }

    fn label(&self) -> &'static str {
        crate::net::ip_family_label(self.family)
    }

    /// A sync that fails before anything is sent.
    fn not_sent(&mut self, e: NftSyncError, full: bool) -> Planned<Outcome> {
        tracing::error!(ip_family = self.label(), error = %e, "nftables sync not sent");
        let outcome = Outcome { cleanup: None, main: Err(e), conntrack: None };
        Planned { full, ops: 0, run: async move { outcome }.boxed_local() }
    }
}

/// A sync's transactions, built as they are sent: a full sync's
/// [`Staged`] ones, or a partial sync's one.
enum Steps {
    Staged(Box<Staged>),
    One(Option<Transaction>),
}

impl Steps {
    fn ops(&self) -> usize {
        match self {
            Steps::Staged(s) => s.ops(),
            Steps::One(tx) => tx.as_ref().map_or(0, |tx| tx.ops.len()),
        }
    }

    fn transactions(&self) -> usize {
        match self {
            Steps::Staged(s) => s.transactions(),
            Steps::One(tx) => usize::from(tx.is_some()),
        }
    }
}

impl Iterator for Steps {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        match self {
            Steps::Staged(s) => s.next(),
            Steps::One(tx) => tx.take(),
        }
    }
}

/// The results of one sync.
pub struct Outcome {
    /// The stale chains' deletion, if one was sent.
    cleanup: Option<Result<(), NftSyncError>>,
    main: Result<(), NftSyncError>,
    conntrack: ConntrackAnswer,
}

impl Dataplane for NftablesDataplane {
    type Outcome = Outcome;
    type Config = NftContextBuilder;

    fn prepare(&mut self, kind: SyncKind) -> Option<Prepare<Self>> {
        let decision = self.decide(kind);
        let full = decision.full;
        self.decision = Some(decision);
        let family = self.label();
        if full {
            let listing = self.targets.list();
            let read = async move {
                let listed = listing.await;
                Box::new(move |d: &mut NftablesDataplane| d.listed = Some(listed))
                    as Box<dyn FnOnce(&mut NftablesDataplane)>
            };
            return Some(read.boxed_local());
        }
        if kind != SyncKind::Periodic {
            return None;
        }
        // The syncPeriod's cheap check: two small gets; a listing and a full
        // sync only if somebody changed the table (or the check failed).
        let check = self.targets.check_drift();
        let targets = self.targets.clone();
        let read = async move {
            let drift = match check.await {
                Ok(false) => {
                    return Box::new(|_: &mut NftablesDataplane| ()) as Box<dyn FnOnce(&mut NftablesDataplane)>;
                }
                Ok(true) => "the nftables actor saw somebody change the table".to_string(),
                Err(e) => e.to_string(),
            };
            tracing::info!(ip_family = family, drift = %drift, "the nftables table drifted: full resync");
            let listed = targets.list().await;
            Box::new(move |d: &mut NftablesDataplane| {
                d.listed = Some(listed);
                if let Some(decision) = d.decision.as_mut() {
                    decision.full = true;
                }
            }) as Box<dyn FnOnce(&mut NftablesDataplane)>
        };
        Some(read.boxed_local())
    }

    fn sync(&mut self, model: &Model, changes: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<Outcome> {
        let Decision { full, addrs } = match self.decision.take() {
            Some(d) => d,
            None => self.decide(kind),
        };
        self.partial = !full;
        let reconcile = self.conntrack.plan(model, changes, generation);
        if let (true, Some(Ok(kernel))) = (full, &self.listed) {
            // Only stale chains the listing shows are deleted (a table
            // deleted and written again took the others), as upstream.
            self.planner.forget_unlisted_stale(&kernel.chains);
        }
        let cleanup = self.planner.delete_due(self.epoch.elapsed());
        let (steps, stale): (Steps, usize) = if full {
            let mut kernel = match self.listed.take() {
                Some(Ok(k)) => k,
                Some(Err(e)) => return self.not_sent(e, full),
                None => KernelObjects::default(),
            };
            // Chains this sync's cleanup deletes are gone: nothing to flush.
            if let Some(tx) = &cleanup {
                kernel.chains.retain(|c| !tx.ops.iter().any(|op| matches!(op, NftOp::DeleteChain(d) if d == c)));
            }
            let addrs = addrs.unwrap_or_else(|| (self.addrs)());
            let ctx = (self.context)(model.node(), model.service_cidrs(), &addrs);
            self.last_addrs = addrs;
            let staged = self.planner.full_staged(model, ctx, &kernel, STAGE_OPS);
            (Steps::Staged(Box::new(staged)), self.planner.planned_stale())
        } else {
            let delta = if changes.service_cidrs_changed {
                let ctx = (self.context)(model.node(), model.service_cidrs(), &self.last_addrs);
                self.planner.partial_with(model, ctx)
            } else {
                self.planner.partial(model, &changes.ports)
            };
            match delta {
                Some(d) => (Steps::One(Some(d.tx)), d.stale_chains.len()),
                None => return self.not_sent(NftSyncError::NoConfirmedState, full),
            }
        };
        let ops = steps.ops() + cleanup.as_ref().map_or(0, |tx| tx.ops.len()) + usize::from(reconcile.is_some());
        tracing::debug!(
            ip_family = self.label(),
            generation,
            full,
            ops,
            transactions = steps.transactions(),
            stale,
            "nftables transaction planned"
        );
        let (nft, ct) = (self.targets.clone(), self.targets.conntrack.clone());
        let run = async move {
            let cleanup = match cleanup {
                Some(tx) => Some(nft.apply(generation, tx).await),
                None => None,
            };
            let mut main = Ok(());
            for step in steps.filter(|s| !s.is_empty()) {
                main = nft.apply(generation, step).await;
                if main.is_err() {
                    break;
                }
            }
            let conntrack = match reconcile {
                Some(rc) if main.is_ok() => Some(ct.send(rc).await),
                _ => None,
            };
            Outcome { cleanup, main, conntrack }
        };
        Planned { full, ops, run: run.boxed_local() }
    }

    fn finished(&mut self, o: Outcome) -> Finished {
        let now = self.epoch.elapsed();
        let mut failed = 0;
        let cleanup_failed = matches!(o.cleanup, Some(Err(_)));
        if let Some(Err(e)) = &o.cleanup {
            tracing::warn!(ip_family = self.label(), error = %e, "deleting stale chains failed; the next full sync finds them");
        }
        let sync_failed = o.main.is_err();
        match o.main {
            Ok(()) => self.planner.confirm_applied(now),
            Err(e) => {
                failed += 1;
                self.planner.failed();
                let partial = self.partial;
                tracing::warn!(ip_family = self.label(), error = %e, partial, "nftables sync failed: the next sync is a full one");
            }
        }
        failed += conntrack_finished(&mut self.conntrack, o.conntrack);
        Finished {
            failed,
            resync: failed > 0,
            nftables_sync_failed: sync_failed,
            nftables_cleanup_failed: cleanup_failed,
            ..Finished::default()
        }
    }

    /// Stale chains due for deletion bring a sync (see the module's doc).
    fn next_retry(&self) -> Option<Instant> {
        self.planner.next_delete_due().map(|d| self.epoch + d)
    }

    fn reconfigure(&mut self, context: NftContextBuilder) {
        self.context = context;
    }
}
