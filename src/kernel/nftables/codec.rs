//! The nf_tables ops of one transaction, as `netlink-packet-netfilter`
//! messages. Pure: ops in, messages out.
//!
//! Encodings follow the kernel (include/uapi/linux/netfilter/nf_tables.h)
//! and what `nft` sends, so `nft list` prints what we write:
//! - A set's key is a concatenation of [`KeyType`]s: its type is nft's
//!   datatype ids chained 6 bits apart, its length the fields each padded
//!   to 4 bytes (a 32-bit register); as with `nft`, no concatenation flag
//!   or field lengths (`NFTA_SET_DESC_CONCAT`: interval sets only), see
//!   [`set_attributes`]. An element's key is the fields' bytes in network
//!   order, each padded the same way.
//! - Comments go in the object's user data as libnftnl writes them: one
//!   TLV (type, length, the text with its NUL).

use std::fmt;

use netlink_packet_core::{NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Hook, HookNumber, InetHookNumber, ListAttribute,
    NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetElementAttribute, SetElementFlags, SetElementList,
    SetElementMessage, SetFlags, SetMessage, TableAttribute, TableMessage, Verdict as NlVerdict, VerdictAttribute,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::rule::{self, AnonKey, AnonSet, RuleError};
pub use super::types::{key_bytes, KeyPart, KeyType, Verdict};
use crate::net::IpFamily;

/// nfnetlink's subsystem id of nf_tables (the batch markers' `res_id`).
const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// nft's datatype ids (nftables' include/datatype.h) and their bit width in a concatenation.
const TYPE_BITS: u32 = 6;
/// libnftnl's user-data types of comments.
const UDATA_TABLE_COMMENT: u8 = 0;
const UDATA_CHAIN_COMMENT: u8 = 0;
const UDATA_RULE_COMMENT: u8 = 0;
const UDATA_SET_COMMENT: u8 = 7;
const UDATA_ELEM_COMMENT: u8 = 0;
/// Netfilter's verdicts accept and drop (NF_ACCEPT, NF_DROP).
const NF_ACCEPT: u32 = 1;
const NF_DROP: u32 = 0;

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

/// An element of a set or verdict map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    pub key: Vec<KeyPart>,
    /// The verdict, in a verdict map.
    pub verdict: Option<Verdict>,
    pub comment: Option<String>,
}

impl Element {
    /// A set member.
    pub fn key(key: Vec<KeyPart>) -> Element {
        Element { key, verdict: None, comment: None }
    }

    /// A verdict map entry.
    pub fn to(key: Vec<KeyPart>, verdict: Verdict) -> Element {
        Element { key, verdict: Some(verdict), comment: None }
    }
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
    /// `add set` / `add map NAME { type K : verdict }`; with a timeout
    /// (seconds), `flags dynamic,timeout` (the affinity sets).
    AddSet {
        name: String,
        key: Vec<KeyType>,
        verdict_map: bool,
        timeout: Option<u32>,
        comment: Option<String>,
    },
    DeleteSet(String),
    /// `flush set` / `flush map`: every element goes, the set stays.
    FlushSet(String),
    /// `add element`: keys, with their verdicts in a verdict map.
    AddElements {
        set: String,
        elements: Vec<Element>,
    },
    /// `delete element`.
    DeleteElements {
        set: String,
        keys: Vec<Vec<KeyPart>>,
    },
    /// `add rule CHAIN TEXT`: upstream's rule syntax ([`super::rule`]), a
    /// trailing `comment "..."` included.
    AddRule {
        chain: String,
        rule: String,
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
            NftOp::FlushSet(name) => write!(f, "flush set {name}"),
            NftOp::AddElements { set, elements } => {
                let first = elements.first().map(|e| match &e.verdict {
                    Some(v) => format!("{} : {v}", key_text(&e.key)),
                    None => key_text(&e.key),
                });
                write!(f, "add element {set} {{ {}{} }}", first.unwrap_or_default(), more(elements.len()))
            }
            NftOp::DeleteElements { set, keys } => {
                let first = keys.first().map(|k| key_text(k)).unwrap_or_default();
                write!(f, "delete element {set} {{ {first}{} }}", more(keys.len()))
            }
            NftOp::AddRule { chain, rule } => write!(f, "add rule {chain} {rule}"),
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

/// What a dump lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    Chains,
    Sets,
}

/// A dump of `kind` in `family`, asking for table `table` only.
pub fn dump_request(family: IpFamily, table: &str, kind: DumpKind) -> NetfilterMessage {
    let inner = match kind {
        DumpKind::Chains => {
            NfTablesMessage::GetChain(ChainMessage { attributes: vec![ChainAttribute::Table(table.to_string())] })
        }
        DumpKind::Sets => {
            NfTablesMessage::GetSet(SetMessage { attributes: vec![SetAttribute::Table(table.to_string())] })
        }
    };
    NetfilterMessage::new(NetfilterHeader::new(proto_family(family), 0, 0), inner)
}

/// In a dump reply of `kind` (its bytes after the netlink header): the
/// object's name when it is in table `table`. Both carry the table in
/// attribute 1 (`NFTA_CHAIN_TABLE`, `NFTA_SET_TABLE`); the name is
/// `NFTA_CHAIN_NAME` (3) or `NFTA_SET_NAME` (2).
pub fn name_in_table(payload: &[u8], table: &str, kind: DumpKind) -> Option<String> {
    let name_attr = match kind {
        DumpKind::Chains => 3,
        DumpKind::Sets => 2,
    };
    let text = |v: &[u8]| std::str::from_utf8(v).ok().map(|s| s.trim_end_matches('\0').to_string());
    let (mut in_table, mut name) = (false, None);
    for (k, value) in reply_attrs(payload) {
        match k {
            1 => in_table = text(value).as_deref() == Some(table),
            k if k == name_attr => name = text(value),
            _ => {}
        }
    }
    name.filter(|_| in_table)
}

/// What a get of a table says of it: enough to notice that it was deleted
/// and created again (its handle), lost or gained chains or sets (its use
/// count: chains, sets including rules' anonymous ones, objects) or was
/// made dormant (its flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableInfo {
    pub handle: u64,
    pub use_count: u32,
    pub flags: u32,
}

/// `NFT_MSG_GETTABLE` of table `table` of `family` (not a dump).
pub fn table_request(family: IpFamily, table: &str) -> NetfilterMessage {
    let inner = NfTablesMessage::GetTable(TableMessage { attributes: vec![TableAttribute::Name(table.to_string())] });
    NetfilterMessage::new(NetfilterHeader::new(proto_family(family), 0, 0), inner)
}

/// `NFT_MSG_GETGEN`: the ruleset's generation, which every commit of any
/// sender in the network namespace moves on.
pub fn generation_request() -> NetfilterMessage {
    let inner = NfTablesMessage::GetGen(netlink_packet_netfilter::nftables::GenMessage { attributes: vec![] });
    NetfilterMessage::new(NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0), inner)
}

/// The attributes of a reply (its bytes after the netlink header, past the nfgenmsg).
fn reply_attrs(payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    use netlink_packet_core::{NlaBuffer, NlasIterator};
    NlasIterator::new(payload.get(4..).unwrap_or(&[])).map_while(|nla| nla.ok()).map(|nla: NlaBuffer<&[u8]>| {
        let (kind, len) = (nla.kind(), usize::from(nla.length()));
        let bytes = nla.into_inner();
        (kind, bytes.get(4..len).unwrap_or(&[]))
    })
}

/// A `NFT_MSG_NEWTABLE` reply: `NFTA_TABLE_FLAGS` (2), `NFTA_TABLE_USE` (3),
/// `NFTA_TABLE_HANDLE` (4), all in network order.
pub fn table_info(payload: &[u8]) -> Option<TableInfo> {
    let (mut flags, mut use_count, mut handle) = (None, None, None);
    for (kind, value) in reply_attrs(payload) {
        match kind {
            2 => flags = value.try_into().ok().map(u32::from_be_bytes),
            3 => use_count = value.try_into().ok().map(u32::from_be_bytes),
            4 => handle = value.try_into().ok().map(u64::from_be_bytes),
            _ => {}
        }
    }
    Some(TableInfo { handle: handle?, use_count: use_count?, flags: flags.unwrap_or(0) })
}

/// A `NFT_MSG_NEWGEN` reply's `NFTA_GEN_ID` (1, network order).
pub fn generation_id(payload: &[u8]) -> Option<u32> {
    reply_attrs(payload).find(|(kind, _)| *kind == 1).and_then(|(_, v)| v.try_into().ok().map(u32::from_be_bytes))
}

/// The (sequence, error code) of every refusal (`NLMSG_ERROR` with a
/// non-zero code) in a datagram the kernel sent.
pub fn errors_in(datagram: &[u8]) -> Vec<(u32, i32)> {
    const NLMSG_ERROR: u16 = 2;
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(h) = datagram.get(at..at + 16) {
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let kind = u16::from_ne_bytes([h[4], h[5]]);
        let seq = u32::from_ne_bytes([h[8], h[9], h[10], h[11]]);
        if len < 16 {
            break;
        }
        if kind == NLMSG_ERROR {
            if let Some(c) = datagram.get(at + 16..at + 20) {
                let code = i32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                if code != 0 {
                    out.push((seq, code));
                }
            }
        }
        at += len.next_multiple_of(4);
    }
    out
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

/// The messages of `op` on table `table` of `family`: one, or for a rule
/// with anonymous sets, those sets and their elements first. `next_id`
/// numbers the anonymous sets of one transaction.
pub fn messages(
    family: IpFamily,
    table: &str,
    op: &NftOp,
    next_id: &mut u32,
) -> Result<Vec<NetfilterMessage>, RuleError> {
    let proto = proto_family(family);
    let wrap = |inner: NfTablesMessage| NetfilterMessage::new(NetfilterHeader::new(proto, 0, 0), inner);
    if let NftOp::AddRule { chain, rule } = op {
        let compiled = rule::compile(family, rule, next_id)?;
        let mut out: Vec<NetfilterMessage> =
            compiled.anon.iter().flat_map(|a| anon_set_messages(table, a)).map(wrap).collect();
        let exprs = compiled.exprs.into_iter().map(ListAttribute::<ExpressionAttribute>::from).collect();
        let mut attributes = vec![
            RuleAttribute::Table(table.to_string()),
            RuleAttribute::Chain(chain.clone()),
            RuleAttribute::Expressions(exprs),
        ];
        if let Some(c) = &compiled.comment {
            attributes.push(RuleAttribute::UserData(comment_udata(UDATA_RULE_COMMENT, c)));
        }
        out.push(wrap(NfTablesMessage::NewRule(RuleMessage { attributes })));
        return Ok(out);
    }
    Ok(object_message(table, op).map(wrap).into_iter().collect())
}

fn proto_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

/// An anonymous set of a rule: the set, then its elements (by id).
fn anon_set_messages(table: &str, a: &AnonSet) -> Vec<NfTablesMessage> {
    let (flags, key_type, key_len, map) = match a.key {
        AnonKey::Integer => (SetFlags::Anonymous | SetFlags::Constant | SetFlags::Map, 4u32, 4u32, true),
        AnonKey::Addr(f) => {
            let (t, l) = if f == IpFamily::V4 { (KeyType::Ipv4Addr.id(), 4) } else { (KeyType::Ipv6Addr.id(), 16) };
            (SetFlags::Anonymous | SetFlags::Constant | SetFlags::Interval, t, l, false)
        }
    };
    let name = rule::anon_name(a.key, a.id);
    let mut attributes = vec![
        SetAttribute::Table(table.to_string()),
        SetAttribute::Name(name.clone()),
        SetAttribute::Flags(flags),
        SetAttribute::KeyType(key_type),
        SetAttribute::KeyLen(key_len),
        SetAttribute::Id(a.id),
    ];
    if map {
        attributes.push(SetAttribute::DataType(0xffff_ff00));
        // libnftnl's NFTNL_UDATA_SET_KEYBYTEORDER: host order (numgen's integers).
        let mut udata = vec![0u8, 4];
        udata.extend_from_slice(&1u32.to_ne_bytes());
        attributes.push(SetAttribute::UserData(udata));
    }
    let elements = a
        .elements
        .iter()
        .map(|(key, verdict, end)| {
            let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(key.clone()))];
            if let Some(v) = verdict {
                attrs.push(SetElementAttribute::Data(verdict_data(v)));
            }
            if *end {
                attrs.push(SetElementAttribute::Flags(SetElementFlags::IntervalEnd));
            }
            ListAttribute::Element(attrs)
        })
        .collect();
    vec![
        NfTablesMessage::NewSet(SetMessage { attributes }),
        NfTablesMessage::NewSetElement(SetElementMessage {
            attributes: vec![
                SetElementList::Table(table.to_string()),
                SetElementList::Set(name),
                SetElementList::SetId(a.id),
                SetElementList::Elements(elements),
            ],
        }),
    ]
}

/// The message of `op` on table `table`; `None` for a rule (compiled by [`messages`]).
fn object_message(table: &str, op: &NftOp) -> Option<NfTablesMessage> {
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
        NftOp::AddSet { name, key, verdict_map, timeout, comment } => NfTablesMessage::NewSet(SetMessage {
            attributes: set_attributes(t(), name, key, *verdict_map, *timeout, comment),
        }),
        NftOp::DeleteSet(name) => NfTablesMessage::DeleteSet(SetMessage {
            attributes: vec![SetAttribute::Table(t()), SetAttribute::Name(name.clone())],
        }),
        // A element delete without elements flushes the set.
        NftOp::FlushSet(name) => NfTablesMessage::DeleteSetElement(SetElementMessage {
            attributes: vec![SetElementList::Table(t()), SetElementList::Set(name.clone())],
        }),
        NftOp::AddElements { set, elements } => {
            let list = elements.iter().map(|e| element(&e.key, e.verdict.as_ref(), e.comment.as_deref())).collect();
            NfTablesMessage::NewSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(t()),
                    SetElementList::Set(set.clone()),
                    SetElementList::Elements(list),
                ],
            })
        }
        NftOp::DeleteElements { set, keys } => {
            let list = keys.iter().map(|k| element(k, None, None)).collect();
            NfTablesMessage::DeleteSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(t()),
                    SetElementList::Set(set.clone()),
                    SetElementList::Elements(list),
                ],
            })
        }
        NftOp::AddRule { .. } => return None,
    };
    Some(inner)
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

/// A named set's attributes, as `nft` sends them for the same `add set` /
/// `add map` line: the kernel refuses (EEXIST) to add a set that exists
/// with another definition (flags, key and data types and lengths, the
/// concatenation's field count and lengths; `nft_set_is_same`), so a table
/// `nft -f` wrote (upstream kube-proxy's) takes our adds, and ours takes
/// theirs, only if both send the same. `nft` marks a concatenated key
/// (`NFT_SET_CONCAT`, `NFTA_SET_DESC_CONCAT`) only in interval sets, and
/// these are not.
fn set_attributes(
    table: String,
    name: &str,
    key: &[KeyType],
    verdict_map: bool,
    timeout: Option<u32>,
    comment: &Option<String>,
) -> Vec<SetAttribute> {
    let key_type = key.iter().fold(0u32, |acc, k| (acc << TYPE_BITS) | k.id());
    let key_len: u32 = key.iter().map(|k| k.field_len().next_multiple_of(4)).sum();
    let mut flags = SetFlags::empty();
    if verdict_map {
        flags |= SetFlags::Map;
    }
    if timeout.is_some() {
        flags |= SetFlags::Timeout | SetFlags::Eval;
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
    if let Some(secs) = timeout {
        attributes.push(SetAttribute::Timeout(u64::from(secs) * 1000));
    }
    if let Some(c) = comment {
        attributes.push(SetAttribute::UserData(comment_udata(UDATA_SET_COMMENT, c)));
    }
    attributes
}

fn element(key: &[KeyPart], verdict: Option<&Verdict>, comment: Option<&str>) -> ListAttribute<SetElementAttribute> {
    let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(key_bytes(key)))];
    if let Some(v) = verdict {
        attrs.push(SetElementAttribute::Data(verdict_data(v)));
    }
    if let Some(c) = comment {
        attrs.push(SetElementAttribute::UserData(comment_udata(UDATA_ELEM_COMMENT, c)));
    }
    ListAttribute::Element(attrs)
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

    /// A message's bytes after the netlink header, as the kernel would send them.
    fn payload(msg: NetfilterMessage) -> Vec<u8> {
        use netlink_packet_core::NetlinkSerializable;
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        out
    }

    #[test]
    fn a_table_get_reply_gives_handle_use_and_flags_and_a_gen_reply_its_id() {
        use netlink_packet_netfilter::nftables::{GenAttribute, GenMessage, TableFlags};
        let reply = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
            NfTablesMessage::NewTable(TableMessage {
                attributes: vec![
                    TableAttribute::Name("kube-proxy".into()),
                    TableAttribute::Flags(TableFlags::empty()),
                    TableAttribute::Use(42),
                    TableAttribute::Handle(7),
                ],
            }),
        );
        assert_eq!(table_info(&payload(reply)), Some(TableInfo { handle: 7, use_count: 42, flags: 0 }));
        // A reply without a handle is not taken for one.
        let partial = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0),
            NfTablesMessage::NewTable(TableMessage { attributes: vec![TableAttribute::Use(42)] }),
        );
        assert_eq!(table_info(&payload(partial)), None);
        let gen = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            NfTablesMessage::NewGen(GenMessage { attributes: vec![GenAttribute::Id(0x0102_0304)] }),
        );
        assert_eq!(generation_id(&payload(gen)), Some(0x0102_0304));
        assert_eq!(generation_id(&[0, 0, 0, 0]), None);
        // The requests name the table, in the family asked.
        let req = payload(table_request(IpFamily::V6, "kube-proxy"));
        assert_eq!(req[0], libc::AF_INET6 as u8);
        assert!(req.windows(11).any(|w| w == b"kube-proxy\0"), "{req:?}");
    }

    #[test]
    fn concatenated_keys_pad_each_field_to_a_register() {
        let key = [KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(17), KeyPart::Port(53)];
        assert_eq!(key_bytes(&key), [10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0]);
        let attrs = set_attributes(
            "kube-proxy".into(),
            "service-ips",
            &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
            true,
            None,
            &None,
        );
        assert!(attrs.contains(&SetAttribute::KeyType((7 << 12) | (12 << 6) | 13)));
        assert!(attrs.contains(&SetAttribute::KeyLen(12)));
    }

    /// What `nft` sends for upstream's maps and sets (`nft --debug=netlink`
    /// prints flags 8 for `service-ips`): a map flag, no concatenation flag
    /// and no field lengths (those are for interval sets). With them the
    /// kernel refused our `add map service-ips` over a table `nft -f` wrote
    /// (EEXIST), and every full sync over upstream's table failed.
    #[test]
    fn sets_are_defined_as_nft_defines_them() {
        let concat = [KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService];
        let map = set_attributes("kube-proxy".into(), "service-ips", &concat, true, None, &None);
        assert!(map.contains(&SetAttribute::Flags(SetFlags::Map)), "{map:?}");
        assert!(!map.iter().any(|a| matches!(a, SetAttribute::Description(_))), "{map:?}");
        let affinity = set_attributes("kube-proxy".into(), "affinity-X", &[KeyType::Ipv4Addr], false, Some(600), &None);
        assert!(affinity.contains(&SetAttribute::Flags(SetFlags::Timeout | SetFlags::Eval)), "{affinity:?}");
        let plain = set_attributes("kube-proxy".into(), "cluster-ips", &[KeyType::Ipv4Addr], false, None, &None);
        assert!(plain.contains(&SetAttribute::Flags(SetFlags::empty())), "{plain:?}");
    }

    #[test]
    fn comments_are_libnftnl_user_data() {
        assert_eq!(comment_udata(UDATA_TABLE_COMMENT, "ab"), [0, 3, b'a', b'b', 0]);
    }

    #[test]
    fn ops_name_themselves_for_errors() {
        let op = NftOp::AddElements {
            set: "service-ips".into(),
            elements: vec![Element::to(
                vec![KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(6), KeyPart::Port(53)],
                Verdict::Goto("service-X".into()),
            )],
        };
        assert_eq!(op.to_string(), "add element service-ips { 10.96.0.10 . tcp . 53 : goto service-X }");
    }
}
