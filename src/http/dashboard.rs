//! The dashboard an operator keeps open, served by the metrics server
//! (`metricsBindAddress`):
//!
//! - `GET /dashboard`: one self-contained HTML page (inline CSS, JS and SVG;
//!   a Content-Security-Policy forbids any outside resource): a header with
//!   the mode, node, version, families, Service and endpoint counts and sync
//!   health; charts of each family's sync duration and network programming
//!   latency and of the mailbox depths over time; a panel per actor
//!   (mailbox depth, messages/s, apply latency p50/p99, errors) in groups
//!   named for the mode that runs them; every family's recent syncs, the
//!   failing kernel ops, the input refused lately and, in IPVS mode, the
//!   service ports with a scheduler of their own. It polls every second.
//! - `GET /dashboard/data`: the JSON the page polls ([`DashboardData`]).
//!
//! Where the numbers come from: the actors' stats, and each family's syncs
//! and model counts as the sync hooks report them, are in the
//! [`StatsRegistry`]; sync health is `/livez`'s verdict ([`ProxyHealth`]);
//! what runs (mode, node, families) is given at start ([`About`]). A
//! sampler thread reads every actor's counters once a [`SAMPLE_EVERY`] and
//! keeps the last [`HISTORY_POINTS`] steps, so rates and history are there
//! on a page's first update, however late it opens. Nothing here runs on
//! the sync path, and a request costs the number of actors and syncs kept,
//! not the cluster's size.

use crate::mutex::lock;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use hyper::header::{HeaderValue, CACHE_CONTROL};

use super::{text_response, Response, Routes};
use crate::config::ProxyMode;
use crate::health::{HealthReport, ProxyHealth};
use crate::net::{ip_family_label, IpFamily};
use crate::stats::{
    unix_ms, ActorCounters, FamilySync, IgnoredValues, ModelCounts, Refusal, ServiceScheduler, StatsRegistry,
    StatsSnapshot, SwitchDrain, APPLY_BUCKETS,
};

/// The page, embedded at build time.
const PAGE: &str = include_str!("dashboard.html");
const HTML: &str = "text/html; charset=utf-8";
const JSON: &str = "application/json";
/// Everything comes from the daemon itself: no CDN, font or image host.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'";

/// How often the sampler reads the actors' counters.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How many sampler steps the history keeps (two minutes).
pub const HISTORY_POINTS: usize = 120;
/// A shorter span than this between two samples gives no rate (too noisy).
const RATE_MIN: Duration = Duration::from_millis(250);

/// What runs, as the daemon started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct About {
    pub mode: ProxyMode,
    /// The node's name (hostnameOverride or the host's).
    pub node: String,
    /// The primary family first.
    pub families: Vec<IpFamily>,
}

/// [`About`] as the page shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AboutView {
    /// `ipvs`, `iptables` or `nftables`.
    pub mode: &'static str,
    pub node: String,
    /// This build's version.
    pub version: &'static str,
    /// `IPv4`, `IPv6`: the primary family first.
    pub families: Vec<&'static str>,
}

/// One family's line in the header.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FamilyView {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// `/livez`'s verdict on it: no update has waited past the health timeout.
    pub healthy: bool,
    /// Its last successful sync (or the start of its sync loop), in
    /// milliseconds since the Unix epoch.
    pub last_updated_unix_ms: Option<u64>,
    /// Its model as of its newest sync; `None` before the first.
    pub counts: Option<ModelCounts>,
}

/// Actors shown together: one family's kernel actors, or its ipsets.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActorGroup {
    /// Named for the mode that runs them: `nftables mode: nftables, conntrack`.
    pub title: String,
    pub family: &'static str,
    /// Actor names, in the order a sync reaches them.
    pub actors: Vec<String>,
    /// Per history step: the sum of the members' deepest mailbox in it.
    pub depth_history: Vec<i64>,
}

/// What `/dashboard/data` serves.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DashboardData {
    /// When the data was taken, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub about: AboutView,
    /// `/livez`'s verdict: every family's proxier is healthy.
    pub healthy: bool,
    /// `/healthz` also wants the Node eligible (not being deleted).
    pub node_eligible: bool,
    /// In [`About::families`] order.
    pub families: Vec<FamilyView>,
    /// The span the rates are computed over, in seconds; `None` until the
    /// sampler has two samples.
    pub rate_window_secs: Option<f64>,
    /// Upper bounds of the apply-duration buckets, in milliseconds; each
    /// actor's `apply_buckets` has one more entry (`+Inf`).
    pub apply_bucket_bounds_ms: Vec<f64>,
    /// When each history step ended (one per [`SAMPLE_EVERY`], oldest
    /// first); every `*_history` ends with the newest step.
    pub history_unix_ms: Vec<u64>,
    /// The actors, grouped: per family, its kernel actors, then its ipsets.
    pub groups: Vec<ActorGroup>,
    /// Every actor, per family in pipeline order: ipvs, the ipsets,
    /// dummy-link, iptables or nftables, conntrack, then any other by name.
    pub actors: Vec<ActorView>,
    /// Every family's kept syncs, newest first.
    pub syncs: Vec<FamilySync>,
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
    /// A mode switch's drain of the earlier mode's state, per family
    /// (lasting or finished; none without a switch that drained).
    pub drains: Vec<SwitchDrain>,
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
    /// Messages per second in each history step it was there for.
    pub msgs_history: Vec<f64>,
}

/// The dashboard's routes, `/dashboard` and `/dashboard/data`, and the
/// sampler thread behind them (it ends once the routes are dropped).
pub fn dashboard_routes(about: About, registry: StatsRegistry, health: Arc<ProxyHealth>) -> Routes {
    let state = Arc::new(State { about, registry, health, sampler: Mutex::new(Sampler::default()) });
    spawn_sampler(Arc::downgrade(&state));
    Routes::new()
        .route("/dashboard", |_| page())
        .route("/dashboard/", |_| page())
        .route("/dashboard/data", move |_| state.respond())
}

/// Samples now and then every [`SAMPLE_EVERY`], while `state` lives.
fn spawn_sampler(state: Weak<State>) {
    let sampling = move || {
        while let Some(s) = state.upgrade() {
            s.sample();
            drop(s);
            std::thread::sleep(SAMPLE_EVERY);
        }
    };
    if let Err(e) = std::thread::Builder::new().name("dashboard".into()).spawn(sampling) {
        tracing::warn!(error = %e, "the dashboard's sampler did not start: no rates or history on the dashboard");
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

/// What the data handler and the sampler share.
struct State {
    about: About,
    registry: StatsRegistry,
    health: Arc<ProxyHealth>,
    sampler: Mutex<Sampler>,
}

impl State {
    fn sample(&self) {
        let counts = self.registry.actors().iter().map(|a| (a.name.clone(), a.take_counters())).collect();
        lock(&self.sampler).observe(Instant::now(), unix_ms(SystemTime::now()), counts);
    }

    fn respond(&self) -> Response {
        let data = self.collect();
        match serde_json::to_string(&data) {
            Ok(body) => no_store(text_response(200, JSON, body)),
            Err(e) => {
                tracing::error!(error = %e, "encoding the dashboard data");
                text_response(500, "text/plain; charset=utf-8", format!("encoding the dashboard data: {e}\n"))
            }
        }
    }

    fn collect(&self) -> DashboardData {
        let now = SystemTime::now();
        let live = self.registry.actors();
        let inputs = Inputs {
            unix_ms: unix_ms(now),
            health: self.health.report(now),
            node_eligible: self.health.snapshot().node_eligible(),
            counts: self.registry.model_counts(),
            snaps: live.iter().map(|a| a.snapshot()).collect(),
            buckets: live
                .iter()
                .map(|a| (a.name.clone(), a.apply_histogram().buckets.iter().map(|(_, n)| *n).collect()))
                .collect(),
            syncs: self.registry.syncs(),
        };
        let mut data = dashboard_data(&self.about, inputs, &lock(&self.sampler));
        data.refused = self.registry.refusals();
        data.ignored_values = self.registry.ignored_values();
        data.schedulers = self.registry.schedulers();
        data.drains = self.registry.drains();
        data
    }
}

/// What [`dashboard_data`] assembles, read at one instant.
pub struct Inputs {
    pub unix_ms: u64,
    pub health: HealthReport,
    pub node_eligible: bool,
    /// By family label, as the registry keeps them.
    pub counts: BTreeMap<&'static str, ModelCounts>,
    pub snaps: Vec<StatsSnapshot>,
    /// Per actor: apply durations per bucket.
    pub buckets: BTreeMap<String, Vec<u64>>,
    /// Newest first.
    pub syncs: Vec<FamilySync>,
}

/// Assembles the JSON document (pure: every input is an argument).
pub fn dashboard_data(about: &About, i: Inputs, sampler: &Sampler) -> DashboardData {
    let rates = sampler.rates();
    let mut actors: Vec<ActorView> = i
        .snaps
        .into_iter()
        .map(|stats| {
            let rate = rates.per_actor.get(&stats.name);
            ActorView {
                msgs_per_sec: rate.map(|r| r.msgs_per_sec),
                ops_per_sec: rate.map(|r| r.ops_per_sec),
                apply_buckets: i.buckets.get(&stats.name).cloned().unwrap_or_default(),
                msgs_history: sampler.msgs_history(&stats.name),
                stats,
            }
        })
        .collect();
    actors.sort_by(|a, b| actor_rank(&a.stats.name, about).cmp(&actor_rank(&b.stats.name, about)));
    let names: Vec<&str> = actors.iter().map(|a| a.stats.name.as_str()).collect();
    let groups = actor_groups(about, &names)
        .into_iter()
        .map(|mut g| {
            g.depth_history = sampler.depth_history(&g.actors);
            g
        })
        .collect();
    let families = about
        .families
        .iter()
        .map(|f| {
            let family = ip_family_label(*f);
            let status = i.health.status.get(family);
            FamilyView {
                family,
                healthy: status.is_none_or(|s| s.healthy),
                last_updated_unix_ms: status.map(|s| unix_ms(s.last_updated)),
                counts: i.counts.get(family).copied(),
            }
        })
        .collect();
    DashboardData {
        unix_ms: i.unix_ms,
        about: AboutView {
            mode: about.mode.as_str(),
            node: about.node.clone(),
            version: env!("CARGO_PKG_VERSION"),
            families: about.families.iter().map(|f| ip_family_label(*f)).collect(),
        },
        healthy: i.health.healthy,
        node_eligible: i.node_eligible,
        families,
        rate_window_secs: rates.window.map(|w| w.as_secs_f64()),
        apply_bucket_bounds_ms: APPLY_BUCKETS.iter().map(|b| b * 1000.0).collect(),
        history_unix_ms: sampler.times(),
        groups,
        actors,
        syncs: i.syncs,
        refused: Vec::new(),
        ignored_values: IgnoredValues::default(),
        schedulers: Vec::new(),
        drains: Vec::new(),
    }
}

/// An actor's kind and family: the secondary family's actors are named
/// `<kind> ipv6` (or `ipv4`); the others are the primary family's.
fn split_family<'a>(name: &'a str, about: &About) -> (&'a str, IpFamily) {
    let primary = about.families.first().copied().unwrap_or_default();
    let suffixed = name
        .rsplit_once(' ')
        .and_then(|(kind, suffix)| about.families.iter().find(|f| f.lower() == suffix).map(|f| (kind, *f)));
    suffixed.unwrap_or((name, primary))
}

/// The order in which a sync reaches an actor of this kind.
fn pipeline_stage(kind: &str) -> u8 {
    match kind {
        "ipvs" => 0,
        k if k.starts_with("ipset/") => 1,
        "dummy-link" => 2,
        "iptables" | "nftables" => 3,
        "conntrack" => 4,
        _ => 5,
    }
}

/// Sort key: the family (primary first), the pipeline stage, the name.
fn actor_rank<'a>(name: &'a str, about: &About) -> (usize, u8, &'a str) {
    let (kind, family) = split_family(name, about);
    let family_rank = about.families.iter().position(|f| *f == family).unwrap_or(usize::MAX);
    (family_rank, pipeline_stage(kind), name)
}

/// What an actor of this kind owns, as the group titles name it.
fn kind_label(kind: &str) -> &str {
    match kind {
        "ipvs" => "IPVS",
        "dummy-link" => "kube-ipvs0",
        other => other,
    }
}

fn mode_label(mode: ProxyMode) -> &'static str {
    match mode {
        ProxyMode::Ipvs => "IPVS",
        ProxyMode::Iptables => "iptables",
        ProxyMode::Nftables => "nftables",
    }
}

/// The actors (`names`, in [`actor_rank`] order) in groups, per family:
/// its kernel actors, then its ipsets; each titled for the mode and, on a
/// dual-stack node, the family. `depth_history` is left empty.
pub fn actor_groups(about: &About, names: &[&str]) -> Vec<ActorGroup> {
    let dual = about.families.len() > 1;
    let mut groups: Vec<(IpFamily, bool, Vec<&str>)> = Vec::new();
    for name in names {
        let (kind, family) = split_family(name, about);
        let ipset = kind.starts_with("ipset/");
        match groups.iter_mut().find(|(f, s, _)| *f == family && *s == ipset) {
            Some((_, _, members)) => members.push(name),
            None => groups.push((family, ipset, vec![name])),
        }
    }
    groups
        .into_iter()
        .map(|(family, ipset, members)| {
            let label = ip_family_label(family);
            let mode = mode_label(about.mode);
            let head = if dual { format!("{mode} mode, {label}") } else { format!("{mode} mode") };
            let what = if ipset {
                "ipsets".to_string()
            } else {
                let kinds: Vec<&str> = members.iter().map(|n| kind_label(split_family(n, about).0)).collect();
                kinds.join(", ")
            };
            ActorGroup {
                title: format!("{head}: {what}"),
                family: label,
                actors: members.iter().map(|n| n.to_string()).collect(),
                depth_history: Vec::new(),
            }
        })
        .collect()
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

/// Every actor's counters at one instant.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    unix_ms: u64,
    counts: BTreeMap<String, ActorCounters>,
}

/// The newest samples of every actor's counters: rates come from the two
/// newest, the history from each step between two.
#[derive(Debug, Default)]
pub struct Sampler {
    samples: VecDeque<Sample>,
}

impl Sampler {
    /// Records every actor's counters as of `at` (`unix_ms`), keeping the
    /// newest [`HISTORY_POINTS`] steps.
    pub fn observe(&mut self, at: Instant, unix_ms: u64, counts: BTreeMap<String, ActorCounters>) {
        if self.samples.len() > HISTORY_POINTS {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample { at, unix_ms, counts });
    }

    /// The steps: each pair of consecutive samples.
    fn steps(&self) -> impl Iterator<Item = (&Sample, &Sample)> {
        self.samples.iter().zip(self.samples.iter().skip(1))
    }

    /// Rates over the newest step; none before there is one at least
    /// [`RATE_MIN`] long.
    pub fn rates(&self) -> Rates {
        let newest = self.steps().last().filter(|(a, b)| b.at.saturating_duration_since(a.at) >= RATE_MIN);
        let Some((base, now)) = newest else { return Rates::default() };
        let per_actor =
            now.counts.keys().filter_map(|name| Some((name.clone(), step_rate(base, now, name)?))).collect();
        Rates { window: Some(now.at.saturating_duration_since(base.at)), per_actor }
    }

    /// When each step ended.
    pub fn times(&self) -> Vec<u64> {
        self.steps().map(|(_, b)| b.unix_ms).collect()
    }

    /// `name`'s messages per second in each step it was there for (the
    /// newest steps: an actor does not leave).
    pub fn msgs_history(&self, name: &str) -> Vec<f64> {
        self.steps()
            .filter_map(|(a, b)| step_rate(a, b, name))
            .map(|r| (r.msgs_per_sec * 10.0).round() / 10.0)
            .collect()
    }

    /// Per step: the sum of `names`' deepest mailbox in it.
    pub fn depth_history(&self, names: &[String]) -> Vec<i64> {
        let depth = |s: &Sample| names.iter().filter_map(|n| s.counts.get(n)).map(|c| c.peak_depth).sum();
        self.steps().map(|(_, b)| depth(b)).collect()
    }
}

/// `name`'s rates between samples `a` and `b`, if both have it; a counter
/// that went back (a new actor by an old name) gives 0 for that step.
fn step_rate(a: &Sample, b: &Sample, name: &str) -> Option<Rate> {
    let (before, after) = (a.counts.get(name)?, b.counts.get(name)?);
    let secs = b.at.saturating_duration_since(a.at).as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    let rate = |x: u64, y: u64| x.saturating_sub(y) as f64 / secs;
    Some(Rate { msgs_per_sec: rate(after.received, before.received), ops_per_sec: rate(after.ops, before.ops) })
}

#[cfg(test)]
mod tests;
