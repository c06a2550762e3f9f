//! The iptables-restore subset IPVS mode writes, parsed into tables of
//! chains of rules, and each rule's matches evaluated against a packet.
//! Anything outside the subset (a match module, an option, a target, a
//! missing chain or set) is an error: the tracer never steps over a rule it
//! does not understand.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::TraceError;
use crate::msgs::{SetEntry, SetType, VsKey};
use crate::net::Protocol;

/// One ipset as the tracer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub set_type: SetType,
    pub members: BTreeSet<SetEntry>,
}

/// What the matches look at: the packet as it is at this hook, and the node.
#[derive(Debug, Clone, Copy)]
pub struct Pkt {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Protocol,
    pub dport: u16,
    pub mark: u32,
    /// The virtual server, once IPVS forwarded the packet (`-m ipvs`).
    pub ipvs: Option<VsKey>,
}

/// The node: its sets and which addresses are local (`-m addrtype LOCAL`).
pub struct Env<'a> {
    pub sets: &'a BTreeMap<String, Set>,
    pub local: &'a BTreeSet<IpAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Src,
    Dst,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Match {
    Src(IpNet),
    Dst(IpNet),
    Proto(Protocol),
    DPort(u16),
    Set {
        name: String,
        dirs: Vec<Dir>,
    },
    SrcLocal,
    DstLocal,
    PhysdevIsIn,
    Mark {
        value: u32,
        mask: u32,
    },
    /// Conntrack states; the tracer follows a connection's first packet (NEW).
    CtState(Vec<String>),
    IpvsVaddr(IpNet),
    IpvsVproto(Protocol),
    IpvsVport(u16),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Accept,
    Drop,
    Reject,
    Return,
    Masquerade,
    /// MARK: the new mark from the old one.
    Mark {
        and_not: u32,
        xor: u32,
    },
    Jump(String),
    /// No `-j`: counts only.
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// As written (`-A CHAIN ...`), for traces.
    pub text: String,
    matches: Vec<(bool, Match)>,
    pub target: Target,
}

/// Built-in chains of the tables the tracer walks.
const BUILT_IN: [(&str, &[&str]); 3] = [
    ("mangle", &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
];

/// What the tracer cannot read in a line, or cannot evaluate in a rule a
/// packet reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    #[error("outside a table")]
    OutsideTable,
    #[error("setting a built-in chain's policy is not modelled")]
    BuiltInPolicy,
    #[error("no COMMIT")]
    NoCommit,
    #[error("no chain or target {0}")]
    NoTarget(String),
    #[error("too short")]
    TooShort,
    #[error("no such chain")]
    NoSuchChain,
    #[error("insert position out of range")]
    InsertPosition,
    #[error("unknown command {0}")]
    UnknownCommand(String),
    #[error("unterminated quote")]
    UnterminatedQuote,
    #[error("-j needs a target")]
    NeedsTarget,
    #[error("-m needs a module")]
    NeedsModule,
    #[error("unknown match -m {0}")]
    UnknownModule(String),
    #[error("unknown option {0}")]
    UnknownOption(String),
    #[error("{0} needs a value")]
    NeedsValue(String),
    #[error("a trailing !")]
    TrailingNot,
    #[error("bad port {0}")]
    BadPort(String),
    #[error("only address type LOCAL is modelled")]
    AddressType,
    /// The target's name and options.
    #[error("unknown target -j {0}")]
    UnknownTarget(String),
    #[error("bad address {0}")]
    BadAddress(String),
    #[error("unknown protocol {0}")]
    UnknownProtocol(String),
    #[error("bad set direction {0}")]
    BadDirection(String),
    #[error("bad number {0}")]
    BadNumber(String),
    #[error("no set {0}")]
    NoSet(String),
    #[error("source ports are not modelled")]
    SourcePort,
    #[error("{count} directions for a {set_type} set")]
    Directions { count: usize, set_type: &'static str },
}

/// Tables of chains, as after `iptables-restore --noflush` of every input given.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    chains: BTreeMap<(String, String), Vec<Rule>>,
}

impl Tables {
    /// The built-in chains, empty, with policy ACCEPT.
    pub fn new() -> Tables {
        let chains = BUILT_IN
            .iter()
            .flat_map(|(t, cs)| cs.iter().map(|c| ((t.to_string(), c.to_string()), Vec::new())))
            .collect();
        Tables { chains }
    }

    pub fn chain(&self, table: &str, chain: &str) -> Result<&[Rule], TraceError> {
        let key = (table.to_string(), chain.to_string());
        self.chains.get(&key).map(Vec::as_slice).ok_or_else(|| TraceError::NoChain(format!("{table} {chain}")))
    }

    fn is_built_in(table: &str, chain: &str) -> bool {
        BUILT_IN.iter().any(|(t, cs)| *t == table && cs.contains(&chain))
    }

    /// Applies one iptables-restore input with `--noflush` semantics: a
    /// declared chain is created or flushed; `-A`, `-I`, `-F`, `-X` as the tool.
    pub fn restore(&mut self, text: &str) -> Result<(), TraceError> {
        let mut table: Option<String> = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let bad = |why: Unreadable| TraceError::Parse { line: line.to_string(), why };
            if let Some(t) = line.strip_prefix('*') {
                table = Some(t.to_string());
                continue;
            }
            let Some(t) = table.clone() else { return Err(bad(Unreadable::OutsideTable)) };
            if line == "COMMIT" {
                self.check_targets(&t)?;
                table = None;
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split_whitespace().next().unwrap_or_default();
                if Self::is_built_in(&t, chain) {
                    return Err(bad(Unreadable::BuiltInPolicy));
                }
                self.chains.insert((t, chain.to_string()), Vec::new());
            } else {
                self.command(&t, line).map_err(bad)?;
            }
        }
        match table {
            Some(t) => Err(TraceError::Parse { line: format!("*{t}"), why: Unreadable::NoCommit }),
            None => Ok(()),
        }
    }

    fn command(&mut self, table: &str, line: &str) -> Result<(), Unreadable> {
        let words = split(line)?;
        let (cmd, chain) = match words.as_slice() {
            [cmd, chain, ..] => (cmd.as_str(), chain.as_str()),
            _ => return Err(Unreadable::TooShort),
        };
        let key = (table.to_string(), chain.to_string());
        if cmd == "-X" {
            return self.chains.remove(&key).map(drop).ok_or(Unreadable::NoSuchChain);
        }
        let rules = self.chains.get_mut(&key).ok_or(Unreadable::NoSuchChain)?;
        match cmd {
            "-F" => rules.clear(),
            "-A" => rules.push(parse_rule(line, &words[2..])?),
            "-I" => {
                let (at, skip) = match words.get(2).and_then(|w| w.parse::<usize>().ok()) {
                    Some(n) => (n, 4),
                    None => (1, 3),
                };
                if at == 0 || at > rules.len() + 1 {
                    return Err(Unreadable::InsertPosition);
                }
                // As iptables-save will show it.
                let spec = line.splitn(skip, ' ').last().unwrap_or_default();
                rules.insert(at - 1, parse_rule(&format!("-A {chain} {spec}"), &words[skip - 1..])?);
            }
            _ => return Err(Unreadable::UnknownCommand(cmd.to_string())),
        }
        Ok(())
    }

    /// Every jump of `table` names a chain of it (iptables-restore's check at COMMIT).
    fn check_targets(&self, table: &str) -> Result<(), TraceError> {
        for ((t, _), rules) in self.chains.iter().filter(|((t, _), _)| t == table) {
            for r in rules {
                if let Target::Jump(to) = &r.target {
                    if !self.chains.contains_key(&(t.clone(), to.clone())) {
                        return Err(TraceError::Parse { line: r.text.clone(), why: Unreadable::NoTarget(to.clone()) });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Words of a rule, with double-quoted strings as one word.
fn split(line: &str) -> Result<Vec<String>, Unreadable> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, tail) = match rest.strip_prefix('"') {
            Some(q) => q.split_once('"').ok_or(Unreadable::UnterminatedQuote)?,
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        words.push(word.to_string());
        rest = tail.trim_start();
    }
    Ok(words)
}

/// The option each match module brings (options need their `-m`).
const MODULES: [(&str, &[&str]); 9] = [
    ("comment", &["--comment"]),
    ("set", &["--match-set"]),
    ("addrtype", &["--src-type", "--dst-type"]),
    ("physdev", &["--physdev-is-in"]),
    ("mark", &["--mark"]),
    ("conntrack", &["--ctstate"]),
    ("ipvs", &["--vaddr", "--vproto", "--vport"]),
    ("tcp", &["--dport"]),
    ("udp", &["--dport"]),
];

fn parse_rule(line: &str, words: &[String]) -> Result<Rule, Unreadable> {
    let mut rule = Rule { text: line.to_string(), matches: Vec::new(), target: Target::None };
    let mut modules: Vec<&str> = Vec::new();
    let mut negate = false;
    let mut it = words.iter().map(String::as_str);
    while let Some(w) = it.next() {
        match w {
            "!" => negate = true,
            "-j" => {
                let name = it.next().ok_or(Unreadable::NeedsTarget)?;
                rule.target = parse_target(name, &mut it)?;
            }
            "-m" => {
                let name = it.next().ok_or(Unreadable::NeedsModule)?;
                let known = MODULES
                    .iter()
                    .find(|(m, _)| *m == name)
                    .ok_or_else(|| Unreadable::UnknownModule(name.to_string()))?;
                modules.push(known.0);
            }
            _ => {
                if w.starts_with("--") && !MODULES.iter().any(|(m, opts)| modules.contains(m) && opts.contains(&w)) {
                    return Err(Unreadable::UnknownOption(w.to_string()));
                }
                let arg = || it.next().ok_or_else(|| Unreadable::NeedsValue(w.to_string()));
                if let Some(m) = parse_match(w, arg)? {
                    if let Match::Proto(p) = m {
                        modules.push(p.lower());
                    }
                    rule.matches.push((std::mem::take(&mut negate), m));
                }
            }
        }
    }
    if negate {
        return Err(Unreadable::TrailingNot);
    }
    Ok(rule)
}

/// One match option and its value (`None` for a comment).
fn parse_match<'a>(w: &str, mut arg: impl FnMut() -> Result<&'a str, Unreadable>) -> Result<Option<Match>, Unreadable> {
    let port = |s: &str| s.parse::<u16>().ok().ok_or_else(|| Unreadable::BadPort(s.to_string()));
    Ok(Some(match w {
        "-s" => Match::Src(net(arg()?)?),
        "-d" => Match::Dst(net(arg()?)?),
        "-p" => Match::Proto(proto(arg()?)?),
        "--comment" => {
            arg()?;
            return Ok(None);
        }
        "--match-set" => {
            let name = arg()?.to_string();
            Match::Set { name, dirs: arg()?.split(',').map(dir).collect::<Result<_, _>>()? }
        }
        "--src-type" | "--dst-type" => match (w, arg()?) {
            ("--src-type", "LOCAL") => Match::SrcLocal,
            (_, "LOCAL") => Match::DstLocal,
            _ => return Err(Unreadable::AddressType),
        },
        "--physdev-is-in" => Match::PhysdevIsIn,
        "--mark" => {
            let (value, mask) = mark(arg()?)?;
            Match::Mark { value, mask }
        }
        "--ctstate" => Match::CtState(arg()?.split(',').map(str::to_string).collect()),
        "--vaddr" => Match::IpvsVaddr(net(arg()?)?),
        "--vproto" => Match::IpvsVproto(proto(arg()?)?),
        "--vport" => Match::IpvsVport(port(arg()?)?),
        "--dport" => Match::DPort(port(arg()?)?),
        _ => return Err(Unreadable::UnknownOption(w.to_string())),
    }))
}

fn parse_target<'a>(name: &str, opts: &mut impl Iterator<Item = &'a str>) -> Result<Target, Unreadable> {
    let opts: Vec<&str> = opts.collect();
    let target = match (name, opts.as_slice()) {
        ("ACCEPT", []) => Target::Accept,
        ("DROP", []) => Target::Drop,
        ("RETURN", []) => Target::Return,
        ("REJECT", []) | ("REJECT", ["--reject-with", _]) => Target::Reject,
        ("MASQUERADE", []) | ("MASQUERADE", ["--random-fully"]) => Target::Masquerade,
        // --or-mark V: clear V's bits, then set them.
        ("MARK", ["--or-mark", v]) => Target::Mark { and_not: number(v)?, xor: number(v)? },
        ("MARK", ["--xor-mark", v]) => Target::Mark { and_not: 0, xor: number(v)? },
        ("MARK", ["--set-xmark", vm]) => {
            let (v, m) = mark(vm)?;
            Target::Mark { and_not: m, xor: v }
        }
        (chain, []) => Target::Jump(chain.to_string()),
        _ => return Err(Unreadable::UnknownTarget(format!("{name} {}", opts.join(" ")))),
    };
    Ok(target)
}

fn net(s: &str) -> Result<IpNet, Unreadable> {
    let parsed = s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from));
    parsed.ok_or_else(|| Unreadable::BadAddress(s.to_string()))
}

fn proto(s: &str) -> Result<Protocol, Unreadable> {
    let known = Protocol::from_k8s(&s.to_uppercase()).filter(|_| !s.is_empty());
    known.ok_or_else(|| Unreadable::UnknownProtocol(s.to_string()))
}

fn dir(s: &str) -> Result<Dir, Unreadable> {
    match s {
        "src" => Ok(Dir::Src),
        "dst" => Ok(Dir::Dst),
        _ => Err(Unreadable::BadDirection(s.to_string())),
    }
}

fn number(s: &str) -> Result<u32, Unreadable> {
    let n = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    n.ok().ok_or_else(|| Unreadable::BadNumber(s.to_string()))
}

/// `VALUE[/MASK]`.
fn mark(s: &str) -> Result<(u32, u32), Unreadable> {
    match s.split_once('/') {
        Some((v, m)) => Ok((number(v)?, number(m)?)),
        None => Ok((number(s)?, u32::MAX)),
    }
}

impl Rule {
    /// Whether every match of the rule holds for `p`.
    pub fn matches(&self, p: &Pkt, env: &Env) -> Result<bool, TraceError> {
        for (negated, m) in &self.matches {
            if m.holds(p, env).map_err(|why| TraceError::Match { rule: self.text.clone(), why })? == *negated {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Match {
    fn holds(&self, p: &Pkt, env: &Env) -> Result<bool, Unreadable> {
        Ok(match self {
            Match::Src(n) => n.contains(&p.src),
            Match::Dst(n) => n.contains(&p.dst),
            Match::Proto(pr) => *pr == p.proto,
            Match::DPort(port) => *port == p.dport,
            Match::Set { name, dirs } => {
                let set = env.sets.get(name).ok_or_else(|| Unreadable::NoSet(name.clone()))?;
                in_set(set, dirs, p)?
            }
            Match::SrcLocal => env.local.contains(&p.src),
            Match::DstLocal => env.local.contains(&p.dst),
            // Pods are routed, not bridged: no packet comes in on a bridge port.
            Match::PhysdevIsIn => false,
            Match::Mark { value, mask } => p.mark & mask == *value,
            Match::CtState(states) => states.iter().any(|s| s == "NEW"),
            Match::IpvsVaddr(n) => p.ipvs.is_some_and(|vs| n.contains(&vs.addr)),
            Match::IpvsVproto(pr) => p.ipvs.is_some_and(|vs| vs.protocol == *pr),
            Match::IpvsVport(port) => p.ipvs.is_some_and(|vs| vs.port == *port),
        })
    }
}

/// `-m set --match-set NAME dirs`: the packet's fields picked by `dirs`, in
/// the set's dimensions. Ports are destination ports (the tracer's packets
/// have no source port).
fn in_set(set: &Set, dirs: &[Dir], p: &Pkt) -> Result<bool, Unreadable> {
    let ip = |d: Dir| if d == Dir::Src { p.src } else { p.dst };
    let port = |d: Dir| if d == Dir::Dst { Ok(p.dport) } else { Err(Unreadable::SourcePort) };
    let has = |e: SetEntry| set.members.contains(&e);
    Ok(match (set.set_type, dirs) {
        (SetType::HashIp, [a]) => has(SetEntry::Ip(ip(*a))),
        (SetType::HashIpPort, [a, b]) => has(SetEntry::IpPort(ip(*a), p.proto, port(*b)?)),
        (SetType::HashIpPortIp, [a, b, c]) => has(SetEntry::IpPortIp(ip(*a), p.proto, port(*b)?, ip(*c))),
        (SetType::HashIpPortNet, [a, b, c]) => {
            let (addr, dport, from) = (ip(*a), port(*b)?, ip(*c));
            set.members.iter().any(|e| {
                matches!(e, SetEntry::IpPortNet(i, pr, po, n) if *i == addr && *pr == p.proto && *po == dport && n.contains(&from))
            })
        }
        (SetType::BitmapPort, [a]) => has(SetEntry::Port(port(*a)?)),
        (t, _) => return Err(Unreadable::Directions { count: dirs.len(), set_type: t.as_str() }),
    })
}
