//! Upstream's two daemon servers (`cmd/kube-proxy/app/server.go`):
//!
//! - metrics, on `metricsBindAddress`: `/metrics` (Prometheus text 0.0.4),
//!   `/healthz` and `/healthz/ping` (component-base's ping check: `ok`),
//!   `/proxyMode` (the mode name), `/configz` (`{"kubeproxy.config.k8s.io":
//!   <config>}`), plus the caller's extra routes;
//! - health, on `healthzBindAddress`: `/healthz` and `/livez` with the
//!   proxy's health ([`ProxyHealth`]).

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::config::{KubeProxyConfiguration, ProxyMode, API_VERSION, KIND};
use crate::health::{Probe, ProxyHealth};
use crate::metrics::{ProxyMetrics, TEXT_CONTENT_TYPE};

use super::{text_response, HttpError, Routes, Server, ServerHandle};

const PLAIN: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
/// The configz name kube-proxy registers (its config API group).
const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

/// The configuration `/configz` serves; [`Configz::set`] after a reload.
#[derive(Debug, Clone)]
pub struct Configz(Arc<RwLock<String>>);

impl Configz {
    pub fn new(cfg: &KubeProxyConfiguration) -> Configz {
        Configz(Arc::new(RwLock::new(configz_body(cfg))))
    }

    /// Serves `cfg` from now on.
    pub fn set(&self, cfg: &KubeProxyConfiguration) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = configz_body(cfg);
    }

    /// The JSON body.
    pub fn body(&self) -> String {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// `{"kubeproxy.config.k8s.io": <the versioned config>}`, as component-base's configz.
fn configz_body(cfg: &KubeProxyConfiguration) -> String {
    let mut cfg = cfg.clone();
    if cfg.api_version.is_empty() {
        cfg.api_version = API_VERSION.to_string();
    }
    if cfg.kind.is_empty() {
        cfg.kind = KIND.to_string();
    }
    let mut all = serde_json::Map::new();
    all.insert(CONFIGZ_GROUP.to_string(), serde_json::to_value(&cfg).unwrap_or_default());
    serde_json::Value::Object(all).to_string()
}

/// The metrics server's routes.
pub fn metrics_routes(metrics: Arc<ProxyMetrics>, mode: ProxyMode, configz: Configz) -> Routes {
    Routes::new()
        .route_async("/metrics", move |_| {
            let metrics = metrics.clone();
            async move { text_response(200, TEXT_CONTENT_TYPE, metrics.scrape_text().await) }
        })
        .route("/healthz", |_| text_response(200, PLAIN, "ok"))
        .route("/healthz/ping", |_| text_response(200, PLAIN, "ok"))
        .route("/proxyMode", move |_| text_response(200, PLAIN, mode.as_str()))
        .route("/configz", move |_| text_response(200, JSON, configz.body()))
}

/// The health server's routes.
pub fn health_routes(health: Arc<ProxyHealth>) -> Routes {
    let livez = health.clone();
    Routes::new()
        .route("/healthz", move |_| probe(&health, Probe::Healthz))
        .route("/livez", move |_| probe(&livez, Probe::Livez))
}

fn probe(health: &ProxyHealth, probe: Probe) -> super::Response {
    let r = health.probe(probe, SystemTime::now());
    text_response(r.status, JSON, r.body)
}

/// The running daemon servers; dropping stops them.
#[derive(Debug)]
pub struct HttpServers {
    /// On `healthzBindAddress`, unless it is empty.
    pub healthz: Option<ServerHandle>,
    /// On `metricsBindAddress`, unless it is empty.
    pub metrics: Option<ServerHandle>,
}

/// Starts the health and metrics servers as upstream's `Run` does, with
/// `extra` routes on the metrics server (e.g. the dashboard). Fails only on
/// a bind failure under `bindAddressHardFail` (or without a tokio runtime).
pub fn start_http_servers(
    cfg: &KubeProxyConfiguration,
    metrics: &Arc<ProxyMetrics>,
    health: &Arc<ProxyHealth>,
    configz: &Configz,
    extra: Routes,
) -> Result<HttpServers, HttpError> {
    let hard_fail = cfg.bind_address_hard_fail;
    if cfg.enable_profiling {
        tracing::warn!("enableProfiling: kube-proxy-rs has no /debug/pprof endpoints; ignored");
    }
    let m = Some(metrics.clone());
    let healthz = match cfg.healthz_addr() {
        Some(addr) => Some(
            Server::new("healthz", addr, health_routes(health.clone()))
                .hard_fail(hard_fail)
                .metrics(m.clone())
                .spawn()?,
        ),
        None => None,
    };
    let routes = metrics_routes(metrics.clone(), cfg.proxy_mode(), configz.clone()).merge(extra);
    let metrics = match cfg.metrics_addr() {
        Some(addr) => Some(Server::new("metrics", addr, routes).hard_fail(hard_fail).metrics(m).spawn()?),
        None => None,
    };
    Ok(HttpServers { healthz, metrics })
}
