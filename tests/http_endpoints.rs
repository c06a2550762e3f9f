//! The HTTP servers over real loopback HTTP: status codes, bodies, content
//! types and upstream's headers.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use kube_proxy_rs::config::{KubeProxyConfiguration, ProxyMode};
use kube_proxy_rs::health::ProxyHealth;
use kube_proxy_rs::http::{
    health_routes, metrics_routes, start_http_servers, text_response, Configz, HttpError, Limits, Routes, Server,
    ServiceHealthServers,
};
use kube_proxy_rs::metrics::ProxyMetrics;
use kube_proxy_rs::model::NamespacedName;
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::stats::StatsRegistry;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A response as the tests look at it.
#[derive(Debug)]
struct Got {
    status: u16,
    content_type: String,
    nosniff: bool,
    body: String,
}

/// GET `path` over a fresh HTTP/1.1 connection.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<Got> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .map_err(std::io::Error::other)?;
    let resp = sender.send_request(req).await.map_err(std::io::Error::other)?;
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (status, content_type, nosniff) =
        (resp.status().as_u16(), header("content-type"), header("x-content-type-options") == "nosniff");
    let body = resp.into_body().collect().await.map_err(std::io::Error::other)?.to_bytes();
    Ok(Got { status, content_type, nosniff, body: String::from_utf8_lossy(&body).into_owned() })
}

async fn get_ok(addr: SocketAddr, path: &str) -> Got {
    get(addr, path).await.unwrap_or_else(|e| panic!("GET {addr}{path}: {e}"))
}

fn loopback0() -> SocketAddr {
    SocketAddr::new(LOCALHOST, 0)
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind(loopback0()).and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

fn ipvs_config() -> KubeProxyConfiguration {
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "ipvs".into();
    cfg.metrics_bind_address = "127.0.0.1:0".into();
    cfg.healthz_bind_address = "127.0.0.1:0".into();
    cfg
}

fn metrics() -> Arc<ProxyMetrics> {
    Arc::new(ProxyMetrics::new(ProxyMode::Ipvs, StatsRegistry::default()))
}

#[tokio::test]
async fn metrics_server_serves_metrics_mode_configz_and_ping() {
    let m = metrics();
    m.changes_seen(2, 3);
    let cfg = ipvs_config();
    let routes = metrics_routes(m.clone(), ProxyMode::Ipvs, Configz::new(&cfg));
    let server = Server::new("metrics", loopback0(), routes).spawn().expect("bind");
    let addr = server.local_addr().expect("bound");

    let metrics = get_ok(addr, "/metrics").await;
    assert_eq!((metrics.status, metrics.content_type.as_str()), (200, "text/plain; version=0.0.4; charset=utf-8"));
    assert!(
        metrics.body.contains("# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter\n"),
        "{}",
        metrics.body
    );
    assert!(metrics.body.contains("\nkubeproxy_sync_proxy_rules_endpoint_changes_total 3\n"), "{}", metrics.body);

    let mode = get_ok(addr, "/proxyMode").await;
    assert_eq!(
        (mode.status, mode.content_type.as_str(), mode.body.as_str()),
        (200, "text/plain; charset=utf-8", "ipvs")
    );
    assert!(mode.nosniff);

    let configz = get_ok(addr, "/configz").await;
    assert_eq!((configz.status, configz.content_type.as_str()), (200, "application/json"));
    let v: serde_json::Value = serde_json::from_str(&configz.body).expect("JSON");
    let c = &v["kubeproxy.config.k8s.io"];
    assert_eq!(c["kind"], "KubeProxyConfiguration");
    assert_eq!(c["apiVersion"], "kubeproxy.config.k8s.io/v1alpha1");
    assert_eq!(c["mode"], "ipvs");
    assert_eq!(c["metricsBindAddress"], "127.0.0.1:0");

    for path in ["/healthz", "/healthz/ping"] {
        let ping = get_ok(addr, path).await;
        assert_eq!(
            (ping.status, ping.content_type.as_str(), ping.body.as_str()),
            (200, "text/plain; charset=utf-8", "ok")
        );
    }
    let missing = get_ok(addr, "/nope").await;
    assert_eq!((missing.status, missing.body.as_str()), (404, "404 page not found\n"));
}

#[tokio::test]
async fn extra_routes_and_a_fallback_extend_the_metrics_server() {
    let cfg = ipvs_config();
    let extra = Routes::new()
        .route("/dashboard", |_| text_response(200, "text/html; charset=utf-8", "<h1>kube-proxy-rs</h1>"))
        .fallback(|req| {
            let path = req.uri().path().to_string();
            async move { text_response(200, "text/plain; charset=utf-8", format!("fallback {path}")) }
        });
    let routes = metrics_routes(metrics(), ProxyMode::Ipvs, Configz::new(&cfg)).merge(extra);
    let server = Server::new("metrics", loopback0(), routes).spawn().expect("bind");
    let addr = server.local_addr().expect("bound");
    assert_eq!(get_ok(addr, "/dashboard").await.body, "<h1>kube-proxy-rs</h1>");
    assert_eq!(get_ok(addr, "/api/syncs").await.body, "fallback /api/syncs");
    assert_eq!(get_ok(addr, "/proxyMode").await.body, "ipvs", "exact routes still win");
}

#[tokio::test]
async fn health_server_reports_a_late_sync_and_a_draining_node() {
    let m = metrics();
    let health = Arc::new(ProxyHealth::new(Duration::from_millis(20)).with_metrics(m.clone()));
    let server = Server::new("healthz", loopback0(), health_routes(health.clone())).spawn().expect("bind");
    let addr = server.local_addr().expect("bound");

    health.updated(IpFamily::V4);
    let ok = get_ok(addr, "/healthz").await;
    assert_eq!((ok.status, ok.content_type.as_str()), (200, "application/json"));
    assert!(ok.nosniff);
    let body: serde_json::Value = serde_json::from_str(&ok.body).expect("JSON");
    assert_eq!((body["healthy"].as_bool(), body["nodeEligible"].as_bool()), (Some(true), Some(true)));
    assert!(body["currentTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");

    health.queued_update(IpFamily::V4);
    tokio::time::sleep(Duration::from_millis(40)).await;
    let late = get_ok(addr, "/livez").await;
    assert_eq!(late.status, 503, "{}", late.body);
    assert!(late.body.contains("\"IPv4\":{"), "{}", late.body);

    health.updated(IpFamily::V4);
    health.node_deleted();
    assert_eq!(get_ok(addr, "/healthz").await.status, 503, "the node is going away");
    assert_eq!(get_ok(addr, "/livez").await.status, 200, "livez ignores the node");
    assert_eq!(get_ok(addr, "/metrics").await.status, 404);

    let text = m.encode_text();
    for line in [
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
        "kubeproxy_proxy_healthz_total{code=\"503\"} 1",
        "kubeproxy_proxy_livez_total{code=\"503\"} 1",
        "kubeproxy_proxy_livez_total{code=\"200\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

#[tokio::test]
async fn start_http_servers_binds_both_and_hard_fail_returns_the_error() {
    let cfg = ipvs_config();
    let (m, health) = (metrics(), Arc::new(ProxyHealth::new(Duration::from_secs(60))));
    let configz = Configz::new(&cfg);
    let servers = start_http_servers(&cfg, &m, &health, &configz, Routes::new()).expect("start");
    let metrics_addr = servers.metrics.as_ref().and_then(|s| s.local_addr()).expect("metrics bound");
    let healthz_addr = servers.healthz.as_ref().and_then(|s| s.local_addr()).expect("healthz bound");
    assert_eq!(get_ok(metrics_addr, "/proxyMode").await.body, "ipvs");
    assert_eq!(get_ok(healthz_addr, "/livez").await.status, 200);

    let mut busy = cfg.clone();
    busy.metrics_bind_address = metrics_addr.to_string();
    busy.healthz_bind_address.clear();
    busy.bind_address_hard_fail = true;
    let err = start_http_servers(&busy, &m, &health, &configz, Routes::new()).expect_err("port taken");
    assert!(matches!(err, HttpError::Bind { server: "metrics", .. }), "{err}");

    busy.bind_address_hard_fail = false;
    let retrying = start_http_servers(&busy, &m, &health, &configz, Routes::new()).expect("retries instead");
    assert!(retrying.metrics.as_ref().is_some_and(|s| s.local_addr().is_none()), "not bound yet");
    assert!(retrying.healthz.is_none(), "empty healthzBindAddress disables it");
    assert!(m.encode_text().lines().any(|l| l == "kube_proxy_rs_bind_failures_total{server=\"metrics\"} 2"));

    drop(servers);
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(get(healthz_addr, "/livez").await.is_err(), "dropping the handle closes the port");
}

fn nn(name: &str) -> NamespacedName {
    NamespacedName::new("shop", name)
}

#[tokio::test]
async fn service_health_checks_open_answer_and_close_incrementally() {
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let m = metrics();
    let mut hcs = ServiceHealthServers::new(vec![LOCALHOST], health.clone()).with_metrics(m.clone());
    let (web_port, db_port) = (free_port(), free_port());
    let services = BTreeMap::from([(nn("web"), web_port), (nn("db"), db_port)]);
    hcs.sync_services(&services);
    hcs.sync_endpoints(&BTreeMap::from([(nn("web"), 2), (nn("other"), 5)]));
    let web = SocketAddr::new(LOCALHOST, web_port);
    let db = SocketAddr::new(LOCALHOST, db_port);

    let up = get_ok(web, "/").await;
    assert_eq!((up.status, up.content_type.as_str()), (200, "application/json"));
    assert!(up.nosniff);
    assert_eq!(
        up.body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
    );
    assert_eq!(get_ok(web, "/any/path").await.status, 200, "every path answers");
    let down = get_ok(db, "/").await;
    assert_eq!(down.status, 503, "no local endpoints");
    assert!(down.body.contains("\"localEndpoints\": 0"), "{}", down.body);

    hcs.sync_endpoints(&BTreeMap::new());
    assert_eq!(get_ok(web, "/").await.status, 503, "services not listed have no endpoints");

    let moved = free_port();
    hcs.sync_services(&BTreeMap::from([(nn("web"), moved)]));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(get(db, "/").await.is_err(), "db's health check closed");
    assert!(get(web, "/").await.is_err(), "web's old port closed");
    hcs.sync_endpoints(&BTreeMap::from([(nn("web"), 1)]));
    assert_eq!(get_ok(SocketAddr::new(LOCALHOST, moved), "/").await.status, 200, "web's new port");
    assert_eq!(hcs.listening().len(), 1);
}

#[tokio::test]
async fn a_busy_health_check_port_is_counted_and_retried_at_the_next_sync() {
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let m = metrics();
    let mut hcs = ServiceHealthServers::new(vec![LOCALHOST], health).with_metrics(m.clone());
    let squatter = std::net::TcpListener::bind(loopback0()).expect("bind");
    let port = squatter.local_addr().expect("addr").port();
    let services = BTreeMap::from([(nn("web"), port)]);
    hcs.sync_services(&services);
    assert!(hcs.listening().is_empty());
    assert!(m.encode_text().lines().any(|l| l == "kube_proxy_rs_bind_failures_total{server=\"service-health\"} 1"));

    drop(squatter);
    hcs.sync_services(&services);
    hcs.sync_endpoints(&BTreeMap::from([(nn("web"), 1)]));
    assert_eq!(get_ok(SocketAddr::new(LOCALHOST, port), "/").await.status, 200);
}

#[tokio::test]
async fn an_unhealthy_proxy_fails_service_health_checks_too() {
    let health = Arc::new(ProxyHealth::new(Duration::from_millis(10)));
    let mut hcs = ServiceHealthServers::new(vec![LOCALHOST], health.clone());
    let port = free_port();
    hcs.sync_services(&BTreeMap::from([(nn("web"), port)]));
    hcs.sync_endpoints(&BTreeMap::from([(nn("web"), 3)]));
    health.updated(IpFamily::V4);
    health.queued_update(IpFamily::V4);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let got = get_ok(SocketAddr::new(LOCALHOST, port), "/").await;
    assert_eq!(got.status, 503);
    assert!(got.body.contains("\"serviceProxyHealthy\": false"), "{}", got.body);
}

#[test]
fn servers_run_inside_the_actix_system_runtime() {
    let system = actix_rt::System::new();
    let got = system.block_on(async {
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let server = Server::new("healthz", loopback0(), health_routes(health)).spawn().expect("bind");
        let addr = server.local_addr().expect("bound");
        get_ok(addr, "/livez").await
    });
    assert_eq!(got.status, 200, "{}", got.body);
}

/// Whether the server closed `stream` within `within` (EOF or reset on read).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// A flood of idle and slowloris clients: connections past the cap are
/// closed at once, a client that never finishes its headers is cut after the
/// header timeout, an idle one at the end of its lifetime, and once the
/// flood is over the server answers at once.
#[tokio::test]
async fn a_flood_of_idle_and_slow_clients_is_bounded_and_passes() {
    use tokio::io::AsyncWriteExt;
    let limits = Limits {
        max_connections: 8,
        header_read_timeout: Duration::from_secs(1),
        connection_lifetime: Duration::from_secs(3),
    };
    let server = Server::new(
        "healthz",
        loopback0(),
        Routes::new().route("/healthz", |_| text_response(200, "text/plain", "ok")),
    )
    .limits(limits)
    .spawn()
    .expect("bind");
    let addr = server.local_addr().expect("bound");
    // 4 slowloris clients (a header that never ends), then 60 idle ones.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.expect("write");
        slow.push(c);
    }
    let mut idle = Vec::new();
    for _ in 0..60 {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = 0;
    let mut kept = Vec::new();
    for mut c in idle {
        if closed_within(&mut c, Duration::from_millis(50)).await {
            refused += 1;
        } else {
            kept.push(c);
        }
    }
    assert_eq!(kept.len(), 4, "8 served at once: 4 slow + 4 idle; {refused} closed at once");
    for c in &mut slow {
        assert!(closed_within(c, Duration::from_millis(2500)).await, "a header that never ends is cut");
    }
    for c in &mut kept {
        assert!(closed_within(c, Duration::from_secs(4)).await, "an idle connection ends with its lifetime");
    }
    let started = std::time::Instant::now();
    assert_eq!(get_ok(addr, "/healthz").await.body, "ok");
    assert!(started.elapsed() < Duration::from_secs(1));
}
