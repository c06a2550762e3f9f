//! nf_tables over netlink: the transactions nftables mode's actor sends,
//! carrying only what changed, as typed ops ([`crate::msgs::nftables`]).
//!
//! - Codec: `netlink-packet-netfilter` (rust-netlink, MIT; already the
//!   ctnetlink codec here) has nf_tables' tables, chains, sets, set
//!   elements, rules and the batch markers; expressions it does not model
//!   go through its `Expressions::Other` (name and attributes). The ops are
//!   encoded in [`codec`] (rules in [`expr`]); this module sends them.
//! - [`NftablesTable`] is the actor's handle on one family's table, over
//!   [`NfTables`]: this socket, or the in-memory kernel in tests.
//! - One [`NetlinkNftables::apply`] is one transaction of the nfnetlink
//!   layer ([`Nfnl::transaction`]): `NFNL_MSG_BATCH_BEGIN`, the ops,
//!   `NFNL_MSG_BATCH_END`, in one datagram. The kernel applies all or
//!   nothing; ops ask no ack (as `nft`), every refusal comes back and names
//!   the op ([`TransactionError`]).
//! - [`NetlinkNftables::generation`] and [`NetlinkNftables::table_info`]
//!   are the cheap drift check: two small gets, no listing;
//!   [`NetlinkNftables::list`] and [`NetlinkNftables::chain_names`] are
//!   dumps (the latter also lists iptables-nft's tables for the iptables
//!   handle). Every exchange runs on the blocking pool.

mod attrs;
pub mod codec;
pub mod expr;
pub mod table;
pub mod types;
mod udata;

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_netfilter::NetfilterMessage;

pub use self::codec::TableInfo;
pub use self::expr::EncodeError;
pub use self::table::NftablesTable;
use crate::kernel::netlink::{self, Errno, Msg, Nfnl, NfnlError, RawNfnl, Refusals};
pub use crate::msgs::nftables::NftOp;
use crate::msgs::nftables::Transaction;
use crate::net::IpFamily;

/// nfnetlink's subsystem id of nf_tables (the batch markers' `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// Why a transaction (or a get) changed nothing, or may have.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransactionError {
    /// The kernel refused op `index` (the first refused one) with `errno`;
    /// the whole transaction was aborted.
    #[error("nf_tables refused op {index} ({op}): {errno}; nothing of the transaction applied")]
    Refused { index: usize, op: String, errno: Errno },
    /// The kernel refused the transaction as a whole (its commit, or the
    /// batch: without CAP_NET_ADMIN, say): nothing applied.
    #[error("nf_tables refused the transaction: {errno}; nothing applied")]
    BatchRefused { errno: Errno },
    /// The kernel refused ops, but its refusals overflowed the receive
    /// buffer: which ones is unknown, and nothing applied.
    #[error("nf_tables refused ops of the transaction of {ops} (their errors were lost); nothing applied")]
    RefusalsLost { ops: usize },
    /// No (complete) answer: whether it was committed is unknown.
    #[error("nf_tables {what}: {source}")]
    Unknown {
        what: String,
        #[source]
        source: NfnlError,
    },
    /// An answer without what it must carry.
    #[error("nf_tables {what}: the reply lacks {missing}")]
    Reply { what: String, missing: &'static str },
    /// An op the codec cannot encode; nothing was sent.
    #[error("{0}; nothing sent")]
    Encode(#[from] EncodeError),
    /// The datagram was refused whole (larger than the socket may send,
    /// e.g. without CAP_NET_ADMIN to raise its buffer): nothing applied.
    #[error("nf_tables transaction of {ops} ops refused whole ({source}); nothing applied")]
    TooLarge {
        ops: usize,
        #[source]
        source: Arc<std::io::Error>,
    },
}

impl TransactionError {
    /// Whether nothing of it took effect (else the outcome is unknown).
    pub fn outcome_known(&self) -> bool {
        !matches!(self, TransactionError::Unknown { .. })
    }

    /// `what` failed in the netlink layer: refused by the kernel, or
    /// without an answer.
    fn netlink(what: impl Into<String>, source: NfnlError) -> TransactionError {
        match source.errno() {
            Some(errno) => TransactionError::Refused { index: 0, op: what.into(), errno },
            None => TransactionError::Unknown { what: what.into(), source },
        }
    }
}

/// The nf_tables calls one family's table handle ([`NftablesTable`])
/// makes: the kernel's over netlink ([`NetlinkNftables`]), or an in-memory
/// kernel's in tests.
pub trait NfTables: Clone + Unpin + 'static {
    /// Applies `tx` to table `table` of its family as one transaction.
    fn transact(
        &self,
        table: &str,
        tx: Arc<Transaction>,
    ) -> impl Future<Output = Result<(), TransactionError>> + 'static;

    /// The chains and sets (maps included; anonymous sets left out) of
    /// table `table` of `family`. A missing table lists nothing.
    fn list(&self, family: IpFamily, table: &str) -> impl Future<Output = Result<Listed, TransactionError>> + 'static;

    /// The ruleset's generation: it moves on with every commit in this
    /// network namespace, ours or anybody's.
    fn generation(&self) -> impl Future<Output = Result<u32, TransactionError>> + 'static;

    /// Table `table` of `family` as a get reports it (`None`: no such table).
    fn table_info(
        &self,
        family: IpFamily,
        table: &str,
    ) -> impl Future<Output = Result<Option<TableInfo>, TransactionError>> + 'static;
}

/// An nfnetlink socket for nf_tables, in the network namespace of the
/// thread that opened it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NetlinkNftables {
    nl: Nfnl,
    /// The last anonymous set id used: ids (and so the sets' names, see
    /// [`expr::anon_name`]) stay unique in the table across transactions.
    anon_ids: Arc<AtomicU32>,
}

impl NetlinkNftables {
    /// Opens the socket in the calling thread's network namespace.
    pub fn new() -> std::io::Result<NetlinkNftables> {
        Ok(NetlinkNftables { nl: Nfnl::open()?, anon_ids: Arc::new(AtomicU32::new(anon_id_seed())) })
    }

    /// Netlink messages sent so far (batch markers included).
    pub fn messages_sent(&self) -> u64 {
        self.nl.messages_sent()
    }

    /// Applies `ops` to table `table` of `family` as one transaction (an
    /// op the codec cannot encode: nothing is sent).
    pub async fn apply(&self, family: IpFamily, table: &str, ops: &[NftOp]) -> Result<(), TransactionError> {
        if ops.is_empty() {
            return Ok(());
        }
        // One transaction at a time per socket (the actor's), so the ids it takes are its own.
        let mut next_id = self.anon_ids.load(Ordering::Relaxed);
        let requests = codec::requests(family, table, ops, &mut next_id)?;
        self.anon_ids.store(next_id, Ordering::Relaxed);
        // Each typed message goes as its bytes are made: the two are not held whole at once.
        let (owner, msgs): (Vec<usize>, Vec<Msg>) =
            requests.into_iter().map(|r| (r.op, request(&r.msg, r.flags))).unzip();
        match self.nl.transaction(NFNL_SUBSYS_NFTABLES, msgs).await {
            Ok(refusals) => refused(&refusals, &owner, ops),
            Err(e) => Err(transaction_failure(e, ops.len())),
        }
    }
}

/// What the kernel's refusals of a transaction mean: the first refused op
/// (by its messages, `owner` naming each message's op), or the batch.
fn refused(refusals: &Refusals, owner: &[usize], ops: &[NftOp]) -> Result<(), TransactionError> {
    let first =
        refusals.messages.iter().filter_map(|&(m, errno)| Some((*owner.get(m)?, errno))).min_by_key(|(i, _)| *i);
    match (first, refusals.batch.first()) {
        (Some((index, errno)), _) => Err(TransactionError::Refused {
            index,
            op: ops.get(index).map(ToString::to_string).unwrap_or_default(),
            errno,
        }),
        (None, Some(&errno)) => Err(TransactionError::BatchRefused { errno }),
        (None, None) => Ok(()),
    }
}

/// A transaction that has no answer: refused whole (too large for the
/// socket), refused with its refusals lost, or of unknown outcome.
fn transaction_failure(e: NfnlError, ops: usize) -> TransactionError {
    match e {
        NfnlError::Io { what: "sending", source }
            if matches!(source.raw_os_error(), Some(libc::EMSGSIZE | libc::ENOBUFS)) =>
        {
            TransactionError::TooLarge { ops, source }
        }
        // Every message the kernel sends to a transaction that asked no acks is a refusal.
        NfnlError::Overrun => TransactionError::RefusalsLost { ops },
        e => TransactionError::Unknown { what: format!("transaction of {ops} ops"), source: e },
    }
}

/// Where a socket's anonymous set ids start: at random in the upper half of
/// the ids (`nft` and upstream's kube-proxy have the kernel number theirs
/// from 0 up), so names stay clear of theirs and of an earlier run's
/// still in the table; a clash would be refused and the next full sync
/// would take new ids.
fn anon_id_seed() -> u32 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let random = std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id()));
    // 2^31 .. 2^31 + 2^30: room for 2^30 more before the counter wraps.
    (1 << 31) | (random as u32 & ((1 << 30) - 1))
}

/// The names of a table's chains and sets, as a dump lists them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listed {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
}

impl NetlinkNftables {
    /// The chains and sets (maps included; anonymous sets left out) of
    /// table `table` of `family`: two dumps. A missing table lists nothing.
    pub async fn list(&self, family: IpFamily, table: &str) -> Result<Listed, TransactionError> {
        let chains = self.dump_names(family, table, codec::DumpKind::Chains).await?;
        let sets = self.dump_names(family, table, codec::DumpKind::Sets).await?;
        Ok(Listed {
            chains: chains.into_iter().collect(),
            sets: sets.into_iter().filter(|s| !s.starts_with("__")).collect(),
        })
    }

    /// The names of the chains of table `table` of `family` (iptables-nft's
    /// `ip`/`ip6` tables too): one dump, where `iptables-nft-save` needs
    /// minutes once a table holds 100,000 chains. Empty when the table, or
    /// nf_tables for the family, does not exist.
    pub async fn chain_names(&self, family: IpFamily, table: &str) -> Result<BTreeSet<String>, TransactionError> {
        match self.dump_names(family, table, codec::DumpKind::Chains).await {
            Err(TransactionError::Refused { errno: Errno(libc::EAFNOSUPPORT), .. }) => Ok(BTreeSet::new()),
            other => other,
        }
    }

    /// The ruleset's generation (`NFT_MSG_GETGEN`): it moves on with every
    /// commit in this network namespace, ours or anybody's.
    pub async fn generation(&self) -> Result<u32, TransactionError> {
        let what = "get the ruleset generation";
        let reply = self.get_one(codec::generation_request(), what).await?;
        reply
            .as_ref()
            .and_then(|r| codec::generation_id(r.payload()))
            .ok_or(TransactionError::Reply { what: what.into(), missing: "NFTA_GEN_ID" })
    }

    /// Table `table` of `family` as a get reports it (`None`: no such table).
    pub async fn table_info(&self, family: IpFamily, table: &str) -> Result<Option<TableInfo>, TransactionError> {
        let what = format!("get table {table}");
        match self.get_one(codec::table_request(family, table), &what).await? {
            None => Ok(None),
            Some(r) => codec::table_info(r.payload())
                .map(Some)
                .ok_or(TransactionError::Reply { what, missing: "the table's handle and use count" }),
        }
    }

    /// The one object of a get's answer (`None` when the kernel says ENOENT).
    async fn get_one(&self, msg: NetfilterMessage, what: &str) -> Result<Option<RawNfnl>, TransactionError> {
        match self.nl.get(request(&msg, 0)).await {
            Ok(objects) => objects
                .into_iter()
                .next()
                .map(Some)
                .ok_or(TransactionError::Reply { what: what.into(), missing: "an object" }),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(None),
            Err(e) => Err(TransactionError::netlink(what, e)),
        }
    }

    /// The names of table `table`'s objects of `kind`: one dump, the names
    /// read as they arrive. No such table (or family): nothing of ours there.
    async fn dump_names(
        &self,
        family: IpFamily,
        table: &str,
        kind: codec::DumpKind,
    ) -> Result<BTreeSet<String>, TransactionError> {
        let what = format!("list {kind:?} of table {table}");
        let dump = request(&codec::dump_request(family, table, kind), NLM_F_DUMP);
        let wanted = table.to_string();
        let names = self.nl.dump(dump, BTreeSet::new(), move |names: &mut BTreeSet<String>, raw| {
            names.extend(codec::name_in_table(raw.payload(), &wanted, kind));
            Ok::<(), std::convert::Infallible>(())
        });
        match names.await {
            Ok(names) => Ok(names.unwrap_or_else(|never| match never {})),
            Err(e) if e.errno() == Some(Errno::ENOENT) => Ok(BTreeSet::new()),
            Err(e) => Err(TransactionError::netlink(what, e)),
        }
    }
}

/// Why nf_tables does not answer for a family.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] Arc<std::io::Error>),
    #[error("cannot start the probe's runtime: {0}")]
    Runtime(#[source] Arc<std::io::Error>),
    #[error("listing nf_tables chains: {0}")]
    List(#[source] TransactionError),
}

/// Whether nf_tables answers for `family`: a dump of table `table`'s
/// chains, made on a thread of its own (start-up, before the actors run).
pub fn probe(family: IpFamily, table: &str) -> Result<(), ProbeError> {
    let nft = NetlinkNftables::new().map_err(|e| ProbeError::Socket(Arc::new(e)))?;
    let listed = crate::kernel::blocking::on_own_thread(|| nft.chain_names(family, table));
    listed.map_err(|e| ProbeError::Runtime(Arc::new(e)))?.map(|_| ()).map_err(ProbeError::List)
}

/// `msg` as a request of the nfnetlink layer, with `flags` besides
/// `NLM_F_REQUEST`.
fn request(msg: &NetfilterMessage, flags: u16) -> Msg {
    netlink::request(RawNfnl::emitted(msg), flags)
}

impl NfTables for NetlinkNftables {
    fn transact(
        &self,
        table: &str,
        tx: Arc<Transaction>,
    ) -> impl Future<Output = Result<(), TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.apply(tx.family, &table, &tx.ops).await }
    }

    fn list(&self, family: IpFamily, table: &str) -> impl Future<Output = Result<Listed, TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.list(family, &table).await }
    }

    fn generation(&self) -> impl Future<Output = Result<u32, TransactionError>> + 'static {
        let me = self.clone();
        async move { me.generation().await }
    }

    fn table_info(
        &self,
        family: IpFamily,
        table: &str,
    ) -> impl Future<Output = Result<Option<TableInfo>, TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.table_info(family, &table).await }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<NftOp> {
        ["a", "b", "c"].iter().map(|c| NftOp::AddChain { name: c.to_string(), base: None, comment: None }).collect()
    }

    /// Messages 0..=3 belong to ops 0, 1, 1, 2 (op 1 brings an anonymous set).
    #[test]
    fn refusals_name_the_first_refused_op_or_else_the_batch() {
        let owner = [0, 1, 1, 2];
        let r = Refusals { messages: vec![(3, Errno::ENOENT), (2, Errno::EEXIST)], batch: vec![Errno(1)] };
        match refused(&r, &owner, &ops()) {
            Err(TransactionError::Refused { index: 1, op, errno: Errno::EEXIST }) => assert_eq!(op, "add chain b"),
            other => panic!("{other:?}"),
        }
        let batch = Refusals { messages: Vec::new(), batch: vec![Errno(1)] };
        let e = refused(&batch, &owner, &ops()).expect_err("the batch refused");
        assert!(matches!(e, TransactionError::BatchRefused { errno: Errno(1) }) && e.outcome_known(), "{e:?}");
        assert!(refused(&Refusals::default(), &owner, &ops()).is_ok());
    }

    #[test]
    fn a_transaction_without_answers_is_too_large_refused_or_of_unknown_outcome() {
        let io = |errno| NfnlError::Io { what: "sending", source: Arc::new(std::io::Error::from_raw_os_error(errno)) };
        assert!(matches!(transaction_failure(io(libc::EMSGSIZE), 9), TransactionError::TooLarge { ops: 9, .. }));
        let lost = transaction_failure(NfnlError::Overrun, 9);
        assert!(matches!(lost, TransactionError::RefusalsLost { ops: 9 }) && lost.outcome_known());
        let unknown = transaction_failure(io(libc::EBADF), 9);
        assert!(matches!(unknown, TransactionError::Unknown { .. }) && !unknown.outcome_known(), "{unknown:?}");
        let overdue = transaction_failure(NfnlError::Overdue(std::time::Duration::from_secs(1)), 9);
        assert!(!overdue.outcome_known());
    }
}
