//! The HTTP servers, on hyper inside the daemon's tokio runtime (the actix
//! System's): the metrics server (`/metrics`, `/healthz`, `/proxyMode`,
//! `/configz`, plus any routes added, e.g. the dashboard), the health server
//! (`/healthz`, `/livez`) and one service health-check server per
//! LoadBalancer service with `externalTrafficPolicy: Local`
//! ([`ServiceHealthServers`]).
//!
//! A server is a [`Routes`] table served by [`Server::spawn`], which returns
//! a [`ServerHandle`]; dropping the handle stops the server. As upstream, a
//! port that can't be bound is logged, counted and retried every 5 s,
//! unless `bindAddressHardFail` is set: then [`Server::spawn`] returns the
//! error and the daemon exits.
//!
//! Every server is bounded ([`Limits`]): at most [`MAX_CONNECTIONS`] at once
//! (more are accepted and closed at once, so neither the backlog nor the
//! daemon's file descriptors fill up), request headers must arrive within
//! [`HEADER_READ_TIMEOUT`], and a connection lives at most
//! [`CONNECTION_LIFETIME`] (a keep-alive client reconnects). The healthz
//! port listens on every address by default: no number of idle or slow
//! clients may starve the kernel work or the sources of descriptors.

pub mod dashboard;
mod endpoints;
mod family_health;
mod routes;
mod service_health;
mod zpages;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::metrics::ProxyMetrics;

pub use endpoints::{health_routes, metrics_routes, start_http_servers, Configz, HttpServers};
pub use family_health::SharedServiceHealth;
pub use routes::{not_found, text_response, Body, Handler, Request, Response, Routes};
pub use service_health::{health_check_listen_ips, service_health_body, ServiceHealthServers};
pub use zpages::{acceptable, flagz_body, statusz_body, ZPages};

/// How long upstream waits before retrying a port it couldn't bind.
pub const BIND_RETRY: Duration = Duration::from_secs(5);

/// Connections one server serves at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Time for a client to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, idle or not.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// What one server allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_read_timeout: HEADER_READ_TIMEOUT,
            connection_lifetime: CONNECTION_LIFETIME,
        }
    }
}

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("no tokio runtime to run the {server} server on")]
    NoRuntime { server: &'static str },
    #[error("failed to start {server} server on {addr}: {source}")]
    Bind {
        server: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A running (or still binding) server; dropping it stops the server and
/// closes its connections.
#[derive(Debug)]
pub struct ServerHandle {
    name: &'static str,
    local_addr: Arc<OnceLock<SocketAddr>>,
    task: JoinHandle<()>,
}

impl ServerHandle {
    /// The bound address (with the real port when bound to port 0), once bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr.get().copied()
    }

    /// The server's name (`metrics`, `healthz`, ...).
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A server to start: a name for logs and metrics, an address, routes.
pub struct Server {
    name: &'static str,
    addr: SocketAddr,
    routes: Routes,
    hard_fail: bool,
    metrics: Option<Arc<ProxyMetrics>>,
    limits: Limits,
}

impl Server {
    pub fn new(name: &'static str, addr: SocketAddr, routes: Routes) -> Server {
        Server { name, addr, routes, hard_fail: false, metrics: None, limits: Limits::default() }
    }

    /// Other limits than the defaults (tests).
    pub fn limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
    }

    /// `bindAddressHardFail`: a bind failure is returned instead of retried.
    pub fn hard_fail(mut self, hard_fail: bool) -> Server {
        self.hard_fail = hard_fail;
        self
    }

    /// Counts bind failures in `kube_proxy_rs_bind_failures_total{server}`.
    pub fn metrics(mut self, metrics: Option<Arc<ProxyMetrics>>) -> Server {
        self.metrics = metrics;
        self
    }

    /// Binds now and serves on the current tokio runtime. A bind failure is
    /// returned under hard-fail, else logged and retried every [`BIND_RETRY`].
    pub fn spawn(self) -> Result<ServerHandle, HttpError> {
        let Server { name, addr, routes, hard_fail, metrics, limits } = self;
        let rt = tokio::runtime::Handle::try_current().map_err(|_| HttpError::NoRuntime { server: name })?;
        let local_addr = Arc::new(OnceLock::new());
        let routes = Arc::new(routes);
        let bound = bind(name, addr).and_then(|l| {
            let _guard = rt.enter();
            TcpListener::from_std(l).map_err(|e| bind_error(name, addr, e))
        });
        let task = match bound {
            Ok(listener) => {
                let bound_addr = listener.local_addr().unwrap_or(addr);
                let _ = local_addr.set(bound_addr);
                tracing::info!(server = name, addr = %bound_addr, "serving HTTP");
                rt.spawn(serve(name, listener, routes, limits))
            }
            Err(e) => {
                if let Some(m) = &metrics {
                    m.bind_failed(name);
                }
                if hard_fail {
                    return Err(e);
                }
                tracing::error!(server = name, error = %e, "cannot bind; retrying every 5s");
                rt.spawn(bind_later(name, addr, (routes, limits), local_addr.clone(), metrics))
            }
        };
        Ok(ServerHandle { name, local_addr, task })
    }
}

fn bind_error(server: &'static str, addr: SocketAddr, source: std::io::Error) -> HttpError {
    HttpError::Bind { server, addr, source }
}

/// Binds a non-blocking listener (std sets SO_REUSEADDR, as Go does).
fn bind(server: &'static str, addr: SocketAddr) -> Result<std::net::TcpListener, HttpError> {
    let listener = std::net::TcpListener::bind(addr).map_err(|e| bind_error(server, addr, e))?;
    listener.set_nonblocking(true).map_err(|e| bind_error(server, addr, e))?;
    Ok(listener)
}

/// Retries binding every [`BIND_RETRY`], then serves.
async fn bind_later(
    name: &'static str,
    addr: SocketAddr,
    (routes, limits): (Arc<Routes>, Limits),
    local_addr: Arc<OnceLock<SocketAddr>>,
    metrics: Option<Arc<ProxyMetrics>>,
) {
    loop {
        tokio::time::sleep(BIND_RETRY).await;
        match TcpListener::bind(addr).await {
            Ok(listener) => {
                let _ = local_addr.set(listener.local_addr().unwrap_or(addr));
                tracing::info!(server = name, %addr, "serving HTTP after retrying the bind");
                return serve(name, listener, routes, limits).await;
            }
            Err(e) => {
                tracing::warn!(server = name, %addr, error = %e, "still cannot bind; retrying");
                if let Some(m) = &metrics {
                    m.bind_failed(name);
                }
            }
        }
    }
}

/// A burst of at least this many connections at once is followed by a heap
/// trim once it is over.
const TRIM_AFTER: usize = 32;

/// Accepts connections until aborted; aborting drops every connection too.
async fn serve(name: &'static str, listener: TcpListener, routes: Arc<Routes>, limits: Limits) {
    let mut connections = JoinSet::new();
    let mut refused: u64 = 0;
    // The most connections at once since the server was last idle.
    let mut peak = 0;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) if connections.len() >= limits.max_connections => {
                    drop(stream);
                    refused += 1;
                    if refused.is_power_of_two() {
                        tracing::warn!(server = name, %peer, refused, max = limits.max_connections,
                            "too many connections: closing new ones");
                    }
                }
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(name, stream, routes.clone(), limits));
                    peak = peak.max(connections.len());
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(server = name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                if connections.is_empty() && peak >= TRIM_AFTER {
                    // A burst (a flood, most likely) is over: give the
                    // buffers it left in malloc's free lists back to the
                    // system, so RSS returns to its level.
                    tracing::debug!(server = name, peak, "connections burst over; trimming the heap");
                    crate::heap::trim();
                }
                if connections.is_empty() {
                    peak = 0;
                }
            }
        }
    }
}

async fn serve_connection(name: &'static str, stream: tokio::net::TcpStream, routes: Arc<Routes>, limits: Limits) {
    let service = hyper::service::service_fn(move |req| {
        let routes = routes.clone();
        async move { Ok::<_, std::convert::Infallible>(routes.dispatch(req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.connection_lifetime, conn).await {
        Ok(Err(e)) => tracing::debug!(server = name, error = %e, "connection ended with an error"),
        Ok(Ok(())) => {}
        Err(_) => tracing::debug!(server = name, "connection closed at the end of its lifetime"),
    }
}
