//! nftables mode's kernel actor: owns one family's nf_tables socket
//! ([`NetlinkNftables`]) and upstream's `kube-proxy` table of that family.
//!
//! Receives [`ApplyTransaction`] (one nf_tables transaction: all or
//! nothing), [`ListTable`] (the table's chains and sets, read before a
//! full sync) and [`CheckDrift`] (the periodic sync's cheap check: has
//! anybody changed the table since our last transaction?); answers each
//! with the kernel's result. Messages never
//! interleave (`AtomicResponse`). The planner's ops are turned into the
//! codec's by [`translate`] (pure), in this layer, so `kernel` knows
//! nothing of `plan`.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;

use crate::kernel::nftables::{
    self as k, BaseChain, ChainHook, KeyPart, KeyType, Listed, NetlinkNftables, TableInfo, TransactionError, Verdict,
};
use crate::net::IpFamily;
use crate::plan::nftables::names::{TABLE, TABLE_COMMENT};
use crate::plan::nftables::ruleset::{quote, Hook};
use crate::plan::nftables::{Element, NftOp, Set, Transaction};
use crate::stats::ActorStats;

/// A plan op the codec cannot express (a planner bug; nothing is sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot translate nftables op {op:?}: {why}")]
pub struct TranslateError {
    /// The op, as `nft -f` would read it.
    pub op: String,
    pub why: String,
}

fn bad(op: &NftOp, family: IpFamily, why: impl Into<String>) -> TranslateError {
    let tx = Transaction { family, ops: vec![op.clone()] };
    TranslateError { op: tx.to_string().trim_end().to_string(), why: why.into() }
}

/// The codec's ops of `tx`: consecutive element adds (and deletes) of one
/// set become one op, a rule's comment is appended to its text as `nft`
/// writes it.
pub fn translate(tx: &Transaction) -> Result<Vec<k::NftOp>, TranslateError> {
    let mut out: Vec<k::NftOp> = Vec::with_capacity(tx.ops.len());
    for op in &tx.ops {
        let err = |why: String| bad(op, tx.family, why);
        match op {
            NftOp::AddTable => out.push(k::NftOp::AddTable { comment: Some(TABLE_COMMENT.to_string()) }),
            NftOp::AddChain(c) => out.push(k::NftOp::AddChain {
                name: c.name.clone(),
                base: c.hook.as_ref().map(base_chain).transpose().map_err(err)?,
                comment: c.comment.clone(),
            }),
            NftOp::FlushChain(name) => out.push(k::NftOp::FlushChain(name.clone())),
            NftOp::DeleteChain(name) => out.push(k::NftOp::DeleteChain(name.clone())),
            NftOp::AddRule { chain, rule } => {
                let text = match &rule.comment {
                    Some(c) => format!("{} comment {}", rule.text, quote(c)),
                    None => rule.text.clone(),
                };
                out.push(k::NftOp::AddRule { chain: chain.clone(), rule: text });
            }
            NftOp::AddSet(s) => out.push(add_set(s).map_err(err)?),
            NftOp::FlushSet { name, .. } => out.push(k::NftOp::FlushSet(name.clone())),
            NftOp::DeleteSet { name, .. } => out.push(k::NftOp::DeleteSet(name.clone())),
            NftOp::AddElement(e) => {
                let element = element(e).map_err(err)?;
                match out.last_mut() {
                    Some(k::NftOp::AddElements { set, elements }) if *set == e.set => elements.push(element),
                    _ => out.push(k::NftOp::AddElements { set: e.set.clone(), elements: vec![element] }),
                }
            }
            NftOp::DeleteElement { set: name, key } => {
                let fields: Vec<&str> = key.split(" . ").collect();
                let parsed = key_parts(&fields).map_err(err)?;
                match out.last_mut() {
                    Some(k::NftOp::DeleteElements { set, keys }) if set == name => keys.push(parsed),
                    _ => out.push(k::NftOp::DeleteElements { set: name.clone(), keys: vec![parsed] }),
                }
            }
        }
    }
    Ok(out)
}

fn base_chain(h: &Hook) -> Result<BaseChain, String> {
    let hook = match h.hook {
        "prerouting" => ChainHook::Prerouting,
        "input" => ChainHook::Input,
        "forward" => ChainHook::Forward,
        "output" => ChainHook::Output,
        "postrouting" => ChainHook::Postrouting,
        other => return Err(format!("unknown hook {other:?}")),
    };
    match h.kind {
        "filter" | "nat" => Ok(BaseChain { kind: h.kind, hook, priority: h.priority }),
        other => Err(format!("unknown chain type {other:?}")),
    }
}

/// A set or verdict map; the codec knows the affinity sets' flags
/// (`dynamic,timeout`) from their timeout, and no others.
fn add_set(s: &Set) -> Result<k::NftOp, String> {
    let key_text = if s.map {
        s.key_type.strip_suffix(" : verdict").ok_or_else(|| format!("a map of {:?}, not of verdicts", s.key_type))?
    } else {
        s.key_type.as_str()
    };
    let key = KeyType::parse_concat(key_text).ok_or_else(|| format!("unknown key type {key_text:?}"))?;
    let flags_ok = match s.timeout {
        Some(_) => s.flags == ["dynamic", "timeout"],
        None => s.flags.is_empty(),
    };
    if !flags_ok {
        return Err(format!("flags {:?} with timeout {:?}", s.flags, s.timeout));
    }
    Ok(k::NftOp::AddSet {
        name: s.name.clone(),
        key,
        verdict_map: s.map,
        timeout: s.timeout,
        comment: s.comment.clone(),
    })
}

fn key_parts<S: AsRef<str>>(fields: &[S]) -> Result<Vec<KeyPart>, String> {
    fields
        .iter()
        .map(|f| KeyPart::parse(f.as_ref()).ok_or_else(|| format!("unknown key field {:?}", f.as_ref())))
        .collect()
}

fn element(e: &Element) -> Result<k::Element, String> {
    let key = key_parts(&e.key)?;
    let verdict = match e.value.as_slice() {
        [] => None,
        value => {
            let text = value.join(" . ");
            Some(Verdict::parse(&text).ok_or_else(|| format!("unknown verdict {text:?}"))?)
        }
    };
    Ok(k::Element { key, verdict, comment: e.comment.clone() })
}

// ------------------------------------------------------------------ the actor

/// Why a sync's transaction did not apply.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NftSyncError {
    #[error("listing the table before a full sync: {0}")]
    List(#[source] TransactionError),
    #[error("checking the table for drift: {0}")]
    Check(#[source] TransactionError),
    #[error("{0}")]
    Translate(#[source] TranslateError),
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
        ops: Vec<k::NftOp>,
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

/// One transaction on the table (ops translated by [`translate`]).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), TransactionError>")]
pub struct ApplyTransaction {
    pub generation: u64,
    pub ops: Vec<k::NftOp>,
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
    use crate::plan::nftables::ruleset::Rule;
    use crate::plan::nftables::Chain;

    fn tx(ops: Vec<NftOp>) -> Transaction {
        Transaction { family: IpFamily::V4, ops }
    }

    fn elem(set: &str, key: &[&str], value: &[&str]) -> NftOp {
        NftOp::AddElement(Element {
            set: set.into(),
            key: key.iter().map(|s| s.to_string()).collect(),
            value: value.iter().map(|s| s.to_string()).collect(),
            comment: None,
        })
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

    #[test]
    fn consecutive_element_adds_and_deletes_of_one_set_are_one_op() {
        let ops = translate(&tx(vec![
            elem("cluster-ips", &["10.96.0.10"], &[]),
            elem("cluster-ips", &["10.96.0.11"], &[]),
            elem("service-ips", &["10.96.0.10", "tcp", "80"], &["goto service-X-ns/a/tcp/http"]),
            elem("cluster-ips", &["10.96.0.12"], &[]),
            NftOp::DeleteElement { set: "service-ips".into(), key: "10.96.0.10 . tcp . 80".into() },
            NftOp::DeleteElement { set: "service-ips".into(), key: "10.96.0.11 . udp . 53".into() },
        ]))
        .unwrap();
        let a = |s: &str| KeyPart::Addr(s.parse().unwrap());
        assert_eq!(ops.len(), 4, "{ops:?}");
        assert_eq!(
            ops[0],
            k::NftOp::AddElements {
                set: "cluster-ips".into(),
                elements: vec![k::Element::key(vec![a("10.96.0.10")]), k::Element::key(vec![a("10.96.0.11")])],
            }
        );
        assert_eq!(
            ops[1],
            k::NftOp::AddElements {
                set: "service-ips".into(),
                elements: vec![k::Element::to(
                    vec![a("10.96.0.10"), KeyPart::Proto(6), KeyPart::Port(80)],
                    Verdict::Goto("service-X-ns/a/tcp/http".into())
                )],
            }
        );
        assert_eq!(
            ops[3],
            k::NftOp::DeleteElements {
                set: "service-ips".into(),
                keys: vec![
                    vec![a("10.96.0.10"), KeyPart::Proto(6), KeyPart::Port(80)],
                    vec![a("10.96.0.11"), KeyPart::Proto(17), KeyPart::Port(53)],
                ],
            }
        );
    }

    #[test]
    fn rules_carry_their_comment_as_nft_writes_it_and_chains_their_hook() {
        let hook = Hook { kind: "nat", hook: "prerouting", priority: -100 };
        let chain = Chain { name: "nat-prerouting".into(), hook: Some(hook), comment: None, rules: vec![] };
        let ops = translate(&tx(vec![
            NftOp::AddTable,
            NftOp::AddChain(chain),
            NftOp::AddRule { chain: "services".into(), rule: Rule::commented("ip daddr @cluster-ips reject", "x/y") },
        ]))
        .unwrap();
        assert_eq!(ops[0], k::NftOp::AddTable { comment: Some("rules for kube-proxy".into()) });
        let base = BaseChain { kind: "nat", hook: ChainHook::Prerouting, priority: -100 };
        assert_eq!(ops[1], k::NftOp::AddChain { name: "nat-prerouting".into(), base: Some(base), comment: None });
        assert_eq!(
            ops[2],
            k::NftOp::AddRule { chain: "services".into(), rule: "ip daddr @cluster-ips reject comment \"x/y\"".into() }
        );
    }

    #[test]
    fn sets_and_maps_take_their_key_types_and_affinity_timeouts() {
        let set = |map: bool, key_type: &str, flags: Vec<&'static str>, timeout: Option<u32>| {
            NftOp::AddSet(Set { name: "s".into(), map, key_type: key_type.into(), flags, timeout, comment: None })
        };
        let ops = translate(&tx(vec![
            set(true, "ipv4_addr . inet_proto . inet_service : verdict", vec![], None),
            set(false, "ipv4_addr", vec!["dynamic", "timeout"], Some(10800)),
        ]))
        .unwrap();
        assert_eq!(
            ops[0],
            k::NftOp::AddSet {
                name: "s".into(),
                key: vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
                verdict_map: true,
                timeout: None,
                comment: None
            }
        );
        assert!(matches!(&ops[1], k::NftOp::AddSet { timeout: Some(10800), verdict_map: false, .. }));
        // What the codec cannot say is an error naming the op, not a silent change.
        let e = translate(&tx(vec![set(false, "ipv4_addr", vec!["interval"], None)])).unwrap_err();
        assert!(e.op.starts_with("add set ip kube-proxy s"), "{e}");
        let e = translate(&tx(vec![set(true, "ipv4_addr : ipv4_addr", vec![], None)])).unwrap_err();
        assert!(e.why.contains("not of verdicts"), "{e}");
        let e = translate(&tx(vec![elem("s", &["10.0.0.1"], &["dnat to 10.0.0.2"])])).unwrap_err();
        assert!(e.to_string().contains("unknown verdict"), "{e}");
    }
}
