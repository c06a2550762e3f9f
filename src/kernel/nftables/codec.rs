//! The nf_tables ops of one transaction, as `netlink-packet-netfilter`
//! messages. Pure: ops in, messages out.
//!
//! Encodings follow the kernel (include/uapi/linux/netfilter/nf_tables.h)
//! and what `nft` sends, so `nft list` prints what we write:
//! - A set's key is a concatenation of [`KeyType`]s: its type is nft's
//!   datatype ids chained 6 bits apart, its length the fields each padded
//!   to 4 bytes (a 32-bit register), with the fields' own lengths in
//!   `NFTA_SET_DESC_CONCAT`. An element's key is the fields' bytes in
//!   network order, each padded the same way.
//! - Comments go in the object's user data as libnftnl writes them: one
//!   TLV (type, length, the text with its NUL).

use std::fmt;
use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Expressions, Hook, HookNumber, Immediate,
    InetHookNumber, ListAttribute, NfTablesMessage, Register, RuleAttribute, RuleMessage, SetAttribute, SetDescription,
    SetElementAttribute, SetElementList, SetElementMessage, SetFlags, SetMessage, TableAttribute, TableMessage,
    Verdict as NlVerdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use crate::net::IpFamily;

/// nfnetlink's subsystem id of nf_tables (the batch markers' `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// nft's datatype ids (nftables' include/datatype.h) and their bit width in a concatenation.
const TYPE_BITS: u32 = 6;
/// `NFTA_LIST_ELEM` and `NFTA_SET_FIELD_LEN` of `NFTA_SET_DESC_CONCAT`.
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_FIELD_LEN: u16 = 1;
/// libnftnl's user-data types of comments.
const UDATA_TABLE_COMMENT: u8 = 0;
const UDATA_CHAIN_COMMENT: u8 = 0;
const UDATA_RULE_COMMENT: u8 = 0;
const UDATA_SET_COMMENT: u8 = 7;
/// Netfilter's verdicts accept and drop (NF_ACCEPT, NF_DROP).
const NF_ACCEPT: u32 = 1;
const NF_DROP: u32 = 0;

/// One field of a set's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
}

impl KeyType {
    /// nft's datatype id.
    fn id(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 7,
            KeyType::Ipv6Addr => 8,
            KeyType::InetProto => 12,
            KeyType::InetService => 13,
        }
    }

    /// The field's own length in bytes.
    fn len(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 4,
            KeyType::Ipv6Addr => 16,
            KeyType::InetProto => 1,
            KeyType::InetService => 2,
        }
    }
}

/// One field of an element's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyPart {
    Addr(IpAddr),
    /// An IP protocol number (6 TCP, 17 UDP, 132 SCTP).
    Proto(u8),
    Port(u16),
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Addr(a) => write!(f, "{a}"),
            KeyPart::Proto(6) => f.write_str("tcp"),
            KeyPart::Proto(17) => f.write_str("udp"),
            KeyPart::Proto(132) => f.write_str("sctp"),
            KeyPart::Proto(p) => write!(f, "{p}"),
            KeyPart::Port(p) => write!(f, "{p}"),
        }
    }
}

/// A verdict: a rule's, or a verdict map element's data.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// The hook of a base chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainHook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

/// A base chain's type, hook and priority (`type nat hook prerouting priority -100`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BaseChain {
    /// "filter" or "nat".
    pub kind: &'static str,
    pub hook: ChainHook,
    pub priority: i32,
}

/// One op of a transaction on one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NftOp {
    /// `add table` (an existing table is kept).
    AddTable {
        comment: Option<String>,
    },
    DeleteTable,
    /// `add chain` (an existing chain is kept).
    AddChain {
        name: String,
        base: Option<BaseChain>,
        comment: Option<String>,
    },
    /// `flush chain`: its rules go, the chain stays.
    FlushChain(String),
    DeleteChain(String),
    /// `add set` / `add map NAME { type K : verdict }`.
    AddSet {
        name: String,
        key: Vec<KeyType>,
        verdict_map: bool,
        comment: Option<String>,
    },
    DeleteSet(String),
    /// `add element`: keys, with their verdicts in a verdict map.
    AddElements {
        set: String,
        elements: Vec<(Vec<KeyPart>, Option<Verdict>)>,
    },
    /// `delete element`.
    DeleteElements {
        set: String,
        keys: Vec<Vec<KeyPart>>,
    },
    /// `add rule CHAIN VERDICT` (the match expressions come with the planner).
    AddRule {
        chain: String,
        verdict: Verdict,
        comment: Option<String>,
    },
}

impl NftOp {
    /// The netlink flags besides `NLM_F_REQUEST`: every op asks for its ack.
    pub fn flags(&self) -> u16 {
        match self {
            NftOp::AddTable { .. } | NftOp::AddChain { .. } | NftOp::AddSet { .. } | NftOp::AddElements { .. } => {
                NLM_F_CREATE | NLM_F_ACK
            }
            NftOp::AddRule { .. } => NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
            _ => NLM_F_ACK,
        }
    }
}

fn key_text(key: &[KeyPart]) -> String {
    key.iter().map(ToString::to_string).collect::<Vec<_>>().join(" . ")
}

impl fmt::Display for NftOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NftOp::AddTable { .. } => f.write_str("add table"),
            NftOp::DeleteTable => f.write_str("delete table"),
            NftOp::AddChain { name, .. } => write!(f, "add chain {name}"),
            NftOp::FlushChain(name) => write!(f, "flush chain {name}"),
            NftOp::DeleteChain(name) => write!(f, "delete chain {name}"),
            NftOp::AddSet { name, verdict_map, .. } => {
                write!(f, "add {} {name}", if *verdict_map { "map" } else { "set" })
            }
            NftOp::DeleteSet(name) => write!(f, "delete set {name}"),
            NftOp::AddElements { set, elements } => {
                let first = elements.first().map(|(k, v)| match v {
                    Some(v) => format!("{} : {v}", key_text(k)),
                    None => key_text(k),
                });
                write!(f, "add element {set} {{ {}{} }}", first.unwrap_or_default(), more(elements.len()))
            }
            NftOp::DeleteElements { set, keys } => {
                let first = keys.first().map(|k| key_text(k)).unwrap_or_default();
                write!(f, "delete element {set} {{ {first}{} }}", more(keys.len()))
            }
            NftOp::AddRule { chain, verdict, .. } => write!(f, "add rule {chain} {verdict}"),
        }
    }
}

fn more(n: usize) -> String {
    if n > 1 {
        format!(", ... ({n} elements)")
    } else {
        String::new()
    }
}

/// `NFNL_MSG_BATCH_BEGIN` for nf_tables.
pub fn batch_begin() -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
        ControlMessage::BatchBegin,
    )
}

/// `NFNL_MSG_BATCH_END` for nf_tables.
pub fn batch_end() -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, NFNL_SUBSYS_NFTABLES),
        ControlMessage::BatchEnd,
    )
}

/// The message of `op` on table `table` of `family`.
pub fn message(family: IpFamily, table: &str, op: &NftOp) -> NetfilterMessage {
    let proto = match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    };
    let t = || table.to_string();
    let inner = match op {
        NftOp::AddTable { comment } => {
            let mut attributes = vec![TableAttribute::Name(t())];
            if let Some(c) = comment {
                attributes.push(TableAttribute::UserData(comment_udata(UDATA_TABLE_COMMENT, c)));
            }
            NfTablesMessage::NewTable(TableMessage { attributes })
        }
        NftOp::DeleteTable => {
            NfTablesMessage::DeleteTable(TableMessage { attributes: vec![TableAttribute::Name(t())] })
        }
        NftOp::AddChain { name, base, comment } => {
            let mut attributes = vec![ChainAttribute::Table(t()), ChainAttribute::Name(name.clone())];
            if let Some(b) = base {
                attributes.push(ChainAttribute::Hook(vec![
                    Hook::Number(HookNumber::Inet(hook_number(b.hook))),
                    // The kernel reads the priority as a signed 32-bit number.
                    Hook::Priority(b.priority as u32),
                ]));
                attributes.push(ChainAttribute::Type(b.kind.to_string()));
                attributes.push(ChainAttribute::Policy(NF_ACCEPT));
            }
            if let Some(c) = comment {
                attributes.push(ChainAttribute::UserData(comment_udata(UDATA_CHAIN_COMMENT, c)));
            }
            NfTablesMessage::NewChain(ChainMessage { attributes })
        }
        NftOp::FlushChain(name) => NfTablesMessage::DeleteRule(RuleMessage {
            attributes: vec![RuleAttribute::Table(t()), RuleAttribute::Chain(name.clone())],
        }),
        NftOp::DeleteChain(name) => NfTablesMessage::DeleteChain(ChainMessage {
            attributes: vec![ChainAttribute::Table(t()), ChainAttribute::Name(name.clone())],
        }),
        NftOp::AddSet { name, key, verdict_map, comment } => {
            NfTablesMessage::NewSet(SetMessage { attributes: set_attributes(t(), name, key, *verdict_map, comment) })
        }
        NftOp::DeleteSet(name) => NfTablesMessage::DeleteSet(SetMessage {
            attributes: vec![SetAttribute::Table(t()), SetAttribute::Name(name.clone())],
        }),
        NftOp::AddElements { set, elements } => {
            let list = elements.iter().map(|(k, v)| element(k, v.as_ref())).collect();
            NfTablesMessage::NewSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(t()),
                    SetElementList::Set(set.clone()),
                    SetElementList::Elements(list),
                ],
            })
        }
        NftOp::DeleteElements { set, keys } => {
            let list = keys.iter().map(|k| element(k, None)).collect();
            NfTablesMessage::DeleteSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(t()),
                    SetElementList::Set(set.clone()),
                    SetElementList::Elements(list),
                ],
            })
        }
        NftOp::AddRule { chain, verdict, comment } => {
            let immediate = Expressions::Immediate(vec![
                Immediate::DestinationRegister(Register::Verdict),
                Immediate::Data(verdict_data(verdict)),
            ]);
            let exprs: Vec<ListAttribute<ExpressionAttribute>> = vec![immediate.into()];
            let mut attributes =
                vec![RuleAttribute::Table(t()), RuleAttribute::Chain(chain.clone()), RuleAttribute::Expressions(exprs)];
            if let Some(c) = comment {
                attributes.push(RuleAttribute::UserData(comment_udata(UDATA_RULE_COMMENT, c)));
            }
            NfTablesMessage::NewRule(RuleMessage { attributes })
        }
    };
    NetfilterMessage::new(NetfilterHeader::new(proto, 0, 0), inner)
}

fn hook_number(h: ChainHook) -> InetHookNumber {
    match h {
        ChainHook::Prerouting => InetHookNumber::PreRouting,
        ChainHook::Input => InetHookNumber::LocalIn,
        ChainHook::Forward => InetHookNumber::Forward,
        ChainHook::Output => InetHookNumber::LocalOut,
        ChainHook::Postrouting => InetHookNumber::PostRouting,
    }
}

/// Set ids only need to differ within one transaction.
fn set_id(name: &str) -> u32 {
    name.bytes().fold(2_166_136_261u32, |h, b| (h ^ u32::from(b)).wrapping_mul(16_777_619))
}

fn set_attributes(
    table: String,
    name: &str,
    key: &[KeyType],
    verdict_map: bool,
    comment: &Option<String>,
) -> Vec<SetAttribute> {
    let key_type = key.iter().fold(0u32, |acc, k| (acc << TYPE_BITS) | k.id());
    let key_len: u32 = key.iter().map(|k| k.len().next_multiple_of(4)).sum();
    let mut flags = SetFlags::empty();
    if key.len() > 1 {
        flags |= SetFlags::Concat;
    }
    if verdict_map {
        flags |= SetFlags::Map;
    }
    let mut attributes = vec![
        SetAttribute::Table(table),
        SetAttribute::Name(name.to_string()),
        SetAttribute::Flags(flags),
        SetAttribute::KeyType(key_type),
        SetAttribute::KeyLen(key_len),
        SetAttribute::Id(set_id(name)),
    ];
    if verdict_map {
        // NFT_DATA_VERDICT; the kernel sets the length itself.
        attributes.push(SetAttribute::DataType(0xffff_ff00));
    }
    if key.len() > 1 {
        let fields = key
            .iter()
            .map(|k| nested(NFTA_LIST_ELEM, &[DefaultNla::new(NFTA_SET_FIELD_LEN, k.len().to_be_bytes().to_vec())]))
            .collect();
        attributes.push(SetAttribute::Description(vec![SetDescription::Concat(fields)]));
    }
    if let Some(c) = comment {
        attributes.push(SetAttribute::UserData(comment_udata(UDATA_SET_COMMENT, c)));
    }
    attributes
}

/// A nested attribute of `kind` holding `inner`.
fn nested(kind: u16, inner: &[DefaultNla]) -> DefaultNla {
    let mut value = vec![0; inner.buffer_len()];
    inner.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
}

fn element(key: &[KeyPart], verdict: Option<&Verdict>) -> ListAttribute<SetElementAttribute> {
    let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(key_bytes(key)))];
    if let Some(v) = verdict {
        attrs.push(SetElementAttribute::Data(verdict_data(v)));
    }
    ListAttribute::Element(attrs)
}

/// An element's key: each field in network order, padded to 4 bytes.
pub fn key_bytes(key: &[KeyPart]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() * 4);
    for part in key {
        match part {
            KeyPart::Addr(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            KeyPart::Addr(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            KeyPart::Proto(p) => out.extend_from_slice(&[*p, 0, 0, 0]),
            KeyPart::Port(p) => {
                out.extend_from_slice(&p.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
        }
    }
    out
}

fn verdict_data(v: &Verdict) -> DataAttribute {
    let attrs = match v {
        Verdict::Accept => vec![VerdictAttribute::Code(NlVerdict::Other(NF_ACCEPT))],
        Verdict::Drop => vec![VerdictAttribute::Code(NlVerdict::Other(NF_DROP))],
        Verdict::Return => vec![VerdictAttribute::Code(NlVerdict::Return)],
        Verdict::Jump(c) => vec![VerdictAttribute::Code(NlVerdict::Jump), VerdictAttribute::Chain(c.clone())],
        Verdict::Goto(c) => vec![VerdictAttribute::Code(NlVerdict::Goto), VerdictAttribute::Chain(c.clone())],
    };
    DataAttribute::Verdict(attrs)
}

/// libnftnl's user data with one comment: type, length, the text and its NUL.
fn comment_udata(kind: u8, comment: &str) -> Vec<u8> {
    let text: Vec<u8> = comment.bytes().take(254).chain([0]).collect();
    let mut out = vec![kind, text.len() as u8];
    out.extend(text);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concatenated_keys_pad_each_field_to_a_register() {
        let key = [KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(17), KeyPart::Port(53)];
        assert_eq!(key_bytes(&key), [10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0]);
        let attrs = set_attributes(
            "kube-proxy".into(),
            "service-ips",
            &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            true,
            &None,
        );
        assert!(attrs.contains(&SetAttribute::KeyType((7 << 12) | (12 << 6) | 13)));
        assert!(attrs.contains(&SetAttribute::KeyLen(12)));
        assert!(attrs.contains(&SetAttribute::Flags(SetFlags::Concat | SetFlags::Map)));
    }

    #[test]
    fn comments_are_libnftnl_user_data() {
        assert_eq!(comment_udata(UDATA_TABLE_COMMENT, "ab"), [0, 3, b'a', b'b', 0]);
    }

    #[test]
    fn ops_name_themselves_for_errors() {
        let op = NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![(
                vec![KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(6), KeyPart::Port(53)],
                Some(Verdict::Goto("service-X".into())),
            )],
        };
        assert_eq!(op.to_string(), "add element service-ips { 10.96.0.10 . tcp . 53 : goto service-X }");
    }
}
