//! Process-wide counters the daemon bumps outside the actors (until the
//! metrics registry is wired in, these are plain atomics it can read).

use std::sync::atomic::{AtomicU64, Ordering};

static CONFIG_RELOAD_FAILURES: AtomicU64 = AtomicU64::new(0);

/// A SIGHUP reload was refused (kube_proxy_rs_config_reload_failures_total).
pub fn config_reload_failed() {
    CONFIG_RELOAD_FAILURES.fetch_add(1, Ordering::Relaxed);
}

pub fn config_reload_failures() -> u64 {
    CONFIG_RELOAD_FAILURES.load(Ordering::Relaxed)
}
