//! The Kubernetes API source against an in-process API server: the real
//! kube-rs watchers, through `actors::source::kube::run`, turned into the
//! same events the manifest source emits.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::Resource;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::task::JoinHandle;

use common::apiserver::selector::{FieldSelector, LabelSelector};
use common::apiserver::{ApiServer, Kind, StoreError};
use kube_proxy_rs::actors::source::kube::{self as source, SERVICE_LABEL_SELECTOR};
use kube_proxy_rs::config::ProxyMode;
use kube_proxy_rs::metrics::ProxyMetrics;
use kube_proxy_rs::msgs::source::{Change, SourceBatch, SourceEvent};
use kube_proxy_rs::stats::StatsRegistry;
use serde_json::{json, Value};

const NODE: &str = "node-a";
/// How long anything may take before a test fails.
const PATIENCE: Duration = Duration::from_secs(15);

fn meta(namespace: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        labels: Some(labels).filter(|l| !l.is_empty()),
        ..ObjectMeta::default()
    }
}

fn service(name: &str, cluster_ip: &str, labels: &[(&str, &str)]) -> Service {
    let port = ServicePort { port: 80, protocol: Some("TCP".into()), ..ServicePort::default() };
    let spec = ServiceSpec { cluster_ip: Some(cluster_ip.into()), ports: Some(vec![port]), ..ServiceSpec::default() };
    Service { metadata: meta(Some("default"), name, labels), spec: Some(spec), ..Service::default() }
}

fn slice(name: &str, service: &str, labels: &[(&str, &str)]) -> EndpointSlice {
    let mut all = vec![("kubernetes.io/service-name", service)];
    all.extend_from_slice(labels);
    EndpointSlice {
        metadata: meta(Some("default"), name, &all),
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint { addresses: vec!["10.244.0.5".into()], ..Endpoint::default() }],
        ports: None,
    }
}

fn node(name: &str) -> Node {
    Node { metadata: meta(None, name, &[]), ..Node::default() }
}

fn service_cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
    let spec = ServiceCIDRSpec { cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()) };
    ServiceCIDR { metadata: meta(None, name, &[]), spec: Some(spec), status: None }
}

/// `applied Service default/web`, `deleted Node node-a`, `synced Service`.
fn line(event: &SourceEvent) -> String {
    fn change<K: Resource>(kind: &str, change: &Change<K>) -> String {
        let (verb, object) = match change {
            Change::Applied(o) => ("applied", o.as_ref()),
            Change::Deleted(o) => ("deleted", o.as_ref()),
        };
        let meta = object.meta();
        let name = meta.name.clone().unwrap_or_default();
        match &meta.namespace {
            Some(ns) => format!("{verb} {kind} {ns}/{name}"),
            None => format!("{verb} {kind} {name}"),
        }
    }
    match event {
        SourceEvent::Service(c) => change("Service", c),
        SourceEvent::EndpointSlice(c) => change("EndpointSlice", c),
        SourceEvent::Node(c) => change("Node", c),
        SourceEvent::ServiceCidr(c) => change("ServiceCIDR", c),
        SourceEvent::Synced(kind) => format!("synced {kind}"),
    }
}

const SYNCED: [&str; 4] = ["synced Service", "synced EndpointSlice", "synced Node", "synced ServiceCIDR"];

/// The source under test, running against a server, its batches collected.
struct Source {
    batches: UnboundedReceiver<SourceBatch>,
    task: JoinHandle<()>,
    metrics: Arc<ProxyMetrics>,
    registry: StatsRegistry,
}

impl Source {
    fn start(server: &ApiServer) -> Source {
        let (tx, batches) = unbounded_channel();
        let sink = move |batch| {
            let _ = tx.send(batch);
        };
        let registry = StatsRegistry::default();
        let metrics = Arc::new(ProxyMetrics::new(ProxyMode::Iptables, registry.clone()));
        let task = tokio::spawn(source::run(server.client(), NODE.into(), metrics.clone(), sink));
        Source { batches, task, metrics, registry }
    }

    /// The refusals the dashboard lists: `Kind ns/name reason: detail`, newest first.
    fn listed_refusals(&self) -> Vec<String> {
        let list = self.registry.refusals();
        list.iter().map(|r| format!("{} {} {}: {}", r.kind, r.object, r.reason, r.detail)).collect()
    }

    /// `kube_proxy_rs_source_objects_refused_total{kind=...}`.
    fn refused(&self, kind: &str) -> Option<u64> {
        let prefix = format!("kube_proxy_rs_source_objects_refused_total{{kind=\"{kind}\"}} ");
        let text = self.metrics.encode_text();
        text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|n| n.parse().ok())
    }

    /// Starts and waits for the first list of every kind; its lines.
    async fn synced(server: &ApiServer) -> (Source, Vec<String>) {
        let mut source = Source::start(server);
        let lines = source.until(&SYNCED).await;
        (source, lines)
    }

    /// Receives batches until every `expected` line was seen; all lines received.
    async fn until(&mut self, expected: &[&str]) -> Vec<String> {
        let mut lines = Vec::new();
        let missing = |lines: &[String]| expected.iter().filter(|e| !lines.iter().any(|l| l == *e)).count();
        while missing(&lines) > 0 {
            let batch = tokio::time::timeout(PATIENCE, self.batches.recv()).await;
            let Ok(Some(SourceBatch(events))) = batch else {
                panic!("still waiting for {expected:?}; got {lines:?}");
            };
            lines.extend(events.iter().map(line));
        }
        lines
    }

    /// The lines of every batch already sent.
    fn pending(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(SourceBatch(events)) = self.batches.try_recv() {
            lines.extend(events.iter().map(line));
        }
        lines
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watched kinds, by the path their requests use.
const PATHS: [&str; 4] = [
    "/api/v1/services?",
    "/apis/discovery.k8s.io/v1/endpointslices?",
    "/api/v1/nodes?",
    "/apis/networking.k8s.io/v1/servicecidrs?",
];

fn is_watch(request: &str) -> bool {
    request.contains("watch=true")
}

/// Polls `condition` until it holds.
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every kind is watching again after request number `since`, having
/// listed first if `relisted`. Once a kind's new watch request is seen, its
/// relist (if any) has been handed to the sink.
async fn wait_watching_again(server: &ApiServer, since: usize, relisted: bool) {
    wait_until("every kind watches again", || {
        let requests = server.requests().split_off(since);
        PATHS.iter().all(|path| {
            let of_kind: Vec<&String> = requests.iter().filter(|r| r.contains(path)).collect();
            let first_list = of_kind.iter().position(|r| !is_watch(r));
            let watch_after = |from: usize| of_kind[from..].iter().any(|r| is_watch(r));
            match (relisted, first_list) {
                (true, Some(list)) => watch_after(list + 1),
                (true, None) => false,
                (false, _) => watch_after(0),
            }
        })
    })
    .await;
}

fn lists_since(server: &ApiServer, since: usize) -> Vec<String> {
    server.requests().split_off(since).into_iter().filter(|r| !is_watch(r)).collect()
}

fn sorted(lines: Vec<String>) -> Vec<String> {
    lines.into_iter().collect::<BTreeSet<_>>().into_iter().collect()
}

async fn cluster() -> ApiServer {
    let server = ApiServer::start().await;
    server.create(&service("web", "10.96.0.10", &[])).unwrap();
    server.create(&service("db", "10.96.0.11", &[])).unwrap();
    server.create(&slice("web-abc", "web", &[])).unwrap();
    server.create(&node(NODE)).unwrap();
    server.create(&node("node-b")).unwrap();
    server.create(&service_cidr("kubernetes", &["10.96.0.0/16"])).unwrap();
    server
}

/// What the source emits for [`cluster`]'s initial list, sorted.
const INITIAL_LIST: [&str; 9] = [
    "applied EndpointSlice default/web-abc",
    "applied Node node-a",
    "applied Service default/db",
    "applied Service default/web",
    "applied ServiceCIDR kubernetes",
    "synced EndpointSlice",
    "synced Node",
    "synced Service",
    "synced ServiceCIDR",
];

#[tokio::test]
async fn the_initial_list_emits_every_object_then_synced_for_each_kind() {
    let server = cluster().await;
    let (_source, lines) = Source::synced(&server).await;
    let expected = INITIAL_LIST;
    assert_eq!(sorted(lines.clone()), expected);
    // Within a kind, objects come before its Synced.
    let pos = |l: &str| lines.iter().position(|x| x == l).unwrap();
    assert!(pos("applied Service default/web") < pos("synced Service"));
    assert!(pos("applied Node node-a") < pos("synced Node"));
}

#[tokio::test]
async fn an_empty_cluster_is_synced() {
    let server = ApiServer::start().await;
    let (_source, lines) = Source::synced(&server).await;
    assert_eq!(sorted(lines), sorted(SYNCED.map(String::from).to_vec()));
}

#[tokio::test]
async fn creates_updates_and_deletes_flow_through() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    server.create(&service("new", "10.96.0.12", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/new"]).await, ["applied Service default/new"]);
    let rv = server.update(&service("new", "10.96.0.13", &[])).unwrap();
    let batch = tokio::time::timeout(PATIENCE, source.batches.recv()).await.unwrap().unwrap();
    let [SourceEvent::Service(Change::Applied(updated))] = &batch.0[..] else {
        panic!("{:?}", batch.0.iter().map(line).collect::<Vec<_>>());
    };
    assert_eq!(updated.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()), Some("10.96.0.13"));
    assert_eq!(updated.metadata.resource_version, Some(rv.to_string()));
    server.delete(&service("new", "", &[])).unwrap();
    assert_eq!(source.until(&["deleted Service default/new"]).await, ["deleted Service default/new"]);
    server.create(&slice("web-def", "web", &[])).unwrap();
    server.delete(&slice("web-abc", "web", &[])).unwrap();
    let lines = source.until(&["applied EndpointSlice default/web-def", "deleted EndpointSlice default/web-abc"]).await;
    assert_eq!(lines.len(), 2, "{lines:?}");
}

#[tokio::test]
async fn services_of_other_proxies_and_headless_ones_never_appear() {
    let server = cluster().await;
    let proxy_name = [("service.kubernetes.io/service-proxy-name", "other")];
    let headless = [("service.kubernetes.io/headless", "")];
    server.create(&service("other", "10.96.0.20", &proxy_name)).unwrap();
    server.create(&service("headless", "None", &[])).unwrap();
    server.create(&slice("headless-abc", "headless", &headless)).unwrap();
    let (mut source, lines) = Source::synced(&server).await;
    assert!(!lines.iter().any(|l| l.contains("other") || l.contains("headless")), "{lines:?}");
    // Taken over by another proxy: gone for this one, as a deletion.
    server.update(&service("web", "10.96.0.10", &proxy_name)).unwrap();
    server.create(&service("later", "None", &[])).unwrap();
    server.create(&slice("later-abc", "later", &headless)).unwrap();
    server.create(&service("sentinel", "10.96.0.30", &[])).unwrap();
    let lines = source.until(&["applied Service default/sentinel"]).await;
    assert_eq!(lines, ["deleted Service default/web", "applied Service default/sentinel"]);
}

#[tokio::test]
async fn only_this_nodes_node_is_watched() {
    let server = cluster().await;
    let (mut source, lines) = Source::synced(&server).await;
    assert!(!lines.iter().any(|l| l.contains("node-b")), "{lines:?}");
    server.update(&node("node-b")).unwrap();
    server.create(&node("node-c")).unwrap();
    server.update(&node(NODE)).unwrap();
    assert_eq!(source.until(&["applied Node node-a"]).await, ["applied Node node-a"]);
    let node_requests: Vec<String> =
        server.requests().into_iter().filter(|r| r.starts_with("GET /api/v1/nodes")).collect();
    assert!(!node_requests.is_empty());
    for request in node_requests {
        assert!(request.contains("fieldSelector=metadata.name=node-a"), "{request}");
    }
}

#[tokio::test]
async fn the_watchers_use_upstreams_selectors() {
    let server = cluster().await;
    let (_source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    let requests = server.requests();
    let of = |path: &str| requests.iter().filter(|r| r.contains(path)).cloned().collect::<Vec<_>>();
    for request in of("/api/v1/services?") {
        assert!(request.contains(&format!("labelSelector={SERVICE_LABEL_SELECTOR}")), "{request}");
        assert!(request.contains("fieldSelector=spec.clusterIP!=None"), "{request}");
    }
    for request in of("/apis/discovery.k8s.io/v1/endpointslices?") {
        assert!(request.contains("labelSelector=!service.kubernetes.io/headless"), "{request}");
    }
    // kube-rs's default watcher: paged list, then a watch with bookmarks.
    let watch = of("/api/v1/services?").into_iter().find(|r| is_watch(r)).unwrap();
    assert!(watch.contains("allowWatchBookmarks=true") && watch.contains("timeoutSeconds=290"), "{watch}");
    assert!(!watch.contains("sendInitialEvents"), "{watch}");
}

#[tokio::test]
async fn a_cut_watch_resumes_without_a_relist_or_duplicates() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    let before = server.requests().len();
    assert_eq!(server.cut_watches(), 4);
    // Written while the watch is down: replayed once on resume.
    server.update(&service("web", "10.96.0.99", &[])).unwrap();
    wait_watching_again(&server, before, false).await;
    server.create(&service("sentinel", "10.96.0.30", &[])).unwrap();
    let lines = source.until(&["applied Service default/sentinel"]).await;
    assert_eq!(lines, ["applied Service default/web", "applied Service default/sentinel"]);
    assert_eq!(lists_since(&server, before), Vec::<String>::new());
}

#[tokio::test]
async fn a_bookmark_moves_a_quiet_watch_past_the_compaction_point() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    // Writes no watcher sees (another node) move the cluster ahead.
    server.update(&node("node-b")).unwrap();
    server.bookmark();
    // kube-rs takes the bookmark's version before the cut: no 410, no relist.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.compact();
    let before = server.requests().len();
    server.cut_watches();
    wait_watching_again(&server, before, false).await;
    assert_eq!(lists_since(&server, before), Vec::<String>::new());
    assert_eq!(source.pending(), Vec::<String>::new());
}

#[tokio::test]
async fn after_a_410_a_relist_of_unchanged_objects_emits_nothing() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    // No watcher sees this write, so every watcher falls behind the compaction.
    server.update(&node("node-b")).unwrap();
    server.compact();
    let before = server.requests().len();
    server.cut_watches();
    wait_watching_again(&server, before, true).await;
    assert_eq!(lists_since(&server, before).len(), 4);
    assert_eq!(source.pending(), Vec::<String>::new());
    // Still working afterwards.
    server.create(&service("sentinel", "10.96.0.30", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/sentinel"]).await, ["applied Service default/sentinel"]);
}

#[tokio::test]
async fn after_a_410_a_relist_emits_exactly_the_deleted_object() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    let before = server.requests().len();
    // Deleted while the API server is unreachable, then compacted away.
    server.set_reachable(false);
    server.delete(&service("db", "", &[])).unwrap();
    server.compact();
    server.set_reachable(true);
    wait_watching_again(&server, before, true).await;
    assert_eq!(source.pending(), ["deleted Service default/db"]);
}

#[tokio::test]
async fn an_unreachable_api_server_keeps_the_last_state_and_recovers() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    server.set_reachable(false);
    // The watchers fail and retry meanwhile; nothing is deleted or resent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(source.pending(), Vec::<String>::new());
    server.create(&service("while-down", "10.96.0.40", &[])).unwrap();
    server.set_reachable(true);
    let lines = source.until(&["applied Service default/while-down"]).await;
    assert_eq!(lines, ["applied Service default/while-down"]);
}

#[tokio::test]
async fn a_list_longer_than_a_page_is_read_whole() {
    let server = ApiServer::start().await;
    for i in 0..520 {
        server.create(&service(&format!("svc-{i:03}"), "10.96.1.1", &[])).unwrap();
    }
    let (_source, lines) = Source::synced(&server).await;
    assert_eq!(lines.iter().filter(|l| l.starts_with("applied Service")).count(), 520);
    let lists = lists_since(&server, 0);
    assert!(lists.iter().any(|r| r.contains("/api/v1/services?") && r.contains("continue=")), "{lists:?}");
}

/// A Service as a conversion webhook or a version skew might serve it:
/// `port` a string where our types (and the API) have an integer.
fn bad_service(name: &str, cluster_ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": cluster_ip, "ports": [{"port": "abc", "protocol": "TCP"}]},
    })
}

#[tokio::test]
async fn an_object_that_does_not_decode_is_refused_and_every_other_one_flows() {
    let server = cluster().await;
    server.create(&bad_service("bad", "10.96.0.66")).unwrap();
    let (mut source, lines) = Source::synced(&server).await;
    let expected = INITIAL_LIST;
    assert_eq!(sorted(lines), expected, "the list went through without the bad Service");
    assert_eq!(source.refused("Service"), Some(1));
    assert_eq!(source.refused("EndpointSlice"), Some(0));
    assert_eq!(source.refused("Node"), Some(0));
    assert_eq!(source.refused("ServiceCIDR"), Some(0));
    assert_eq!(
        source.listed_refusals(),
        ["Service default/bad does_not_decode: spec.ports[0].port: invalid type: string \"abc\", expected i32"]
    );
    // The watch goes on: good objects arrive, a bad one is refused.
    server.create(&service("new", "10.96.0.12", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/new"]).await, ["applied Service default/new"]);
    server.create(&bad_service("bad2", "10.96.0.67")).unwrap();
    server.create(&service("sentinel", "10.96.0.30", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/sentinel"]).await, ["applied Service default/sentinel"]);
    assert_eq!(source.refused("Service"), Some(2));
    // A known Service turned bad keeps its last version; its deletion,
    // by identity, goes through; an unknown bad one's deletion is no news.
    server.update(&bad_service("web", "10.96.0.10")).unwrap();
    server.delete(&bad_service("bad", "")).unwrap();
    server.delete(&bad_service("web", "")).unwrap();
    assert_eq!(source.until(&["deleted Service default/web"]).await, ["deleted Service default/web"]);
    assert_eq!(source.refused("Service"), Some(3));
    // Still following.
    server.create(&slice("new-abc", "new", &[])).unwrap();
    let lines = source.until(&["applied EndpointSlice default/new-abc"]).await;
    assert_eq!(lines, ["applied EndpointSlice default/new-abc"]);
}

#[tokio::test]
async fn a_relist_keeps_the_last_readable_version_of_an_object_turned_bad() {
    let server = cluster().await;
    let (mut source, _) = Source::synced(&server).await;
    wait_watching_again(&server, 0, false).await;
    let before = server.requests().len();
    // Turned bad while the API server is unreachable, then compacted away:
    // the relist lists it, refused.
    server.set_reachable(false);
    server.update(&bad_service("web", "10.96.0.10")).unwrap();
    server.create(&bad_service("bad", "10.96.0.66")).unwrap();
    server.compact();
    server.set_reachable(true);
    wait_watching_again(&server, before, true).await;
    assert_eq!(source.pending(), Vec::<String>::new(), "neither deleted nor changed");
    assert_eq!(source.refused("Service"), Some(2));
    // Fixed later: the new version flows.
    server.update(&service("web", "10.96.0.99", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/web"]).await, ["applied Service default/web"]);
}

/// A kind whose lists fail holds back nothing else: the `others` sync,
/// it never does (no event, no synced) until its lists work again; then
/// `applied` and its synced.
async fn a_failing_kind_holds_back_only_itself(kind: Kind, name: &str, others: &[&str], applied: &str) {
    let server = cluster().await;
    server.fail_kind(kind, true);
    let mut source = Source::start(&server);
    let lines = source.until(others).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut lines = [lines, source.pending()].concat();
    lines.retain(|l| l.contains(name));
    assert_eq!(lines, Vec::<String>::new(), "no {name}, no synced {name}");
    server.fail_kind(kind, false);
    let synced = format!("synced {name}");
    let lines = source.until(&[synced.as_str()]).await;
    assert_eq!(lines, [applied.to_string(), synced]);
}

#[tokio::test]
async fn a_kind_whose_lists_fail_never_syncs_and_the_others_do() {
    let others = ["synced Service", "synced Node"];
    a_failing_kind_holds_back_only_itself(
        Kind::EndpointSlice,
        "EndpointSlice",
        &others,
        "applied EndpointSlice default/web-abc",
    )
    .await;
}

/// ServiceCIDRs (cluster-scoped, every one watched): created, updated
/// and deleted ones flow through the real kube-rs watcher, the whole
/// object with its ranges.
#[tokio::test]
async fn service_cidrs_are_listed_and_followed() {
    let server = cluster().await;
    let (mut source, lines) = Source::synced(&server).await;
    assert!(lines.contains(&"applied ServiceCIDR kubernetes".to_string()), "{lines:?}");
    let cidrs = |batch: &SourceBatch| match &batch.0[..] {
        [SourceEvent::ServiceCidr(Change::Applied(c))] => c.spec.as_ref().and_then(|s| s.cidrs.clone()),
        other => panic!("{:?}", other.iter().map(line).collect::<Vec<_>>()),
    };
    server.create(&service_cidr("extra", &["10.100.0.0/24", "fd00:100::/112"])).unwrap();
    let batch = tokio::time::timeout(PATIENCE, source.batches.recv()).await.unwrap().unwrap();
    assert_eq!(cidrs(&batch), Some(vec!["10.100.0.0/24".to_string(), "fd00:100::/112".to_string()]));
    server.update(&service_cidr("extra", &["10.101.0.0/24"])).unwrap();
    let batch = tokio::time::timeout(PATIENCE, source.batches.recv()).await.unwrap().unwrap();
    assert_eq!(cidrs(&batch), Some(vec!["10.101.0.0/24".to_string()]));
    server.delete(&service_cidr("extra", &[])).unwrap();
    assert_eq!(source.until(&["deleted ServiceCIDR extra"]).await, ["deleted ServiceCIDR extra"]);
    let requests = server.requests();
    let of_kind: Vec<&String> = requests.iter().filter(|r| r.contains("/servicecidrs")).collect();
    assert!(of_kind.iter().any(|r| is_watch(r)), "watched: {of_kind:?}");
    assert!(of_kind.iter().all(|r| !r.contains("Selector")), "no selector: {of_kind:?}");
}

/// A ServiceCIDR our types cannot read is refused by name and field and
/// costs nothing else: the other ServiceCIDRs and kinds flow.
#[tokio::test]
async fn a_service_cidr_that_does_not_decode_is_refused_alone() {
    let server = cluster().await;
    let bad = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
        "metadata": {"name": "bad"}, "spec": {"cidrs": "10.200.0.0/16"},
    });
    server.create(&bad).unwrap();
    let (mut source, lines) = Source::synced(&server).await;
    assert_eq!(sorted(lines), INITIAL_LIST, "the list went through without the bad ServiceCIDR");
    assert_eq!(source.refused("ServiceCIDR"), Some(1));
    assert_eq!(source.refused("Service"), Some(0));
    assert_eq!(
        source.listed_refusals(),
        ["ServiceCIDR bad does_not_decode: spec.cidrs: invalid type: string \"10.200.0.0/16\", expected a sequence"]
    );
    server.create(&service_cidr("good", &["10.102.0.0/24"])).unwrap();
    assert_eq!(source.until(&["applied ServiceCIDR good"]).await, ["applied ServiceCIDR good"]);
}

/// ServiceCIDR lists failing (500) hold back nothing else: Services,
/// EndpointSlices and the Node sync; the ServiceCIDRs follow once their
/// list works.
#[tokio::test]
async fn failing_service_cidr_lists_do_not_hold_back_the_other_kinds() {
    let others = ["synced Service", "synced EndpointSlice", "synced Node"];
    a_failing_kind_holds_back_only_itself(Kind::ServiceCidr, "ServiceCIDR", &others, "applied ServiceCIDR kubernetes")
        .await;
}

/// An API server that does not serve ServiceCIDRs (404, before 1.33):
/// the other kinds sync as ever, and the source does not ask again at the
/// usual backoff (about a second) but every `UNAVAILABLE_RETRY` (minutes).
#[tokio::test]
async fn an_api_server_without_service_cidrs_is_asked_again_only_minutes_later() {
    let server = cluster().await;
    server.set_served(Kind::ServiceCidr, false);
    let mut source = Source::start(&server);
    let lines = source.until(&["synced Service", "synced EndpointSlice", "synced Node"]).await;
    let asked = || server.requests().into_iter().filter(|r| r.contains("/servicecidrs")).count();
    wait_until("the ServiceCIDRs were asked for", || asked() >= 1).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(asked(), 1, "asked once, not again within 3 s");
    let mut lines = [lines, source.pending()].concat();
    lines.retain(|l| l.contains("ServiceCIDR"));
    assert_eq!(lines, Vec::<String>::new());
    assert!(source::UNAVAILABLE_RETRY >= Duration::from_secs(60), "{:?}", source::UNAVAILABLE_RETRY);
    // Still following the other kinds.
    server.create(&service("sentinel", "10.96.0.30", &[])).unwrap();
    assert_eq!(source.until(&["applied Service default/sentinel"]).await, ["applied Service default/sentinel"]);
}

// The test API server itself.

#[tokio::test]
async fn apiserver_lists_and_gets_through_kube_rs() {
    let server = cluster().await;
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let list = services.list(&ListParams::default().labels(SERVICE_LABEL_SELECTOR)).await.unwrap();
    let names: Vec<String> = list.items.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(names, ["db", "web"]);
    assert_eq!(list.metadata.resource_version, Some(server.resource_version().to_string()));
    let nodes: Api<Node> = Api::all(server.client());
    assert_eq!(nodes.get("node-b").await.unwrap().metadata.name.as_deref(), Some("node-b"));
    let missing = nodes.get("node-z").await.unwrap_err();
    assert!(matches!(missing, kube::Error::Api(ref s) if s.code == 404), "{missing:?}");
    let bad = nodes.list(&ListParams::default().fields("spec.podCIDR=x")).await.unwrap_err();
    assert!(matches!(bad, kube::Error::Api(ref s) if s.code == 400), "{bad:?}");
}

#[tokio::test]
async fn apiserver_serves_raw_json_as_written_and_fails_a_kind_on_demand() {
    let server = cluster().await;
    server.create(&bad_service("bad", "10.96.0.66")).unwrap();
    let services: Api<Service> = Api::namespaced(server.client(), "default");
    let error = services.get("bad").await.unwrap_err();
    assert!(error.to_string().contains("invalid type: string \"abc\""), "typed reads refuse it: {error}");
    server.fail_kind(Kind::Service, true);
    let failed = services.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(failed, kube::Error::Api(ref s) if s.code == 500), "{failed:?}");
    assert_eq!(services.get("web").await.unwrap().metadata.name.as_deref(), Some("web"), "gets still work");
    server.fail_kind(Kind::Service, false);
    assert!(services.list(&ListParams::default().labels("app=none")).await.is_ok());
}

#[tokio::test]
async fn apiserver_serves_service_cidrs_cluster_scoped_and_unserves_a_kind_on_demand() {
    let server = cluster().await;
    let cidrs: Api<ServiceCIDR> = Api::all(server.client());
    let got = cidrs.get("kubernetes").await.unwrap();
    assert_eq!(got.metadata.namespace, None);
    assert_eq!(got.spec.and_then(|s| s.cidrs), Some(vec!["10.96.0.0/16".to_string()]));
    let list = cidrs.list(&ListParams::default().fields("metadata.name=kubernetes")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    server.set_served(Kind::ServiceCidr, false);
    let missing = cidrs.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(missing, kube::Error::Api(ref s) if s.code == 404), "{missing:?}");
    assert!(cidrs.get("kubernetes").await.is_err(), "gets too");
    server.set_served(Kind::ServiceCidr, true);
    assert_eq!(cidrs.list(&ListParams::default()).await.unwrap().items.len(), 1);
}

#[tokio::test]
async fn apiserver_refuses_conflicting_writes() {
    let server = cluster().await;
    assert!(matches!(server.create(&node(NODE)), Err(StoreError::AlreadyExists(_))));
    assert!(matches!(server.update(&node("node-z")), Err(StoreError::NotFound(_))));
    assert!(matches!(server.delete(&node("node-z")), Err(StoreError::NotFound(_))));
    let before = server.resource_version();
    assert_eq!(server.create(&node("node-c")), Ok(before + 1));
}

#[test]
fn apiserver_label_selectors_follow_upstream_syntax() {
    let labelled = |labels: serde_json::Value| serde_json::json!({"metadata": {"name": "x", "labels": labels}});
    let object = labelled(serde_json::json!({"app": "web", "tier": "front"}));
    let matches = |text: &str| LabelSelector::parse(text).unwrap().matches(&object);
    assert!(matches("app=web,tier==front"));
    assert!(matches("app!=db,missing!=x,tier"));
    assert!(matches("app in (db, web),tier notin (back)"));
    assert!(!matches("app in (db)"));
    assert!(!matches("missing"));
    assert!(matches(""));
    let proxy = LabelSelector::parse(SERVICE_LABEL_SELECTOR).unwrap();
    assert!(!proxy.matches(&labelled(serde_json::json!({"service.kubernetes.io/service-proxy-name": "x"}))));
    assert!(LabelSelector::parse("app in (a").is_err());
    assert!(LabelSelector::parse("bad key=1").is_err());
}

#[test]
fn apiserver_field_selectors_refuse_unsupported_fields() {
    let service = serde_json::json!({"metadata": {"name": "web", "namespace": "ns"}, "spec": {"clusterIP": "None"}});
    let supported = ["metadata.name", "metadata.namespace", "spec.clusterIP"];
    let matches = |text: &str| FieldSelector::parse(text, &supported).unwrap().matches(&service);
    assert!(matches("metadata.name=web,metadata.namespace==ns"));
    assert!(!matches("spec.clusterIP!=None"));
    assert!(matches("metadata.name!=db"));
    let error = FieldSelector::parse("spec.type=ClusterIP", &supported).unwrap_err();
    assert_eq!(error, "field label not supported: spec.type");
}
