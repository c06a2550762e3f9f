//! kube-proxy-rs: the binary. Flags, then the configuration, then one of:
//! write the configuration, dry-run, clean up, or run the daemon (with
//! `--init-only`, only its set-up of the node).

use std::path::Path;
use std::process::ExitCode;

use kube_proxy_rs::cleanup::{self, CleanupError};
use kube_proxy_rs::config::{self, ConfigError, Flags, KubeProxyConfiguration};
use kube_proxy_rs::dry_run::{self, DryRunError};
use kube_proxy_rs::startup::{self, process, Exit, Purpose, Source, StartError};
use kube_proxy_rs::{http, logging};

/// jemalloc for every thread (src/heap.rs).
#[global_allocator]
static ALLOCATOR: kube_proxy_rs::heap::Allocator = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let started = std::time::SystemTime::now();
    let flags = Flags::from_env();
    let format = logging::LogFormat::parse(flags.logging_format.as_deref().unwrap_or_default());
    logging::init(flags.v.unwrap_or(0), format);
    process::ignore_sighup_until_ready();
    process::raise_open_files_limit();
    tracing::debug!(version = env!("CARGO_PKG_VERSION"), "kube-proxy-rs starting");
    match run(&flags, started) {
        Ok(Exit::Stopped) => ExitCode::SUCCESS,
        // As upstream's NodeManager: exit 1, for the DaemonSet to restart the proxy.
        Ok(Exit::Restart(_)) => ExitCode::from(1),
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Why the binary stops with exit code 1.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    DryRun(#[from] DryRunError),
    #[error(transparent)]
    Cleanup(#[from] CleanupError),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Flags that do not go together.
    #[error("{0}")]
    Usage(&'static str),
}

fn run(flags: &Flags, started: std::time::SystemTime) -> Result<Exit, Failure> {
    let cfg = config::load(flags)?;
    logging::apply(&cfg.logging);
    tracing::debug!(mode = %cfg.proxy_mode(), "configuration loaded");
    // Before anything touches the node (sysctls, ports, the kernel).
    if let Some(dir) = &flags.manifests {
        startup::check_manifest_dir(dir)?;
    }
    if let Some(path) = &flags.write_config_to {
        return write_config(&cfg, path);
    }
    if flags.diff && !flags.dry_run {
        return Err(Failure::Usage("--diff needs --dry-run"));
    }
    if flags.dry_run {
        let out = match &flags.manifests {
            Some(dir) => dry_run::dry_run(&cfg, dir, flags.diff)?,
            None => dry_run::dry_run_from_cluster(&cfg, flags.master.as_deref(), flags.diff)?,
        };
        print!("{out}");
        return Ok(Exit::Stopped);
    }
    if flags.cleanup {
        cleanup::cleanup()?;
        return Ok(Exit::Stopped);
    }
    let source = match &flags.manifests {
        Some(dir) => Source::Manifests(dir.clone()),
        None => Source::Api { master: flags.master.clone() },
    };
    let purpose = if flags.init_only { Purpose::InitOnly } else { Purpose::Serve };
    let zpages = http::ZPages::new(&cfg.gates(), flags.values(config::flag_default), started);
    let flags = flags.clone();
    Ok(startup::run(cfg, source, Box::new(move || config::merge(&flags)), purpose, zpages)?)
}

/// `--write-config-to`: the effective configuration as a file.
fn write_config(cfg: &KubeProxyConfiguration, path: &Path) -> Result<Exit, Failure> {
    let yaml = config::to_yaml(cfg)?;
    std::fs::write(path, yaml).map_err(|source| Failure::Write { path: path.to_path_buf(), source })?;
    tracing::info!(path = %path.display(), "wrote the effective configuration");
    Ok(Exit::Stopped)
}
