//! SIGHUP in the running daemon: the new file loaded with the start's
//! flags, [`super::plan`]ned against the running configuration, and its
//! live part applied: the z-pages' and the logs' configuration, the mode's
//! node set-up again, and each family's proxier reconfigured with settings
//! derived anew. A file that is refused changes nothing.

use std::sync::Arc;

use crate::config::{ConfigError, KubeProxyConfiguration, Merged};
use crate::http::Configz;
use crate::kernel::addrs;
use crate::metrics::ProxyMetrics;
use crate::model::NodeInfo;
use crate::proxier::{Mode, Proxier};
use crate::settings;

/// Re-reads the configuration (SIGHUP), with the same flags as at start:
/// merged, not yet finished ([`super::plan`] finishes it).
pub type Reloader = Box<dyn Fn() -> Result<Merged, ConfigError>>;

/// What a reload changes in the running daemon.
pub struct Live<M: Mode> {
    pub cfg: KubeProxyConfiguration,
    pub node_name: String,
    /// The Node as found at start (what the node set-up is decided for; a
    /// change of what it says restarts the daemon).
    pub node: NodeInfo,
    /// The primary family's first.
    pub proxiers: Vec<Proxier<M>>,
    /// What the mode opened at start (kept across reloads).
    pub shared: M::Shared,
    pub configz: Configz,
    pub metrics: Arc<ProxyMetrics>,
}

impl<M: Mode> Live<M> {
    /// Applies what can change live, names what can't; a bad file changes nothing.
    pub async fn reload(&mut self, load: &Reloader) {
        let plan = match load()
            .map_err(|source| super::ReloadError::Invalid { source })
            .and_then(|loaded| super::plan(&self.cfg, loaded))
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "config reload refused; the running configuration stays");
                self.metrics.config_reload_failed();
                return;
            }
        };
        if !plan.needs_restart.is_empty() {
            tracing::warn!(fields = %plan.needs_restart.join(", "), "config changes need a restart and were not applied");
        }
        if plan.applied.is_empty() {
            tracing::info!("config reloaded: nothing to apply");
            return;
        }
        tracing::info!(fields = %plan.applied.join(", "), "config reloaded: applying");
        self.cfg = plan.effective;
        self.configz.set(&self.cfg);
        crate::logging::apply(&self.cfg.logging);
        M::reopen(&self.cfg, &self.shared).await;
        let addrs = addrs::local_addrs().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the node's addresses after reload");
            Vec::new()
        });
        for proxier in &self.proxiers {
            // The host probed again.
            let s = settings::derive(
                &self.cfg,
                proxier.family,
                &self.node_name,
                M::host(&self.shared, proxier.family).await,
            );
            if let Err(e) = M::set_up_family(&s, &self.node, &addrs) {
                tracing::warn!(error = %e, "node set-up after reload");
            }
            proxier.reconfigure(&s);
        }
    }
}
