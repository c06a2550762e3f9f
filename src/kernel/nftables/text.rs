//! `nft -f` lines → ops: the syntax `--dry-run --proxy-mode nftables`
//! prints and the planner's transactions are written in (knftables'), read
//! back into [`NftOp`]s, so one text is what operators read, what `nft -f`
//! takes and what the codec sends. Only the forms upstream writes.

use super::codec::{BaseChain, ChainHook, Element, NftOp};
use super::types::{KeyPart, KeyType, Verdict};
use crate::net::IpFamily;

/// One line: its family and op (`None` for a blank line).
pub fn parse_line(line: &str) -> Result<Option<(IpFamily, NftOp)>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let err = |why: &str| format!("{why}: {line:?}");
    let mut w = line.splitn(5, ' ');
    let verb = w.next().ok_or_else(|| err("empty"))?;
    let kind = w.next().ok_or_else(|| err("no object"))?;
    let family = match w.next() {
        Some("ip") => IpFamily::V4,
        Some("ip6") => IpFamily::V6,
        _ => return Err(err("not an ip or ip6 table")),
    };
    let _table = w.next().ok_or_else(|| err("no table"))?;
    let rest = w.next().unwrap_or("");
    let op = match (verb, kind) {
        ("add", "table") => {
            let (_, clauses) = clauses(&format!("x {rest}"));
            NftOp::AddTable { comment: clauses.iter().find_map(|c| quoted(c, "comment")) }
        }
        ("delete", "table") => NftOp::DeleteTable,
        ("add", "chain") => {
            let (name, clauses) = clauses(rest);
            let mut base = None;
            for c in &clauses {
                let t: Vec<&str> = c.split_whitespace().collect();
                if let ["type", kind, "hook", hook, "priority", prio] = t.as_slice() {
                    base = Some(BaseChain {
                        kind: if *kind == "nat" { "nat" } else { "filter" },
                        hook: match *hook {
                            "prerouting" => ChainHook::Prerouting,
                            "input" => ChainHook::Input,
                            "forward" => ChainHook::Forward,
                            "output" => ChainHook::Output,
                            "postrouting" => ChainHook::Postrouting,
                            _ => return Err(err("unknown hook")),
                        },
                        priority: prio.parse().map_err(|_| err("a priority that is not a number"))?,
                    });
                }
            }
            NftOp::AddChain { name: name.to_string(), base, comment: clauses.iter().find_map(|c| quoted(c, "comment")) }
        }
        ("flush", "chain") => NftOp::FlushChain(rest.to_string()),
        ("delete", "chain") => NftOp::DeleteChain(rest.to_string()),
        ("add", "set" | "map") => {
            let (name, clauses) = clauses(rest);
            let ty = clauses.iter().find_map(|c| c.strip_prefix("type ")).ok_or_else(|| err("no type"))?;
            let key =
                KeyType::parse_concat(ty.trim_end_matches(" : verdict")).ok_or_else(|| err("unknown key type"))?;
            let timeout = match clauses.iter().find_map(|c| c.strip_prefix("timeout ")) {
                Some(t) => Some(t.trim_end_matches('s').parse().map_err(|_| err("a timeout not in seconds"))?),
                None => None,
            };
            NftOp::AddSet {
                name: name.to_string(),
                key,
                verdict_map: kind == "map",
                timeout,
                comment: clauses.iter().find_map(|c| quoted(c, "comment")),
            }
        }
        ("flush", "set" | "map") => NftOp::FlushSet(rest.to_string()),
        ("delete", "set" | "map") => NftOp::DeleteSet(rest.to_string()),
        ("add" | "delete", "element") => {
            let (set, body) = rest.split_once(" { ").ok_or_else(|| err("no element braces"))?;
            let body = body.trim_end().strip_suffix('}').ok_or_else(|| err("no closing brace"))?.trim();
            let (key_part, verdict) = match body.rsplit_once(" : ") {
                Some((k, v)) => (k, Some(Verdict::parse(v).ok_or_else(|| err("unknown verdict"))?)),
                None => (body, None),
            };
            let (key_text, comment) = match key_part.split_once(" comment ") {
                Some((k, c)) => (k, Some(c.trim_matches('"').to_string())),
                None => (key_part, None),
            };
            let key: Vec<KeyPart> = key_text
                .split(" . ")
                .map(|f| KeyPart::parse(f.trim()).ok_or_else(|| err("unknown key field")))
                .collect::<Result<_, _>>()?;
            if verb == "add" {
                NftOp::AddElements { set: set.to_string(), elements: vec![Element { key, verdict, comment }] }
            } else {
                NftOp::DeleteElements { set: set.to_string(), keys: vec![key] }
            }
        }
        ("add", "rule") => {
            let (chain, rule) = rest.split_once(' ').ok_or_else(|| err("a rule without a chain"))?;
            NftOp::AddRule { chain: chain.to_string(), rule: rule.to_string() }
        }
        _ => return Err(err("not an op of upstream's")),
    };
    Ok(Some((family, op)))
}

/// A text's ops of `family`, consecutive element adds (deletes) of one set
/// joined into one op.
pub fn parse_ops(text: &str, family: IpFamily) -> Result<Vec<NftOp>, String> {
    let mut ops: Vec<NftOp> = Vec::new();
    for line in text.lines() {
        let Some((f, op)) = parse_line(line)? else { continue };
        if f != family {
            continue;
        }
        match (ops.last_mut(), op) {
            (Some(NftOp::AddElements { set, elements }), NftOp::AddElements { set: s2, elements: more })
                if *set == s2 =>
            {
                elements.extend(more)
            }
            (Some(NftOp::DeleteElements { set, keys }), NftOp::DeleteElements { set: s2, keys: more })
                if *set == s2 =>
            {
                keys.extend(more)
            }
            (_, op) => ops.push(op),
        }
    }
    Ok(ops)
}

/// `NAME { a ; b ; }` → (NAME, [a, b]).
fn clauses(rest: &str) -> (&str, Vec<String>) {
    match rest.split_once(" { ") {
        Some((head, body)) => {
            let body = body.trim_end().trim_end_matches('}').trim();
            let parts = body.split(" ; ").map(|c| c.trim().trim_end_matches(';').trim().to_string());
            (head, parts.filter(|c| !c.is_empty()).collect())
        }
        None => (rest, Vec::new()),
    }
}

fn quoted(clause: &str, word: &str) -> Option<String> {
    clause.strip_prefix(word).map(|c| c.trim().trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_kind_of_line_upstream_writes() {
        let text = "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
            add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n\
            add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"x\" ; }\n\
            add set ip kube-proxy affinity-A { type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }\n\
            add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto service-A }\n\
            add element ip kube-proxy service-ips { 10.96.0.11 . udp . 53 comment \"ns/dns\" : goto reject-chain }\n\
            delete element ip kube-proxy service-ips { 10.96.0.12 . tcp . 80 }\n\
            add rule ip kube-proxy nat-prerouting jump services\n\
            flush chain ip kube-proxy service-A\n\
            add element ip6 kube-proxy cluster-ips { fd00::10 }\n";
        let ops = parse_ops(text, IpFamily::V4).unwrap();
        assert_eq!(ops.len(), 8, "{ops:?}");
        assert!(matches!(&ops[4], NftOp::AddElements { elements, .. } if elements.len() == 2));
        assert!(matches!(&ops[3], NftOp::AddSet { timeout: Some(600), verdict_map: false, .. }));
        assert!(parse_line("add quota ip kube-proxy q").is_err());
        assert_eq!(parse_ops(text, IpFamily::V6).unwrap().len(), 1);
    }
}
