//! The nfnetlink_acct codec (extended accounting objects, the kernel's
//! `nfacct`): the pure builders of the requests iptables mode sends (create
//! an object, read one, delete one) and the reader of the kernel's replies.
//! `netlink-packet-netfilter` 0.4 has no module for this subsystem (it
//! types ctnetlink, nflog and nftables), so the message is ours, on
//! `netlink-packet-core`'s attribute traits and the crate's
//! [`NetfilterHeader`] for the `nfgenmsg`.
//!
//! Nothing here does I/O; [`super::NetlinkNfacct`] sends what these
//! functions build.
//!
//! Wire format, from `include/uapi/linux/netfilter/nfnetlink_acct.h` and
//! `net/netfilter/nfnetlink_acct.c`:
//! - socket protocol `NETLINK_NETFILTER` (12); the netlink message type is
//!   `NFNL_SUBSYS_ACCT (7) << 8 | NFNL_MSG_ACCT_*` (`NEW` 0, `GET` 1,
//!   `GET_CTRZERO` 2, `DEL` 3);
//! - the payload starts with `struct nfgenmsg`: family `AF_UNSPEC`, version
//!   `NFNETLINK_V0`, `res_id` 0 (objects are per network namespace, not per
//!   family: one object counts IPv4 and IPv6 rules alike);
//! - attributes: `NFACCT_NAME` (1, a NUL-terminated string of at most 31
//!   characters), `NFACCT_PKTS` (2) and `NFACCT_BYTES` (3) as `__be64`,
//!   `NFACCT_USE` (4, `__be32`: the rules referencing the object), then,
//!   for quota objects only, `NFACCT_FLAGS`, `NFACCT_QUOTA`, ...;
//! - `NEW` of an existing name fails with `EBUSY` unless `NLM_F_EXCL`
//!   (then `EEXIST`) or `NLM_F_REPLACE` (then the counters are reset): we
//!   send neither, so creating twice is harmless and leaves the counts;
//! - a `GET` naming an object is answered with one `NEW` message (flag
//!   `NLM_F_MULTI`) carrying its attributes, then the ack; an unknown name
//!   is `ENOENT`; a kernel without the subsystem answers `EINVAL` (after
//!   trying to load the module `nfnetlink-subsys-7`);
//! - `DEL` of an object a rule still references is `EBUSY`.
//!
//! The requests are byte for byte those of the `nfacct` tool (1.0.2,
//! libnetfilter_acct); the tests compare them with its captures.

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NlaBuffer, NlasIterator,
    Parseable, ParseableParametrized, NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};

/// `NFNL_SUBSYS_ACCT`.
pub const NFNL_SUBSYS_ACCT: u8 = 7;
/// `NFNETLINK_V0`: `nfgenmsg.version`.
pub const NFNETLINK_V0: u8 = 0;

/// `NFACCT_NAME`.
pub const NFACCT_NAME: u16 = 1;
/// `NFACCT_PKTS`.
pub const NFACCT_PKTS: u16 = 2;
/// `NFACCT_BYTES`.
pub const NFACCT_BYTES: u16 = 3;
/// `NFACCT_USE`.
pub const NFACCT_USE: u16 = 4;

/// `NFACCT_NAME_MAX` (32) less the terminating NUL.
pub const NAME_MAX_LEN: usize = 31;

/// The command of an nfacct message (`enum nfnl_acct_msg_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcctCommand {
    /// `NFNL_MSG_ACCT_NEW`: create (request) or describe (reply) an object.
    New,
    /// `NFNL_MSG_ACCT_GET`.
    Get,
    /// `NFNL_MSG_ACCT_DEL`.
    Del,
    Other(u8),
}

impl From<AcctCommand> for u8 {
    fn from(c: AcctCommand) -> u8 {
        match c {
            AcctCommand::New => 0,
            AcctCommand::Get => 1,
            AcctCommand::Del => 3,
            AcctCommand::Other(n) => n,
        }
    }
}

impl From<u8> for AcctCommand {
    fn from(n: u8) -> AcctCommand {
        match n {
            0 => AcctCommand::New,
            1 => AcctCommand::Get,
            3 => AcctCommand::Del,
            n => AcctCommand::Other(n),
        }
    }
}

/// One attribute of an nfacct message; the ones we do not read stay as they came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcctAttr {
    Name(String),
    Packets(u64),
    Bytes(u64),
    Use(u32),
    Other(DefaultNla),
}

impl Nla for AcctAttr {
    fn value_len(&self) -> usize {
        match self {
            AcctAttr::Name(n) => n.len() + 1,
            AcctAttr::Packets(_) | AcctAttr::Bytes(_) => 8,
            AcctAttr::Use(_) => 4,
            AcctAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            AcctAttr::Name(_) => NFACCT_NAME,
            AcctAttr::Packets(_) => NFACCT_PKTS,
            AcctAttr::Bytes(_) => NFACCT_BYTES,
            AcctAttr::Use(_) => NFACCT_USE,
            AcctAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            AcctAttr::Name(n) => {
                buf[..n.len()].copy_from_slice(n.as_bytes());
                buf[n.len()] = 0;
            }
            AcctAttr::Packets(v) | AcctAttr::Bytes(v) => buf[..8].copy_from_slice(&v.to_be_bytes()),
            AcctAttr::Use(v) => buf[..4].copy_from_slice(&v.to_be_bytes()),
            AcctAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for AcctAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<AcctAttr, DecodeError> {
        let value = buf.value();
        let be64 = |what: &str| -> Result<u64, DecodeError> {
            let bytes: [u8; 8] = value.try_into().map_err(|_| format!("{what}: {} bytes, not 8", value.len()))?;
            Ok(u64::from_be_bytes(bytes))
        };
        Ok(match buf.kind() {
            NFACCT_NAME => {
                // NLA_NUL_STRING: the name ends at the first NUL.
                let end = value.iter().position(|&b| b == 0).ok_or("NFACCT_NAME without its NUL")?;
                let name = std::str::from_utf8(&value[..end]).map_err(|e| format!("NFACCT_NAME: {e}"))?;
                AcctAttr::Name(name.to_string())
            }
            NFACCT_PKTS => AcctAttr::Packets(be64("NFACCT_PKTS")?),
            NFACCT_BYTES => AcctAttr::Bytes(be64("NFACCT_BYTES")?),
            NFACCT_USE => {
                let bytes: [u8; 4] =
                    value.try_into().map_err(|_| format!("NFACCT_USE: {} bytes, not 4", value.len()))?;
                AcctAttr::Use(u32::from_be_bytes(bytes))
            }
            _ => AcctAttr::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// An nfacct message: the `nfgenmsg`, the command, the attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcctMessage {
    pub header: NetfilterHeader,
    pub command: AcctCommand,
    pub attrs: Vec<AcctAttr>,
}

impl AcctMessage {
    /// A request: `AF_UNSPEC`, `NFNETLINK_V0`, as libnetfilter_acct sends.
    pub fn request(command: AcctCommand, attrs: Vec<AcctAttr>) -> AcctMessage {
        AcctMessage { header: NetfilterHeader::new(NetfilterProtoFamily::Unspec, NFNETLINK_V0, 0), command, attrs }
    }
}

crate::kernel::netlink::nfnl_message!(AcctMessage, NFNL_SUBSYS_ACCT);

impl ParseableParametrized<[u8], u16> for AcctMessage {
    fn parse_with_param(buf: &[u8], message_type: u16) -> Result<AcctMessage, DecodeError> {
        let subsystem = (message_type >> 8) as u8;
        if subsystem != NFNL_SUBSYS_ACCT {
            return Err(format!("message type {message_type:#06x} is not an nfacct message").into());
        }
        let header = NetfilterHeader::parse(buf)?;
        let rest = buf.get(header.buffer_len()..).unwrap_or_default();
        let attrs =
            NlasIterator::new(rest).map(|nla| AcctAttr::parse(&nla?)).collect::<Result<Vec<_>, DecodeError>>()?;
        Ok(AcctMessage { header, command: AcctCommand::from(message_type as u8), attrs })
    }
}

impl netlink_packet_core::NetlinkDeserializable for AcctMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<AcctMessage, DecodeError> {
        AcctMessage::parse_with_param(payload, header.message_type)
    }
}

/// Parses a netlink payload of type `message_type` as an nfacct message;
/// anything of another subsystem is an error.
pub fn parse(message_type: u16, payload: &[u8]) -> Result<AcctMessage, DecodeError> {
    AcctMessage::parse_with_param(payload, message_type)
}

/// Why a name cannot be an nfacct object's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("nfacct object names are not empty")]
    Empty,
    #[error("nfacct object name {0:?} is longer than {NAME_MAX_LEN} bytes")]
    TooLong(String),
    #[error("nfacct object name {0:?} holds a NUL")]
    Nul(String),
}

/// Checks a name before it goes to the kernel (which would truncate a long one).
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

/// Creates the object `name` with zero counters (`nfacct add NAME`). No
/// `NLM_F_EXCL` or `NLM_F_REPLACE`: an existing object answers `EBUSY` and
/// keeps its counts.
pub fn new_request(name: &str) -> AcctMessage {
    AcctMessage::request(
        AcctCommand::New,
        vec![AcctAttr::Name(name.to_string()), AcctAttr::Packets(0), AcctAttr::Bytes(0)],
    )
}

/// Reads the object `name` (`nfacct get NAME`).
pub fn get_request(name: &str) -> AcctMessage {
    AcctMessage::request(AcctCommand::Get, vec![AcctAttr::Name(name.to_string())])
}

/// Deletes the object `name` (`nfacct delete NAME`).
pub fn delete_request(name: &str) -> AcctMessage {
    AcctMessage::request(AcctCommand::Del, vec![AcctAttr::Name(name.to_string())])
}

/// The netlink flags of a request: every one asks for an ack; `NEW` creates.
pub fn request_flags(msg: &AcctMessage) -> u16 {
    match msg.command {
        AcctCommand::New => NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE,
        _ => NLM_F_REQUEST | NLM_F_ACK,
    }
}

/// The request as a whole netlink message (sequence number 0: the
/// connection numbers what it sends).
pub fn netlink_request(msg: AcctMessage) -> NetlinkMessage<AcctMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = request_flags(&msg);
    let mut nl = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(msg));
    nl.finalize();
    nl
}

/// An accounting object as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub name: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Why an answer does not describe an object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("a {0:?} message, not a description of an object")]
    NotADescription(AcctCommand),
    /// The attribute a description must have.
    #[error("no {0}")]
    Missing(&'static str),
    #[error("an ack without the object")]
    NoObject,
}

impl Counter {
    /// Reads a `NEW` message (a `GET`'s answer): name, packets and bytes
    /// are required (upstream's decoder is as strict).
    pub fn from_message(msg: &AcctMessage) -> Result<Counter, Unusable> {
        if msg.command != AcctCommand::New {
            return Err(Unusable::NotADescription(msg.command));
        }
        let (mut name, mut packets, mut bytes) = (None, None, None);
        for a in &msg.attrs {
            match a {
                AcctAttr::Name(n) => name = Some(n.clone()),
                AcctAttr::Packets(p) => packets = Some(*p),
                AcctAttr::Bytes(b) => bytes = Some(*b),
                AcctAttr::Use(_) | AcctAttr::Other(_) => {}
            }
        }
        Ok(Counter {
            name: name.ok_or(Unusable::Missing("NFACCT_NAME"))?,
            packets: packets.ok_or(Unusable::Missing("NFACCT_PKTS"))?,
            bytes: bytes.ok_or(Unusable::Missing("NFACCT_BYTES"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLM_F_MULTIPART;

    use super::*;

    fn emit(msg: AcctMessage) -> Vec<u8> {
        let nl = netlink_request(msg);
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    /// The bytes after the 16-byte netlink header, parsed with the header's type.
    fn parse_captured(bytes: &[u8]) -> (NetlinkHeader, AcctMessage) {
        let nl = NetlinkMessage::<AcctMessage>::deserialize(bytes).expect("captured message parses");
        match nl.payload {
            NetlinkPayload::InnerMessage(m) => (nl.header, m),
            other => panic!("not an nfacct message: {other:?}"),
        }
    }

    /// With the sequence number of a capture (the connection sets its own).
    fn with_seq(mut bytes: Vec<u8>, seq: [u8; 4]) -> Vec<u8> {
        bytes[8..12].copy_from_slice(&seq);
        bytes
    }

    const SEQ: [u8; 4] = [0xc7, 0x0a, 0x07, 0x6b];

    /// `nfacct add fresh` (nfacct 1.0.2, libnetfilter_acct), captured with
    /// `strace -xx -e trace=sendto -e write=4` in a network namespace of
    /// its own on Linux 6.18.
    #[rustfmt::skip]
    const ADD_FRESH: [u8; 56] = [
        0x38, 0x00, 0x00, 0x00,                         // nlmsg_len = 56
        0x00, 0x07,                                     // NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_NEW
        0x05, 0x04,                                     // NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
        0xc7, 0x0a, 0x07, 0x6b, 0x00, 0x00, 0x00, 0x00, // nlmsg_seq, nlmsg_pid
        0x00, 0x00, 0x00, 0x00,                         // nfgenmsg: AF_UNSPEC, V0, res_id 0
        0x0a, 0x00, 0x01, 0x00, 0x66, 0x72, 0x65, 0x73, // NFACCT_NAME "fresh\0" (len 10)
        0x68, 0x00, 0x00, 0x00,                         //   + padding
        0x0c, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, // NFACCT_PKTS = 0
        0x00, 0x00, 0x00, 0x00,
        0x0c, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, // NFACCT_BYTES = 0
        0x00, 0x00, 0x00, 0x00,
    ];

    /// `nfacct get localhost_nps_accepted_pkts`, captured the same way.
    #[rustfmt::skip]
    const GET_LOCALHOST: [u8; 52] = [
        0x34, 0x00, 0x00, 0x00,                         // nlmsg_len = 52
        0x01, 0x07,                                     // NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_GET
        0x05, 0x00,                                     // NLM_F_REQUEST | NLM_F_ACK
        0xc7, 0x0a, 0x07, 0x6b, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,                         // nfgenmsg
        0x20, 0x00, 0x01, 0x00,                         // NFACCT_NAME, len 32
        0x6c, 0x6f, 0x63, 0x61, 0x6c, 0x68, 0x6f, 0x73, // "localhost_nps_accepted_pkts\0"
        0x74, 0x5f, 0x6e, 0x70, 0x73, 0x5f, 0x61, 0x63,
        0x63, 0x65, 0x70, 0x74, 0x65, 0x64, 0x5f, 0x70,
        0x6b, 0x74, 0x73, 0x00,
    ];

    /// The kernel's answer to that `GET` (`strace -e read=4` of `recvmsg`)
    /// after 3 UDP datagrams of 34 bytes matched `iptables-legacy -A OUTPUT
    /// -o lo -p udp -m nfacct --nfacct-name localhost_nps_accepted_pkts`.
    #[rustfmt::skip]
    const GOT_LOCALHOST: [u8; 84] = [
        0x54, 0x00, 0x00, 0x00,                         // nlmsg_len = 84
        0x00, 0x07,                                     // NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_NEW
        0x02, 0x00,                                     // NLM_F_MULTI
        0xc7, 0x0a, 0x07, 0x6b, 0xf1, 0x30, 0x00, 0x00, // nlmsg_seq, nlmsg_pid
        0x00, 0x00, 0x00, 0x00,                         // nfgenmsg
        0x20, 0x00, 0x01, 0x00,                         // NFACCT_NAME, len 32
        0x6c, 0x6f, 0x63, 0x61, 0x6c, 0x68, 0x6f, 0x73,
        0x74, 0x5f, 0x6e, 0x70, 0x73, 0x5f, 0x61, 0x63,
        0x63, 0x65, 0x70, 0x74, 0x65, 0x64, 0x5f, 0x70,
        0x6b, 0x74, 0x73, 0x00,
        0x0c, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, // NFACCT_PKTS = 3
        0x00, 0x00, 0x00, 0x03,
        0x0c, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, // NFACCT_BYTES = 102
        0x00, 0x00, 0x00, 0x66,
        0x08, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x02, // NFACCT_USE = 2
    ];

    /// One entry of `nfacct list`'s dump: the 29-character name pads to 32.
    #[rustfmt::skip]
    const LISTED_CT_INVALID: [u8; 88] = [
        0x58, 0x00, 0x00, 0x00, 0x00, 0x07, 0x02, 0x00, // len 88, ACCT_NEW, NLM_F_MULTI
        0xc7, 0x0a, 0x07, 0x6b, 0xf9, 0x30, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x22, 0x00, 0x01, 0x00,                         // NFACCT_NAME, len 34
        0x63, 0x74, 0x5f, 0x73, 0x74, 0x61, 0x74, 0x65, // "ct_state_invalid_dropped_pkts\0"
        0x5f, 0x69, 0x6e, 0x76, 0x61, 0x6c, 0x69, 0x64,
        0x5f, 0x64, 0x72, 0x6f, 0x70, 0x70, 0x65, 0x64,
        0x5f, 0x70, 0x6b, 0x74, 0x73, 0x00, 0x00, 0x00,
        0x0c, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x0c, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x08, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01,
    ];

    #[test]
    fn new_request_bytes_match_the_nfacct_tool() {
        assert_eq!(with_seq(emit(new_request("fresh")), SEQ), ADD_FRESH);
    }

    #[test]
    fn get_request_bytes_match_the_nfacct_tool() {
        assert_eq!(with_seq(emit(get_request("localhost_nps_accepted_pkts")), SEQ), GET_LOCALHOST);
    }

    #[test]
    fn delete_request_is_a_get_with_the_del_command() {
        let mut want = GET_LOCALHOST.to_vec();
        want[4] = 0x03; // NFNL_MSG_ACCT_DEL
        assert_eq!(with_seq(emit(delete_request("localhost_nps_accepted_pkts")), SEQ), want);
    }

    #[test]
    fn reads_the_kernels_description_of_a_counted_object() {
        let (header, msg) = parse_captured(&GOT_LOCALHOST);
        assert_eq!(header.flags, NLM_F_MULTIPART);
        assert_eq!(msg.command, AcctCommand::New);
        assert_eq!(msg.attrs.last(), Some(&AcctAttr::Use(2)));
        let counter = Counter::from_message(&msg).expect("a counter");
        assert_eq!(counter, Counter { name: "localhost_nps_accepted_pkts".into(), packets: 3, bytes: 102 });
        let (_, listed) = parse_captured(&LISTED_CT_INVALID);
        let counter = Counter::from_message(&listed).expect("a counter");
        assert_eq!(counter, Counter { name: "ct_state_invalid_dropped_pkts".into(), packets: 0, bytes: 0 });
    }

    #[test]
    fn replies_round_trip_to_the_same_bytes() {
        for captured in [&GOT_LOCALHOST[..], &LISTED_CT_INVALID[..], &ADD_FRESH[..], &GET_LOCALHOST[..]] {
            let nl = NetlinkMessage::<AcctMessage>::deserialize(captured).expect("parses");
            let mut buf = vec![0; nl.buffer_len()];
            nl.serialize(&mut buf);
            assert_eq!(buf, captured);
        }
    }

    #[test]
    fn unknown_attributes_are_kept() {
        // A quota object's NFACCT_FLAGS (5) after the captured attributes.
        let mut bytes = GOT_LOCALHOST.to_vec();
        bytes.extend_from_slice(&[0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x01]);
        bytes[0] += 8;
        let (_, msg) = parse_captured(&bytes);
        assert_eq!(msg.attrs.last(), Some(&AcctAttr::Other(DefaultNla::new(5, vec![0, 0, 0, 1]))));
        assert_eq!(Counter::from_message(&msg).map(|c| c.packets), Ok(3));
    }

    #[test]
    fn malformed_replies_are_errors() {
        let payload = &GOT_LOCALHOST[16..];
        // Another subsystem (ctnetlink) with the same bytes.
        assert!(parse(0x0100, payload).is_err());
        // NFACCT_PKTS of 4 bytes.
        let mut short = payload.to_vec();
        short[36..40].copy_from_slice(&[0x08, 0x00, 0x02, 0x00]);
        assert!(parse(0x0700, &short[..]).is_err(), "a 4-byte NFACCT_PKTS");
        // A name without its NUL.
        let mut unterminated = payload.to_vec();
        unterminated[35] = b'x';
        assert!(parse(0x0700, &unterminated).is_err());
        // A description without its byte count is not a counter.
        let msg = parse(0x0700, &payload[..48]).expect("name and packets parse");
        assert_eq!(Counter::from_message(&msg), Err(Unusable::Missing("NFACCT_BYTES")));
        let get = parse(0x0701, &GET_LOCALHOST[16..]).expect("a GET parses");
        assert!(Counter::from_message(&get).is_err(), "a GET is no description");
    }

    #[test]
    fn names_are_checked_before_they_are_sent() {
        assert_eq!(check_name("ct_state_invalid_dropped_pkts"), Ok(()));
        assert_eq!(check_name(&"x".repeat(31)), Ok(()));
        assert_eq!(check_name(&"x".repeat(32)), Err(NameError::TooLong("x".repeat(32))));
        assert_eq!(check_name(""), Err(NameError::Empty));
        assert_eq!(check_name("a\0b"), Err(NameError::Nul("a\0b".into())));
    }
}
