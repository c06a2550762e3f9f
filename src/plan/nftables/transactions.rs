//! Desired states → one nf_tables transaction: what the nftables actor
//! sends and what `nft -f` takes (printed).
//!
//! Upstream's semantics (pkg/proxy/nftables/proxier.go): a full sync adds
//! and flushes every chain and writes every rule, resets (flushes) the sets
//! and maps and adds every element; a partial sync rewrites the chains of
//! changed service ports only (add + flush + rules), adds and deletes map
//! elements one by one (a changed value: delete, then add), flushes unused
//! chains and leaves their deletion to a later transaction (with kernels
//! before 6.2 a chain a just-deleted element pointed to cannot be deleted
//! at once), and deletes unused affinity sets at once.
//!
//! Within a transaction, objects are added before anything names them:
//! sets, then chains (add + flush), then rules, then element deletes and
//! adds, then set deletes.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use super::base::nodeport_ips_set;
use super::maps_names::{is_maps_map, is_maps_object};
use super::names::{is_affinity_set, is_service_chain, NODEPORT_IPS, SERVICE_IPS, SERVICE_NODEPORTS};
use super::ruleset::{Chain, Objects, Ruleset, SetElement};
use crate::msgs::nftables::{push, Element, ElementSource, Elements, KeyPart, NftOp, SetFlag, SetSpec, Transaction};
use crate::net::IpFamily;

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
        self.chains.push(c.add_op());
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

/// Chains a full sync flushes (and deletes later) when the desired table
/// has not got them: per-service chains, and the `maps` ruleset's chains
/// (after a switch to upstream's, or classes the cluster does not use).
fn owned_chain(name: &str) -> bool {
    is_service_chain(name) || is_maps_object(name)
}

/// Sets and maps a full sync deletes when the desired table has not got
/// them: affinity sets, the `maps` ruleset's sets, and the dispatch maps
/// only upstream's ruleset uses.
fn owned_set(name: &str) -> bool {
    is_affinity_set(name) || is_maps_object(name) || name == SERVICE_IPS || name == SERVICE_NODEPORTS
}

/// A full sync of `new` over a kernel holding `kernel` (upstream's sync with
/// needFullSync): the table, every set and map (reset, but for dynamic sets
/// the packet path fills), every chain (add + flush) and rule, every
/// element; per-service chains and the other ruleset's chains in the kernel
/// that `new` does not use are flushed (stale), affinity sets and the other
/// ruleset's sets it does not use deleted. `recreate_base` adds and deletes
/// the base chains first, so a changed hook or priority takes (upstream
/// does so once per process).
pub fn full_sync(new: &Ruleset, kernel: &KernelObjects, recreate_base: bool) -> Delta {
    full_sync_with(new, kernel, recreate_base, |_| true, |adds| first_elements(new, |e| push(adds, e.add_op())))
}

/// [`full_sync`] writing only the chains `write` takes (added, flushed,
/// their rules); everything else as [`full_sync`] (the staged sync's last
/// transaction: [`super::staging`]), but for the elements: one
/// [`NftOp::AddElementsOf`] op lists them from `new` when the transaction
/// is encoded, where [`full_sync`] copies each into its ops. The kernel
/// gets the same messages from both.
pub fn full_sync_of(
    new: &Arc<Ruleset>,
    kernel: &KernelObjects,
    recreate_base: bool,
    write: impl Fn(&Chain) -> bool,
) -> Delta {
    full_sync_with(new, kernel, recreate_base, write, |adds| {
        let elements = RulesetElements::new(new.clone());
        if elements.count > 0 {
            adds.push(NftOp::AddElementsOf(Elements(Arc::new(elements))));
        }
    })
}

/// A full sync, its element adds written by `elements`.
fn full_sync_with(
    new: &Ruleset,
    kernel: &KernelObjects,
    recreate_base: bool,
    write: impl Fn(&Chain) -> bool,
    elements: impl FnOnce(&mut Vec<NftOp>),
) -> Delta {
    let mut head = vec![NftOp::add_table()];
    if recreate_base {
        for c in new.top.chains.iter().filter(|c| c.base.is_some()) {
            head.push(Chain::regular(c.name.clone(), vec![]).add_op());
            head.push(NftOp::DeleteChain(c.name.clone()));
        }
    }
    let mut ops = Ops::default();
    for s in new.sets() {
        ops.sets.push(NftOp::AddSet(s.clone()));
    }
    let dynamic = |s: &SetSpec| s.flags.contains(&SetFlag::Dynamic);
    for s in new.top.sets.iter().chain(&new.shared.sets).filter(|s| !dynamic(s)) {
        ops.sets.push(NftOp::FlushSet { name: s.name.clone(), map: s.is_map() });
    }
    new.chains().filter(|c| write(c)).for_each(|c| ops.rewrite(c));
    let stale = stale_chains(new, kernel);
    ops.stale.extend(stale.iter().cloned().map(NftOp::FlushChain));
    elements(&mut ops.element_adds);
    if nodeport_ips_missing(new) {
        // Upstream's add + delete: gone whether or not it was there.
        ops.set_deletes.push(NftOp::AddSet(nodeport_ips_set(new.family)));
        ops.set_deletes.push(NftOp::DeleteSet { name: NODEPORT_IPS.into(), map: false });
    }
    let sets: BTreeSet<&str> = new.sets().map(|s| s.name.as_str()).collect();
    for s in kernel.sets.iter().filter(|s| owned_set(s) && !sets.contains(s.as_str())) {
        let map = s == SERVICE_IPS || s == SERVICE_NODEPORTS || is_maps_map(s);
        ops.set_deletes.push(NftOp::DeleteSet { name: s.clone(), map });
    }
    Delta { tx: ops.into_tx(new.family, head), stale_chains: stale }
}

/// Whether `new` has no `nodeport-ips` set: a full sync deletes the
/// kernel's (adding it first, so the delete cannot fail).
pub fn nodeport_ips_missing(new: &Ruleset) -> bool {
    !new.top.sets.iter().any(|s| s.name == NODEPORT_IPS)
}

/// The chains of `kernel` a full sync of `new` flushes (and deletes
/// later): per-service chains and the other ruleset's chains `new` has not got.
pub fn stale_chains(new: &Ruleset, kernel: &KernelObjects) -> Vec<String> {
    let active: BTreeSet<&str> = new.chains().map(|c| c.name.as_str()).collect();
    kernel.chains.iter().filter(|c| owned_chain(c) && !active.contains(c.as_str())).cloned().collect()
}

/// An element by `(set, key)`, borrowed: what identifies it in the kernel.
#[derive(Debug, Clone, Copy)]
struct ById<'a>(&'a SetElement);

impl PartialEq for ById<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.0.set == other.0.set && self.0.element.key == other.0.element.key
    }
}

impl Eq for ById<'_> {}

impl Hash for ById<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (self.0.set.as_str(), self.0.element.key.as_slice()).hash(state)
    }
}

/// Calls `f` with each element of `rs` the first time its `(set, key)`
/// comes, in the ruleset's order (an element several groups hold is
/// written once).
fn first_elements<'a>(rs: &'a Ruleset, mut f: impl FnMut(&'a SetElement)) {
    let mut seen: HashSet<ById<'a>> = HashSet::with_capacity(rs.elements().count());
    for e in rs.elements() {
        if seen.insert(ById(e)) {
            f(e);
        }
    }
}

/// The elements a full sync of a ruleset adds ([`first_elements`]), listed
/// from the ruleset when its last transaction is encoded.
#[derive(Debug)]
struct RulesetElements {
    rs: Arc<Ruleset>,
    count: usize,
    runs: usize,
}

impl RulesetElements {
    fn new(rs: Arc<Ruleset>) -> RulesetElements {
        let mut elements = RulesetElements { rs, count: 0, runs: 0 };
        let (mut count, mut runs) = (0, 0);
        elements.runs(&mut |_, run| {
            count += run.len();
            runs += 1;
        });
        (elements.count, elements.runs) = (count, runs);
        elements
    }
}

impl ElementSource for RulesetElements {
    fn runs(&self, each: &mut dyn FnMut(&str, &[&Element])) {
        let mut run: Vec<&Element> = Vec::new();
        let mut set = "";
        first_elements(&self.rs, |e| {
            if e.set != set && !run.is_empty() {
                each(set, &run);
                run.clear();
            }
            set = &e.set;
            run.push(&e.element);
        });
        if !run.is_empty() {
            each(set, &run);
        }
    }

    fn count(&self) -> usize {
        self.count
    }

    fn runs_count(&self) -> usize {
        self.runs
    }
}

/// An element's `(set, key)` as [`ElementRefs`] knows it: two 64-bit
/// SipHash digests under keys drawn at random for each [`ElementRefs`].
type ElementId = [u64; 2];

/// How many groups of a ruleset hold each element (by `(set, key)`): a
/// ClusterIP is in `cluster-ips` once per port of its service, and stays
/// there until the last of them goes. An element is known by a 128-bit
/// digest of its set and key, not a copy of them (24 bytes an element,
/// where a copy costs the set's name and the key besides): two elements
/// are confused only if their digests under secret random keys agree in
/// all 128 bits.
#[derive(Debug, Default, Clone)]
pub struct ElementRefs {
    keys: (RandomState, RandomState),
    counts: HashMap<ElementId, u32>,
}

impl ElementRefs {
    pub fn new() -> ElementRefs {
        ElementRefs::default()
    }

    fn id(&self, set: &str, key: &[KeyPart]) -> ElementId {
        [self.keys.0.hash_one((set, key)), self.keys.1.hash_one((set, key))]
    }

    /// How many groups hold element `key` of `set`.
    pub fn get(&self, set: &str, key: &[KeyPart]) -> usize {
        self.counts.get(&self.id(set, key)).map_or(0, |&n| n as usize)
    }

    /// `objects`' elements are held once more.
    pub fn add(&mut self, objects: &Objects) {
        for e in &objects.elements {
            *self.counts.entry(self.id(&e.set, &e.element.key)).or_default() += 1;
        }
    }

    /// `objects`' elements are held once less (gone at none).
    pub fn remove(&mut self, objects: &Objects) {
        for e in &objects.elements {
            let id = self.id(&e.set, &e.element.key);
            if let Some(n) = self.counts.get_mut(&id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.counts.remove(&id);
                }
            }
        }
    }

    /// How many elements are held.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    pub fn clear(&mut self) {
        self.counts = HashMap::new();
    }
}

/// The [`ElementRefs`] of `rs`.
pub fn element_refs(rs: &Ruleset) -> ElementRefs {
    let mut refs = ElementRefs { counts: HashMap::with_capacity(rs.elements().count()), ..ElementRefs::default() };
    rs.groups().for_each(|g| refs.add(g));
    refs.counts.shrink_to_fit();
    refs
}

/// A partial sync from `old` (what the kernel holds, its service ports
/// possibly held: [`Objects::hold`]) to `new`: only groups (the top-level
/// objects, each service port) that differ are written.
/// Compares every group; a caller that knows what changed uses
/// [`groups_sync`] with those groups only.
pub fn partial_sync(old: &Ruleset, new: &Ruleset) -> Delta {
    let empty = Objects::default();
    let mut pairs: Vec<(&Objects, &Objects)> = vec![];
    if old.top != new.top {
        pairs.push((&old.top, &new.top));
    }
    let shared = changed_parts(&old.shared, &new.shared);
    if shared.0 != shared.1 {
        pairs.push((&shared.0, &shared.1));
    }
    let names: BTreeSet<_> = old.services.keys().chain(new.services.keys()).collect();
    for spn in names {
        let (o, n) = (old.services.get(spn).unwrap_or(&empty), new.services.get(spn).unwrap_or(&empty));
        if !o.same_as(n) {
            pairs.push((o, n));
        }
    }
    groups_sync(new.family, pairs, &element_refs(old))
}

/// The parts of a group that differ, as a pair for [`groups_sync`]: `old`'s
/// chains, sets and elements that `new` has not as they are, and `new`'s
/// that `old` has not. A chain that changed is in both (rewritten); one
/// equal in both is in neither, so it is not written again (the shared
/// objects of the `maps` ruleset: a rule that reads an endpoints map costs
/// the kernel a walk of the map each time it is added).
pub fn changed_parts(old: &Objects, new: &Objects) -> (Objects, Objects) {
    let only = |a: &Objects, b: &Objects| Objects {
        chains: a.chains.iter().filter(|c| !b.chains.contains(c)).cloned().collect(),
        sets: a.sets.iter().filter(|s| !b.sets.contains(s)).cloned().collect(),
        elements: a.elements.iter().filter(|e| !b.elements.contains(e)).cloned().collect(),
        classes: vec![],
        held: None,
    };
    (only(old, new), only(new, old))
}

/// The transaction taking each group from its old to its new objects (an
/// absent group is empty): the new chains rewritten (add + flush + rules),
/// unused chains flushed (stale), sets added or deleted, elements
/// deleted and added one by one. `refs` counts the groups holding each
/// element in the kernel's state: an element another group still holds is
/// not deleted, one already there is not added. Work follows the groups given.
pub fn groups_sync<'a>(
    family: IpFamily,
    pairs: impl IntoIterator<Item = (&'a Objects, &'a Objects)>,
    refs: &ElementRefs,
) -> Delta {
    let mut ops = Ops::default();
    let mut old_elems: BTreeMap<(&str, &[KeyPart]), (usize, &SetElement)> = BTreeMap::new();
    let mut new_elems: BTreeMap<(&str, &[KeyPart]), (usize, &SetElement)> = BTreeMap::new();
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
            ops.set_deletes.push(NftOp::DeleteSet { name: s.name.clone(), map: s.is_map() });
        }
        for e in &o.elements {
            old_elems.entry((&e.set, &e.element.key)).or_insert((0, e)).0 += 1;
        }
        for e in &n.elements {
            new_elems.entry((&e.set, &e.element.key)).or_insert((0, e)).0 += 1;
        }
    }
    let stale: Vec<String> = old_chains.difference(&new_chains).map(|c| c.to_string()).collect();
    ops.stale.extend(stale.iter().cloned().map(NftOp::FlushChain));
    let ids: BTreeSet<&(&str, &[KeyPart])> = old_elems.keys().chain(new_elems.keys()).collect();
    for id in ids {
        let before = refs.get(id.0, id.1);
        let (old, new) = (old_elems.get(id), new_elems.get(id));
        let after = (before + new.map_or(0, |n| n.0)).saturating_sub(old.map_or(0, |o| o.0));
        let changed = matches!((old, new), (Some(o), Some(n)) if o.1 != n.1);
        if before > 0 && (after == 0 || changed) {
            push(&mut ops.element_deletes, NftOp::DeleteElements { set: id.0.to_string(), keys: vec![id.1.to_vec()] });
        }
        if let Some((_, e)) = new.filter(|_| before == 0 || changed) {
            push(&mut ops.element_adds, e.add_op());
        }
    }
    Delta { tx: ops.into_tx(family, vec![]), stale_chains: stale }
}

/// Deletes chains a sync left stale (flushed); the caller leaves out those a
/// later sync used again.
pub fn delete_stale(family: IpFamily, chains: &[String]) -> Transaction {
    Transaction { family, ops: chains.iter().cloned().map(NftOp::DeleteChain).collect() }
}
