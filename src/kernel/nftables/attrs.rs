//! Netlink attributes of nf_tables expressions and data, as raw
//! [`DefaultNla`]s: the numbers of include/uapi/linux/netfilter/nf_tables.h.

use netlink_packet_core::{DefaultNla, Emitable, NLA_F_NESTED};

use crate::msgs::nftables::Verdict;

const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

pub fn u32_attr(kind: u16, v: u32) -> DefaultNla {
    DefaultNla::new(kind, v.to_be_bytes().to_vec())
}

pub fn str_attr(kind: u16, s: &str) -> DefaultNla {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    DefaultNla::new(kind, v)
}

/// A nested attribute of `kind` holding `inner`.
pub fn nested(kind: u16, inner: &[DefaultNla]) -> DefaultNla {
    let mut value = vec![0; inner.buffer_len()];
    inner.emit(&mut value);
    DefaultNla::new(kind | NLA_F_NESTED, value)
}

/// `NFTA_DATA_VALUE` data in attribute `kind`.
pub fn data_value(kind: u16, bytes: &[u8]) -> DefaultNla {
    nested(kind, &[DefaultNla::new(NFTA_DATA_VALUE, bytes.to_vec())])
}

/// `NFTA_DATA_VERDICT` data in attribute `kind`.
pub fn verdict_data(kind: u16, v: &Verdict) -> DefaultNla {
    let (code, chain): (i32, Option<&str>) = match v {
        Verdict::Accept => (1, None),
        Verdict::Drop => (0, None),
        Verdict::Return => (-5, None),
        Verdict::Jump(c) => (-3, Some(c)),
        Verdict::Goto(c) => (-4, Some(c)),
    };
    let mut inner = vec![DefaultNla::new(NFTA_VERDICT_CODE, code.to_be_bytes().to_vec())];
    if let Some(c) = chain {
        inner.push(str_attr(NFTA_VERDICT_CHAIN, c));
    }
    nested(kind, &[nested(NFTA_DATA_VERDICT, &inner)])
}
