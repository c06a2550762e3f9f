//! The dashboard in a real browser, once per mode: IPVS mode (IPv4),
//! iptables mode and nftables mode (both dual-stack), each the mode's whole
//! actor system on in-memory kernels (real clock, inside an actix System)
//! with the daemon's sync hooks, the dashboard routes on a loopback HTTP
//! server, and Service/EndpointSlice changes fed while headless Chromium
//! (driven over WebDriver) shows the page. Each run checks what the
//! screenshot shows: the header's values (mode, node, version, families,
//! Service and endpoint counts, sync health), the actor groups named for
//! the mode, the sync and latency charts drawn per family and the mailbox
//! depth chart, each growing, the sync table's families, and, at 1,400 ×
//! 1,000 and at 390 px, no overlapping boxes, no blank band between boxes,
//! no clipped text and no sideways scrolling; the screenshots are kept as
//! `target/dashboard-<mode>-<width>.png`. The IPVS run also checks the JSON,
//! the page's headers, the Services' own schedulers, the ignored values,
//! and the empty and disconnected states.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/install-deps.sh`);
//! without them the test fails.

#[path = "dashboard/webdriver.rs"]
mod webdriver;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use kube_proxy_rs::actors::coordinator::{
    AddrSource, Coordinator, IptablesDataplane, NftablesDataplane, RulesRenderer,
};
use kube_proxy_rs::actors::wiring::{start_iptables_actors, start_ipvs_actors, start_nftables_actors, IpvsKernels};
use kube_proxy_rs::bench::dual::dual_stack;
use kube_proxy_rs::config::{KubeProxyConfiguration, ProxyMode};
use kube_proxy_rs::fixtures::{annotated, applied_service, applied_slice, deleted_service, ep, service, slice, Ep};
use kube_proxy_rs::health::ProxyHealth;
use kube_proxy_rs::http::dashboard::{dashboard_routes, About};
use kube_proxy_rs::http::Server;
use kube_proxy_rs::kernel::mem::{Journal, MemConntrack, MemIptables, MemNftables};
use kube_proxy_rs::metrics::ProxyMetrics;
use kube_proxy_rs::model::endpoints::ANNOTATION_TRIGGER_TIME;
use kube_proxy_rs::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
use kube_proxy_rs::model::NodeInfo;
use kube_proxy_rs::msgs::{ResourceKind, SourceBatch, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::observe::SyncHooks;
use kube_proxy_rs::plan::context::LocalAddr;
use kube_proxy_rs::plan::iptables::HostFeatures;
use kube_proxy_rs::plan::ipvs::{IpvsPlanner, IpvsSet};
use kube_proxy_rs::proxier::{coordinator_settings, Mode};
use kube_proxy_rs::settings::{self, FamilySettings};
use kube_proxy_rs::stats::StatsRegistry;
use serde::Deserialize;
use webdriver::Browser;

/// Services whose endpoints churn.
const SERVICES: u32 = 30;
/// Time between two changes (~50 changes/s).
const CHURN_EVERY: Duration = Duration::from_millis(20);
/// Churn goes on at least this long, and until the browser checks are done.
const MIN_CHANGES: u32 = 150;
/// The wide layout's viewport, and the phone's width.
const WIDE: (u32, u32) = (1400, 1000);
const PHONE: u32 = 390;
/// The page's own wait: up to this long for what it shows.
const WITHIN: Duration = Duration::from_secs(30);

/// The mode under test and the families it runs.
struct Cluster {
    mode: ProxyMode,
    families: Vec<IpFamily>,
}

impl Cluster {
    fn dual(&self) -> bool {
        self.families.len() > 1
    }

    /// The registry suffix of `family`'s actors (the daemon's).
    fn suffix(&self, family: IpFamily) -> String {
        if family == self.families[0] {
            String::new()
        } else {
            format!(" {}", family.lower())
        }
    }

    /// `events` as the cluster's API server sends them (dual-stack: with
    /// their IPv6 twins).
    fn as_sent(&self, events: Vec<SourceEvent>) -> Vec<SourceEvent> {
        if self.dual() {
            dual_stack(&events)
        } else {
            events
        }
    }
}

/// The node's address of `family`.
fn node_addrs(family: IpFamily) -> AddrSource {
    let ip: IpAddr = match family {
        IpFamily::V4 => [192, 168, 50, 2].into(),
        IpFamily::V6 => "fd00::c0a8:3202".parse().expect("an IPv6 address"),
    };
    Box::new(move || vec![LocalAddr { ifname: "eth0".into(), ip }])
}

/// `family`'s settings, syncing at most every 400 ms.
fn family_settings(cluster: &Cluster, family: IpFamily) -> FamilySettings {
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.mode = cluster.mode.as_str().into();
    let host = HostFeatures { random_fully: true, ..HostFeatures::default() };
    let mut s = settings::derive(&cfg, family, "node-a", host);
    s.min_sync = Duration::from_millis(400);
    s
}

/// Starts one coordinator per family with its actors and the daemon's
/// hooks, registering their stats in `registry`; returns where to send
/// events.
fn start_daemon(
    cluster: &Cluster,
    registry: &StatsRegistry,
    health: &Arc<ProxyHealth>,
    metrics: &Arc<ProxyMetrics>,
) -> Vec<Recipient<SourceBatch>> {
    let mut sinks = Vec::new();
    for family in cluster.families.iter().copied() {
        let hooks = SyncHooks::new(family, metrics.clone(), health.clone(), registry.clone());
        let actors = registry.with_suffix(&cluster.suffix(family));
        let s = family_settings(cluster, family);
        let settings = coordinator_settings(&s);
        let addrs = node_addrs(family);
        let journal = Journal::default();
        let sink = match cluster.mode {
            ProxyMode::Ipvs => {
                let kernels = IpvsKernels::in_memory(&journal, family);
                let rules: RulesRenderer =
                    Box::new(move |p: &IpvsPlanner, node: &NodeInfo| p.rules(&s.rules_config(node)));
                // The daemon's hooks in IPVS mode: they list the Services' own schedulers.
                let hooks = hooks.with_scheduler_list();
                Coordinator::create(|ctx| {
                    let targets = start_ipvs_actors(kernels, &actors, ctx.address().recipient());
                    Coordinator::new(settings, targets, addrs, rules).with_observer(hooks)
                })
                .recipient()
            }
            ProxyMode::Iptables => {
                let context = IptablesDataplane::config(&s);
                let (iptables, conntrack) = (MemIptables::new(&journal), MemConntrack::new(&journal));
                Coordinator::create(|ctx| {
                    let targets = start_iptables_actors(iptables, conntrack, &actors, ctx.address().recipient());
                    let dataplane = IptablesDataplane::new(targets, addrs, context, &[]);
                    Coordinator::with_dataplane(settings, dataplane).with_observer(hooks)
                })
                .recipient()
            }
            ProxyMode::Nftables => {
                let context = NftablesDataplane::config(&s);
                let (nft, conntrack) = (MemNftables::new(&journal), MemConntrack::new(&journal));
                Coordinator::create(|ctx| {
                    let targets = start_nftables_actors(nft, family, conntrack, &actors, ctx.address().recipient());
                    let dataplane = NftablesDataplane::new(family, targets, addrs, context);
                    Coordinator::with_dataplane(settings, dataplane).with_observer(hooks)
                })
                .recipient()
            }
        };
        sinks.push(sink);
    }
    sinks
}

fn web_service(i: u32) -> SourceEvent {
    let svc = service("default", &format!("web-{i}"), &format!("10.96.1.{i}"), &[("http", "TCP", 80, 0)]);
    // web-0 chose its own IPVS scheduler.
    let own: &[(&str, &str)] =
        if i == 0 { &[(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "port")] } else { &[] };
    applied_service(annotated(svc, own))
}

/// Service `web-i`'s slice with `n` endpoints, chosen by `seed`, changed now
/// (its trigger time, for the network programming latency).
fn web_slice(i: u32, n: u32, seed: u32) -> SourceEvent {
    let eps: Vec<Ep> = (0..n).map(|k| ep(&format!("10.244.{i}.{}", (seed + k) % 250 + 1), "node-b")).collect();
    let mut s = slice("default", &format!("web-{i}-1"), &format!("web-{i}"), &[("http", "TCP", 8080)], &eps);
    let now = jiff::Timestamp::try_from(SystemTime::now()).expect("a timestamp").to_string();
    s.metadata.annotations = Some([(ANNOTATION_TRIGGER_TIME.to_string(), now)].into());
    applied_slice(s)
}

/// A UDP service, IPv4 only, whose endpoint changes bring conntrack reconciles.
fn dns(n: u32) -> Vec<SourceEvent> {
    let svc = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0)]);
    let eps: Vec<Ep> = (0..n).map(|k| ep(&format!("10.244.200.{}", k + 1), "node-b")).collect();
    vec![applied_service(svc), applied_slice(slice("kube-system", "dns-1", "dns", &[("dns", "UDP", 53)], &eps))]
}

/// A NodePort service without endpoints that comes and goes.
fn node_port(present: bool) -> SourceEvent {
    let svc = service("default", "np", "10.96.2.1", &[("http", "TCP", 80, 30080)]);
    if present {
        applied_service(svc)
    } else {
        deleted_service(svc)
    }
}

/// Every web Service with two endpoints, dns with three, the NodePort
/// Service present: what the header counts once churn stops.
fn settled(cluster: &Cluster) -> Vec<SourceEvent> {
    let mut web = vec![node_port(true)];
    for i in 0..SERVICES {
        web.push(web_service(i));
        web.push(web_slice(i, 2, 0));
    }
    let mut events = cluster.as_sent(web);
    events.extend(dns(3));
    events
}

/// The header's (Services, endpoints) for [`settled`]: per family, dns is
/// IPv4's only.
fn settled_counts(cluster: &Cluster) -> (String, String) {
    let web = SERVICES + 1;
    let counts: Vec<(IpFamily, u32, u32)> = cluster
        .families
        .iter()
        .map(|f| match f {
            IpFamily::V4 => (*f, web + 1, 2 * SERVICES + 3),
            IpFamily::V6 => (*f, web, 2 * SERVICES),
        })
        .collect();
    if !cluster.dual() {
        return (counts[0].1.to_string(), counts[0].2.to_string());
    }
    let line = |pick: fn(&(IpFamily, u32, u32)) -> u32| {
        let parts: Vec<String> = counts.iter().map(|c| format!("{} {}", family_label(c.0), pick(c))).collect();
        parts.join(" · ")
    };
    (line(|c| c.1), line(|c| c.2))
}

fn family_label(f: IpFamily) -> &'static str {
    kube_proxy_rs::net::ip_family_label(f)
}

/// Sends `events` to every family's coordinator.
async fn send(sinks: &[Recipient<SourceBatch>], events: Vec<SourceEvent>) {
    for s in sinks {
        s.send(SourceBatch(events.clone())).await.expect("coordinator alive");
    }
}

/// One change per tick until `stop` (and at least [`MIN_CHANGES`]), then
/// the settled state; returns how many changes were sent.
async fn churn(cluster: Arc<Cluster>, sinks: Arc<Vec<Recipient<SourceBatch>>>, stop: Arc<AtomicBool>) -> u32 {
    let mut n = 0u32;
    while n < MIN_CHANGES || !stop.load(Ordering::Relaxed) {
        let event = match n % 20 {
            0 => cluster.as_sent(vec![node_port(n % 40 == 0)]),
            10 => vec![dns(1 + n % 3).remove(1)],
            _ => cluster.as_sent(vec![web_slice(n % SERVICES, 1 + n % 4, n)]),
        };
        send(&sinks, event).await;
        n += 1;
        tokio::time::sleep(CHURN_EVERY).await;
    }
    send(&sinks, settled(&cluster)).await;
    n
}

/// What the page shows (see `dashboard/read_page.js`).
#[derive(Debug, Deserialize)]
struct Page {
    facts: BTreeMap<String, String>,
    groups: Vec<String>,
    panels: Vec<Panel>,
    syncs: Vec<Vec<String>>,
    schedulers: Vec<Vec<String>>,
    /// Chart → series → points drawn.
    charts: BTreeMap<String, BTreeMap<String, usize>>,
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

/// What `dashboard/layout.js` finds wrong with the layout.
#[derive(Debug, Deserialize)]
struct Layout {
    viewport: [f64; 2],
    page_width: f64,
    boxes: usize,
    overlaps: Vec<String>,
    holes: Vec<String>,
    clipped: Vec<String>,
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

    fn fact(&self, name: &str) -> &str {
        self.facts.get(name).map(String::as_str).unwrap_or_else(|| panic!("no fact {name}: {:?}", self.facts))
    }

    /// Points drawn in `chart`'s line of `series` (0 if none).
    fn points(&self, chart: &str, series: &str) -> usize {
        self.charts.get(chart).and_then(|c| c.get(series)).copied().unwrap_or(0)
    }
}

async fn run_script<T: serde::de::DeserializeOwned>(b: &Browser, script: &str) -> T {
    let v = b.execute(script).await.unwrap_or_else(|e| panic!("{e}"));
    let text = v.as_str().unwrap_or_else(|| panic!("the script returned {v}"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

async fn read_page(b: &Browser) -> Page {
    run_script(b, include_str!("dashboard/read_page.js")).await
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

/// Every actor of `cluster`'s mode, by its stats name.
fn expected_actors(cluster: &Cluster) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for family in &cluster.families {
        let suffix = cluster.suffix(*family);
        let kinds: Vec<String> = match cluster.mode {
            ProxyMode::Ipvs => {
                let mut k: Vec<String> = ["ipvs", "dummy-link", "iptables", "conntrack"].map(String::from).into();
                k.extend(IpvsSet::ALL.iter().map(|s| format!("ipset/{}", s.name(*family))));
                k
            }
            ProxyMode::Iptables => vec!["iptables".into(), "conntrack".into()],
            ProxyMode::Nftables => vec!["nftables".into(), "conntrack".into()],
        };
        names.extend(kinds.into_iter().map(|k| format!("{k}{suffix}")));
    }
    names
}

/// The group headings the page shows for `cluster` (with their member counts).
fn expected_groups(cluster: &Cluster) -> Vec<String> {
    let per_family: Vec<(&str, usize)> = match cluster.mode {
        ProxyMode::Ipvs => {
            vec![("IPVS mode{f}: IPVS, kube-ipvs0, iptables, conntrack", 4), ("IPVS mode{f}: ipsets", 17)]
        }
        ProxyMode::Iptables => vec![("iptables mode{f}: iptables, conntrack", 2)],
        ProxyMode::Nftables => vec![("nftables mode{f}: nftables, conntrack", 2)],
    };
    let mut out = Vec::new();
    for family in &cluster.families {
        let f = if cluster.dual() { format!(", {}", family_label(*family)) } else { String::new() };
        out.extend(per_family.iter().map(|(title, n)| format!("{} ({n})", title.replace("{f}", &f))));
    }
    out
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

fn screenshot_path(mode: ProxyMode, width: u32) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join(format!("dashboard-{}-{width}.png", mode.as_str()))
}

/// The header: what runs, and the counts once churn settled.
fn check_header(page: &Page, cluster: &Cluster) {
    assert_eq!(page.fact("mode"), cluster.mode.as_str());
    assert_eq!(page.fact("node"), "node-a");
    assert_eq!(page.fact("version"), env!("CARGO_PKG_VERSION"));
    let families: Vec<&str> = cluster.families.iter().map(|f| family_label(*f)).collect();
    assert_eq!(page.fact("families"), families.join(", "));
    assert!(page.fact("health").starts_with("healthy"), "{:?}", page.facts);
    assert_eq!(page.groups, expected_groups(cluster), "groups named for the mode");
}

/// Panels, live numbers, charts and syncs while the changes churn.
async fn check_live(b: &Browser, cluster: &Cluster) {
    let actors = expected_actors(cluster);
    // The first actor a sync reaches is named for the mode.
    let first_actor = cluster.mode.as_str().to_string();
    let families: Vec<&str> = cluster.families.iter().map(|f| family_label(*f)).collect();
    let first = wait_for(b, WITHIN, "a panel per actor with rates, and every chart drawn", |p| {
        p.panels.len() == actors.len()
            && number(&p.panel(&first_actor).rate).is_some()
            && families.iter().all(|f| p.points("sync", f) >= 2 && p.points("latency", f) >= 2)
            && p.charts.get("depth").is_some_and(|d| d.values().all(|n| *n >= 2))
    })
    .await;
    check_header(&first, cluster);
    let shown: BTreeSet<String> = first.panels.iter().map(|p| p.name.clone()).collect();
    assert_eq!(shown, actors);
    assert_eq!(first.panels[0].name, first_actor, "pipeline order");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = read_page(b).await;
    let (a1, a2) = (first.panel(&first_actor), second.panel(&first_actor));
    assert!(number(&a2.received) > number(&a1.received), "{first_actor}'s message count did not move: {a1:?} {a2:?}");
    assert!(number(&a2.rate).is_some_and(|r| r > 0.0), "{first_actor}'s rate under churn: {a2:?}");
    assert!(number(&a2.p99).is_some() && number(&a2.errors) == Some(0.0), "{a2:?}");
    assert!(number(&a2.depth).is_some(), "{a2:?}");
    assert_eq!(second.status, "live", "{}", second.status_text);
    for chart in ["sync", "latency", "depth"] {
        let (before, after) = (&first.charts[chart], &second.charts[chart]);
        assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>(), "{chart}'s series");
        for (series, n) in after {
            assert!(*n > before[series], "{chart} {series} did not grow: {} → {n}", before[series]);
        }
    }
    let mut depth_series: Vec<&String> = second.charts["depth"].keys().collect();
    depth_series.sort();
    assert_eq!(depth_series.len(), expected_groups(cluster).len(), "a depth line per group: {depth_series:?}");
    let generations: Vec<(String, f64)> =
        second.syncs.iter().map(|r| (r[0].clone(), number(&r.get(1).cloned()).unwrap_or(0.0))).collect();
    for family in &families {
        let mine: Vec<f64> = generations.iter().filter(|(f, _)| f == family).map(|(_, g)| *g).collect();
        assert!(mine.len() >= 2, "{family}'s syncs in the table: {generations:?}");
        assert!(mine.windows(2).all(|w| w[0] > w[1]), "newest first: {mine:?}");
    }
    assert!(
        second.syncs.iter().all(|r| r.len() == 7 && ["full", "partial", "periodic"].contains(&r[2].as_str())),
        "{:?}",
        second.syncs
    );
}

/// The layout at the window's current size: no overlaps, holes, clipped
/// text or sideways scrolling; returns what it measured.
async fn check_layout(b: &Browser, width: u32, what: &str) -> Layout {
    let layout: Layout = run_script(b, include_str!("dashboard/layout.js")).await;
    assert_eq!(layout.viewport[0], f64::from(width), "{what}: the viewport's width");
    assert!(layout.boxes > 20, "{what}: {layout:?}");
    assert!(layout.page_width <= f64::from(width), "{what}: the page scrolls sideways: {layout:?}");
    assert!(layout.overlaps.is_empty(), "{what}: boxes overlap: {:#?}", layout.overlaps);
    assert!(layout.holes.is_empty(), "{what}: blank bands: {:#?}", layout.holes);
    assert!(layout.clipped.is_empty(), "{what}: clipped text: {:#?}", layout.clipped);
    layout
}

/// Resizes to `width` × `height`, letting the page lay itself out again.
async fn resize(b: &Browser, width: u32, height: u32) {
    b.resize(width, height).await.unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// At `width` × `height`, then with the whole page in view: checks the
/// layout and keeps the screenshot of the whole page.
async fn check_and_screenshot(b: &Browser, mode: ProxyMode, width: u32, height: u32) -> PathBuf {
    resize(b, width, height).await;
    let first = check_layout(b, width, &format!("{width} × {height}")).await;
    // The window's height includes the browser's own bars; the page gets the viewport's.
    let bars = f64::from(height) - first.viewport[1];
    let full = f64::from(read_page(b).await.height) + bars.max(0.0);
    resize(b, width, (full.ceil() as u32).clamp(height, 9000)).await;
    let whole = check_layout(b, width, &format!("{width} px, the whole page")).await;
    let shown = read_page(b).await.height;
    assert!(whole.viewport[1] >= f64::from(shown), "{width} px: the screenshot cuts the page: {whole:?}, {shown} px");
    let png = b.screenshot().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let path = screenshot_path(mode, width);
    webdriver::save(&path, &png);
    path
}

/// The JSON endpoint and the page's headers, over plain HTTP.
async fn check_http(addr: SocketAddr, actors: usize) {
    let (status, headers, body) = get(addr, "/dashboard/data").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(v["actors"].as_array().map(Vec::len), Some(actors), "{v}");
    assert!(v["actors"][0]["msgs_per_sec"].is_number(), "{v}");
    assert!(v["syncs"].as_array().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(v["about"]["mode"], "ipvs");
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

/// IPVS mode's extras: the own schedulers, the ignored values, no outside resources.
async fn check_ipvs_extras(b: &Browser, base: &str) {
    let page = wait_for(b, WITHIN, "the ignored values", |p| p.ignored[0] == "2").await;
    assert_eq!(page.ignored[1], "last: Service default/lb spec.loadBalancerSourceRanges[1]", "{:?}", page.ignored);
    assert_eq!(page.schedulers, [["default/web-0:http", "ipv4", "sh", "sh-port"]], "the Services' own schedulers");
    assert!(page.resources.iter().all(|r| r.starts_with(base)), "outside resources: {:?}", page.resources);
}

/// Before any actor or sync: the empty states; once the daemon is gone:
/// the page says so.
async fn check_empty_then_disconnected(b: &Browser) {
    let about = About { mode: ProxyMode::Iptables, node: "node-a".into(), families: vec![IpFamily::V4] };
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let routes = dashboard_routes(about, StatsRegistry::default(), health);
    let server = Server::new("empty", SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), routes).spawn().expect("server");
    let addr = server.local_addr().expect("bound");
    b.goto(&format!("http://{addr}/dashboard")).await.unwrap_or_else(|e| panic!("{e}"));
    let page = wait_for(b, Duration::from_secs(10), "empty states", |p| p.status == "live").await;
    assert!(page.panels.is_empty() && page.syncs.is_empty() && page.schedulers.is_empty(), "{page:#?}");
    assert!(page.empty.iter().any(|t| t.contains("No actors")), "{:?}", page.empty);
    assert!(page.empty.iter().any(|t| t.contains("No syncs yet")), "{:?}", page.empty);
    assert_eq!((page.fact("services"), page.fact("endpoints")), ("–", "–"), "nothing synced yet");
    drop(server);
    let gone = wait_for(b, Duration::from_secs(10), "the disconnected state", |p| p.status == "stale").await;
    assert!(gone.status_text.contains("disconnected"), "{}", gone.status_text);
}

/// Runs `cluster` under churn with the dashboard open in a browser, checks
/// it live, then settled, at both widths, and keeps the screenshots.
fn run(cluster: Cluster) {
    let system = actix_rt::System::new();
    system.block_on(async move {
        let cluster = Arc::new(cluster);
        // As in the daemon: the servers first, the coordinators after them.
        let registry = StatsRegistry::default();
        let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
        let metrics = Arc::new(ProxyMetrics::new(cluster.mode, registry.clone()));
        let about = About { mode: cluster.mode, node: "node-a".into(), families: cluster.families.clone() };
        let routes = dashboard_routes(about, registry.clone(), health.clone());
        let server = Server::new("dashboard", SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), routes)
            .spawn()
            .expect("dashboard server");
        let addr = server.local_addr().expect("bound");
        let sinks = Arc::new(start_daemon(&cluster, &registry, &health, &metrics));
        let mut initial =
            vec![SourceEvent::Synced(ResourceKind::Service), SourceEvent::Synced(ResourceKind::EndpointSlice)];
        initial.extend(settled(&cluster));
        send(&sinks, initial).await;
        // The daemon counts these as its sources' objects arrive (the runtime's fan-out).
        let field = "spec.loadBalancerSourceRanges";
        for i in 0..2 {
            metrics.value_ignored("Service", "default/lb", field, &format!("{field}[{i}]"), "is not a CIDR");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let churning = actix_rt::spawn(churn(cluster.clone(), sinks.clone(), stop.clone()));

        let browser = Browser::start().await;
        resize(&browser, WIDE.0, WIDE.1).await;
        let base = format!("http://{addr}/");
        browser.goto(&format!("{base}dashboard")).await.unwrap_or_else(|e| panic!("{e}\n{}", browser.driver_log()));
        check_live(&browser, &cluster).await;
        if cluster.mode == ProxyMode::Ipvs {
            check_ipvs_extras(&browser, &base).await;
            check_http(addr, expected_actors(&cluster).len()).await;
        }
        stop.store(true, Ordering::Relaxed);
        let changes = churning.await.expect("churn task");
        assert!(changes >= MIN_CHANGES, "{changes} changes");
        let (services, endpoints) = settled_counts(&cluster);
        let page = wait_for(&browser, WITHIN, "the settled counts", |p| {
            p.fact("services") == services && p.fact("endpoints") == endpoints
        })
        .await;
        check_header(&page, &cluster);
        let wide = check_and_screenshot(&browser, cluster.mode, WIDE.0, WIDE.1).await;
        let phone = check_and_screenshot(&browser, cluster.mode, PHONE, 800).await;
        if cluster.mode == ProxyMode::Ipvs {
            check_empty_then_disconnected(&browser).await;
        }
        browser.close().await;
        println!("dashboard screenshots: {} and {} ({changes} changes fed)", wide.display(), phone.display());
    });
}

#[test]
fn the_dashboard_shows_ipvs_mode_live_in_a_browser() {
    run(Cluster { mode: ProxyMode::Ipvs, families: vec![IpFamily::V4] });
}

#[test]
fn the_dashboard_shows_dual_stack_iptables_mode_live_in_a_browser() {
    run(Cluster { mode: ProxyMode::Iptables, families: vec![IpFamily::V4, IpFamily::V6] });
}

#[test]
fn the_dashboard_shows_dual_stack_nftables_mode_live_in_a_browser() {
    run(Cluster { mode: ProxyMode::Nftables, families: vec![IpFamily::V4, IpFamily::V6] });
}
