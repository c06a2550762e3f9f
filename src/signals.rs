//! SIGTERM and SIGINT, watched by a thread of their own. The daemon's
//! runtime is one thread, and planning a large sync keeps it busy for
//! seconds: a signal handled there would wait for it. Here the first
//! SIGTERM/SIGINT is passed on to the runtime (stop taking events, let the
//! sync in flight finish, leave the kernel as it is); a second one ends the
//! process at once, exit code 1, whatever the runtime is doing.
//!
//! [`watch`] blocks the two signals in the calling thread before the
//! runtime's threads exist (they inherit the mask), so only the watcher's
//! `sigwait` receives them.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use tokio::sync::mpsc;

/// The first SIGTERM or SIGINT, by name.
pub type Stop = mpsc::UnboundedReceiver<&'static str>;

/// Starts the watcher; call before any other thread starts.
pub fn watch() -> Result<Stop, nix::Error> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    let (tx, rx) = mpsc::unbounded_channel();
    let spawned = std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut seen = 0;
        loop {
            let Ok(signal) = set.wait() else { continue };
            seen += 1;
            if seen == 1 {
                tracing::info!(%signal, "stopping: the sync in flight finishes first; a second SIGTERM or SIGINT exits at once");
                let _ = tx.send(signal.as_str());
            } else {
                tracing::warn!(%signal, "second signal: exiting now, leaving the kernel as it is");
                std::process::exit(1);
            }
        }
    });
    spawned.map_err(|_| nix::Error::EAGAIN)?;
    Ok(rx)
}
