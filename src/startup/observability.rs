//! Metrics, health, the HTTP servers (metrics, healthz, the dashboard and
//! the z-pages) and the service health checks, started before the
//! proxiers, and the hooks through which each family's coordinator reports
//! to them.

use std::net::IpAddr;
use std::sync::Arc;

use super::families::Families;
use super::StartError;
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

/// Starts them for `families` on node `node_name`, with `node` as found at start;
/// the hooks list the Services' IPVS schedulers when `schedulers`.
pub fn start(
    cfg: &KubeProxyConfiguration,
    families: Families,
    node_name: &str,
    node: &NodeInfo,
    registry: &StatsRegistry,
    zpages: http::ZPages,
    schedulers: bool,
) -> Result<(Vec<(IpFamily, SyncHooks)>, Observability), StartError> {
    let metrics = Arc::new(ProxyMetrics::new(cfg.proxy_mode(), registry.clone()));
    metrics.families_started(&families.all().collect::<Vec<_>>());
    let health = Arc::new(ProxyHealth::new(health::health_timeout(cfg)).with_metrics(metrics.clone()));
    let configz = http::Configz::new(cfg);
    let about = http::dashboard::About {
        mode: cfg.proxy_mode(),
        node: node_name.to_string(),
        families: families.all().collect(),
    };
    let dashboard = http::dashboard::dashboard_routes(about, registry.clone(), health.clone());
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
            let hooks = SyncHooks::new(f, metrics.clone(), health.clone(), registry.clone())
                .with_service_health(service_health.clone());
            (f, if schedulers { hooks.with_scheduler_list() } else { hooks })
        })
        .collect();
    Ok((hooks, Observability { metrics, configz, _servers: servers }))
}
