//! The ip_set nfnetlink codec (the kernel's ipsets, as the `ipset` tool
//! programs them): the pure builders of the requests IPVS mode sends
//! (protocol and type queries, create, destroy, header, list, add, del) and
//! the readers of the kernel's replies. No crate types this subsystem, so
//! the messages are ours, on `netlink-packet-core`'s attribute traits and
//! `netlink-packet-netfilter`'s [`NetfilterHeader`] for the `nfgenmsg`.
//!
//! Nothing here does I/O; [`super::netlink::NetlinkIpset`] sends what these
//! functions build.
//!
//! Wire format, from `include/uapi/linux/netfilter/ipset/ip_set.h` and
//! what the kernel (6.18) and the `ipset` tool (7.17) exchange:
//! - socket protocol `NETLINK_NETFILTER` (12); the message type is
//!   `NFNL_SUBSYS_IPSET (6) << 8 | IPSET_CMD_*`; the `nfgenmsg` is
//!   `AF_INET`, `NFNETLINK_V0`, `res_id` 0 for every command (the set's own
//!   family travels in `IPSET_ATTR_FAMILY`);
//! - every message starts with `IPSET_ATTR_PROTOCOL` (a `u8`): the kernel
//!   refuses one below `IPSET_PROTOCOL_MIN` (6); `IPSET_CMD_PROTOCOL` asks
//!   the kernel's (7 since Linux 5.5, and its minimum);
//! - `IPSET_CMD_TYPE` (type name, family) answers the revisions of a set
//!   type the kernel has (`IPSET_ATTR_REVISION` the highest,
//!   `IPSET_ATTR_REVISION_MIN` the lowest); `CREATE` must name one;
//! - numbers inside `IPSET_ATTR_DATA` are big-endian and flagged
//!   `NLA_F_NET_BYTEORDER`; an address is a nest (`IPSET_ATTR_IP`, `_IP2`)
//!   holding `IPSET_ATTR_IPADDR_IPV4` or `_IPV6`;
//! - `IPSET_ATTR_DATA` holds the set's parameters in `CREATE` and in a
//!   listing's header, and one member in `ADD`/`DEL`: the two use the same
//!   attribute numbers for different things (18 is `HASHSIZE` in one and
//!   `NAME` in the other), so the command says which is meant; a listing's
//!   members come in `IPSET_ATTR_ADT`, one `IPSET_ATTR_DATA` nest each;
//! - `ADD`, `DEL` and `CREATE` without `NLM_F_EXCL` are the tool's
//!   `-exist`: adding a member that is there, deleting one that is not,
//!   and creating a set that exists with the same parameters succeed;
//! - `LIST` is a dump (`NLM_F_DUMP`) answered with `IPSET_CMD_LIST`
//!   messages (`NLM_F_MULTI`) then `NLMSG_DONE`; the first carries the
//!   header, each carries members in `IPSET_ATTR_ADT`; with
//!   `IPSET_ATTR_FLAGS` = `IPSET_FLAG_LIST_HEADER` only the header comes;
//! - refusals are negated errnos in the ack, `ENOENT` for a missing set
//!   and ipset's own codes from 4096 up ([`error_message`]).
//!
//! The requests are byte for byte those of the `ipset` tool (7.17,
//! libipset); the tests compare them with its captures.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla,
    NlaBuffer, NlasIterator, Parseable, ParseableParametrized, NLA_F_NESTED, NLA_F_NET_BYTEORDER, NLM_F_ACK,
    NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};

use crate::msgs::{IpsetOp, SetEntry, SetSpec, SetType};
use crate::net::{IpFamily, Protocol};

/// `NFNL_SUBSYS_IPSET`.
pub const NFNL_SUBSYS_IPSET: u8 = 6;
/// `IPSET_PROTOCOL`: the newest protocol we speak.
pub const IPSET_PROTOCOL: u8 = 7;
/// `IPSET_PROTOCOL_MIN`: the oldest the kernel accepts.
pub const IPSET_PROTOCOL_MIN: u8 = 6;
/// `IPSET_MAXNAMELEN` (32) less the terminating NUL.
pub const NAME_MAX_LEN: usize = 31;
/// `NFNETLINK_V0`.
const NFNETLINK_V0: u8 = 0;

/// `NFPROTO_UNSPEC`, `NFPROTO_IPV4`, `NFPROTO_IPV6`: `IPSET_ATTR_FAMILY`.
pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// Attributes at command level.
const ATTR_PROTOCOL: u16 = 1;
const ATTR_SETNAME: u16 = 2;
const ATTR_TYPENAME: u16 = 3;
const ATTR_REVISION: u16 = 4;
const ATTR_FAMILY: u16 = 5;
const ATTR_FLAGS: u16 = 6;
const ATTR_DATA: u16 = 7;
const ATTR_ADT: u16 = 8;
const ATTR_LINENO: u16 = 9;
/// `IPSET_ATTR_PROTOCOL_MIN`, also `IPSET_ATTR_REVISION_MIN`.
const ATTR_MIN: u16 = 10;
const ATTR_INDEX: u16 = 11;

// Attributes in IPSET_ATTR_DATA: a member's (CADT and ADT).
const ATTR_IP: u16 = 1;
const ATTR_PORT: u16 = 4;
const ATTR_PORT_TO: u16 = 5;
const ATTR_PROTO: u16 = 7;
const ATTR_CADT_FLAGS: u16 = 8;
const ATTR_CADT_LINENO: u16 = 9;
const ATTR_IP2: u16 = 20;
const ATTR_CIDR2: u16 = 21;
// ... and a set's (create-only and kernel-only).
const ATTR_HASHSIZE: u16 = 18;
const ATTR_MAXELEM: u16 = 19;
const ATTR_ELEMENTS: u16 = 24;
const ATTR_REFERENCES: u16 = 25;
const ATTR_MEMSIZE: u16 = 26;

// In IPSET_ATTR_IP / IPSET_ATTR_IP2.
const ATTR_IPADDR_IPV4: u16 = 1;
const ATTR_IPADDR_IPV6: u16 = 2;

/// `IPSET_FLAG_LIST_HEADER`: a listing without members.
pub const IPSET_FLAG_LIST_HEADER: u32 = 1 << 2;
/// `IPSET_FLAG_NOMATCH`, in a member's `IPSET_ATTR_CADT_FLAGS`.
pub const IPSET_FLAG_NOMATCH: u32 = 1 << 2;

/// The command of an ip_set message (`enum ipset_cmd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpsetCommand {
    Protocol,
    Create,
    Destroy,
    Flush,
    List,
    Save,
    Add,
    Del,
    Test,
    Header,
    Type,
    Other(u8),
}

impl From<IpsetCommand> for u8 {
    fn from(c: IpsetCommand) -> u8 {
        match c {
            IpsetCommand::Protocol => 1,
            IpsetCommand::Create => 2,
            IpsetCommand::Destroy => 3,
            IpsetCommand::Flush => 4,
            IpsetCommand::List => 7,
            IpsetCommand::Save => 8,
            IpsetCommand::Add => 9,
            IpsetCommand::Del => 10,
            IpsetCommand::Test => 11,
            IpsetCommand::Header => 12,
            IpsetCommand::Type => 13,
            IpsetCommand::Other(n) => n,
        }
    }
}

impl From<u8> for IpsetCommand {
    fn from(n: u8) -> IpsetCommand {
        match n {
            1 => IpsetCommand::Protocol,
            2 => IpsetCommand::Create,
            3 => IpsetCommand::Destroy,
            4 => IpsetCommand::Flush,
            7 => IpsetCommand::List,
            8 => IpsetCommand::Save,
            9 => IpsetCommand::Add,
            10 => IpsetCommand::Del,
            11 => IpsetCommand::Test,
            12 => IpsetCommand::Header,
            13 => IpsetCommand::Type,
            n => IpsetCommand::Other(n),
        }
    }
}

impl IpsetCommand {
    /// Whether `IPSET_ATTR_DATA` holds a member (else a set's parameters).
    fn data_is_member(self) -> bool {
        matches!(self, IpsetCommand::Add | IpsetCommand::Del | IpsetCommand::Test)
    }
}

/// An attribute at command level; the ones we do not read stay as they came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpsetAttr {
    Protocol(u8),
    SetName(String),
    TypeName(String),
    Revision(u8),
    Family(u8),
    Flags(u32),
    /// `IPSET_ATTR_DATA` of `CREATE` and of a listing's header.
    SetData(Vec<SetDataAttr>),
    /// `IPSET_ATTR_DATA` of `ADD`/`DEL`: one member.
    Member(Vec<MemberAttr>),
    /// `IPSET_ATTR_ADT` of a listing: one `IPSET_ATTR_DATA` per member.
    Members(Vec<Vec<MemberAttr>>),
    Lineno(u32),
    /// `IPSET_ATTR_PROTOCOL_MIN` / `IPSET_ATTR_REVISION_MIN`.
    Min(u8),
    Index(u16),
    Other(DefaultNla),
}

/// An attribute of a set's parameters (`CREATE`, a listing's header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetDataAttr {
    HashSize(u32),
    MaxElem(u32),
    PortFrom(u16),
    PortTo(u16),
    /// The member count (kernel-only).
    Elements(u32),
    References(u32),
    MemSize(u32),
    Other(DefaultNla),
}

/// An attribute of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberAttr {
    Ip(IpAddr),
    Port(u16),
    Proto(u8),
    Ip2(IpAddr),
    Cidr2(u8),
    CadtFlags(u32),
    Lineno(u32),
    Other(DefaultNla),
}

fn string_len(s: &str) -> usize {
    s.len() + 1
}

fn emit_string(buf: &mut [u8], s: &str) {
    buf[..s.len()].copy_from_slice(s.as_bytes());
    buf[s.len()] = 0;
}

/// The attributes' bytes, back to back (each padded to 4).
fn nested_len<N: Nla>(attrs: &[N]) -> usize {
    attrs.buffer_len()
}

impl Nla for IpsetAttr {
    fn value_len(&self) -> usize {
        match self {
            IpsetAttr::Protocol(_) | IpsetAttr::Revision(_) | IpsetAttr::Family(_) | IpsetAttr::Min(_) => 1,
            IpsetAttr::SetName(s) | IpsetAttr::TypeName(s) => string_len(s),
            IpsetAttr::Flags(_) | IpsetAttr::Lineno(_) => 4,
            IpsetAttr::Index(_) => 2,
            IpsetAttr::SetData(attrs) => nested_len(attrs),
            IpsetAttr::Member(attrs) => nested_len(attrs),
            IpsetAttr::Members(members) => members.iter().map(|m| MemberNest(m.as_slice()).buffer_len()).sum(),
            IpsetAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            IpsetAttr::Protocol(_) => ATTR_PROTOCOL,
            IpsetAttr::SetName(_) => ATTR_SETNAME,
            IpsetAttr::TypeName(_) => ATTR_TYPENAME,
            IpsetAttr::Revision(_) => ATTR_REVISION,
            IpsetAttr::Family(_) => ATTR_FAMILY,
            IpsetAttr::Flags(_) => ATTR_FLAGS | NLA_F_NET_BYTEORDER,
            IpsetAttr::SetData(_) | IpsetAttr::Member(_) => ATTR_DATA | NLA_F_NESTED,
            IpsetAttr::Members(_) => ATTR_ADT | NLA_F_NESTED,
            IpsetAttr::Lineno(_) => ATTR_LINENO | NLA_F_NET_BYTEORDER,
            IpsetAttr::Min(_) => ATTR_MIN,
            IpsetAttr::Index(_) => ATTR_INDEX | NLA_F_NET_BYTEORDER,
            IpsetAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            IpsetAttr::Protocol(v) | IpsetAttr::Revision(v) | IpsetAttr::Family(v) | IpsetAttr::Min(v) => buf[0] = *v,
            IpsetAttr::SetName(s) | IpsetAttr::TypeName(s) => emit_string(buf, s),
            IpsetAttr::Flags(v) | IpsetAttr::Lineno(v) => buf[..4].copy_from_slice(&v.to_be_bytes()),
            IpsetAttr::Index(v) => buf[..2].copy_from_slice(&v.to_be_bytes()),
            IpsetAttr::SetData(attrs) => attrs.as_slice().emit(buf),
            IpsetAttr::Member(attrs) => attrs.as_slice().emit(buf),
            IpsetAttr::Members(members) => {
                let nests: Vec<MemberNest<'_>> = members.iter().map(|m| MemberNest(m.as_slice())).collect();
                nests.as_slice().emit(buf);
            }
            IpsetAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

/// One member's `IPSET_ATTR_DATA` nest inside `IPSET_ATTR_ADT`.
struct MemberNest<'a>(&'a [MemberAttr]);

impl Nla for MemberNest<'_> {
    fn value_len(&self) -> usize {
        self.0.buffer_len()
    }

    fn kind(&self) -> u16 {
        ATTR_DATA | NLA_F_NESTED
    }

    fn emit_value(&self, buf: &mut [u8]) {
        self.0.emit(buf)
    }
}

impl Nla for SetDataAttr {
    fn value_len(&self) -> usize {
        match self {
            SetDataAttr::PortFrom(_) | SetDataAttr::PortTo(_) => 2,
            SetDataAttr::Other(nla) => nla.value_len(),
            _ => 4,
        }
    }

    fn kind(&self) -> u16 {
        let kind = match self {
            SetDataAttr::HashSize(_) => ATTR_HASHSIZE,
            SetDataAttr::MaxElem(_) => ATTR_MAXELEM,
            SetDataAttr::PortFrom(_) => ATTR_PORT,
            SetDataAttr::PortTo(_) => ATTR_PORT_TO,
            SetDataAttr::Elements(_) => ATTR_ELEMENTS,
            SetDataAttr::References(_) => ATTR_REFERENCES,
            SetDataAttr::MemSize(_) => ATTR_MEMSIZE,
            SetDataAttr::Other(nla) => return nla.kind(),
        };
        kind | NLA_F_NET_BYTEORDER
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            SetDataAttr::HashSize(v)
            | SetDataAttr::MaxElem(v)
            | SetDataAttr::Elements(v)
            | SetDataAttr::References(v)
            | SetDataAttr::MemSize(v) => buf[..4].copy_from_slice(&v.to_be_bytes()),
            SetDataAttr::PortFrom(v) | SetDataAttr::PortTo(v) => buf[..2].copy_from_slice(&v.to_be_bytes()),
            SetDataAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

/// An address inside `IPSET_ATTR_IP`/`_IP2`.
struct AddrNla(IpAddr);

impl Nla for AddrNla {
    fn value_len(&self) -> usize {
        match self.0 {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 16,
        }
    }

    fn kind(&self) -> u16 {
        match self.0 {
            IpAddr::V4(_) => ATTR_IPADDR_IPV4 | NLA_F_NET_BYTEORDER,
            IpAddr::V6(_) => ATTR_IPADDR_IPV6 | NLA_F_NET_BYTEORDER,
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self.0 {
            IpAddr::V4(a) => buf[..4].copy_from_slice(&a.octets()),
            IpAddr::V6(a) => buf[..16].copy_from_slice(&a.octets()),
        }
    }
}

impl Nla for MemberAttr {
    fn value_len(&self) -> usize {
        match self {
            MemberAttr::Ip(a) | MemberAttr::Ip2(a) => AddrNla(*a).buffer_len(),
            MemberAttr::Port(_) => 2,
            MemberAttr::Proto(_) | MemberAttr::Cidr2(_) => 1,
            MemberAttr::CadtFlags(_) | MemberAttr::Lineno(_) => 4,
            MemberAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            MemberAttr::Ip(_) => ATTR_IP | NLA_F_NESTED,
            MemberAttr::Ip2(_) => ATTR_IP2 | NLA_F_NESTED,
            MemberAttr::Port(_) => ATTR_PORT | NLA_F_NET_BYTEORDER,
            MemberAttr::Proto(_) => ATTR_PROTO,
            MemberAttr::Cidr2(_) => ATTR_CIDR2,
            MemberAttr::CadtFlags(_) => ATTR_CADT_FLAGS | NLA_F_NET_BYTEORDER,
            MemberAttr::Lineno(_) => ATTR_CADT_LINENO | NLA_F_NET_BYTEORDER,
            MemberAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            MemberAttr::Ip(a) | MemberAttr::Ip2(a) => AddrNla(*a).emit(buf),
            MemberAttr::Port(p) => buf[..2].copy_from_slice(&p.to_be_bytes()),
            MemberAttr::Proto(v) | MemberAttr::Cidr2(v) => buf[0] = *v,
            MemberAttr::CadtFlags(v) | MemberAttr::Lineno(v) => buf[..4].copy_from_slice(&v.to_be_bytes()),
            MemberAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

// ------------------------------------------------------------------ parsing

fn fixed<const N: usize>(value: &[u8], what: &str) -> Result<[u8; N], DecodeError> {
    value.try_into().map_err(|_| DecodeError::from(format!("{what}: {} bytes, not {N}", value.len())))
}

fn u8_of(value: &[u8], what: &str) -> Result<u8, DecodeError> {
    Ok(fixed::<1>(value, what)?[0])
}

fn be16(value: &[u8], what: &str) -> Result<u16, DecodeError> {
    Ok(u16::from_be_bytes(fixed(value, what)?))
}

fn be32(value: &[u8], what: &str) -> Result<u32, DecodeError> {
    Ok(u32::from_be_bytes(fixed(value, what)?))
}

/// An `NLA_NUL_STRING`: up to the first NUL.
fn nul_string(value: &[u8], what: &str) -> Result<String, DecodeError> {
    let end = value.iter().position(|&b| b == 0).ok_or_else(|| format!("{what} without its NUL"))?;
    let s = std::str::from_utf8(&value[..end]).map_err(|e| format!("{what}: {e}"))?;
    Ok(s.to_string())
}

/// The address in an `IPSET_ATTR_IP`/`_IP2` nest.
fn addr_of(value: &[u8], what: &str) -> Result<IpAddr, DecodeError> {
    for nla in NlasIterator::new(value) {
        let nla = nla?;
        match nla.kind() {
            ATTR_IPADDR_IPV4 => return Ok(IpAddr::V4(Ipv4Addr::from(fixed::<4>(nla.value(), what)?))),
            ATTR_IPADDR_IPV6 => return Ok(IpAddr::V6(Ipv6Addr::from(fixed::<16>(nla.value(), what)?))),
            _ => {}
        }
    }
    Err(format!("{what} without an address").into())
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for MemberAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<MemberAttr, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            ATTR_IP => MemberAttr::Ip(addr_of(value, "IPSET_ATTR_IP")?),
            ATTR_IP2 => MemberAttr::Ip2(addr_of(value, "IPSET_ATTR_IP2")?),
            ATTR_PORT => MemberAttr::Port(be16(value, "IPSET_ATTR_PORT")?),
            ATTR_PROTO => MemberAttr::Proto(u8_of(value, "IPSET_ATTR_PROTO")?),
            ATTR_CIDR2 => MemberAttr::Cidr2(u8_of(value, "IPSET_ATTR_CIDR2")?),
            ATTR_CADT_FLAGS => MemberAttr::CadtFlags(be32(value, "IPSET_ATTR_CADT_FLAGS")?),
            ATTR_CADT_LINENO => MemberAttr::Lineno(be32(value, "IPSET_ATTR_LINENO")?),
            _ => MemberAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for SetDataAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<SetDataAttr, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            ATTR_HASHSIZE => SetDataAttr::HashSize(be32(value, "IPSET_ATTR_HASHSIZE")?),
            ATTR_MAXELEM => SetDataAttr::MaxElem(be32(value, "IPSET_ATTR_MAXELEM")?),
            ATTR_PORT => SetDataAttr::PortFrom(be16(value, "IPSET_ATTR_PORT_FROM")?),
            ATTR_PORT_TO => SetDataAttr::PortTo(be16(value, "IPSET_ATTR_PORT_TO")?),
            ATTR_ELEMENTS => SetDataAttr::Elements(be32(value, "IPSET_ATTR_ELEMENTS")?),
            ATTR_REFERENCES => SetDataAttr::References(be32(value, "IPSET_ATTR_REFERENCES")?),
            ATTR_MEMSIZE => SetDataAttr::MemSize(be32(value, "IPSET_ATTR_MEMSIZE")?),
            _ => SetDataAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

fn parse_nested<A>(value: &[u8]) -> Result<Vec<A>, DecodeError>
where
    A: for<'b> Parseable<NlaBuffer<&'b [u8]>>,
{
    NlasIterator::new(value).map(|nla| A::parse(&nla?)).collect()
}

impl<'a, T: AsRef<[u8]> + ?Sized> ParseableParametrized<NlaBuffer<&'a T>, IpsetCommand> for IpsetAttr {
    fn parse_with_param(buf: &NlaBuffer<&'a T>, command: IpsetCommand) -> Result<IpsetAttr, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            ATTR_PROTOCOL => IpsetAttr::Protocol(u8_of(value, "IPSET_ATTR_PROTOCOL")?),
            ATTR_SETNAME => IpsetAttr::SetName(nul_string(value, "IPSET_ATTR_SETNAME")?),
            ATTR_TYPENAME => IpsetAttr::TypeName(nul_string(value, "IPSET_ATTR_TYPENAME")?),
            ATTR_REVISION => IpsetAttr::Revision(u8_of(value, "IPSET_ATTR_REVISION")?),
            ATTR_FAMILY => IpsetAttr::Family(u8_of(value, "IPSET_ATTR_FAMILY")?),
            ATTR_FLAGS => IpsetAttr::Flags(be32(value, "IPSET_ATTR_FLAGS")?),
            ATTR_DATA if command.data_is_member() => IpsetAttr::Member(parse_nested(value)?),
            ATTR_DATA => IpsetAttr::SetData(parse_nested(value)?),
            ATTR_ADT => {
                let mut members = Vec::new();
                for nla in NlasIterator::new(value) {
                    let nla = nla?;
                    if nla.kind() == ATTR_DATA {
                        members.push(parse_nested(nla.value())?);
                    }
                }
                IpsetAttr::Members(members)
            }
            ATTR_LINENO => IpsetAttr::Lineno(be32(value, "IPSET_ATTR_LINENO")?),
            ATTR_MIN => IpsetAttr::Min(u8_of(value, "IPSET_ATTR_PROTOCOL_MIN")?),
            ATTR_INDEX => IpsetAttr::Index(be16(value, "IPSET_ATTR_INDEX")?),
            _ => IpsetAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An ip_set message: the `nfgenmsg`, the command, the attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsetMessage {
    pub header: NetfilterHeader,
    pub command: IpsetCommand,
    pub attrs: Vec<IpsetAttr>,
}

impl IpsetMessage {
    /// A request as libipset sends every one: `AF_INET`, `NFNETLINK_V0`,
    /// the protocol first.
    pub fn request(command: IpsetCommand, protocol: u8, mut attrs: Vec<IpsetAttr>) -> IpsetMessage {
        attrs.insert(0, IpsetAttr::Protocol(protocol));
        IpsetMessage { header: NetfilterHeader::new(NetfilterProtoFamily::IPv4, NFNETLINK_V0, 0), command, attrs }
    }
}

crate::kernel::netlink::nfnl_message!(IpsetMessage, NFNL_SUBSYS_IPSET);

impl ParseableParametrized<[u8], u16> for IpsetMessage {
    fn parse_with_param(buf: &[u8], message_type: u16) -> Result<IpsetMessage, DecodeError> {
        if (message_type >> 8) as u8 != NFNL_SUBSYS_IPSET {
            return Err(format!("message type {message_type:#06x} is not an ip_set message").into());
        }
        let command = IpsetCommand::from(message_type as u8);
        let header = NetfilterHeader::parse(buf)?;
        let rest = buf.get(header.buffer_len()..).unwrap_or_default();
        let attrs = NlasIterator::new(rest)
            .map(|nla| IpsetAttr::parse_with_param(&nla?, command))
            .collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(IpsetMessage { header, command, attrs })
    }
}

impl NetlinkDeserializable for IpsetMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<IpsetMessage, DecodeError> {
        IpsetMessage::parse_with_param(payload, header.message_type)
    }
}

/// Parses a netlink payload of type `message_type` as an ip_set message;
/// anything of another subsystem is an error.
pub fn parse(message_type: u16, payload: &[u8]) -> Result<IpsetMessage, DecodeError> {
    IpsetMessage::parse_with_param(payload, message_type)
}

// ----------------------------------------------------------------- builders

/// Why a name cannot be a set's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("ipset names are not empty")]
    Empty,
    #[error("ipset name {0:?} is longer than {NAME_MAX_LEN} bytes")]
    TooLong(String),
    #[error("ipset name {0:?} holds a NUL")]
    Nul(String),
}

/// Checks a set name before it goes to the kernel (which refuses a long one).
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        Err(NameError::Empty)
    } else if name.len() > NAME_MAX_LEN {
        Err(NameError::TooLong(name.to_string()))
    } else if name.contains('\0') {
        Err(NameError::Nul(name.to_string()))
    } else {
        Ok(())
    }
}

/// The `IPSET_ATTR_FAMILY` of a set: a bitmap:port set has none
/// (`NFPROTO_UNSPEC`), as the tool sends it.
pub fn set_family(spec: &SetSpec) -> u8 {
    match (spec.set_type, spec.family) {
        (SetType::BitmapPort, _) => NFPROTO_UNSPEC,
        (_, IpFamily::V4) => NFPROTO_IPV4,
        (_, IpFamily::V6) => NFPROTO_IPV6,
    }
}

/// The tool's name for a family number (`inet`, `inet6`, `unspec`).
pub fn family_name(family: u8) -> String {
    match family {
        NFPROTO_IPV4 => "inet".into(),
        NFPROTO_IPV6 => "inet6".into(),
        NFPROTO_UNSPEC => "unspec".into(),
        n => format!("family {n}"),
    }
}

/// Asks the kernel's protocol range. Sent with the oldest protocol, which
/// every kernel since ip_set went to netlink accepts.
pub fn protocol_request() -> IpsetMessage {
    IpsetMessage::request(IpsetCommand::Protocol, IPSET_PROTOCOL_MIN, Vec::new())
}

/// Asks the revisions of a set type the kernel has (`IPSET_CMD_TYPE`).
pub fn type_request(protocol: u8, type_name: &str, family: u8) -> IpsetMessage {
    IpsetMessage::request(
        IpsetCommand::Type,
        protocol,
        vec![IpsetAttr::TypeName(type_name.to_string()), IpsetAttr::Family(family)],
    )
}

/// Creates `spec` with upstream's parameters at `revision` (`ipset create
/// ... -exist`: [`request_flags`] sends no `NLM_F_EXCL`).
pub fn create_request(protocol: u8, spec: &SetSpec, revision: u8) -> IpsetMessage {
    let data = match spec.set_type {
        SetType::BitmapPort => vec![SetDataAttr::PortFrom(0), SetDataAttr::PortTo(65535)],
        _ => vec![SetDataAttr::HashSize(1024), SetDataAttr::MaxElem(65536)],
    };
    IpsetMessage::request(
        IpsetCommand::Create,
        protocol,
        vec![
            IpsetAttr::SetName(spec.name.clone()),
            IpsetAttr::TypeName(spec.set_type.as_str().to_string()),
            IpsetAttr::Revision(revision),
            IpsetAttr::Family(set_family(spec)),
            IpsetAttr::SetData(data),
        ],
    )
}

/// Destroys the set `name` (`ipset destroy NAME`).
pub fn destroy_request(protocol: u8, name: &str) -> IpsetMessage {
    IpsetMessage::request(IpsetCommand::Destroy, protocol, vec![IpsetAttr::SetName(name.to_string())])
}

/// Asks the type, family and revision of the set `name` (`IPSET_CMD_HEADER`).
pub fn header_request(protocol: u8, name: &str) -> IpsetMessage {
    IpsetMessage::request(IpsetCommand::Header, protocol, vec![IpsetAttr::SetName(name.to_string())])
}

/// Lists the set `name`: with its members (`ipset list NAME`), or its
/// header alone (`ipset list -t NAME`).
pub fn list_request(protocol: u8, name: &str, header_only: bool) -> IpsetMessage {
    let mut attrs = vec![IpsetAttr::SetName(name.to_string())];
    if header_only {
        attrs.push(IpsetAttr::Flags(IPSET_FLAG_LIST_HEADER));
    }
    IpsetMessage::request(IpsetCommand::List, protocol, attrs)
}

/// Adds or deletes one member of `set` (`ipset add|del SET ENTRY -exist`).
pub fn op_request(protocol: u8, set: &str, op: &IpsetOp) -> IpsetMessage {
    let (command, entry) = match op {
        IpsetOp::Add(e) => (IpsetCommand::Add, e),
        IpsetOp::Del(e) => (IpsetCommand::Del, e),
    };
    IpsetMessage::request(
        command,
        protocol,
        vec![IpsetAttr::SetName(set.to_string()), IpsetAttr::Member(member_attrs(entry))],
    )
}

/// A member's attributes, in the tool's order (address, port, protocol,
/// second address, its prefix, line number 0). A host net's prefix is left
/// out, as the tool does: the kernel's default is the host prefix.
pub fn member_attrs(entry: &SetEntry) -> Vec<MemberAttr> {
    let mut attrs = match *entry {
        SetEntry::Ip(ip) => vec![MemberAttr::Ip(ip)],
        SetEntry::Port(port) => vec![MemberAttr::Port(port)],
        SetEntry::IpPort(ip, proto, port) => {
            vec![MemberAttr::Ip(ip), MemberAttr::Port(port), MemberAttr::Proto(proto.number())]
        }
        SetEntry::IpPortIp(ip, proto, port, ip2) => {
            vec![MemberAttr::Ip(ip), MemberAttr::Port(port), MemberAttr::Proto(proto.number()), MemberAttr::Ip2(ip2)]
        }
        SetEntry::IpPortNet(ip, proto, port, net) => {
            let mut v = vec![
                MemberAttr::Ip(ip),
                MemberAttr::Port(port),
                MemberAttr::Proto(proto.number()),
                MemberAttr::Ip2(net.network()),
            ];
            if net.prefix_len() != net.max_prefix_len() {
                v.push(MemberAttr::Cidr2(net.prefix_len()));
            }
            v
        }
    };
    attrs.push(MemberAttr::Lineno(0));
    attrs
}

/// The netlink flags of a request. Queries ask for no ack (their answer
/// ends the request); commands do; a listing is a dump. No `NLM_F_EXCL`
/// anywhere but `DESTROY` (where the kernel ignores it; the tool sends
/// it): add, del and create are idempotent.
pub fn request_flags(msg: &IpsetMessage) -> u16 {
    match msg.command {
        IpsetCommand::Protocol | IpsetCommand::Type | IpsetCommand::Header => NLM_F_REQUEST,
        IpsetCommand::Create => NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        IpsetCommand::Destroy => NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL,
        IpsetCommand::List | IpsetCommand::Save => NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP,
        _ => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// The request as a whole netlink message (sequence number 0: the
/// connection numbers what it sends).
pub fn netlink_request(msg: IpsetMessage) -> NetlinkMessage<IpsetMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = request_flags(&msg);
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    nl
}

// ------------------------------------------------------------------ readers

/// A protocol range, from an `IPSET_CMD_PROTOCOL` or `IPSET_CMD_TYPE` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub min: u8,
    pub max: u8,
}

/// What an answer lacks that it must carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The attribute an answer must have.
    #[error("no {0}")]
    Missing(&'static str),
    /// The attribute a set's header must have.
    #[error("a header without {0}")]
    HeaderWithout(&'static str),
    #[error("no answer")]
    NoAnswer,
    #[error("a listing without the set's header")]
    NoHeader,
}

/// The kernel's protocol range from its `IPSET_CMD_PROTOCOL` answer (a
/// kernel that predates `IPSET_ATTR_PROTOCOL_MIN` speaks only its one).
pub fn protocol_range(msg: &IpsetMessage) -> Result<Range, Unusable> {
    let mut max = None;
    let mut min = None;
    for a in &msg.attrs {
        match a {
            IpsetAttr::Protocol(p) => max = Some(*p),
            IpsetAttr::Min(p) => min = Some(*p),
            _ => {}
        }
    }
    let max = max.ok_or(Unusable::Missing("IPSET_ATTR_PROTOCOL"))?;
    Ok(Range { min: min.unwrap_or(max), max })
}

/// A set type's revision range from the kernel's `IPSET_CMD_TYPE` answer.
pub fn revision_range(msg: &IpsetMessage) -> Result<Range, Unusable> {
    let mut max = None;
    let mut min = None;
    for a in &msg.attrs {
        match a {
            IpsetAttr::Revision(r) => max = Some(*r),
            IpsetAttr::Min(r) => min = Some(*r),
            _ => {}
        }
    }
    let max = max.ok_or(Unusable::Missing("IPSET_ATTR_REVISION"))?;
    Ok(Range { min: min.unwrap_or(max), max })
}

/// A set as the kernel describes it (`HEADER`, a listing's first message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetHeader {
    pub type_name: String,
    pub family: u8,
    pub revision: u8,
    /// The member count (listings only).
    pub elements: Option<u32>,
}

/// The header in a `HEADER` answer or a listing's message; `None` for a
/// listing's later messages (members only).
pub fn set_header(msg: &IpsetMessage) -> Result<Option<SetHeader>, Unusable> {
    let (mut type_name, mut family, mut revision, mut elements) = (None, None, None, None);
    for a in &msg.attrs {
        match a {
            IpsetAttr::TypeName(t) => type_name = Some(t.clone()),
            IpsetAttr::Family(f) => family = Some(*f),
            IpsetAttr::Revision(r) => revision = Some(*r),
            IpsetAttr::SetData(data) => {
                elements = data.iter().find_map(|d| if let SetDataAttr::Elements(n) = d { Some(*n) } else { None })
            }
            _ => {}
        }
    }
    let Some(type_name) = type_name else {
        return Ok(None);
    };
    Ok(Some(SetHeader {
        type_name,
        family: family.ok_or(Unusable::HeaderWithout("IPSET_ATTR_FAMILY"))?,
        revision: revision.ok_or(Unusable::HeaderWithout("IPSET_ATTR_REVISION"))?,
        elements,
    }))
}

/// The members in a listing's message, as their attributes.
pub fn listed_members(msg: &IpsetMessage) -> impl Iterator<Item = &[MemberAttr]> {
    msg.attrs
        .iter()
        .filter_map(|a| if let IpsetAttr::Members(m) = a { Some(m) } else { None })
        .flatten()
        .map(Vec::as_slice)
}

/// A listed member as a [`SetEntry`] of a set of type `t`; `None` for one
/// we cannot represent (another protocol, a `nomatch` member, a missing
/// part), which is left alone.
pub fn member_entry(t: SetType, attrs: &[MemberAttr]) -> Option<SetEntry> {
    let (mut ip, mut port, mut proto, mut ip2, mut cidr2) = (None, None, None, None, None);
    for a in attrs {
        match a {
            MemberAttr::Ip(a) => ip = Some(*a),
            MemberAttr::Port(p) => port = Some(*p),
            MemberAttr::Proto(p) => proto = Protocol::ALL.into_iter().find(|q| q.number() == *p).map(Some),
            MemberAttr::Ip2(a) => ip2 = Some(*a),
            MemberAttr::Cidr2(c) => cidr2 = Some(*c),
            MemberAttr::CadtFlags(f) if f & IPSET_FLAG_NOMATCH != 0 => return None,
            MemberAttr::CadtFlags(_) | MemberAttr::Lineno(_) | MemberAttr::Other(_) => {}
        }
    }
    // A protocol number we have no name for is `Some(None)`.
    let proto = || proto.flatten();
    Some(match t {
        SetType::HashIp => SetEntry::Ip(ip?),
        SetType::BitmapPort => SetEntry::Port(port?),
        SetType::HashIpPort => SetEntry::IpPort(ip?, proto()?, port?),
        SetType::HashIpPortIp => SetEntry::IpPortIp(ip?, proto()?, port?, ip2?),
        SetType::HashIpPortNet => {
            let ip2 = ip2?;
            let prefix = cidr2.unwrap_or(if ip2.is_ipv4() { 32 } else { 128 });
            SetEntry::IpPortNet(ip?, proto()?, port?, IpNet::new(ip2, prefix).ok()?)
        }
    })
}

/// What ipset's own error codes (4096 and up) mean, for a set of type `t`
/// (the codes from 4352 up are the type's own); `None` for a plain errno.
pub fn error_message(code: i32, t: Option<SetType>) -> Option<&'static str> {
    let bitmap = t == Some(SetType::BitmapPort);
    Some(match code {
        4097 => "the kernel refused the ipset protocol (a message it cannot read)",
        4098 => "the kernel has no such set type or revision (is its module available?)",
        4099 => "the kernel's maximum number of sets is reached",
        4100 => "the set is in use by a kernel component (an iptables rule or another set)",
        4101 => "the second set exists",
        4102 => "the sets are of different types",
        4103 => "it exists",
        4104 => "invalid CIDR prefix",
        4105 => "invalid netmask",
        4106 => "invalid family",
        4107 => "timeout support is not enabled in the set",
        4108 => "the set is referenced by another set",
        4109 => "an IPv4 address was expected",
        4110 => "an IPv6 address was expected",
        4111 => "counters are not enabled in the set",
        4112 => "comments are not enabled in the set",
        4113 => "invalid markmask",
        4114 => "skbinfo is not enabled in the set",
        4352 if bitmap => "the member is outside the set's range",
        4353 if bitmap => "the range is too large for the set type",
        4352 => "the set is full (maxelem reached)",
        4353 => "a null member cannot be stored",
        4354 => "invalid protocol",
        4355 => "the protocol is missing",
        4356 => "ranges are not supported by the set type",
        4357 => "invalid range",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLM_F_MULTIPART;

    use super::super::captures::*;
    use super::*;

    fn emit(msg: IpsetMessage) -> Vec<u8> {
        let nl = netlink_request(msg);
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    /// Our request with the sequence number of `captured` (the connection
    /// sets its own).
    fn as_captured(msg: IpsetMessage, captured: &[u8]) -> Vec<u8> {
        let mut bytes = emit(msg);
        bytes[8..12].copy_from_slice(&captured[8..12]);
        bytes
    }

    fn parse_captured(bytes: &[u8]) -> (NetlinkHeader, IpsetMessage) {
        let nl = NetlinkMessage::<IpsetMessage>::deserialize(bytes).expect("captured message parses");
        match nl.payload {
            NetlinkPayload::InnerMessage(m) => (nl.header, m),
            other => panic!("not an ip_set message: {other:?}"),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    fn spec(name: &str, set_type: SetType, family: IpFamily) -> SetSpec {
        SetSpec { name: name.into(), set_type, family, comment: "" }
    }

    fn members(t: SetType, listing: &[u8]) -> Vec<String> {
        let (_, msg) = parse_captured(listing);
        listed_members(&msg).map(|m| member_entry(t, m).expect("a member").to_string()).collect()
    }

    #[test]
    fn create_requests_match_the_ipset_tool() {
        let cluster_ip = spec("KUBE-CLUSTER-IP", SetType::HashIpPort, IpFamily::V4);
        assert_eq!(as_captured(create_request(7, &cluster_ip, 7), &CREATE_CLUSTER_IP), CREATE_CLUSTER_IP);
        let lb6 = spec("KUBE-6-LOAD-BALANCER", SetType::HashIpPort, IpFamily::V6);
        assert_eq!(as_captured(create_request(7, &lb6, 7), &CREATE_6_LOAD_BALANCER), CREATE_6_LOAD_BALANCER);
        // A bitmap:port set has no family, whichever proxier asks.
        let node_port = spec("KUBE-NODE-PORT-TCP", SetType::BitmapPort, IpFamily::V6);
        assert_eq!(as_captured(create_request(7, &node_port, 3), &CREATE_NODE_PORT_TCP), CREATE_NODE_PORT_TCP);
    }

    #[test]
    fn add_requests_match_the_ipset_tool() {
        let cases = [
            ("KUBE-CLUSTER-IP", SetEntry::IpPort(ip("10.96.0.10"), Protocol::Udp, 53), &ADD_CLUSTER_IP_DNS[..]),
            (
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                SetEntry::IpPortNet(ip("1.2.3.4"), Protocol::Tcp, 443, "10.0.0.0/8".parse().expect("net")),
                &ADD_SOURCE_CIDR[..],
            ),
            (
                "KUBE-LOAD-BALANCER-SOURCE-CIDR",
                SetEntry::IpPortNet(ip("1.2.3.4"), Protocol::Udp, 53, "10.1.2.3/32".parse().expect("net")),
                &ADD_SOURCE_HOST[..],
            ),
            ("KUBE-6-LOAD-BALANCER", SetEntry::IpPort(ip("fd00::a"), Protocol::Tcp, 80), &ADD_6_LOAD_BALANCER[..]),
            ("KUBE-NODE-PORT-TCP", SetEntry::Port(30080), &ADD_NODE_PORT[..]),
        ];
        for (set, entry, captured) in cases {
            assert_eq!(as_captured(op_request(7, set, &IpsetOp::Add(entry)), captured), captured, "{entry}");
        }
    }

    #[test]
    fn a_delete_is_the_add_with_the_del_command() {
        let dns = SetEntry::IpPort(ip("10.96.0.10"), Protocol::Udp, 53);
        let mut want = ADD_CLUSTER_IP_DNS.to_vec();
        want[4] = 0x0a; // IPSET_CMD_DEL
        assert_eq!(as_captured(op_request(7, "KUBE-CLUSTER-IP", &IpsetOp::Del(dns)), &want), want);
    }

    #[test]
    fn queries_listings_and_destroys_match_the_ipset_tool() {
        assert_eq!(as_captured(type_request(7, "hash:ip,port", NFPROTO_IPV4), &TYPE_ASKED), TYPE_ASKED);
        assert_eq!(as_captured(list_request(7, "KUBE-CLUSTER-IP", true), &LIST_HEADER_ASKED), LIST_HEADER_ASKED);
        let destroy = destroy_request(7, "KUBE-6-LOAD-BALANCER");
        assert_eq!(as_captured(destroy, &DESTROY_6_LOAD_BALANCER), DESTROY_6_LOAD_BALANCER);
        // Our protocol query says 6 where the tool says 7: the oldest
        // protocol, which old kernels (6 only) accept too.
        let mut want = PROTOCOL_ASKED.to_vec();
        want[24] = IPSET_PROTOCOL_MIN;
        assert_eq!(as_captured(protocol_request(), &want), want);
        let full = emit(list_request(7, "KUBE-CLUSTER-IP", false));
        assert_eq!(full.len(), LIST_HEADER_ASKED.len() - 8, "no flags without -t");
    }

    #[test]
    fn requests_parse_back_to_what_was_built() {
        let net = SetEntry::IpPortNet(ip("fd00::1"), Protocol::Sctp, 9, "2001:db8::/64".parse().expect("net"));
        for msg in [
            op_request(7, "KUBE-6-LOAD-BALANCER-SOURCE-CID", &IpsetOp::Del(net)),
            create_request(7, &spec("KUBE-6-CLUSTER-IP", SetType::HashIpPort, IpFamily::V6), 7),
            list_request(7, "KUBE-CLUSTER-IP", true),
            type_request(7, "hash:ip,port,ip", NFPROTO_IPV6),
            protocol_request(),
            destroy_request(7, "KUBE-NODE-PORT-UDP"),
        ] {
            let (_, parsed) = parse_captured(&emit(msg.clone()));
            assert_eq!(parsed, msg);
        }
    }

    #[test]
    fn reads_the_protocol_and_revision_ranges() {
        let (_, msg) = parse_captured(&PROTOCOL_ANSWER);
        assert_eq!(protocol_range(&msg), Ok(Range { min: 6, max: 7 }));
        let (_, msg) = parse_captured(&TYPE_ANSWER);
        assert_eq!(msg.command, IpsetCommand::Type);
        assert_eq!(revision_range(&msg), Ok(Range { min: 0, max: 7 }));
        // A kernel that predates the minimum speaks its one protocol.
        let old = IpsetMessage::request(IpsetCommand::Protocol, 6, Vec::new());
        assert_eq!(protocol_range(&old), Ok(Range { min: 6, max: 6 }));
        assert!(revision_range(&old).is_err());
    }

    #[test]
    fn reads_a_listing_header_and_its_members() {
        let (header, msg) = parse_captured(&LIST_HEADER_ANSWER);
        assert_eq!(header.flags, NLM_F_MULTIPART);
        let h = set_header(&msg).expect("a header").expect("the first message has it");
        assert_eq!(
            h,
            SetHeader { type_name: "hash:ip,port".into(), family: NFPROTO_IPV4, revision: 7, elements: Some(2) }
        );
        assert_eq!(listed_members(&msg).count(), 0, "-t lists no members");
        assert_eq!(members(SetType::HashIpPort, &LISTED_CLUSTER_IP), ["10.96.0.10,udp:53", "10.96.0.2,sctp:9"]);
        let (_, node_port) = parse_captured(&LISTED_NODE_PORT);
        let h = set_header(&node_port).expect("a header").expect("it has one");
        assert_eq!((h.type_name.as_str(), h.family, h.revision), ("bitmap:port", NFPROTO_UNSPEC, 3));
        assert_eq!(members(SetType::BitmapPort, &LISTED_NODE_PORT), ["30080"]);
    }

    #[test]
    fn reads_net_members_with_and_without_a_prefix() {
        assert_eq!(
            members(SetType::HashIpPortNet, &LISTED_SOURCE_CIDR),
            ["1.2.3.4,udp:53,10.1.2.3/32", "1.2.3.4,tcp:443,10.0.0.0/8"]
        );
    }

    #[test]
    fn listings_round_trip_to_the_same_bytes() {
        for captured in [&LISTED_CLUSTER_IP[..], &LISTED_NODE_PORT[..], &TYPE_ANSWER[..], &PROTOCOL_ANSWER[..]] {
            let nl = NetlinkMessage::<IpsetMessage>::deserialize(captured).expect("parses");
            let mut buf = vec![0; nl.buffer_len()];
            nl.serialize(&mut buf);
            // The kernel leaves NLA_F_NET_BYTEORDER off the addresses it
            // lists; we set it on the ones we send.
            let differ: Vec<usize> = (0..buf.len()).filter(|&i| buf[i] != captured[i]).collect();
            assert!(differ.iter().all(|&i| captured[i] == 0x00 && buf[i] == 0x40), "{differ:?}");
        }
    }

    #[test]
    fn members_we_cannot_represent_are_none() {
        let icmp = [MemberAttr::Ip(ip("10.0.0.1")), MemberAttr::Port(0x0800), MemberAttr::Proto(1)];
        assert_eq!(member_entry(SetType::HashIpPort, &icmp), None);
        let nomatch = [
            MemberAttr::Ip(ip("10.0.0.1")),
            MemberAttr::Port(80),
            MemberAttr::Proto(6),
            MemberAttr::Ip2(ip("10.0.0.0")),
            MemberAttr::Cidr2(8),
            MemberAttr::CadtFlags(IPSET_FLAG_NOMATCH),
        ];
        assert_eq!(member_entry(SetType::HashIpPortNet, &nomatch), None);
        assert_eq!(member_entry(SetType::HashIpPort, &[MemberAttr::Ip(ip("10.0.0.1"))]), None, "no port");
    }

    #[test]
    fn malformed_replies_are_errors() {
        let payload = &LISTED_CLUSTER_IP[16..];
        assert!(parse(0x0107, payload).is_err(), "another subsystem");
        let mut short = payload.to_vec();
        short[4] = 0x06; // IPSET_ATTR_PROTOCOL of 2 bytes
        assert!(parse(0x0607, &short).is_err());
        let mut unterminated = payload.to_vec();
        let name_end = 12 + 4 + "KUBE-CLUSTER-IP".len();
        assert_eq!(unterminated[name_end], 0);
        unterminated[name_end] = b'x';
        assert!(parse(0x0607, &unterminated).is_err(), "a name without its NUL");
    }

    #[test]
    fn ipset_error_codes_read_as_the_set_type_means_them() {
        assert_eq!(error_message(4352, Some(SetType::HashIpPort)), Some("the set is full (maxelem reached)"));
        assert_eq!(error_message(4352, Some(SetType::BitmapPort)), Some("the member is outside the set's range"));
        assert_eq!(error_message(4103, None), Some("it exists"));
        assert_eq!(error_message(2, None), None);
    }

    #[test]
    fn names_are_checked_before_they_are_sent() {
        assert_eq!(check_name("KUBE-6-LOAD-BALANCER-SOURCE-CID"), Ok(()));
        assert_eq!(check_name(&"x".repeat(32)), Err(NameError::TooLong("x".repeat(32))));
        assert_eq!(check_name(""), Err(NameError::Empty));
    }
}
