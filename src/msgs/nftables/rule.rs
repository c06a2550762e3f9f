//! A rule as a sequence of typed matches and statements: the forms
//! upstream's nftables proxier writes and no others. `Display` writes a
//! rule as upstream writes it, word for word, so `--dry-run` prints the
//! text upstream's tests expect; the codec compiles the same values to the
//! expressions `nft` sends for that text.

use std::fmt;
use std::net::SocketAddr;

use super::values::{concat, nft_family, quote, Hex, Joined, KeyPart, KeyType, Verdict};
use crate::net::{IpFamily, Protocol};

/// What a match, a lookup or an update reads from the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// `ip saddr` / `ip6 saddr`.
    Saddr(IpFamily),
    /// `ip daddr` / `ip6 daddr`.
    Daddr(IpFamily),
    /// `meta l4proto`.
    L4proto,
    /// `th dport`: the transport header's destination port.
    Dport,
    /// `numgen random mod M offset O`: a number in `O..O+M` at random (of
    /// modulus 1, the constant `O`: nft has no constant in a concatenation).
    Numgen { modulus: u32, offset: u32 },
}

impl Field {
    /// The constant `n` as a field of a concatenation (`numgen random mod 1 offset n`).
    pub fn constant(n: u32) -> Field {
        Field::Numgen { modulus: 1, offset: n }
    }
}

impl Field {
    /// The set key type the field's values have.
    pub fn key_type(self) -> KeyType {
        match self {
            Field::Saddr(f) | Field::Daddr(f) => KeyType::addr(f),
            Field::L4proto => KeyType::InetProto,
            Field::Dport => KeyType::InetService,
            Field::Numgen { .. } => KeyType::Integer,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Saddr(family) => write!(f, "{} saddr", nft_family(*family)),
            Field::Daddr(family) => write!(f, "{} daddr", nft_family(*family)),
            Field::L4proto => f.write_str("meta l4proto"),
            Field::Dport => f.write_str("th dport"),
            Field::Numgen { modulus, offset: 0 } => write!(f, "numgen random mod {modulus}"),
            Field::Numgen { modulus, offset } => write!(f, "numgen random mod {modulus} offset {offset}"),
        }
    }
}

/// How an anonymous set's items are separated in the text (upstream joins
/// the ServiceCIDRs with `,` and source ranges with ` , `).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListSep {
    Comma,
    SpacedComma,
}

/// An anonymous set of addresses and CIDRs (an interval set; of one item,
/// `nft` compiles a plain compare).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnonSet {
    pub items: Vec<KeyPart>,
    pub sep: ListSep,
}

impl fmt::Display for AnonSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = match self.sep {
            ListSep::Comma => ",",
            ListSep::SpacedComma => " , ",
        };
        write!(f, "{{ {} }}", Joined(&self.items, sep))
    }
}

/// A connection tracking status bit (`ct status dnat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtStatus {
    /// The connection's destination was translated.
    Dnat,
}

/// A connection tracking state (`ct state new`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CtState {
    New,
}

/// Which address `fib ... type local` looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FibKey {
    Saddr,
    Daddr,
}

/// How `mark set mark <op> bits` changes the mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MarkOp {
    Or,
    Xor,
}

/// One match or statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expr {
    /// `ip daddr 10.96.0.1`, `ip saddr != 10.0.0.0/8`, `meta l4proto tcp`.
    Cmp {
        field: Field,
        neq: bool,
        value: KeyPart,
    },
    /// `ip daddr { 10.96.0.0/12,10.200.0.0/16 }`, `ip saddr != { 203.0.113.0/25 }`.
    InAnon {
        field: Field,
        neq: bool,
        set: AnonSet,
    },
    /// `tcp dport 80`: the transport protocol, and its destination port.
    ProtoDport {
        proto: Protocol,
        port: u16,
    },
    /// `ip daddr @cluster-ips`: the key is in the named set.
    Lookup {
        key: Vec<Field>,
        set: String,
    },
    /// `ip daddr . meta l4proto . th dport vmap @service-ips`.
    Vmap {
        key: Vec<Field>,
        map: String,
    },
    /// `numgen random mod N vmap { 0 : goto a , 1 : goto b }`: one of the
    /// verdicts at random.
    NumgenVmap(Vec<Verdict>),
    /// `ct state new`.
    CtState(CtState),
    /// `ct status dnat`.
    CtStatus(CtStatus),
    /// `fib daddr type local`: the address is one of the node's.
    FibLocal(FibKey),
    /// `mark and 0x4000 == 0`.
    MarkTest {
        mask: Hex,
        value: u32,
    },
    /// `iif cbr0`, `iif != veth*`: upstream's interface local-traffic
    /// detectors (the codec does not compile them: `nft` resolves an
    /// interface name to its index when it reads the rule).
    Iif {
        name: String,
        neq: bool,
    },
    /// `update @affinity-... { ip saddr }`: the key added to the set, or its
    /// timeout refreshed.
    Update {
        set: String,
        key: Vec<Field>,
    },
    /// `mark set mark or 0x4000`.
    MarkSet {
        op: MarkOp,
        bits: Hex,
    },
    /// `dnat to 10.180.0.1:80` (`[fd00::1]:80`).
    Dnat(SocketAddr),
    /// `dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @m`:
    /// the address and port the map holds for the key (no translation, and
    /// the rule ends there, when it holds none).
    DnatMap {
        family: IpFamily,
        key: Vec<Field>,
        map: String,
    },
    /// `masquerade fully-random`.
    Masquerade {
        fully_random: bool,
    },
    /// `reject`: ICMP port unreachable.
    Reject,
    Verdict(Verdict),
}

fn not(neq: bool) -> &'static str {
    if neq {
        "!= "
    } else {
        ""
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Cmp { field, neq, value } => write!(f, "{field} {}{value}", not(*neq)),
            Expr::InAnon { field, neq, set } => write!(f, "{field} {}{set}", not(*neq)),
            Expr::ProtoDport { proto, port } => write!(f, "{} dport {port}", proto.lower()),
            Expr::Lookup { key, set } => write!(f, "{} @{set}", concat(key)),
            Expr::Vmap { key, map } => write!(f, "{} vmap @{map}", concat(key)),
            Expr::NumgenVmap(verdicts) => {
                write!(f, "numgen random mod {} vmap {{ ", verdicts.len())?;
                for (i, v) in verdicts.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" , ")?;
                    }
                    write!(f, "{i} : {v}")?;
                }
                f.write_str(" }")
            }
            Expr::CtState(CtState::New) => f.write_str("ct state new"),
            Expr::CtStatus(CtStatus::Dnat) => f.write_str("ct status dnat"),
            Expr::FibLocal(FibKey::Saddr) => f.write_str("fib saddr type local"),
            Expr::FibLocal(FibKey::Daddr) => f.write_str("fib daddr type local"),
            Expr::MarkTest { mask, value } => write!(f, "mark and {mask} == {value}"),
            Expr::Iif { name, neq } => write!(f, "iif {}{name}", not(*neq)),
            Expr::Update { set, key } => write!(f, "update @{set} {{ {} }}", concat(key)),
            Expr::MarkSet { op: MarkOp::Or, bits } => write!(f, "mark set mark or {bits}"),
            Expr::MarkSet { op: MarkOp::Xor, bits } => write!(f, "mark set mark xor {bits}"),
            Expr::Dnat(to) => write!(f, "dnat to {to}"),
            Expr::DnatMap { family, key, map } => {
                write!(f, "dnat {} to {} map @{map}", nft_family(*family), concat(key))
            }
            Expr::Masquerade { fully_random: true } => f.write_str("masquerade fully-random"),
            Expr::Masquerade { fully_random: false } => f.write_str("masquerade"),
            Expr::Reject => f.write_str("reject"),
            Expr::Verdict(v) => write!(f, "{v}"),
        }
    }
}

/// A rule: its matches and statements in order, and a comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rule {
    pub exprs: Vec<Expr>,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(exprs: Vec<Expr>) -> Rule {
        Rule { exprs, comment: None }
    }

    pub fn commented(exprs: Vec<Expr>, comment: &str) -> Rule {
        Rule { exprs, comment: Some(comment.to_string()) }
    }

    /// The chains the rule jumps or goes to.
    pub fn chains(&self) -> impl Iterator<Item = &str> {
        self.exprs.iter().flat_map(|e| {
            let verdicts: &[Verdict] = match e {
                Expr::Verdict(v) => std::slice::from_ref(v),
                Expr::NumgenVmap(vs) => vs,
                _ => &[],
            };
            verdicts.iter().filter_map(Verdict::chain)
        })
    }

    /// The named sets and maps the rule reads or updates.
    pub fn sets(&self) -> impl Iterator<Item = &str> {
        self.exprs.iter().filter_map(|e| match e {
            Expr::Lookup { set, .. } | Expr::Update { set, .. } => Some(set.as_str()),
            Expr::DnatMap { map, .. } => Some(map.as_str()),
            Expr::Vmap { map, .. } => Some(map.as_str()),
            _ => None,
        })
    }
}

impl fmt::Display for Rule {
    /// Upstream's text: the expressions joined by spaces, then `comment "..."`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Joined(&self.exprs, " "))?;
        if let Some(c) = &self.comment {
            write!(f, " comment {}", quote(c))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> KeyPart {
        KeyPart::Addr(s.parse().unwrap())
    }

    fn net(s: &str) -> KeyPart {
        KeyPart::Net(s.parse().unwrap())
    }

    #[test]
    fn rules_are_written_as_upstream_writes_them() {
        let v4 = IpFamily::V4;
        let dispatch = vec![Field::Daddr(v4), Field::L4proto, Field::Dport];
        let cases = [
            (
                Rule::new(vec![Expr::Vmap { key: dispatch, map: "service-ips".into() }]),
                "ip daddr . meta l4proto . th dport vmap @service-ips",
            ),
            (
                Rule::commented(
                    vec![Expr::Lookup { key: vec![Field::Daddr(v4)], set: "cluster-ips".into() }, Expr::Reject],
                    "Reject traffic to invalid ports of ClusterIPs",
                ),
                "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
            ),
            (
                Rule::new(vec![
                    Expr::InAnon {
                        field: Field::Daddr(v4),
                        neq: false,
                        set: AnonSet { items: vec![net("10.96.0.0/12"), net("10.200.0.0/16")], sep: ListSep::Comma },
                    },
                    Expr::Verdict(Verdict::Drop),
                ]),
                "ip daddr { 10.96.0.0/12,10.200.0.0/16 } drop",
            ),
            (
                Rule::new(vec![
                    Expr::InAnon {
                        field: Field::Saddr(IpFamily::V6),
                        neq: true,
                        set: AnonSet { items: vec![net("fd00::/64"), ip("fd00:1::1")], sep: ListSep::SpacedComma },
                    },
                    Expr::Verdict(Verdict::Drop),
                ]),
                "ip6 saddr != { fd00::/64 , fd00:1::1 } drop",
            ),
            (
                Rule::new(vec![Expr::NumgenVmap(vec![Verdict::Goto("a".into()), Verdict::Goto("b".into())])]),
                "numgen random mod 2 vmap { 0 : goto a , 1 : goto b }",
            ),
            (
                Rule::new(vec![
                    Expr::Cmp { field: Field::Daddr(v4), neq: false, value: ip("172.30.0.41") },
                    Expr::ProtoDport { proto: Protocol::Tcp, port: 80 },
                    Expr::Verdict(Verdict::Jump("mark-for-masquerade".into())),
                ]),
                "ip daddr 172.30.0.41 tcp dport 80 jump mark-for-masquerade",
            ),
            (
                Rule::new(vec![
                    Expr::MarkTest { mask: Hex { value: 0x4000, width: 8 }, value: 0 },
                    Expr::Verdict(Verdict::Return),
                ]),
                "mark and 0x004000 == 0 return",
            ),
            (
                Rule::new(vec![
                    Expr::Cmp { field: Field::L4proto, neq: false, value: KeyPart::Proto(Protocol::Sctp) },
                    Expr::Dnat("[fd00::1]:80".parse().unwrap()),
                ]),
                "meta l4proto sctp dnat to [fd00::1]:80",
            ),
            (
                Rule::new(vec![Expr::Update { set: "affinity-X".into(), key: vec![Field::Saddr(v4)] }]),
                "update @affinity-X { ip saddr }",
            ),
            (
                Rule::new(vec![
                    Expr::FibLocal(FibKey::Daddr),
                    Expr::Cmp { field: Field::Daddr(IpFamily::V6), neq: true, value: ip("::1") },
                    Expr::Iif { name: "veth*".into(), neq: true },
                ]),
                "fib daddr type local ip6 daddr != ::1 iif != veth*",
            ),
        ];
        for (rule, text) in cases {
            assert_eq!(rule.to_string(), text);
        }
    }

    #[test]
    fn data_map_dnat_numgen_slots_and_ct_status_are_written_as_nft_reads_them() {
        let v4 = IpFamily::V4;
        let service = || vec![Field::Daddr(v4), Field::L4proto, Field::Dport];
        let pick = Expr::DnatMap {
            family: v4,
            key: [service(), vec![Field::Numgen { modulus: 3, offset: 0 }]].concat(),
            map: "m".into(),
        };
        assert_eq!(
            Rule::new(vec![pick]).to_string(),
            "dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @m"
        );
        let update = Expr::Update { set: "a".into(), key: [service(), vec![Field::Saddr(v4)]].concat() };
        let slot = Expr::DnatMap { family: v4, key: [service(), vec![Field::constant(2)]].concat(), map: "m".into() };
        assert_eq!(
            Rule::new(vec![update, slot]).to_string(),
            "update @a { ip daddr . meta l4proto . th dport . ip saddr } \
             dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 1 offset 2 map @m"
        );
        let hairpin = Rule::new(vec![
            Expr::CtStatus(CtStatus::Dnat),
            Expr::Lookup { key: vec![Field::Saddr(IpFamily::V6), Field::Daddr(IpFamily::V6)], set: "h".into() },
        ]);
        assert_eq!(hairpin.to_string(), "ct status dnat ip6 saddr . ip6 daddr @h");
        assert_eq!(hairpin.sets().collect::<Vec<_>>(), ["h"]);
    }

    #[test]
    fn a_rule_names_the_chains_and_sets_it_uses() {
        let r = Rule::new(vec![
            Expr::Lookup { key: vec![Field::Saddr(IpFamily::V4)], set: "affinity-A".into() },
            Expr::NumgenVmap(vec![Verdict::Goto("a".into()), Verdict::Goto("b".into())]),
            Expr::Verdict(Verdict::Jump("c".into())),
        ]);
        assert_eq!(r.chains().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(r.sets().collect::<Vec<_>>(), ["affinity-A"]);
    }
}
