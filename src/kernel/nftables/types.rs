//! The wire form of set keys: nft's datatype ids and lengths of each key
//! type, and an element's key bytes.

use std::net::IpAddr;

use super::expr::Unencodable;
use crate::msgs::nftables::{KeyPart, KeyType};

/// nft's datatype id of `k` (nftables' include/datatype.h).
pub fn type_id(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 7,
        KeyType::Ipv6Addr => 8,
        KeyType::InetProto => 12,
        KeyType::InetService => 13,
    }
}

/// The field's own length in bytes.
pub fn field_len(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 4,
        KeyType::Ipv6Addr => 16,
        KeyType::InetProto => 1,
        KeyType::InetService => 2,
    }
}

/// The field's length padded to a 32-bit register.
pub fn padded_len(k: KeyType) -> u32 {
    field_len(k).next_multiple_of(4)
}

/// An element's key: each field in network order, padded to 4 bytes. A
/// CIDR is not a key of the sets here (no interval sets).
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
            KeyPart::Net(n) => return Err(Unencodable::IntervalKey { key: *n }),
        }
    }
    Ok(out)
}
