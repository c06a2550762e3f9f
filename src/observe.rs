//! What the coordinator reports ([`SyncObserver`]), fed to metrics, proxy
//! health, the service health checks and the dashboard (each sync and the
//! model's counts, in the [`StatsRegistry`]): three calls named for what the
//! coordinator just did, so the sync loop reports what upstream's proxier
//! reports, where it does.
//!
//! Per-service-port facts (Local policy without local endpoints, health-check
//! ports and local ready endpoints, endpoint counts) are kept per port and
//! updated only for the ports a partial sync replanned, so reporting stays
//! proportional to the change; a full sync recomputes them all.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use crate::actors::coordinator::{SyncObserver, SyncOutcome};
use crate::health::ProxyHealth;
use crate::http::SharedServiceHealth;
use crate::metrics::ProxyMetrics;
use crate::model::topology::categorize;
use crate::model::{Model, ModelChanges, NamespacedName, ServicePort, ServicePortName};
use crate::msgs::{Change, SourceEvent};
use crate::net::{ip_family_label, IpFamily, Protocol};
use crate::stats::{unix_ms, FamilySync, ModelCounts, ServiceScheduler, StatsRegistry};

/// What one service port contributes to the per-sync reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct PortFacts {
    no_local_internal: bool,
    no_local_external: bool,
    /// healthCheckNodePort and local ready endpoints, when it has one.
    health_check: Option<(u16, usize)>,
    /// Its endpoints.
    endpoints: usize,
}

/// A port's facts are filed under the model's own service port, ordered
/// by its name (which is not copied).
#[derive(Debug)]
struct Filed(Arc<ServicePort>);

impl Borrow<ServicePortName> for Filed {
    fn borrow(&self) -> &ServicePortName {
        &self.0.name
    }
}

impl PartialEq for Filed {
    fn eq(&self, other: &Filed) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Filed {}

impl PartialOrd for Filed {
    fn partial_cmp(&self, other: &Filed) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Filed {
    fn cmp(&self, other: &Filed) -> std::cmp::Ordering {
        self.0.name.cmp(&other.0.name)
    }
}

/// Metrics, health, service health checks and the dashboard, fed by the coordinator.
pub struct SyncHooks {
    family: IpFamily,
    metrics: Arc<ProxyMetrics>,
    health: Arc<ProxyHealth>,
    /// Where each sync and the model's counts go (the dashboard's).
    registry: StatsRegistry,
    service_health: Option<SharedServiceHealth>,
    ports: BTreeMap<Filed, PortFacts>,
    /// Ports without local endpoints: (internal, external), kept in step with `ports`.
    no_local: (usize, usize),
    /// The endpoints of `ports`, kept in step with them.
    endpoints: usize,
    /// Services with ports in `ports`.
    services: usize,
    /// The ports that have a healthCheckNodePort (few), for the health-check servers.
    health_checked: BTreeMap<ServicePortName, PortFacts>,
    /// Trigger times of the sync in flight, observed if it succeeds.
    triggers: Vec<String>,
    /// IPVS mode: the ports this family listed in `registry` as having a
    /// scheduler of their own.
    schedulers: Option<BTreeSet<ServicePortName>>,
    /// Told once, after the first successful sync.
    first_sync: Option<tokio::sync::oneshot::Sender<()>>,
}

impl SyncHooks {
    /// Marks `family` updated now, as upstream's sync loop does when it
    /// starts, with its first sync pending from now (so a first sync that
    /// never succeeds, or never comes, turns unhealthy after the timeout).
    /// Each sync and the model's counts after it go to `registry`.
    pub fn new(
        family: IpFamily,
        metrics: Arc<ProxyMetrics>,
        health: Arc<ProxyHealth>,
        registry: StatsRegistry,
    ) -> SyncHooks {
        health.started(family);
        SyncHooks {
            family,
            metrics,
            health,
            registry,
            service_health: None,
            ports: BTreeMap::new(),
            no_local: (0, 0),
            endpoints: 0,
            services: 0,
            health_checked: BTreeMap::new(),
            triggers: Vec::new(),
            schedulers: None,
            first_sync: None,
        }
    }

    /// Also lists the service ports whose Service chose its own IPVS
    /// scheduler in the registry (for the dashboard), kept in step with each
    /// sync's replanned ports.
    pub fn with_scheduler_list(mut self) -> SyncHooks {
        self.schedulers = Some(BTreeSet::new());
        self
    }

    /// Also tells `done` once the first sync succeeded (a mode switch
    /// removes the earlier mode's state only then).
    pub fn on_first_sync(mut self, done: tokio::sync::oneshot::Sender<()>) -> SyncHooks {
        self.first_sync = Some(done);
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
        let sp = model.service_port(spn);
        let new = sp.map(|_| port_facts(model, spn));
        // Removed first: the key is replaced too, so the model's old port is not kept.
        let old = self.ports.remove(spn);
        if let (Some(sp), Some(f)) = (sp, new) {
            self.ports.insert(Filed(sp.clone()), f);
        }
        self.count_service(spn, old.is_some(), new.is_some());
        for (facts, sign) in [(old, -1isize), (new, 1isize)] {
            let Some(f) = facts else { continue };
            let step = |n: &mut usize, by: usize| *n = n.saturating_add_signed(sign * by as isize);
            step(&mut self.no_local.0, usize::from(f.no_local_internal));
            step(&mut self.no_local.1, usize::from(f.no_local_external));
            step(&mut self.endpoints, f.endpoints);
        }
        match new.filter(|f| f.health_check.is_some()) {
            Some(f) => self.health_checked.insert(spn.clone(), f),
            None => self.health_checked.remove(spn),
        };
    }

    /// Keeps `services` in step with a port that was (`was`) or is (`is`)
    /// in `ports`: its Service counts while any of its ports is there.
    fn count_service(&mut self, spn: &ServicePortName, was: bool, is: bool) {
        if was == is || self.has_other_port(spn) {
            return;
        }
        if is {
            self.services += 1;
        } else {
            self.services = self.services.saturating_sub(1);
        }
    }

    /// Whether `ports` has a port of `spn`'s Service besides `spn` (a
    /// Service's ports are neighbours in name order).
    fn has_other_port(&self, spn: &ServicePortName) -> bool {
        let first = ServicePortName { service: spn.service.clone(), port: String::new(), protocol: Protocol::Tcp };
        let same_service = self.ports.range::<ServicePortName, _>(&first..).map(|(f, _)| &f.0.name);
        same_service.take_while(|n| n.service == spn.service).any(|n| n != spn)
    }

    /// What the model holds, as the kept facts count it.
    fn model_counts(&self) -> ModelCounts {
        ModelCounts { services: self.services, service_ports: self.ports.len(), endpoints: self.endpoints }
    }

    /// Lists or unlists `spn`'s own scheduler; the registry is touched only
    /// for ports that have one or had one.
    fn list_scheduler(&mut self, model: &Model, spn: &ServicePortName) {
        let Some(listed) = self.schedulers.as_mut() else { return };
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
        self.registry.set_scheduler(&spn.to_string(), family, entry);
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
            let all: Vec<Arc<ServicePort>> =
                self.ports.keys().map(|f| f.0.clone()).chain(model.service_ports().cloned()).collect();
            for sp in all {
                self.set_facts(model, &sp.name);
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
    /// successful restore; then the sync, with its slowest programming
    /// latency, and the model's counts go to the registry.
    fn sync_finished(&mut self, outcome: SyncOutcome) {
        let now = SystemTime::now();
        let slowest = self.report_sync(&outcome, now);
        let sync = FamilySync {
            family: ip_family_label(self.family),
            unix_ms: unix_ms(now),
            record: outcome.record,
            programming_ms: slowest.map(|secs| secs * 1000.0),
        };
        self.registry.sync_finished(sync, self.model_counts());
    }
}

impl SyncHooks {
    /// [`SyncObserver::sync_finished`]'s metrics and health; returns the
    /// slowest network programming latency observed, in seconds.
    fn report_sync(&mut self, outcome: &SyncOutcome, now: SystemTime) -> Option<f64> {
        self.metrics.sync_done(self.family, outcome.record.full, outcome.took);
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
        if let Some(r) = &outcome.rules {
            self.metrics.iptables_rules(self.family, "filter", r.filter_total, r.filter_last);
            self.metrics.iptables_rules(self.family, "nat", r.nat_total, r.nat_last);
        }
        let triggers = std::mem::take(&mut self.triggers);
        if !outcome.ok {
            return None;
        }
        self.metrics.sync_succeeded(self.family, now);
        self.health.updated(self.family);
        let latencies = triggers.iter().filter_map(|t| self.metrics.programming_latency(self.family, t, now));
        let slowest = latencies.reduce(f64::max);
        self.metrics.no_local_endpoints(self.family, self.no_local.0, self.no_local.1);
        self.sync_service_health();
        if let Some(done) = self.first_sync.take() {
            // Nothing waits any more when the receiver is gone.
            let _ = done.send(());
        }
        slowest
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
        endpoints: endpoints.len(),
    }
}

#[cfg(test)]
mod tests;
