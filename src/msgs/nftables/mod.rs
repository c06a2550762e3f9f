//! nftables mode's messages: the ops of nf_tables transactions on one
//! family's `kube-proxy` table, typed from the planner to the codec
//! (chains, rules as typed expressions, sets and maps with typed keys,
//! elements). Text is an output only: a [`Transaction`] prints as `nft -f`
//! input (knftables' syntax, what `--dry-run` shows and upstream's tests
//! compare), an [`NftOp`] names itself briefly for errors and logs.

mod objects;
mod rule;
mod values;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

pub use objects::{BaseChain, ChainHook, ChainType, ElemValue, Element, SetData, SetFlag, SetSpec};
pub use rule::{AnonSet, CtState, CtStatus, Expr, FibKey, Field, ListSep, MarkOp, Rule};
pub use values::{concat, nft_family, quote, Hex, Joined, KeyPart, KeyType, Verdict};

use crate::net::IpFamily;

/// The table, one per family (`ip kube-proxy`, `ip6 kube-proxy`).
pub const TABLE: &str = "kube-proxy";
/// The table's comment.
pub const TABLE_COMMENT: &str = "rules for kube-proxy";

/// One op of a transaction on the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NftOp {
    /// `add table` (an existing table is kept).
    AddTable {
        comment: Option<String>,
    },
    DeleteTable,
    /// `add chain` (an existing chain is kept; its rules are separate ops).
    AddChain {
        name: String,
        base: Option<BaseChain>,
        comment: Option<String>,
    },
    /// `flush chain`: its rules go, the chain stays.
    FlushChain(String),
    DeleteChain(String),
    /// `add rule CHAIN RULE` (appended).
    AddRule {
        chain: String,
        rule: Rule,
    },
    /// `add set` / `add map`.
    AddSet(SetSpec),
    /// `flush set` / `flush map`: every element goes, the set stays.
    FlushSet {
        name: String,
        map: bool,
    },
    DeleteSet {
        name: String,
        map: bool,
    },
    /// `add element`: one op for consecutive elements of one set ([`push`]).
    AddElements {
        set: String,
        elements: Vec<Element>,
    },
    /// `delete element` by key, likewise.
    DeleteElements {
        set: String,
        keys: Vec<Vec<KeyPart>>,
    },
    /// `add element` of every run an [`ElementSource`] lists, one
    /// [`NftOp::AddElements`] op each, written from the source when the
    /// transaction is encoded or printed: no copy of the elements is made.
    AddElementsOf(Elements),
}

/// Elements listed by the value holding them (a full sync's planned
/// ruleset), for [`NftOp::AddElementsOf`].
pub trait ElementSource: fmt::Debug + Send + Sync {
    /// Each run of elements of one set, in order: what consecutive
    /// [`NftOp::AddElements`] ops joined by [`push`] would hold.
    fn runs(&self, each: &mut dyn FnMut(&str, &[&Element]));

    /// How many elements [`ElementSource::runs`] lists.
    fn count(&self) -> usize;

    /// How many runs [`ElementSource::runs`] lists.
    fn runs_count(&self) -> usize;
}

/// A shared [`ElementSource`]. Compared, ordered and hashed by the ops it
/// stands for ([`Elements::ops`]).
#[derive(Debug, Clone)]
pub struct Elements(pub Arc<dyn ElementSource>);

impl Elements {
    /// The [`NftOp::AddElements`] ops these elements stand for (copies).
    pub fn expand(&self) -> Vec<NftOp> {
        let mut ops = Vec::new();
        self.0.runs(&mut |set, elements| {
            ops.push(NftOp::AddElements {
                set: set.to_string(),
                elements: elements.iter().map(|&e| e.clone()).collect(),
            })
        });
        ops
    }
}

impl PartialEq for Elements {
    fn eq(&self, other: &Elements) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.expand() == other.expand()
    }
}

impl Eq for Elements {}

impl PartialOrd for Elements {
    fn partial_cmp(&self, other: &Elements) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Elements {
    fn cmp(&self, other: &Elements) -> std::cmp::Ordering {
        self.expand().cmp(&other.expand())
    }
}

impl std::hash::Hash for Elements {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.expand().hash(state)
    }
}

/// `ops` with each [`NftOp::AddElementsOf`] replaced by the ops it stands
/// for (borrowed when there is none).
pub fn expanded(ops: &[NftOp]) -> Cow<'_, [NftOp]> {
    if !ops.iter().any(|op| matches!(op, NftOp::AddElementsOf(_))) {
        return Cow::Borrowed(ops);
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops {
        match op {
            NftOp::AddElementsOf(source) => out.extend(source.expand()),
            op => out.push(op.clone()),
        }
    }
    Cow::Owned(out)
}

impl NftOp {
    /// `add table` with the table's comment.
    pub fn add_table() -> NftOp {
        NftOp::AddTable { comment: Some(TABLE_COMMENT.to_string()) }
    }

    /// How many operations upstream counts for this op (knftables'
    /// `NumOperations`: one per element).
    pub fn operations(&self) -> usize {
        match self {
            NftOp::AddElements { elements, .. } => elements.len(),
            NftOp::DeleteElements { keys, .. } => keys.len(),
            NftOp::AddElementsOf(source) => source.0.count(),
            _ => 1,
        }
    }

    /// How many ops this one stands for: an [`NftOp::AddElementsOf`] as
    /// many as its runs, any other one.
    pub fn ops(&self) -> usize {
        match self {
            NftOp::AddElementsOf(source) => source.0.runs_count(),
            _ => 1,
        }
    }
}

/// Appends `op` to `ops`, element adds (deletes) of the set the last op
/// adds to (deletes from) joining that op: one netlink message for a run
/// of elements.
pub fn push(ops: &mut Vec<NftOp>, op: NftOp) {
    match (ops.last_mut(), op) {
        (Some(NftOp::AddElements { set, elements }), NftOp::AddElements { set: s, elements: more }) if *set == s => {
            elements.extend(more)
        }
        (Some(NftOp::DeleteElements { set, keys }), NftOp::DeleteElements { set: s, keys: more }) if *set == s => {
            keys.extend(more)
        }
        (_, op) => ops.push(op),
    }
}

/// An element op's first key and how many more, for brief names.
fn first_of(n: usize, first: Option<String>) -> String {
    let more = if n > 1 { format!(", ... ({n} elements)") } else { String::new() };
    format!("{{ {}{more} }}", first.unwrap_or_default())
}

impl fmt::Display for NftOp {
    /// The op, briefly (a large element op by its first element).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftOp::AddTable { .. } => f.write_str("add table"),
            NftOp::DeleteTable => f.write_str("delete table"),
            NftOp::AddChain { name, .. } => write!(f, "add chain {name}"),
            NftOp::FlushChain(name) => write!(f, "flush chain {name}"),
            NftOp::DeleteChain(name) => write!(f, "delete chain {name}"),
            NftOp::AddRule { chain, rule } => write!(f, "add rule {chain} {rule}"),
            NftOp::AddSet(s) => write!(f, "add {} {}", s.kind(), s.name),
            NftOp::FlushSet { name, map } => write!(f, "flush {} {name}", kind(*map)),
            NftOp::DeleteSet { name, map } => write!(f, "delete {} {name}", kind(*map)),
            NftOp::AddElements { set, elements } => {
                write!(f, "add element {set} {}", first_of(elements.len(), elements.first().map(|e| e.to_string())))
            }
            NftOp::DeleteElements { set, keys } => {
                let first = keys.first().map(|k| concat(k).to_string());
                write!(f, "delete element {set} {}", first_of(keys.len(), first))
            }
            NftOp::AddElementsOf(source) => {
                let (mut first, mut runs) = (None, 0);
                source.0.runs(&mut |set, elements| {
                    runs += 1;
                    if first.is_none() {
                        first = elements.first().map(|e| format!("{set} {{ {e}, ... }}"));
                    }
                });
                let n = source.0.count();
                write!(f, "add {n} elements in {runs} runs, the first {}", first.unwrap_or_default())
            }
        }
    }
}

fn kind(map: bool) -> &'static str {
    if map {
        "map"
    } else {
        "set"
    }
}

/// The ops of one transaction on one family's table: the kernel applies
/// them all or none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Transaction {
    pub family: IpFamily,
    pub ops: Vec<NftOp>,
}

impl Transaction {
    pub fn new(family: IpFamily) -> Transaction {
        Transaction { family, ops: Vec::new() }
    }

    /// Appends `op` ([`push`]).
    pub fn push(&mut self, op: NftOp) {
        push(&mut self.ops, op);
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The same transaction with each [`NftOp::AddElementsOf`] replaced by
    /// the ops it stands for ([`expanded`]).
    pub fn expanded(self) -> Transaction {
        let ops = match expanded(&self.ops) {
            Cow::Owned(ops) => ops,
            Cow::Borrowed(_) => self.ops,
        };
        Transaction { family: self.family, ops }
    }

    /// How many ops it holds, each [`NftOp::AddElementsOf`] counted as the
    /// ops it stands for ([`NftOp::ops`]).
    pub fn op_count(&self) -> usize {
        self.ops.iter().map(NftOp::ops).sum()
    }

    /// Number of operations (upstream's `NumOperations`: one per element).
    pub fn len(&self) -> usize {
        self.ops.iter().map(NftOp::operations).sum()
    }
}

impl fmt::Display for Transaction {
    /// `nft -f` input, one operation a line, as knftables writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = nft_family(self.family);
        let head = |verb: &str, kind: &str| format!("{verb} {kind} {family} {TABLE}");
        for op in &self.ops {
            match op {
                NftOp::AddTable { comment: Some(c) } => {
                    writeln!(f, "{} {{ comment {} ; }}", head("add", "table"), quote(c))?
                }
                NftOp::AddTable { comment: None } => writeln!(f, "{}", head("add", "table"))?,
                NftOp::DeleteTable => writeln!(f, "{}", head("delete", "table"))?,
                NftOp::AddChain { name, base, comment } => {
                    write!(f, "{} {name}", head("add", "chain"))?;
                    if base.is_some() || comment.is_some() {
                        f.write_str(" {")?;
                        if let Some(b) = base {
                            write!(f, " {b} ;")?;
                        }
                        if let Some(c) = comment {
                            write!(f, " comment {} ;", quote(c))?;
                        }
                        f.write_str(" }")?;
                    }
                    writeln!(f)?;
                }
                NftOp::FlushChain(name) => writeln!(f, "{} {name}", head("flush", "chain"))?,
                NftOp::DeleteChain(name) => writeln!(f, "{} {name}", head("delete", "chain"))?,
                NftOp::AddRule { chain, rule } => writeln!(f, "{} {chain} {rule}", head("add", "rule"))?,
                NftOp::AddSet(s) => writeln!(f, "{} {} {s}", head("add", s.kind()), s.name)?,
                NftOp::FlushSet { name, map } => writeln!(f, "{} {name}", head("flush", kind(*map)))?,
                NftOp::DeleteSet { name, map } => writeln!(f, "{} {name}", head("delete", kind(*map)))?,
                NftOp::AddElements { set, elements } => write_adds(f, &head("add", "element"), set, elements)?,
                NftOp::AddElementsOf(source) => {
                    let head = head("add", "element");
                    let mut written = Ok(());
                    source.0.runs(&mut |set, elements| {
                        if written.is_ok() {
                            written = write_adds(f, &head, set, elements.iter().copied());
                        }
                    });
                    written?
                }
                NftOp::DeleteElements { set, keys } => {
                    let head = head("delete", "element");
                    for k in keys {
                        writeln!(f, "{head} {set} {{ {} }}", concat(k))?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `add element` lines, one per element of `set`.
fn write_adds<'a>(
    f: &mut fmt::Formatter<'_>,
    head: &str,
    set: &str,
    elements: impl IntoIterator<Item = &'a Element>,
) -> fmt::Result {
    elements.into_iter().try_for_each(|e| writeln!(f, "{head} {set} {{ {e} }}"))
}

/// The data map of the codec's and the text's tests: `map eps { typeof ip
/// daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th
/// dport ; }` in `family`.
#[cfg(test)]
pub(crate) fn example_endpoints_map(family: IpFamily) -> SetSpec {
    SetSpec::data_map(
        "eps",
        vec![Field::Daddr(family), Field::L4proto, Field::Dport, Field::constant(0)],
        vec![Field::Daddr(family), Field::Dport],
    )
}

/// An element of [`example_endpoints_map`]: `service . tcp . 80 . 1 :
/// endpoint . 8080`.
#[cfg(test)]
pub(crate) fn example_endpoint(service: &str, endpoint: &str) -> Element {
    let addr = |a: &str| KeyPart::Addr(a.parse().expect("a test address"));
    Element::data(
        vec![addr(service), KeyPart::Proto(crate::net::Protocol::Tcp), KeyPart::Port(80), KeyPart::Slot(1)],
        vec![addr(endpoint), KeyPart::Port(8080)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::Protocol;

    fn key(ip: &str, port: u16) -> Vec<KeyPart> {
        vec![KeyPart::Addr(ip.parse().unwrap()), KeyPart::Proto(Protocol::Tcp), KeyPart::Port(port)]
    }

    #[test]
    fn consecutive_element_ops_of_one_set_are_one_op_and_count_per_element() {
        let mut tx = Transaction::new(IpFamily::V4);
        let add = |set: &str, k| NftOp::AddElements { set: set.into(), elements: vec![Element::key(k)] };
        tx.push(add("a", key("10.0.0.1", 80)));
        tx.push(add("a", key("10.0.0.2", 80)));
        tx.push(add("b", key("10.0.0.3", 80)));
        tx.push(NftOp::DeleteElements { set: "b".into(), keys: vec![key("10.0.0.4", 80)] });
        tx.push(NftOp::DeleteElements { set: "b".into(), keys: vec![key("10.0.0.5", 80)] });
        assert_eq!(tx.ops.len(), 3);
        assert_eq!(tx.len(), 5);
        assert_eq!(
            tx.to_string(),
            "add element ip kube-proxy a { 10.0.0.1 . tcp . 80 }\n\
             add element ip kube-proxy a { 10.0.0.2 . tcp . 80 }\n\
             add element ip kube-proxy b { 10.0.0.3 . tcp . 80 }\n\
             delete element ip kube-proxy b { 10.0.0.4 . tcp . 80 }\n\
             delete element ip kube-proxy b { 10.0.0.5 . tcp . 80 }\n"
        );
        assert_eq!(tx.ops[0].to_string(), "add element a { 10.0.0.1 . tcp . 80, ... (2 elements) }");
    }

    #[test]
    fn objects_are_written_as_knftables_writes_them() {
        let ops = vec![
            NftOp::AddTable { comment: Some(TABLE_COMMENT.into()) },
            NftOp::AddChain {
                name: "nat-prerouting".into(),
                base: Some(BaseChain { kind: ChainType::Nat, hook: ChainHook::Prerouting, priority: -100 }),
                comment: None,
            },
            NftOp::AddChain { name: "reject-chain".into(), base: None, comment: Some("helper".into()) },
            NftOp::AddSet(SetSpec {
                flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
                timeout: Some(10800),
                ..SetSpec::set("affinity-X", vec![KeyType::Ipv6Addr], None)
            }),
            NftOp::AddSet(SetSpec::verdict_map(
                "service-nodeports",
                vec![KeyType::InetProto, KeyType::InetService],
                Some("NodePort traffic"),
            )),
            NftOp::AddElements {
                set: "no-endpoint-services".into(),
                elements: vec![Element {
                    key: key("fd00::10", 80),
                    value: Some(ElemValue::Verdict(Verdict::Goto("reject-chain".into()))),
                    comment: Some("ns/svc:p80".into()),
                }],
            },
            NftOp::FlushSet { name: "service-ips".into(), map: true },
            NftOp::DeleteSet { name: "nodeport-ips".into(), map: false },
            NftOp::AddSet(example_endpoints_map(IpFamily::V6)),
            NftOp::AddElements { set: "eps".into(), elements: vec![example_endpoint("fd00::10", "fd00::1:2")] },
            NftOp::AddSet(SetSpec { size: Some(1024), ..SetSpec::set("s", vec![KeyType::Ipv6Addr], None) }),
        ];
        assert_eq!(
            Transaction { family: IpFamily::V6, ops }.to_string(),
            "add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\n\
             add chain ip6 kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n\
             add chain ip6 kube-proxy reject-chain { comment \"helper\" ; }\n\
             add set ip6 kube-proxy affinity-X { type ipv6_addr ; flags dynamic,timeout ; timeout 10800s ; }\n\
             add map ip6 kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }\n\
             add element ip6 kube-proxy no-endpoint-services { fd00::10 . tcp . 80 comment \"ns/svc:p80\" : goto reject-chain }\n\
             flush map ip6 kube-proxy service-ips\n\
             delete set ip6 kube-proxy nodeport-ips\n\
             add map ip6 kube-proxy eps { typeof ip6 daddr . meta l4proto . th dport . numgen random mod 1 : ip6 daddr . th dport ; }\n\
             add element ip6 kube-proxy eps { fd00::10 . tcp . 80 . 1 : fd00::1:2 . 8080 }\n\
             add set ip6 kube-proxy s { type ipv6_addr ; size 1024 ; }\n"
        );
    }
}
