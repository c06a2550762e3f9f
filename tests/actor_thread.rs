//! The thread the actors share is never held by a kernel read: on a
//! dual-stack node both families' proxiers and the metrics server run on
//! one actix thread, and a read that takes seconds (the iptables handle's
//! listing of a 134,000-chain table) runs on tokio's blocking pool, as the
//! real handles' reads do ([`kube_proxy_rs::kernel::blocking::off_thread`]).
//! Meanwhile `/metrics` answers and the other family syncs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use kube_proxy_rs::actors::coordinator::{
    AddrSource, ContextBuilder, Coordinator, GetSyncHistory, IptablesDataplane, Settings, SyncRecord,
};
use kube_proxy_rs::actors::wiring::start_iptables_actors;
use kube_proxy_rs::config::{KubeProxyConfiguration, ProxyMode};
use kube_proxy_rs::fixtures::{applied_service, applied_slice, ep, iptables_settings, service, slice};
use kube_proxy_rs::health::ProxyHealth;
use kube_proxy_rs::http::{self, Configz, Server};
use kube_proxy_rs::kernel::mem::{Journal, MemConntrack, MemIptables};
use kube_proxy_rs::metrics::ProxyMetrics;
use kube_proxy_rs::msgs::{ResourceKind, SourceBatch, SourceEvent};
use kube_proxy_rs::net::IpFamily;
use kube_proxy_rs::observe::SyncHooks;
use kube_proxy_rs::plan::context::{NodePortFilter, PlanSettings};
use kube_proxy_rs::plan::iptables::iptables_context;
use kube_proxy_rs::stats::StatsRegistry;

/// How long the IPv4 proxier's full sync reads the tables.
const SLOW_READ: Duration = Duration::from_secs(3);

/// One family's iptables proxier over in-memory kernels, observed by `metrics`.
fn proxier(
    family: IpFamily,
    iptables: &MemIptables,
    metrics: &Arc<ProxyMetrics>,
) -> Addr<Coordinator<IptablesDataplane>> {
    let ipt = iptables_settings(family, "node-a", NodePortFilter::All);
    let context: ContextBuilder = Box::new(move |node, addrs| iptables_context(&ipt, node, addrs));
    let addrs: AddrSource = Box::new(Vec::new);
    let plan =
        PlanSettings { family, node_name: "node-a".into(), scheduler: String::new(), node_ports: NodePortFilter::All };
    let settings = Settings {
        plan,
        min_sync: Duration::ZERO,
        max_sync: Duration::from_secs(30),
        burst: 2,
        model_gates: Default::default(),
    };
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(120)));
    let registry = StatsRegistry::default();
    let hooks = SyncHooks::new(family, metrics.clone(), health, registry.clone());
    let (iptables, conntrack) = (iptables.clone(), MemConntrack::new(&iptables.journal));
    Coordinator::create(move |ctx| {
        let targets = start_iptables_actors(iptables, conntrack, &registry, ctx.address().recipient());
        Coordinator::with_dataplane(settings, IptablesDataplane::new(targets, addrs, context, &[])).with_observer(hooks)
    })
}

/// A ClusterIP service `web` at `ip` with one endpoint, and the sources' synced markers.
fn web(ip: &str, endpoint: &str, address_type: &str) -> Vec<SourceEvent> {
    let mut eps = slice("default", "web-1", "web", &[("http", "TCP", 8080)], &[ep(endpoint, "node-b")]);
    eps.address_type = address_type.into();
    vec![
        SourceEvent::Synced(ResourceKind::Service),
        SourceEvent::Synced(ResourceKind::EndpointSlice),
        applied_service(service("default", "web", ip, &[("http", "TCP", 80, 0)])),
        applied_slice(eps),
    ]
}

/// `GET /metrics` from a thread of its own: the status line and how long it took.
fn scrape(addr: SocketAddr) -> (String, Duration) {
    let started = Instant::now();
    let mut conn = TcpStream::connect(addr).expect("connect to the metrics server");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").expect("send");
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    (answer.lines().next().unwrap_or_default().to_string(), started.elapsed())
}

async fn syncs(c: &Addr<Coordinator<IptablesDataplane>>) -> Vec<SyncRecord> {
    c.send(GetSyncHistory).await.expect("coordinator alive")
}

/// Waits (polling, at most `limit`) for `done` to hold.
async fn wait_until(limit: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[test]
fn a_read_that_takes_seconds_stalls_neither_metrics_nor_the_other_familys_syncs() {
    actix_rt::System::new().block_on(async {
        let journal = Journal::default();
        let (v4, v6) = (MemIptables::new(&journal), MemIptables::new(&Journal::default()));
        v4.slow_reads(SLOW_READ);
        let metrics = Arc::new(ProxyMetrics::new(ProxyMode::Iptables, StatsRegistry::default()));
        let configz = Configz::new(&KubeProxyConfiguration::with_defaults());
        let routes = http::metrics_routes(metrics.clone(), ProxyMode::Iptables, configz);
        let server = Server::new("metrics", "127.0.0.1:0".parse().expect("an address"), routes).spawn();
        let server = server.expect("the metrics server");
        let addr = server.local_addr().expect("bound");
        let (c4, c6) = (proxier(IpFamily::V4, &v4, &metrics), proxier(IpFamily::V6, &v6, &metrics));

        // The IPv4 proxier's first (full) sync starts reading the tables.
        c4.send(SourceBatch(web("10.96.0.20", "10.244.1.1", "IPv4"))).await.expect("coordinator alive");
        let reading = wait_until(SLOW_READ / 3, async || journal.pos("iptables read started").is_some()).await;
        assert!(reading, "the IPv4 full sync reads the tables: {:?}", journal.lines());
        let read_started = Instant::now();

        // Meanwhile: the IPv6 proxier syncs, and /metrics answers.
        c6.send(SourceBatch(web("fd00::20", "fd00:244::1", "IPv6"))).await.expect("coordinator alive");
        let v6_synced = wait_until(SLOW_READ / 3, async || !syncs(&c6).await.is_empty()).await;
        let v6_took = read_started.elapsed();
        assert!(journal.pos("iptables read done").is_none(), "the IPv4 read ended before the IPv6 sync");
        assert!(v6_synced, "the IPv6 proxier synced within {v6_took:?} of the IPv4 read's start");
        assert_eq!(v6.restores.lock().expect("restores").len(), 1, "the IPv6 rules written");
        let (tx, scraped) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || tx.send(scrape(addr)));
        let (status, scrape_took) = scraped.await.expect("the scraping thread");
        assert!(journal.pos("iptables read done").is_none(), "the IPv4 read ended before the scrape");
        assert_eq!(status, "HTTP/1.1 200 OK", "took {scrape_took:?}");
        assert!(scrape_took < SLOW_READ / 3, "/metrics took {scrape_took:?}");

        // The IPv4 sync completes once its read is done.
        let v4_synced = wait_until(SLOW_READ * 2, async || !syncs(&c4).await.is_empty()).await;
        assert!(v4_synced && read_started.elapsed() >= SLOW_READ * 9 / 10, "{:?}", journal.lines());
        assert_eq!(v4.restores.lock().expect("restores").len(), 1, "the IPv4 rules written after the read");
        System::current().stop();
    });
}
