//! A packet tracer over an nf_tables table as the in-memory kernel holds
//! it (typed rules and elements), as upstream's tests trace packets through
//! knftables' fake (helpers_test.go's tracePacket): it runs
//! `filter-prerouting-pre-dnat`, then `nat-prerouting` (a DNAT there
//! changes the destination the later chains see), then `filter-forward`
//! and `filter-input`; every verdict of a `numgen` vmap and every slot a
//! `numgen` picks in a DNAT map is followed, so the output lists all
//! reachable endpoints; a DNATed packet then runs `nat-postrouting` towards
//! each endpoint (the connection's status says DNAT there) and is
//! masqueraded if it reaches `masquerade`; a packet not DNATed is
//! masqueraded when it leaves with a mark set (`mark-for-masquerade`);
//! dynamic (affinity) sets are empty; the connection is new.

use std::net::{IpAddr, SocketAddr};

use super::names;
use crate::kernel::mem::MemTable;
use crate::msgs::nftables::{ElemValue, Expr, FibKey, Field, KeyPart, MarkOp, Rule, Verdict};
use crate::net::Protocol;

/// A connection's first packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    pub src: IpAddr,
    pub proto: Protocol,
    pub dst: IpAddr,
    pub port: u16,
}

/// Where a packet went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Output {
    Dnat(SocketAddr),
    Drop,
    Reject,
}

/// What a rule (or a verdict) did to the packet.
enum Step {
    /// On to the next rule.
    Next,
    /// Back to the calling chain.
    Return,
    /// The packet's fate is decided.
    Terminal,
}

struct Tracer<'a> {
    table: &'a MemTable,
    node_ips: &'a [IpAddr],
    outputs: Vec<Output>,
    mark: u32,
    /// The connection's destination was translated (in `nat-postrouting`).
    dnat: bool,
    /// The packet reached `masquerade`.
    masqueraded: bool,
}

/// Upstream's tracePacket: the destinations (endpoints, `DROP`, `REJECT`)
/// joined by `, `, and whether the packet is masqueraded. `node_ips` are
/// the node's addresses (`fib ... type local`).
pub fn trace(table: &MemTable, node_ips: &[IpAddr], packet: Packet) -> (String, bool) {
    let mut t = Tracer { table, node_ips, outputs: vec![], mark: 0, dnat: false, masqueraded: false };
    let mut p = packet;
    if !t.run(names::FILTER_PREROUTING_PRE_DNAT, &p) {
        t.run(names::NAT_PREROUTING, &p);
        if let Some(Output::Dnat(to)) = t.outputs.first() {
            p.dst = to.ip();
        }
        if !t.run(names::FILTER_FORWARD, &p) {
            t.run(names::FILTER_INPUT, &p);
        }
    }
    let endpoints: Vec<SocketAddr> =
        t.outputs.iter().filter_map(|o| if let Output::Dnat(to) = o { Some(*to) } else { None }).collect();
    let masqueraded = match endpoints.is_empty() {
        true => t.mark != 0,
        false => {
            let (mark, outputs) = (t.mark, std::mem::take(&mut t.outputs));
            t.dnat = true;
            for to in endpoints {
                t.mark = mark;
                t.run(names::NAT_POSTROUTING, &Packet { dst: to.ip(), port: to.port(), ..packet });
            }
            t.outputs = outputs;
            t.masqueraded
        }
    };
    let outputs: Vec<String> = t
        .outputs
        .iter()
        .map(|o| match o {
            Output::Dnat(to) => to.to_string(),
            Output::Drop => "DROP".into(),
            Output::Reject => "REJECT".into(),
        })
        .collect();
    (outputs.join(", "), masqueraded)
}

impl Tracer<'_> {
    /// Runs `chain`; true when the packet reached a terminal verdict.
    fn run(&mut self, chain: &str, p: &Packet) -> bool {
        let c = self.table.chains.get(chain).unwrap_or_else(|| panic!("no chain {chain} in the table"));
        for r in &c.rules {
            match self.rule(r, p) {
                Step::Next => {}
                Step::Return => return false,
                Step::Terminal => return true,
            }
        }
        false
    }

    fn rule(&mut self, r: &Rule, p: &Packet) -> Step {
        for e in &r.exprs {
            match e {
                Expr::Cmp { field, neq, value } => {
                    if matches(value, field, p) == *neq {
                        return Step::Next;
                    }
                }
                Expr::InAnon { field, neq, set } => {
                    if set.items.iter().any(|v| matches(v, field, p)) == *neq {
                        return Step::Next;
                    }
                }
                Expr::ProtoDport { proto, port } => {
                    if (p.proto, p.port) != (*proto, *port) {
                        return Step::Next;
                    }
                }
                Expr::Lookup { key, set } => {
                    if self.elements(set, key, p).is_empty() {
                        return Step::Next;
                    }
                }
                Expr::Vmap { key, map } => {
                    let found = self.elements(map, key, p).first().and_then(|e| e.value.clone());
                    let Some(ElemValue::Verdict(v)) = found else { return Step::Next };
                    return self.verdict(&v, p);
                }
                Expr::DnatMap { key, map, .. } => {
                    let targets: Vec<SocketAddr> =
                        self.elements(map, key, p).iter().filter_map(|e| dnat_target(e.value.as_ref())).collect();
                    if targets.is_empty() {
                        return Step::Next;
                    }
                    self.outputs.extend(targets.into_iter().map(Output::Dnat));
                    return Step::Terminal;
                }
                Expr::NumgenVmap(verdicts) => {
                    for v in verdicts {
                        self.verdict(v, p);
                    }
                    return Step::Terminal;
                }
                Expr::CtState(_) => {}
                Expr::CtStatus(_) => {
                    if !self.dnat {
                        return Step::Next;
                    }
                }
                Expr::FibLocal(key) => {
                    let addr = if *key == FibKey::Saddr { p.src } else { p.dst };
                    if !self.node_ips.contains(&addr) {
                        return Step::Next;
                    }
                }
                Expr::MarkTest { mask, value } => {
                    if self.mark & mask.value != *value {
                        return Step::Next;
                    }
                }
                Expr::Iif { .. } => panic!("the tracer has no interfaces: {r}"),
                Expr::Update { .. } => {}
                Expr::MarkSet { op: MarkOp::Or, bits } => self.mark |= bits.value,
                Expr::MarkSet { op: MarkOp::Xor, bits } => self.mark ^= bits.value,
                Expr::Dnat(to) => {
                    self.outputs.push(Output::Dnat(*to));
                    return Step::Terminal;
                }
                Expr::Masquerade { .. } => {
                    self.masqueraded = true;
                    return Step::Terminal;
                }
                Expr::Reject => {
                    self.outputs.push(Output::Reject);
                    return Step::Terminal;
                }
                Expr::Verdict(v) => return self.verdict(v, p),
            }
        }
        Step::Next
    }

    /// A verdict, of a rule or a map element.
    fn verdict(&mut self, v: &Verdict, p: &Packet) -> Step {
        match v {
            Verdict::Accept => Step::Terminal,
            Verdict::Drop => {
                self.outputs.push(Output::Drop);
                Step::Terminal
            }
            Verdict::Return => Step::Return,
            Verdict::Jump(c) if self.run(c, p) => Step::Terminal,
            Verdict::Jump(_) => Step::Next,
            Verdict::Goto(c) if self.run(c, p) => Step::Terminal,
            Verdict::Goto(_) => Step::Return,
        }
    }

    /// The elements of `set` whose key is the packet's `key` fields: one at
    /// most, or one per value a `numgen` in the key can take.
    fn elements(&self, set: &str, key: &[Field], p: &Packet) -> Vec<&crate::msgs::nftables::Element> {
        let s = self.table.sets.get(set).unwrap_or_else(|| panic!("no set {set} in the table"));
        let mut keys: Vec<Vec<KeyPart>> = vec![vec![]];
        for f in key {
            let values = field_values(f, p);
            keys = keys.into_iter().flat_map(|k| values.iter().map(move |v| [k.clone(), vec![*v]].concat())).collect();
        }
        keys.iter().filter_map(|k| s.elements.get(k)).collect()
    }
}

/// A data map element's address and port.
fn dnat_target(value: Option<&ElemValue>) -> Option<SocketAddr> {
    match value {
        Some(ElemValue::Data(d)) => match d[..] {
            [KeyPart::Addr(ip), KeyPart::Port(port)] => Some(SocketAddr::new(ip, port)),
            _ => None,
        },
        _ => None,
    }
}

/// The packet's values of `f`, as key parts: one, or every number a `numgen` yields.
fn field_values(f: &Field, p: &Packet) -> Vec<KeyPart> {
    match f {
        Field::Numgen { modulus, offset } => (*offset..offset + modulus).map(KeyPart::Slot).collect(),
        f => vec![field(f, p)],
    }
}

/// The packet's value of `f`, as a key part (a `numgen`: its first number).
fn field(f: &Field, p: &Packet) -> KeyPart {
    match f {
        Field::Saddr(_) => KeyPart::Addr(p.src),
        Field::Daddr(_) => KeyPart::Addr(p.dst),
        Field::L4proto => KeyPart::Proto(p.proto),
        Field::Dport => KeyPart::Port(p.port),
        Field::Numgen { offset, .. } => KeyPart::Slot(*offset),
    }
}

/// Whether the packet's `f` is `value` (in it, for a CIDR).
fn matches(value: &KeyPart, f: &Field, p: &Packet) -> bool {
    match (value, field(f, p)) {
        (KeyPart::Net(n), KeyPart::Addr(a)) => n.contains(&a),
        (v, have) => *v == have,
    }
}
