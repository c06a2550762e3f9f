//! A full sync's transaction cut into the transactions the nftables actor
//! sends ([`staged`]): the kernel's cost of one transaction grows faster
//! than its length, so a cold sync goes in bounded pieces.

use std::collections::{BTreeSet, HashMap};

use super::names::is_service_chain;
use crate::msgs::nftables::{NftOp, Transaction};

/// At least this many ops (a chain's rules are not split) in each
/// transaction that writes a full sync's per-service chains ([`staged`]):
/// the kernel's cost per anonymous set grows with its transaction's length.
pub const STAGE_OPS: usize = 8192;

/// Into how many transactions at most [`staged`] cuts the per-service
/// chains: each transaction that adds jumps makes the kernel validate the
/// table it can reach (proportional to the table, for a resync over it), so
/// larger syncs take larger transactions rather than more of them.
pub const STAGES: usize = 32;

/// A full sync's transaction as the nftables actor sends it: the
/// per-service chains first (declared, then their rules, each chain flushed
/// and rewritten in one transaction, endpoint chains before the service,
/// external and firewall chains that jump to them), in transactions of
/// about `max(chunk, ops / STAGES)` ops, and last one transaction with the
/// rest: base and top-level chains, sets and maps (reset), elements, stale
/// chains flushed. A new chain is unused until the last transaction adds
/// the elements naming it; a chain the kernel holds changes in one step,
/// as a partial sync changes it; the maps switch at once in the last
/// transaction, as upstream's single one does. A transaction that fails
/// stops the sync: the next full sync finds what was written and writes
/// over it, or flushes it as stale.
///
/// Why: within one transaction the kernel's cost per anonymous set (each
/// `numgen ... vmap` rule brings one) grows with the transaction's length
/// (it walks the transaction to bind the set), so a full sync in one
/// transaction is quadratic: 271 s at 10,000 services, for us and for
/// `nft -f`. Bounded transactions make it close to linear.
pub fn staged(tx: Transaction, existing_chains: &BTreeSet<String>, chunk: usize) -> Vec<Transaction> {
    let base: BTreeSet<String> = tx
        .ops
        .iter()
        .filter_map(|op| match op {
            NftOp::AddChain { name, base: Some(_), .. } => Some(name.clone()),
            _ => None,
        })
        .collect();
    let mut declare = vec![NftOp::add_table()];
    // Each per-service chain's ops (flush if the kernel holds it, then its rules).
    let mut order: Vec<String> = Vec::new();
    let mut per_chain: HashMap<String, Vec<NftOp>> = HashMap::new();
    let mut rest = Vec::with_capacity(tx.ops.len());
    for op in tx.ops {
        match &op {
            NftOp::AddSet(_) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::AddChain { name, .. } if is_service_chain(name) => {
                if !per_chain.contains_key(name) {
                    per_chain.insert(name.clone(), Vec::new());
                    order.push(name.clone());
                }
                if !existing_chains.contains(name) {
                    declare.push(op);
                }
            }
            // Top-level regular chains (mark-for-masquerade, ...) that the rules jump to.
            NftOp::AddChain { name, .. } if !base.contains(name) => {
                declare.push(op.clone());
                rest.push(op);
            }
            NftOp::FlushChain(name) if per_chain.contains_key(name) => {
                if existing_chains.contains(name) {
                    per_chain.entry(name.clone()).or_default().push(op);
                }
            }
            NftOp::AddRule { chain, .. } if per_chain.contains_key(chain) => {
                per_chain.entry(chain.clone()).or_default().push(op);
            }
            _ => rest.push(op),
        }
    }
    let mut chains: Vec<(String, Vec<NftOp>)> = order
        .into_iter()
        .map(|name| {
            let ops = per_chain.remove(&name).unwrap_or_default();
            (name, ops)
        })
        .collect();
    let family = tx.family;
    let staged_ops: usize = chains.iter().map(|(_, ops)| ops.len()).sum();
    if staged_ops == 0 {
        return vec![Transaction { family, ops: rest }];
    }
    // Leaves first: what a chain jumps to has its rules before it does.
    chains.sort_by_key(|(name, _)| chain_rank(name));
    let size = chunk.max(staged_ops / STAGES).max(1);
    let mut out = vec![Transaction { family, ops: declare }];
    let mut current: Vec<NftOp> = Vec::new();
    for (_, ops) in chains {
        if current.len() >= size {
            out.push(Transaction { family, ops: std::mem::take(&mut current) });
        }
        current.extend(ops);
    }
    if !current.is_empty() {
        out.push(Transaction { family, ops: current });
    }
    out.push(Transaction { family, ops: rest });
    out
}

/// The order [`staged`] writes per-service chains in: endpoint chains
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
