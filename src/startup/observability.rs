//! Metrics, health, the HTTP servers (metrics, healthz, the dashboard and
//! the z-pages) and the service health checks, started before the
//! proxiers, and the hooks through which each family's coordinator reports
//! to them.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use actix::prelude::*;

use super::families::Families;
use super::StartError;
use crate::actors::coordinator::GetSyncHistory;
use crate::config::KubeProxyConfiguration;
use crate::health::{self, ProxyHealth};
use crate::http::{self, ServiceHealthServers, SharedServiceHealth};
use crate::kernel::addrs;
use crate::metrics::ProxyMetrics;
use crate::model::NodeInfo;
use crate::net::IpFamily;
use crate::observe::SyncHooks;
use crate::stats::StatsRegistry;

/// The metrics and health servers; dropped on shutdown.
pub struct Observability {
    pub metrics: Arc<ProxyMetrics>,
    pub configz: http::Configz,
    _servers: http::HttpServers,
}

/// Where the dashboard asks the primary family's coordinator for its syncs:
/// set once that coordinator runs (the dashboard starts before it).
pub type HistorySlot = Arc<OnceLock<Recipient<GetSyncHistory>>>;

/// Starts them for `families` on a node with `node` as found at start;
/// the hooks list the Services' IPVS schedulers when `schedulers`.
pub fn start(
    cfg: &KubeProxyConfiguration,
    families: Families,
    node: &NodeInfo,
    registry: &StatsRegistry,
    history: HistorySlot,
    zpages: http::ZPages,
    schedulers: bool,
) -> Result<(Vec<(IpFamily, SyncHooks)>, Observability), StartError> {
    let metrics = Arc::new(ProxyMetrics::new(cfg.proxy_mode(), registry.clone()));
    metrics.families_started(&families.all().collect::<Vec<_>>());
    let health = Arc::new(ProxyHealth::new(health::health_timeout(cfg)).with_metrics(metrics.clone()));
    let configz = http::Configz::new(cfg);
    let dashboard = http::dashboard::dashboard_routes(registry.clone(), http::dashboard::coordinator_history(history));
    let extra = dashboard.merge(zpages.routes());
    let servers = http::start_http_servers(cfg, &metrics, &health, &configz, extra).map_err(StartError::Http)?;
    let local: Vec<IpAddr> = addrs::local_addrs().unwrap_or_default().into_iter().map(|a| a.ip).collect();
    let ips = http::health_check_listen_ips(&cfg.node_port_addresses(), &local, &node.addresses);
    // One set of health-check servers: a dual-stack service's healthCheckNodePort is one port.
    let service_health: SharedServiceHealth =
        ServiceHealthServers::new(ips, health.clone()).with_metrics(metrics.clone()).into();
    let hooks = families
        .all()
        .map(|f| {
            let hooks = SyncHooks::new(f, metrics.clone(), health.clone()).with_service_health(service_health.clone());
            (f, if schedulers { hooks.with_scheduler_list(registry.clone()) } else { hooks })
        })
        .collect();
    Ok((hooks, Observability { metrics, configz, _servers: servers }))
}
