//! The process's own set-up, before the configuration is read: SIGHUP
//! ignored until the daemon listens for it, and the open files limit
//! raised.

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
