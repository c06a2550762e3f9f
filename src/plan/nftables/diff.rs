//! Desired states → one nf_tables transaction: what the nftables actor
//! sends (as netlink, later) and what `nft -f` takes (as text, here).
//!
//! Upstream's semantics (pkg/proxy/nftables/proxier.go): a full sync adds
//! and flushes every chain and writes every rule, resets (flushes) the sets
//! and maps and adds every element; a partial sync rewrites the chains of
//! changed service ports only (add + flush + rules), adds and deletes map
//! elements one by one (a changed value: delete, then add), flushes chains
//! no longer used and leaves their deletion to a later transaction (with
//! kernels before 6.2 a chain a just-deleted element pointed to cannot be
//! deleted at once), and deletes affinity sets no longer used at once.
//!
//! Within a transaction, objects are added before anything names them:
//! sets, then chains (add + flush), then rules, then element deletes and
//! adds, then set deletes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use super::names::{is_affinity_set, is_service_chain, NODEPORT_IPS};
use super::ruleset::{addr_type, Chain, Element, Objects, Rule, Ruleset, Set, Writer};
use crate::net::IpFamily;

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NftOp {
    /// `add table` (with its comment).
    AddTable,
    /// `add chain` (the chain's hook and comment; its rules are separate ops).
    AddChain(Chain),
    FlushChain(String),
    DeleteChain(String),
    AddRule {
        chain: String,
        rule: Rule,
    },
    /// `add set` / `add map`.
    AddSet(Set),
    /// `flush set` / `flush map`: every element goes.
    FlushSet {
        name: String,
        map: bool,
    },
    DeleteSet {
        name: String,
        map: bool,
    },
    AddElement(Element),
    /// `delete element` by key (`172.30.0.41 . tcp . 80`).
    DeleteElement {
        set: String,
        key: String,
    },
}

/// The ops of one transaction, for one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub family: IpFamily,
    pub ops: Vec<NftOp>,
}

impl Transaction {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of operations (upstream's `NumOperations`).
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

impl fmt::Display for Transaction {
    /// `nft -f` input, one op a line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = Writer { family: self.family };
        for op in &self.ops {
            let line = match op {
                NftOp::AddTable => w.table(),
                NftOp::AddChain(c) => w.chain(c),
                NftOp::FlushChain(name) => w.verb("flush", "chain", name),
                NftOp::DeleteChain(name) => w.verb("delete", "chain", name),
                NftOp::AddRule { chain, rule } => w.rule(chain, rule),
                NftOp::AddSet(s) => w.set(s),
                NftOp::FlushSet { name, map } => w.verb("flush", if *map { "map" } else { "set" }, name),
                NftOp::DeleteSet { name, map } => w.verb("delete", if *map { "map" } else { "set" }, name),
                NftOp::AddElement(e) => w.element(e),
                NftOp::DeleteElement { set, key } => w.delete_element(set, key),
            };
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// A transaction and the chains it flushed because nothing uses them any
/// more: delete them with [`delete_stale`] in a later transaction (upstream:
/// at least 1 s later), unless a later sync uses them again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub tx: Transaction,
    pub stale_chains: Vec<String>,
}

/// What the kernel's table holds, by name (listed at start-up or on a full
/// resync; empty for a kernel without the table).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct KernelObjects {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
}

/// The ops of a transaction in their groups, joined in a valid order.
#[derive(Default)]
struct Ops {
    sets: Vec<NftOp>,
    chains: Vec<NftOp>,
    stale: Vec<NftOp>,
    rules: Vec<NftOp>,
    element_deletes: Vec<NftOp>,
    element_adds: Vec<NftOp>,
    set_deletes: Vec<NftOp>,
}

impl Ops {
    /// Add + flush `c`, and its rules.
    fn rewrite(&mut self, c: &Chain) {
        let header = Chain { rules: vec![], ..c.clone() };
        self.chains.push(NftOp::AddChain(header));
        self.chains.push(NftOp::FlushChain(c.name.clone()));
        self.rules.extend(c.rules.iter().map(|r| NftOp::AddRule { chain: c.name.clone(), rule: r.clone() }));
    }

    fn into_tx(self, family: IpFamily, head: Vec<NftOp>) -> Transaction {
        let ops = head
            .into_iter()
            .chain(self.sets)
            .chain(self.chains)
            .chain(self.stale)
            .chain(self.rules)
            .chain(self.element_deletes)
            .chain(self.element_adds)
            .chain(self.set_deletes)
            .collect();
        Transaction { family, ops }
    }
}

/// A full sync of `new` over a kernel holding `kernel` (upstream's sync with
/// needFullSync): the table, every set and map (reset), every chain
/// (add + flush) and rule, every element; per-service chains in the kernel
/// that `new` does not use are flushed (stale), affinity sets it does not
/// use deleted. `recreate_base` adds and deletes the base chains first, so
/// a changed hook or priority takes (upstream does so once per process).
pub fn full_sync(new: &Ruleset, kernel: &KernelObjects, recreate_base: bool) -> Delta {
    let mut head = vec![NftOp::AddTable];
    if recreate_base {
        for c in new.top.chains.iter().filter(|c| c.hook.is_some()) {
            head.push(NftOp::AddChain(Chain::regular(c.name.clone(), vec![])));
            head.push(NftOp::DeleteChain(c.name.clone()));
        }
    }
    let mut ops = Ops::default();
    for s in new.sets() {
        ops.sets.push(NftOp::AddSet(s.clone()));
    }
    for s in &new.top.sets {
        ops.sets.push(NftOp::FlushSet { name: s.name.clone(), map: s.map });
    }
    new.chains().for_each(|c| ops.rewrite(c));
    let active: BTreeSet<&str> = new.chains().map(|c| c.name.as_str()).collect();
    let stale: Vec<String> =
        kernel.chains.iter().filter(|c| is_service_chain(c) && !active.contains(c.as_str())).cloned().collect();
    ops.stale.extend(stale.iter().cloned().map(NftOp::FlushChain));
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    ops.element_adds.extend(new.elements().filter(|e| seen.insert(e.id())).cloned().map(NftOp::AddElement));
    if !new.top.sets.iter().any(|s| s.name == NODEPORT_IPS) {
        // Upstream's add + delete: gone whether or not it was there.
        let def = Set {
            name: NODEPORT_IPS.into(),
            map: false,
            key_type: addr_type(new.family).into(),
            flags: vec![],
            timeout: None,
            comment: Some("IPs that accept NodePort traffic".into()),
        };
        ops.set_deletes.push(NftOp::AddSet(def));
        ops.set_deletes.push(NftOp::DeleteSet { name: NODEPORT_IPS.into(), map: false });
    }
    let sets: BTreeSet<&str> = new.sets().map(|s| s.name.as_str()).collect();
    for s in kernel.sets.iter().filter(|s| is_affinity_set(s) && !sets.contains(s.as_str())) {
        ops.set_deletes.push(NftOp::DeleteSet { name: s.clone(), map: false });
    }
    Delta { tx: ops.into_tx(new.family, head), stale_chains: stale }
}

/// At least this many ops (a chain's rules are not split) in each
/// transaction that writes a full sync's per-service chains ([`staged`]):
/// the kernel's cost per anonymous set grows with its transaction's length.
pub const STAGE_OPS: usize = 8192;

/// Into how many transactions at most [`staged`] cuts the per-service
/// chains: each transaction that adds jumps makes the kernel validate the
/// table it can reach (proportional to the table, for a resync over it), so
/// larger syncs take larger transactions rather than more of them.
pub const STAGES: usize = 32;

/// A full sync's transaction as the nftables actor sends it: the
/// per-service chains first (declared, then their rules, each chain flushed
/// and rewritten in one transaction, endpoint chains before the service,
/// external and firewall chains that jump to them), in transactions of
/// about `max(chunk, ops / STAGES)` ops, and last one transaction with the
/// rest: base and top-level chains, sets and maps (reset), elements, stale
/// chains flushed. A new chain is unused until the last transaction adds
/// the elements naming it; a chain the kernel holds changes in one step,
/// as a partial sync changes it; the maps switch at once in the last
/// transaction, as upstream's single one does. A transaction that fails
/// stops the sync: the next full sync finds what was written and writes
/// over it, or flushes it as stale.
///
/// Why: within one transaction the kernel's cost per anonymous set (each
/// `numgen ... vmap` rule brings one) grows with the transaction's length
/// (it walks the transaction to bind the set), so a full sync in one
/// transaction is quadratic: 271 s at 10,000 services, for us and for
/// `nft -f`. Bounded transactions make it close to linear.
pub fn staged(tx: Transaction, existing_chains: &BTreeSet<String>, chunk: usize) -> Vec<Transaction> {
    let base: BTreeSet<String> = tx
        .ops
        .iter()
        .filter_map(|op| match op {
            NftOp::AddChain(c) if c.hook.is_some() => Some(c.name.clone()),
            _ => None,
        })
        .collect();
    let mut declare = vec![NftOp::AddTable];
    // Each per-service chain's ops (flush if the kernel holds it, then its rules).
    let mut order: Vec<String> = Vec::new();
    let mut per_chain: HashMap<String, Vec<NftOp>> = HashMap::new();
    let mut rest = Vec::with_capacity(tx.ops.len());
    for op in tx.ops {
        match &op {
            NftOp::AddSet(_) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::AddChain(c) if is_service_chain(&c.name) => {
                if !per_chain.contains_key(&c.name) {
                    per_chain.insert(c.name.clone(), Vec::new());
                    order.push(c.name.clone());
                }
                if !existing_chains.contains(&c.name) {
                    declare.push(op);
                }
            }
            // Top-level regular chains (mark-for-masquerade, ...) that the rules jump to.
            NftOp::AddChain(c) if !base.contains(&c.name) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::FlushChain(name) if per_chain.contains_key(name) => {
                if existing_chains.contains(name) {
                    per_chain.entry(name.clone()).or_default().push(op);
                }
            }
            NftOp::AddRule { chain, .. } if per_chain.contains_key(chain) => {
                per_chain.entry(chain.clone()).or_default().push(op);
            }
            _ => rest.push(op),
        }
    }
    let mut chains: Vec<(String, Vec<NftOp>)> = order
        .into_iter()
        .map(|name| {
            let ops = per_chain.remove(&name).unwrap_or_default();
            (name, ops)
        })
        .collect();
    let family = tx.family;
    let staged_ops: usize = chains.iter().map(|(_, ops)| ops.len()).sum();
    if staged_ops == 0 {
        return vec![Transaction { family, ops: rest }];
    }
    // Leaves first: what a chain jumps to has its rules before it does.
    chains.sort_by_key(|(name, _)| chain_rank(name));
    let size = chunk.max(staged_ops / STAGES).max(1);
    let mut out = vec![Transaction { family, ops: declare }];
    let mut current: Vec<NftOp> = Vec::new();
    for (_, ops) in chains {
        if current.len() >= size {
            out.push(Transaction { family, ops: std::mem::take(&mut current) });
        }
        current.extend(ops);
    }
    if !current.is_empty() {
        out.push(Transaction { family, ops: current });
    }
    out.push(Transaction { family, ops: rest });
    out
}

/// The order [`staged`] writes per-service chains in: endpoint chains
/// (they jump only to top-level chains), then service chains (to endpoint
/// chains), external chains (to service and endpoint chains), firewall
/// chains (to external and service chains).
fn chain_rank(name: &str) -> u8 {
    use super::names::{ENDPOINT_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, SERVICE_PREFIX};
    [ENDPOINT_PREFIX, SERVICE_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX]
        .iter()
        .position(|p| name.starts_with(p))
        .map_or(4, |i| i as u8)
}

/// How many groups of a ruleset hold each element (by `(set, key)`): a
/// ClusterIP is in `cluster-ips` once per port of its service, and stays
/// there until the last of them goes.
pub type ElementRefs = HashMap<(String, String), usize>;

/// The [`ElementRefs`] of `rs`.
pub fn element_refs(rs: &Ruleset) -> ElementRefs {
    let mut refs = ElementRefs::new();
    for e in rs.elements() {
        *refs.entry(e.id()).or_default() += 1;
    }
    refs
}

/// A partial sync from `old` (what the kernel holds) to `new`: only groups
/// (the top-level objects, each service port) that differ are written.
/// Compares every group; a caller that knows what changed uses
/// [`groups_sync`] with those groups only.
pub fn partial_sync(old: &Ruleset, new: &Ruleset) -> Delta {
    let empty = Objects::default();
    let mut pairs: Vec<(&Objects, &Objects)> = vec![];
    if old.top != new.top {
        pairs.push((&old.top, &new.top));
    }
    let names: BTreeSet<_> = old.services.keys().chain(new.services.keys()).collect();
    for spn in names {
        let (o, n) = (old.services.get(spn).unwrap_or(&empty), new.services.get(spn).unwrap_or(&empty));
        if o != n {
            pairs.push((o, n));
        }
    }
    groups_sync(new.family, pairs, &element_refs(old))
}

/// The transaction taking each group from its old to its new objects (an
/// absent group is empty): the new chains rewritten (add + flush + rules),
/// chains no longer used flushed (stale), sets added or deleted, elements
/// deleted and added one by one. `refs` counts the groups holding each
/// element in the kernel's state: an element another group still holds is
/// not deleted, one already there is not added. Work follows the groups given.
pub fn groups_sync<'a>(
    family: IpFamily,
    pairs: impl IntoIterator<Item = (&'a Objects, &'a Objects)>,
    refs: &ElementRefs,
) -> Delta {
    let mut ops = Ops::default();
    let mut old_elems: BTreeMap<(String, String), (usize, &Element)> = BTreeMap::new();
    let mut new_elems: BTreeMap<(String, String), (usize, &Element)> = BTreeMap::new();
    let mut old_chains: BTreeSet<&str> = BTreeSet::new();
    let mut new_chains: BTreeSet<&str> = BTreeSet::new();
    for (o, n) in pairs {
        n.chains.iter().for_each(|c| ops.rewrite(c));
        old_chains.extend(o.chains.iter().map(|c| c.name.as_str()));
        new_chains.extend(n.chains.iter().map(|c| c.name.as_str()));
        for s in n.sets.iter().filter(|s| !o.sets.contains(s)) {
            ops.sets.push(NftOp::AddSet(s.clone()));
        }
        for s in o.sets.iter().filter(|s| !n.sets.iter().any(|x| x.name == s.name)) {
            ops.set_deletes.push(NftOp::DeleteSet { name: s.name.clone(), map: s.map });
        }
        for e in &o.elements {
            old_elems.entry(e.id()).or_insert((0, e)).0 += 1;
        }
        for e in &n.elements {
            new_elems.entry(e.id()).or_insert((0, e)).0 += 1;
        }
    }
    let stale: Vec<String> = old_chains.difference(&new_chains).map(|c| c.to_string()).collect();
    ops.stale.extend(stale.iter().cloned().map(NftOp::FlushChain));
    let ids: BTreeSet<&(String, String)> = old_elems.keys().chain(new_elems.keys()).collect();
    for id in ids {
        let before = refs.get(id).copied().unwrap_or(0);
        let (old, new) = (old_elems.get(id), new_elems.get(id));
        let after = (before + new.map_or(0, |n| n.0)).saturating_sub(old.map_or(0, |o| o.0));
        let changed = matches!((old, new), (Some(o), Some(n)) if o.1 != n.1);
        if before > 0 && (after == 0 || changed) {
            ops.element_deletes.push(NftOp::DeleteElement { set: id.0.clone(), key: id.1.clone() });
        }
        if let Some((_, e)) = new.filter(|_| before == 0 || changed) {
            ops.element_adds.push(NftOp::AddElement((*e).clone()));
        }
    }
    Delta { tx: ops.into_tx(family, vec![]), stale_chains: stale }
}

/// Deletes chains a sync left stale (flushed); the caller leaves out those a
/// later sync used again.
pub fn delete_stale(family: IpFamily, chains: &[String]) -> Transaction {
    Transaction { family, ops: chains.iter().cloned().map(NftOp::DeleteChain).collect() }
}
