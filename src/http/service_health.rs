//! Service health-check servers, as upstream's `ServiceHealthServer`
//! (`pkg/proxy/healthcheck/service_health.go`): for each LoadBalancer
//! service with `externalTrafficPolicy: Local`, an HTTP server on its
//! `healthCheckNodePort` telling the cloud load balancer whether this node
//! has local endpoints: 200 when it has some and the proxy is healthy, else
//! 503, with upstream's JSON body, on every path.
//!
//! [`ServiceHealthServers::sync_services`] opens and closes listeners
//! incrementally; [`ServiceHealthServers::sync_endpoints`] updates the
//! counts. A port that can't be bound is logged and counted, and retried at
//! the next `sync_services`, as upstream.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use crate::health::ProxyHealth;
use crate::metrics::ProxyMetrics;
use crate::model::service::NamespacedName;
use crate::model::Model;

use super::{text_response, HttpError, Routes, Server, ServerHandle};

/// The metrics label and log name of these servers.
const NAME: &str = "service-health";

/// Local endpoint counts of the services with an open health check.
type Counts = Arc<RwLock<BTreeMap<NamespacedName, usize>>>;

/// One service's listeners.
#[derive(Debug)]
struct Instance {
    port: u16,
    servers: Vec<ServerHandle>,
}

/// The health-check servers of the node's Local-policy LoadBalancer services.
pub struct ServiceHealthServers {
    listen_ips: Vec<IpAddr>,
    health: Arc<ProxyHealth>,
    metrics: Option<Arc<ProxyMetrics>>,
    counts: Counts,
    open: BTreeMap<NamespacedName, Instance>,
}

impl ServiceHealthServers {
    /// Servers listening on each of `listen_ips`: upstream listens on the
    /// node IPs that match nodePortAddresses, or on every address
    /// ([`ServiceHealthServers::all_addresses`]) when that is empty.
    pub fn new(listen_ips: Vec<IpAddr>, health: Arc<ProxyHealth>) -> ServiceHealthServers {
        ServiceHealthServers { listen_ips, health, metrics: None, counts: Counts::default(), open: BTreeMap::new() }
    }

    /// Every address, both families (`[::]`, falling back to `0.0.0.0`
    /// where IPv6 is off), as Go's listener on `0.0.0.0` does.
    pub fn all_addresses() -> Vec<IpAddr> {
        vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)]
    }

    /// Counts bind failures in `kube_proxy_rs_bind_failures_total{server="service-health"}`.
    pub fn with_metrics(mut self, metrics: Arc<ProxyMetrics>) -> ServiceHealthServers {
        self.metrics = Some(metrics);
        self
    }

    /// Makes `services` (name → healthCheckNodePort) the open set: closes the
    /// others and those whose port changed, opens the new ones, leaves the
    /// rest alone. Must run inside the tokio runtime.
    pub fn sync_services(&mut self, services: &BTreeMap<NamespacedName, u16>) {
        let stale: Vec<NamespacedName> =
            self.open.iter().filter(|(nn, i)| services.get(*nn) != Some(&i.port)).map(|(nn, _)| nn.clone()).collect();
        for nn in stale {
            if let Some(i) = self.open.remove(&nn) {
                tracing::debug!(service = %nn, port = i.port, "closing health check");
            }
            self.counts().remove(&nn);
        }
        for (nn, port) in services {
            if self.open.contains_key(nn) {
                continue;
            }
            match self.listen(nn, *port) {
                Ok(servers) => {
                    tracing::debug!(service = %nn, port, "opened health check");
                    self.counts().insert(nn.clone(), 0);
                    self.open.insert(nn.clone(), Instance { port: *port, servers });
                }
                Err(e) => tracing::error!(service = %nn, port, error = %e, "failed to start health check"),
            }
        }
    }

    /// Sets the local endpoint counts (services not listed have none);
    /// services without an open health check are ignored.
    pub fn sync_endpoints(&mut self, endpoints: &BTreeMap<NamespacedName, usize>) {
        let mut counts = self.counts();
        for (nn, n) in counts.iter_mut() {
            *n = endpoints.get(nn).copied().unwrap_or(0);
        }
    }

    /// The open health checks and their bound addresses.
    pub fn listening(&self) -> BTreeMap<NamespacedName, Vec<SocketAddr>> {
        self.open
            .iter()
            .map(|(nn, i)| (nn.clone(), i.servers.iter().filter_map(|s| s.local_addr()).collect()))
            .collect()
    }

    fn counts(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<NamespacedName, usize>> {
        self.counts.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens on every address, or on none (what was opened is closed).
    fn listen(&self, nn: &NamespacedName, port: u16) -> Result<Vec<ServerHandle>, HttpError> {
        self.listen_ips.iter().map(|ip| self.listen_one(nn, *ip, port)).collect()
    }

    fn listen_one(&self, nn: &NamespacedName, ip: IpAddr, port: u16) -> Result<ServerHandle, HttpError> {
        let spawn = |ip: IpAddr| {
            let routes = service_routes(nn.clone(), self.counts.clone(), self.health.clone());
            Server::new(NAME, SocketAddr::new(ip, port), routes).hard_fail(true).metrics(self.metrics.clone()).spawn()
        };
        match spawn(ip) {
            Err(HttpError::Bind { source, .. }) if ip == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && no_ipv6(&source) => {
                spawn(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
            }
            other => other,
        }
    }
}

/// What the health checks need from the model, in one pass over the
/// service ports that have a healthCheckNodePort: the ports (upstream's
/// `HealthCheckNodePorts()`) and their local ready endpoints, counted over
/// all of a service's ports (upstream's `LocalReadyEndpoints()`).
pub fn health_check_state(model: &Model) -> (BTreeMap<NamespacedName, u16>, BTreeMap<NamespacedName, usize>) {
    let mut ports = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for sp in model.service_ports().filter(|sp| sp.health_check_node_port != 0) {
        let nn = &sp.name.service;
        ports.insert(nn.clone(), sp.health_check_node_port);
        let local = model.endpoints(&sp.name).iter().filter(|e| e.is_local && e.ready).count();
        *endpoints.entry(nn.clone()).or_insert(0) += local;
    }
    (ports, endpoints)
}

/// IPv6 is disabled or absent on this host.
fn no_ipv6(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(nix::libc::EAFNOSUPPORT) | Some(nix::libc::EADDRNOTAVAIL))
}

/// Every path answers the service's health.
fn service_routes(nn: NamespacedName, counts: Counts, health: Arc<ProxyHealth>) -> Routes {
    Routes::new().fallback(move |_req| {
        let count = counts.read().unwrap_or_else(|e| e.into_inner()).get(&nn).copied().unwrap_or(0);
        let healthy = health.is_healthy();
        let status = if count != 0 && healthy { 200 } else { 503 };
        std::future::ready(text_response(status, "application/json", service_health_body(&nn, count, healthy)))
    })
}

/// Upstream's body, byte for byte (tab-indented, no trailing newline).
pub fn service_health_body(nn: &NamespacedName, local_endpoints: usize, proxy_healthy: bool) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        q(&nn.namespace),
        q(&nn.name),
        local_endpoints,
        proxy_healthy
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::msgs::{ResourceKind, SourceEvent};
    use crate::net::IpFamily;

    #[test]
    fn health_check_state_counts_local_ready_endpoints_over_all_ports() {
        let mut m = Model::new(IpFamily::V4, "node-a");
        m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
        m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
        let mut lb = service("shop", "web", "10.96.0.30", &[("http", "TCP", 80, 30080), ("https", "TCP", 443, 30443)]);
        let spec = lb.spec.as_mut().unwrap();
        spec.type_ = Some("LoadBalancer".into());
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        m.record(&applied_service(lb)).unwrap();
        m.record(&applied_service(service("shop", "db", "10.96.0.31", &[("pg", "TCP", 5432, 0)]))).unwrap();
        let eps = [ep("10.244.0.5", "node-a"), ep("10.244.0.6", "node-a").not_ready(), ep("10.244.1.5", "node-b")];
        m.record(&applied_slice(slice("shop", "web-1", "web", &[("http", "TCP", 80), ("https", "TCP", 443)], &eps)))
            .unwrap();
        m.apply();
        let (ports, endpoints) = health_check_state(&m);
        let web = NamespacedName::new("shop", "web");
        assert_eq!(ports, BTreeMap::from([(web.clone(), 32000)]));
        assert_eq!(endpoints, BTreeMap::from([(web, 2)]), "one local ready endpoint, counted on both ports");
    }

    #[test]
    fn body_is_upstreams() {
        let nn = NamespacedName::new("web", "shop");
        let body = service_health_body(&nn, 2, true);
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"web\",\n\t\t\"name\": \"shop\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["service"]["name"], "shop");
    }
}
