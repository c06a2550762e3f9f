//! A packet tracer for IPVS mode, as upstream's tests trace packets through
//! their fake nftables: given what a sync left in the kernels (the
//! iptables-restore input, the ipsets, the IPVS table, kube-ipvs0's
//! addresses) and the node's addresses, it says where a connection's first
//! packet goes, and which rules it matched on the way.
//!
//! The path, as netfilter and IPVS take it:
//!
//! 1. nat PREROUTING (from a pod or outside) or nat OUTPUT then filter
//!    OUTPUT (from the node itself);
//! 2. routing: a destination that is not local (the node's addresses,
//!    kube-ipvs0's, loopback) is forwarded: filter FORWARD, then gone;
//! 3. filter INPUT;
//! 4. IPVS at LOCAL_IN: a virtual server for (dst, proto, port) picks one of
//!    its real servers of non-zero weight (each is a possible outcome); one
//!    without any rejects (ICMP port unreachable, as IPVS's ip_vs_leave); no
//!    virtual server: the packet is the host's;
//! 5. the packet to the real server: filter OUTPUT (`-m ipvs` matches now),
//!    nat POSTROUTING (MASQUERADE or not).
//!
//! The built-in chains hold our jumps ([`JUMPS`]) as the iptables handle
//! inserts them on a fresh node. Not modelled: see [`Tracer::trace`].

mod rules;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};

use rules::{Env, Pkt, Tables, Target};
pub use rules::{Set, Unreadable};

use super::ipvs::rules::JUMPS;
use crate::kernel::iptables::chains::Jump;
use crate::kernel::IpvsTable;
use crate::msgs::VsKey;
use crate::net::Protocol;

/// Where a packet comes from: a pod or outside the node (it arrives on an
/// interface: nat PREROUTING), or the node itself (nat OUTPUT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Pod,
    Node,
    Outside,
}

/// The first packet of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub origin: Origin,
    /// For [`Origin::Node`], the source the kernel picks: the destination
    /// itself when it is local (a kube-ipvs0 address), else the outgoing
    /// interface's address.
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: Protocol,
    pub dport: u16,
}

/// Where the packet ends.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// IPVS sent it to this real server, with its source rewritten
    /// (MASQUERADE in nat POSTROUTING) or not.
    Delivered { to: SocketAddr, masqueraded: bool },
    /// A DROP rule (`table chain: rule`).
    Dropped { rule: String },
    /// A REJECT rule, or IPVS for a virtual server without real servers.
    Rejected { by: String },
    /// A local destination that is no virtual server: the host's own.
    NotAService,
    /// Not local: routed on, untouched by IPVS.
    Forwarded,
}

/// One possible outcome and the rules matched on the way, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub verdict: Verdict,
    pub steps: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// A line the tracer does not understand, or iptables-restore would refuse.
    #[error("{line}: {why}")]
    Parse {
        line: String,
        #[source]
        why: Unreadable,
    },
    /// A rule a packet reached that cannot be evaluated (a missing set, a
    /// set used with the wrong number of directions, a source port).
    #[error("{rule}: {why}")]
    Match {
        rule: String,
        #[source]
        why: Unreadable,
    },
    #[error("no chain {0}")]
    NoChain(String),
    #[error("chains nest deeper than {0}")]
    TooDeep(usize),
}

/// The kernel state a sync left, as the tracer reads it.
#[derive(Debug, Clone, Default)]
pub struct Kernel {
    /// Every iptables-restore input, in the order applied (`--noflush`).
    pub restores: Vec<String>,
    /// Every ipset, by name.
    pub sets: BTreeMap<String, Set>,
    pub ipvs: IpvsTable,
    /// Addresses on kube-ipvs0.
    pub ipvs0: BTreeSet<IpAddr>,
    /// The node's other addresses (loopback included or not: it is added).
    pub node: BTreeSet<IpAddr>,
}

/// The parsed state, ready to trace packets.
#[derive(Debug, Clone)]
pub struct Tracer {
    tables: Tables,
    sets: BTreeMap<String, Set>,
    ipvs: IpvsTable,
    local: BTreeSet<IpAddr>,
}

/// Beyond this, chains loop (iptables refuses loops; this is a safety net).
const MAX_DEPTH: usize = 32;

/// How a walk through a chain ended.
enum Flow {
    /// RETURN, or the end of the chain: back to the caller.
    Return,
    Accept,
    Drop(String),
    Reject(String),
    Masquerade,
}

impl Tracer {
    pub fn new(k: &Kernel) -> Result<Tracer, TraceError> {
        Self::with_jumps(k, &JUMPS)
    }

    /// With other jumps from the built-in chains than IPVS mode's (tests).
    pub fn with_jumps(k: &Kernel, jumps: &[Jump]) -> Result<Tracer, TraceError> {
        let mut tables = Tables::new();
        for r in &k.restores {
            tables.restore(r)?;
        }
        for j in jumps {
            tables.restore(&format!("*{}\n{}\nCOMMIT\n", j.table, j.insert_line()))?;
        }
        let loopback = ["127.0.0.1", "::1"].map(|a| a.parse::<IpAddr>().expect("loopback literal"));
        let local = k.node.iter().chain(&k.ipvs0).chain(&loopback).copied().collect();
        Ok(Tracer { tables, sets: k.sets.clone(), ipvs: k.ipvs.clone(), local })
    }

    /// Every outcome of `p`: one per real server IPVS may pick, else one.
    ///
    /// Not modelled: conntrack beyond a first packet (replies, ESTABLISHED,
    /// IPVS persistence for session affinity), schedulers' choice (every
    /// real server of non-zero weight is a possible outcome), the loopback
    /// leg of the node's own packets (nat POSTROUTING is decided once, on
    /// the way to the real server, with the original source), bridged pods
    /// (`--physdev-is-in` never holds), interface matches (`-i`), source
    /// ports, mangle, and routing beyond "local or not".
    pub fn trace(&self, p: &Packet) -> Result<Vec<Trace>, TraceError> {
        let pkt = Pkt { src: p.src, dst: p.dst, proto: p.proto, dport: p.dport, mark: 0, ipvs: None };
        let mut w = Walk { pkt, steps: Vec::new() };
        let local = self.local.contains(&p.dst);
        let mut hooks = match p.origin {
            Origin::Node => vec![("nat", "OUTPUT"), ("filter", "OUTPUT")],
            Origin::Pod | Origin::Outside => vec![("nat", "PREROUTING")],
        };
        hooks.push(("filter", if local { "INPUT" } else { "FORWARD" }));
        if let Some(verdict) = self.hooks(&hooks, &mut w)? {
            return Ok(vec![w.end(verdict)]);
        }
        if !local {
            return Ok(vec![w.end(Verdict::Forwarded)]);
        }
        let vs = VsKey { addr: p.dst, protocol: p.proto, port: p.dport };
        let Some(spec) = self.ipvs.services.get(&vs) else {
            return Ok(vec![w.end(Verdict::NotAService)]);
        };
        w.steps.push(format!("ipvs: -A {vs} {spec}"));
        let dests: Vec<SocketAddr> = (self.ipvs.dests.iter())
            .filter(|((k, _), d)| *k == vs && d.spec.weight > 0)
            .map(|((_, d), _)| SocketAddr::new(d.addr, d.port))
            .collect();
        if dests.is_empty() {
            return Ok(vec![w.end(Verdict::Rejected { by: format!("ipvs: no real server for {vs}") })]);
        }
        dests.into_iter().map(|to| self.to_real_server(w.clone(), vs, to)).collect()
    }

    /// The outcomes' verdicts alone, sorted.
    pub fn verdicts(&self, p: &Packet) -> Result<Vec<Verdict>, TraceError> {
        let mut v: Vec<Verdict> = self.trace(p)?.into_iter().map(|t| t.verdict).collect();
        v.sort();
        Ok(v)
    }

    /// Step 5: IPVS rewrote the destination; filter OUTPUT, nat POSTROUTING.
    fn to_real_server(&self, mut w: Walk, vs: VsKey, to: SocketAddr) -> Result<Trace, TraceError> {
        w.steps.push(format!("ipvs: -> {to}"));
        (w.pkt.dst, w.pkt.dport, w.pkt.ipvs) = (to.ip(), to.port(), Some(vs));
        if let Some(verdict) = self.hooks(&[("filter", "OUTPUT")], &mut w)? {
            return Ok(w.end(verdict));
        }
        let masqueraded = matches!(self.walk("nat", "POSTROUTING", &mut w, 0)?, Flow::Masquerade);
        Ok(w.end(Verdict::Delivered { to, masqueraded }))
    }

    /// Walks built-in chains in order; a drop or reject ends the packet.
    fn hooks(&self, hooks: &[(&str, &str)], w: &mut Walk) -> Result<Option<Verdict>, TraceError> {
        for (table, chain) in hooks {
            match self.walk(table, chain, w, 0)? {
                Flow::Return | Flow::Accept | Flow::Masquerade => {}
                Flow::Drop(rule) => return Ok(Some(Verdict::Dropped { rule })),
                Flow::Reject(by) => return Ok(Some(Verdict::Rejected { by })),
            }
        }
        Ok(None)
    }

    /// One chain: the first terminal target decides; RETURN or the end of a
    /// chain goes back to the caller (a built-in chain's policy is ACCEPT).
    fn walk(&self, table: &str, chain: &str, w: &mut Walk, depth: usize) -> Result<Flow, TraceError> {
        if depth > MAX_DEPTH {
            return Err(TraceError::TooDeep(MAX_DEPTH));
        }
        let env = Env { sets: &self.sets, local: &self.local };
        for rule in self.tables.chain(table, chain)? {
            if !rule.matches(&w.pkt, &env)? {
                continue;
            }
            w.steps.push(format!("{table}: {}", rule.text));
            let at = || format!("{table} {chain}: {}", rule.text);
            match &rule.target {
                Target::None => {}
                Target::Mark { and_not, xor } => w.pkt.mark = (w.pkt.mark & !and_not) ^ xor,
                Target::Return => return Ok(Flow::Return),
                Target::Accept => return Ok(Flow::Accept),
                Target::Drop => return Ok(Flow::Drop(at())),
                Target::Reject => return Ok(Flow::Reject(at())),
                Target::Masquerade => return Ok(Flow::Masquerade),
                Target::Jump(to) => match self.walk(table, to, w, depth + 1)? {
                    Flow::Return => {}
                    flow => return Ok(flow),
                },
            }
        }
        Ok(Flow::Return)
    }
}

/// A packet on its way, and the rules it matched so far.
#[derive(Debug, Clone)]
struct Walk {
    pkt: Pkt,
    steps: Vec<String>,
}

impl Walk {
    fn end(self, verdict: Verdict) -> Trace {
        Trace { verdict, steps: self.steps }
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:?}", self.verdict)?;
        self.steps.iter().try_for_each(|s| writeln!(f, "  {s}"))
    }
}
