//! Prometheus metrics: upstream's kube-proxy metrics, with the names, types,
//! labels and buckets of `pkg/proxy/metrics/metrics.go` (1.33+: `ip_family`
//! labels), and ours (`kube_proxy_rs_*`), the per-actor ones read from the
//! [`StatsRegistry`] at scrape time.
//!
//! [`ProxyMetrics`] is shared as an `Arc`; every update is an atomic add or
//! store (a label lookup for the labelled families), cheap enough to call
//! from the coordinator on every sync. Its methods are named for what the
//! caller did (`sync_queued`, `sync_done`, ...). `/metrics` serves
//! [`ProxyMetrics::encode_text`]: the Prometheus text format 0.0.4, as
//! upstream's handler does.

mod actors;
pub mod exposition;
mod nfacct;
mod process;
mod switch;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, linear_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use crate::config::ProxyMode;
use crate::health::{Probe, ProbeCounter};
use crate::model::intake::Notice;
use crate::net::IpFamily;
use crate::stats::StatsRegistry;

pub use exposition::TEXT_CONTENT_TYPE;
pub use nfacct::{NfacctReadError, NfacctReader};

/// The labels of one series, in order.
type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
type CounterFamily = Family<Labels, Counter>;

pub use crate::net::ip_family_label;

/// Which traffic policy a service with no local endpoints has
/// (`traffic_policy` label of `kubeproxy_sync_proxy_rules_no_local_endpoints_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicy {
    Internal,
    External,
}

impl TrafficPolicy {
    fn label(self) -> &'static str {
        match self {
            TrafficPolicy::Internal => "internal",
            TrafficPolicy::External => "external",
        }
    }
}

/// `ExponentialBuckets(0.001, 2, 15)`: 1 ms to ~16 s (sync and conntrack durations).
fn sync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Upstream's network-programming buckets: `MergeBuckets` (which starts with
/// a 0 bucket) of 0.25 s steps to 0.5 s, 1 s steps to 59 s, 5 s steps to
/// 115 s and 30 s steps to 5 min.
fn programming_histogram() -> Histogram {
    let buckets = std::iter::once(0.0)
        .chain(linear_buckets(0.25, 0.25, 2))
        .chain(linear_buckets(1.0, 1.0, 59))
        .chain(linear_buckets(60.0, 5.0, 12))
        .chain(linear_buckets(120.0, 30.0, 7));
    Histogram::new(buckets)
}

fn family_labels(f: IpFamily) -> Labels {
    vec![("ip_family", ip_family_label(f).to_string())]
}

/// Seconds since the Unix epoch (0 for times before it).
fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Upstream's sync metrics (every mode).
#[derive(Debug)]
struct SyncMetrics {
    latency: HistogramFamily,
    full: HistogramFamily,
    partial: HistogramFamily,
    last: GaugeFamily,
    last_queued: GaugeFamily,
    programming: HistogramFamily,
    endpoints_pending: Gauge,
    endpoints_total: Counter,
    services_pending: Gauge,
    services_total: Counter,
    no_local: GaugeFamily,
}

/// Upstream's per-backend metrics (registered for the modes that have them).
#[derive(Debug)]
struct BackendMetrics {
    restore_failures: CounterFamily,
    partial_restore_failures: CounterFamily,
    iptables_rules: GaugeFamily,
    iptables_last: GaugeFamily,
    nft_sync_failures: CounterFamily,
    nft_cleanup_failures: CounterFamily,
    conntrack_duration: HistogramFamily,
    conntrack_deleted: CounterFamily,
}

/// Health probes and ours.
#[derive(Debug, Default)]
struct ServerMetrics {
    healthz: CounterFamily,
    livez: CounterFamily,
    bind_failures: CounterFamily,
    config_reload_failures: prometheus_client::metrics::counter::Counter,
    objects_ignored: CounterFamily,
    objects_refused: CounterFamily,
    values_ignored: CounterFamily,
}

impl SyncMetrics {
    fn new() -> SyncMetrics {
        SyncMetrics {
            latency: Family::new_with_constructor(sync_histogram),
            full: Family::new_with_constructor(sync_histogram),
            partial: Family::new_with_constructor(sync_histogram),
            last: GaugeFamily::default(),
            last_queued: GaugeFamily::default(),
            programming: Family::new_with_constructor(programming_histogram),
            endpoints_pending: Gauge::default(),
            endpoints_total: Counter::default(),
            services_pending: Gauge::default(),
            services_total: Counter::default(),
            no_local: GaugeFamily::default(),
        }
    }
}

impl BackendMetrics {
    fn new() -> BackendMetrics {
        BackendMetrics {
            restore_failures: CounterFamily::default(),
            partial_restore_failures: CounterFamily::default(),
            iptables_rules: GaugeFamily::default(),
            iptables_last: GaugeFamily::default(),
            nft_sync_failures: CounterFamily::default(),
            nft_cleanup_failures: CounterFamily::default(),
            conntrack_duration: Family::new_with_constructor(sync_histogram),
            conntrack_deleted: CounterFamily::default(),
        }
    }
}

/// Every metric the daemon exports, and the registry that encodes them.
#[derive(Debug)]
pub struct ProxyMetrics {
    registry: Registry,
    /// Where refusals are listed for the dashboard.
    actors: StatsRegistry,
    /// Trigger times before this are not observed (upstream's tracker start time).
    started: SystemTime,
    sync: SyncMetrics,
    backend: BackendMetrics,
    server: ServerMetrics,
    /// iptables mode's nfacct counters, read from the kernel at each scrape.
    nfacct: nfacct::NfacctMetrics,
}

/// Registers metrics under their upstream (exposition) names.
struct Registrar<'a>(&'a mut Registry);

impl Registrar<'_> {
    /// Counters are registered without `_total`: the encoder appends it.
    fn add(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.0.register(name.strip_suffix("_total").unwrap_or(name), help, metric);
    }

    /// Gauges keep their name, even one ending in `_total`.
    fn add_gauge(&mut self, name: &str, help: &str, metric: impl Metric) {
        self.0.register(name, help, metric);
    }
}

impl ProxyMetrics {
    /// The metrics for `mode` (upstream registers some per backend), with the
    /// per-actor metrics read from `actors` at each scrape.
    pub fn new(mode: ProxyMode, actors: StatsRegistry) -> ProxyMetrics {
        let sync = SyncMetrics::new();
        let backend = BackendMetrics::new();
        let server = ServerMetrics::default();
        let mut registry = Registry::default();
        let mut r = Registrar(&mut registry);
        register_sync(&mut r, &sync);
        register_backend(&mut r, &backend, mode);
        register_server(&mut r, &server);
        registry.register_collector(Box::new(actors::ActorCollector::new(actors.clone())));
        registry.register_collector(Box::new(process::ProcessCollector));
        registry.register_collector(Box::new(switch::SwitchCollector::new(actors.clone())));
        let nfacct = nfacct::NfacctMetrics::default();
        if mode == ProxyMode::Iptables {
            registry.register_collector(Box::new(nfacct.collector()));
        }
        ProxyMetrics { registry, actors, started: SystemTime::now(), sync, backend, server, nfacct }
    }

    /// The exposition in the Prometheus text format 0.0.4 (what `/metrics`
    /// serves, as upstream).
    pub fn encode_text(&self) -> String {
        exposition::to_prometheus_text(&self.encode_openmetrics())
    }

    /// [`ProxyMetrics::encode_text`] after reading what is read from the
    /// kernel at scrape time (the nfacct counters), as `/metrics` serves it.
    pub async fn scrape_text(&self) -> String {
        self.nfacct.refresh().await;
        self.encode_text()
    }

    /// iptables mode counts packets into the nfacct objects `objects`
    /// (`ct_state_invalid_dropped_pkts`, `localhost_nps_accepted_pkts`):
    /// their metrics exist from now (0 until read), and each scrape reads
    /// them with `reader`. Objects the rules do not use have no metric.
    pub fn nfacct_counters(&self, objects: &[&'static str], reader: NfacctReader) {
        self.nfacct.serve(objects, reader);
    }

    /// The exposition in the OpenMetrics text format.
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics");
        }
        out
    }

    /// The proxier of each of `families` runs: every histogram and counter
    /// of upstream's with an `ip_family` label (and the probes' 200 and 503
    /// counts) exists from now, at zero, so dashboards and alerts built on
    /// upstream's names have a series before the first observation.
    /// Timestamps and rule counts stay absent until there is a value.
    pub fn families_started(&self, families: &[IpFamily]) {
        for family in families {
            let labels = family_labels(*family);
            for h in [&self.sync.latency, &self.sync.full, &self.sync.partial, &self.sync.programming] {
                let _ = h.get_or_create(&labels);
            }
            let _ = self.backend.conntrack_duration.get_or_create(&labels);
            for c in [
                &self.backend.restore_failures,
                &self.backend.partial_restore_failures,
                &self.backend.nft_sync_failures,
                &self.backend.nft_cleanup_failures,
                &self.backend.conntrack_deleted,
            ] {
                let _ = c.get_or_create(&labels);
            }
        }
        for code in ["200", "503"] {
            let _ = self.server.healthz.get_or_create(&vec![("code", code.to_string())]);
            let _ = self.server.livez.get_or_create(&vec![("code", code.to_string())]);
        }
    }

    /// A sync was queued (a Service or EndpointSlice change arrived):
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`.
    pub fn sync_queued(&self, family: IpFamily, at: SystemTime) {
        self.sync.last_queued.get_or_create(&family_labels(family)).set(unix_seconds(at));
    }

    /// A sync finished, successfully or not (upstream observes both): the
    /// duration goes to `kubeproxy_sync_proxy_rules_duration_seconds` and to
    /// the full or partial histogram.
    pub fn sync_done(&self, family: IpFamily, full: bool, took: Duration) {
        let labels = family_labels(family);
        let secs = took.as_secs_f64();
        self.sync.latency.get_or_create(&labels).observe(secs);
        let kind = if full { &self.sync.full } else { &self.sync.partial };
        kind.get_or_create(&labels).observe(secs);
    }

    /// A sync succeeded: `kubeproxy_sync_proxy_rules_last_timestamp_seconds`.
    pub fn sync_succeeded(&self, family: IpFamily, at: SystemTime) {
        self.sync.last.get_or_create(&family_labels(family)).set(unix_seconds(at));
    }

    /// How many Service and EndpointSlice changes wait for the next sync
    /// (set after recording events, and to 0 once a sync took them).
    pub fn changes_pending(&self, services: usize, endpoints: usize) {
        self.sync.services_pending.set(i64::try_from(services).unwrap_or(i64::MAX));
        self.sync.endpoints_pending.set(i64::try_from(endpoints).unwrap_or(i64::MAX));
    }

    /// Service and EndpointSlice changes seen (`..._changes_total`).
    pub fn changes_seen(&self, services: u64, endpoints: u64) {
        self.sync.services_total.inc_by(services);
        self.sync.endpoints_total.inc_by(endpoints);
    }

    /// Observes network programming latency for one changed EndpointSlice,
    /// from its `endpoints.kubernetes.io/last-change-trigger-time`
    /// annotation (RFC 3339) to `now`, after a successful sync. As upstream,
    /// a value that doesn't parse, or a trigger from before this process
    /// started, is ignored. Returns the latency observed, in seconds.
    pub fn programming_latency(&self, family: IpFamily, trigger_time: &str, now: SystemTime) -> Option<f64> {
        match parse_trigger_time(trigger_time) {
            Some(t) => self.programming_latency_since(family, t, now),
            None => {
                tracing::debug!(value = trigger_time, "ignoring an unparsable last-change-trigger-time");
                None
            }
        }
    }

    /// [`ProxyMetrics::programming_latency`] with the trigger time parsed.
    pub fn programming_latency_since(&self, family: IpFamily, trigger: SystemTime, now: SystemTime) -> Option<f64> {
        if trigger <= self.started {
            return None;
        }
        let secs = unix_seconds(now) - unix_seconds(trigger);
        self.sync.programming.get_or_create(&family_labels(family)).observe(secs);
        Some(secs)
    }

    /// Services with a Local traffic policy and no local endpoints, after a sync.
    pub fn no_local_endpoints(&self, family: IpFamily, internal: usize, external: usize) {
        for (policy, n) in [(TrafficPolicy::Internal, internal), (TrafficPolicy::External, external)] {
            let labels =
                vec![("ip_family", ip_family_label(family).to_string()), ("traffic_policy", policy.label().into())];
            self.sync.no_local.get_or_create(&labels).set(n as f64);
        }
    }

    /// An `iptables-restore` failed (iptables and ipvs modes).
    pub fn iptables_restore_failed(&self, family: IpFamily) {
        self.backend.restore_failures.get_or_create(&family_labels(family)).inc();
    }

    /// A partial `iptables-restore` failed and a full one follows (iptables mode).
    pub fn iptables_partial_restore_failed(&self, family: IpFamily) {
        self.backend.partial_restore_failures.get_or_create(&family_labels(family)).inc();
    }

    /// Rules kube-proxy owns in `table`, and how many the last sync wrote (iptables mode).
    pub fn iptables_rules(&self, family: IpFamily, table: &str, total: usize, last: usize) {
        let labels = vec![("ip_family", ip_family_label(family).to_string()), ("table", table.to_string())];
        self.backend.iptables_rules.get_or_create(&labels).set(total as f64);
        self.backend.iptables_last.get_or_create(&labels).set(last as f64);
    }

    /// An nftables transaction failed (nftables mode).
    pub fn nftables_sync_failed(&self, family: IpFamily) {
        self.backend.nft_sync_failures.get_or_create(&family_labels(family)).inc();
    }

    /// Removing stale nftables chains failed (nftables mode).
    pub fn nftables_cleanup_failed(&self, family: IpFamily) {
        self.backend.nft_cleanup_failures.get_or_create(&family_labels(family)).inc();
    }

    /// The conntrack reconciler ran: how long, and how many flows it deleted.
    pub fn conntrack_reconciled(&self, family: IpFamily, took: Duration, deleted: u64) {
        let labels = family_labels(family);
        self.backend.conntrack_duration.get_or_create(&labels).observe(took.as_secs_f64());
        self.backend.conntrack_deleted.get_or_create(&labels).inc_by(deleted);
    }

    /// The health server answered `/healthz` with `code`.
    pub fn healthz_served(&self, code: u16) {
        self.server.healthz.get_or_create(&vec![("code", code.to_string())]).inc();
    }

    /// The health server answered `/livez` with `code`.
    pub fn livez_served(&self, code: u16) {
        self.server.livez.get_or_create(&vec![("code", code.to_string())]).inc();
    }

    /// A configuration reload (SIGHUP) was refused; the old config stays.
    pub fn config_reload_failed(&self) {
        self.server.config_reload_failures.inc();
    }

    /// What the proxiers left out of a source batch: a value, or an object
    /// (or a part of one), counted and listed on the dashboard.
    pub fn notice(&self, n: &Notice) {
        match n {
            Notice::Value(v) => self.value_ignored(v.kind, &v.object, v.value.field, &v.value.path, &v.value.detail()),
            other => {
                if let Some((kind, object, reason, detail)) = other.ignored_object() {
                    self.object_ignored(kind, object, reason, &detail);
                }
            }
        }
    }

    /// A source object (or a part of one) that every proxier ignores (see
    /// `model::notice`, `model::node_ports`): counted, and listed on the
    /// dashboard.
    pub fn object_ignored(&self, kind: &str, object: &str, reason: &str, detail: &str) {
        let labels = vec![("kind", kind.to_string()), ("reason", reason.to_string())];
        self.server.objects_ignored.get_or_create(&labels).inc();
        self.list_refusal(kind, object, reason, detail);
    }

    /// An IP or CIDR value skipped inside an object the daemon takes (see
    /// `model::notice::ignored_values`; `field` without indices, `path`
    /// with them): counted, and shown on the dashboard.
    pub fn value_ignored(&self, kind: &str, object: &str, field: &str, path: &str, detail: &str) {
        let labels = vec![("kind", kind.to_string()), ("field", field.to_string())];
        self.server.values_ignored.get_or_create(&labels).inc();
        self.actors.value_ignored(crate::stats::LastIgnored {
            unix_ms: now_unix_ms(),
            kind: kind.to_string(),
            object: object.to_string(),
            field: path.to_string(),
        });
        self.list_refusal(kind, object, "invalid_value", detail);
    }

    /// The API source watches `kind`: its
    /// `kube_proxy_rs_source_objects_refused_total` series exists from now, at 0.
    pub fn refusals_counted(&self, kind: &str) {
        self.server.objects_refused.get_or_create(&vec![("kind", kind.to_string())]).inc_by(0);
    }

    /// An object of `kind` the API source could not decode (see
    /// `actors::source::kube`; `detail`: the field and serde's message):
    /// counted, and listed on the dashboard (reason `does_not_decode`).
    pub fn object_refused(&self, kind: &str, object: &str, detail: &str) {
        self.server.objects_refused.get_or_create(&vec![("kind", kind.to_string())]).inc();
        self.list_refusal(kind, object, "does_not_decode", detail);
    }

    /// Lists a refused or ignored object on the dashboard.
    fn list_refusal(&self, kind: &str, object: &str, reason: &str, detail: &str) {
        self.actors.refused(crate::stats::Refusal {
            unix_ms: now_unix_ms(),
            kind: kind.to_string(),
            object: object.to_string(),
            reason: reason.to_string(),
            detail: detail.to_string(),
        });
    }

    /// An HTTP server (`metrics`, `healthz` or `service-health`) could not bind its port.
    pub fn bind_failed(&self, server: &str) {
        self.server.bind_failures.get_or_create(&vec![("server", server.to_string())]).inc();
    }
}

/// The API source's refused objects, counted and listed.
impl crate::actors::source::kube::Refusals for ProxyMetrics {
    fn counting(&self, kind: &str) {
        self.refusals_counted(kind);
    }
    fn refused(&self, kind: &str, object: &str, detail: &str) {
        self.object_refused(kind, object, detail);
    }
}

/// The health probes' answers, counted.
impl ProbeCounter for ProxyMetrics {
    fn probe_served(&self, probe: Probe, status: u16) {
        match probe {
            Probe::Healthz => self.healthz_served(status),
            Probe::Livez => self.livez_served(status),
        }
    }
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Parses an RFC 3339 timestamp (the trigger-time annotation).
pub fn parse_trigger_time(text: &str) -> Option<SystemTime> {
    text.trim().parse::<jiff::Timestamp>().ok().map(SystemTime::from)
}

fn register_sync(r: &mut Registrar, s: &SyncMetrics) {
    r.add("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", s.latency.clone());
    r.add(
        "kubeproxy_sync_full_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for full resyncs",
        s.full.clone(),
    );
    r.add(
        "kubeproxy_sync_partial_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds for partial resyncs",
        s.partial.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "The last time proxy rules were successfully synced",
        s.last.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
        "The last time a sync of proxy rules was queued",
        s.last_queued.clone(),
    );
    r.add(
        "kubeproxy_network_programming_duration_seconds",
        "In Cluster Network Programming Latency in seconds",
        s.programming.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
        "Pending proxy rules Endpoint changes",
        s.endpoints_pending.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "Cumulative proxy rules Endpoint changes",
        s.endpoints_total.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_service_changes_pending",
        "Pending proxy rules Service changes",
        s.services_pending.clone(),
    );
    r.add(
        "kubeproxy_sync_proxy_rules_service_changes_total",
        "Cumulative proxy rules Service changes",
        s.services_total.clone(),
    );
    r.add_gauge(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
        "Number of services with a Local traffic policy and no endpoints",
        s.no_local.clone(),
    );
}

fn register_backend(r: &mut Registrar, b: &BackendMetrics, mode: ProxyMode) {
    if matches!(mode, ProxyMode::Iptables | ProxyMode::Ipvs) {
        r.add(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            b.restore_failures.clone(),
        );
    }
    if mode == ProxyMode::Iptables {
        r.add(
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "Cumulative proxy iptables partial restore failures",
            b.partial_restore_failures.clone(),
        );
        r.add_gauge(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            b.iptables_rules.clone(),
        );
        r.add_gauge(
            "kubeproxy_sync_proxy_rules_iptables_last",
            "Number of iptables rules written by kube-proxy in last sync",
            b.iptables_last.clone(),
        );
    }
    if mode == ProxyMode::Nftables {
        r.add(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
            "Cumulative proxy nftables sync failures",
            b.nft_sync_failures.clone(),
        );
        r.add(
            "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total",
            "Cumulative proxy nftables cleanup failures",
            b.nft_cleanup_failures.clone(),
        );
    }
    r.add(
        "kubeproxy_conntrack_reconciler_sync_duration_seconds",
        "ReconcileConntrackFlowsLatency latency in seconds",
        b.conntrack_duration.clone(),
    );
    r.add(
        "kubeproxy_conntrack_reconciler_deleted_entries_total",
        "Cumulative conntrack flows deleted by conntrack reconciler",
        b.conntrack_deleted.clone(),
    );
}

fn register_server(r: &mut Registrar, s: &ServerMetrics) {
    r.add("kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", s.healthz.clone());
    r.add("kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status", s.livez.clone());
    r.add(
        "kube_proxy_rs_bind_failures_total",
        "HTTP servers that could not bind their address, by server",
        s.bind_failures.clone(),
    );
    r.add(
        "kube_proxy_rs_config_reload_failures_total",
        "Configuration reloads refused (the running configuration was kept)",
        s.config_reload_failures.clone(),
    );
    r.add(
        "kube_proxy_rs_source_objects_ignored_total",
        "Source objects every proxier ignores, by kind and reason (an EndpointSlice without the service-name label or of an unknown address type)",
        s.objects_ignored.clone(),
    );
    r.add(
        "kube_proxy_rs_ignored_values_total",
        "IP and CIDR values that do not parse, skipped inside the Services, EndpointSlices and Node the proxy takes, by kind and field",
        s.values_ignored.clone(),
    );
    r.add(
        "kube_proxy_rs_source_objects_refused_total",
        "Objects from the API server that do not decode into their type, by kind (skipped, or their last readable version kept)",
        s.objects_refused.clone(),
    );
}

#[cfg(test)]
mod tests;
