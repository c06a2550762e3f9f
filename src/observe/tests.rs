use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::config::ProxyMode;
use crate::fixtures::*;
use crate::health::Probe;
use crate::http::ServiceHealthServers;
use crate::msgs::ResourceKind;
use crate::stats::{ModelCounts, ServiceScheduler, StatsRegistry, SyncRecord};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn model() -> Model {
    let mut m = Model::new(IpFamily::V4, "node-a");
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    m
}

fn hooks() -> SyncHooks {
    hooks_in(&StatsRegistry::default())
}

/// Hooks reporting to `registry`.
fn hooks_in(registry: &StatsRegistry) -> SyncHooks {
    let metrics = Arc::new(ProxyMetrics::new(ProxyMode::Ipvs, registry.clone()));
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)).with_metrics(metrics.clone()));
    SyncHooks::new(IpFamily::V4, metrics, health, registry.clone())
}

/// A LoadBalancer service with externalTrafficPolicy Local and a health check on `hc_port`.
fn local_lb(name: &str, ip: &str, hc_port: u16) -> Service {
    let mut lb = service("shop", name, ip, &[("http", "TCP", 80, 30080), ("https", "TCP", 443, 30443)]);
    let spec = lb.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(i32::from(hc_port));
    lb
}

fn web_slice(eps: &[Ep]) -> SourceEvent {
    applied_slice(slice("shop", "web-1", "web", &[("http", "TCP", 80), ("https", "TCP", 443)], eps))
}

/// Records `events`, reports them, and runs a sync that ends `ok`.
fn sync(h: &mut SyncHooks, m: &mut Model, events: Vec<SourceEvent>, full: bool, ok: bool) {
    for ev in &events {
        m.record(ev).unwrap();
    }
    h.events_recorded(&events, m);
    let changes = m.apply();
    h.sync_started(m, &changes, full);
    h.sync_finished(SyncOutcome {
        record: SyncRecord { full, failed: usize::from(!ok), ..SyncRecord::default() },
        took: Duration::from_millis(5),
        ok,
        iptables_restore_failed: !ok,
        ..SyncOutcome::default()
    });
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind((LOCALHOST, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

#[test]
fn recorded_events_are_counted_and_queue_an_update() {
    let h = hooks();
    let mut m = model();
    let events = vec![applied_service(service("shop", "db", "10.96.0.31", &[("pg", "TCP", 5432, 0)]))];
    m.record(&events[0]).unwrap();
    h.events_recorded(&events, &m);
    let text = h.metrics().encode_text();
    assert!(has_line(&text, "kubeproxy_sync_proxy_rules_service_changes_total 1"), "{text}");
    assert!(has_line(&text, "kubeproxy_sync_proxy_rules_service_changes_pending 1"), "{text}");
    assert!(text.contains("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}"), "{text}");
    let far = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(h.health().probe(Probe::Livez, far).status, 503, "the queued update was never synced");
}

#[test]
fn our_node_being_deleted_drains_healthz() {
    let h = hooks();
    let m = model();
    let mut other = node("node-b", "192.168.50.3", "z1");
    other.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
    h.events_recorded(&[SourceEvent::Node(Change::Applied(Arc::new(other)))], &m);
    assert_eq!(h.health().probe(Probe::Healthz, SystemTime::now()).status, 200, "another node's deletion");
    let mut ours = node("node-a", "192.168.50.2", "z1");
    ours.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
    h.events_recorded(&[SourceEvent::Node(Change::Applied(Arc::new(ours)))], &m);
    assert_eq!(h.health().probe(Probe::Healthz, SystemTime::now()).status, 503);
    assert_eq!(h.health().probe(Probe::Livez, SystemTime::now()).status, 200);
}

#[test]
fn a_failed_sync_observes_its_duration_but_nothing_else() {
    let mut h = hooks();
    let mut m = model();
    sync(
        &mut h,
        &mut m,
        vec![applied_service(service("shop", "db", "10.96.0.31", &[("pg", "TCP", 5432, 0)]))],
        true,
        false,
    );
    let text = h.metrics().encode_text();
    assert!(has_line(&text, "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1"), "{text}");
    assert!(has_line(&text, "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 1"));
    assert!(!text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{"), "{text}");
    assert!(has_line(&text, "kubeproxy_sync_proxy_rules_service_changes_pending 0"), "the sync took the change");
}

#[tokio::test]
async fn local_lb_services_get_health_checks_and_no_local_endpoint_counts() {
    let mut h = hooks().with_service_health(ServiceHealthServers::new(
        vec![LOCALHOST],
        Arc::new(ProxyHealth::new(Duration::from_secs(60))),
    ));
    let mut m = model();
    let port = free_port();
    let remote_only = [ep("10.244.1.5", "node-b")];
    sync(
        &mut h,
        &mut m,
        vec![applied_service(local_lb("web", "10.96.0.30", port)), web_slice(&remote_only)],
        true,
        true,
    );
    let web = NamespacedName::new("shop", "web");
    assert_eq!(
        h.service_health().map(|s| s.listening()).unwrap_or_default()[&web],
        vec![SocketAddr::new(LOCALHOST, port)]
    );
    let text = h.metrics().encode_text();
    let external =
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}";
    assert!(has_line(&text, &format!("{external} 2.0")), "both ports lack local endpoints:\n{text}");
    assert!(text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}"));

    // A partial sync of the slice change updates only web's ports.
    let local = [ep("10.244.0.5", "node-a"), ep("10.244.1.5", "node-b")];
    sync(&mut h, &mut m, vec![web_slice(&local)], false, true);
    let text = h.metrics().encode_text();
    assert!(has_line(&text, &format!("{external} 0.0")), "{text}");
    assert_eq!(h.health_checks().1[&web], 2, "one local ready endpoint on each of two ports");

    sync(&mut h, &mut m, vec![deleted_service(local_lb("web", "10.96.0.30", port))], false, true);
    assert!(h.service_health().map(|s| s.listening().is_empty()).unwrap_or(false), "closed with the service");
    assert!(h.ports.is_empty(), "{:?}", h.ports);
}

#[test]
fn no_local_counts_stay_in_step_across_partial_and_full_syncs() {
    let mut h = hooks();
    let mut m = model();
    let remote = ep("10.244.1.5", "node-b");
    sync(
        &mut h,
        &mut m,
        vec![applied_service(local_lb("web", "10.96.0.20", 0)), web_slice(std::slice::from_ref(&remote))],
        true,
        true,
    );
    assert_eq!(h.no_local, (0, 2), "both ports: endpoints exist, none local");
    sync(&mut h, &mut m, vec![web_slice(&[remote, ep("10.244.0.5", "node-a")])], false, true);
    assert_eq!(h.no_local, (0, 0));
    sync(&mut h, &mut m, vec![deleted_service(local_lb("web", "10.96.0.20", 0))], false, true);
    assert_eq!(h.no_local, (0, 0));
    assert!(h.ports.is_empty() && h.health_checked.is_empty());
    sync(&mut h, &mut m, vec![], true, true);
    assert_eq!(h.no_local, (0, 0), "a full resync recounts to the same");
}

#[test]
fn service_ports_with_their_own_scheduler_are_listed_for_the_dashboard() {
    use crate::model::scheduler::{ANNOTATION_SCHEDULER, ANNOTATION_SCHEDULER_FLAGS};
    let registry = StatsRegistry::default();
    let mut h = hooks_in(&registry).with_scheduler_list();
    let mut m = model();
    let web = |a: &[(&str, &str)]| {
        applied_service(annotated(service("shop", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]), a))
    };
    let plain = applied_service(service("shop", "plain", "10.96.0.21", &[("http", "TCP", 80, 0)]));
    let sh = [(ANNOTATION_SCHEDULER, "sh"), (ANNOTATION_SCHEDULER_FLAGS, "fallback,port")];
    sync(&mut h, &mut m, vec![web(&sh), plain], true, true);
    let listed = registry.schedulers();
    assert_eq!(
        listed,
        [ServiceScheduler {
            service_port: "shop/web:http".into(),
            family: "ipv4".into(),
            scheduler: "sh".into(),
            flags: "sh-fallback,sh-port".into(),
        }]
    );
    // A partial sync that changes the annotation updates it; one that drops it unlists the port.
    sync(&mut h, &mut m, vec![web(&[(ANNOTATION_SCHEDULER, "lc")])], false, true);
    assert_eq!(
        registry.schedulers().iter().map(|s| (s.scheduler.as_str(), s.flags.as_str())).collect::<Vec<_>>(),
        [("lc", "")]
    );
    sync(&mut h, &mut m, vec![web(&[(ANNOTATION_SCHEDULER, "bogus")])], false, true);
    assert_eq!(registry.schedulers(), [], "a refused annotation is the default scheduler");
}

#[test]
fn each_sync_goes_to_the_registry_with_the_models_counts_kept_per_changed_port() {
    let registry = StatsRegistry::default();
    let mut h = hooks_in(&registry);
    let mut m = model();
    let two = |ip| [ep(ip, "node-a"), ep("10.244.9.9", "node-b")];
    let dns = service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0), ("dns-tcp", "TCP", 53, 0)]);
    let dns_slice =
        slice("kube-system", "dns-1", "dns", &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)], &two("10.244.1.2"));
    let events = vec![
        applied_service(local_lb("web", "10.96.0.20", 0)),
        web_slice(&two("10.244.1.1")),
        applied_service(dns),
        applied_slice(dns_slice),
    ];
    sync(&mut h, &mut m, events, true, true);
    let counts = |services, service_ports, endpoints| ModelCounts { services, service_ports, endpoints };
    assert_eq!(registry.model_counts()["IPv4"], counts(2, 4, 8), "two ports of two endpoints each, per Service");
    // A partial sync of one port's endpoints; the orphan slice of a missing Service counts nothing.
    let orphan = applied_slice(slice("shop", "gone-1", "gone", &[("http", "TCP", 80)], &two("10.244.3.3")));
    sync(&mut h, &mut m, vec![web_slice(&[ep("10.244.1.1", "node-a")]), orphan], false, true);
    assert_eq!(registry.model_counts()["IPv4"], counts(2, 4, 6));
    sync(&mut h, &mut m, vec![deleted_service(local_lb("web", "10.96.0.20", 0))], false, false);
    assert_eq!(registry.model_counts()["IPv4"], counts(1, 2, 4), "counted after a failed sync too");
    sync(&mut h, &mut m, vec![], true, true);
    assert_eq!(registry.model_counts()["IPv4"], counts(1, 2, 4), "a full resync recounts to the same");
    let syncs = registry.syncs();
    let kinds: Vec<(bool, usize)> = syncs.iter().map(|s| (s.record.full, s.record.failed)).collect();
    assert_eq!(kinds, [(true, 0), (false, 1), (false, 0), (true, 0)], "newest first");
    assert!(syncs.iter().all(|s| s.family == "IPv4" && s.unix_ms > 0), "{syncs:?}");
}

#[test]
fn a_sync_reports_its_slowest_programming_latency() {
    use crate::model::endpoints::ANNOTATION_TRIGGER_TIME;
    use std::time::SystemTime;
    let registry = StatsRegistry::default();
    let mut h = hooks_in(&registry);
    let mut m = model();
    // Trigger times count from the process's start (the metrics'): these are after it.
    let now = || jiff::Timestamp::try_from(SystemTime::now()).unwrap().to_string();
    let triggered = |name: &str, ip, at: String| {
        let mut s = slice("shop", name, "web", &[("http", "TCP", 80)], &[ep(ip, "node-a")]);
        s.metadata.annotations = Some([(ANNOTATION_TRIGGER_TIME.to_string(), at)].into());
        applied_slice(s)
    };
    let web = applied_service(service("shop", "web", "10.96.0.20", &[("http", "TCP", 80, 0)]));
    sync(&mut h, &mut m, vec![web], true, true);
    let first = triggered("web-1", "10.244.1.1", now());
    std::thread::sleep(Duration::from_millis(40));
    let second = triggered("web-2", "10.244.1.2", now());
    std::thread::sleep(Duration::from_millis(10));
    sync(&mut h, &mut m, vec![first, second], false, true);
    sync(&mut h, &mut m, vec![triggered("web-1", "10.244.1.5", now())], false, false);
    let latencies: Vec<Option<f64>> = registry.syncs().iter().map(|s| s.programming_ms).collect();
    assert_eq!(latencies[0], None, "a failed sync observes none");
    assert!(latencies[1].is_some_and(|ms| (50.0..1000.0).contains(&ms)), "the slower of two: {latencies:?}");
    assert_eq!(latencies[2], None, "no trigger time");
}
