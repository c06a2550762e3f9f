//! Kernel reads that block (a netlink dump or get waiting for the kernel,
//! an x_tables `getsockopt`) run on tokio's blocking pool through
//! [`off_thread`], never on the thread the actors share: a dump of 134,000
//! chains there would stall every actor and the HTTP servers meanwhile.
//!
//! What a job touches it must bring along (a socket opened by the caller,
//! in the caller's network namespace): the pool's threads may sit in
//! another one.
//!
//! Start-up probes that run before the actors exist, in a runtime or
//! outside one, use [`on_own_thread`].

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinError;

/// The blocking pool's thread did not bring the job's result back (it
/// panicked, or the runtime is shutting down).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: the blocking pool's thread failed: {source}")]
pub struct PoolError {
    pub what: &'static str,
    #[source]
    pub source: Arc<JoinError>,
}

/// Runs `job` (named `what` for errors) on tokio's blocking pool and waits
/// for it without blocking the calling thread. Must run inside a Tokio runtime.
pub async fn off_thread<T: Send + 'static>(
    what: &'static str,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    tokio::task::spawn_blocking(job).await.map_err(|e| PoolError { what, source: Arc::new(e) })
}

/// Runs the future `make` builds to its end on a thread of its own (in the
/// caller's network namespace) with a runtime of its own, and waits for it.
/// Err: the runtime could not be built.
pub fn on_own_thread<T: Send, F: Future<Output = T>>(make: impl FnOnce() -> F + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        let thread = s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            Ok(rt.block_on(make()))
        });
        thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// The job sleeps a second on another thread while a task on this
    /// (single) runtime thread keeps ticking.
    #[tokio::test(flavor = "current_thread")]
    async fn the_calling_thread_keeps_running_meanwhile() {
        let started = Instant::now();
        let job = off_thread("a slow read", || std::thread::sleep(Duration::from_millis(500)));
        let ticker = async {
            let mut ticks = 0;
            while started.elapsed() < Duration::from_millis(400) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks += 1;
            }
            ticks
        };
        let (done, ticks) = tokio::join!(job, ticker);
        assert!(done.is_ok());
        assert!(ticks >= 20, "the runtime thread ticked only {ticks} times while the job slept");
    }

    /// From inside a runtime too, where a second runtime on this thread could not start.
    #[tokio::test]
    async fn a_probe_runs_on_its_own_thread_from_a_runtime_or_without_one() {
        let probe = || on_own_thread(|| async { off_thread("a read", || 7).await.expect("the pool") });
        assert_eq!(probe().expect("a runtime"), 7);
        assert_eq!(std::thread::spawn(probe).join().expect("no panic").expect("a runtime"), 7);
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_naming_it() {
        let e = off_thread("a read", || panic!("boom")).await.expect_err("panicked");
        assert!(e.to_string().starts_with("a read: the blocking pool's thread failed"), "{e}");
    }
}
