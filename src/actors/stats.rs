//! Per-actor counters: mailbox depth, messages, apply latency, errors, last
//! acked generation. Shared (`Arc`) between the actor, the coordinator that
//! sends to it, and the metrics/dashboard endpoints.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many recent apply latencies each actor keeps for percentiles.
const LATENCY_WINDOW: usize = 512;

#[derive(Debug, Default)]
pub struct ActorStats {
    pub name: String,
    queued: AtomicI64,
    received: AtomicU64,
    ops: AtomicU64,
    errors: AtomicU64,
    last_generation: AtomicU64,
    latencies: Mutex<VecDeque<Duration>>,
}

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
}

impl ActorStats {
    pub fn new(name: &str) -> Arc<ActorStats> {
        Arc::new(ActorStats { name: name.to_string(), ..ActorStats::default() })
    }

    /// A message was sent to the actor.
    pub fn enqueued(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
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
        let mut l = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() == LATENCY_WINDOW {
            l.pop_front();
        }
        l.push_back(took);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut lat: Vec<Duration> = self.latencies.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect();
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
        }
    }
}

/// Every actor's stats, by name.
#[derive(Debug, Default, Clone)]
pub struct StatsRegistry {
    actors: Arc<Mutex<BTreeMap<String, Arc<ActorStats>>>>,
}

impl StatsRegistry {
    pub fn register(&self, name: &str) -> Arc<ActorStats> {
        let s = ActorStats::new(name);
        self.actors.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), s.clone());
        s
    }

    pub fn snapshot(&self) -> Vec<StatsSnapshot> {
        self.actors.lock().unwrap_or_else(|e| e.into_inner()).values().map(|s| s.snapshot()).collect()
    }
}
