//! The wire form of set key types: nft's datatype ids and the lengths of
//! each.

use crate::msgs::nftables::KeyType;

/// nft's datatype id of `k` (nftables' include/datatype.h).
pub fn type_id(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 7,
        KeyType::Ipv6Addr => 8,
        KeyType::InetProto => 12,
        KeyType::InetService => 13,
        KeyType::Integer => 4,
    }
}

/// The field's own length in bytes.
pub fn field_len(k: KeyType) -> u32 {
    match k {
        KeyType::Ipv4Addr => 4,
        KeyType::Ipv6Addr => 16,
        KeyType::InetProto => 1,
        KeyType::InetService => 2,
        KeyType::Integer => 4,
    }
}

/// The field's length padded to a 32-bit register.
pub fn padded_len(k: KeyType) -> u32 {
    field_len(k).next_multiple_of(4)
}

/// A concatenation's type: nft's datatype ids chained 6 bits apart.
pub fn concat_type(types: &[KeyType]) -> u32 {
    types.iter().fold(0u32, |acc, k| (acc << 6) | type_id(*k))
}

/// A concatenation's length: the fields each padded to a register.
pub fn concat_len(types: &[KeyType]) -> u32 {
    types.iter().map(|k| padded_len(*k)).sum()
}
