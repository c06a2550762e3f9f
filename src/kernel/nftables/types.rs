//! The values of nf_tables keys and verdicts that ops, rules and elements
//! share: key types (nft's datatype ids), key fields and their bytes,
//! verdicts, and how nft writes them.

use std::fmt;
use std::net::IpAddr;

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
    pub fn id(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 7,
            KeyType::Ipv6Addr => 8,
            KeyType::InetProto => 12,
            KeyType::InetService => 13,
        }
    }

    /// The field's own length in bytes.
    pub fn field_len(self) -> u32 {
        match self {
            KeyType::Ipv4Addr => 4,
            KeyType::Ipv6Addr => 16,
            KeyType::InetProto => 1,
            KeyType::InetService => 2,
        }
    }
}

impl KeyType {
    /// One of nft's type names (`ipv4_addr`, `inet_proto`, ...).
    pub fn parse(name: &str) -> Option<KeyType> {
        Some(match name {
            "ipv4_addr" => KeyType::Ipv4Addr,
            "ipv6_addr" => KeyType::Ipv6Addr,
            "inet_proto" => KeyType::InetProto,
            "inet_service" => KeyType::InetService,
            _ => return None,
        })
    }

    /// A `type` clause's key (`ipv4_addr . inet_proto . inet_service`).
    pub fn parse_concat(text: &str) -> Option<Vec<KeyType>> {
        text.split(" . ").map(|t| KeyType::parse(t.trim())).collect()
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

impl KeyPart {
    /// A key field as nft writes it: an address, a protocol name, a port.
    pub fn parse(field: &str) -> Option<KeyPart> {
        if let Ok(a) = field.parse::<IpAddr>() {
            return Some(KeyPart::Addr(a));
        }
        match field {
            "tcp" => Some(KeyPart::Proto(6)),
            "udp" => Some(KeyPart::Proto(17)),
            "sctp" => Some(KeyPart::Proto(132)),
            _ => field.parse().ok().map(KeyPart::Port),
        }
    }
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

impl Verdict {
    /// `accept`, `drop`, `return`, `jump CHAIN`, `goto CHAIN`.
    pub fn parse(text: &str) -> Option<Verdict> {
        let mut w = text.split_whitespace();
        let v = match (w.next()?, w.next()) {
            ("accept", None) => Verdict::Accept,
            ("drop", None) => Verdict::Drop,
            ("return", None) => Verdict::Return,
            ("jump", Some(c)) => Verdict::Jump(c.to_string()),
            ("goto", Some(c)) => Verdict::Goto(c.to_string()),
            _ => return None,
        };
        w.next().is_none().then_some(v)
    }
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

impl KeyType {
    /// The field's length padded to a 32-bit register.
    pub fn padded_len(self) -> u32 {
        match self {
            KeyType::Ipv6Addr => 16,
            _ => 4,
        }
    }
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
