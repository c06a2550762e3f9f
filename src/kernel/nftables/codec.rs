//! The nf_tables ops of one transaction, as `netlink-packet-netfilter`
//! messages with their netlink flags. Pure: typed ops in, messages out
//! (rules through [`super::expr`]).
//!
//! Encodings follow the kernel (include/uapi/linux/netfilter/nf_tables.h)
//! and what `nft` sends, so `nft list` prints what we write:
//! - A set's key is a concatenation of key types: its type is nft's
//!   datatype ids chained 6 bits apart, its length the fields each padded
//!   to 4 bytes (a 32-bit register); as with `nft`, no concatenation flag
//!   or field lengths (`NFTA_SET_DESC_CONCAT`: interval sets only), see
//!   [`set_attributes`]. An element's key is the fields' bytes in network
//!   order, each padded the same way.
//! - Comments go in the object's user data as libnftnl writes them: one
//!   TLV (type, length, the text with its NUL).

use std::net::IpAddr;

use netlink_packet_core::{NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Hook, HookNumber, InetHookNumber, ListAttribute,
    NfTablesMessage, RuleAttribute, RuleMessage, SetAttribute, SetDescription, SetElementAttribute, SetElementFlags,
    SetElementList, SetElementMessage, SetFlags, SetMessage, TableAttribute, TableMessage, Verdict as NlVerdict,
    VerdictAttribute,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::expr::{self, anon_name, AnonKey, AnonSet, EncodeError, Unencodable};
use super::types::{concat_len, concat_type, field_len, type_id};
use super::udata;
use crate::msgs::nftables::{ChainHook, ElemValue, Element, KeyPart, NftOp, SetData, SetFlag, SetSpec, Verdict};
use crate::net::IpFamily;

/// libnftnl's user-data types of comments.
const UDATA_TABLE_COMMENT: u8 = 0;
const UDATA_CHAIN_COMMENT: u8 = 0;
const UDATA_RULE_COMMENT: u8 = 0;
const UDATA_ELEM_COMMENT: u8 = 0;
/// Netfilter's verdicts accept and drop (NF_ACCEPT, NF_DROP).
const NF_ACCEPT: u32 = 1;
const NF_DROP: u32 = 0;

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

/// One message of a transaction: what it is, its netlink flags besides
/// `NLM_F_REQUEST`, and the op it belongs to (a rule brings its anonymous
/// sets and their elements).
#[derive(Debug, Clone)]
pub struct Request {
    pub msg: NetfilterMessage,
    pub flags: u16,
    pub op: usize,
}

/// The messages of `ops` on table `table` of `family`, in order. Ops ask
/// no ack (as `nft`'s: only refusals come back); `next_id` numbers the
/// anonymous sets.
pub fn requests(family: IpFamily, table: &str, ops: &[NftOp], next_id: &mut u32) -> Result<Vec<Request>, EncodeError> {
    let mut out = Vec::with_capacity(ops.len());
    encode(family, table, ops, next_id, |r| out.push(r))?;
    Ok(out)
}

/// [`requests`], each handed to `emit` as it is made (none is kept here).
pub fn encode(
    family: IpFamily,
    table: &str,
    ops: &[NftOp],
    next_id: &mut u32,
    mut emit: impl FnMut(Request),
) -> Result<(), EncodeError> {
    for (i, op) in ops.iter().enumerate() {
        let flags = op_flags(op) & !NLM_F_ACK;
        if let NftOp::AddRule { chain, rule } = op {
            let compiled = expr::compile(family, rule, next_id)?;
            for a in &compiled.anon {
                for msg in anon_set_messages(table, a) {
                    // Created as `nft` creates a rule's anonymous sets.
                    emit(Request { msg: wrap(family, msg), flags: NLM_F_CREATE, op: i });
                }
            }
            let exprs = compiled.exprs.into_iter().map(ListAttribute::<ExpressionAttribute>::from).collect();
            let mut attributes = vec![
                RuleAttribute::Table(table.to_string()),
                RuleAttribute::Chain(chain.clone()),
                RuleAttribute::Expressions(exprs),
            ];
            if let Some(c) = &rule.comment {
                attributes.push(RuleAttribute::UserData(comment_udata(UDATA_RULE_COMMENT, c)));
            }
            emit(Request { msg: wrap(family, NfTablesMessage::NewRule(RuleMessage { attributes })), flags, op: i });
        } else if let NftOp::AddElementsOf(source) = op {
            // Each run's message is made from the source's elements, written and dropped in turn.
            let mut failed = None;
            source.0.runs(&mut |set, elements| {
                if failed.is_none() {
                    match elements_message(table, set, elements.iter().copied()) {
                        Ok(msg) => emit(Request { msg: wrap(family, msg), flags, op: i }),
                        Err(why) => failed = Some(EncodeError { what: format!("add element {set}"), why }),
                    }
                }
            });
            failed.map_or(Ok(()), Err)?;
        } else {
            let msg = object_message(table, op).map_err(|why| EncodeError { what: op.to_string(), why })?;
            emit(Request { msg: wrap(family, msg), flags, op: i });
        }
    }
    Ok(())
}

/// `add element` of `elements` to `set` of table `table`: one message.
fn elements_message<'a>(
    table: &str,
    set: &str,
    elements: impl Iterator<Item = &'a Element>,
) -> Result<NfTablesMessage, Unencodable> {
    let list = elements.map(element).collect::<Result<_, _>>()?;
    Ok(NfTablesMessage::NewSetElement(SetElementMessage {
        attributes: vec![
            SetElementList::Table(table.to_string()),
            SetElementList::Set(set.to_string()),
            SetElementList::Elements(list),
        ],
    }))
}

/// The netlink flags `nft` sends `op` with.
fn op_flags(op: &NftOp) -> u16 {
    match op {
        NftOp::AddTable { .. }
        | NftOp::AddChain { .. }
        | NftOp::AddSet(_)
        | NftOp::AddElements { .. }
        | NftOp::AddElementsOf(_) => NLM_F_CREATE | NLM_F_ACK,
        NftOp::AddRule { .. } => NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
        _ => NLM_F_ACK,
    }
}

fn wrap(family: IpFamily, inner: NfTablesMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(proto_family(family), 0, 0), inner)
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
            let k = crate::msgs::nftables::KeyType::addr(f);
            (SetFlags::Anonymous | SetFlags::Constant | SetFlags::Interval, type_id(k), field_len(k), false)
        }
    };
    let name = anon_name(a.key, a.id);
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
        .map(|e| {
            let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(e.key.clone()))];
            if let Some(v) = &e.verdict {
                attrs.push(SetElementAttribute::Data(verdict_data(v)));
            }
            if e.interval_end {
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

/// The message of `op` (not a rule: [`requests`] compiles those) on table `table`.
fn object_message(table: &str, op: &NftOp) -> Result<NfTablesMessage, Unencodable> {
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
        NftOp::AddSet(spec) => NfTablesMessage::NewSet(SetMessage { attributes: set_attributes(t(), spec) }),
        NftOp::DeleteSet { name, .. } => NfTablesMessage::DeleteSet(SetMessage {
            attributes: vec![SetAttribute::Table(t()), SetAttribute::Name(name.clone())],
        }),
        // An element delete without elements flushes the set.
        NftOp::FlushSet { name, .. } => NfTablesMessage::DeleteSetElement(SetElementMessage {
            attributes: vec![SetElementList::Table(t()), SetElementList::Set(name.clone())],
        }),
        NftOp::AddElements { set, elements } => elements_message(table, set, elements.iter())?,
        NftOp::DeleteElements { set, keys } => {
            let list = keys.iter().map(|k| element(&Element::key(k.clone()))).collect::<Result<_, _>>()?;
            NfTablesMessage::DeleteSetElement(SetElementMessage {
                attributes: vec![
                    SetElementList::Table(t()),
                    SetElementList::Set(set.clone()),
                    SetElementList::Elements(list),
                ],
            })
        }
        NftOp::AddRule { .. } | NftOp::AddElementsOf(_) => return Err(Unencodable::NotOneMessage),
    };
    Ok(inner)
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
/// these are not. A set defined by `typeof` carries its fields in its user
/// data, which `nft list` prints it from ([`udata::set`]).
fn set_attributes(table: String, spec: &SetSpec) -> Vec<SetAttribute> {
    let mut flags = SetFlags::empty();
    if spec.is_map() {
        flags |= SetFlags::Map;
    }
    for f in &spec.flags {
        flags |= match f {
            SetFlag::Dynamic => SetFlags::Eval,
            SetFlag::Timeout => SetFlags::Timeout,
        };
    }
    let mut attributes = vec![
        SetAttribute::Table(table),
        SetAttribute::Name(spec.name.clone()),
        SetAttribute::Flags(flags),
        SetAttribute::KeyType(concat_type(&spec.key)),
        SetAttribute::KeyLen(concat_len(&spec.key)),
        SetAttribute::Id(set_id(&spec.name)),
    ];
    match &spec.data {
        // NFT_DATA_VERDICT; the kernel sets the length itself.
        Some(SetData::Verdict) => attributes.push(SetAttribute::DataType(0xffff_ff00)),
        Some(data @ SetData::Fields(_)) => {
            let types = data.types();
            attributes.push(SetAttribute::DataType(concat_type(&types)));
            attributes.push(SetAttribute::DataLen(concat_len(&types)));
        }
        None => {}
    }
    if let Some(secs) = spec.timeout {
        attributes.push(SetAttribute::Timeout(u64::from(secs) * 1000));
    }
    if let Some(n) = spec.size {
        attributes.push(SetAttribute::Description(vec![SetDescription::Size(n)]));
    }
    let user_data = udata::set(spec);
    if !user_data.is_empty() {
        attributes.push(SetAttribute::UserData(user_data));
    }
    attributes
}

fn element(e: &Element) -> Result<ListAttribute<SetElementAttribute>, Unencodable> {
    let mut attrs = vec![SetElementAttribute::Key(DataAttribute::Value(key_bytes(&e.key)?))];
    match &e.value {
        Some(ElemValue::Verdict(v)) => attrs.push(SetElementAttribute::Data(verdict_data(v))),
        Some(ElemValue::Data(d)) => attrs.push(SetElementAttribute::Data(DataAttribute::Value(key_bytes(d)?))),
        None => {}
    }
    if let Some(c) = &e.comment {
        attrs.push(SetElementAttribute::UserData(comment_udata(UDATA_ELEM_COMMENT, c)));
    }
    Ok(ListAttribute::Element(attrs))
}

/// An element's key (or data): each field in network order, padded to 4
/// bytes; a slot (a `numgen` result) in host order. A CIDR is not a key of
/// the sets here (no interval sets).
pub fn key_bytes(key: &[KeyPart]) -> Result<Vec<u8>, Unencodable> {
    let mut out = Vec::with_capacity(key.len() * 4);
    for part in key {
        match part {
            KeyPart::Addr(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            KeyPart::Addr(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            KeyPart::Proto(p) => out.extend_from_slice(&[p.number(), 0, 0, 0]),
            KeyPart::Port(p) => {
                out.extend_from_slice(&p.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
            }
            KeyPart::Slot(n) => out.extend_from_slice(&n.to_ne_bytes()),
            KeyPart::Net(n) => return Err(Unencodable::IntervalKey { key: *n }),
        }
    }
    Ok(out)
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
    udata::comment(kind, comment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::nftables::KeyType;
    use crate::net::Protocol;

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
        let key = [KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(Protocol::Udp), KeyPart::Port(53)];
        assert_eq!(key_bytes(&key).unwrap(), [10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0]);
        let concat = vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService];
        let attrs = set_attributes("kube-proxy".into(), &SetSpec::verdict_map("service-ips", concat, None));
        assert!(attrs.contains(&SetAttribute::KeyType((7 << 12) | (12 << 6) | 13)));
        assert!(attrs.contains(&SetAttribute::KeyLen(12)));
        // A CIDR is not a named set's key here (no interval sets).
        assert!(key_bytes(&[KeyPart::Net("10.0.0.0/8".parse().unwrap())]).is_err());
    }

    /// What `nft` sends for upstream's maps and sets (`nft --debug=netlink`
    /// prints flags 8 for `service-ips`): a map flag, no concatenation flag
    /// and no field lengths (those are for interval sets). With them the
    /// kernel would refuse our `add map service-ips` over a table `nft -f`
    /// wrote (EEXIST), so every full sync over upstream's table would fail.
    #[test]
    fn sets_are_defined_as_nft_defines_them() {
        let concat = vec![KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService];
        let map = set_attributes("kube-proxy".into(), &SetSpec::verdict_map("service-ips", concat, None));
        assert!(map.contains(&SetAttribute::Flags(SetFlags::Map)), "{map:?}");
        assert!(!map.iter().any(|a| matches!(a, SetAttribute::Description(_))), "{map:?}");
        let spec = SetSpec {
            flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
            timeout: Some(600),
            ..SetSpec::set("affinity-X", vec![KeyType::Ipv4Addr], None)
        };
        let affinity = set_attributes("kube-proxy".into(), &spec);
        assert!(affinity.contains(&SetAttribute::Flags(SetFlags::Timeout | SetFlags::Eval)), "{affinity:?}");
        let plain = set_attributes("kube-proxy".into(), &SetSpec::set("cluster-ips", vec![KeyType::Ipv4Addr], None));
        assert!(plain.contains(&SetAttribute::Flags(SetFlags::empty())), "{plain:?}");
    }

    /// The kernel's view of `nft -f`'s `map eps { typeof ip daddr . meta
    /// l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; }`
    /// (a set dump): map flag only, key ipv4_addr . inet_proto . inet_service
    /// . integer (16 bytes), data ipv4_addr . inet_service (8 bytes).
    #[test]
    fn a_data_map_is_defined_as_nft_defines_it_and_its_elements_carry_data() {
        use crate::msgs::nftables::{example_endpoint, example_endpoints_map};
        let spec = example_endpoints_map(IpFamily::V4);
        let attrs = set_attributes("kube-proxy".into(), &spec);
        for want in [
            SetAttribute::Flags(SetFlags::Map),
            SetAttribute::KeyType(0x001c_c344),
            SetAttribute::KeyLen(16),
            SetAttribute::DataType(0x1cd),
            SetAttribute::DataLen(8),
        ] {
            assert!(attrs.contains(&want), "{want:?} in {attrs:?}");
        }
        let e = example_endpoint("10.96.0.1", "10.0.0.2");
        let ListAttribute::Element(attrs) = element(&e).unwrap() else { panic!("an element") };
        let slot = 1u32.to_ne_bytes();
        let key = [&[10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0][..], &slot[..]].concat();
        assert_eq!(attrs[0], SetElementAttribute::Key(DataAttribute::Value(key)));
        assert_eq!(attrs[1], SetElementAttribute::Data(DataAttribute::Value(vec![10, 0, 0, 2, 0x1f, 0x90, 0, 0])));
    }

    #[test]
    fn comments_are_libnftnl_user_data() {
        assert_eq!(comment_udata(UDATA_TABLE_COMMENT, "ab"), [0, 3, b'a', b'b', 0]);
    }

    /// A rule's anonymous sets come before it, created without an ack; the
    /// other messages carry their op's flags, no op asks an ack.
    #[test]
    fn a_rules_anonymous_sets_come_first_and_no_op_asks_an_ack() {
        use crate::msgs::nftables::{Expr, Rule};
        let rule = Rule::new(vec![Expr::NumgenVmap(vec![Verdict::Goto("a".into()), Verdict::Goto("b".into())])]);
        let ops = [
            NftOp::AddChain { name: "s".into(), base: None, comment: None },
            NftOp::AddRule { chain: "s".into(), rule },
            NftOp::FlushChain("s".into()),
        ];
        let reqs = requests(IpFamily::V4, "kube-proxy", &ops, &mut 0).unwrap();
        let shape: Vec<(usize, u16)> = reqs.iter().map(|r| (r.op, r.flags)).collect();
        let (create, append) = (NLM_F_CREATE, NLM_F_APPEND);
        assert_eq!(shape, [(0, create), (1, create), (1, create), (1, create | append), (2, 0)]);
    }
}
