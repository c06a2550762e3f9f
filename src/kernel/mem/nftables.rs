//! In-memory nf_tables: one network namespace's tables (both families),
//! typed, and the ruleset generation. A transaction is applied all or
//! nothing, with the kernel's errors for what it refuses: ENOENT for a
//! missing table, chain, set or element (or a chain or set a rule or an
//! element names), EBUSY deleting a chain or set still referenced, EEXIST
//! adding a set, base chain or element over one defined otherwise, EINVAL
//! for an element that does not fit its set. Every rule is compiled by the
//! codec first, as the netlink handle does before it sends: what the codec
//! refuses, nothing is applied. Committed ops are recorded in the journal
//! (`nft ip add chain X`); faults injected through it refuse the op they
//! match (EIO), lost replies commit and answer with an unknown outcome.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use super::Journal;
use crate::kernel::netlink::{Errno, NfnlError};
use crate::kernel::nftables::{codec, Listed, NfTables, TableInfo, TransactionError};
use crate::msgs::nftables::{
    expanded, nft_family, BaseChain, ElemValue, Element, Expr, KeyPart, KeyType, NftOp, Rule, SetData, SetSpec,
    Transaction,
};
use crate::mutex::lock;
use crate::net::IpFamily;

/// One table: its chains (with their rules) and sets (with their elements).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemTable {
    pub handle: u64,
    pub comment: Option<String>,
    pub chains: BTreeMap<String, MemChain>,
    pub sets: BTreeMap<String, MemSet>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemChain {
    pub base: Option<BaseChain>,
    pub comment: Option<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemSet {
    pub spec: SetSpec,
    pub elements: BTreeMap<Vec<KeyPart>, Element>,
}

/// Tables by family and name.
pub type MemTables = BTreeMap<(IpFamily, String), MemTable>;

#[derive(Debug, Default)]
struct State {
    generation: u32,
    handles: u64,
    tables: MemTables,
}

/// The in-memory nf_tables of one network namespace. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct MemNftables {
    pub journal: Journal,
    state: Arc<Mutex<State>>,
    /// Listings of a table so far (a full sync reads one first).
    pub listings: Arc<std::sync::atomic::AtomicUsize>,
}

impl MemNftables {
    pub fn new(journal: &Journal) -> MemNftables {
        MemNftables { journal: journal.clone(), ..MemNftables::default() }
    }

    /// Table `table` of `family` as it is now.
    pub fn table(&self, family: IpFamily, table: &str) -> Option<MemTable> {
        lock(&self.state).tables.get(&(family, table.to_string())).cloned()
    }

    /// Somebody else's commit: `change` edits the tables, the generation moves.
    pub fn tamper(&self, change: impl FnOnce(&mut MemTables)) {
        let mut st = lock(&self.state);
        change(&mut st.tables);
        st.generation = st.generation.wrapping_add(1);
    }

    /// Applies `ops` to table `table` of `family` as one transaction.
    pub fn apply(&self, family: IpFamily, table: &str, ops: &[NftOp]) -> Result<(), TransactionError> {
        if ops.is_empty() {
            return Ok(());
        }
        // A source of elements as the ops it stands for: applied and journaled as those.
        let ops = &*expanded(ops);
        codec::requests(family, table, ops, &mut 0)?;
        let lines: Vec<String> = ops.iter().map(|op| format!("nft {} {op}", nft_family(family))).collect();
        let mut st = lock(&self.state);
        let mut tables = st.tables.clone();
        let mut handles = st.handles;
        for (index, (op, line)) in ops.iter().zip(&lines).enumerate() {
            let applied = match self.journal.faulted(line) {
                true => Err(Errno(libc::EIO)),
                false => apply(&mut tables, &mut handles, (family, table.to_string()), op),
            };
            if let Err(errno) = applied {
                self.journal.record(format!("FAILED {line}"));
                return Err(TransactionError::Refused { index, op: op.to_string(), errno });
            }
        }
        st.tables = tables;
        st.handles = handles;
        st.generation = st.generation.wrapping_add(1);
        drop(st);
        let mut lost = false;
        for line in lines {
            lost |= self.journal.reply_lost(&line);
            self.journal.record(line);
        }
        match lost {
            true => Err(TransactionError::Unknown {
                what: "transaction".into(),
                source: NfnlError::Overdue(crate::kernel::netlink::DEFAULT_REPLY_TIMEOUT),
            }),
            false => Ok(()),
        }
    }
}

type Applied = Result<(), Errno>;

fn apply(tables: &mut MemTables, handles: &mut u64, key: (IpFamily, String), op: &NftOp) -> Applied {
    match op {
        NftOp::AddTable { comment } => {
            tables.entry(key).or_insert_with(|| {
                *handles += 1;
                MemTable { handle: *handles, comment: comment.clone(), ..MemTable::default() }
            });
            Ok(())
        }
        NftOp::DeleteTable => tables.remove(&key).map(drop).ok_or(Errno::ENOENT),
        _ => apply_in(tables.get_mut(&key).ok_or(Errno::ENOENT)?, op),
    }
}

/// An op on the objects of table `t`.
fn apply_in(t: &mut MemTable, op: &NftOp) -> Applied {
    match op {
        NftOp::AddTable { .. } | NftOp::DeleteTable => Ok(()),
        NftOp::AddChain { name, base, comment } => match t.chains.get(name) {
            // A hook given must be the chain's (nf_tables_updchain).
            Some(c) if base.is_some() && c.base != *base => Err(Errno(libc::EEXIST)),
            Some(_) => Ok(()),
            None => {
                let chain = MemChain { base: *base, comment: comment.clone(), rules: vec![] };
                t.chains.insert(name.clone(), chain);
                Ok(())
            }
        },
        NftOp::FlushChain(name) => {
            t.chains.get_mut(name).ok_or(Errno::ENOENT)?.rules.clear();
            Ok(())
        }
        NftOp::DeleteChain(name) => {
            let chain = t.chains.remove(name).ok_or(Errno::ENOENT)?;
            if chain_used(t, name) {
                t.chains.insert(name.clone(), chain);
                return Err(Errno(libc::EBUSY));
            }
            Ok(())
        }
        NftOp::AddRule { chain, rule } => {
            let known_sets = rule.sets().all(|s| t.sets.contains_key(s));
            let known_chains = rule.chains().all(|c| t.chains.contains_key(c));
            if !(known_sets && known_chains) {
                return Err(Errno::ENOENT);
            }
            t.chains.get_mut(chain).ok_or(Errno::ENOENT)?.rules.push(rule.clone());
            Ok(())
        }
        NftOp::AddSet(spec) => match t.sets.get(&spec.name) {
            // nft_set_is_same: key, data and flags.
            Some(s) if (&s.spec.key, &s.spec.data, &s.spec.flags) != (&spec.key, &spec.data, &spec.flags) => {
                Err(Errno(libc::EEXIST))
            }
            Some(_) => Ok(()),
            None => {
                t.sets.insert(spec.name.clone(), MemSet { spec: spec.clone(), elements: BTreeMap::new() });
                Ok(())
            }
        },
        NftOp::FlushSet { name, .. } => {
            t.sets.get_mut(name).ok_or(Errno::ENOENT)?.elements.clear();
            Ok(())
        }
        NftOp::DeleteSet { name, .. } => {
            if !t.sets.contains_key(name) {
                return Err(Errno::ENOENT);
            }
            if t.chains.values().flat_map(|c| &c.rules).any(|r| r.sets().any(|s| s == name)) {
                return Err(Errno(libc::EBUSY));
            }
            t.sets.remove(name);
            Ok(())
        }
        NftOp::AddElements { set, elements } => {
            let chains: Vec<String> = t.chains.keys().cloned().collect();
            let s = t.sets.get_mut(set).ok_or(Errno::ENOENT)?;
            for e in elements {
                if !fits(&s.spec, e) {
                    return Err(Errno(libc::EINVAL));
                }
                if e.value.as_ref().and_then(|v| v.chain()).is_some_and(|c| !chains.iter().any(|k| k == c)) {
                    return Err(Errno::ENOENT);
                }
                match s.elements.get(&e.key) {
                    Some(have) if have.value != e.value => return Err(Errno(libc::EEXIST)),
                    Some(_) => {}
                    None => {
                        s.elements.insert(e.key.clone(), e.clone());
                    }
                }
            }
            Ok(())
        }
        NftOp::AddElementsOf(source) => source.expand().iter().try_for_each(|op| apply_in(t, op)),
        NftOp::DeleteElements { set, keys } => {
            let s = t.sets.get_mut(set).ok_or(Errno::ENOENT)?;
            for k in keys {
                s.elements.remove(k).ok_or(Errno::ENOENT)?;
            }
            Ok(())
        }
    }
}

/// Whether a rule or a map element of `t` jumps or goes to `chain`.
fn chain_used(t: &MemTable, chain: &str) -> bool {
    let by_rule = t.chains.values().flat_map(|c| &c.rules).any(|r| r.chains().any(|c| c == chain));
    let by_element = t
        .sets
        .values()
        .flat_map(|s| s.elements.values())
        .any(|e| e.value.as_ref().and_then(|v| v.chain()) == Some(chain));
    by_rule || by_element
}

/// Whether `e` has the key and value `spec` takes.
fn fits(spec: &SetSpec, e: &Element) -> bool {
    let value_ok = match (&spec.data, &e.value) {
        (None, None) | (Some(SetData::Verdict), Some(ElemValue::Verdict(_))) => true,
        (Some(data @ SetData::Fields(_)), Some(ElemValue::Data(parts))) => of_types(&data.types(), parts),
        _ => false,
    };
    value_ok && of_types(&spec.key, &e.key)
}

/// Whether `parts` are values of `types`, one each.
fn of_types(types: &[KeyType], parts: &[KeyPart]) -> bool {
    types.len() == parts.len()
        && types.iter().zip(parts).all(|(t, p)| match (t, p) {
            (KeyType::Ipv4Addr, KeyPart::Addr(a)) => a.is_ipv4(),
            (KeyType::Ipv6Addr, KeyPart::Addr(a)) => a.is_ipv6(),
            (KeyType::InetProto, KeyPart::Proto(_))
            | (KeyType::InetService, KeyPart::Port(_))
            | (KeyType::Integer, KeyPart::Slot(_)) => true,
            _ => false,
        })
}

/// Anonymous sets a rule brings (counted in the table's use, as the kernel does).
fn anonymous_sets(r: &Rule) -> u32 {
    r.exprs
        .iter()
        .filter(|e| match e {
            Expr::NumgenVmap(_) => true,
            Expr::InAnon { set, .. } => set.items.len() > 1,
            _ => false,
        })
        .count() as u32
}

impl NfTables for MemNftables {
    fn transact(
        &self,
        table: &str,
        tx: Arc<Transaction>,
    ) -> impl Future<Output = Result<(), TransactionError>> + 'static {
        std::future::ready(self.apply(tx.family, table, &tx.ops))
    }

    fn list(&self, family: IpFamily, table: &str) -> impl Future<Output = Result<Listed, TransactionError>> + 'static {
        self.listings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let listed = self
            .table(family, table)
            .map(|t| Listed { chains: t.chains.keys().cloned().collect(), sets: t.sets.keys().cloned().collect() })
            .unwrap_or_default();
        std::future::ready(Ok(listed))
    }

    fn generation(&self) -> impl Future<Output = Result<u32, TransactionError>> + 'static {
        std::future::ready(Ok(lock(&self.state).generation))
    }

    fn table_info(
        &self,
        family: IpFamily,
        table: &str,
    ) -> impl Future<Output = Result<Option<TableInfo>, TransactionError>> + 'static {
        let info = self.table(family, table).map(|t| {
            let anon: u32 = t.chains.values().flat_map(|c| &c.rules).map(anonymous_sets).sum();
            let use_count = (t.chains.len() + t.sets.len()) as u32 + anon;
            TableInfo { handle: t.handle, use_count, flags: 0 }
        });
        std::future::ready(Ok(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::nftables::{
        BaseChain, ChainHook, ChainType, Element, Field, KeyPart, KeyType, NftOp, Rule, SetSpec, Verdict,
    };
    use crate::net::Protocol;

    const T: &str = "kube-proxy";
    const V4: IpFamily = IpFamily::V4;

    fn key(ip: &str) -> Vec<KeyPart> {
        vec![KeyPart::Addr(ip.parse().unwrap()), KeyPart::Proto(Protocol::Tcp), KeyPart::Port(80)]
    }

    fn to(chain: &str, ip: &str) -> NftOp {
        NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(key(ip), Verdict::Goto(chain.into()))],
        }
    }

    fn chain(name: &str) -> NftOp {
        NftOp::AddChain { name: name.into(), base: None, comment: None }
    }

    fn rule(chain: &str, exprs: Vec<Expr>) -> NftOp {
        NftOp::AddRule { chain: chain.into(), rule: Rule::new(exprs) }
    }

    /// A table with a map, a chain an element goes to, a chain a rule jumps to.
    fn table() -> MemNftables {
        let k = MemNftables::default();
        let map = SetSpec::verdict_map(
            "service-ips",
            vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            None,
        );
        let dispatch =
            Expr::Vmap { key: vec![Field::Daddr(V4), Field::L4proto, Field::Dport], map: "service-ips".into() };
        let ops = vec![
            NftOp::add_table(),
            chain("services"),
            chain("service-a"),
            chain("mark"),
            NftOp::AddSet(map),
            rule("services", vec![dispatch]),
            rule("service-a", vec![Expr::Verdict(Verdict::Jump("mark".into()))]),
            to("service-a", "10.96.0.1"),
        ];
        k.apply(V4, T, &ops).expect("the table");
        k
    }

    fn refused(k: &MemNftables, ops: Vec<NftOp>) -> (usize, i32) {
        let before = k.table(V4, T);
        match k.apply(V4, T, &ops) {
            Err(TransactionError::Refused { index, errno, .. }) => {
                assert_eq!(k.table(V4, T), before, "nothing of a refused transaction applied: {ops:?}");
                (index, errno.0)
            }
            other => panic!("{ops:?}: {other:?}"),
        }
    }

    #[test]
    fn a_transaction_applies_all_or_nothing_with_the_kernels_errors() {
        let k = table();
        let t = k.table(V4, T).expect("the table");
        assert_eq!(t.chains.keys().collect::<Vec<_>>(), ["mark", "service-a", "services"]);
        assert_eq!(t.sets["service-ips"].elements.len(), 1);
        // A good op, then a missing chain deleted: neither applies.
        assert_eq!(
            refused(&k, vec![to("service-a", "10.96.0.2"), NftOp::DeleteChain("gone".into())]),
            (1, libc::ENOENT)
        );
        // Still referenced: by a map element, by a rule's jump; a set by a rule.
        assert_eq!(refused(&k, vec![NftOp::DeleteChain("service-a".into())]), (0, libc::EBUSY));
        assert_eq!(refused(&k, vec![NftOp::DeleteChain("mark".into())]), (0, libc::EBUSY));
        assert_eq!(refused(&k, vec![NftOp::DeleteSet { name: "service-ips".into(), map: true }]), (0, libc::EBUSY));
        // Defined otherwise: a set, a base chain's hook, an element's verdict.
        let other = SetSpec::verdict_map("service-ips", vec![KeyType::Ipv4Addr], None);
        assert_eq!(refused(&k, vec![NftOp::AddSet(other)]), (0, libc::EEXIST));
        let base = Some(BaseChain { kind: ChainType::Nat, hook: ChainHook::Output, priority: -100 });
        assert_eq!(
            refused(&k, vec![NftOp::AddChain { name: "services".into(), base, comment: None }]),
            (0, libc::EEXIST)
        );
        assert_eq!(refused(&k, vec![to("mark", "10.96.0.1")]), (0, libc::EEXIST));
        // Missing: what a rule or an element names, an element deleted.
        assert_eq!(refused(&k, vec![to("nowhere", "10.96.0.3")]), (0, libc::ENOENT));
        assert_eq!(
            refused(&k, vec![rule("services", vec![Expr::Verdict(Verdict::Goto("x".into()))])]),
            (0, libc::ENOENT)
        );
        let gone = NftOp::DeleteElements { set: "service-ips".into(), keys: vec![key("10.96.0.9")] };
        assert_eq!(refused(&k, vec![gone]), (0, libc::ENOENT));
        // An element that is not the map's: EINVAL.
        let bad = NftOp::AddElements { set: "service-ips".into(), elements: vec![Element::key(key("10.96.0.4"))] };
        assert_eq!(refused(&k, vec![bad]), (0, libc::EINVAL));
        // Adding what is there as it is, and deleting in order, are fine.
        let gen = futures::executor::block_on(k.generation()).unwrap();
        k.apply(V4, T, &[to("service-a", "10.96.0.1"), chain("services")]).expect("the same again");
        let unhook = vec![
            NftOp::DeleteElements { set: "service-ips".into(), keys: vec![key("10.96.0.1")] },
            NftOp::DeleteChain("service-a".into()),
            NftOp::DeleteChain("mark".into()),
        ];
        k.apply(V4, T, &unhook).expect("nothing refers to them any more");
        assert_eq!(futures::executor::block_on(k.generation()).unwrap(), gen.wrapping_add(2), "a commit each");
        assert_eq!(k.table(V4, T).unwrap().chains.keys().collect::<Vec<_>>(), ["services"]);
    }

    #[test]
    fn what_the_codec_refuses_is_not_applied() {
        let k = table();
        let iif = rule("services", vec![Expr::Iif { name: "cbr0".into(), neq: false }]);
        match k.apply(V4, T, &[chain("new"), iif]) {
            Err(TransactionError::Encode(e)) => {
                assert_eq!(e.why, crate::kernel::nftables::expr::Unencodable::Interface { name: "cbr0".into() })
            }
            other => panic!("{other:?}"),
        }
        assert!(!k.table(V4, T).unwrap().chains.contains_key("new"));
    }

    #[test]
    fn ops_are_recorded_and_faults_refuse_or_lose_them() {
        let k = table();
        k.journal.clear();
        k.journal.fail("add chain broken", 1);
        assert_eq!(refused(&k, vec![chain("ok"), chain("broken")]), (1, libc::EIO));
        assert_eq!(k.journal.lines(), ["FAILED nft ip add chain broken"]);
        k.apply(V4, T, &[chain("ok"), chain("broken")]).expect("the fault is used up");
        assert_eq!(k.journal.lines()[1..], ["nft ip add chain ok", "nft ip add chain broken"]);
        k.journal.lose("add chain late", 1);
        match k.apply(V4, T, &[chain("late")]) {
            Err(e @ TransactionError::Unknown { .. }) => assert!(!e.outcome_known()),
            other => panic!("{other:?}"),
        }
        assert!(k.table(V4, T).unwrap().chains.contains_key("late"), "applied, its answer lost");
    }

    #[test]
    fn the_table_reports_its_handle_and_use_like_the_kernel() {
        let k = table();
        let info = |k: &MemNftables| futures::executor::block_on(k.table_info(V4, T)).unwrap().expect("a table");
        let first = info(&k);
        // 3 chains, 1 map.
        assert_eq!((first.use_count, first.flags), (4, 0));
        let numgen = Expr::NumgenVmap(vec![Verdict::Goto("mark".into())]);
        k.apply(V4, T, &[rule("service-a", vec![numgen])]).unwrap();
        assert_eq!(info(&k).use_count, 5, "a rule's anonymous set counts");
        let gen = futures::executor::block_on(k.generation()).unwrap();
        k.tamper(|tables| {
            tables.remove(&(V4, T.to_string()));
        });
        assert_eq!(futures::executor::block_on(k.generation()).unwrap(), gen.wrapping_add(1));
        assert_eq!(futures::executor::block_on(k.table_info(V4, T)).unwrap(), None);
        k.apply(V4, T, &[NftOp::add_table()]).unwrap();
        assert_ne!(info(&k).handle, first.handle, "a new table, a new handle");
        let listed = futures::executor::block_on(k.list(IpFamily::V6, T)).unwrap();
        assert!(listed.chains.is_empty() && listed.sets.is_empty());
    }
}
