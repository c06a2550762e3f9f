//! A full sync cut into the transactions the nftables actor sends
//! ([`Staged`]): the kernel's cost of one transaction grows faster than
//! its length, so a cold sync goes in bounded pieces. The pieces are built
//! one at a time from the planned ruleset as they are sent, so the sync's
//! ops are never all held at once.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::names::is_service_chain;
use super::ruleset::{Chain, Objects, Ruleset};
use super::transactions::{full_sync_of, nodeport_ips_missing, KernelObjects};
use crate::msgs::nftables::{NftOp, Transaction};

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
/// transactions: first one declaring the sets and the chains (per-service
/// chains the kernel has not got, top-level regular chains the rules jump
/// to); then the per-service chains (each flushed if the kernel holds it,
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
/// Each per-service transaction is built from the ruleset when it is due
/// (the ruleset is shared with the planner, which keeps it as what the
/// kernel holds): the sync's ops are held one transaction at a time, not
/// all at once.
///
/// Why: within one transaction the kernel's cost per anonymous set (each
/// `numgen ... vmap` rule brings one) grows with the transaction's length
/// (it walks the transaction to bind the set), so a full sync in one
/// transaction is quadratic: 271 s at 10,000 services, for us and for
/// `nft -f`. Bounded transactions make it close to linear.
#[derive(Debug)]
pub struct Staged {
    rs: Arc<Ruleset>,
    /// Per-service chains the kernel holds (flushed before their rules).
    existing: BTreeSet<String>,
    declare: Option<Transaction>,
    /// Per-service chains in the order they are written: (group in
    /// [`Ruleset::groups`], chain in the group).
    order: Vec<(usize, usize)>,
    /// Where each per-service transaction ends in `order`.
    cuts: Vec<usize>,
    /// The next per-service transaction (an index into `cuts`).
    next: usize,
    rest: Option<Transaction>,
    ops: usize,
}

impl Staged {
    /// The full sync of `rs` over a kernel holding `kernel` (re-creating
    /// the base chains with `recreate_base`), per-service transactions of
    /// at least `chunk` ops.
    pub fn new(rs: Arc<Ruleset>, kernel: &KernelObjects, recreate_base: bool, chunk: usize) -> Staged {
        let existing: BTreeSet<String> = kernel.chains.iter().filter(|c| is_service_chain(c)).cloned().collect();
        let family = rs.family;
        let mut rest = full_sync_of(&rs, kernel, recreate_base, |c| !is_service_chain(&c.name)).tx;
        let mut order: Vec<(usize, usize)> = Vec::new();
        let mut declare = Transaction { family, ops: vec![NftOp::add_table()] };
        declare.ops.extend(rs.sets().cloned().map(NftOp::AddSet));
        for (g, objects) in rs.groups().enumerate() {
            for (i, c) in objects.chains.iter().enumerate() {
                if is_service_chain(&c.name) {
                    order.push((g, i));
                    if !existing.contains(&c.name) {
                        declare.ops.push(c.add_op());
                    }
                } else if c.base.is_none() {
                    declare.ops.push(c.add_op());
                }
            }
        }
        if nodeport_ips_missing(&rs) {
            declare.ops.push(NftOp::AddSet(super::base::nodeport_ips_set(family)));
        }
        let groups: Vec<&Objects> = rs.groups().collect();
        let chain = |&(g, i): &(usize, usize)| &groups[g].chains[i];
        let chain_ops = |c: &Chain| c.rules.len() + usize::from(existing.contains(&c.name));
        let staged_ops: usize = order.iter().map(|at| chain_ops(chain(at))).sum();
        if staged_ops == 0 {
            let ops = rest.len();
            return Staged { rs, existing, declare: None, order: vec![], cuts: vec![], next: 0, rest: Some(rest), ops };
        }
        // Leaves first: what a chain jumps to has its rules before it does.
        order.sort_by_key(|at| chain_rank(&chain(at).name));
        let size = chunk.max(staged_ops / STAGES).max(1);
        let mut cuts = Vec::new();
        let mut current = 0;
        for (n, at) in order.iter().enumerate() {
            if current >= size {
                cuts.push(n);
                current = 0;
            }
            current += chain_ops(chain(at));
        }
        if current > 0 {
            cuts.push(order.len());
        }
        drop(groups);
        rest.ops.shrink_to_fit();
        let ops = declare.len() + staged_ops + rest.len();
        Staged { rs, existing, declare: Some(declare), order, cuts, next: 0, rest: Some(rest), ops }
    }

    /// The ops of every transaction together.
    pub fn ops(&self) -> usize {
        self.ops
    }

    /// How many transactions are left to send.
    pub fn transactions(&self) -> usize {
        usize::from(self.declare.is_some()) + self.cuts.len() - self.next + usize::from(self.rest.is_some())
    }

    /// The `n`th per-service transaction.
    fn per_service(&self, n: usize) -> Transaction {
        let start = if n == 0 { 0 } else { self.cuts[n - 1] };
        let groups: Vec<&Objects> = self.rs.groups().collect();
        let mut ops = Vec::new();
        for &(g, i) in &self.order[start..self.cuts[n]] {
            let c = &groups[g].chains[i];
            if self.existing.contains(&c.name) {
                ops.push(NftOp::FlushChain(c.name.clone()));
            }
            ops.extend(c.rules.iter().map(|r| NftOp::AddRule { chain: c.name.clone(), rule: r.clone() }));
        }
        Transaction { family: self.rs.family, ops }
    }
}

impl Iterator for Staged {
    type Item = Transaction;

    fn next(&mut self) -> Option<Transaction> {
        if let Some(declare) = self.declare.take() {
            return Some(declare);
        }
        if self.next < self.cuts.len() {
            self.next += 1;
            return Some(self.per_service(self.next - 1));
        }
        self.rest.take()
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
