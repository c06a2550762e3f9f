//! Proxy health, as upstream's `ProxyHealthServer`
//! (`pkg/proxy/healthcheck/proxy_health.go`): the sync loop reports
//! [`ProxyHealth::queued_update`] when a change arrives and
//! [`ProxyHealth::updated`] when a sync succeeded; the proxy is unhealthy
//! once an update has waited longer than the health timeout (upstream: 2 ×
//! syncPeriod).
//!
//! One rule of ours: the sync loop's start ([`ProxyHealth::started`]) also
//! queues an update, the first sync. Upstream queues updates only once its
//! informers have synced, so a proxy whose first list never completes (an
//! API server that fails its lists) stays healthy forever with no rules
//! programmed; here it turns unhealthy once the first sync has not
//! succeeded within the health timeout of the start.
//!
//! - `/livez`: 200 while healthy, else 503.
//! - `/healthz`: the same, and also 503 while the Node is not eligible
//!   (being deleted, or tainted `ToBeDeletedByClusterAutoscaler`), so load
//!   balancers drain the node first.
//!
//! Both answer upstream's JSON (`lastUpdated`, `currentTime`,
//! `nodeEligible` for `/healthz`, `healthy`, per-family `status`) and count
//! `kubeproxy_proxy_healthz_total` / `kubeproxy_proxy_livez_total`.
//! The rules are pure ([`HealthState`], time is an argument);
//! [`ProxyHealth`] wraps them in a lock for the sync loop and the servers.

use crate::mutex::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use serde::{Serialize, Serializer};

use crate::config::KubeProxyConfiguration;
use crate::net::{ip_family_label, IpFamily};

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Upstream's health timeout: twice the sync period.
pub fn health_timeout(cfg: &KubeProxyConfiguration) -> Duration {
    cfg.sync_period().saturating_mul(2)
}

/// Whether the Node may take traffic: not being deleted and not tainted for
/// deletion by the cluster autoscaler (upstream's `NodeEligible`).
pub fn node_eligible(node: &Node) -> bool {
    if node.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    !taints.iter().any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// What the sync loop reported, per IP family, and the Node's eligibility.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthState {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_pending: BTreeMap<IpFamily, SystemTime>,
    node_eligible: bool,
}

impl Default for HealthState {
    /// Nothing reported yet; the node counts as eligible until a Node event
    /// says otherwise (so a proxy without a Node object is not drained).
    fn default() -> HealthState {
        HealthState { last_updated: BTreeMap::new(), oldest_pending: BTreeMap::new(), node_eligible: true }
    }
}

impl HealthState {
    /// A sync of `family` succeeded (or the sync loop started): nothing is pending.
    pub fn updated(&mut self, family: IpFamily, now: SystemTime) {
        self.oldest_pending.remove(&family);
        self.last_updated.insert(family, now);
    }

    /// The sync loop of `family` started: updated now, as upstream marks
    /// it, and its first sync pending from now, so a family that never
    /// syncs turns unhealthy after the timeout.
    pub fn started(&mut self, family: IpFamily, now: SystemTime) {
        self.updated(family, now);
        self.queued_update(family, now);
    }

    /// A change for `family` arrived; the oldest unsynced one counts.
    pub fn queued_update(&mut self, family: IpFamily, now: SystemTime) {
        self.oldest_pending.entry(family).or_insert(now);
    }

    /// Records the Node's eligibility (see [`node_eligible`]).
    pub fn set_node_eligible(&mut self, eligible: bool) {
        self.node_eligible = eligible;
    }

    pub fn node_eligible(&self) -> bool {
        self.node_eligible
    }

    /// Upstream's `Health()`: a family is unhealthy once it has synced at
    /// least once and an update has waited `timeout` or longer. A family
    /// that never synced is not judged (upstream marks it updated when its
    /// sync loop starts).
    pub fn report(&self, timeout: Duration, now: SystemTime) -> HealthReport {
        let mut report = HealthReport {
            last_updated: self.last_updated.values().max().copied(),
            current_time: now,
            node_eligible: None,
            healthy: true,
            status: BTreeMap::new(),
        };
        for (family, last) in &self.last_updated {
            let late = self
                .oldest_pending
                .get(family)
                .is_some_and(|queued| now.duration_since(*queued).unwrap_or(Duration::ZERO) >= timeout);
            report.healthy &= !late;
            report.status.insert(ip_family_label(*family), ProxierHealth { last_updated: *last, healthy: !late });
        }
        report
    }

    /// The answer to a probe (pure; the caller counts it).
    pub fn probe(&self, probe: Probe, timeout: Duration, now: SystemTime) -> ProbeResponse {
        let mut report = self.report(timeout, now);
        let healthy = match probe {
            Probe::Healthz => {
                report.node_eligible = Some(self.node_eligible);
                report.healthy && self.node_eligible
            }
            Probe::Livez => report.healthy,
        };
        if healthy {
            // As upstream: a healthy proxy reports a "recent" lastUpdated.
            report.last_updated = Some(now);
        }
        let body = serde_json::to_string(&report).unwrap_or_default();
        ProbeResponse { status: if healthy { 200 } else { 503 }, body }
    }
}

/// Which endpoint is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/healthz`: proxy health and Node eligibility.
    Healthz,
    /// `/livez`: proxy health only.
    Livez,
}

/// Status and JSON body of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResponse {
    pub status: u16,
    pub body: String,
}

/// Upstream's `ProxyHealth` JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthReport {
    /// The most recent successful sync of any family (`None`: never; Go's zero time).
    #[serde(serialize_with = "go_time_opt")]
    pub last_updated: Option<SystemTime>,
    #[serde(serialize_with = "go_time")]
    pub current_time: SystemTime,
    /// Only in `/healthz` answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_eligible: Option<bool>,
    pub healthy: bool,
    /// Per IP family (`IPv4`, `IPv6`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub status: BTreeMap<&'static str, ProxierHealth>,
}

/// One family's health.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxierHealth {
    #[serde(serialize_with = "go_time")]
    pub last_updated: SystemTime,
    pub healthy: bool,
}

/// Go's JSON time: RFC 3339 with as many fractional digits as needed (UTC here).
pub fn format_go_time(t: Option<SystemTime>) -> String {
    match t.and_then(|t| jiff::Timestamp::try_from(t).ok()) {
        Some(ts) => ts.to_string(),
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

fn go_time<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_go_time(Some(*t)))
}

fn go_time_opt<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_go_time(*t))
}

/// Counts probe answers (`kubeproxy_proxy_healthz_total` /
/// `kubeproxy_proxy_livez_total`): the metrics implement it, so health
/// knows nothing of them.
pub trait ProbeCounter: Send + Sync + std::fmt::Debug {
    /// `probe` was answered with `status`.
    fn probe_served(&self, probe: Probe, status: u16);
}

/// The shared health: the sync loop writes, the HTTP servers read.
#[derive(Debug)]
pub struct ProxyHealth {
    state: Mutex<HealthState>,
    timeout: Duration,
    metrics: Option<Arc<dyn ProbeCounter>>,
}

impl ProxyHealth {
    /// Health with upstream's rules and `timeout` (see [`health_timeout`]).
    pub fn new(timeout: Duration) -> ProxyHealth {
        ProxyHealth { state: Mutex::new(HealthState::default()), timeout, metrics: None }
    }

    /// Counts probe answers in `kubeproxy_proxy_healthz_total` / `_livez_total`.
    pub fn with_metrics(mut self, metrics: Arc<dyn ProbeCounter>) -> ProxyHealth {
        self.metrics = Some(metrics);
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        lock(&self.state)
    }

    /// A sync of `family` succeeded now.
    pub fn updated(&self, family: IpFamily) {
        self.state().updated(family, SystemTime::now());
    }

    /// The sync loop of `family` starts now (see [`HealthState::started`]).
    pub fn started(&self, family: IpFamily) {
        self.state().started(family, SystemTime::now());
    }

    /// A Service or EndpointSlice change for `family` arrived now.
    pub fn queued_update(&self, family: IpFamily) {
        self.state().queued_update(family, SystemTime::now());
    }

    /// Our Node was added or updated.
    pub fn sync_node(&self, node: &Node) {
        let eligible = node_eligible(node);
        let mut state = self.state();
        if state.node_eligible() != eligible {
            tracing::info!(eligible, "node eligibility changed");
        }
        state.set_node_eligible(eligible);
    }

    /// Our Node was deleted: not eligible (upstream: no Node, not eligible).
    pub fn node_deleted(&self) {
        self.state().set_node_eligible(false);
    }

    /// The proxy's health, ignoring the Node (what service health checks use).
    pub fn is_healthy(&self) -> bool {
        self.report(SystemTime::now()).healthy
    }

    /// Every family's health at `now`, as `/livez` judges it (for the dashboard).
    pub fn report(&self, now: SystemTime) -> HealthReport {
        self.state().report(self.timeout, now)
    }

    /// A copy of the state (for tests and the dashboard).
    pub fn snapshot(&self) -> HealthState {
        self.state().clone()
    }

    /// Answers `/healthz` or `/livez` at `now`, counting the answer.
    pub fn probe(&self, probe: Probe, now: SystemTime) -> ProbeResponse {
        let response = self.state().probe(probe, self.timeout, now);
        if let Some(m) = &self.metrics {
            m.probe_served(probe, response.status);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn json(body: &str) -> serde_json::Value {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn healthy_before_the_first_sync_even_with_updates_queued() {
        let mut s = HealthState::default();
        s.queued_update(IpFamily::V4, at(0));
        let r = s.probe(Probe::Healthz, TIMEOUT, at(1000));
        assert_eq!(r.status, 200);
        let body = json(&r.body);
        assert_eq!(body["nodeEligible"], true);
        assert!(body.get("status").is_none(), "{body}");
    }

    #[test]
    fn a_family_that_never_syncs_turns_unhealthy_after_the_timeout() {
        let mut s = HealthState::default();
        s.started(IpFamily::V4, at(0));
        assert_eq!(s.probe(Probe::Healthz, TIMEOUT, at(59)).status, 200, "within the timeout of the start");
        let r = s.probe(Probe::Healthz, TIMEOUT, at(60));
        assert_eq!(r.status, 503, "no first sync within the timeout");
        assert_eq!(json(&r.body)["status"]["IPv4"]["healthy"], false);
        assert_eq!(s.probe(Probe::Livez, TIMEOUT, at(60)).status, 503);
        // Changes queued meanwhile do not move the first pending update.
        s.queued_update(IpFamily::V4, at(100));
        assert_eq!(s.probe(Probe::Livez, TIMEOUT, at(101)).status, 503);
        s.updated(IpFamily::V4, at(102));
        assert_eq!(s.probe(Probe::Healthz, TIMEOUT, at(103)).status, 200, "the first sync heals it");
    }

    #[test]
    fn an_update_queued_longer_than_the_timeout_is_unhealthy() {
        let mut s = HealthState::default();
        s.updated(IpFamily::V4, at(0));
        s.queued_update(IpFamily::V4, at(10));
        s.queued_update(IpFamily::V4, at(50));
        assert_eq!(s.probe(Probe::Livez, TIMEOUT, at(69)).status, 200, "59 s after the oldest queued update");
        let r = s.probe(Probe::Livez, TIMEOUT, at(70));
        assert_eq!(r.status, 503, "the oldest queued update counts");
        let body = json(&r.body);
        assert_eq!(body["healthy"], false);
        assert_eq!(body["lastUpdated"], "2023-11-14T22:13:20Z");
        assert_eq!(
            body["status"]["IPv4"],
            serde_json::json!({"lastUpdated": "2023-11-14T22:13:20Z", "healthy": false})
        );
        s.updated(IpFamily::V4, at(71));
        assert_eq!(s.probe(Probe::Livez, TIMEOUT, at(500)).status, 200, "a sync clears the pending update");
    }

    #[test]
    fn one_late_family_makes_the_proxy_unhealthy() {
        let mut s = HealthState::default();
        s.updated(IpFamily::V4, at(0));
        s.updated(IpFamily::V6, at(0));
        s.queued_update(IpFamily::V6, at(1));
        let body = json(&s.probe(Probe::Livez, TIMEOUT, at(100)).body);
        assert_eq!(body["healthy"], false);
        assert_eq!(body["status"]["IPv4"]["healthy"], true);
        assert_eq!(body["status"]["IPv6"]["healthy"], false);
    }

    #[test]
    fn healthz_drains_an_ineligible_node_but_livez_does_not() {
        let mut s = HealthState::default();
        s.updated(IpFamily::V4, at(0));
        s.set_node_eligible(false);
        let healthz = s.probe(Probe::Healthz, TIMEOUT, at(5));
        assert_eq!(healthz.status, 503);
        assert_eq!(json(&healthz.body)["nodeEligible"], false);
        assert_eq!(json(&healthz.body)["healthy"], true, "the proxy itself is fine");
        let livez = s.probe(Probe::Livez, TIMEOUT, at(5));
        assert_eq!(livez.status, 200);
        assert!(json(&livez.body).get("nodeEligible").is_none(), "{}", livez.body);
    }

    #[test]
    fn body_has_upstreams_fields_in_order_and_go_times() {
        let mut s = HealthState::default();
        s.updated(IpFamily::V4, at(0));
        let now = at(3) + Duration::from_millis(250);
        let r = s.probe(Probe::Healthz, TIMEOUT, now);
        assert_eq!(
            r.body,
            r#"{"lastUpdated":"2023-11-14T22:13:23.25Z","currentTime":"2023-11-14T22:13:23.25Z","nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2023-11-14T22:13:20Z","healthy":true}}}"#
        );
        assert_eq!(format_go_time(None), "0001-01-01T00:00:00Z");
    }

    #[test]
    fn node_eligibility_follows_deletion_and_the_autoscaler_taint() {
        let mut node = Node::default();
        assert!(node_eligible(&node));
        node.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TO_BE_DELETED_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }]),
            ..NodeSpec::default()
        });
        assert!(!node_eligible(&node));
        node.spec = None;
        node.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(!node_eligible(&node));
        let h = ProxyHealth::new(TIMEOUT);
        h.sync_node(&node);
        assert!(!h.snapshot().node_eligible());
        h.sync_node(&Node::default());
        assert!(h.snapshot().node_eligible());
        h.node_deleted();
        assert!(!h.snapshot().node_eligible());
    }

    #[test]
    fn timeout_is_twice_the_sync_period() {
        let mut cfg = KubeProxyConfiguration::with_defaults();
        cfg.mode = "ipvs".into();
        assert_eq!(health_timeout(&cfg), Duration::from_secs(60));
    }
}
