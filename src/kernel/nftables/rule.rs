//! Rule text → nf_tables expressions: the forms upstream's nftables
//! proxier writes (and the planner prints in `--dry-run`), compiled into
//! the expressions `nft` would send for the same text, so one text is both
//! what operators read and what the kernel holds.
//!
//! The grammar is upstream's, no more: matches on `ip`/`ip6` `saddr`/`daddr`
//! (an address, a CIDR, `!=`, `@set`, an anonymous `{ ... }` set),
//! `meta l4proto`, `th dport` in concatenations, `ct state`, `fib ... type
//! local`, `mark and M == V`; then `vmap @map`, `numgen random mod N vmap
//! { ... }`, `update @set { ip saddr }`, `mark set mark or|xor M`,
//! `dnat to A:P`, `masquerade [fully-random]`, `reject`, and the verdicts;
//! `comment "..."` last. Anything else is an error naming the word.
//!
//! Registers as nft uses them: a single value in register 1; a
//! concatenation's fields from register 1 on in 32-bit steps (8 + words).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::DefaultNla;
use netlink_packet_netfilter::nftables::Expressions;

use super::attrs::{data_value, str_attr, u32_attr, verdict_data};
use super::types::{KeyPart, KeyType, Verdict};
use crate::net::IpFamily;

/// A rule that is not in the grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub rule: String,
    pub why: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot compile rule {:?}: {}", self.rule, self.why)
    }
}

impl std::error::Error for RuleError {}

/// An anonymous set a rule needs, created in the same transaction before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonSet {
    /// Referenced by the rule's lookup (unique within the transaction).
    pub id: u32,
    pub key: AnonKey,
    /// The elements: keys (and verdicts, for a map).
    pub elements: Vec<(Vec<u8>, Option<Verdict>, bool)>,
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
    pub comment: Option<String>,
}

// Expression attributes (include/uapi/linux/netfilter/nf_tables.h).
const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_REG32_00: u32 = 8;

/// Compiles `text` for a table of `family`; anonymous sets get ids from `next_id`.
pub fn compile(family: IpFamily, text: &str, next_id: &mut u32) -> Result<Compiled, RuleError> {
    let err = |why: String| RuleError { rule: text.to_string(), why };
    let (body, comment) = split_comment(text).map_err(err)?;
    let words = tokens(body);
    let mut c = Compiler { family, words: &words, at: 0, exprs: Vec::new(), anon: Vec::new(), next_id };
    c.rule().map_err(err)?;
    Ok(Compiled { exprs: c.exprs, anon: c.anon, comment })
}

/// The rule without its trailing `comment "..."`, and the comment.
fn split_comment(text: &str) -> Result<(&str, Option<String>), String> {
    match text.find(" comment \"") {
        Some(i) => {
            let rest = &text[i + " comment \"".len()..];
            let end = rest.rfind('"').ok_or("an unterminated comment")?;
            if !rest[end + 1..].trim().is_empty() {
                return Err("words after the comment".into());
            }
            Ok((&text[..i], Some(rest[..end].to_string())))
        }
        None => Ok((text, None)),
    }
}

/// Words, with `{`, `}`, `,` and `:` split off.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for w in text.split_whitespace() {
        let mut cur = String::new();
        for ch in w.chars() {
            if matches!(ch, '{' | '}' | ',') {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                out.push(ch.to_string());
            } else {
                cur.push(ch);
            }
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

struct Compiler<'a> {
    family: IpFamily,
    words: &'a [String],
    at: usize,
    exprs: Vec<Expressions>,
    anon: Vec<AnonSet>,
    next_id: &'a mut u32,
}

/// A value a match loads into a register.
#[derive(Debug, Clone, Copy)]
enum Load {
    Addr { src: bool },
    L4proto,
    Dport,
}

impl Load {
    fn key_type(self, family: IpFamily) -> KeyType {
        match (self, family) {
            (Load::Addr { .. }, IpFamily::V4) => KeyType::Ipv4Addr,
            (Load::Addr { .. }, IpFamily::V6) => KeyType::Ipv6Addr,
            (Load::L4proto, _) => KeyType::InetProto,
            (Load::Dport, _) => KeyType::InetService,
        }
    }
}

impl Compiler<'_> {
    fn peek(&self) -> Option<&str> {
        self.words.get(self.at).map(String::as_str)
    }

    fn next(&mut self) -> Result<&str, String> {
        let w = self.words.get(self.at).ok_or("the rule ends too early")?;
        self.at += 1;
        Ok(w.as_str())
    }

    fn expect(&mut self, want: &str) -> Result<(), String> {
        match self.next()? {
            w if w == want => Ok(()),
            w => Err(format!("expected {want:?}, found {w:?}")),
        }
    }

    fn rule(&mut self) -> Result<(), String> {
        while let Some(w) = self.peek() {
            match w {
                "ip" | "ip6" | "meta" | "th" => self.match_or_lookup()?,
                "ct" => self.ct_state()?,
                "fib" => self.fib()?,
                "mark" => self.mark()?,
                "numgen" => self.numgen()?,
                "update" => self.update()?,
                "dnat" => self.dnat()?,
                "masquerade" => self.masquerade()?,
                "reject" => {
                    self.at += 1;
                    let code: u8 = if self.family == IpFamily::V4 { 3 } else { 4 };
                    self.push("reject", vec![u32_attr(1, 0), DefaultNla::new(2, vec![code])]);
                }
                "jump" | "goto" | "return" | "drop" | "accept" => {
                    let v = self.verdict()?;
                    self.push("immediate", vec![u32_attr(1, NFT_REG_VERDICT), verdict_data(2, &v)]);
                }
                other => return Err(format!("unknown word {other:?}")),
            }
        }
        Ok(())
    }

    fn verdict(&mut self) -> Result<Verdict, String> {
        Ok(match self.next()? {
            "jump" => Verdict::Jump(self.next()?.to_string()),
            "goto" => Verdict::Goto(self.next()?.to_string()),
            "return" => Verdict::Return,
            "drop" => Verdict::Drop,
            "accept" => Verdict::Accept,
            w => return Err(format!("expected a verdict, found {w:?}")),
        })
    }

    /// `ip6 daddr` / `meta l4proto` / `th dport`.
    fn load_word(&mut self) -> Result<Load, String> {
        let fam = self.next()?.to_string();
        let field = self.next()?.to_string();
        match (fam.as_str(), field.as_str()) {
            ("ip", _) if self.family != IpFamily::V4 => Err("an ip match in an ip6 table".into()),
            ("ip6", _) if self.family != IpFamily::V6 => Err("an ip6 match in an ip table".into()),
            ("ip" | "ip6", "saddr") => Ok(Load::Addr { src: true }),
            ("ip" | "ip6", "daddr") => Ok(Load::Addr { src: false }),
            ("meta", "l4proto") => Ok(Load::L4proto),
            ("th", "dport") => Ok(Load::Dport),
            _ => Err(format!("unknown match {fam} {field}")),
        }
    }

    fn emit_load(&mut self, load: Load, reg: u32) {
        let (base, offset, len) = match (load, self.family) {
            (Load::Addr { src: true }, IpFamily::V4) => (1, 12, 4),
            (Load::Addr { src: false }, IpFamily::V4) => (1, 16, 4),
            (Load::Addr { src: true }, IpFamily::V6) => (1, 8, 16),
            (Load::Addr { src: false }, IpFamily::V6) => (1, 24, 16),
            (Load::Dport, _) => (2, 2, 2),
            (Load::L4proto, _) => {
                // meta load l4proto (NFT_META_L4PROTO = 16).
                self.push("meta", vec![u32_attr(1, reg), u32_attr(2, 16)]);
                return;
            }
        };
        self.push("payload", vec![u32_attr(1, reg), u32_attr(2, base), u32_attr(3, offset), u32_attr(4, len)]);
    }

    /// A match, a concatenation, a lookup or a vmap.
    fn match_or_lookup(&mut self) -> Result<(), String> {
        let first = self.load_word()?;
        let mut loads = vec![first];
        while self.peek() == Some(".") {
            self.at += 1;
            loads.push(self.load_word()?);
        }
        // Fields from register 1 on, in 32-bit steps.
        let mut word = 0;
        for (i, l) in loads.iter().enumerate() {
            let reg = if i == 0 { NFT_REG_1 } else { NFT_REG32_00 + word };
            self.emit_load(*l, reg);
            word += l.key_type(self.family).padded_len() / 4;
        }
        if loads.len() > 1 || self.peek() == Some("vmap") {
            self.expect("vmap")?;
            let set = self.set_name()?;
            self.push("lookup", vec![str_attr(1, &set), u32_attr(2, NFT_REG_1), u32_attr(3, NFT_REG_VERDICT)]);
            return Ok(());
        }
        let neq = self.peek() == Some("!=");
        if neq {
            self.at += 1;
        }
        let value = self.next()?.to_string();
        if let Some(set) = value.strip_prefix('@') {
            let mut attrs = vec![str_attr(1, set), u32_attr(2, NFT_REG_1)];
            if neq {
                attrs.push(u32_attr(5, 1)); // NFT_LOOKUP_F_INV
            }
            self.push("lookup", attrs);
            return Ok(());
        }
        if value == "{" {
            return self.anonymous_set(first, neq);
        }
        let op = u32::from(neq); // NFT_CMP_EQ 0, NFT_CMP_NEQ 1
        match first {
            Load::L4proto => {
                let p = proto_number(&value)?;
                self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, op), data_value(3, &[p])]);
            }
            Load::Dport => {
                let port: u16 = value.parse().map_err(|_| format!("bad port {value:?}"))?;
                self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, op), data_value(3, &port.to_be_bytes())]);
            }
            Load::Addr { .. } => {
                let net = parse_net(&value, self.family)?;
                self.addr_cmp(net, neq);
            }
        }
        Ok(())
    }

    /// The loaded address in (or, `neq`, not in) `net`: a compare, after a
    /// mask unless `net` is one address.
    fn addr_cmp(&mut self, net: IpNet, neq: bool) {
        let addr = addr_bytes(net.network());
        if net.prefix_len() != net.max_prefix_len() {
            let mask = addr_bytes(net.netmask());
            let zero = vec![0; mask.len()];
            self.bitwise(&mask, &zero);
        }
        self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, u32::from(neq)), data_value(3, &addr)]);
    }

    fn set_name(&mut self) -> Result<String, String> {
        let w = self.next()?;
        w.strip_prefix('@').map(str::to_string).ok_or_else(|| format!("expected @set, found {w:?}"))
    }

    fn new_id(&mut self) -> u32 {
        *self.next_id += 1;
        *self.next_id
    }

    /// `{ a , b/c }` of addresses and CIDRs: an anonymous interval set; of
    /// one element, a compare, as `nft` writes it (`ip daddr { 10.96.0.0/16 }`
    /// is listed as `ip daddr 10.96.0.0/16`).
    fn anonymous_set(&mut self, load: Load, neq: bool) -> Result<(), String> {
        if !matches!(load, Load::Addr { .. }) {
            return Err("an anonymous set of something other than addresses".into());
        }
        let mut nets = Vec::new();
        loop {
            match self.next()?.to_string().as_str() {
                "}" => break,
                "," => {}
                w => nets.push(parse_net(w, self.family)?),
            }
        }
        if let [net] = nets[..] {
            self.addr_cmp(net, neq);
            return Ok(());
        }
        let id = self.new_id();
        let elements = interval_elements(&nets);
        self.anon.push(AnonSet { id, key: AnonKey::Addr(self.family), elements });
        let name = anon_name(AnonKey::Addr(self.family), id);
        let mut attrs = vec![str_attr(1, &name), u32_attr(2, NFT_REG_1), u32_attr(4, id)];
        if neq {
            attrs.push(u32_attr(5, 1));
        }
        self.push("lookup", attrs);
        Ok(())
    }

    /// `ct state new` / `ct state invalid`.
    fn ct_state(&mut self) -> Result<(), String> {
        self.at += 1;
        self.expect("state")?;
        let bit: u32 = match self.next()? {
            "invalid" => 1,
            "established" => 2,
            "related" => 4,
            "new" => 8,
            w => return Err(format!("unknown ct state {w:?}")),
        };
        self.push("ct", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 0)]);
        self.bitwise(&bit.to_ne_bytes(), &[0; 4]);
        self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 1), data_value(3, &[0; 4])]);
        Ok(())
    }

    /// `fib saddr type local` / `fib daddr type local`.
    fn fib(&mut self) -> Result<(), String> {
        self.at += 1;
        let flags: u32 = match self.next()? {
            "saddr" => 1,
            "daddr" => 2,
            w => return Err(format!("unknown fib key {w:?}")),
        };
        self.expect("type")?;
        self.expect("local")?;
        // NFT_FIB_RESULT_ADDRTYPE = 3; RTN_LOCAL = 2, host order.
        self.push("fib", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 3), u32_attr(3, flags)]);
        self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 0), data_value(3, &2u32.to_ne_bytes())]);
        Ok(())
    }

    /// `mark and M == V` or `mark set mark or|xor M`.
    fn mark(&mut self) -> Result<(), String> {
        self.at += 1;
        let meta_mark = 3; // NFT_META_MARK
        match self.next()? {
            "and" => {
                let m = parse_u32(self.next()?)?;
                self.expect("==")?;
                let v = parse_u32(self.next()?)?;
                self.push("meta", vec![u32_attr(1, NFT_REG_1), u32_attr(2, meta_mark)]);
                self.bitwise(&m.to_ne_bytes(), &[0; 4]);
                self.push("cmp", vec![u32_attr(1, NFT_REG_1), u32_attr(2, 0), data_value(3, &v.to_ne_bytes())]);
            }
            "set" => {
                self.expect("mark")?;
                let (mask, xor) = match self.next()? {
                    "or" => {
                        let m = parse_u32(self.next()?)?;
                        (!m, m)
                    }
                    "xor" => (u32::MAX, parse_u32(self.next()?)?),
                    w => return Err(format!("unknown mark operation {w:?}")),
                };
                self.push("meta", vec![u32_attr(1, NFT_REG_1), u32_attr(2, meta_mark)]);
                self.bitwise(&mask.to_ne_bytes(), &xor.to_ne_bytes());
                // meta set mark (NFTA_META_SREG = 3).
                self.push("meta", vec![u32_attr(2, meta_mark), u32_attr(3, NFT_REG_1)]);
            }
            w => return Err(format!("unknown mark form {w:?}")),
        }
        Ok(())
    }

    /// `numgen random mod N vmap { 0 : goto a , 1 : goto b }`.
    fn numgen(&mut self) -> Result<(), String> {
        self.at += 1;
        self.expect("random")?;
        self.expect("mod")?;
        let modulus = parse_u32(self.next()?)?;
        self.expect("vmap")?;
        self.expect("{")?;
        let mut elements = Vec::new();
        loop {
            let w = self.next()?.to_string();
            match w.as_str() {
                "}" => break,
                "," => continue,
                n => {
                    let n = parse_u32(n)?;
                    self.expect(":")?;
                    let v = self.verdict()?;
                    elements.push((n.to_ne_bytes().to_vec(), Some(v), false));
                }
            }
        }
        // NFTA_NG_DREG, MODULUS, TYPE (NFT_NG_RANDOM = 1).
        self.push("numgen", vec![u32_attr(1, NFT_REG_1), u32_attr(2, modulus), u32_attr(3, 1)]);
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
        Ok(())
    }

    /// `update @set { ip saddr }`.
    fn update(&mut self) -> Result<(), String> {
        self.at += 1;
        let set = self.set_name()?;
        self.expect("{")?;
        let load = self.load_word()?;
        self.expect("}")?;
        self.emit_load(load, NFT_REG_1);
        // NFTA_DYNSET_SET_NAME, OP (NFT_DYNSET_OP_UPDATE = 1), SREG_KEY.
        self.push("dynset", vec![str_attr(1, &set), u32_attr(3, 1), u32_attr(4, NFT_REG_1)]);
        Ok(())
    }

    /// `dnat to A:P` (`[A]:P` for IPv6).
    fn dnat(&mut self) -> Result<(), String> {
        self.at += 1;
        self.expect("to")?;
        let target = self.next()?.to_string();
        let sock: std::net::SocketAddr = target.parse().map_err(|_| format!("bad dnat target {target:?}"))?;
        self.push("immediate", vec![u32_attr(1, NFT_REG_1), data_value(2, &addr_bytes(sock.ip()))]);
        self.push("immediate", vec![u32_attr(1, NFT_REG_2), data_value(2, &sock.port().to_be_bytes())]);
        let nfproto = if self.family == IpFamily::V4 { 2 } else { 10 };
        // NFTA_NAT_TYPE (NFT_NAT_DNAT = 1), FAMILY, REG_ADDR_MIN, REG_PROTO_MIN, FLAGS (PROTO_SPECIFIED).
        self.push(
            "nat",
            vec![u32_attr(1, 1), u32_attr(2, nfproto), u32_attr(3, NFT_REG_1), u32_attr(5, NFT_REG_2), u32_attr(7, 2)],
        );
        Ok(())
    }

    fn masquerade(&mut self) -> Result<(), String> {
        self.at += 1;
        let mut attrs = Vec::new();
        if self.peek() == Some("fully-random") {
            self.at += 1;
            attrs.push(u32_attr(1, 0x10)); // NF_NAT_RANGE_PROTO_RANDOM_FULLY
        }
        self.push("masq", attrs);
        Ok(())
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

fn proto_number(w: &str) -> Result<u8, String> {
    match w {
        "tcp" => Ok(6),
        "udp" => Ok(17),
        "sctp" => Ok(132),
        _ => Err(format!("unknown protocol {w:?}")),
    }
}

fn parse_u32(w: &str) -> Result<u32, String> {
    let parsed = match w.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => w.parse(),
    };
    parsed.map_err(|_| format!("bad number {w:?}"))
}

fn parse_net(w: &str, family: IpFamily) -> Result<IpNet, String> {
    let net = match w.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => IpNet::from(w.parse::<IpAddr>().map_err(|_| format!("bad address {w:?}"))?),
    };
    if family.matches(&net.addr()) {
        Ok(net.trunc())
    } else {
        Err(format!("{w} is not of the table's family"))
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
fn interval_elements(nets: &[IpNet]) -> Vec<(Vec<u8>, Option<Verdict>, bool)> {
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
        out.push((bytes(lo, len), None, false));
        let top = if len == 4 { u128::from(u32::MAX) } else { u128::MAX };
        if hi < top {
            out.push((bytes(hi + 1, len), None, true));
        }
    }
    out
}

/// An element key of `parts` (re-exported for the planner's elements).
pub fn element_key(parts: &[KeyPart]) -> Vec<u8> {
    super::types::key_bytes(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &Compiled) -> Vec<String> {
        c.exprs
            .iter()
            .map(|e| match e {
                Expressions::Other { expression_type, .. } => expression_type.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn compiled(family: IpFamily, text: &str) -> Compiled {
        compile(family, text, &mut 0).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn upstreams_forms_compile_to_nfts_expressions() {
        let v4 = IpFamily::V4;
        assert_eq!(
            names(&compiled(v4, "ip daddr . meta l4proto . th dport vmap @service-ips")),
            ["payload", "meta", "payload", "lookup"]
        );
        assert_eq!(names(&compiled(v4, "ct state new jump firewall-check")), ["ct", "bitwise", "cmp", "immediate"]);
        assert_eq!(
            names(&compiled(v4, "meta l4proto tcp dnat to 10.244.0.13:8080")),
            ["meta", "cmp", "immediate", "immediate", "nat"]
        );
        assert_eq!(names(&compiled(v4, "mark set mark or 0x004000")), ["meta", "bitwise", "meta"]);
        let c = compiled(v4, "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"");
        assert_eq!(names(&c), ["payload", "lookup", "reject"]);
        assert_eq!(c.comment.as_deref(), Some("Reject traffic to invalid ports of ClusterIPs"));
        let c = compiled(v4, "numgen random mod 2 vmap { 0 : goto endpoint-a , 1 : goto endpoint-b }");
        assert_eq!(c.anon.len(), 1);
        assert_eq!(c.anon[0].elements.len(), 2);
        let c = compiled(
            IpFamily::V6,
            "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports",
        );
        assert_eq!(names(&c), ["fib", "cmp", "payload", "cmp", "meta", "payload", "lookup"]);
    }

    #[test]
    fn an_anonymous_set_of_one_cidr_is_a_compare_as_nft_writes_it() {
        let one =
            compiled(IpFamily::V4, "ip daddr { 10.96.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"");
        assert_eq!(names(&one), ["payload", "bitwise", "cmp", "immediate"]);
        assert!(one.anon.is_empty());
        let plain =
            compiled(IpFamily::V4, "ip daddr 10.96.0.0/16 drop comment \"Drop traffic to unallocated ClusterIPs\"");
        assert_eq!(format!("{:?}", one.exprs), format!("{:?}", plain.exprs));
        let two = compiled(IpFamily::V4, "ip daddr { 10.96.0.0/16,10.200.0.0/16 } drop");
        assert_eq!(names(&two), ["payload", "lookup", "immediate"]);
        assert_eq!(two.anon.len(), 1);
        let not_one = compiled(IpFamily::V6, "ip6 saddr != { fd00::/64 } drop");
        assert_eq!(
            format!("{:?}", not_one.exprs),
            format!("{:?}", compiled(IpFamily::V6, "ip6 saddr != fd00::/64 drop").exprs)
        );
    }

    #[test]
    fn what_is_not_upstreams_is_named() {
        let e = compile(IpFamily::V4, "tcp flags syn drop", &mut 0).unwrap_err();
        assert!(e.why.contains("\"tcp\""), "{e}");
        let e = compile(IpFamily::V4, "ip6 daddr ::1 drop", &mut 0).unwrap_err();
        assert!(e.why.contains("ip6 match"), "{e}");
    }

    #[test]
    fn cidrs_become_merged_intervals() {
        let nets: Vec<IpNet> =
            ["10.0.0.0/8", "10.1.0.0/16", "192.168.0.1/32"].iter().map(|n| n.parse().unwrap()).collect();
        let e = interval_elements(&nets);
        let keys: Vec<(Vec<u8>, bool)> = e.into_iter().map(|(k, _, end)| (k, end)).collect();
        assert_eq!(
            keys,
            vec![
                (vec![10, 0, 0, 0], false),
                (vec![11, 0, 0, 0], true),
                (vec![192, 168, 0, 1], false),
                (vec![192, 168, 0, 2], true),
            ]
        );
    }
}
