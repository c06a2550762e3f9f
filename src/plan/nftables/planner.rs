//! The nftables-mode planner's state between syncs: the desired ruleset,
//! what the kernel holds (after an acknowledged transaction), and the stale
//! chains waiting to be deleted. Pure: time is an argument (any monotonic
//! clock, e.g. the time since start).
//!
//! A sync is planned ([`NftablesPlanner::full`] or
//! [`NftablesPlanner::partial`]), sent, and then either confirmed
//! ([`NftablesPlanner::confirm_applied`]: the kernel holds it) or failed
//! ([`NftablesPlanner::failed`]: unknown, the next sync must be full, as
//! upstream's needFullSync). Chains a confirmed sync left stale are deleted
//! by [`NftablesPlanner::delete_due`] once [`STALE_CHAIN_DELAY`] has passed,
//! unless a later sync used them again (upstream's staleChains).

use std::collections::BTreeMap;
use std::time::Duration;

use super::context::NftablesContext;
use super::diff::{delete_stale, full_sync, partial_sync, Delta, KernelObjects, Transaction};
use super::ruleset::Ruleset;
use crate::model::{Model, ServicePortName};

/// How long a flushed chain waits before it is deleted (upstream: a
/// second; kernels before 6.2 notice late that a map element no longer
/// points to a chain).
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct NftablesPlanner {
    ctx: NftablesContext,
    /// What the last planned sync makes the kernel hold.
    desired: Ruleset,
    /// What the kernel holds: `None` until a full sync is confirmed, and after a failure.
    applied: Option<Ruleset>,
    /// The last planned sync's stale chains, until confirmed.
    planned_stale: Vec<String>,
    /// Flushed chains and when they were flushed.
    stale: BTreeMap<String, Duration>,
    /// The base chains were re-created once (upstream does it once per process).
    recreated_base: bool,
}

impl NftablesPlanner {
    pub fn new(ctx: NftablesContext) -> NftablesPlanner {
        let desired = Ruleset { family: ctx.family, top: super::base::top_level(&ctx), services: BTreeMap::new() };
        NftablesPlanner {
            ctx,
            desired,
            applied: None,
            planned_stale: vec![],
            stale: BTreeMap::new(),
            recreated_base: false,
        }
    }

    pub fn context(&self) -> &NftablesContext {
        &self.ctx
    }

    /// The desired ruleset of the last planned sync.
    pub fn desired(&self) -> &Ruleset {
        &self.desired
    }

    /// Whether the next sync must be full (none confirmed yet, or one failed).
    pub fn needs_full(&self) -> bool {
        self.applied.is_none()
    }

    /// A full sync of `model` with `ctx` over a kernel holding `kernel`
    /// (listed by the caller). The first one also re-creates the base chains.
    pub fn full(&mut self, model: &Model, ctx: NftablesContext, kernel: &KernelObjects) -> Delta {
        self.ctx = ctx;
        self.desired = super::desired(model, &self.ctx);
        let delta = full_sync(&self.desired, kernel, !self.recreated_base);
        self.recreated_base = true;
        self.planned_stale = delta.stale_chains.clone();
        delta
    }

    /// A partial sync of the `changed` service ports over the confirmed
    /// state. `None` when the next sync must be full.
    pub fn partial<'a>(
        &mut self,
        model: &Model,
        changed: impl IntoIterator<Item = &'a ServicePortName>,
    ) -> Option<Delta> {
        let applied = self.applied.as_ref()?;
        let mut next = applied.clone();
        super::update(&mut next, model, &self.ctx, changed);
        let delta = partial_sync(applied, &next);
        self.desired = next;
        self.planned_stale = delta.stale_chains.clone();
        Some(delta)
    }

    /// The last planned sync is in the kernel (acknowledged at `now`).
    pub fn confirm_applied(&mut self, now: Duration) {
        let active: std::collections::BTreeSet<&str> = self.desired.chains().map(|c| c.name.as_str()).collect();
        self.stale.retain(|c, _| !active.contains(c.as_str()));
        for c in std::mem::take(&mut self.planned_stale) {
            self.stale.entry(c).or_insert(now);
        }
        self.applied = Some(self.desired.clone());
    }

    /// The last planned sync failed or its outcome is unknown: the next
    /// one is full, and stale chains are found again from the kernel.
    pub fn failed(&mut self) {
        self.applied = None;
        self.planned_stale.clear();
        self.stale.clear();
    }

    /// Chains waiting to be deleted.
    pub fn stale_chains(&self) -> Vec<String> {
        self.stale.keys().cloned().collect()
    }

    /// A transaction deleting the stale chains flushed at least
    /// [`STALE_CHAIN_DELAY`] before `now` (forgotten here: if it fails they
    /// are found again by the next full sync, as upstream).
    pub fn delete_due(&mut self, now: Duration) -> Option<Transaction> {
        let due: Vec<String> = self
            .stale
            .iter()
            .filter(|(_, at)| now.saturating_sub(**at) >= STALE_CHAIN_DELAY)
            .map(|(c, _)| c.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        for c in &due {
            self.stale.remove(c);
        }
        Some(delete_stale(self.ctx.family, &due))
    }
}
