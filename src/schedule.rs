//! When to sync: upstream's BoundedFrequencyRunner semantics as a pure state
//! machine. Time is an argument; the coordinator owns the timer.
//!
//! - Nothing runs before the source's initial list is complete.
//! - A requested sync runs at once while the burst allows, then no closer
//!   than `min` apart (a token bucket of `burst` tokens refilled one per
//!   `min`, as upstream's flowcontrol rate limiter).
//! - A sync runs at least every `max` (the syncPeriod). That periodic sync
//!   is a partial one with cheap drift checks ([`SyncKind::Periodic`]), as
//!   upstream's newest proxiers do. Under steady changes no sync waits a
//!   whole `max`, so the first sync once `max` has passed since the last
//!   checked one (periodic or full) is the periodic one: the checks (and
//!   the node's addresses) are read at least every syncPeriod, as
//!   upstream's every sync reads them. A full resync comes when asked for
//!   (start, reload, topology, drift, a failure) and once per
//!   [`FULL_SYNC_PERIOD`] (upstream's `FullSyncPeriod`), unless the
//!   dataplane turns that off (iptables mode's large-cluster mode).
//! - After a failed sync a retry comes after a backoff that starts at
//!   max(min, 1s), doubles, and never exceeds `max`.

use std::time::Duration;

use tokio::time::Instant;

/// Upstream's `FullSyncPeriod`: a full resync at least this often.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// What kind of sync is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Read the kernel, repair drift, rewrite everything.
    Full,
    /// The syncPeriod's sync: the deltas plus each actor's cheap check.
    Periodic,
    /// The deltas only.
    Partial,
}

#[derive(Debug, Clone)]
pub struct SyncScheduler {
    min: Duration,
    max: Duration,
    burst: u32,
    /// GCRA "theoretical arrival time" of the token bucket.
    tat: Option<Instant>,
    initialized: bool,
    requested: bool,
    full_requested: bool,
    running: bool,
    /// A full resync at least this often (None: only when asked for).
    full_period: Option<Duration>,
    periodic_at: Option<Instant>,
    /// When the last sync with the drift checks (periodic or full) started.
    checked_at: Option<Instant>,
    retry_at: Option<Instant>,
    last_full: Option<Instant>,
    failures: u32,
}

impl SyncScheduler {
    pub fn new(min: Duration, max: Duration, burst: u32) -> SyncScheduler {
        SyncScheduler {
            min,
            max: max.max(Duration::from_millis(1)),
            burst: burst.max(1),
            tat: None,
            initialized: false,
            requested: false,
            full_requested: true,
            running: false,
            full_period: Some(FULL_SYNC_PERIOD),
            periodic_at: None,
            checked_at: None,
            retry_at: None,
            last_full: None,
            failures: 0,
        }
    }

    /// Changes the periods (config reload); takes effect from the next decision.
    pub fn set_periods(&mut self, min: Duration, max: Duration) {
        self.min = min;
        self.max = max.max(Duration::from_millis(1));
    }

    /// How often a full resync happens unasked (None: never; upstream's
    /// large-cluster mode).
    pub fn set_full_period(&mut self, period: Option<Duration>) {
        self.full_period = period;
    }

    /// The source's initial list is complete: syncs may start.
    pub fn set_initialized(&mut self) {
        self.initialized = true;
    }

    /// Something changed: sync as soon as the rate limit allows.
    pub fn request(&mut self) {
        self.requested = true;
    }

    /// The next sync must be a full one (config reload, topology, drift).
    pub fn request_full(&mut self) {
        self.requested = true;
        self.full_requested = true;
    }

    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Earliest instant a requested sync may start (token bucket).
    fn allowed_at(&self, now: Instant) -> Instant {
        let tolerance = self.min * (self.burst - 1);
        match self.tat {
            Some(tat) => tat.checked_sub(tolerance).map_or(now, |t| t.max(now)),
            None => now,
        }
    }

    /// When the coordinator should next call [`poll`](Self::poll); None: no timer needed.
    pub fn next_wakeup(&self, now: Instant) -> Option<Instant> {
        if !self.initialized || self.running {
            return None;
        }
        let mut next = self.periodic_at;
        if self.requested {
            next = Some(next.map_or(self.allowed_at(now), |n| n.min(self.allowed_at(now))));
        }
        if let Some(r) = self.retry_at {
            next = Some(next.map_or(r, |n| n.min(r)));
        }
        next
    }

    /// Starts a sync if one is due at `now`.
    pub fn poll(&mut self, now: Instant) -> Option<SyncKind> {
        let due = self.next_wakeup(now)?;
        if due > now {
            return None;
        }
        let base = self.tat.map_or(now, |t| t.max(now));
        self.tat = Some(base + self.min);
        let periodic = self.periodic_at.is_some_and(|p| p <= now)
            || self.checked_at.is_some_and(|c| now.duration_since(c) >= self.max);
        let stale_full = self.full_period.is_some_and(|p| self.last_full.is_none_or(|f| now.duration_since(f) >= p));
        let kind = if self.full_requested || stale_full {
            SyncKind::Full
        } else if periodic {
            SyncKind::Periodic
        } else {
            SyncKind::Partial
        };
        self.requested = false;
        self.full_requested = false;
        self.retry_at = None;
        self.running = true;
        if kind == SyncKind::Full {
            self.last_full = Some(now);
        }
        if kind != SyncKind::Partial {
            self.checked_at = Some(now);
        }
        Some(kind)
    }

    /// The sync started by the last poll finished at `now`.
    pub fn finished(&mut self, now: Instant, ok: bool) {
        self.running = false;
        self.periodic_at = Some(now + self.max);
        if ok {
            self.failures = 0;
            return;
        }
        let base = self.min.max(Duration::from_secs(1));
        let backoff = base.saturating_mul(1u32 << self.failures.min(16));
        self.failures += 1;
        self.retry_at = Some(now + backoff.min(self.max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn sched() -> (SyncScheduler, Instant) {
        let mut s = SyncScheduler::new(Duration::from_secs(1), Duration::from_secs(30), 2);
        s.set_initialized();
        (s, Instant::now())
    }

    /// Runs a sync at `t` that takes no time.
    fn run(s: &mut SyncScheduler, t: Instant) -> Option<SyncKind> {
        let k = s.poll(t);
        if k.is_some() {
            s.finished(t, true);
        }
        k
    }

    #[test]
    fn nothing_runs_before_initialization() {
        let mut s = SyncScheduler::new(Duration::from_secs(1), Duration::from_secs(30), 2);
        let t0 = Instant::now();
        s.request();
        assert_eq!(s.next_wakeup(t0), None);
        assert_eq!(s.poll(t0), None);
        s.set_initialized();
        assert_eq!(s.next_wakeup(t0), Some(t0));
        assert_eq!(s.poll(t0), Some(SyncKind::Full), "the first sync is full");
    }

    #[test]
    fn burst_then_min_sync_period() {
        let (mut s, t0) = sched();
        s.request();
        assert_eq!(run(&mut s, t0), Some(SyncKind::Full));
        s.request();
        assert_eq!(run(&mut s, t0 + 100 * MS), Some(SyncKind::Partial), "second token of the burst");
        s.request();
        assert_eq!(s.poll(t0 + 200 * MS), None, "bucket empty");
        assert_eq!(s.next_wakeup(t0 + 200 * MS), Some(t0 + 1000 * MS));
        assert_eq!(run(&mut s, t0 + 1000 * MS), Some(SyncKind::Partial));
        s.request();
        assert_eq!(s.next_wakeup(t0 + 1050 * MS), Some(t0 + 2000 * MS), "then one per minSyncPeriod");
    }

    #[test]
    fn requests_while_waiting_coalesce_into_one_sync() {
        let (mut s, t0) = sched();
        s.request();
        run(&mut s, t0);
        s.request();
        run(&mut s, t0);
        for i in 1..10 {
            s.request();
            assert_eq!(s.poll(t0 + i * 10 * MS), None);
        }
        assert_eq!(run(&mut s, t0 + 1000 * MS), Some(SyncKind::Partial));
        assert_eq!(s.poll(t0 + 1000 * MS), None, "coalesced: nothing left to do");
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_sync_period_brings_a_periodic_partial_sync_not_a_full_one() {
        let (mut s, t0) = sched();
        s.request();
        assert_eq!(run(&mut s, t0), Some(SyncKind::Full));
        assert_eq!(s.next_wakeup(t0 + MS), Some(t0 + 30 * S));
        assert_eq!(run(&mut s, t0 + 30 * S), Some(SyncKind::Periodic));
        assert_eq!(s.next_wakeup(t0 + 30 * S), Some(t0 + 60 * S), "and again a syncPeriod later");
        assert_eq!(run(&mut s, t0 + 60 * S), Some(SyncKind::Periodic));
    }

    #[test]
    fn under_steady_changes_a_sync_each_sync_period_carries_the_checks() {
        let (mut s, t0) = sched();
        s.request();
        assert_eq!(run(&mut s, t0), Some(SyncKind::Full));
        let mut periodic = Vec::new();
        for i in 1..=95 {
            s.request();
            if run(&mut s, t0 + i * S) == Some(SyncKind::Periodic) {
                periodic.push(i);
            }
        }
        assert_eq!(periodic, [30, 60, 90], "a change every second never leaves a syncPeriod without a sync");
    }

    #[test]
    fn a_full_resync_comes_once_per_full_sync_period() {
        let (mut s, t0) = sched();
        s.request();
        run(&mut s, t0);
        let mut t = t0;
        let mut kinds = Vec::new();
        while t < t0 + FULL_SYNC_PERIOD + 30 * S {
            t += 30 * S;
            kinds.push(run(&mut s, t).expect("periodic sync due"));
        }
        let fulls: Vec<usize> = (0..kinds.len()).filter(|i| kinds[*i] == SyncKind::Full).collect();
        assert_eq!(fulls, vec![119], "the sync at 60 min is the only full one: {kinds:?}");
        let first = kinds.iter().position(|k| *k == SyncKind::Full).unwrap();
        assert_eq!(t0 + 30 * S * (first as u32 + 1), t0 + FULL_SYNC_PERIOD);
    }

    #[test]
    fn partial_syncs_turn_full_once_the_full_sync_period_passed() {
        let (mut s, t0) = sched();
        s.request();
        run(&mut s, t0);
        s.request();
        assert_eq!(run(&mut s, t0 + 10 * S), Some(SyncKind::Partial));
        s.request();
        assert_eq!(run(&mut s, t0 + FULL_SYNC_PERIOD), Some(SyncKind::Full));
    }

    #[test]
    fn without_a_full_sync_period_only_requests_bring_full_syncs() {
        let (mut s, t0) = sched();
        s.set_full_period(None);
        s.request();
        assert_eq!(run(&mut s, t0), Some(SyncKind::Full), "the first one still is");
        let mut t = t0;
        for _ in 0..300 {
            t += 30 * S;
            assert_eq!(run(&mut s, t), Some(SyncKind::Periodic));
        }
        s.request_full();
        assert_eq!(run(&mut s, t + S), Some(SyncKind::Full), "drift, reload, failure still ask for one");
    }

    #[test]
    fn failed_sync_retries_with_backoff_capped_at_sync_period() {
        let mut s = SyncScheduler::new(Duration::ZERO, Duration::from_secs(5), 2);
        s.set_initialized();
        let t0 = Instant::now();
        s.request();
        s.poll(t0);
        s.finished(t0, false);
        assert_eq!(s.next_wakeup(t0), Some(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        assert!(s.poll(t1).is_some());
        s.finished(t1, false);
        assert_eq!(s.next_wakeup(t1), Some(t1 + Duration::from_secs(2)));
        let t2 = t1 + Duration::from_secs(2);
        s.poll(t2);
        s.finished(t2, false);
        let t3 = t2 + Duration::from_secs(4);
        s.poll(t3);
        s.finished(t3, false);
        assert_eq!(s.next_wakeup(t3), Some(t3 + Duration::from_secs(5)), "capped at syncPeriod");
    }

    #[test]
    fn zero_min_sync_period_never_waits() {
        let mut s = SyncScheduler::new(Duration::ZERO, Duration::from_secs(30), 2);
        s.set_initialized();
        let t0 = Instant::now();
        for _ in 0..10 {
            s.request();
            assert!(run(&mut s, t0).is_some());
        }
    }

    #[test]
    fn nothing_new_starts_while_a_sync_runs() {
        let (mut s, t0) = sched();
        s.request();
        assert!(s.poll(t0).is_some());
        s.request();
        assert_eq!(s.next_wakeup(t0), None);
        s.finished(t0 + 10 * MS, true);
        assert_eq!(s.next_wakeup(t0 + 10 * MS), Some(t0 + 10 * MS));
    }
}
