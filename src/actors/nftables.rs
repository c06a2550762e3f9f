//! nftables mode's kernel actor: owns one family's nf_tables socket
//! ([`NetlinkNftables`]) and upstream's `kube-proxy` table of that family.
//!
//! Receives [`ApplyTransaction`] (one nf_tables transaction: all or
//! nothing), [`ListTable`] (the table's chains and sets, read before a
//! full sync) and [`CheckDrift`] (the periodic sync's cheap check: has
//! anybody changed the table since our last transaction?); answers each
//! with the kernel's result. Messages never
//! interleave (`AtomicResponse`). The planner's ops are the codec's (typed,
//! [`crate::msgs::nftables`]).

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::kernel::nftables::{Listed, NetlinkNftables, TableInfo, TransactionError};
use crate::msgs::nftables::{NftOp, TABLE};
use crate::net::IpFamily;
use crate::stats::ActorStats;

/// Why a sync's transaction did not apply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NftSyncError {
    #[error("listing the table before a full sync: {0}")]
    List(#[source] TransactionError),
    #[error("checking the table for drift: {0}")]
    Check(#[source] TransactionError),
    #[error("{0}")]
    Apply(#[source] TransactionError),
    /// A partial sync was asked of a planner that knows no kernel state (a bug).
    #[error("a partial sync without a confirmed full sync")]
    NoConfirmedState,
    #[error("the nftables actor is unreachable: {0}")]
    Unreachable(String),
}

/// The nftables actor's address, with its stats (mailbox depth is counted at send).
#[derive(Clone)]
pub struct NftablesTarget {
    pub addr: Addr<NftablesActor>,
    pub stats: Arc<ActorStats>,
}

impl NftablesTarget {
    /// Starts the actor over `nft`, registering its stats as `name`.
    pub fn start(nft: NetlinkNftables, family: IpFamily, stats: Arc<ActorStats>) -> NftablesTarget {
        let addr = NftablesActor::new(nft, family, stats.clone()).start();
        NftablesTarget { addr, stats }
    }

    /// Applies `ops` as one transaction.
    pub fn apply(
        &self,
        generation: u64,
        ops: Vec<NftOp>,
    ) -> impl std::future::Future<Output = Result<(), NftSyncError>> + 'static {
        self.ask(ApplyTransaction { generation, ops }, NftSyncError::Apply)
    }

    /// Whether the table changed since our last transaction: `Some(what)` when it did.
    pub fn check_drift(&self) -> impl std::future::Future<Output = Result<Option<String>, NftSyncError>> + 'static {
        self.ask(CheckDrift, NftSyncError::Check)
    }

    /// Lists the table's chains and sets.
    pub fn list(&self) -> impl std::future::Future<Output = Result<Listed, NftSyncError>> + 'static {
        self.ask(ListTable, NftSyncError::List)
    }

    /// Sends `msg`, counted in the mailbox; the kernel's error wrapped by `wrap`.
    fn ask<M, T>(
        &self,
        msg: M,
        wrap: fn(TransactionError) -> NftSyncError,
    ) -> impl std::future::Future<Output = Result<T, NftSyncError>> + 'static
    where
        M: Message<Result = Result<T, TransactionError>> + Send + 'static,
        T: Send + 'static,
        NftablesActor: Handler<M>,
    {
        self.stats.enqueued();
        let sent = self.addr.send(msg);
        async move {
            match sent.await {
                Ok(res) => res.map_err(wrap),
                Err(e) => Err(NftSyncError::Unreachable(e.to_string())),
            }
        }
    }
}

/// One family's `kube-proxy` table.
pub struct NftablesActor {
    nft: NetlinkNftables,
    family: IpFamily,
    stats: Arc<ActorStats>,
    /// What the kernel held right after our last transaction.
    witnessed: Option<Witness>,
}

impl NftablesActor {
    pub fn new(nft: NetlinkNftables, family: IpFamily, stats: Arc<ActorStats>) -> NftablesActor {
        NftablesActor { nft, family, stats, witnessed: None }
    }
}

/// The ruleset's generation and our table, read right after a transaction
/// of ours: a later generation means somebody committed since, and the
/// table tells whether it was to ours (deleted, re-created, chains or sets
/// added or removed, made dormant). A flushed chain or a deleted element
/// leaves both alike: those the hourly full sync repairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Witness {
    pub generation: u32,
    pub table: Option<TableInfo>,
}

impl Witness {
    async fn read(nft: &NetlinkNftables, family: IpFamily) -> Result<Witness, TransactionError> {
        let generation = nft.generation().await?;
        Ok(Witness { generation, table: nft.table_info(family, TABLE).await? })
    }
}

/// How the table changed between two witnesses, if it did (pure).
pub fn table_drift(was: Option<TableInfo>, now: Option<TableInfo>) -> Option<String> {
    match (was, now) {
        (None, None) => None,
        (Some(_), None) => Some("the table was deleted".into()),
        (None, Some(_)) => Some("a table appeared".into()),
        (Some(a), Some(b)) if a == b => None,
        (Some(a), Some(b)) if a.handle != b.handle => Some("the table was deleted and created again".into()),
        (Some(a), Some(b)) if a.flags != b.flags => {
            Some(format!("the table's flags went {:#x} → {:#x}", a.flags, b.flags))
        }
        (Some(a), Some(b)) => Some(format!("the table's chains and sets went {} → {}", a.use_count, b.use_count)),
    }
}

impl Actor for NftablesActor {
    type Context = Context<Self>;
}

/// One transaction on the table.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), TransactionError>")]
pub struct ApplyTransaction {
    pub generation: u64,
    pub ops: Vec<NftOp>,
}

/// The table's chains and sets (none if there is no table).
#[derive(Debug, Message)]
#[rtype(result = "Result<Listed, TransactionError>")]
pub struct ListTable;

/// Has anybody changed the table since our last transaction? `Some(what)`
/// if so; `None` also before our first transaction (that one is a full sync).
#[derive(Debug, Message)]
#[rtype(result = "Result<Option<String>, TransactionError>")]
pub struct CheckDrift;

impl Handler<ApplyTransaction> for NftablesActor {
    type Result = AtomicResponse<Self, Result<(), TransactionError>>;

    fn handle(&mut self, msg: ApplyTransaction, _: &mut Context<Self>) -> Self::Result {
        self.stats.dequeued();
        let (nft, family, started) = (self.nft.clone(), self.family, Instant::now());
        let n = msg.ops.len();
        let work = async move {
            let res = nft.apply(family, TABLE, &msg.ops).await;
            // What the table is now, for the periodic drift check (unknown after a failure).
            let witness = match &res {
                Ok(()) => Witness::read(&nft, family).await.map_err(|e| tracing::debug!(error = %e, "no witness")).ok(),
                Err(_) => None,
            };
            (res, witness)
        };
        AtomicResponse::new(Box::pin(work.into_actor(self).map(move |(res, witness), act, _| {
            act.witnessed = witness;
            let actor = act.stats.name.as_str();
            match &res {
                Ok(()) => tracing::debug!(actor, generation = msg.generation, ops = n, "transaction applied"),
                Err(e) => tracing::warn!(actor, generation = msg.generation, ops = n, error = %e, "transaction failed"),
            }
            act.stats.applied(msg.generation, n, usize::from(res.is_err()), started.elapsed());
            res
        })))
    }
}

impl Handler<ListTable> for NftablesActor {
    type Result = AtomicResponse<Self, Result<Listed, TransactionError>>;

    fn handle(&mut self, _: ListTable, _: &mut Context<Self>) -> Self::Result {
        self.stats.dequeued();
        let (nft, family) = (self.nft.clone(), self.family);
        let work = async move { nft.list(family, TABLE).await };
        AtomicResponse::new(Box::pin(work.into_actor(self).map(|res, act, _| {
            if let Err(e) = &res {
                tracing::warn!(actor = %act.stats.name, error = %e, "listing the table failed");
            }
            res
        })))
    }
}

impl Handler<CheckDrift> for NftablesActor {
    type Result = AtomicResponse<Self, Result<Option<String>, TransactionError>>;

    fn handle(&mut self, _: CheckDrift, _: &mut Context<Self>) -> Self::Result {
        self.stats.dequeued();
        let (nft, family, was) = (self.nft.clone(), self.family, self.witnessed);
        let work = async move {
            let Some(was) = was else { return (Ok(None), None) };
            let generation = match nft.generation().await {
                Ok(g) if g == was.generation => return (Ok(None), Some(was)),
                Ok(g) => g,
                Err(e) => return (Err(e), None),
            };
            // Somebody committed: to our table?
            match nft.table_info(family, TABLE).await {
                Ok(table) => match table_drift(was.table, table) {
                    None => (Ok(None), Some(Witness { generation, table })),
                    Some(what) => (Ok(Some(what)), None),
                },
                Err(e) => (Err(e), None),
            }
        };
        AtomicResponse::new(Box::pin(work.into_actor(self).map(|(res, witness), act, _| {
            act.witnessed = witness;
            if let Err(e) = &res {
                tracing::warn!(actor = %act.stats.name, error = %e, "checking the table for drift failed");
            }
            res
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_drift_names_what_changed_and_nothing_when_alike() {
        let t = |handle, use_count, flags| Some(TableInfo { handle, use_count, flags });
        assert_eq!(table_drift(t(1, 10, 0), t(1, 10, 0)), None);
        assert_eq!(table_drift(None, None), None);
        assert_eq!(table_drift(t(1, 10, 0), None).as_deref(), Some("the table was deleted"));
        assert_eq!(table_drift(None, t(1, 10, 0)).as_deref(), Some("a table appeared"));
        assert_eq!(table_drift(t(1, 10, 0), t(2, 10, 0)).as_deref(), Some("the table was deleted and created again"));
        assert_eq!(table_drift(t(1, 10, 0), t(1, 10, 1)).as_deref(), Some("the table's flags went 0x0 → 0x1"));
        assert_eq!(table_drift(t(1, 10, 0), t(1, 9, 0)).as_deref(), Some("the table's chains and sets went 10 → 9"));
    }
}
