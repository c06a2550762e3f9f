//! The values nf_tables ops, rules and elements share: key types (nft's
//! datatypes), key parts and compared values, verdicts, mark bits, and how
//! `nft` writes each.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::net::{IpFamily, Protocol};

/// `ip` or `ip6`: a table's family, and the prefix of its address matches.
pub fn nft_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// Go's `%q` for the strings upstream quotes (names, IPs, fixed comments):
/// quotes and backslashes escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One field of a set's key: nft's datatypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    /// A 32-bit number in host order: a `numgen` result (a slot).
    Integer,
}

impl KeyType {
    /// `ipv4_addr` or `ipv6_addr`.
    pub fn addr(family: IpFamily) -> KeyType {
        match family {
            IpFamily::V4 => KeyType::Ipv4Addr,
            IpFamily::V6 => KeyType::Ipv6Addr,
        }
    }

    /// nft's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Integer => "integer",
        }
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One field of an element's key, or the value a rule compares a field
/// with: an address, a CIDR (an interval), a protocol, a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyPart {
    Addr(IpAddr),
    Net(IpNet),
    Proto(Protocol),
    Port(u16),
    /// A slot: the number a `numgen` yields (host order).
    Slot(u32),
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::Addr(a) => write!(f, "{a}"),
            KeyPart::Net(n) => write!(f, "{n}"),
            KeyPart::Proto(p) => f.write_str(p.lower()),
            KeyPart::Port(p) => write!(f, "{p}"),
            KeyPart::Slot(n) => write!(f, "{n}"),
        }
    }
}

/// Values written one after the other, `sep` between them.
pub struct Joined<'a, T>(pub &'a [T], pub &'static str);

impl<T: fmt::Display> fmt::Display for Joined<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(self.1)?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}

/// A key (or a concatenation) as nft writes it: its parts joined by ` . `.
pub fn concat<T>(parts: &[T]) -> Joined<'_, T> {
    Joined(parts, " . ")
}

/// A verdict: a rule's, or a verdict map element's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    /// The chain a jump or goto continues in.
    pub fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
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

/// A 32-bit constant written in hex, `width` characters wide with its
/// `0x` (upstream prints the masquerade mark as `%#08x`: `0x004000`; its
/// test fixtures write `0x4000`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hex {
    pub value: u32,
    pub width: usize,
}

impl fmt::Display for Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#0width$x}", self.value, width = self.width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_nft_writes_them() {
        assert_eq!(Hex { value: 0x4000, width: 8 }.to_string(), "0x004000");
        assert_eq!(Hex { value: 0x4000, width: 0 }.to_string(), "0x4000");
        assert_eq!(Hex { value: 1 << 31, width: 8 }.to_string(), "0x80000000");
        let key = [KeyPart::Addr("10.96.0.10".parse().unwrap()), KeyPart::Proto(Protocol::Udp), KeyPart::Port(53)];
        assert_eq!(concat(&key).to_string(), "10.96.0.10 . udp . 53");
        assert_eq!(KeyPart::Net("fd00::/64".parse().unwrap()).to_string(), "fd00::/64");
        assert_eq!(Verdict::Goto("service-X".into()).to_string(), "goto service-X");
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }
}
