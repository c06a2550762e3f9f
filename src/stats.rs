//! Per-actor counters: mailbox depth, messages, apply latency, errors, last
//! acked generation. Shared (`Arc`) between the actor, the coordinator that
//! sends to it, and the metrics/dashboard endpoints. The registry also keeps
//! each family's recent syncs and model counts, as the sync hooks report
//! them, for the dashboard.

use crate::mutex::lock;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How many recent apply latencies each actor keeps for percentiles.
const LATENCY_WINDOW: usize = 512;

/// Upper bounds, in seconds, of the apply-duration histogram buckets
/// (`kube_proxy_rs_actor_apply_duration_seconds`): 100 µs doubling to ~13 s.
pub const APPLY_BUCKETS: [f64; 18] = [
    0.0001, 0.0002, 0.0004, 0.0008, 0.0016, 0.0032, 0.0064, 0.0128, 0.0256, 0.0512, 0.1024, 0.2048, 0.4096, 0.8192,
    1.6384, 3.2768, 6.5536, 13.1072,
];

/// Every batch's apply duration, bucketed (lock-free; read at scrape time).
#[derive(Debug, Default)]
struct ApplyHistogram {
    /// Per-bucket counts; the last one is `+Inf`.
    buckets: [AtomicU64; APPLY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl ApplyHistogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = APPLY_BUCKETS.iter().position(|b| secs <= *b).unwrap_or(APPLY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        let bounds = APPLY_BUCKETS.iter().copied().chain(std::iter::once(f64::INFINITY));
        let buckets = bounds.zip(self.buckets.iter()).map(|(b, n)| (b, n.load(Ordering::Relaxed))).collect();
        HistogramSnapshot {
            buckets,
            sum: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

/// A point-in-time copy of a histogram.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations in this bucket)`, not cumulative; the last
    /// bound is `+Inf`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the observations, in seconds.
    pub sum: f64,
    pub count: u64,
}

#[derive(Debug, Default)]
pub struct ActorStats {
    pub name: String,
    queued: AtomicI64,
    /// The deepest the mailbox was since the last [`ActorStats::take_counters`].
    peak: AtomicI64,
    received: AtomicU64,
    ops: AtomicU64,
    errors: AtomicU64,
    last_generation: AtomicU64,
    latencies: Mutex<VecDeque<Duration>>,
    apply: ApplyHistogram,
    /// Ops the kernel refused, waiting for their retry (the coordinator's view).
    failing: Mutex<Vec<FailingKey>>,
    failing_count: AtomicU64,
    retries: AtomicU64,
}

/// A key whose op the kernel refused, waiting for its retry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FailingKey {
    /// The op, as the tool would print it.
    pub op: String,
    pub attempts: u32,
    /// Milliseconds until the next attempt (0: in the batch in flight).
    pub retry_in_ms: u64,
    pub error: String,
}

/// What [`ActorStats::take_counters`] reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActorCounters {
    /// Messages taken from the mailbox so far.
    pub received: u64,
    /// Kernel ops applied so far.
    pub ops: u64,
    /// The deepest the mailbox was since the previous read.
    pub peak_depth: i64,
}

/// How many failing keys an actor's snapshot lists (all are counted).
pub const FAILING_LISTED: usize = 20;

/// A point-in-time copy of an actor's stats.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct StatsSnapshot {
    pub name: String,
    pub mailbox_depth: i64,
    pub received: u64,
    pub ops: u64,
    pub errors: u64,
    pub last_generation: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Keys whose op the kernel refused, waiting for a retry.
    pub failing_keys: u64,
    /// The first [`FAILING_LISTED`] of them.
    pub failing: Vec<FailingKey>,
    /// Retried ops that went through.
    pub retries: u64,
}

impl ActorStats {
    pub fn new(name: &str) -> Arc<ActorStats> {
        Arc::new(ActorStats { name: name.to_string(), ..ActorStats::default() })
    }

    /// A message was sent to the actor.
    pub fn enqueued(&self) {
        let depth = self.queued.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(depth, Ordering::Relaxed);
    }

    /// The actor took a message out of its mailbox.
    pub fn dequeued(&self) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    /// The actor finished a batch.
    pub fn applied(&self, generation: u64, ops: usize, errors: usize, took: Duration) {
        self.ops.fetch_add(ops as u64, Ordering::Relaxed);
        self.errors.fetch_add(errors as u64, Ordering::Relaxed);
        self.last_generation.fetch_max(generation, Ordering::Relaxed);
        self.apply.observe(took);
        let mut l = lock(&self.latencies);
        if l.len() == LATENCY_WINDOW {
            l.pop_front();
        }
        l.push_back(took);
    }

    /// The keys waiting for a retry after this sync (`count` of them;
    /// `listed` the first few).
    pub fn set_failing(&self, count: usize, listed: Vec<FailingKey>) {
        self.failing_count.store(count as u64, Ordering::Relaxed);
        *lock(&self.failing) = listed;
    }

    /// Retried ops went through.
    pub fn retried(&self, n: usize) {
        self.retries.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Keys waiting for a retry.
    pub fn failing_keys(&self) -> u64 {
        self.failing_count.load(Ordering::Relaxed)
    }

    /// The counters a periodic sampler reads: messages and ops so far, and
    /// the deepest the mailbox was since the previous call (at least its
    /// depth now). The peak restarts at each call, so there is one caller:
    /// the dashboard's sampler.
    pub fn take_counters(&self) -> ActorCounters {
        let depth = self.queued.load(Ordering::Relaxed);
        ActorCounters {
            received: self.received.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            peak_depth: self.peak.swap(depth, Ordering::Relaxed).max(depth),
        }
    }

    /// Every apply duration so far, in [`APPLY_BUCKETS`].
    pub fn apply_histogram(&self) -> HistogramSnapshot {
        self.apply.snapshot()
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut lat: Vec<Duration> = lock(&self.latencies).iter().copied().collect();
        lat.sort();
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                return 0.0;
            }
            let i = ((lat.len() - 1) as f64 * p).round() as usize;
            lat[i].as_secs_f64() * 1000.0
        };
        StatsSnapshot {
            name: self.name.clone(),
            mailbox_depth: self.queued.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            last_generation: self.last_generation.load(Ordering::Relaxed),
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            failing_keys: self.failing_keys(),
            failing: lock(&self.failing).clone(),
            retries: self.retries.load(Ordering::Relaxed),
        }
    }
}

/// One finished sync, for logs, metrics and the dashboard.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SyncRecord {
    pub generation: u64,
    pub full: bool,
    /// The syncPeriod's sync (with the actors' drift checks).
    pub periodic: bool,
    pub duration_ms: f64,
    pub ports_changed: usize,
    pub ops: usize,
    pub failed: usize,
}

/// What one family's model holds after a sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ModelCounts {
    /// Services with at least one port of the family.
    pub services: usize,
    pub service_ports: usize,
    /// The endpoints of every service port (an address serving two ports counts twice).
    pub endpoints: usize,
}

/// One sync of one family, as the dashboard lists and charts it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FamilySync {
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// When it finished, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    #[serde(flatten)]
    pub record: SyncRecord,
    /// The longest network programming latency among the changes the sync
    /// carried, in milliseconds; `None` when none had a trigger time to
    /// measure from (or the sync failed).
    pub programming_ms: Option<f64>,
}

/// `t` in milliseconds since the Unix epoch (0 before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How many syncs of each family the dashboard keeps.
pub const SYNCS_KEPT: usize = 120;

/// A family's recent syncs and its model's counts as of the newest.
#[derive(Debug, Default)]
struct FamilyFeed {
    counts: ModelCounts,
    syncs: VecDeque<FamilySync>,
}

/// Every actor's stats, by name, the input the daemon refused lately, and
/// the service ports with a scheduler of their own (IPVS mode).
#[derive(Debug, Default, Clone)]
pub struct StatsRegistry {
    actors: Arc<Mutex<BTreeMap<String, Arc<ActorStats>>>>,
    /// Appended to the names registered through this handle.
    suffix: String,
    refusals: Arc<Mutex<std::collections::VecDeque<Refusal>>>,
    ignored_values: Arc<Mutex<IgnoredValues>>,
    /// Keyed by (service port, family).
    schedulers: Arc<Mutex<BTreeMap<(String, String), ServiceScheduler>>>,
    /// Keyed by family (`IPv4`, `IPv6`).
    families: Arc<Mutex<BTreeMap<&'static str, FamilyFeed>>>,
    /// A mode switch's drains, keyed by family (`IPv4`, `IPv6`).
    drains: Arc<Mutex<BTreeMap<&'static str, SwitchDrain>>>,
}

/// A family's drain of the earlier mode's state after a mode switch (IPVS
/// mode's virtual servers with connections), for the dashboard and metrics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SwitchDrain {
    /// The earlier mode drained (`ipvs`).
    pub mode: &'static str,
    /// `IPv4` or `IPv6`.
    pub family: &'static str,
    /// Whether it lasts; a finished drain stays listed with nothing left.
    pub draining: bool,
    /// Virtual servers left, and the connections IPVS tracks through them.
    pub virtual_servers: usize,
    pub connections: u64,
    /// When it started (milliseconds since the epoch).
    pub since_ms: u64,
    /// Its limit in seconds; 0: until the connections end.
    pub timeout_s: u64,
}

/// A service port whose Service chose its own IPVS scheduler (the
/// `ipvs.kube-proxy-rs.io/scheduler` annotation), for the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServiceScheduler {
    /// `namespace/name:port`.
    pub service_port: String,
    /// `ipv4` or `ipv6`.
    pub family: String,
    pub scheduler: String,
    /// ipvsadm's names, comma-separated (`sh-fallback,sh-port`); empty for none.
    pub flags: String,
}

/// An input object (or part of one) the daemon refused or ignored, for
/// the dashboard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Refusal {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub kind: String,
    /// `namespace/name`.
    pub object: String,
    /// The metric's `reason` label.
    pub reason: String,
    pub detail: String,
}

/// The IP and CIDR values skipped inside the objects the daemon takes
/// (`model::notice::ignored_values`), for the dashboard's counter.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IgnoredValues {
    /// Since the start.
    pub total: u64,
    /// The newest one.
    pub last: Option<LastIgnored>,
}

/// Where the newest ignored value was.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastIgnored {
    /// When, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub kind: String,
    /// `namespace/name` (a Node's name).
    pub object: String,
    /// The field with its indices (`spec.loadBalancerSourceRanges[0]`).
    pub field: String,
}

/// How many refusals the dashboard lists.
pub const REFUSALS_KEPT: usize = 50;

impl StatsRegistry {
    pub fn register(&self, name: &str) -> Arc<ActorStats> {
        let name = format!("{name}{}", self.suffix);
        let s = ActorStats::new(&name);
        lock(&self.actors).insert(name, s.clone());
        s
    }

    /// The same registry, naming what registers through it `NAME{suffix}`
    /// (the secondary family's actors: `ipvs ipv6`).
    pub fn with_suffix(&self, suffix: &str) -> StatsRegistry {
        StatsRegistry { suffix: suffix.to_string(), ..self.clone() }
    }

    /// Sets (`Some`) or clears a service port's own scheduler for `family`.
    pub fn set_scheduler(&self, service_port: &str, family: &str, scheduler: Option<ServiceScheduler>) {
        let key = (service_port.to_string(), family.to_string());
        let mut map = lock(&self.schedulers);
        match scheduler {
            Some(s) => map.insert(key, s),
            None => map.remove(&key),
        };
    }

    /// The service ports with a scheduler of their own, by name then family.
    pub fn schedulers(&self) -> Vec<ServiceScheduler> {
        lock(&self.schedulers).values().cloned().collect()
    }

    /// A sync of `sync.family` finished, leaving its model with `counts`
    /// (the newest [`SYNCS_KEPT`] syncs of each family are kept).
    pub fn sync_finished(&self, sync: FamilySync, counts: ModelCounts) {
        let mut families = lock(&self.families);
        let feed = families.entry(sync.family).or_default();
        if feed.syncs.len() == SYNCS_KEPT {
            feed.syncs.pop_front();
        }
        feed.syncs.push_back(sync);
        feed.counts = counts;
    }

    /// Each family's model counts as of its newest sync (families that have
    /// not synced yet are missing).
    pub fn model_counts(&self) -> BTreeMap<&'static str, ModelCounts> {
        lock(&self.families).iter().map(|(f, feed)| (*f, feed.counts)).collect()
    }

    /// Every family's kept syncs, newest first.
    pub fn syncs(&self) -> Vec<FamilySync> {
        let families = lock(&self.families);
        let mut all: Vec<FamilySync> = families.values().flat_map(|f| f.syncs.iter().rev().cloned()).collect();
        // Stable: a family's syncs in the same millisecond stay newest first.
        all.sort_by_key(|s| std::cmp::Reverse(s.unix_ms));
        all
    }

    /// Where a family's drain stands (replacing what it said before).
    pub fn drain_progress(&self, drain: SwitchDrain) {
        lock(&self.drains).insert(drain.family, drain);
    }

    /// Every family's drain, lasting or finished, by family.
    pub fn drains(&self) -> Vec<SwitchDrain> {
        lock(&self.drains).values().cloned().collect()
    }

    /// Remembers a refusal (the newest [`REFUSALS_KEPT`]).
    pub fn refused(&self, r: Refusal) {
        let mut list = lock(&self.refusals);
        if list.len() == REFUSALS_KEPT {
            list.pop_front();
        }
        list.push_back(r);
    }

    /// Counts an ignored value; it is the newest.
    pub fn value_ignored(&self, last: LastIgnored) {
        let mut v = lock(&self.ignored_values);
        v.total += 1;
        v.last = Some(last);
    }

    /// The ignored values: how many, and the newest.
    pub fn ignored_values(&self) -> IgnoredValues {
        lock(&self.ignored_values).clone()
    }

    /// The remembered refusals, newest first.
    pub fn refusals(&self) -> Vec<Refusal> {
        lock(&self.refusals).iter().rev().cloned().collect()
    }

    pub fn snapshot(&self) -> Vec<StatsSnapshot> {
        lock(&self.actors).values().map(|s| s.snapshot()).collect()
    }

    /// Every actor's live stats, by name (for the metrics collector).
    pub fn actors(&self) -> Vec<Arc<ActorStats>> {
        lock(&self.actors).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_durations_land_in_their_buckets() {
        let s = ActorStats::new("ipvs");
        s.applied(3, 5, 1, Duration::from_micros(50));
        s.applied(4, 1, 0, Duration::from_millis(1));
        s.applied(2, 1, 0, Duration::from_secs(60));
        let h = s.apply_histogram();
        assert_eq!(h.count, 3);
        assert_eq!(h.buckets.len(), APPLY_BUCKETS.len() + 1);
        assert_eq!(h.buckets[0], (0.0001, 1));
        assert_eq!(h.buckets[4], (0.0016, 1), "1 ms falls in the 1.6 ms bucket");
        assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert!((h.sum - 60.00105).abs() < 1e-9, "{}", h.sum);
        let snap = s.snapshot();
        assert_eq!((snap.ops, snap.errors, snap.last_generation), (7, 1, 4));
    }

    #[test]
    fn the_peak_depth_is_the_deepest_since_the_last_read() {
        let s = ActorStats::new("ipvs");
        for _ in 0..3 {
            s.enqueued();
        }
        s.dequeued();
        s.dequeued();
        assert_eq!(s.take_counters(), ActorCounters { received: 2, ops: 0, peak_depth: 3 });
        assert_eq!(s.take_counters().peak_depth, 1, "the depth now, once the peak was read");
        s.dequeued();
        s.applied(1, 4, 0, Duration::from_millis(1));
        assert_eq!(s.take_counters(), ActorCounters { received: 3, ops: 4, peak_depth: 1 }, "1 until read");
        assert_eq!(s.take_counters().peak_depth, 0);
    }

    fn family_sync(family: &'static str, unix_ms: u64, generation: u64) -> FamilySync {
        FamilySync { family, unix_ms, record: SyncRecord { generation, ..SyncRecord::default() }, programming_ms: None }
    }

    #[test]
    fn syncs_are_kept_per_family_and_listed_newest_first() {
        let reg = StatsRegistry::default();
        let counts = |services| ModelCounts { services, service_ports: services, endpoints: 2 * services };
        for g in 1..=SYNCS_KEPT as u64 + 5 {
            reg.sync_finished(family_sync("IPv4", 1000 + g, g), counts(1));
        }
        reg.with_suffix(" ipv6").sync_finished(family_sync("IPv6", 1002, 1), counts(7));
        let syncs = reg.syncs();
        assert_eq!(syncs.len(), SYNCS_KEPT + 1);
        let newest: Vec<(&str, u64)> = syncs.iter().take(2).map(|s| (s.family, s.record.generation)).collect();
        assert_eq!(newest, [("IPv4", SYNCS_KEPT as u64 + 5), ("IPv4", SYNCS_KEPT as u64 + 4)]);
        assert_eq!(syncs.last().map(|s| (s.family, s.unix_ms)), Some(("IPv6", 1002)), "older than every IPv4 one kept");
        assert_eq!(reg.model_counts(), [("IPv4", counts(1)), ("IPv6", counts(7))].into());
    }

    #[test]
    fn the_registry_lists_live_stats() {
        let reg = StatsRegistry::default();
        let a = reg.register("ipvs");
        a.enqueued();
        let live = reg.actors();
        assert_eq!(live.len(), 1);
        assert_eq!(live[0].snapshot().mailbox_depth, 1);
        reg.with_suffix(" ipv6").register("ipvs");
        let names: Vec<String> = reg.snapshot().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["ipvs", "ipvs ipv6"]);
    }
}
