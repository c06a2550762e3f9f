//! Typed rules → nf_tables expressions: each match and statement of a
//! [`Rule`] compiled into the expressions `nft` sends for the same rule
//! text (payload, meta, cmp, bitwise, lookup and vmap over concatenations,
//! anonymous `numgen` maps and interval sets, ct, fib, dynset, nat, masq,
//! reject, immediate verdicts), so `nft list` prints what upstream wrote.
//!
//! Registers as `nft` uses them: a single value in register 1; a
//! concatenation's fields from register 1 on in 32-bit steps (8 + words).

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::Expressions;

use super::attrs::{data_value, str_attr, u32_attr, verdict_data};
use super::types::padded_len;
use crate::msgs::nftables::{CtState, CtStatus, Expr, FibKey, Field, KeyPart, MarkOp, Rule, Verdict};
use crate::net::IpFamily;

/// An op the codec cannot encode (a planner bug, or a rule form `nft`
/// itself resolves by reading the system); nothing is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {what:?}: {why}")]
pub struct EncodeError {
    /// The op or rule, as upstream writes it.
    pub what: String,
    #[source]
    pub why: Unencodable,
}

/// Why an op or a rule cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unencodable {
    #[error("a {field} match in a table of the other family")]
    OtherFamily { field: Field },
    #[error("{field} compared with {value}")]
    Mismatch { field: Field, value: KeyPart },
    #[error("an anonymous set of {field}")]
    AnonymousSetOf { field: Field },
    #[error("{item} in an anonymous set of {field}")]
    AnonymousItem { item: KeyPart, field: Field },
    /// `nft` resolves an interface name to its index when it reads the rule.
    #[error("iif {name}: an interface is matched by its index, not encoded")]
    Interface { name: String },
    #[error("dnat to {addr} in a table of the other family")]
    DnatOtherFamily { addr: IpAddr },
    #[error("{key}: an interval key in a set without intervals")]
    IntervalKey { key: IpNet },
    #[error("a rule (its expressions) or a source of elements (its runs) is not one object's message")]
    NotOneMessage,
    #[error("a {field} match compared with a value")]
    NotComparable { field: Field },
}

/// An anonymous set a rule needs, created in the same transaction before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonSet {
    /// Referenced by the rule's lookup (unique within the table).
    pub id: u32,
    pub key: AnonKey,
    /// The elements: keys, their verdicts in a map, interval ends.
    pub elements: Vec<AnonElement>,
}

/// One element of an anonymous set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonElement {
    pub key: Vec<u8>,
    pub verdict: Option<Verdict>,
    /// The first address after an interval.
    pub interval_end: bool,
}

/// An anonymous set's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnonKey {
    /// `numgen` results (host-order integers), a verdict map.
    Integer,
    /// Addresses and CIDRs of one family, an interval set.
    Addr(IpFamily),
}

/// The name of anonymous set `id` with key `key`: `__map<id>` or
/// `__set<id>`, written out. `nft` sends `__map%d` and the kernel then
/// numbers the set by reading every set of the table (a `sscanf` each, per
/// anonymous set: quadratic over a cold sync); with the number written out
/// it only checks the name is free. Listings do not show these names (the
/// set's anonymous flag makes `nft` print it inline), so the table lists as
/// `nft`'s does. The caller keeps ids unique within the table.
pub fn anon_name(key: AnonKey, id: u32) -> String {
    match key {
        AnonKey::Integer => format!("__map{id}"),
        AnonKey::Addr(_) => format!("__set{id}"),
    }
}

/// A compiled rule.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub exprs: Vec<Expressions>,
    pub anon: Vec<AnonSet>,
}

// Registers (include/uapi/linux/netfilter/nf_tables.h).
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_REG32_00: u32 = 8;
/// NFT_META_L4PROTO, NFT_META_MARK.
const META_L4PROTO: u32 = 16;
const META_MARK: u32 = 3;
/// NFT_LOOKUP_F_INV.
const LOOKUP_INV: u32 = 1;
/// NFT_CT_STATE, NFT_CT_STATUS (NFT_CT_DIRECTION is 1).
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
/// NFT_NAT_DNAT.
const NAT_DNAT: u32 = 1;

/// Compiles `rule` for a table of `family`; anonymous sets get ids from `next_id`.
pub fn compile(family: IpFamily, rule: &Rule, next_id: &mut u32) -> Result<Compiled, EncodeError> {
    let mut c = Compiler { family, exprs: Vec::new(), anon: Vec::new(), next_id };
    for e in &rule.exprs {
        c.expr(e).map_err(|why| EncodeError { what: rule.to_string(), why })?;
    }
    Ok(Compiled { exprs: c.exprs, anon: c.anon })
}

struct Compiler<'a> {
    family: IpFamily,
    exprs: Vec<Expressions>,
    anon: Vec<AnonSet>,
    next_id: &'a mut u32,
}

impl Compiler<'_> {
    fn expr(&mut self, e: &Expr) -> Result<(), Unencodable> {
        match e {
            Expr::Cmp { field, neq, value } => {
                self.load(*field, NFT_REG_1)?;
                self.cmp_value(*field, *neq, value)
            }
            Expr::InAnon { field, neq, set } => {
                self.load(*field, NFT_REG_1)?;
                self.anonymous_set(*field, *neq, &set.items)
            }
            Expr::ProtoDport { proto, port } => {
                self.load(Field::L4proto, NFT_REG_1)?;
                self.cmp(false, &[proto.number()]);
                self.load(Field::Dport, NFT_REG_1)?;
                self.cmp(false, &port.to_be_bytes());
                Ok(())
            }
            Expr::Lookup { key, set } => {
                self.load_concat(key)?;
                self.push("lookup", vec![str_attr(1, set), u32_attr(2, NFT_REG_1)]);
                Ok(())
            }
            Expr::Vmap { key, map } => {
                self.load_concat(key)?;
                self.push("lookup", vec![str_attr(1, map), u32_attr(2, NFT_REG_1), u32_attr(3, NFT_REG_VERDICT)]);
                Ok(())
            }
            Expr::NumgenVmap(verdicts) => {
                self.numgen_vmap(verdicts);
                Ok(())
            }
            Expr::CtState(state) => {
                self.ct_state(*state);
                Ok(())
            }
            Expr::CtStatus(CtStatus::Dnat) => {
                // IPS_DST_NAT: the status's bit 5, set: not zero.
                self.push("ct", vec![u32_attr(1, NFT_REG_1), u32_attr(2, CT_STATUS)]);
                self.bitwise(&0x20u32.to_ne_bytes(), &[0; 4]);
                self.cmp(true, &[0; 4]);
                Ok(())
            }
            Expr::FibLocal(key) => {
                self.fib_local(*key);
                Ok(())
            }
            Expr::MarkTest { mask, value } => {
                self.push("meta", vec![u32_attr(1, NFT_REG_1), u32_attr(2, META_MARK)]);
                self.bitwise(&mask.value.to_ne_bytes(), &[0; 4]);
                self.cmp(false, &value.to_ne_bytes());
                Ok(())
            }
            Expr::Iif { name, .. } => Err(Unencodable::Interface { name: name.clone() }),
            Expr::Update { set, key } => {
                self.load_concat(key)?;
                // NFTA_DYNSET_SET_NAME, OP (NFT_DYNSET_OP_UPDATE = 1), SREG_KEY.
                self.push("dynset", vec![str_attr(1, set), u32_attr(3, 1), u32_attr(4, NFT_REG_1)]);
                Ok(())
            }
            Expr::MarkSet { op, bits } => {
                let (mask, xor) = match op {
                    MarkOp::Or => (!bits.value, bits.value),
                    MarkOp::Xor => (u32::MAX, bits.value),
                };
                self.push("meta", vec![u32_attr(1, NFT_REG_1), u32_attr(2, META_MARK)]);
                self.bitwise(&mask.to_ne_bytes(), &xor.to_ne_bytes());
                // meta set mark (NFTA_META_SREG = 3).
                self.push("meta", vec![u32_attr(2, META_MARK), u32_attr(3, NFT_REG_1)]);
                Ok(())
            }
            Expr::Dnat(to) => self.dnat(to.ip(), to.port()),
            Expr::DnatMap { family, key, map } => {
                if *family != self.family {
                    return Err(Unencodable::OtherFamily { field: Field::Daddr(*family) });
                }
                self.load_concat(key)?;
                self.push("lookup", vec![str_attr(1, map), u32_attr(2, NFT_REG_1), u32_attr(3, NFT_REG_1)]);
                // The port follows the address in the registers the lookup filled.
                let addr_words = padded_len(crate::msgs::nftables::KeyType::addr(self.family)) / 4;
                self.nat_dnat(NFT_REG_1, NFT_REG32_00 + addr_words);
                Ok(())
            }
            Expr::Masquerade { fully_random } => {
                let mut attrs = Vec::new();
                if *fully_random {
                    attrs.push(u32_attr(1, 0x10)); // NF_NAT_RANGE_PROTO_RANDOM_FULLY
                }
                self.push("masq", attrs);
                Ok(())
            }
            Expr::Reject => {
                // NFT_REJECT_ICMP_UNREACH; ICMP (3) or ICMPv6 (4) port unreachable.
                let code: u8 = if self.family == IpFamily::V4 { 3 } else { 4 };
                self.push("reject", vec![u32_attr(1, 0), DefaultNla::new(2, vec![code])]);
                Ok(())
            }
            Expr::Verdict(v) => {
                self.push("immediate", vec![u32_attr(1, NFT_REG_VERDICT), verdict_data(2, v)]);
                Ok(())
            }
        }
    }

    /// Loads `field` into register `reg`.
    fn load(&mut self, field: Field, reg: u32) -> Result<(), Unencodable> {
        // (base: network 1, transport 2; offset; length).
        let (base, offset, len) = match field {
            Field::Saddr(f) | Field::Daddr(f) if f != self.family => return Err(Unencodable::OtherFamily { field }),
            Field::Saddr(IpFamily::V4) => (1, 12, 4),
            Field::Daddr(IpFamily::V4) => (1, 16, 4),
            Field::Saddr(IpFamily::V6) => (1, 8, 16),
            Field::Daddr(IpFamily::V6) => (1, 24, 16),
            Field::Dport => (2, 2, 2),
            Field::L4proto => {
                self.push("meta", vec![u32_attr(1, reg), u32_attr(2, META_L4PROTO)]);
                return Ok(());
            }
            Field::Numgen { modulus, offset } => {
                // NFTA_NG_DREG, MODULUS, TYPE (NFT_NG_RANDOM = 1), OFFSET.
                let mut attrs = vec![u32_attr(1, reg), u32_attr(2, modulus), u32_attr(3, 1)];
                if offset != 0 {
                    attrs.push(u32_attr(4, offset));
                }
                self.push("numgen", attrs);
                return Ok(());
            }
        };
        self.push("payload", vec![u32_attr(1, reg), u32_attr(2, base), u32_attr(3, offset), u32_attr(4, len)]);
        Ok(())
    }

    /// A concatenation's fields from register 1 on, in 32-bit steps.
    fn load_concat(&mut self, key: &[Field]) -> Result<(), Unencodable> {
        let mut word = 0;
        for (i, field) in key.iter().enumerate() {
            let reg = if i == 0 { NFT_REG_1 } else { NFT_REG32_00 + word };
            self.load(*field, reg)?;
            word += padded_len(field.key_type()) / 4;
        }
        Ok(())
    }

    /// Register 1 (holding `field`) equal to (`neq`: not) `value`.
    fn cmp_value(&mut self, field: Field, neq: bool, value: &KeyPart) -> Result<(), Unencodable> {
        match (field, value) {
            (Field::Saddr(_) | Field::Daddr(_), KeyPart::Addr(a)) if self.family.matches(a) => {
                self.addr_cmp(IpNet::from(*a), neq)
            }
            (Field::Saddr(_) | Field::Daddr(_), KeyPart::Net(n)) if self.family.matches(&n.addr()) => {
                self.addr_cmp(n.trunc(), neq)
            }
            (Field::L4proto, KeyPart::Proto(p)) => self.cmp(neq, &[p.number()]),
            (Field::Dport, KeyPart::Port(p)) => self.cmp(neq, &p.to_be_bytes()),
            (Field::Numgen { .. }, _) => return Err(Unencodable::NotComparable { field }),
            _ => return Err(Unencodable::Mismatch { field, value: *value }),
        }
        Ok(())
    }

    fn cmp(&mut self, neq: bool, data: &[u8]) {
        // NFT_CMP_EQ 0, NFT_CMP_NEQ 1.
        self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, u32::from(neq)), data_value(3, data)]);
    }

    /// The loaded address in (or, `neq`, not in) `net`: a compare, after a
    /// mask unless `net` is one address.
    fn addr_cmp(&mut self, net: IpNet, neq: bool) {
        if net.prefix_len() != net.max_prefix_len() {
            let mask = addr_bytes(net.netmask());
            let zero = vec![0; mask.len()];
            self.bitwise(&mask, &zero);
        }
        self.cmp(neq, &addr_bytes(net.network()));
    }

    fn new_id(&mut self) -> u32 {
        *self.next_id += 1;
        *self.next_id
    }

    /// Addresses and CIDRs: an anonymous interval set; of one item, a
    /// compare, as `nft` writes it (`ip daddr { 10.96.0.0/16 }` is listed
    /// as `ip daddr 10.96.0.0/16`).
    fn anonymous_set(&mut self, field: Field, neq: bool, items: &[KeyPart]) -> Result<(), Unencodable> {
        if !matches!(field, Field::Saddr(_) | Field::Daddr(_)) {
            return Err(Unencodable::AnonymousSetOf { field });
        }
        let nets = items
            .iter()
            .map(|item| match item {
                KeyPart::Addr(a) if self.family.matches(a) => Ok(IpNet::from(*a)),
                KeyPart::Net(n) if self.family.matches(&n.addr()) => Ok(n.trunc()),
                item => Err(Unencodable::AnonymousItem { item: *item, field }),
            })
            .collect::<Result<Vec<IpNet>, Unencodable>>()?;
        if let [net] = nets[..] {
            self.addr_cmp(net, neq);
            return Ok(());
        }
        let id = self.new_id();
        let key = AnonKey::Addr(self.family);
        self.anon.push(AnonSet { id, key, elements: interval_elements(&nets) });
        let mut attrs = vec![str_attr(1, &anon_name(key, id)), u32_attr(2, NFT_REG_1), u32_attr(4, id)];
        if neq {
            attrs.push(u32_attr(5, LOOKUP_INV));
        }
        self.push("lookup", attrs);
        Ok(())
    }

    /// `ct state new`.
    fn ct_state(&mut self, state: CtState) {
        let bit: u32 = match state {
            CtState::New => 8,
        };
        // The state's bit set: not zero.
        self.push("ct", vec![u32_attr(1, NFT_REG_1), u32_attr(2, CT_STATE)]);
        self.bitwise(&bit.to_ne_bytes(), &[0; 4]);
        self.cmp(true, &[0; 4]);
    }

    /// `fib saddr type local` / `fib daddr type local`.
    fn fib_local(&mut self, key: FibKey) {
        let flags: u32 = match key {
            FibKey::Saddr => 1,
            FibKey::Daddr => 2,
        };
        // NFT_FIB_RESULT_ADDRTYPE = 3; RTN_LOCAL = 2, host order.
        self.push("fib", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 3), u32_attr(3, flags)]);
        self.cmp(false, &2u32.to_ne_bytes());
    }

    /// `numgen random mod N vmap { 0 : v0 , ... }`: an anonymous verdict map.
    fn numgen_vmap(&mut self, verdicts: &[Verdict]) {
        let elements = verdicts
            .iter()
            .enumerate()
            .map(|(n, v)| AnonElement {
                key: (n as u32).to_ne_bytes().to_vec(),
                verdict: Some(v.clone()),
                interval_end: false,
            })
            .collect();
        // NFTA_NG_DREG, MODULUS, TYPE (NFT_NG_RANDOM = 1).
        self.push("numgen", vec![u32_attr(1, NFT_REG_1), u32_attr(2, verdicts.len() as u32), u32_attr(3, 1)]);
        let id = self.new_id();
        self.anon.push(AnonSet { id, key: AnonKey::Integer, elements });
        self.push(
            "lookup",
            vec![
                str_attr(1, &anon_name(AnonKey::Integer, id)),
                u32_attr(2, NFT_REG_1),
                u32_attr(3, NFT_REG_VERDICT),
                u32_attr(4, id),
            ],
        );
    }

    /// `dnat to A:P`.
    fn dnat(&mut self, addr: IpAddr, port: u16) -> Result<(), Unencodable> {
        if !self.family.matches(&addr) {
            return Err(Unencodable::DnatOtherFamily { addr });
        }
        self.push("immediate", vec![u32_attr(1, NFT_REG_1), data_value(2, &addr_bytes(addr))]);
        self.push("immediate", vec![u32_attr(1, NFT_REG_2), data_value(2, &port.to_be_bytes())]);
        self.nat_dnat(NFT_REG_1, NFT_REG_2);
        Ok(())
    }

    /// DNAT to the address in register `addr` and the port in register `port`.
    fn nat_dnat(&mut self, addr: u32, port: u32) {
        let nfproto = if self.family == IpFamily::V4 { 2 } else { 10 };
        // NFTA_NAT_TYPE, FAMILY, REG_ADDR_MIN, REG_PROTO_MIN, FLAGS (PROTO_SPECIFIED).
        self.push(
            "nat",
            vec![u32_attr(1, NAT_DNAT), u32_attr(2, nfproto), u32_attr(3, addr), u32_attr(5, port), u32_attr(7, 2)],
        );
    }

    /// Register 1 = (register 1 & `mask`) ^ `xor`, over `mask`'s length.
    fn bitwise(&mut self, mask: &[u8], xor: &[u8]) {
        let len = mask.len() as u32;
        let attrs = vec![
            u32_attr(1, NFT_REG_1),
            u32_attr(2, NFT_REG_1),
            u32_attr(3, len),
            data_value(4, mask),
            data_value(5, xor),
        ];
        self.push("bitwise", attrs);
    }

    fn push(&mut self, name: &str, attributes: Vec<DefaultNla>) {
        self.exprs.push(Expressions::Other { expression_type: name.to_string(), attributes });
    }
}

fn addr_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// An interval set's elements for `nets`: each merged range's first
/// address, and the address after its last as an interval end (none past
/// the top of the address space).
fn interval_elements(nets: &[IpNet]) -> Vec<AnonElement> {
    let mut ranges: Vec<(u128, u128, usize)> = nets
        .iter()
        .map(|n| {
            let (lo, hi) = match (n.network(), n.broadcast()) {
                (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b))),
                (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b)),
                _ => (0, 0),
            };
            (lo, hi, if n.addr().is_ipv4() { 4 } else { 16 })
        })
        .collect();
    ranges.sort();
    let mut merged: Vec<(u128, u128, usize)> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.0 <= last.1.saturating_add(1) => last.1 = last.1.max(r.1),
            _ => merged.push(r),
        }
    }
    let bytes = |v: u128, len: usize| v.to_be_bytes()[16 - len..].to_vec();
    let mut out = Vec::new();
    for (lo, hi, len) in merged {
        out.push(AnonElement { key: bytes(lo, len), verdict: None, interval_end: false });
        let top = if len == 4 { u128::from(u32::MAX) } else { u128::MAX };
        if hi < top {
            out.push(AnonElement { key: bytes(hi + 1, len), verdict: None, interval_end: true });
        }
    }
    out
}
