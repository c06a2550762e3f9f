//! kube-proxy-rs: the binary. Flags and config, then one of: write the
//! config, dry-run, clean up, or run the daemon.

use std::process::ExitCode;

use kube_proxy_rs::config::{self, Flags};
use kube_proxy_rs::daemon::{self, StartError};
use kube_proxy_rs::{cleanup, http, logging, runtime};

fn main() -> ExitCode {
    let started = std::time::SystemTime::now();
    let flags = Flags::from_env();
    let format = logging::LogFormat::parse(flags.logging_format.as_deref().unwrap_or_default());
    logging::init(flags.v.unwrap_or(0), format);
    ignore_sighup_until_ready();
    raise_open_files_limit();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "kube-proxy-rs starting");
    match run(&flags, started) {
        Ok(runtime::Exit::Stopped) => ExitCode::SUCCESS,
        // As upstream's NodeManager: exit 1, for the DaemonSet to restart the proxy.
        Ok(runtime::Exit::Restart(_)) => ExitCode::from(1),
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
    }
}

fn run(flags: &Flags, started: std::time::SystemTime) -> Result<runtime::Exit, StartError> {
    let cfg = config::load(flags)?;
    logging::apply(&cfg.logging);
    tracing::debug!(mode = %cfg.proxy_mode(), "configuration loaded");
    // Before anything touches the node (sysctls, ports, the kernel).
    if let Some(dir) = &flags.manifests {
        daemon::check_manifest_dir(dir)?;
    }
    if let Some(path) = &flags.write_config_to {
        let yaml = config::to_yaml(&cfg)?;
        std::fs::write(path, yaml).map_err(|source| StartError::Write { path: path.clone(), source })?;
        tracing::info!(path = %path.display(), "wrote the effective configuration");
        return Ok(runtime::Exit::Stopped);
    }
    if flags.diff && !flags.dry_run {
        return Err(StartError::Usage("--diff needs --dry-run"));
    }
    if flags.dry_run {
        let out = match &flags.manifests {
            Some(dir) => daemon::dry_run(&cfg, dir, flags.diff)?,
            None => daemon::dry_run_from_cluster(&cfg, flags.master.as_deref(), flags.diff)?,
        };
        print!("{out}");
        return Ok(runtime::Exit::Stopped);
    }
    if flags.cleanup {
        return cleanup::cleanup().map(|()| runtime::Exit::Stopped).map_err(StartError::from);
    }
    let source = match &flags.manifests {
        Some(dir) => runtime::Source::Manifests(dir.clone()),
        None => runtime::Source::Api { master: flags.master.clone() },
    };
    let purpose = if flags.init_only { runtime::Purpose::InitOnly } else { runtime::Purpose::Serve };
    let zpages = http::ZPages::new(&cfg.gates(), flags.values(config::flag_default), started);
    let flags = flags.clone();
    runtime::run(cfg, source, Box::new(move || config::merge(&flags)), purpose, zpages)
}

/// A SIGHUP that arrives before the runtime listens for it would kill the
/// process (the default action); ignore it until then. The runtime's handler
/// replaces this disposition.
fn ignore_sighup_until_ready() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler code, so nothing runs in signal context.
    if let Err(e) = unsafe { signal(Signal::SIGHUP, SigHandler::SigIgn) } {
        tracing::warn!(error = %e, "cannot ignore SIGHUP during start-up");
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime
/// does for upstream kube-proxy (the default soft limit, often 1,024, is
/// what a flood of connections or a large cluster's pipes would exhaust).
fn raise_open_files_limit() {
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
