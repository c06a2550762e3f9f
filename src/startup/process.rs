//! The process's own set-up, before the configuration is read: SIGHUP
//! ignored until the daemon listens for it, and the open files limit
//! raised; and its end: a deadline for the runtime's drop.

use std::sync::mpsc;
use std::time::Duration;

/// A SIGHUP that arrives before the daemon listens for it would kill the
/// process (the default action); ignore it until then. The daemon's
/// handler replaces this disposition.
pub fn ignore_sighup_until_ready() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler code, so nothing runs in signal context.
    if let Err(e) = unsafe { signal(Signal::SIGHUP, SigHandler::SigIgn) } {
        tracing::warn!(error = %e, "cannot ignore SIGHUP during start-up");
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime
/// does for upstream kube-proxy (the default soft limit, often 1,024, is
/// what a flood of connections or a large cluster's pipes would exhaust).
pub fn raise_open_files_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write the one struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 || lim.rlim_cur >= lim.rlim_max {
            return;
        }
        let from = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
            tracing::debug!(from, to = lim.rlim_max, "raised the open files limit");
        }
    }
}

/// Armed while the runtime is dropped: tokio's drop waits for every job on
/// its blocking pool, and a kernel read that never returns would keep a
/// stopped daemon alive. If the guard is not dropped within its time, a
/// warning says so and `expired` runs (the daemon passes a process exit
/// with the exit code it was about to return).
pub struct ExitDeadline {
    done: Option<mpsc::Sender<()>>,
    watcher: Option<std::thread::JoinHandle<()>>,
}

impl ExitDeadline {
    pub fn arm(within: Duration, expired: impl FnOnce() + Send + 'static) -> Self {
        let (done, wait) = mpsc::channel::<()>();
        let watcher = std::thread::Builder::new().name("exit-deadline".into()).spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(within) {
                tracing::warn!(waited = ?within, "the runtime has not stopped (a job on its blocking pool is still under way); exiting without it");
                expired();
            }
        });
        match watcher {
            Ok(w) => Self { done: Some(done), watcher: Some(w) },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the exit deadline's thread; the exit waits for the runtime");
                Self { done: None, watcher: None }
            }
        }
    }
}

impl Drop for ExitDeadline {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::ExitDeadline;

    fn flag() -> (Arc<AtomicBool>, impl FnOnce() + Send + 'static) {
        let fired = Arc::new(AtomicBool::new(false));
        let set = fired.clone();
        (fired, move || set.store(true, Ordering::SeqCst))
    }

    #[test]
    fn a_guard_dropped_in_time_does_not_fire() {
        let (fired, expired) = flag();
        drop(ExitDeadline::arm(Duration::from_secs(5), expired));
        assert!(!fired.load(Ordering::SeqCst));
    }

    #[test]
    fn a_guard_held_past_its_time_fires() {
        let (fired, expired) = flag();
        let guard = ExitDeadline::arm(Duration::from_millis(20), expired);
        std::thread::sleep(Duration::from_millis(300));
        assert!(fired.load(Ordering::SeqCst));
        drop(guard);
    }
}
