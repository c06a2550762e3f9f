//! The iptables-mode planner: upstream's iptables proxier
//! (pkg/proxy/iptables/proxier.go, syncProxyRules) as a pure function of
//! the model, with upstream's chain names, rule text and emission order, so
//! a node can switch between upstream and us.
//!
//! Like upstream, every sync rewrites the top-level chains (filter
//! KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD, KUBE-NODEPORTS,
//! KUBE-PROXY-FIREWALL, KUBE-FIREWALL; nat KUBE-SERVICES, KUBE-NODEPORTS,
//! KUBE-POSTROUTING, KUBE-MARK-MASQ), while a partial sync writes the
//! per-service chains (KUBE-SVC/SVL/EXT/FW/SEP) of changed service ports
//! only, and flushes and deletes (`:C - [0:0]` then `-X C`) chains no
//! longer used.
//!
//! Unlike upstream:
//! - a partial sync does not recompute unchanged services: each service
//!   port's lines in the top-level chains are kept from when it was last
//!   rendered, and the top-level chains are their concatenation;
//! - stale chains are known without `iptables-save`: the planner remembers
//!   the chains it wrote (and those the runtime found,
//!   [`IptablesPlanner::note_kernel_chains`]), so they are deleted on every
//!   sync, also in large-cluster mode (upstream waits a syncPeriod there);
//! - service ports are emitted sorted by name (upstream: Go map order);
//! - a full sync also declares the empty `KUBE-PROXY-CANARY` chain in
//!   mangle, nat and filter (upstream's Monitor creates it with separate
//!   commands). Partial syncs leave it out, so a flush stays visible.
//!
//! Use: [`IptablesPlanner::full`] on start-up, after any failed restore,
//! when the context changes (config, node addresses, topology labels) and
//! periodically; [`IptablesPlanner::partial`] with the changed service
//! ports otherwise; [`IptablesPlanner::confirm_applied`] after each
//! successful restore. Before each full sync the runtime ensures [`JUMPS`]
//! and [`KUBELET_JUMPS`], and sets [`context::SYSCTL_ROUTE_LOCALNET`] when
//! [`IptablesContext::needs_route_localnet`].

pub mod context;
pub mod names;
pub mod render;
pub mod service;

#[cfg(test)]
mod tests;

use crate::msgs::RestoreInput;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

pub use crate::kernel::iptables::chains::{Jump, JUMP_POSITION};
pub use context::{iptables_context, HostFeatures, IptablesContext, IptablesSettings, NodePortDestinations};
pub use names::{endpoint_chain, is_service_chain, port_proto_hash, ServiceChains};

use crate::model::{Model, ServicePortName};
use render::{restore_input, Fragment, Frame};
use service::render_port;

/// The chain vocabulary iptables mode shares with the iptables handle.
pub use crate::kernel::iptables::chains::{
    CANARY, CLEANUP_FILTER_CHAINS, CLEANUP_NAT_CHAINS, IPTABLES_JUMPS as JUMPS, IPTABLES_PROFILE as PROFILE,
    KUBELET_JUMPS, KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS,
    KUBE_POSTROUTING, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
/// More endpoints than this in all: endpoint comments are left out
/// (upstream's largeClusterEndpointsThreshold).
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// What the planner keeps of one service port between syncs.
#[derive(Debug, Clone)]
struct Cached {
    filter: String,
    nat_top: String,
    chains: Vec<String>,
    /// All its endpoints, counted toward large-cluster mode.
    endpoints: usize,
    /// Rules (`-A` lines) in its own chains.
    own_rules: usize,
    no_local: (bool, bool),
}

/// The iptables-mode planner. Remembers, per service port, its lines in the
/// top-level chains and the chains it owns, so a partial sync renders only
/// the changed service ports.
#[derive(Debug)]
pub struct IptablesPlanner {
    ctx: IptablesContext,
    ports: BTreeMap<ServicePortName, Cached>,
    total_endpoints: usize,
    /// Per-service chains that may be in the kernel and are not active:
    /// every sync deletes them until [`IptablesPlanner::confirm_applied`].
    stale: BTreeSet<String>,
    /// The stale chains the last rendered sync deleted.
    deleted: Vec<String>,
    /// Rules of the last rendered sync.
    counts: RuleCounts,
}

/// Rules (`-A` lines) kube-proxy owns per table after a sync, and how many
/// that sync wrote (upstream's `kubeproxy_sync_proxy_rules_iptables_total`
/// and `..._iptables_last`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounts {
    pub filter_total: usize,
    pub filter_last: usize,
    pub nat_total: usize,
    pub nat_last: usize,
}

impl IptablesPlanner {
    pub fn new(ctx: IptablesContext) -> IptablesPlanner {
        IptablesPlanner {
            ctx,
            ports: BTreeMap::new(),
            total_endpoints: 0,
            stale: BTreeSet::new(),
            deleted: Vec::new(),
            counts: RuleCounts::default(),
        }
    }

    /// Rules of the last rendered sync (valid once it is applied).
    pub fn rule_counts(&self) -> RuleCounts {
        self.counts
    }

    pub fn context(&self) -> &IptablesContext {
        &self.ctx
    }

    /// Upstream's largeClusterMode for the current model.
    pub fn large_cluster_mode(&self) -> bool {
        self.total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD
    }

    /// Records per-service chains found in the kernel (`iptables-save -t
    /// nat`, at start-up or on a full resync): those the model does not
    /// use are deleted by the next sync, as upstream's stale-chain cleanup.
    pub fn note_kernel_chains<'a>(&mut self, chains: impl IntoIterator<Item = &'a str>) {
        // The chains of the current service ports, gathered only here (at
        // start-up and full resyncs) rather than kept beside `ports`.
        let active: HashSet<&str> = self.ports.values().flat_map(|c| c.chains.iter().map(String::as_str)).collect();
        let found: Vec<String> =
            chains.into_iter().filter(|c| is_service_chain(c) && !active.contains(c)).map(str::to_string).collect();
        self.stale.extend(found);
    }

    /// Per-service chains the next sync will flush and delete.
    pub fn stale_chains(&self) -> Vec<String> {
        self.stale.iter().cloned().collect()
    }

    /// The last rendered restore input was applied: the chains it deleted are gone.
    /// Whether chains wait to be deleted (a sync must be written even when
    /// no service port changed).
    pub fn has_stale_chains(&self) -> bool {
        !self.stale.is_empty()
    }

    pub fn confirm_applied(&mut self) {
        for c in std::mem::take(&mut self.deleted) {
            self.stale.remove(&c);
        }
    }

    /// Service ports with a Local policy but no local endpoint:
    /// (internal, external), for `kubeproxy_sync_proxy_rules_no_local_endpoints_total`.
    pub fn no_local_endpoints(&self) -> (usize, usize) {
        self.ports.values().fold((0, 0), |(i, e), c| (i + usize::from(c.no_local.0), e + usize::from(c.no_local.1)))
    }

    /// Full sync (upstream's syncProxyRules with needFullSync): every chain
    /// of every service port, the canary, and deletion of stale chains.
    /// `ctx` replaces the context (node addresses or settings may have changed).
    pub fn full(&mut self, model: &Model, ctx: IptablesContext) -> String {
        self.full_input(model, ctx).text()
    }

    /// [`full`](Self::full) as the restore input in parts (what the
    /// iptables actor gets: the per-service rules are not copied).
    pub fn full_input(&mut self, model: &Model, ctx: IptablesContext) -> RestoreInput {
        self.ctx = ctx;
        let ports: Vec<ServicePortName> =
            self.ports.keys().cloned().chain(model.service_ports().map(|sp| sp.name.clone())).collect();
        self.sync(model, ports, true)
    }

    /// Partial sync: the top-level chains, the chains of `changed` service
    /// ports (added, updated or removed; e.g. `ModelChanges::ports`), and
    /// the deletion of unused chains.
    pub fn partial<'a>(&mut self, model: &Model, changed: impl IntoIterator<Item = &'a ServicePortName>) -> String {
        self.partial_input(model, changed).text()
    }

    /// [`partial`](Self::partial) as the restore input in parts.
    pub fn partial_input<'a>(
        &mut self,
        model: &Model,
        changed: impl IntoIterator<Item = &'a ServicePortName>,
    ) -> RestoreInput {
        let ports = changed.into_iter().cloned().collect();
        self.sync(model, ports, false)
    }

    fn sync(&mut self, model: &Model, ports: Vec<ServicePortName>, full: bool) -> RestoreInput {
        let ports: BTreeSet<ServicePortName> = ports.into_iter().collect();
        for spn in &ports {
            self.update_count(model, spn);
        }
        let large = self.large_cluster_mode();
        let mut own: HashMap<ServicePortName, String> = HashMap::with_capacity(ports.len());
        for spn in ports {
            if let Some(rules) = self.rerender(model, &spn, large) {
                own.insert(spn, rules);
            }
        }
        self.deleted = self.stale.iter().cloned().collect();
        let frame = Frame { ctx: &self.ctx, full, stale: &self.deleted };
        let unwritten: usize =
            self.ports.iter().filter(|(spn, _)| !own.contains_key(*spn)).map(|(_, c)| c.own_rules).sum();
        let fragments: Vec<Fragment> = self
            .ports
            .iter()
            .map(|(spn, c)| Fragment {
                filter: &c.filter,
                nat_top: &c.nat_top,
                chains: &c.chains,
                own: own.remove(spn),
            })
            .collect();
        let input = RestoreInput::from_parts(restore_input(&frame, fragments));
        let (filter_last, nat_last) = count_rules(input.lines());
        self.counts = RuleCounts { filter_total: filter_last, filter_last, nat_total: nat_last + unwritten, nat_last };
        input
    }

    /// Keeps the total endpoint count (large-cluster mode) current for `spn`.
    fn update_count(&mut self, model: &Model, spn: &ServicePortName) {
        let old = self.ports.get(spn).map_or(0, |c| c.endpoints);
        let new = if model.service_port(spn).is_some() { model.endpoints(spn).len() } else { 0 };
        self.total_endpoints = self.total_endpoints - old + new;
    }

    /// Renders `spn` again (or forgets it), moving chains it has stopped
    /// using to the stale set. Returns the rules of its own chains if it
    /// still exists (its chains stay in `ports`).
    fn rerender(&mut self, model: &Model, spn: &ServicePortName, large: bool) -> Option<String> {
        let old = self.ports.remove(spn);
        let rules = model.service_port(spn).map(|sp| render_port(&self.ctx, sp, model.endpoints(spn), large));
        let new_chains: &[String] = rules.as_ref().map_or(&[], |r| r.chains.as_slice());
        let keep: HashSet<&str> = new_chains.iter().map(String::as_str).collect();
        for c in old.into_iter().flat_map(|o| o.chains) {
            if !keep.contains(c.as_str()) {
                self.stale.insert(c);
            }
        }
        for c in new_chains {
            self.stale.remove(c);
        }
        let mut r = rules?;
        // Kept for the life of the service port (and the rules until the
        // restore): no growth slack. At 10,000 services this is ≈ 15 MB.
        r.filter.shrink_to_fit();
        r.nat_top.shrink_to_fit();
        r.chains.shrink_to_fit();
        r.chain_rules.shrink_to_fit();
        let cached = Cached {
            filter: r.filter,
            nat_top: r.nat_top,
            chains: r.chains,
            endpoints: model.endpoints(spn).len(),
            own_rules: r.chain_rules.lines().filter(|l| l.starts_with("-A ")).count(),
            no_local: r.no_local,
        };
        self.ports.insert(spn.clone(), cached);
        Some(r.chain_rules)
    }
}

/// `-A` lines in the filter and nat sections of a restore input.
fn count_rules<'a>(lines: impl Iterator<Item = &'a str>) -> (usize, usize) {
    let (mut table, mut filter, mut nat) = ("", 0, 0);
    for line in lines {
        if let Some(t) = line.strip_prefix('*') {
            table = if t == "filter" {
                "filter"
            } else if t == "nat" {
                "nat"
            } else {
                ""
            };
        } else if line.starts_with("-A ") {
            match table {
                "filter" => filter += 1,
                "nat" => nat += 1,
                _ => {}
            }
        }
    }
    (filter, nat)
}

/// `--dry-run` in iptables mode: the restore input of a full sync from an
/// empty kernel (the caller prints it after a `# iptables` line).
pub fn dry_run(model: &Model, ctx: IptablesContext) -> String {
    IptablesPlanner::new(ctx.clone()).full(model, ctx)
}
