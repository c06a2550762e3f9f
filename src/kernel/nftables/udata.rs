//! libnftnl's user data: the type-length-value records nft keeps in an
//! object's `NFTA_*_USERDATA`, which the kernel stores and returns as they
//! are and `nft list` reads: comments, and the fields a set defined by
//! `typeof` was declared with (`nft list` prints such a set, and the
//! `numgen` slot of its key, from them; without them it has no name for the
//! slot's type).
//!
//! A record is a type byte, a length byte and the value. The fields of a
//! `typeof` are nft's expression records: the expression's kind, then its
//! attributes in a nested record (numbers are 32-bit, host order).

use crate::msgs::nftables::{Field, SetData, SetSpec};
use crate::net::IpFamily;

/// NFTNL_UDATA_SET_KEYBYTEORDER, DATABYTEORDER, KEY_TYPEOF, DATA_TYPEOF,
/// DATA_INTERVAL, COMMENT.
const SET_KEY_BYTEORDER: u8 = 0;
const SET_DATA_BYTEORDER: u8 = 1;
const SET_KEY_TYPEOF: u8 = 3;
const SET_DATA_TYPEOF: u8 = 4;
const SET_DATA_INTERVAL: u8 = 6;
const SET_COMMENT: u8 = 7;

/// nft's expression kinds (`enum expr_types`).
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;
/// nft's protocol descriptions (`enum proto_desc_id`) and their fields.
const PROTO_TH: u32 = 11;
const PROTO_IP: u32 = 12;
const PROTO_IP6: u32 = 13;
const TH_DPORT: u32 = 2;
const IP_SADDR: u32 = 11;
const IP_DADDR: u32 = 12;
const IP6_SADDR: u32 = 8;
const IP6_DADDR: u32 = 9;
/// NFT_META_L4PROTO; NFT_NG_RANDOM.
const META_L4PROTO: u32 = 16;
const NG_RANDOM: u32 = 1;

/// One record (values longer than 255 bytes are cut: nothing here is).
fn record(kind: u8, value: &[u8]) -> Vec<u8> {
    let value = &value[..value.len().min(255)];
    let mut out = Vec::with_capacity(value.len() + 2);
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
    out
}

fn number(kind: u8, n: u32) -> Vec<u8> {
    record(kind, &n.to_ne_bytes())
}

/// A comment: `kind`, the text and its NUL.
pub fn comment(kind: u8, text: &str) -> Vec<u8> {
    let bytes: Vec<u8> = text.bytes().take(254).chain([0]).collect();
    record(kind, &bytes)
}

/// An expression: its kind, then its attributes.
fn expr(kind: u32, attrs: &[u32]) -> Vec<u8> {
    let nested: Vec<u8> = attrs.iter().enumerate().flat_map(|(i, n)| number(i as u8, *n)).collect();
    [number(0, kind), record(1, &nested)].concat()
}

/// One field as nft's expression record.
fn field(f: Field) -> Vec<u8> {
    match f {
        Field::Saddr(IpFamily::V4) => expr(EXPR_PAYLOAD, &[PROTO_IP, IP_SADDR]),
        Field::Daddr(IpFamily::V4) => expr(EXPR_PAYLOAD, &[PROTO_IP, IP_DADDR]),
        Field::Saddr(IpFamily::V6) => expr(EXPR_PAYLOAD, &[PROTO_IP6, IP6_SADDR]),
        Field::Daddr(IpFamily::V6) => expr(EXPR_PAYLOAD, &[PROTO_IP6, IP6_DADDR]),
        Field::Dport => expr(EXPR_PAYLOAD, &[PROTO_TH, TH_DPORT]),
        Field::L4proto => expr(EXPR_META, &[META_L4PROTO]),
        Field::Numgen { modulus, offset } => expr(EXPR_NUMGEN, &[NG_RANDOM, modulus, offset]),
    }
}

/// Fields as a `typeof`: one field, or their concatenation.
fn fields(fs: &[Field]) -> Vec<u8> {
    match fs {
        [one] => field(*one),
        _ => {
            let items: Vec<u8> = fs.iter().enumerate().flat_map(|(i, f)| record(i as u8, &field(*f))).collect();
            [number(0, EXPR_CONCAT), record(1, &items)].concat()
        }
    }
}

/// A named set's user data as nft writes it for the same definition: for a
/// `typeof` set its byte orders (of a concatenation: none), key fields and
/// data fields; then its comment. Empty when it has neither.
pub fn set(spec: &SetSpec) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(key) = &spec.key_of {
        out.extend(number(SET_KEY_BYTEORDER, 0));
        let data = match &spec.data {
            Some(SetData::Fields(d)) => Some(d),
            _ => None,
        };
        if data.is_some() {
            out.extend(number(SET_DATA_BYTEORDER, 0));
        }
        out.extend(record(SET_KEY_TYPEOF, &fields(key)));
        if let Some(d) = data {
            out.extend(record(SET_DATA_TYPEOF, &fields(d)));
            out.extend(number(SET_DATA_INTERVAL, 0));
        }
    }
    if let Some(c) = &spec.comment {
        out.extend(comment(SET_COMMENT, c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// What `nft -f` (v1.0.6) stored for `map eps { typeof ip daddr . meta
    /// l4proto . th dport . numgen random mod 1 : ip daddr . th dport ; }`,
    /// read back from the kernel (`NFTA_SET_USERDATA` of a set dump).
    #[test]
    fn a_typeof_map_is_described_as_nft_describes_it() {
        let spec = crate::msgs::nftables::example_endpoints_map(IpFamily::V4);
        assert_eq!(
            hex(&set(&spec)),
            "000400000000010400000000036000040d00000001580014000407000000010c00040c00000001040c000000010e00040900000001060004100000000214000407000000010c00040b000000010402000000031a0004170000000112000401000000010401000000020400000000043400040d000000012c0014000407000000010c00040c00000001040c0000000114000407000000010c00040b000000010402000000060400000000"
        );
    }

    #[test]
    fn a_comment_is_its_text_and_nul() {
        assert_eq!(hex(&set(&SetSpec::set("s", vec![], Some("ab")))), "0703616200");
    }
}
