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

use crate::config::NodePortAddresses;
use crate::health::ProxyHealth;
use crate::metrics::ProxyMetrics;
use crate::model::service::NamespacedName;

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

/// Where upstream listens for service health checks: every address when
/// nodePortAddresses is empty, else the node's addresses it selects
/// (`local`: the interfaces' addresses; `node_ips`: the Node object's, for
/// `primary`). Possibly none, as upstream, which then serves no health checks.
pub fn health_check_listen_ips(npa: &NodePortAddresses, local: &[IpAddr], node_ips: &[IpAddr]) -> Vec<IpAddr> {
    let ips: Vec<IpAddr> = match npa {
        NodePortAddresses::All => return ServiceHealthServers::all_addresses(),
        NodePortAddresses::Primary => node_ips.to_vec(),
        NodePortAddresses::Cidrs(cidrs) => {
            local.iter().filter(|ip| cidrs.iter().any(|c| c.contains(*ip))).copied().collect()
        }
    };
    if ips.is_empty() {
        tracing::warn!(?npa, "no node address matches nodePortAddresses: service health checks will not be served");
    }
    ips
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

    #[test]
    fn listen_addresses_follow_node_port_addresses() {
        let local: Vec<IpAddr> = ["127.0.0.1", "192.168.50.2", "10.0.0.7"].iter().map(|s| s.parse().unwrap()).collect();
        let node: Vec<IpAddr> = vec!["192.168.50.2".parse().unwrap()];
        assert_eq!(
            health_check_listen_ips(&NodePortAddresses::All, &local, &node),
            vec![IpAddr::V6(Ipv6Addr::UNSPECIFIED)]
        );
        assert_eq!(health_check_listen_ips(&NodePortAddresses::Primary, &local, &node), node);
        let cidrs = NodePortAddresses::Cidrs(vec!["192.168.0.0/16".parse().unwrap(), "10.0.0.0/8".parse().unwrap()]);
        assert_eq!(health_check_listen_ips(&cidrs, &local, &node), local[1..].to_vec());
        let none = NodePortAddresses::Cidrs(vec!["172.16.0.0/12".parse().unwrap()]);
        assert!(health_check_listen_ips(&none, &local, &node).is_empty());
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
