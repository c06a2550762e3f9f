//! What the coordinator reports ([`SyncObserver`]), fed to metrics, proxy
//! health and the service health checks: three calls named for what the
//! coordinator just did, so the sync loop reports what upstream's proxier
//! reports, where it does.
//!
//! Per-service-port facts (Local policy without local endpoints, health-check
//! ports and local ready endpoints) are kept per port and updated only for
//! the ports a partial sync replanned, so reporting stays proportional to the
//! change; a full sync recomputes them all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use crate::actors::coordinator::{SyncObserver, SyncOutcome};
use crate::health::ProxyHealth;
use crate::http::SharedServiceHealth;
use crate::metrics::ProxyMetrics;
use crate::model::topology::categorize;
use crate::model::{Model, ModelChanges, NamespacedName, ServicePortName};
use crate::msgs::{Change, SourceEvent};
use crate::net::IpFamily;
use crate::stats::{ServiceScheduler, StatsRegistry};

/// What one service port contributes to the per-sync reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct PortFacts {
    no_local_internal: bool,
    no_local_external: bool,
    /// healthCheckNodePort and local ready endpoints, when it has one.
    health_check: Option<(u16, usize)>,
}

/// Metrics, health and service health checks, fed by the coordinator.
pub struct SyncHooks {
    family: IpFamily,
    metrics: Arc<ProxyMetrics>,
    health: Arc<ProxyHealth>,
    service_health: Option<SharedServiceHealth>,
    ports: BTreeMap<ServicePortName, PortFacts>,
    /// Ports without local endpoints: (internal, external), kept in step with `ports`.
    no_local: (usize, usize),
    /// The ports that have a healthCheckNodePort (few), for the health-check servers.
    health_checked: BTreeMap<ServicePortName, PortFacts>,
    /// Trigger times of the sync in flight, observed if it succeeds.
    triggers: Vec<String>,
    /// Where the service ports with a scheduler of their own are listed
    /// (IPVS mode: the dashboard's), and which ports this family listed.
    schedulers: Option<(StatsRegistry, BTreeSet<ServicePortName>)>,
}

impl SyncHooks {
    /// Marks `family` updated now, as upstream's sync loop does when it
    /// starts, with its first sync pending from now (so a first sync that
    /// never succeeds, or never comes, turns unhealthy after the timeout).
    pub fn new(family: IpFamily, metrics: Arc<ProxyMetrics>, health: Arc<ProxyHealth>) -> SyncHooks {
        health.started(family);
        SyncHooks {
            family,
            metrics,
            health,
            service_health: None,
            ports: BTreeMap::new(),
            no_local: (0, 0),
            health_checked: BTreeMap::new(),
            triggers: Vec::new(),
            schedulers: None,
        }
    }

    /// Also lists the service ports whose Service chose its own IPVS
    /// scheduler in `registry` (for the dashboard), kept in step with each
    /// sync's replanned ports.
    pub fn with_scheduler_list(mut self, registry: StatsRegistry) -> SyncHooks {
        self.schedulers = Some((registry, BTreeSet::new()));
        self
    }

    /// Also drives the service health-check servers after each successful sync.
    /// (Shared with the other family's hooks on a dual-stack node.)
    pub fn with_service_health(mut self, servers: impl Into<SharedServiceHealth>) -> SyncHooks {
        self.service_health = Some(servers.into());
        self
    }

    pub fn metrics(&self) -> &Arc<ProxyMetrics> {
        &self.metrics
    }

    pub fn health(&self) -> &Arc<ProxyHealth> {
        &self.health
    }

    fn node_event(&self, change: &Change<k8s_openapi::api::core::v1::Node>, our_node: &str) {
        let node = change.object();
        if node.metadata.name.as_deref() != Some(our_node) {
            return;
        }
        match change {
            Change::Applied(n) => self.health.sync_node(n),
            Change::Deleted(_) => self.health.node_deleted(),
        }
    }

    /// Replaces one port's facts, keeping the counters and the health-check
    /// index in step, so a sync costs what its changes touch.
    fn set_facts(&mut self, model: &Model, spn: &ServicePortName) {
        self.list_scheduler(model, spn);
        let new = model.service_port(spn).map(|_| port_facts(model, spn));
        let old = match &new {
            Some(f) => self.ports.insert(spn.clone(), *f),
            None => self.ports.remove(spn),
        };
        for (facts, sign) in [(old, -1i64), (new, 1i64)] {
            let Some(f) = facts else { continue };
            let step = |n: &mut usize, on: bool| {
                if on {
                    *n = n.saturating_add_signed(sign as isize);
                }
            };
            step(&mut self.no_local.0, f.no_local_internal);
            step(&mut self.no_local.1, f.no_local_external);
        }
        match new.filter(|f| f.health_check.is_some()) {
            Some(f) => self.health_checked.insert(spn.clone(), f),
            None => self.health_checked.remove(spn),
        };
    }

    /// Lists or unlists `spn`'s own scheduler; the registry is touched only
    /// for ports that have one or had one.
    fn list_scheduler(&mut self, model: &Model, spn: &ServicePortName) {
        let Some((list, listed)) = self.schedulers.as_mut() else { return };
        let own = model.service_port(spn).and_then(|sp| sp.ipvs_scheduler);
        if own.is_none() && !listed.remove(spn) {
            return;
        }
        let family = self.family.lower();
        let entry = own.map(|s| {
            listed.insert(spn.clone());
            ServiceScheduler {
                service_port: spn.to_string(),
                family: family.to_string(),
                scheduler: s.name.to_string(),
                flags: s.flag_names(),
            }
        });
        list.set_scheduler(&spn.to_string(), family, entry);
    }

    /// Service → (healthCheckNodePort, local ready endpoints over its ports).
    fn health_checks(&self) -> (BTreeMap<NamespacedName, u16>, BTreeMap<NamespacedName, usize>) {
        let mut ports = BTreeMap::new();
        let mut endpoints = BTreeMap::new();
        for (spn, facts) in &self.health_checked {
            if let Some((port, local)) = facts.health_check {
                ports.insert(spn.service.clone(), port);
                *endpoints.entry(spn.service.clone()).or_insert(0) += local;
            }
        }
        (ports, endpoints)
    }

    fn sync_service_health(&mut self) {
        if self.service_health.is_none() {
            return;
        }
        let (ports, endpoints) = self.health_checks();
        if let Some(servers) = &self.service_health {
            servers.sync(self.family, ports, endpoints);
        }
    }

    /// The open service health checks (for tests and the dashboard).
    pub fn service_health(&self) -> Option<&SharedServiceHealth> {
        self.service_health.as_ref()
    }
}

impl SyncObserver for SyncHooks {
    /// After recording a source batch into `model`: counts the changes,
    /// sets the pending gauges, follows our Node's eligibility, and queues an
    /// update (health and `..._last_queued_timestamp_seconds`) when the
    /// initialized model has something to sync.
    fn events_recorded(&self, events: &[SourceEvent], model: &Model) {
        let (mut services, mut slices) = (0, 0);
        for ev in events {
            match ev {
                SourceEvent::Service(_) => services += 1,
                // As upstream's metaproxier, which hands each slice to its
                // address type's proxier only (Services go to both).
                SourceEvent::EndpointSlice(c) if c.object().address_type == self.family.slice_address_type() => {
                    slices += 1
                }
                SourceEvent::EndpointSlice(_) => {}
                SourceEvent::Node(change) => self.node_event(change, model.node_name()),
                SourceEvent::ServiceCidr(_) | SourceEvent::Synced(_) => {}
            }
        }
        self.metrics.changes_seen(services, slices);
        let (pending_services, pending_slices) = model.pending_counts();
        self.metrics.changes_pending(pending_services, pending_slices);
        if model.is_initialized() && model.has_pending() {
            self.metrics.sync_queued(self.family, SystemTime::now());
            self.health.queued_update(self.family);
        }
    }

    /// After `model.apply()` at the start of a sync: the pending gauges drop,
    /// the replanned ports' facts are updated (all of them on a full sync) and
    /// the changes' trigger times wait for the sync's outcome.
    fn sync_started(&mut self, model: &Model, changes: &ModelChanges, full: bool) {
        let (pending_services, pending_slices) = model.pending_counts();
        self.metrics.changes_pending(pending_services, pending_slices);
        if full {
            let all: Vec<ServicePortName> =
                self.ports.keys().cloned().chain(model.service_ports().map(|sp| sp.name.clone())).collect();
            for spn in all {
                self.set_facts(model, &spn);
            }
        } else {
            for spn in &changes.ports {
                self.set_facts(model, spn);
            }
        }
        self.triggers = changes.trigger_times.clone();
    }

    /// After the sync's acks: durations always; on success the last-sync
    /// timestamp, health, network programming latency, the no-local-endpoints
    /// gauges and the service health checks, as upstream does after a
    /// successful restore.
    fn sync_finished(&mut self, outcome: SyncOutcome) {
        self.metrics.sync_done(self.family, outcome.full, outcome.took);
        if outcome.iptables_restore_failed {
            self.metrics.iptables_restore_failed(self.family);
        }
        if outcome.partial_restore_failed {
            self.metrics.iptables_partial_restore_failed(self.family);
        }
        if outcome.nftables_sync_failed {
            self.metrics.nftables_sync_failed(self.family);
        }
        if outcome.nftables_cleanup_failed {
            self.metrics.nftables_cleanup_failed(self.family);
        }
        if let Some(r) = outcome.rules {
            self.metrics.iptables_rules(self.family, "filter", r.filter_total, r.filter_last);
            self.metrics.iptables_rules(self.family, "nat", r.nat_total, r.nat_last);
        }
        let triggers = std::mem::take(&mut self.triggers);
        if !outcome.ok {
            return;
        }
        let now = SystemTime::now();
        self.metrics.sync_succeeded(self.family, now);
        self.health.updated(self.family);
        for t in &triggers {
            self.metrics.programming_latency(self.family, t, now);
        }
        self.metrics.no_local_endpoints(self.family, self.no_local.0, self.no_local.1);
        self.sync_service_health();
    }
}

/// Upstream's per-port accounting: a Local policy with endpoints somewhere
/// but none here counts as "no local endpoints"; a health-check port counts
/// its local ready endpoints.
fn port_facts(model: &Model, spn: &ServicePortName) -> PortFacts {
    let Some(sp) = model.service_port(spn) else { return PortFacts::default() };
    let endpoints = model.endpoints(spn);
    let cat = categorize(endpoints, sp, model.node_name(), model.node().zone());
    let no_local = cat.has_any && cat.local.is_empty();
    let health_check = (sp.health_check_node_port != 0)
        .then(|| (sp.health_check_node_port, endpoints.iter().filter(|e| e.is_local && e.ready).count()));
    PortFacts {
        no_local_internal: no_local && sp.internal_policy_local,
        no_local_external: no_local && sp.external_policy_local,
        health_check,
    }
}

#[cfg(test)]
mod tests;
