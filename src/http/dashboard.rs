//! The actor mailbox dashboard, served by the metrics server
//! (`metricsBindAddress`):
//!
//! - `GET /dashboard`: one self-contained HTML page (inline CSS and JS, no
//!   external resource; a Content-Security-Policy forbids any) with a panel
//!   per actor (mailbox depth, messages/s, apply latency p50/p99, errors)
//!   and a table of the recent syncs, refreshed every second;
//! - `GET /dashboard/data`: the JSON the page polls ([`DashboardData`]):
//!   every actor's [`StatsSnapshot`] plus message and op rates computed here
//!   from successive snapshots, and the coordinator's recent syncs, newest
//!   first, the input refused lately ([`Refusal`]), the count of values
//!   skipped inside objects ([`IgnoredValues`]) and, in IPVS mode, the
//!   service ports with a scheduler of their own ([`ServiceScheduler`]).
//!
//! Rates are computed server-side against the newest sample at least
//! [`RATE_BASE`] old, so any client (or `curl` in a loop) gets them; samples
//! are taken when the data is requested, at most every [`SAMPLE_EVERY`].

use crate::sync::lock;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use actix::Recipient;
use futures::future::BoxFuture;
use futures::FutureExt;
use hyper::header::{HeaderValue, CACHE_CONTROL};

use super::{text_response, Response, Routes};
use crate::actors::coordinator::{GetSyncHistory, SyncRecord};
use crate::stats::{IgnoredValues, Refusal, ServiceScheduler, StatsRegistry, StatsSnapshot, APPLY_BUCKETS};

/// The page, embedded at build time.
const PAGE: &str = include_str!("dashboard.html");
const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";
/// Everything comes from the daemon itself: no CDN, font or image host.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'";

/// Rates compare against the newest sample at least this old.
pub const RATE_BASE: Duration = Duration::from_secs(1);
/// Samples older than this are dropped.
const RATE_KEEP: Duration = Duration::from_secs(10);
/// A shorter span than this gives no rate (too noisy).
const RATE_MIN: Duration = Duration::from_millis(250);
/// At most one sample per this span, however many clients poll.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How long the data endpoint waits for the coordinator's sync history.
const HISTORY_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks the coordinator for its recent syncs (oldest first, as
/// `GetSyncHistory` answers).
type SyncHistory = Box<dyn Fn() -> BoxFuture<'static, Vec<SyncRecord>> + Send + Sync>;

/// What `/dashboard/data` serves.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DashboardData {
    /// When the data was taken, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The span the rates are computed over, in seconds; `None` until two
    /// samples far enough apart exist.
    pub rate_window_secs: Option<f64>,
    /// Upper bounds of the apply-duration buckets, in milliseconds; each
    /// actor's `apply_buckets` has one more entry (`+Inf`).
    pub apply_bucket_bounds_ms: Vec<f64>,
    /// Every actor, in pipeline order: ipvs, the ipsets, dummy-link,
    /// iptables, conntrack, then any other by name.
    pub actors: Vec<ActorView>,
    /// The coordinator's recent syncs, newest first.
    pub syncs: Vec<SyncRecord>,
    /// False when the coordinator did not answer in time (`syncs` is empty).
    pub syncs_available: bool,
    /// Input the daemon refused or ignored lately (a nodePort another
    /// Service holds, an EndpointSlice of an unknown addressType, an API
    /// object that does not decode, ...), newest first.
    pub refused: Vec<Refusal>,
    /// The IP and CIDR values skipped inside the objects taken: how many,
    /// and where the newest was.
    pub ignored_values: IgnoredValues,
    /// IPVS mode: the service ports whose Service chose its own scheduler
    /// (annotation), by name then family.
    pub schedulers: Vec<ServiceScheduler>,
}

/// One actor's panel.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActorView {
    #[serde(flatten)]
    pub stats: StatsSnapshot,
    /// Messages taken from the mailbox per second, over `rate_window_secs`.
    pub msgs_per_sec: Option<f64>,
    /// Kernel ops applied per second, over `rate_window_secs`.
    pub ops_per_sec: Option<f64>,
    /// Apply durations per bucket (not cumulative), see
    /// `apply_bucket_bounds_ms`.
    pub apply_buckets: Vec<u64>,
}

/// The dashboard's routes: `/dashboard` and `/dashboard/data`. `history`
/// returns the coordinator's recent syncs (e.g. by sending it
/// `GetSyncHistory`).
pub fn dashboard_routes<F>(registry: StatsRegistry, history: F) -> Routes
where
    F: Fn() -> BoxFuture<'static, Vec<SyncRecord>> + Send + Sync + 'static,
{
    let state = Arc::new(State { registry, history: Box::new(history), rates: Mutex::new(RateTracker::default()) });
    let data = move |_| {
        let state = state.clone();
        async move { state.respond().await }
    };
    Routes::new().route("/dashboard", |_| page()).route("/dashboard/", |_| page()).route_async("/dashboard/data", data)
}

/// The `history` for [`dashboard_routes`] when the coordinator starts after
/// the servers (as in the daemon, whose metrics server comes first): asks
/// the coordinator in `cell` once it is set; no syncs before that, nor if
/// it has stopped.
pub fn coordinator_history(
    cell: Arc<OnceLock<Recipient<GetSyncHistory>>>,
) -> impl Fn() -> BoxFuture<'static, Vec<SyncRecord>> + Send + Sync + 'static {
    move || {
        let coordinator = cell.get().cloned();
        async move {
            match coordinator {
                Some(addr) => addr.send(GetSyncHistory).await.unwrap_or_default(),
                None => Vec::new(),
            }
        }
        .boxed()
    }
}

fn page() -> Response {
    let mut resp = no_store(text_response(200, HTML, PAGE));
    resp.headers_mut().insert("content-security-policy", HeaderValue::from_static(CSP));
    resp
}

fn no_store(mut resp: Response) -> Response {
    resp.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// What the data handler shares between requests.
struct State {
    registry: StatsRegistry,
    history: SyncHistory,
    rates: Mutex<RateTracker>,
}

impl State {
    async fn respond(&self) -> Response {
        let data = self.collect().await;
        match serde_json::to_string(&data) {
            Ok(body) => no_store(text_response(200, JSON, body)),
            Err(e) => {
                tracing::error!(error = %e, "encoding the dashboard data");
                text_response(500, "text/plain; charset=utf-8", format!("encoding the dashboard data: {e}\n"))
            }
        }
    }

    async fn collect(&self) -> DashboardData {
        let syncs = tokio::time::timeout(HISTORY_TIMEOUT, (self.history)()).await.ok();
        let live = self.registry.actors();
        let snaps: Vec<StatsSnapshot> = live.iter().map(|a| a.snapshot()).collect();
        let buckets: BTreeMap<String, Vec<u64>> = live
            .iter()
            .map(|a| (a.name.clone(), a.apply_histogram().buckets.iter().map(|(_, n)| *n).collect()))
            .collect();
        let rates = lock(&self.rates).observe(Instant::now(), &snaps);
        let mut data = dashboard_data(unix_ms(SystemTime::now()), snaps, &buckets, &rates, syncs);
        data.refused = self.registry.refusals();
        data.ignored_values = self.registry.ignored_values();
        data.schedulers = self.registry.schedulers();
        data
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Assembles the JSON document (pure: every input is an argument).
/// `syncs` is the coordinator's answer, oldest first, or `None` when it did
/// not answer.
pub fn dashboard_data(
    unix_ms: u64,
    snaps: Vec<StatsSnapshot>,
    buckets: &BTreeMap<String, Vec<u64>>,
    rates: &Rates,
    syncs: Option<Vec<SyncRecord>>,
) -> DashboardData {
    let mut actors: Vec<ActorView> = snaps
        .into_iter()
        .map(|stats| {
            let rate = rates.per_actor.get(&stats.name);
            ActorView {
                msgs_per_sec: rate.map(|r| r.msgs_per_sec),
                ops_per_sec: rate.map(|r| r.ops_per_sec),
                apply_buckets: buckets.get(&stats.name).cloned().unwrap_or_default(),
                stats,
            }
        })
        .collect();
    actors.sort_by(|a, b| pipeline_rank(&a.stats.name).cmp(&pipeline_rank(&b.stats.name)));
    let syncs_available = syncs.is_some();
    let mut syncs = syncs.unwrap_or_default();
    syncs.reverse();
    DashboardData {
        unix_ms,
        rate_window_secs: rates.window.map(|w| w.as_secs_f64()),
        apply_bucket_bounds_ms: APPLY_BUCKETS.iter().map(|b| b * 1000.0).collect(),
        actors,
        syncs,
        syncs_available,
        refused: Vec::new(),
        ignored_values: IgnoredValues::default(),
        schedulers: Vec::new(),
    }
}

/// Sort key: the order in which a sync reaches the actors, then the name.
fn pipeline_rank(name: &str) -> (u8, &str) {
    let stage = match name {
        "ipvs" => 0,
        n if n.starts_with("ipset/") => 1,
        "dummy-link" => 2,
        "iptables" => 3,
        "conntrack" => 4,
        _ => 5,
    };
    (stage, name)
}

/// One actor's rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub msgs_per_sec: f64,
    pub ops_per_sec: f64,
}

/// Rates for every actor seen in both samples, and the span between them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    pub window: Option<Duration>,
    pub per_actor: BTreeMap<String, Rate>,
}

/// Counters of every actor at one instant.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    /// Name to (messages received, ops applied).
    counts: BTreeMap<String, (u64, u64)>,
}

/// Recent samples of the counters, to derive rates from.
#[derive(Debug, Default)]
pub struct RateTracker {
    samples: VecDeque<Sample>,
}

impl RateTracker {
    /// Records the counters as of `now` (at most every [`SAMPLE_EVERY`]) and
    /// returns the rates since the newest sample at least [`RATE_BASE`]
    /// older (or the oldest one kept, if it is at least 250 ms old).
    pub fn observe(&mut self, now: Instant, snaps: &[StatsSnapshot]) -> Rates {
        let current = Sample { at: now, counts: snaps.iter().map(|s| (s.name.clone(), (s.received, s.ops))).collect() };
        while self.samples.front().is_some_and(|s| now.saturating_duration_since(s.at) > RATE_KEEP) {
            self.samples.pop_front();
        }
        let rates = self.base(now).map(|b| rates_between(b, &current)).unwrap_or_default();
        if self.samples.back().is_none_or(|s| now.saturating_duration_since(s.at) >= SAMPLE_EVERY) {
            self.samples.push_back(current);
        }
        rates
    }

    fn base(&self, now: Instant) -> Option<&Sample> {
        let age = |s: &Sample| now.saturating_duration_since(s.at);
        let old_enough = self.samples.iter().rev().find(|s| age(s) >= RATE_BASE);
        old_enough.or_else(|| self.samples.front()).filter(|s| age(s) >= RATE_MIN)
    }
}

fn rates_between(base: &Sample, now: &Sample) -> Rates {
    let span = now.at.saturating_duration_since(base.at);
    let secs = span.as_secs_f64();
    let per_actor = now
        .counts
        .iter()
        .filter_map(|(name, (msgs, ops))| {
            let (msgs0, ops0) = base.counts.get(name)?;
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            Some((name.clone(), Rate { msgs_per_sec: rate(*msgs, *msgs0), ops_per_sec: rate(*ops, *ops0) }))
        })
        .collect();
    Rates { window: Some(span), per_actor }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn snap(name: &str, received: u64, ops: u64) -> StatsSnapshot {
        StatsSnapshot { name: name.into(), received, ops, ..StatsSnapshot::default() }
    }

    fn sync(generation: u64, full: bool) -> SyncRecord {
        SyncRecord { generation, full, periodic: false, duration_ms: 1.5, ports_changed: 2, ops: 7, failed: 0 }
    }

    #[test]
    fn the_json_has_every_actor_with_its_counters_rates_and_buckets() {
        let rates = Rates {
            window: Some(Duration::from_millis(1500)),
            per_actor: [("ipvs".to_string(), Rate { msgs_per_sec: 4.0, ops_per_sec: 10.0 })].into(),
        };
        let buckets: BTreeMap<String, Vec<u64>> = [("ipvs".to_string(), vec![1; 19])].into();
        let mut ipvs = snap("ipvs", 12, 30);
        (ipvs.mailbox_depth, ipvs.errors, ipvs.last_generation, ipvs.p50_ms, ipvs.p99_ms) = (2, 1, 9, 0.5, 3.25);
        let data = dashboard_data(1_700_000_000_000, vec![ipvs], &buckets, &rates, Some(vec![]));
        let v = serde_json::to_value(&data).unwrap();
        assert_eq!(v["unix_ms"], json!(1_700_000_000_000u64));
        assert_eq!(v["rate_window_secs"], json!(1.5));
        assert_eq!(v["apply_bucket_bounds_ms"].as_array().map(Vec::len), Some(APPLY_BUCKETS.len()));
        assert_eq!(v["apply_bucket_bounds_ms"][0], json!(0.1));
        assert_eq!(
            v["actors"][0],
            json!({
                "name": "ipvs", "mailbox_depth": 2, "received": 12, "ops": 30, "errors": 1,
                "last_generation": 9, "p50_ms": 0.5, "p99_ms": 3.25,
                "failing_keys": 0, "failing": [], "retries": 0,
                "msgs_per_sec": 4.0, "ops_per_sec": 10.0, "apply_buckets": vec![1; 19],
            })
        );
        assert_eq!(v["syncs"], json!([]));
        assert_eq!(v["syncs_available"], json!(true));
        assert_eq!(v["schedulers"], json!([]));
    }

    #[test]
    fn syncs_are_newest_first_with_every_field() {
        let data =
            dashboard_data(0, vec![], &BTreeMap::new(), &Rates::default(), Some(vec![sync(1, true), sync(2, false)]));
        let v = serde_json::to_value(&data).unwrap();
        assert_eq!(
            v["syncs"],
            json!([
                {"generation": 2, "full": false, "periodic": false, "duration_ms": 1.5, "ports_changed": 2, "ops": 7, "failed": 0},
                {"generation": 1, "full": true, "periodic": false, "duration_ms": 1.5, "ports_changed": 2, "ops": 7, "failed": 0},
            ])
        );
    }

    #[test]
    fn without_a_previous_sample_or_an_answer_the_fields_are_null_or_empty() {
        let data = dashboard_data(0, vec![snap("conntrack", 0, 0)], &BTreeMap::new(), &Rates::default(), None);
        let v = serde_json::to_value(&data).unwrap();
        assert_eq!(v["rate_window_secs"], Value::Null);
        assert_eq!(v["actors"][0]["msgs_per_sec"], Value::Null);
        assert_eq!(v["actors"][0]["apply_buckets"], json!([]));
        assert_eq!((v["syncs"].clone(), v["syncs_available"].clone()), (json!([]), json!(false)));
    }

    #[test]
    fn actors_are_listed_in_pipeline_order() {
        let names =
            ["conntrack", "dummy-link", "ipset/KUBE-NODE-PORT-TCP", "iptables", "ipvs", "ipset/KUBE-CLUSTER-IP", "zz"];
        let snaps = names.iter().map(|n| snap(n, 0, 0)).collect();
        let data = dashboard_data(0, snaps, &BTreeMap::new(), &Rates::default(), None);
        let order: Vec<&str> = data.actors.iter().map(|a| a.stats.name.as_str()).collect();
        assert_eq!(
            order,
            ["ipvs", "ipset/KUBE-CLUSTER-IP", "ipset/KUBE-NODE-PORT-TCP", "dummy-link", "iptables", "conntrack", "zz"]
        );
    }

    #[test]
    fn rates_come_from_the_newest_sample_at_least_a_second_old() {
        let t0 = Instant::now();
        let mut r = RateTracker::default();
        assert_eq!(r.observe(t0, &[snap("ipvs", 0, 0)]), Rates::default(), "no rate from one sample");
        let early = r.observe(t0 + Duration::from_millis(100), &[snap("ipvs", 5, 5)]);
        assert_eq!(early.window, None, "100 ms is too short a span");
        r.observe(t0 + Duration::from_millis(500), &[snap("ipvs", 10, 20)]);
        let at_2s = r.observe(t0 + Duration::from_secs(2), &[snap("ipvs", 40, 80)]);
        assert_eq!(at_2s.window, Some(Duration::from_millis(1500)), "base: the 500 ms sample");
        assert_eq!(at_2s.per_actor["ipvs"], Rate { msgs_per_sec: 20.0, ops_per_sec: 40.0 });
    }

    #[test]
    fn a_new_actor_has_no_rate_and_a_reset_counter_does_not_go_negative() {
        let t0 = Instant::now();
        let mut r = RateTracker::default();
        r.observe(t0, &[snap("ipvs", 10, 10)]);
        let later = r.observe(t0 + Duration::from_secs(1), &[snap("ipvs", 0, 0), snap("iptables", 3, 3)]);
        assert_eq!(later.per_actor["ipvs"], Rate { msgs_per_sec: 0.0, ops_per_sec: 0.0 });
        assert!(!later.per_actor.contains_key("iptables"));
    }

    #[test]
    fn old_samples_are_dropped_and_frequent_polls_add_none() {
        let t0 = Instant::now();
        let mut r = RateTracker::default();
        for i in 0..100 {
            r.observe(t0 + Duration::from_millis(10 * i), &[]);
        }
        assert_eq!(r.samples.len(), 5, "one sample per 200 ms");
        r.observe(t0 + Duration::from_secs(60), &[]);
        assert_eq!(r.samples.len(), 1, "only the newest survives a long gap");
    }
}
