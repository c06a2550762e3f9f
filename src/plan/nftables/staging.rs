//! A full sync cut into the transactions the nftables actor sends
//! ([`Staged`]): the kernel's cost of one transaction grows faster than
//! its length, so a cold sync goes in bounded pieces. The pieces are built
//! one at a time from the planned ruleset as they are sent, so the sync's
//! ops are never all held at once; a held ruleset's service ports
//! ([`super::desired_held`]) have their rules rendered again from the
//! model's objects when their chains are written ([`PortSources`]), so
//! neither are the whole table's rules.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::context::NftablesContext;
use super::names::is_service_chain;
use super::ruleset::{Chain, Objects, Ruleset};
use super::transactions::{full_sync_of, nodeport_ips_missing, KernelObjects};
use crate::model::{EndpointList, ServicePort};
use crate::msgs::nftables::{NftOp, Rule, Transaction};

/// At least this many ops (a chain's rules are not split) in each
/// transaction that writes a full sync's per-service chains ([`Staged`]):
/// the kernel's cost per anonymous set grows with its transaction's length.
pub const STAGE_OPS: usize = 8192;

/// Into how many transactions at most [`Staged`] cuts the per-service
/// chains: each transaction that adds jumps makes the kernel validate the
/// table it can reach (proportional to the table, for a resync over it), so
/// larger syncs take larger transactions rather than more of them.
pub const STAGES: usize = 32;

/// A full sync of a ruleset as the nftables actor sends it, an iterator of
/// transactions: first one declaring the sets and the top-level regular
/// chains the rules jump to; then the per-service chains the kernel has not
/// got, declared in transactions of about `max(chunk, chains / STAGES)`
/// ops; then the per-service chains (each flushed if the kernel holds it,
/// then its rules; endpoint chains before the service, external and
/// firewall chains that jump to them), in transactions of about
/// `max(chunk, ops / STAGES)` ops; last one transaction with the rest:
/// base and top-level chains, sets and maps (reset), elements, stale
/// chains flushed ([`full_sync_of`] without the per-service chains). A new
/// chain is unused until the last transaction adds the elements naming it;
/// a chain the kernel holds changes in one step, as a partial sync changes
/// it; the maps switch at once in the last transaction, as upstream's
/// single one does. A transaction that fails stops the sync: the next full
/// sync finds what was written and writes over it, or flushes it as stale.
///
/// Each declaring and per-service transaction is built from the ruleset
/// when it is due
/// (the ruleset is shared with the planner, which keeps it as what the
/// kernel holds): the sync's ops are held one bounded transaction at a
/// time, not all at once (the last one aside: its maps switch at once).
/// A held service port's rules ([`Staged::held`]) are rendered again
/// from its [`PortSource`] for each transaction that writes its chains.
///
/// Why: within one transaction the kernel's cost per anonymous set (each
/// `numgen ... vmap` rule brings one) grows with the transaction's length
/// (it walks the transaction to bind the set), so a full sync in one
/// transaction is quadratic: 271 s at 10,000 services, for us and for
/// `nft -f`. Bounded transactions make it close to linear.
#[derive(Debug)]
pub struct Staged {
    rs: Arc<Ruleset>,
    /// Where the held service ports' rules are rendered from.
    sources: Option<PortSources>,
    /// Per-service chains the kernel holds (flushed before their rules).
    existing: BTreeSet<String>,
    /// The table, the sets and the top-level regular chains.
    head: Option<Transaction>,
    /// The per-service chains the kernel has not got, declared in
    /// transactions of about `max(chunk, chains / STAGES)` ops.
    declared: Pieces,
    /// Every per-service chain, written in transactions of about
    /// `max(chunk, ops / STAGES)` ops (leaves first).
    written: Pieces,
    rest: Option<Transaction>,
    ops: usize,
}

/// A per-service chain: its group in [`Ruleset::groups`] and its index
/// in the group (32 bits each: a staged sync holds two per chain).
type At = (u32, u32);

/// Where `at` is, as indices.
fn index(&(g, i): &At) -> (usize, usize) {
    (g as usize, i as usize)
}

/// Per-service chains cut into transactions ([`At`]), where each
/// transaction ends, and the next one to build.
#[derive(Debug, Default)]
struct Pieces {
    order: Vec<At>,
    cuts: Vec<usize>,
    next: usize,
}

impl Pieces {
    /// `order` cut into pieces of at least `size` by `weight` (a chain is
    /// not split).
    fn cut(mut order: Vec<At>, size: usize, weight: impl Fn(&At) -> usize) -> Pieces {
        order.shrink_to_fit();
        let mut cuts = Vec::new();
        let mut current = 0;
        for (n, at) in order.iter().enumerate() {
            if current >= size {
                cuts.push(n);
                current = 0;
            }
            current += weight(at);
        }
        if current > 0 {
            cuts.push(order.len());
        }
        Pieces { order, cuts, next: 0 }
    }

    fn left(&self) -> usize {
        self.cuts.len() - self.next
    }

    /// The chains of the next piece, if any is left.
    fn take(&mut self) -> Option<&[At]> {
        let n = self.next;
        let end = *self.cuts.get(n)?;
        self.next += 1;
        let start = if n == 0 { 0 } else { self.cuts[n - 1] };
        Some(&self.order[start..end])
    }
}

/// The index of the first service port's group in [`Ruleset::groups`]
/// (after the top level and the shared objects).
const FIRST_PORT: usize = 2;

/// What one service port of a held ruleset was rendered from: the
/// model's service port and endpoints (shared with the model, which
/// replaces them rather than changing them), and each chain's rule count
/// (what [`Staged`] cuts its transactions by).
#[derive(Debug)]
pub struct PortSource {
    port: Arc<ServicePort>,
    endpoints: Option<EndpointList>,
    rules: Box<[u32]>,
}

impl PortSource {
    /// The source of `objects`, rendered (not held yet) from `port` and `endpoints`.
    pub fn new(port: Arc<ServicePort>, endpoints: Option<EndpointList>, objects: &Objects) -> PortSource {
        let rules = objects.chains.iter().map(|c| u32::try_from(c.rules.len()).unwrap_or(u32::MAX)).collect();
        PortSource { port, endpoints, rules }
    }
}

/// The sources of a held ruleset's service ports, in its order, and the
/// context they were rendered with ([`super::desired_held`]).
#[derive(Debug)]
pub struct PortSources {
    ctx: NftablesContext,
    ports: Vec<PortSource>,
}

impl PortSources {
    pub fn new(ctx: NftablesContext, ports: Vec<PortSource>) -> PortSources {
        PortSources { ctx, ports }
    }

    /// The objects of the held ruleset's `port`-th service port, rendered again.
    fn render(&self, port: usize) -> Option<Objects> {
        let p = self.ports.get(port)?;
        Some(super::render_port(&self.ctx, &p.port, p.endpoints.as_deref().unwrap_or_default()))
    }

    /// How many rules chain `chain` of the `port`-th service port has.
    fn rules(&self, port: usize, chain: usize) -> usize {
        self.ports.get(port).and_then(|p| p.rules.get(chain)).map_or(0, |&n| n as usize)
    }
}

impl Staged {
    /// The full sync of `rs` (its service ports not held) over a kernel
    /// holding `kernel` (re-creating the base chains with
    /// `recreate_base`), per-service transactions of at least `chunk` ops:
    /// the reference the held sync ([`Staged::held`], what the planner
    /// sends) is tested against.
    #[cfg(test)]
    pub fn new(rs: Arc<Ruleset>, kernel: &KernelObjects, recreate_base: bool, chunk: usize) -> Staged {
        Staged::build(rs, None, kernel, recreate_base, chunk)
    }

    /// The full sync of `rs`, whose service ports are held, over a kernel
    /// holding `kernel` (re-creating the base chains with `recreate_base`),
    /// per-service transactions of at least `chunk` ops; the held ports'
    /// rules rendered again from `sources` when they are written
    /// ([`super::desired_held`]).
    pub fn held(
        rs: Arc<Ruleset>,
        sources: PortSources,
        kernel: &KernelObjects,
        recreate_base: bool,
        chunk: usize,
    ) -> Staged {
        Staged::build(rs, Some(sources), kernel, recreate_base, chunk)
    }

    fn build(
        rs: Arc<Ruleset>,
        sources: Option<PortSources>,
        kernel: &KernelObjects,
        recreate_base: bool,
        chunk: usize,
    ) -> Staged {
        let existing: BTreeSet<String> = kernel.chains.iter().filter(|c| is_service_chain(c)).cloned().collect();
        let family = rs.family;
        let mut rest = full_sync_of(&rs, kernel, recreate_base, |c| !is_service_chain(&c.name)).tx;
        let mut order: Vec<At> = Vec::new();
        let mut head = Transaction { family, ops: vec![NftOp::add_table()] };
        head.ops.extend(rs.sets().cloned().map(NftOp::AddSet));
        for (g, objects) in rs.groups().enumerate() {
            for (i, c) in objects.chains.iter().enumerate() {
                if is_service_chain(&c.name) {
                    order.push((g as u32, i as u32));
                } else if c.base.is_none() {
                    head.ops.push(c.add_op());
                }
            }
        }
        if nodeport_ips_missing(&rs) {
            head.ops.push(NftOp::AddSet(super::base::nodeport_ips_set(family)));
        }
        let groups: Vec<&Objects> = rs.groups().collect();
        let chain = |at: &At| {
            let (g, i) = index(at);
            &groups[g].chains[i]
        };
        let chain_ops = |at: &At| {
            let (g, i) = index(at);
            let c: &Chain = &groups[g].chains[i];
            let rules = match (&sources, groups[g].held) {
                (Some(s), Some(_)) => s.rules(g - FIRST_PORT, i),
                _ => c.rules.len(),
            };
            rules + usize::from(existing.contains(&c.name))
        };
        let staged_ops: usize = order.iter().map(chain_ops).sum();
        if staged_ops == 0 {
            let ops = rest.len();
            let (declared, written) = (Pieces::default(), Pieces::default());
            return Staged { rs, sources, existing, head: None, declared, written, rest: Some(rest), ops };
        }
        let new: Vec<At> = order.iter().copied().filter(|at| !existing.contains(&chain(at).name)).collect();
        let declare_size = chunk.max(new.len() / STAGES).max(1);
        let declared = Pieces::cut(new, declare_size, |_| 1);
        // Leaves first: what a chain jumps to has its rules before it does.
        order.sort_by_key(|at| chain_rank(&chain(at).name));
        let written = Pieces::cut(order, chunk.max(staged_ops / STAGES).max(1), chain_ops);
        drop(groups);
        rest.ops.shrink_to_fit();
        let ops = head.len() + declared.order.len() + staged_ops + rest.len();
        Staged { rs, sources, existing, head: Some(head), declared, written, rest: Some(rest), ops }
    }

    /// The ops of every transaction together.
    pub fn ops(&self) -> usize {
        self.ops
    }

    /// How many transactions are left to send.
    pub fn transactions(&self) -> usize {
        usize::from(self.head.is_some()) + self.declared.left() + self.written.left() + usize::from(self.rest.is_some())
    }

    /// The next transaction declaring per-service chains.
    fn declaring(&mut self) -> Option<Transaction> {
        let groups: Vec<&Objects> = self.rs.groups().collect();
        let ops = self.declared.take()?.iter().map(index).map(|(g, i)| groups[g].chains[i].add_op()).collect();
        Some(Transaction { family: self.rs.family, ops })
    }

    /// The next transaction writing per-service chains' rules; a held
    /// service port is rendered again once for each run of its chains.
    fn writing(&mut self) -> Option<Transaction> {
        let groups: Vec<&Objects> = self.rs.groups().collect();
        let mut rendered: Option<(usize, Objects)> = None;
        let mut ops = Vec::new();
        for (g, i) in self.written.take()?.iter().map(index) {
            let c = &groups[g].chains[i];
            if self.existing.contains(&c.name) {
                ops.push(NftOp::FlushChain(c.name.clone()));
            }
            let add = |rule: Rule| NftOp::AddRule { chain: c.name.clone(), rule };
            match self.sources.as_ref().filter(|_| groups[g].held.is_some()) {
                Some(sources) => {
                    if rendered.as_ref().is_none_or(|(at, _)| *at != g) {
                        rendered = sources.render(g - FIRST_PORT).map(|o| (g, o));
                    }
                    let again = rendered.as_mut().and_then(|(_, o)| o.chains.get_mut(i));
                    debug_assert!(again.as_ref().is_some_and(|a| a.name == c.name), "{} rendered again", c.name);
                    ops.extend(again.map(|a| std::mem::take(&mut a.rules)).unwrap_or_default().into_iter().map(add));
                }
                None => ops.extend(c.rules.iter().cloned().map(add)),
            }
        }
        Some(Transaction { family: self.rs.family, ops })
    }
}

impl Iterator for Staged {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        if let Some(head) = self.head.take() {
            return Some(head);
        }
        self.declaring().or_else(|| self.writing()).or_else(|| self.rest.take())
    }
}

/// The order [`Staged`] writes per-service chains in: endpoint chains
/// (they jump only to top-level chains), then service chains (to endpoint
/// chains), external chains (to service and endpoint chains), firewall
/// chains (to external and service chains).
fn chain_rank(name: &str) -> u8 {
    use super::names::{ENDPOINT_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, SERVICE_PREFIX};
    [ENDPOINT_PREFIX, SERVICE_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX]
        .iter()
        .position(|p| name.starts_with(p))
        .map_or(4, |i| i as u8)
}
