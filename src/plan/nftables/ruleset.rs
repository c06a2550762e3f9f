//! The desired content of one family's `kube-proxy` table as data: chains
//! (with their rules), sets and verdict maps, and elements. The top-level
//! objects and each service port's objects are kept apart, so a change to
//! one service port touches only its own piece (see [`super::diff`]).
//!
//! Text is `nft -f` syntax as knftables writes it (`add chain ip kube-proxy
//! …`); [`Ruleset::dump`] lists the whole table in the order of knftables'
//! `Fake.Dump()`, which upstream's tests compare against.

use std::collections::BTreeMap;
use std::fmt;

use super::names::{TABLE, TABLE_COMMENT};
use crate::model::ServicePortName;
use crate::net::IpFamily;

/// `ip` or `ip6`: the table family, and the prefix of address matches.
pub fn nft_family(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// `ipv4_addr` or `ipv6_addr`.
pub fn addr_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}

/// A base chain's hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hook {
    /// `filter` or `nat`.
    pub kind: &'static str,
    /// `prerouting`, `input`, `forward`, `output` or `postrouting`.
    pub hook: &'static str,
    /// Numeric, as knftables writes it (`dstnat-10` is -110).
    pub priority: i32,
}

/// One rule: its text and optional comment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub text: String,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(text: impl Into<String>) -> Rule {
        Rule { text: text.into(), comment: None }
    }

    pub fn commented(text: impl Into<String>, comment: &str) -> Rule {
        Rule { text: text.into(), comment: Some(comment.to_string()) }
    }
}

/// A chain and its rules, in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub name: String,
    pub hook: Option<Hook>,
    pub comment: Option<String>,
    pub rules: Vec<Rule>,
}

impl Chain {
    pub fn regular(name: impl Into<String>, rules: Vec<Rule>) -> Chain {
        Chain { name: name.into(), hook: None, comment: None, rules }
    }
}

/// A named set (`map: false`) or verdict map (`map: true`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Set {
    pub name: String,
    pub map: bool,
    /// The `type` clause (`ipv4_addr . inet_proto . inet_service : verdict`).
    pub key_type: String,
    /// `dynamic`, `timeout`, … in order.
    pub flags: Vec<&'static str>,
    /// Element timeout in seconds.
    pub timeout: Option<u32>,
    pub comment: Option<String>,
}

/// An element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Element {
    /// The set or map.
    pub set: String,
    /// Key fields (`172.30.0.41`, `tcp`, `80`), written joined by ` . `.
    pub key: Vec<String>,
    /// Value fields of a map element (`goto service-…`).
    pub value: Vec<String>,
    pub comment: Option<String>,
}

impl Element {
    /// `(set, key)`: what identifies an element in the kernel.
    pub fn id(&self) -> (String, String) {
        (self.set.clone(), self.key.join(" . "))
    }
}

/// A group of objects: the top-level ones, or one service port's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Objects {
    pub chains: Vec<Chain>,
    pub sets: Vec<Set>,
    /// Elements, of this group's sets or of the top-level maps.
    pub elements: Vec<Element>,
}

/// One family's desired `kube-proxy` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    pub family: IpFamily,
    /// Base chains, top-level chains, sets and maps, `nodeport-ips` members.
    pub top: Objects,
    /// Each service port's chains, affinity sets, and its elements in the top-level maps.
    pub services: BTreeMap<ServicePortName, Objects>,
}

/// Writes knftables' text of objects, for one family's table.
#[derive(Debug, Clone, Copy)]
pub struct Writer {
    pub family: IpFamily,
}

impl Writer {
    fn prefix(&self, verb: &str, kind: &str) -> String {
        format!("{verb} {kind} {} {TABLE}", nft_family(self.family))
    }

    /// `add table ip kube-proxy { comment "rules for kube-proxy" ; }`.
    pub fn table(&self) -> String {
        format!("{} {{ comment {} ; }}", self.prefix("add", "table"), quote(TABLE_COMMENT))
    }

    /// `add chain …` with hook and comment, as knftables writes it.
    pub fn chain(&self, c: &Chain) -> String {
        let mut s = format!("{} {}", self.prefix("add", "chain"), c.name);
        if c.hook.is_some() || c.comment.is_some() {
            s.push_str(" {");
            if let Some(h) = &c.hook {
                s.push_str(&format!(" type {} hook {} priority {} ;", h.kind, h.hook, h.priority));
            }
            if let Some(comment) = &c.comment {
                s.push_str(&format!(" comment {} ;", quote(comment)));
            }
            s.push_str(" }");
        }
        s
    }

    /// `flush chain …`, `delete chain …`, `flush set …`, `delete set …`, `flush map …`.
    pub fn verb(&self, verb: &str, kind: &str, name: &str) -> String {
        format!("{} {name}", self.prefix(verb, kind))
    }

    /// `add rule ip kube-proxy <chain> <rule> [comment "…"]`.
    pub fn rule(&self, chain: &str, r: &Rule) -> String {
        let mut s = format!("{} {chain} {}", self.prefix("add", "rule"), r.text);
        if let Some(c) = &r.comment {
            s.push_str(&format!(" comment {}", quote(c)));
        }
        s
    }

    /// `add set …` / `add map …`.
    pub fn set(&self, set: &Set) -> String {
        let kind = if set.map { "map" } else { "set" };
        let mut s = format!("{} {} {{ type {} ;", self.prefix("add", kind), set.name, set.key_type);
        if !set.flags.is_empty() {
            s.push_str(&format!(" flags {} ;", set.flags.join(",")));
        }
        if let Some(t) = set.timeout {
            s.push_str(&format!(" timeout {t}s ;"));
        }
        if let Some(c) = &set.comment {
            s.push_str(&format!(" comment {} ;", quote(c)));
        }
        s.push_str(" }");
        s
    }

    /// `add element ip kube-proxy <set> { key [comment "…"] [: value] }`.
    pub fn element(&self, e: &Element) -> String {
        let mut s = format!("{} {} {{ {}", self.prefix("add", "element"), e.set, e.key.join(" . "));
        if let Some(c) = &e.comment {
            s.push_str(&format!(" comment {}", quote(c)));
        }
        if !e.value.is_empty() {
            s.push_str(&format!(" : {}", e.value.join(" . ")));
        }
        s.push_str(" }");
        s
    }

    /// `delete element ip kube-proxy <set> { key }`.
    pub fn delete_element(&self, set: &str, key: &str) -> String {
        format!("{} {set} {{ {key} }}", self.prefix("delete", "element"))
    }
}

/// Go's `%q` for the strings we write (names, IPs, fixed comments): quotes
/// and backslashes escaped.
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

impl Ruleset {
    /// Every chain, top-level and per service port.
    pub fn chains(&self) -> impl Iterator<Item = &Chain> {
        self.top.chains.iter().chain(self.services.values().flat_map(|o| o.chains.iter()))
    }

    /// Every set and map.
    pub fn sets(&self) -> impl Iterator<Item = &Set> {
        self.top.sets.iter().chain(self.services.values().flat_map(|o| o.sets.iter()))
    }

    /// Every element.
    pub fn elements(&self) -> impl Iterator<Item = &Element> {
        self.top.elements.iter().chain(self.services.values().flat_map(|o| o.elements.iter()))
    }

    /// The whole table in knftables' `Fake.Dump()` order: the table; chains,
    /// sets, then maps, each sorted by name; every chain's rules (chains by
    /// name, rules in order); the elements of the sets, then of the maps
    /// (each sorted by its line). Objects come before anything naming them,
    /// so `nft -f` takes it as one transaction on an empty kernel.
    pub fn dump(&self) -> String {
        let w = Writer { family: self.family };
        let chains: BTreeMap<&str, &Chain> = self.chains().map(|c| (c.name.as_str(), c)).collect();
        let sets: BTreeMap<(bool, &str), &Set> = self.sets().map(|s| ((s.map, s.name.as_str()), s)).collect();
        // A set lists an element once, however many groups hold it.
        let mut elements: BTreeMap<(bool, &str), std::collections::BTreeSet<String>> = BTreeMap::new();
        let is_map: BTreeMap<&str, bool> = sets.keys().map(|(m, n)| (*n, *m)).collect();
        for e in self.elements() {
            let map = is_map.get(e.set.as_str()).copied().unwrap_or(false);
            elements.entry((map, e.set.as_str())).or_default().insert(w.element(e));
        }
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(w.table());
        chains.values().for_each(|c| line(w.chain(c)));
        sets.values().for_each(|s| line(w.set(s)));
        for c in chains.values() {
            c.rules.iter().for_each(|r| line(w.rule(&c.name, r)));
        }
        for lines in elements.into_values() {
            lines.into_iter().for_each(&mut line);
        }
        out
    }
}

impl fmt::Display for Ruleset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.dump())
    }
}
