//! The actor dashboard in a real browser: the whole IPVS-mode actor system on
//! in-memory kernels (real clock, inside an actix System), the dashboard
//! routes on a loopback HTTP server, a few hundred Service/EndpointSlice
//! changes fed while headless Chromium (driven over WebDriver) shows the
//! page. Checks one panel per actor, live counters, the syncs table, and
//! saves a screenshot to `target/dashboard.png`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/install-deps.sh`);
//! without them the test fails.

#[path = "dashboard/webdriver.rs"]
mod webdriver;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use futures::FutureExt;
use http_body_util::{BodyExt, Empty};
use kube_proxy_rs::actors::coordinator::{AddrSource, Coordinator, RulesRenderer, Settings};
use kube_proxy_rs::actors::wiring::{start_ipvs_actors, IpvsKernels};
use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::config::ProxyMode;
use kube_proxy_rs::fixtures::{annotated, applied_service, applied_slice, deleted_service, ep, service, slice, Ep};
use kube_proxy_rs::health::ProxyHealth;
use kube_proxy_rs::http::dashboard::{coordinator_history, dashboard_routes};
use kube_proxy_rs::http::Server;
use kube_proxy_rs::kernel::mem::{Journal, MemConntrack, MemIpset, MemIptables, MemIpvs, MemLink};
use kube_proxy_rs::metrics::ProxyMetrics;
use kube_proxy_rs::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
use kube_proxy_rs::model::NodeInfo;
use kube_proxy_rs::msgs::{ResourceKind, SourceBatch, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::observe::SyncHooks;
use kube_proxy_rs::plan::context::LocalAddr;
use kube_proxy_rs::plan::iptables::HostFeatures;
use kube_proxy_rs::plan::ipvs::{IpvsPlanner, IpvsSet};
use kube_proxy_rs::settings;
use kube_proxy_rs::stats::StatsRegistry;
use serde::Deserialize;
use webdriver::Browser;

/// Services whose endpoints churn.
const SERVICES: u32 = 30;
/// Time between two changes (~50 changes/s).
const CHURN_EVERY: Duration = Duration::from_millis(20);
/// Churn goes on at least this long, and until the browser checks are done.
const MIN_CHANGES: u32 = 300;

/// Starts the actors and the coordinator, registering their stats in `registry`.
fn start_daemon(registry: &StatsRegistry) -> Addr<Coordinator> {
    let journal = Journal::default();
    let sets: BTreeMap<IpvsSet, MemIpset> =
        IpvsSet::ALL.iter().map(|s| (*s, MemIpset::new(&journal, s.spec(IpFamily::V4)))).collect();
    let kernels = IpvsKernels {
        ipvs: MemIpvs::new(&journal),
        sets,
        link: MemLink::new(&journal),
        iptables: MemIptables::new(&journal),
        conntrack: MemConntrack::new(&journal),
    };
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = "ipvs".into();
    let host = HostFeatures { random_fully: true, ..HostFeatures::default() };
    let derived = settings::derive(&cfg, IpFamily::V4, "node-a", host);
    let settings = Settings {
        plan: derived.plan.clone(),
        min_sync: Duration::from_millis(200),
        max_sync: Duration::from_secs(30),
        burst: 2,
        model_gates: derived.model_gates,
    };
    let addrs: AddrSource = Box::new(|| vec![LocalAddr { ifname: "eth0".into(), ip: [192, 168, 50, 2].into() }]);
    let rules: RulesRenderer = Box::new(move |p: &IpvsPlanner, node: &NodeInfo| p.rules(&derived.rules_config(node)));
    // The daemon's hooks in IPVS mode: they list the Services' own schedulers.
    let metrics = Arc::new(ProxyMetrics::new(ProxyMode::Ipvs, registry.clone()));
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let hooks = SyncHooks::new(IpFamily::V4, metrics, health).with_scheduler_list(registry.clone());
    Coordinator::create(|ctx| {
        let targets = start_ipvs_actors(kernels, registry, ctx.address().recipient());
        Coordinator::new(settings, targets, addrs, rules).with_observer(hooks)
    })
}

fn web_service(i: u32) -> SourceEvent {
    let svc = service("default", &format!("web-{i}"), &format!("10.96.1.{i}"), &[("http", "TCP", 80, 0)]);
    // web-0 chose its own IPVS scheduler.
    let own: &[(&str, &str)] =
        if i == 0 { &[(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "port")] } else { &[] };
    applied_service(annotated(svc, own))
}

/// Service `web-i`'s slice with `n` endpoints, chosen by `seed`.
fn web_slice(i: u32, n: u32, seed: u32) -> SourceEvent {
    let eps: Vec<Ep> = (0..n).map(|k| ep(&format!("10.244.{i}.{}", (seed + k) % 250 + 1), "node-b")).collect();
    applied_slice(slice("default", &format!("web-{i}-1"), &format!("web-{i}"), &[("http", "TCP", 8080)], &eps))
}

/// A UDP service whose endpoint changes bring conntrack reconciles.
fn dns(n: u32) -> Vec<SourceEvent> {
    let svc = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0)]);
    let eps: Vec<Ep> = (0..n).map(|k| ep(&format!("10.244.200.{}", k + 1), "node-b")).collect();
    vec![applied_service(svc), applied_slice(slice("kube-system", "dns-1", "dns", &[("dns", "UDP", 53)], &eps))]
}

/// A NodePort service that comes and goes (ipsets and iptables rules change).
fn node_port(present: bool) -> SourceEvent {
    let svc = service("default", "np", "10.96.2.1", &[("http", "TCP", 80, 30080)]);
    if present {
        applied_service(svc)
    } else {
        deleted_service(svc)
    }
}

fn initial_state() -> Vec<SourceEvent> {
    let mut events = vec![SourceEvent::Synced(ResourceKind::Service), SourceEvent::Synced(ResourceKind::EndpointSlice)];
    for i in 0..SERVICES {
        events.push(web_service(i));
        events.push(web_slice(i, 2, 0));
    }
    events.extend(dns(3));
    events
}

/// One change per tick until `stop` (and at least [`MIN_CHANGES`]); returns
/// how many were sent.
async fn churn(coord: Addr<Coordinator>, stop: Arc<AtomicBool>) -> u32 {
    let mut n = 0u32;
    while n < MIN_CHANGES || !stop.load(Ordering::Relaxed) {
        let event = match n % 20 {
            0 => node_port(n % 40 == 0),
            10 => dns(1 + n % 3).remove(1),
            _ => web_slice(n % SERVICES, 1 + n % 4, n),
        };
        coord.send(SourceBatch(vec![event])).await.expect("coordinator alive");
        n += 1;
        tokio::time::sleep(CHURN_EVERY).await;
    }
    n
}

/// What the page shows (see `dashboard/read_page.js`).
#[derive(Debug, Deserialize)]
struct Page {
    panels: Vec<Panel>,
    syncs: Vec<Vec<String>>,
    schedulers: Vec<Vec<String>>,
    /// The ignored-values tile: the count, and the newest one.
    ignored: [String; 2],
    status: String,
    status_text: String,
    empty: Vec<String>,
    height: u32,
    resources: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Panel {
    name: String,
    depth: Option<String>,
    rate: Option<String>,
    received: Option<String>,
    p50: Option<String>,
    p99: Option<String>,
    errors: Option<String>,
}

/// A displayed number ("1,234", "12.5"); `None` for "–".
fn number(text: &Option<String>) -> Option<f64> {
    let t: String = text.as_deref()?.chars().filter(|c| c.is_ascii_digit() || *c == '.').collect();
    t.parse().ok()
}

impl Page {
    fn panel(&self, name: &str) -> &Panel {
        self.panels.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no panel {name}: {:?}", self.panels))
    }
}

async fn read_page(b: &Browser) -> Page {
    let v = b.execute(include_str!("dashboard/read_page.js")).await.unwrap_or_else(|e| panic!("{e}"));
    let text = v.as_str().unwrap_or_else(|| panic!("read_page.js returned {v}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Reads the page until `ok` holds, for up to `within`.
async fn wait_for(b: &Browser, within: Duration, what: &str, ok: impl Fn(&Page) -> bool) -> Page {
    let deadline = Instant::now() + within;
    loop {
        let page = read_page(b).await;
        if ok(&page) {
            return page;
        }
        assert!(Instant::now() < deadline, "{what} not shown within {within:?}: {page:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every actor of IPVS mode, by its stats name.
fn expected_actors() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = ["ipvs", "dummy-link", "iptables", "conntrack"].map(String::from).into();
    names.extend(IpvsSet::ALL.iter().map(|s| format!("ipset/{}", s.name(IpFamily::V4))));
    names
}

/// GET over loopback: (status, headers we check, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, hyper::HeaderMap, String) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let req = hyper::Request::get(path).header("host", addr.to_string()).body(Empty::<Bytes>::new()).expect("req");
    let resp = sender.send_request(req).await.expect("response");
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("dashboard.png")
}

/// The page's own checks: panels, live numbers, syncs, no outside resources.
async fn check_page(b: &Browser, base: &str) {
    let actors = expected_actors();
    assert_eq!(actors.len(), 21, "ipvs, 17 ipsets, dummy-link, iptables, conntrack");
    let first = wait_for(b, Duration::from_secs(15), "a panel per actor with rates", |p| {
        p.panels.len() == actors.len() && number(&p.panel("ipvs").rate).is_some()
    })
    .await;
    let shown: BTreeSet<String> = first.panels.iter().map(|p| p.name.clone()).collect();
    assert_eq!(shown, actors);
    assert_eq!(first.panels[0].name, "ipvs", "pipeline order");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = read_page(b).await;
    let (ipvs1, ipvs2) = (first.panel("ipvs"), second.panel("ipvs"));
    assert!(number(&ipvs2.received) > number(&ipvs1.received), "ipvs message count did not move: {ipvs1:?} {ipvs2:?}");
    assert!(number(&ipvs2.rate).is_some_and(|r| r > 0.0), "ipvs rate under churn: {ipvs2:?}");
    assert_ne!(first.panels, second.panels, "nothing on the panels changed");
    assert!(number(&ipvs2.p99).is_some() && number(&ipvs2.errors) == Some(0.0), "{ipvs2:?}");
    assert!(number(&ipvs2.depth).is_some(), "{ipvs2:?}");
    assert_eq!(second.status, "live", "{}", second.status_text);
    let page = wait_for(b, Duration::from_secs(10), "three syncs", |p| p.syncs.len() >= 3).await;
    let generations: Vec<f64> = page.syncs.iter().map(|r| number(&r.first().cloned()).unwrap_or(0.0)).collect();
    assert!(generations.windows(2).all(|w| w[0] > w[1]), "newest first: {generations:?}");
    assert!(
        page.syncs.iter().all(|r| r.len() == 6 && (r[1] == "full" || r[1] == "partial" || r[1] == "periodic")),
        "{:?}",
        page.syncs
    );
    assert!(page.resources.iter().all(|r| r.starts_with(base)), "outside resources: {:?}", page.resources);
    assert_eq!(page.schedulers, [["default/web-0:http", "ipv4", "sh", "sh-port"]], "the Services' own schedulers");
    let ignored = wait_for(b, Duration::from_secs(5), "the ignored values", |p| p.ignored[0] == "2").await.ignored;
    assert_eq!(ignored[1], "last: Service default/lb spec.loadBalancerSourceRanges[1]", "{ignored:?}");
}

/// The JSON endpoint and the page's headers, over plain HTTP.
async fn check_http(addr: SocketAddr) {
    let (status, headers, body) = get(addr, "/dashboard/data").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["actors"].as_array().map(Vec::len), Some(21), "{v}");
    assert!(v["actors"][0]["msgs_per_sec"].is_number(), "{v}");
    assert!(v["syncs"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(
        v["schedulers"],
        serde_json::json!([{"service_port": "default/web-0:http", "family": "ipv4", "scheduler": "sh", "flags": "sh-port"}])
    );
    let (status, headers, body) = get(addr, "/dashboard").await;
    assert_eq!(status, 200);
    assert!(headers["content-security-policy"].to_str().is_ok_and(|c| c.contains("default-src 'none'")));
    let urls = body.replace("http://www.w3.org/2000/svg", "");
    assert!(!urls.contains("http://") && !urls.contains("https://"), "the page names an outside URL");
}

/// Before any actor or sync: both empty states; once the daemon is gone:
/// the page says so.
async fn check_empty_then_disconnected(b: &Browser) {
    let no_syncs = || async { Vec::new() }.boxed();
    let routes = dashboard_routes(StatsRegistry::default(), no_syncs);
    let server = Server::new("empty", SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), routes).spawn().expect("server");
    let addr = server.local_addr().expect("bound");
    b.goto(&format!("http://{addr}/dashboard")).await.unwrap_or_else(|e| panic!("{e}"));
    let page = wait_for(b, Duration::from_secs(10), "empty states", |p| p.status == "live").await;
    assert!(page.panels.is_empty() && page.syncs.is_empty() && page.schedulers.is_empty(), "{page:#?}");
    assert!(page.empty.iter().any(|t| t.contains("No actors")), "{:?}", page.empty);
    assert!(page.empty.iter().any(|t| t.contains("No syncs yet")), "{:?}", page.empty);
    drop(server);
    let gone = wait_for(b, Duration::from_secs(10), "the disconnected state", |p| p.status == "stale").await;
    assert!(gone.status_text.contains("disconnected"), "{}", gone.status_text);
}

async fn screenshot(b: &Browser) -> PathBuf {
    let height = read_page(b).await.height;
    b.resize(1280, (height + 120).clamp(600, 4000)).await.unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let png = b.screenshot().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let path = screenshot_path();
    webdriver::save(&path, &png);
    path
}

#[test]
fn the_dashboard_shows_every_actor_live_in_a_browser() {
    let system = actix_rt::System::new();
    system.block_on(async {
        // As in the daemon: the server first, the coordinator after it.
        let registry = StatsRegistry::default();
        let cell = Arc::new(OnceLock::new());
        let routes = dashboard_routes(registry.clone(), coordinator_history(cell.clone()));
        let server = Server::new("dashboard", SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), routes)
            .spawn()
            .expect("dashboard server");
        let addr = server.local_addr().expect("bound");
        let coord = start_daemon(&registry);
        assert!(cell.set(coord.clone().recipient()).is_ok());
        coord.send(SourceBatch(initial_state())).await.expect("coordinator alive");
        // The daemon counts these as its sources' objects arrive (the runtime's fan-out).
        let metrics = ProxyMetrics::new(ProxyMode::Ipvs, registry.clone());
        let field = "spec.loadBalancerSourceRanges";
        for i in 0..2 {
            metrics.value_ignored("Service", "default/lb", field, &format!("{field}[{i}]"), "is not a CIDR");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let churning = actix_rt::spawn(churn(coord.clone(), stop.clone()));

        let browser = Browser::start().await;
        let base = format!("http://{addr}/");
        browser.goto(&format!("{base}dashboard")).await.unwrap_or_else(|e| panic!("{e}\n{}", browser.driver_log()));
        check_page(&browser, &base).await;
        check_http(addr).await;
        let path = screenshot(&browser).await;
        check_empty_then_disconnected(&browser).await;
        browser.close().await;
        stop.store(true, Ordering::Relaxed);
        let changes = churning.await.expect("churn task");
        assert!(changes >= MIN_CHANGES, "{changes} changes");
        println!("dashboard screenshot: {} ({changes} changes fed)", path.display());
    });
}
