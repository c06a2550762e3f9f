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
            let bad = |why: &str| TraceError::Parse { line: line.to_string(), why: why.to_string() };
            if let Some(t) = line.strip_prefix('*') {
                table = Some(t.to_string());
                continue;
            }
            let Some(t) = table.clone() else { return Err(bad("outside a table")) };
            if line == "COMMIT" {
                self.check_targets(&t)?;
                table = None;
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split_whitespace().next().unwrap_or_default();
                if Self::is_built_in(&t, chain) {
                    return Err(bad("setting a built-in chain's policy is not modelled"));
                }
                self.chains.insert((t, chain.to_string()), Vec::new());
            } else {
                self.command(&t, line).map_err(|why| bad(&why))?;
            }
        }
        match table {
            Some(t) => Err(TraceError::Parse { line: format!("*{t}"), why: "no COMMIT".into() }),
            None => Ok(()),
        }
    }

    fn command(&mut self, table: &str, line: &str) -> Result<(), String> {
        let words = split(line)?;
        let (cmd, chain) = match words.as_slice() {
            [cmd, chain, ..] => (cmd.as_str(), chain.as_str()),
            _ => return Err("too short".into()),
        };
        let key = (table.to_string(), chain.to_string());
        if cmd == "-X" {
            return self.chains.remove(&key).map(drop).ok_or_else(|| "no such chain".into());
        }
        let rules = self.chains.get_mut(&key).ok_or("no such chain")?;
        match cmd {
            "-F" => rules.clear(),
            "-A" => rules.push(parse_rule(line, &words[2..])?),
            "-I" => {
                let (at, skip) = match words.get(2).and_then(|w| w.parse::<usize>().ok()) {
                    Some(n) => (n, 4),
                    None => (1, 3),
                };
                if at == 0 || at > rules.len() + 1 {
                    return Err("insert position out of range".into());
                }
                // As iptables-save will show it.
                let spec = line.splitn(skip, ' ').last().unwrap_or_default();
                rules.insert(at - 1, parse_rule(&format!("-A {chain} {spec}"), &words[skip - 1..])?);
            }
            _ => return Err(format!("unknown command {cmd}")),
        }
        Ok(())
    }

    /// Every jump of `table` names a chain of it (iptables-restore's check at COMMIT).
    fn check_targets(&self, table: &str) -> Result<(), TraceError> {
        for ((t, _), rules) in self.chains.iter().filter(|((t, _), _)| t == table) {
            for r in rules {
                if let Target::Jump(to) = &r.target {
                    if !self.chains.contains_key(&(t.clone(), to.clone())) {
                        return Err(TraceError::Parse {
                            line: r.text.clone(),
                            why: format!("no chain or target {to}"),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Words of a rule, with double-quoted strings as one word.
fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let (word, tail) = match rest.strip_prefix('"') {
            Some(q) => q.split_once('"').ok_or("unterminated quote")?,
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

fn parse_rule(line: &str, words: &[String]) -> Result<Rule, String> {
    let mut rule = Rule { text: line.to_string(), matches: Vec::new(), target: Target::None };
    let mut modules: Vec<&str> = Vec::new();
    let mut negate = false;
    let mut it = words.iter().map(String::as_str);
    while let Some(w) = it.next() {
        match w {
            "!" => negate = true,
            "-j" => {
                let name = it.next().ok_or("-j needs a target")?;
                rule.target = parse_target(name, &mut it)?;
            }
            "-m" => {
                let name = it.next().ok_or("-m needs a module")?;
                let known = MODULES.iter().find(|(m, _)| *m == name).ok_or(format!("unknown match -m {name}"))?;
                modules.push(known.0);
            }
            _ => {
                if w.starts_with("--") && !MODULES.iter().any(|(m, opts)| modules.contains(m) && opts.contains(&w)) {
                    return Err(format!("unknown option {w}"));
                }
                let arg = || it.next().ok_or_else(|| format!("{w} needs a value"));
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
        return Err("a trailing !".into());
    }
    Ok(rule)
}

/// One match option and its value (`None` for a comment).
fn parse_match<'a>(w: &str, mut arg: impl FnMut() -> Result<&'a str, String>) -> Result<Option<Match>, String> {
    let port = |s: &str| s.parse::<u16>().map_err(|_| format!("bad port {s}"));
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
            _ => return Err("only address type LOCAL is modelled".into()),
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
        _ => return Err(format!("unknown option {w}")),
    }))
}

fn parse_target<'a>(name: &str, opts: &mut impl Iterator<Item = &'a str>) -> Result<Target, String> {
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
        _ => return Err(format!("unknown target -j {name} {}", opts.join(" "))),
    };
    Ok(target)
}

fn net(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>().or_else(|_| s.parse::<IpAddr>().map(IpNet::from)).map_err(|_| format!("bad address {s}"))
}

fn proto(s: &str) -> Result<Protocol, String> {
    Protocol::from_k8s(&s.to_uppercase()).filter(|_| !s.is_empty()).ok_or(format!("unknown protocol {s}"))
}

fn dir(s: &str) -> Result<Dir, String> {
    match s {
        "src" => Ok(Dir::Src),
        "dst" => Ok(Dir::Dst),
        _ => Err(format!("bad set direction {s}")),
    }
}

fn number(s: &str) -> Result<u32, String> {
    let n = match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    };
    n.map_err(|_| format!("bad number {s}"))
}

/// `VALUE[/MASK]`.
fn mark(s: &str) -> Result<(u32, u32), String> {
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
    fn holds(&self, p: &Pkt, env: &Env) -> Result<bool, String> {
        Ok(match self {
            Match::Src(n) => n.contains(&p.src),
            Match::Dst(n) => n.contains(&p.dst),
            Match::Proto(pr) => *pr == p.proto,
            Match::DPort(port) => *port == p.dport,
            Match::Set { name, dirs } => {
                let set = env.sets.get(name).ok_or(format!("no set {name}"))?;
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
fn in_set(set: &Set, dirs: &[Dir], p: &Pkt) -> Result<bool, String> {
    let ip = |d: Dir| if d == Dir::Src { p.src } else { p.dst };
    let port = |d: Dir| if d == Dir::Dst { Ok(p.dport) } else { Err("source ports are not modelled".to_string()) };
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
        (t, _) => return Err(format!("{} directions for a {} set", dirs.len(), t.as_str())),
    })
}
