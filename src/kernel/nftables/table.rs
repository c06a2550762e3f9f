//! One family's `kube-proxy` table as a kernel actor's handle
//! ([`NftablesTable`]): its ops are whole transactions, each applied all or
//! nothing; the syncPeriod's check ([`Subsystem::verify`]) is the cheap
//! drift check; [`NftablesKernel::list`] reads the table's chains and sets
//! before a full sync. Over the kernel's nf_tables ([`super::NetlinkNftables`])
//! or an in-memory one, both behind [`NfTables`].

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::{Listed, NfTables, TableInfo, TransactionError};
use crate::kernel::{Applied, Checked, KResult, KernelError, NftablesKernel, Subsystem};
use crate::msgs::nftables::{Transaction, TABLE};
use crate::mutex::lock;
use crate::net::IpFamily;

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

/// `family`'s `kube-proxy` table over `K`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct NftablesTable<K> {
    kernel: K,
    family: IpFamily,
    /// What the kernel held right after our last transaction (`None`
    /// before the first one and after a failure: nothing to compare with).
    witnessed: Arc<Mutex<Option<Witness>>>,
}

impl<K: NfTables> NftablesTable<K> {
    pub fn new(kernel: K, family: IpFamily) -> NftablesTable<K> {
        NftablesTable { kernel, family, witnessed: Arc::default() }
    }

    /// Applies `tx`; after a success, reads what the table is now.
    async fn transact(&self, tx: &Arc<Transaction>) -> KResult<()> {
        let res = self.kernel.transact(TABLE, tx.clone()).await;
        let witness = match &res {
            Ok(()) => self.read_witness().await.map_err(|e| tracing::debug!(error = %e, "no witness")).ok(),
            Err(_) => None,
        };
        *lock(&self.witnessed) = witness;
        res.map_err(|e| transaction_error(format!("nf_tables transaction of {} ops", tx.op_count()), e))
    }

    async fn read_witness(&self) -> Result<Witness, TransactionError> {
        let generation = self.kernel.generation().await?;
        Ok(Witness { generation, table: self.kernel.table_info(self.family, TABLE).await? })
    }

    /// Has anybody changed the table since our last transaction? `Some(what)`
    /// if so; `None` also before our first transaction (that one is full).
    async fn drift(&self) -> Result<Option<String>, TransactionError> {
        let Some(was) = *lock(&self.witnessed) else { return Ok(None) };
        let generation = self.kernel.generation().await?;
        if generation == was.generation {
            return Ok(None);
        }
        // Somebody committed: to our table?
        let table = self.kernel.table_info(self.family, TABLE).await?;
        let drift = table_drift(was.table, table);
        if drift.is_none() {
            *lock(&self.witnessed) = Some(Witness { generation, table });
        }
        Ok(drift)
    }
}

/// A transaction's (or a read's) failure as an ack carries it: refused
/// (nothing applied, the kernel's errno kept) or of unknown outcome.
pub(crate) fn transaction_error(what: String, e: TransactionError) -> KernelError {
    let errno = match &e {
        TransactionError::Refused { errno, .. } | TransactionError::BatchRefused { errno } => Some(errno.0),
        _ => None,
    };
    KernelError::library(what, e.outcome_known(), errno, e)
}

impl<K: NfTables> Subsystem for NftablesTable<K> {
    type Op = Arc<Transaction>;

    fn apply(&self, ops: Vec<Arc<Transaction>>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move {
            let mut results = Vec::with_capacity(ops.len());
            for tx in &ops {
                results.push(me.transact(tx).await);
            }
            results
        }
    }

    /// The transactions as they are: the planner wrote them from a listing
    /// of the table ([`NftablesKernel::list`]).
    fn reconcile(&self, desired: Vec<Arc<Transaction>>) -> impl Future<Output = Applied<Arc<Transaction>>> + 'static {
        let applied = self.apply(desired.clone());
        async move { Ok((desired, applied.await)) }
    }

    /// The cheap drift check: the ruleset's generation, and only if it
    /// moved, the table's handle, use count and flags (two small gets, no
    /// listing). Drift is what only a full sync repairs.
    fn verify(
        &self,
        _desired: Vec<Arc<Transaction>>,
    ) -> impl Future<Output = KResult<Checked<Arc<Transaction>>>> + 'static {
        let me = self.clone();
        async move {
            let drift = match me.drift().await {
                Ok(drift) => drift,
                Err(e) => {
                    *lock(&me.witnessed) = None;
                    return Err(transaction_error(format!("check table {TABLE} for drift"), e));
                }
            };
            if let Some(what) = &drift {
                *lock(&me.witnessed) = None;
                tracing::info!(table = TABLE, drift = %what, "somebody changed the nftables table");
            }
            Ok(Checked { applied: Vec::new(), results: Vec::new(), drift: drift.is_some() })
        }
    }

    fn kernel_ops(tx: &Arc<Transaction>) -> usize {
        tx.op_count()
    }
}

impl<K: NfTables> NftablesKernel for NftablesTable<K> {
    fn list(&self) -> impl Future<Output = KResult<Listed>> + 'static {
        let listed = self.kernel.list(self.family, TABLE);
        async move { listed.await.map_err(|e| transaction_error(format!("list table {TABLE}"), e)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::mem::MemNftables;
    use crate::msgs::nftables::NftOp;
    use futures::executor::block_on;

    fn tx(ops: Vec<NftOp>) -> Vec<Arc<Transaction>> {
        vec![Arc::new(Transaction { family: IpFamily::V4, ops })]
    }

    fn drift(t: &NftablesTable<MemNftables>) -> bool {
        block_on(t.verify(Vec::new())).expect("the check").drift
    }

    /// The cheap check: nothing before our first transaction, nothing
    /// after it while nobody commits or only to another table; drift when
    /// our table lost a chain (once: the next full sync is what repairs it).
    #[test]
    fn the_check_sees_changes_to_our_table_only() {
        let kernel = MemNftables::default();
        let t = NftablesTable::new(kernel.clone(), IpFamily::V4);
        assert!(!drift(&t), "no transaction of ours yet");
        let chain = |name: &str| NftOp::AddChain { name: name.into(), base: None, comment: None };
        let results = block_on(t.apply(tx(vec![NftOp::add_table(), chain("a"), chain("b")])));
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert!(!drift(&t));
        kernel.tamper(|tables| {
            tables.insert((IpFamily::V4, "somebody-else".into()), Default::default());
        });
        assert!(!drift(&t), "another table's commit");
        kernel.tamper(|tables| {
            tables.get_mut(&(IpFamily::V4, TABLE.to_string())).map(|t| t.chains.remove("b"));
        });
        assert!(drift(&t), "a chain of ours deleted");
        assert!(!drift(&t), "reported once, until our next transaction");
        // A refused transaction: its errno, known outcome; nothing to compare with after it.
        let results = block_on(t.apply(tx(vec![NftOp::DeleteChain("gone".into())])));
        let e = results[0].as_ref().expect_err("refused");
        assert!(e.outcome_known() && e.errno_value() == Some(libc::ENOENT), "{e}");
        kernel.tamper(|tables| {
            tables.remove(&(IpFamily::V4, TABLE.to_string()));
        });
        assert!(!drift(&t), "no witness after a failure: the next sync is full anyway");
    }

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
