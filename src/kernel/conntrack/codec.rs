//! The ctnetlink codec: the pure builders for the two requests kube-proxy
//! sends (dump a family, delete one entry) and the reader of the kernel's
//! dump replies, over the message types of the rust-netlink crate
//! `netlink-packet-netfilter` ([`NetfilterMessage`] with a
//! [`ConntrackMessage`] inside).
//!
//! Nothing here does I/O; [`super::NetlinkConntrack`] sends what these
//! functions build.
//!
//! Wire format, from `include/uapi/linux/netfilter/nfnetlink.h`,
//! `nfnetlink_conntrack.h` and the policies in
//! `net/netfilter/nf_conntrack_netlink.c`:
//! - socket protocol `NETLINK_NETFILTER` (12); the netlink message type is
//!   `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_*`;
//! - the payload starts with `struct nfgenmsg { u8 family; u8 version;
//!   __be16 res_id; }`: the family selects the table (`AF_INET`/`AF_INET6`),
//!   version is `NFNETLINK_V0`;
//! - a connection is described by `CTA_TUPLE_ORIG` and `CTA_TUPLE_REPLY`,
//!   each nested: `CTA_TUPLE_IP` (nested `CTA_IP_V4_SRC`/`DST`, 4 bytes, or
//!   `CTA_IP_V6_SRC`/`DST`, 16 bytes) and `CTA_TUPLE_PROTO` (nested
//!   `CTA_PROTO_NUM`, u8, and `CTA_PROTO_SRC_PORT`/`DST_PORT`, `__be16`);
//! - `CTA_ID` is a `__be32`, `CTA_ZONE` a `__be16`;
//! - dump replies are `IPCTNL_MSG_CT_NEW` messages whose nested attributes
//!   carry `NLA_F_NESTED` (the kernel's `nla_nest_start`); the crate sends
//!   its nests with the flag too, as libnetfilter_conntrack does.
//!
//! What the crate does not type, and how we fill the gap (checked against
//! the captures in the tests below; the README lists them too):
//! - `CTA_ID` (12) and `CTA_ZONE` (18) have no [`ConntrackAttribute`]
//!   variant: we emit them as `ConntrackAttribute::Other(DefaultNla)` with
//!   the big-endian value ([`id_attr`], [`zone_attr`]) and read them back
//!   from `Other` ourselves, checking the length (a wrong one is a
//!   [`ReplyError::BadLength`]);
//! - `IPTuple` chooses the address family from the value's length, not from
//!   the attribute kind: a 16-byte `CTA_IP_V4_SRC` would read as an IPv6
//!   source. The kernel never sends that (its policy fixes each kind's
//!   length), so no shim; a length that is neither 4 nor 16 is still an
//!   error;
//! - `ConntrackAttribute` and `Tuple` decide `NLA_F_NESTED` by variant, so
//!   an `Other` attribute parsed with the flag (the kernel's nested
//!   `CTA_TIMESTAMP`, `CTA_COUNTERS_*`) is emitted again without it. We only
//!   read those, never emit an untyped nest, so no shim; a test pins it;
//! - the crate dispatches on the subsystem byte and parses nflog and
//!   nftables messages too: [`parse`] refuses anything but ctnetlink, as a
//!   reply on our socket of another subsystem is a bug worth reporting.
//!
//! Deleting (`IPCTNL_MSG_CT_DELETE`) **without** a tuple flushes the whole
//! table: [`delete_request`] therefore only exists for a dumped [`Entry`],
//! whose original tuple it always carries.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    DecodeError, DefaultNla, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, ParseableParametrized, NLM_F_ACK,
    NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, ConntrackMessageType, IPTuple, ProtoTuple, Tuple as TupleNla,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily, NetfilterSubsystem,
};

use crate::net::{IpFamily, Protocol};

/// `NFNETLINK_V0`: `nfgenmsg.version`.
pub const NFNETLINK_V0: u8 = 0;
/// `AF_INET`, as `nfgenmsg.nfgen_family` carries it.
pub const AF_INET: u8 = 2;
/// `AF_INET6`.
pub const AF_INET6: u8 = 10;

/// `CTA_ID` (enum ctattr_type): not typed by the crate, carried as `Other`.
pub const CTA_ID: u16 = 12;
/// `CTA_ZONE`: not typed by the crate, carried as `Other`.
pub const CTA_ZONE: u16 = 18;

/// The `nfgen_family` byte for an IP family.
pub fn af(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

/// The `nfgenmsg` of a request about `family`'s table.
pub fn header(family: IpFamily) -> NetfilterHeader {
    NetfilterHeader::new(NetfilterProtoFamily::from(af(family)), NFNETLINK_V0, 0)
}

/// Parses a netlink payload of type `message_type` as a ctnetlink message.
/// Unknown attributes become `Other`; a known one with a malformed value is
/// an error (the layout changed: better to say so than to guess).
pub fn parse(message_type: u16, payload: &[u8]) -> Result<NetfilterMessage, DecodeError> {
    let msg = NetfilterMessage::parse_with_param(payload, message_type)?;
    match msg.subsys() {
        NetfilterSubsystem::Conntrack => Ok(msg),
        _ => Err(format!("message type {message_type:#06x} is not a ctnetlink message").into()),
    }
}

/// `CTA_ZONE`, as the kernel reads it.
pub fn zone_attr(zone: u16) -> ConntrackAttribute {
    ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec()))
}

/// `CTA_ID`, as the kernel reads it.
pub fn id_attr(id: u32) -> ConntrackAttribute {
    ConntrackAttribute::Other(DefaultNla::new(CTA_ID, id.to_be_bytes().to_vec()))
}

// ---------------------------------------------------------------- entries

/// One direction of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IP protocol number (IPPROTO_*).
    pub protocol: u8,
    /// `None` for protocols without ports (ICMP).
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
}

/// A dumped conntrack entry: what kube-proxy matches on and what a delete
/// needs to name exactly this entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    pub orig: Tuple,
    pub reply: Tuple,
    /// `CTA_ZONE`; the kernel leaves it out for the default zone.
    pub zone: Option<u16>,
    /// `CTA_ID`.
    pub id: Option<u32>,
}

/// A dump reply that is well-formed netlink but not a usable entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    #[error("reply lacks attribute {0}")]
    Missing(&'static str),
    #[error("{0} mixes IPv4 and IPv6 addresses")]
    MixedFamilies(&'static str),
    /// An attribute the crate leaves untyped (`CTA_ID`, `CTA_ZONE`) with a
    /// value of the wrong size.
    #[error("{attr} has {len} bytes, expected {expected}")]
    BadLength { attr: &'static str, len: usize, expected: usize },
    /// Not an `IPCTNL_MSG_CT_NEW` message (the netlink message type).
    #[error("message type {0:#06x} is not a conntrack entry")]
    NotAnEntry(u16),
}

macro_rules! attr {
    ($attrs:expr, $variant:path) => {
        $attrs.iter().find_map(|a| match a {
            $variant(v) => Some(v),
            _ => None,
        })
    };
}

fn required<T>(v: Option<T>, name: &'static str) -> Result<T, ReplyError> {
    v.ok_or(ReplyError::Missing(name))
}

/// The value of the first `Other` attribute of kind `kind`, as `N`
/// big-endian bytes.
fn other_be<const N: usize>(
    attrs: &[ConntrackAttribute],
    kind: u16,
    name: &'static str,
) -> Result<Option<[u8; N]>, ReplyError> {
    let Some(nla) = attrs.iter().find_map(|a| match a {
        ConntrackAttribute::Other(nla) if nla.kind() == kind => Some(nla),
        _ => None,
    }) else {
        return Ok(None);
    };
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    let len = value.len();
    <[u8; N]>::try_from(value).map(Some).map_err(|_| ReplyError::BadLength { attr: name, len, expected: N })
}

/// Source and destination of a `CTA_TUPLE_IP` nest, which must all be of
/// one family.
fn addresses(ip: &[IPTuple], which: &'static str) -> Result<(IpAddr, IpAddr), ReplyError> {
    let src = required(attr!(ip, IPTuple::SourceAddress), "CTA_IP_V4_SRC or CTA_IP_V6_SRC")?;
    let dst = required(attr!(ip, IPTuple::DestinationAddress), "CTA_IP_V4_DST or CTA_IP_V6_DST")?;
    let mixed = ip.iter().any(|a| match a {
        IPTuple::SourceAddress(x) | IPTuple::DestinationAddress(x) => x.is_ipv4() != src.is_ipv4(),
        _ => false,
    });
    if mixed {
        return Err(ReplyError::MixedFamilies(which));
    }
    Ok((*src, *dst))
}

impl Tuple {
    /// Reads a tuple's attributes; `which` names it in errors.
    pub fn from_attrs(attrs: &[TupleNla], which: &'static str) -> Result<Tuple, ReplyError> {
        let ip = required(attr!(attrs, TupleNla::Ip), "CTA_TUPLE_IP")?;
        let proto = required(attr!(attrs, TupleNla::Proto), "CTA_TUPLE_PROTO")?;
        let (src, dst) = addresses(ip, which)?;
        Ok(Tuple {
            src,
            dst,
            protocol: u8::from(*required(attr!(proto, ProtoTuple::Protocol), "CTA_PROTO_NUM")?),
            src_port: attr!(proto, ProtoTuple::SourcePort).copied(),
            dst_port: attr!(proto, ProtoTuple::DestinationPort).copied(),
        })
    }

    /// The tuple's attributes, as the kernel dumps them.
    pub fn attrs(&self) -> Vec<TupleNla> {
        let ip = vec![IPTuple::SourceAddress(self.src), IPTuple::DestinationAddress(self.dst)];
        let mut proto = vec![ProtoTuple::Protocol(self.protocol.into())];
        proto.extend(self.src_port.map(ProtoTuple::SourcePort));
        proto.extend(self.dst_port.map(ProtoTuple::DestinationPort));
        vec![TupleNla::Ip(ip), TupleNla::Proto(proto)]
    }

    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.dst)
    }
}

impl Entry {
    /// Reads a dump entry (an `IPCTNL_MSG_CT_NEW` message).
    pub fn from_message(msg: &NetfilterMessage) -> Result<Entry, ReplyError> {
        let attrs = match &msg.inner {
            NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) => attrs,
            _ => return Err(ReplyError::NotAnEntry(netlink_packet_core::NetlinkSerializable::message_type(msg))),
        };
        let orig = required(attr!(attrs, ConntrackAttribute::CtaTupleOrig), "CTA_TUPLE_ORIG")?;
        let reply = required(attr!(attrs, ConntrackAttribute::CtaTupleReply), "CTA_TUPLE_REPLY")?;
        Ok(Entry {
            orig: Tuple::from_attrs(orig, "CTA_TUPLE_ORIG")?,
            reply: Tuple::from_attrs(reply, "CTA_TUPLE_REPLY")?,
            zone: other_be(attrs, CTA_ZONE, "CTA_ZONE")?.map(u16::from_be_bytes),
            id: other_be(attrs, CTA_ID, "CTA_ID")?.map(u32::from_be_bytes),
        })
    }

    /// A connection of `protocol` from `client` to `orig_dst`, answered from
    /// `reply_src` (its endpoint when DNATed), as the default zone lists it
    /// (no id: the kernel's would be any).
    pub fn connection(protocol: Protocol, client: SocketAddr, orig_dst: SocketAddr, reply_src: SocketAddr) -> Entry {
        let p = protocol.number();
        let tuple = |src: SocketAddr, dst: SocketAddr| Tuple {
            src: src.ip(),
            dst: dst.ip(),
            protocol: p,
            src_port: Some(src.port()),
            dst_port: Some(dst.port()),
        };
        Entry { orig: tuple(client, orig_dst), reply: tuple(reply_src, client), zone: None, id: None }
    }

    /// The L4 protocol, if it is one kube-proxy knows.
    pub fn protocol(&self) -> Option<Protocol> {
        Protocol::from_number(self.orig.protocol)
    }
}

impl fmt::Display for Entry {
    /// As `conntrack -L` lists it, without the timeout, state and counters:
    /// `udp src=A dst=B sport=P dport=Q src=C dst=D sport=R dport=S`, the
    /// original direction, then the reply.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.protocol() {
            Some(p) => write!(f, "{}", p.lower())?,
            None => write!(f, "{}", self.orig.protocol)?,
        }
        for t in [&self.orig, &self.reply] {
            write!(f, " src={} dst={}", t.src, t.dst)?;
            if let (Some(sport), Some(dport)) = (t.src_port, t.dst_port) {
                write!(f, " sport={sport} dport={dport}")?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- requests

/// `conntrack -L -f <family>`: every entry of one family's table.
pub fn dump_request(family: IpFamily) -> NetfilterMessage {
    NetfilterMessage::new(header(family), ConntrackMessage::Get(Vec::new()))
}

/// Deletes exactly `entry`: its original tuple, its zone, and its id, so a
/// newer connection that reused the tuple is left alone (the kernel answers
/// ENOENT). Always carries a tuple: a delete without one flushes the table.
pub fn delete_request(entry: &Entry) -> NetfilterMessage {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(entry.orig.attrs())];
    attrs.extend(entry.zone.map(zone_attr));
    attrs.extend(entry.id.map(id_attr));
    NetfilterMessage::new(header(entry.orig.family()), ConntrackMessage::Delete(attrs))
}

/// The ctnetlink command of `msg`, if it is a conntrack message.
fn command(msg: &NetfilterMessage) -> Option<ConntrackMessageType> {
    match &msg.inner {
        NetfilterMessageInner::Conntrack(ct) => Some(ct.message_type()),
        _ => None,
    }
}

/// Netlink header flags: a `GET` is a dump, anything else wants an ack, so
/// every request ends in exactly one ack, error or `NLMSG_DONE`.
pub fn request_flags(msg: &NetfilterMessage) -> u16 {
    match command(msg) {
        Some(ConntrackMessageType::Get) => NLM_F_REQUEST | NLM_F_DUMP,
        _ => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// Wraps `msg` in a netlink header with its flags. The sequence number is
/// left 0: the connection assigns it.
pub fn netlink_request(msg: NetfilterMessage) -> NetlinkMessage<NetfilterMessage> {
    let flags = request_flags(&msg);
    let mut nl = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(msg));
    nl.header.flags = flags;
    nl.finalize();
    nl
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLA_F_NESTED;
    use netlink_packet_netfilter::conntrack::{ProtoInfo, ProtoInfoTCP, Status};

    use super::*;

    /// Serializes `msg` as the connection would send it, with sequence 1.
    fn emit(msg: NetfilterMessage) -> Vec<u8> {
        let mut nl = netlink_request(msg);
        nl.header.sequence_number = 1;
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    fn deserialize(bytes: &[u8]) -> NetlinkMessage<NetfilterMessage> {
        NetlinkMessage::<NetfilterMessage>::deserialize(bytes).expect("valid message")
    }

    fn payload(nl: NetlinkMessage<NetfilterMessage>) -> NetfilterMessage {
        match nl.payload {
            NetlinkPayload::InnerMessage(msg) => msg,
            other => panic!("not a ctnetlink message: {other:?}"),
        }
    }

    /// Emits `msg`, checks the bytes, then parses them back to `msg`.
    fn check(msg: NetfilterMessage, expected: &[u8]) {
        let bytes = emit(msg.clone());
        assert_eq!(bytes, expected);
        assert_eq!(payload(deserialize(&bytes)), msg);
    }

    /// Parses a whole netlink message and serializes it again, unchanged.
    fn round_trip(bytes: &[u8]) -> NetfilterMessage {
        let nl = deserialize(bytes);
        let mut again = vec![0; nl.buffer_len()];
        nl.serialize(&mut again);
        assert_eq!(again, bytes);
        payload(nl)
    }

    /// The attributes of a conntrack message.
    fn attrs(msg: &NetfilterMessage) -> &[ConntrackAttribute] {
        match &msg.inner {
            NetfilterMessageInner::Conntrack(
                ConntrackMessage::New(a) | ConntrackMessage::Get(a) | ConntrackMessage::Delete(a),
            ) => a,
            other => panic!("not a typed conntrack message: {other:?}"),
        }
    }

    /// A dump entry (`IPCTNL_MSG_CT_NEW`) of `family` with `attrs`.
    fn new_msg(family: IpFamily, attrs: Vec<ConntrackAttribute>) -> NetfilterMessage {
        NetfilterMessage::new(header(family), ConntrackMessage::New(attrs))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }

    // Captured with `strace -xx conntrack -D -p udp --orig-dst 10.0.0.1` in a
    // network namespace with `iptables -t nat -A OUTPUT -d 10.0.0.1 -p udp
    // -j DNAT --to-destination 127.0.0.1`, after `echo hi >
    // /dev/udp/10.0.0.1/53` (conntrack-tools 1.4.7, Linux 6.18).

    /// The dump request conntrack-tools sent (`-L -f ipv4`), sequence 1.
    #[rustfmt::skip]
    const DUMP_V4: [u8; 20] = [
        // nlmsghdr
        0x14, 0x00, 0x00, 0x00, // nlmsg_len = 20
        0x01, 0x01,             // nlmsg_type = CTNETLINK << 8 | IPCTNL_MSG_CT_GET
        0x01, 0x03,             // nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP
        0x01, 0x00, 0x00, 0x00, // nlmsg_seq = 1
        0x00, 0x00, 0x00, 0x00, // nlmsg_pid = 0
        // nfgenmsg
        0x02, 0x00, 0x00, 0x00, // family = AF_INET, version = 0, res_id = 0
    ];

    /// The original tuple of the captured entry: 10.0.0.1:56549 -> 10.0.0.1:53/udp.
    #[rustfmt::skip]
    const ORIG_V4: [u8; 52] = [
        0x34, 0x00, 0x01, 0x80,                         // CTA_TUPLE_ORIG, nested, len 52
        0x14, 0x00, 0x01, 0x80,                         //   CTA_TUPLE_IP, nested, len 20
        0x08, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x01, //     CTA_IP_V4_SRC = 10.0.0.1
        0x08, 0x00, 0x02, 0x00, 0x0a, 0x00, 0x00, 0x01, //     CTA_IP_V4_DST = 10.0.0.1
        0x1c, 0x00, 0x02, 0x80,                         //   CTA_TUPLE_PROTO, nested, len 28
        0x05, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00, //     CTA_PROTO_NUM = 17 (udp), 3 pad
        0x06, 0x00, 0x02, 0x00, 0xdc, 0xe5, 0x00, 0x00, //     CTA_PROTO_SRC_PORT = 56549, big endian
        0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0x00, 0x00, //     CTA_PROTO_DST_PORT = 53
    ];

    /// The kernel's dump entry for that connection, DNATed to 127.0.0.1.
    #[rustfmt::skip]
    const ENTRY_V4: [u8; 164] = [
        // nlmsghdr
        0xa4, 0x00, 0x00, 0x00, // nlmsg_len = 164
        0x00, 0x01,             // nlmsg_type = CTNETLINK << 8 | IPCTNL_MSG_CT_NEW
        0x22, 0x00,             // nlmsg_flags = NLM_F_MULTI | NLM_F_DUMP_FILTERED
        0x92, 0x4c, 0x02, 0x6b, // nlmsg_seq
        0xdd, 0x33, 0x00, 0x00, // nlmsg_pid
        // nfgenmsg
        0x02, 0x00, 0x00, 0x00, // AF_INET, v0, res_id 0
        // CTA_TUPLE_ORIG: as ORIG_V4
        0x34, 0x00, 0x01, 0x80,
        0x14, 0x00, 0x01, 0x80,
        0x08, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x01,
        0x08, 0x00, 0x02, 0x00, 0x0a, 0x00, 0x00, 0x01,
        0x1c, 0x00, 0x02, 0x80,
        0x05, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x02, 0x00, 0xdc, 0xe5, 0x00, 0x00,
        0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0x00, 0x00,
        0x34, 0x00, 0x02, 0x80,                         // CTA_TUPLE_REPLY, nested, len 52
        0x14, 0x00, 0x01, 0x80,                         //   CTA_TUPLE_IP
        0x08, 0x00, 0x01, 0x00, 0x7f, 0x00, 0x00, 0x01, //     CTA_IP_V4_SRC = 127.0.0.1 (the DNAT target)
        0x08, 0x00, 0x02, 0x00, 0x0a, 0x00, 0x00, 0x01, //     CTA_IP_V4_DST = 10.0.0.1
        0x1c, 0x00, 0x02, 0x80,                         //   CTA_TUPLE_PROTO
        0x05, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00, //     CTA_PROTO_NUM = 17
        0x06, 0x00, 0x02, 0x00, 0x00, 0x35, 0x00, 0x00, //     CTA_PROTO_SRC_PORT = 53
        0x06, 0x00, 0x03, 0x00, 0xdc, 0xe5, 0x00, 0x00, //     CTA_PROTO_DST_PORT = 56549
        0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0xa8, // CTA_STATUS = 0x1a8 (kept as Other)
        0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, // CTA_MARK = 0 (Other)
        0x08, 0x00, 0x0c, 0x00, 0xa6, 0x98, 0xc2, 0xd9, // CTA_ID = 0xa698c2d9, big endian
        0x08, 0x00, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x01, // CTA_USE = 1 (Other)
        0x08, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x1d, // CTA_TIMEOUT = 29 s (Other)
    ];

    /// The same connection over IPv6 (`ip6tables ... -d fd00::1 -j DNAT
    /// --to-destination ::1`, `conntrack -L -f ipv6`).
    #[rustfmt::skip]
    const ENTRY_V6: [u8; 212] = [
        // nlmsghdr
        0xd4, 0x00, 0x00, 0x00, // nlmsg_len = 212
        0x00, 0x01,             // CTNETLINK << 8 | IPCTNL_MSG_CT_NEW
        0x22, 0x00,             // NLM_F_MULTI | NLM_F_DUMP_FILTERED
        0x99, 0x4c, 0x02, 0x6b, // nlmsg_seq
        0xe5, 0x34, 0x00, 0x00, // nlmsg_pid
        0x0a, 0x00, 0x00, 0x00, // nfgenmsg: AF_INET6
        0x4c, 0x00, 0x01, 0x80,                         // CTA_TUPLE_ORIG, len 76
        0x2c, 0x00, 0x01, 0x80,                         //   CTA_TUPLE_IP, len 44
        0x14, 0x00, 0x03, 0x00,                         //     CTA_IP_V6_SRC = fd00::1
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x14, 0x00, 0x04, 0x00,                         //     CTA_IP_V6_DST = fd00::1
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x1c, 0x00, 0x02, 0x80,                         //   CTA_TUPLE_PROTO
        0x05, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00, //     udp
        0x06, 0x00, 0x02, 0x00, 0xac, 0x45, 0x00, 0x00, //     sport 44101
        0x06, 0x00, 0x03, 0x00, 0x00, 0x35, 0x00, 0x00, //     dport 53
        0x4c, 0x00, 0x02, 0x80,                         // CTA_TUPLE_REPLY, len 76
        0x2c, 0x00, 0x01, 0x80,
        0x14, 0x00, 0x03, 0x00,                         //     CTA_IP_V6_SRC = ::1
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x14, 0x00, 0x04, 0x00,                         //     CTA_IP_V6_DST = fd00::1
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        0x1c, 0x00, 0x02, 0x80,
        0x05, 0x00, 0x01, 0x00, 0x11, 0x00, 0x00, 0x00, //     udp
        0x06, 0x00, 0x02, 0x00, 0x00, 0x35, 0x00, 0x00, //     sport 53
        0x06, 0x00, 0x03, 0x00, 0xac, 0x45, 0x00, 0x00, //     dport 44101
        0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0xa8, // CTA_STATUS
        0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, // CTA_MARK
        0x08, 0x00, 0x0c, 0x00, 0x9d, 0xfd, 0xcb, 0x91, // CTA_ID = 0x9dfdcb91
        0x08, 0x00, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x01, // CTA_USE
        0x08, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x1d, // CTA_TIMEOUT
    ];

    /// A TCP entry, which the kernel dumps with `CTA_PROTOINFO` (typed by the
    /// crate, so parsed strictly). Captured with `strace -xx -e read=3
    /// conntrack -L -f ipv4 -p tcp` in a network namespace with `iptables -t
    /// nat -A OUTPUT -d 10.96.0.10 -p tcp -j DNAT --to-destination
    /// 10.0.0.1:8080` and a connection from 10.0.0.1:40007 to 10.96.0.10:80
    /// (conntrack-tools 1.4.7, Linux 6.18).
    #[rustfmt::skip]
    const ENTRY_TCP: [u8; 212] = [
        0xd4, 0x00, 0x00, 0x00, 0x00, 0x01, 0x22, 0x00,  // nlmsghdr: len 212, CT_NEW, MULTI | DUMP_FILTERED
        0x7f, 0xc5, 0x06, 0x6b, 0x26, 0x53, 0x00, 0x00,  // nlmsg_seq, nlmsg_pid
        0x02, 0x00, 0x00, 0x00,                          // nfgenmsg: AF_INET
        0x34, 0x00, 0x01, 0x80,                          // CTA_TUPLE_ORIG, nested, len 52
        0x14, 0x00, 0x01, 0x80,                          //   CTA_TUPLE_IP
        0x08, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x01,  //     CTA_IP_V4_SRC = 10.0.0.1
        0x08, 0x00, 0x02, 0x00, 0x0a, 0x60, 0x00, 0x0a,  //     CTA_IP_V4_DST = 10.96.0.10
        0x1c, 0x00, 0x02, 0x80,                          //   CTA_TUPLE_PROTO
        0x05, 0x00, 0x01, 0x00, 0x06, 0x00, 0x00, 0x00,  //     CTA_PROTO_NUM = 6 (tcp)
        0x06, 0x00, 0x02, 0x00, 0x9c, 0x47, 0x00, 0x00,  //     CTA_PROTO_SRC_PORT = 40007
        0x06, 0x00, 0x03, 0x00, 0x00, 0x50, 0x00, 0x00,  //     CTA_PROTO_DST_PORT = 80
        0x34, 0x00, 0x02, 0x80,                          // CTA_TUPLE_REPLY, nested, len 52
        0x14, 0x00, 0x01, 0x80,                          //   CTA_TUPLE_IP
        0x08, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x01,  //     CTA_IP_V4_SRC = 10.0.0.1 (the DNAT target)
        0x08, 0x00, 0x02, 0x00, 0x0a, 0x00, 0x00, 0x01,  //     CTA_IP_V4_DST = 10.0.0.1
        0x1c, 0x00, 0x02, 0x80,                          //   CTA_TUPLE_PROTO
        0x05, 0x00, 0x01, 0x00, 0x06, 0x00, 0x00, 0x00,  //     tcp
        0x06, 0x00, 0x02, 0x00, 0x1f, 0x90, 0x00, 0x00,  //     CTA_PROTO_SRC_PORT = 8080
        0x06, 0x00, 0x03, 0x00, 0x9c, 0x47, 0x00, 0x00,  //     CTA_PROTO_DST_PORT = 40007
        0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x01, 0xae,  // CTA_STATUS = 0x1ae
        0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,  // CTA_MARK = 0
        0x08, 0x00, 0x0c, 0x00, 0xf7, 0xe5, 0x60, 0x15,  // CTA_ID = 0xf7e56015
        0x08, 0x00, 0x0b, 0x00, 0x00, 0x00, 0x00, 0x01,  // CTA_USE = 1
        0x08, 0x00, 0x07, 0x00, 0x00, 0x06, 0x97, 0x7f,  // CTA_TIMEOUT = 431999 s
        0x30, 0x00, 0x04, 0x80,                          // CTA_PROTOINFO, nested, len 48
        0x2c, 0x00, 0x01, 0x80,                          //   CTA_PROTOINFO_TCP, nested, len 44
        0x05, 0x00, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00,  //     CTA_PROTOINFO_TCP_STATE = 3 (ESTABLISHED)
        0x05, 0x00, 0x02, 0x00, 0x0a, 0x00, 0x00, 0x00,  //     CTA_PROTOINFO_TCP_WSCALE_ORIGINAL = 10
        0x05, 0x00, 0x03, 0x00, 0x0a, 0x00, 0x00, 0x00,  //     CTA_PROTOINFO_TCP_WSCALE_REPLY = 10
        0x06, 0x00, 0x04, 0x00, 0x23, 0x00, 0x00, 0x00,  //     CTA_PROTOINFO_TCP_FLAGS_ORIGINAL = 0x23/0x00
        0x06, 0x00, 0x05, 0x00, 0x23, 0x00, 0x00, 0x00,  //     CTA_PROTOINFO_TCP_FLAGS_REPLY = 0x23/0x00
    ];

    fn entry_v4() -> Entry {
        Entry {
            orig: Tuple {
                src: ip("10.0.0.1"),
                dst: ip("10.0.0.1"),
                protocol: 17,
                src_port: Some(56549),
                dst_port: Some(53),
            },
            reply: Tuple {
                src: ip("127.0.0.1"),
                dst: ip("10.0.0.1"),
                protocol: 17,
                src_port: Some(53),
                dst_port: Some(56549),
            },
            zone: None,
            id: Some(0xa698_c2d9),
        }
    }

    fn entry_v6() -> Entry {
        Entry {
            orig: Tuple {
                src: ip("fd00::1"),
                dst: ip("fd00::1"),
                protocol: 17,
                src_port: Some(44101),
                dst_port: Some(53),
            },
            reply: Tuple {
                src: ip("::1"),
                dst: ip("fd00::1"),
                protocol: 17,
                src_port: Some(53),
                dst_port: Some(44101),
            },
            zone: None,
            id: Some(0x9dfd_cb91),
        }
    }

    fn other(kind: u16, value: &[u8]) -> ConntrackAttribute {
        ConntrackAttribute::Other(DefaultNla::new(kind, value.to_vec()))
    }

    fn tuple_orig(t: &Tuple) -> ConntrackAttribute {
        ConntrackAttribute::CtaTupleOrig(t.attrs())
    }

    fn tuple_reply(t: &Tuple) -> ConntrackAttribute {
        ConntrackAttribute::CtaTupleReply(t.attrs())
    }

    #[test]
    fn dump_request_bytes_match_conntrack_tools() {
        check(dump_request(IpFamily::V4), &DUMP_V4);
        let mut v6 = DUMP_V4;
        v6[16] = AF_INET6; // nfgenmsg.family
        check(dump_request(IpFamily::V6), &v6);
    }

    #[test]
    fn parses_a_kernel_dump_entry_and_keeps_unknown_attributes() {
        let msg = round_trip(&ENTRY_V4);
        assert_eq!(msg.header, NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0));
        let a = attrs(&msg);
        let orig = vec![
            TupleNla::Ip(vec![IPTuple::SourceAddress(ip("10.0.0.1")), IPTuple::DestinationAddress(ip("10.0.0.1"))]),
            TupleNla::Proto(vec![
                ProtoTuple::Protocol(17u8.into()),
                ProtoTuple::SourcePort(56549),
                ProtoTuple::DestinationPort(53),
            ]),
        ];
        assert_eq!(a[0], ConntrackAttribute::CtaTupleOrig(orig));
        // The crate types status, mark and timeout; CTA_ID and CTA_USE stay `Other`.
        assert_eq!(a[2], ConntrackAttribute::CtaStatus(Status::from_bits_retain(0x1a8)));
        assert_eq!(a[3], ConntrackAttribute::CtaMark(0));
        assert_eq!(a[4], id_attr(0xa698_c2d9));
        assert_eq!(a[5], other(11, &[0, 0, 0, 1]));
        assert_eq!(a[6], ConntrackAttribute::CtaTimeout(29));
        assert_eq!(a.len(), 7);
        assert_eq!(Entry::from_message(&msg), Ok(entry_v4()));
    }

    #[test]
    fn parses_an_ipv6_dump_entry() {
        let msg = round_trip(&ENTRY_V6);
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv6);
        let orig = vec![
            TupleNla::Ip(vec![IPTuple::SourceAddress(ip("fd00::1")), IPTuple::DestinationAddress(ip("fd00::1"))]),
            TupleNla::Proto(vec![
                ProtoTuple::Protocol(17u8.into()),
                ProtoTuple::SourcePort(44101),
                ProtoTuple::DestinationPort(53),
            ]),
        ];
        assert_eq!(attrs(&msg)[0], ConntrackAttribute::CtaTupleOrig(orig));
        assert_eq!(Entry::from_message(&msg), Ok(entry_v6()));
        assert_eq!(entry_v6().orig.family(), IpFamily::V6);
    }

    #[test]
    fn parses_a_tcp_dump_entry_with_protoinfo() {
        let msg = round_trip(&ENTRY_TCP);
        let a = attrs(&msg);
        let ConntrackAttribute::CtaProtoInfo(info) = &a[7] else { panic!("CTA_PROTOINFO: {:?}", a[7]) };
        let ProtoInfo::TCP(tcp) = &info[0] else { panic!("CTA_PROTOINFO_TCP: {info:?}") };
        assert_eq!(tcp[0], ProtoInfoTCP::State(3)); // ESTABLISHED
        let tuple = |src, dst, sport, dport| Tuple {
            src: ip(src),
            dst: ip(dst),
            protocol: 6,
            src_port: Some(sport),
            dst_port: Some(dport),
        };
        let expected = Entry {
            orig: tuple("10.0.0.1", "10.96.0.10", 40007, 80),
            reply: tuple("10.0.0.1", "10.0.0.1", 8080, 40007),
            zone: None,
            id: Some(0xf7e5_6015),
        };
        assert_eq!(Entry::from_message(&msg), Ok(expected));
        assert_eq!(expected.protocol(), Some(Protocol::Tcp));
    }

    /// nlmsghdr + nfgenmsg of a delete request of `len` bytes.
    #[rustfmt::skip]
    fn delete_header(len: u8, family: u8) -> Vec<u8> {
        vec![
            len, 0x00, 0x00, 0x00,  // nlmsg_len
            0x02, 0x01,             // CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE
            0x05, 0x00,             // NLM_F_REQUEST | NLM_F_ACK
            0x01, 0x00, 0x00, 0x00, // nlmsg_seq = 1
            0x00, 0x00, 0x00, 0x00, // nlmsg_pid = 0
            family, 0x00, 0x00, 0x00, // nfgenmsg
        ]
    }

    #[test]
    fn delete_names_the_original_tuple_and_id() {
        // The tuple is byte for byte the one conntrack-tools sends for this
        // entry; we add CTA_ID (as vishvananda/netlink does) where it sends
        // the reply tuple, status, timeout and mark.
        let mut expected = delete_header(80, AF_INET);
        expected.extend_from_slice(&ORIG_V4);
        expected.extend_from_slice(&[0x08, 0x00, 0x0c, 0x00, 0xa6, 0x98, 0xc2, 0xd9]); // CTA_ID
        check(delete_request(&entry_v4()), &expected);
    }

    #[test]
    fn delete_carries_a_non_default_zone() {
        let entry = Entry { zone: Some(5), id: None, ..entry_v4() };
        let mut expected = delete_header(80, AF_INET);
        expected.extend_from_slice(&ORIG_V4);
        expected.extend_from_slice(&[0x06, 0x00, 0x12, 0x00, 0x00, 0x05, 0x00, 0x00]); // CTA_ZONE = 5, 2 pad
        check(delete_request(&entry), &expected);
    }

    #[test]
    fn delete_v6_bytes() {
        let mut expected = delete_header(104, AF_INET6);
        expected.extend_from_slice(&ENTRY_V6[20..96]); // the captured CTA_TUPLE_ORIG
        expected.extend_from_slice(&[0x08, 0x00, 0x0c, 0x00, 0x9d, 0xfd, 0xcb, 0x91]);
        check(delete_request(&entry_v6()), &expected);
    }

    #[test]
    fn zone_and_id_read_back_from_a_dumped_entry() {
        let entry = Entry { zone: Some(7), ..entry_v4() };
        let msg = new_msg(
            IpFamily::V4,
            vec![tuple_orig(&entry.orig), tuple_reply(&entry.reply), zone_attr(7), id_attr(0xa698_c2d9)],
        );
        let bytes = emit(msg.clone());
        assert_eq!(&bytes[4..6], &[0x00, 0x01]); // CTNETLINK << 8 | IPCTNL_MSG_CT_NEW
        assert_eq!(Entry::from_message(&payload(deserialize(&bytes))), Ok(entry));
    }

    #[test]
    fn unknown_attributes_at_every_level_round_trip() {
        let msg = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0x1234),
            ConntrackMessage::New(vec![
                ConntrackAttribute::CtaTupleOrig(vec![
                    TupleNla::Ip(vec![
                        IPTuple::SourceAddress(ip("10.1.2.3")),
                        IPTuple::Other(DefaultNla::new(9, vec![1])),
                    ]),
                    TupleNla::Proto(vec![
                        ProtoTuple::Protocol(1u8.into()),
                        ProtoTuple::Other(DefaultNla::new(4, vec![0, 7])),
                    ]),
                    TupleNla::Other(DefaultNla::new(3, vec![0, 2])), // CTA_TUPLE_ZONE
                ]),
                other(11, &[0, 0, 0, 1]), // CTA_USE
                zone_attr(7),
            ]),
        );
        let bytes = emit(msg.clone());
        assert_eq!(&bytes[18..20], &[0x12, 0x34]); // res_id, big endian
        assert_eq!(&bytes[22..24], &[0x01, 0x80]); // CTA_TUPLE_ORIG, with NLA_F_NESTED
        assert_eq!(payload(deserialize(&bytes)), msg);
        // An unknown command keeps its number, and its attributes as bytes.
        let unknown = NetfilterMessage::new(
            header(IpFamily::V4),
            ConntrackMessage::Other { message_type: 9, attributes: vec![DefaultNla::new(3, vec![0, 0, 0, 1])] },
        );
        let bytes = emit(unknown.clone());
        assert_eq!(&bytes[4..6], &[0x09, 0x01]);
        assert_eq!(payload(deserialize(&bytes)), unknown);
    }

    /// A gap in the crate, pinned so an upgrade that fixes it shows: the
    /// typed enums `ConntrackAttribute` and `Tuple` override `is_nested` to
    /// cover their typed nests only, so an `Other` attribute parsed with
    /// `NLA_F_NESTED` (the kernel's `CTA_TIMESTAMP`, `CTA_COUNTERS_*` with
    /// accounting on) is emitted again without it. Harmless for us: we read
    /// those replies and never emit an untyped nest.
    #[test]
    fn crate_gap_untyped_nests_lose_nla_f_nested_when_emitted() {
        let nested = other(20 | NLA_F_NESTED, &[12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9]); // CTA_TIMESTAMP
        let bytes = emit(new_msg(IpFamily::V4, vec![nested]));
        assert_eq!(&bytes[22..24], &[0x14, 0x00]); // type 20, flag dropped
        let parsed = payload(deserialize(&bytes));
        assert_eq!(attrs(&parsed), &[other(20, &[12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 9])]);
        // A nest the crate parsed keeps its flag when read, though.
        let mut with_flag = bytes.clone();
        with_flag[23] |= 0x80;
        assert_eq!(attrs(&payload(deserialize(&with_flag)))[0].kind(), 20 | NLA_F_NESTED);
    }

    #[test]
    fn malformed_replies_are_errors() {
        // An IPv4 address of 3 bytes inside a tuple.
        let bad_ip = [
            0x02, 0x00, 0x00, 0x00, 0x10, 0x00, 0x01, 0x80, 0x0c, 0x00, 0x01, 0x80, 0x07, 0x00, 0x01, 0x00, 1, 2, 3, 0,
        ];
        assert!(parse(0x0100, &bad_ip).is_err());
        // A truncated nfgenmsg, an attribute running past the end, another subsystem.
        assert!(parse(0x0100, &[0x02, 0x00]).is_err());
        assert!(parse(0x0100, &[0x02, 0x00, 0x00, 0x00, 0x08, 0x00, 0x03, 0x00, 0x00]).is_err());
        assert!(parse(0x0200, &ENTRY_V4[16..]).is_err());
        assert!(parse(0x0100, &ENTRY_V4[16..]).is_ok());
    }

    #[test]
    fn untyped_zone_and_id_of_the_wrong_size_are_errors() {
        // The crate keeps CTA_ID/CTA_ZONE as bytes: our reader checks the size.
        let e = entry_v4();
        let bad_id = [0x02, 0x00, 0x00, 0x00, 0x06, 0x00, 0x0c, 0x00, 0x00, 0x01, 0x00, 0x00];
        assert_eq!(attrs(&parse(0x0100, &bad_id).expect("parses"))[0], other(CTA_ID, &[0x00, 0x01]));
        let msg = new_msg(IpFamily::V4, vec![tuple_orig(&e.orig), tuple_reply(&e.reply), other(CTA_ID, &[0, 1])]);
        assert_eq!(Entry::from_message(&msg), Err(ReplyError::BadLength { attr: "CTA_ID", len: 2, expected: 4 }));
        let msg = new_msg(IpFamily::V4, vec![tuple_orig(&e.orig), tuple_reply(&e.reply), other(CTA_ZONE, &[0; 4])]);
        assert_eq!(Entry::from_message(&msg), Err(ReplyError::BadLength { attr: "CTA_ZONE", len: 4, expected: 2 }));
    }

    #[test]
    fn only_new_messages_are_entries() {
        let get = parse(0x0101, &DUMP_V4[16..]).expect("a GET parses");
        assert_eq!(Entry::from_message(&get), Err(ReplyError::NotAnEntry(0x0101)));
        assert_eq!(Entry::from_message(&delete_request(&entry_v4())), Err(ReplyError::NotAnEntry(0x0102)));
    }

    #[test]
    fn entries_need_both_tuples_with_addresses_and_protocol() {
        let e = entry_v4();
        let msg = new_msg(IpFamily::V4, vec![tuple_orig(&e.orig), id_attr(1)]);
        assert_eq!(Entry::from_message(&msg), Err(ReplyError::Missing("CTA_TUPLE_REPLY")));
        let ip_only = vec![TupleNla::Ip(vec![
            IPTuple::SourceAddress(ip("10.0.0.1")),
            IPTuple::DestinationAddress(ip("10.0.0.2")),
        ])];
        let no_proto = new_msg(IpFamily::V4, vec![ConntrackAttribute::CtaTupleOrig(ip_only), tuple_reply(&e.reply)]);
        assert_eq!(Entry::from_message(&no_proto), Err(ReplyError::Missing("CTA_TUPLE_PROTO")));
        let proto = TupleNla::Proto(vec![ProtoTuple::Protocol(17u8.into())]);
        let mixed = vec![
            TupleNla::Ip(vec![
                IPTuple::SourceAddress(ip("10.0.0.1")),
                IPTuple::DestinationAddress(ip("10.0.0.2")),
                IPTuple::SourceAddress(ip("fd00::1")),
                IPTuple::DestinationAddress(ip("fd00::2")),
            ]),
            proto.clone(),
        ];
        assert_eq!(Tuple::from_attrs(&mixed, "CTA_TUPLE_ORIG"), Err(ReplyError::MixedFamilies("CTA_TUPLE_ORIG")));
        let v4_to_v6 = vec![
            TupleNla::Ip(vec![IPTuple::SourceAddress(ip("10.0.0.1")), IPTuple::DestinationAddress(ip("fd00::2"))]),
            proto.clone(),
        ];
        assert_eq!(Tuple::from_attrs(&v4_to_v6, "CTA_TUPLE_REPLY"), Err(ReplyError::MixedFamilies("CTA_TUPLE_REPLY")));
        let no_dst = vec![TupleNla::Ip(vec![IPTuple::SourceAddress(ip("10.0.0.1"))]), proto];
        assert_eq!(
            Tuple::from_attrs(&no_dst, "CTA_TUPLE_ORIG"),
            Err(ReplyError::Missing("CTA_IP_V4_DST or CTA_IP_V6_DST"))
        );
    }

    #[test]
    fn portless_tuples_round_trip() {
        let icmp = Tuple { src: ip("10.0.0.1"), dst: ip("10.0.0.2"), protocol: 1, src_port: None, dst_port: None };
        assert_eq!(Tuple::from_attrs(&icmp.attrs(), "CTA_TUPLE_ORIG"), Ok(icmp));
        assert_eq!(Entry { orig: icmp, reply: icmp, zone: None, id: None }.protocol(), None);
        assert_eq!(entry_v4().protocol(), Some(Protocol::Udp));
    }
}
