use std::net::IpAddr;

use super::topology::categorize;
use super::*;
use crate::fixtures::*;
use crate::msgs::{ResourceKind, SourceEvent};
use crate::net::Protocol;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn spn(ns: &str, name: &str, port: &str, proto: Protocol) -> ServicePortName {
    ServicePortName { service: NamespacedName::new(ns, name), port: port.into(), protocol: proto }
}

fn model() -> Model {
    let mut m = Model::new(IpFamily::V4, "node-a");
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    m
}

fn dns() -> k8s_openapi::api::core::v1::Service {
    service("kube-system", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0), ("dns-tcp", "TCP", 53, 0)])
}

#[test]
fn service_ports_are_keyed_by_name_and_protocol() {
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    let ch = m.apply();
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    assert_eq!(udp.to_string(), "kube-system/dns:dns");
    assert!(ch.ports.contains(&udp));
    assert_eq!(ch.ports.len(), 2);
    let sp = m.service_port(&udp).unwrap();
    assert_eq!((sp.cluster_ip, sp.port, sp.node_port), (ip("10.96.0.10"), 53, 0));
    assert_eq!(sp.affinity_timeout, None);
}

#[test]
fn unnamed_port_prints_without_colon() {
    assert_eq!(spn("ns", "svc", "", Protocol::Tcp).to_string(), "ns/svc");
}

#[test]
fn service_fields_follow_upstream_filters() {
    let mut s = service("ns", "lb", "10.96.0.30", &[("http", "TCP", 80, 30080)]);
    let spec = s.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_ips = Some(vec!["192.168.60.20".into(), "fd00::20".into(), "bogus".into()]);
    spec.load_balancer_source_ranges = Some(vec![" 192.168.50.0/24 ".into(), "fd00::/64".into()]);
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32000);
    spec.session_affinity = Some("ClientIP".into());
    s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [
        {"ip": "192.168.60.10"}, {"ip": "192.168.60.11", "ipMode": "Proxy"}, {"hostname": "lb.example"}
    ]}})));
    let mut m = model();
    m.record(&applied_service(s)).unwrap();
    m.apply();
    let sp = m.service_port(&spn("ns", "lb", "http", Protocol::Tcp)).unwrap();
    assert_eq!(sp.external_ips, vec![ip("192.168.60.20")]);
    assert_eq!(sp.load_balancer_vips, vec![ip("192.168.60.10")]);
    assert_eq!(sp.load_balancer_source_ranges, vec!["192.168.50.0/24".parse().unwrap()]);
    assert_eq!(sp.affinity_timeout, Some(DEFAULT_AFFINITY_TIMEOUT));
    assert!(sp.external_policy_local && !sp.internal_policy_local);
    assert_eq!((sp.node_port, sp.health_check_node_port), (30080, 32000));
}

use service::DEFAULT_AFFINITY_TIMEOUT;

#[test]
fn skipped_services_yield_no_ports() {
    let mut headless = service("ns", "headless", "None", &[("p", "TCP", 80, 0)]);
    headless.spec.as_mut().unwrap().cluster_ips = Some(vec!["None".into()]);
    let mut ext = service("ns", "ext", "", &[]);
    ext.spec.as_mut().unwrap().type_ = Some("ExternalName".into());
    let mut other = service("ns", "other", "10.96.0.40", &[("p", "TCP", 80, 0)]);
    other.metadata.labels = Some([(service::LABEL_SERVICE_PROXY_NAME.to_string(), "x".to_string())].into());
    let v6 = service("ns", "v6", "fd00::10", &[("p", "TCP", 80, 0)]);
    let mut m = model();
    for s in [headless, ext, other, v6] {
        m.record(&applied_service(s)).unwrap();
    }
    assert!(m.apply().ports.is_empty());
    assert_eq!(m.service_ports().count(), 0);
}

#[test]
fn invalid_cluster_ip_is_an_error_naming_object_and_field() {
    let bad = service("ns", "bad", "10.96.0.999", &[("p", "TCP", 80, 0)]);
    let mut m = model();
    let err = m.record(&applied_service(bad)).unwrap_err();
    assert_eq!(err.to_string(), "Service ns/bad: invalid spec.clusterIPs[0]: \"10.96.0.999\"");
    // The broken service leaves no pending change behind; others still work.
    m.record(&applied_service(dns())).unwrap();
    assert_eq!(m.apply().ports.len(), 2);
}

#[test]
fn bad_update_keeps_the_last_good_state() {
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.apply();
    let mut bad = dns();
    bad.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("ICMP".into());
    let err = m.record(&applied_service(bad)).unwrap_err();
    assert!(err.to_string().contains("spec.ports[0].protocol"), "{err}");
    assert!(m.apply().ports.is_empty());
    assert!(m.service_port(&spn("kube-system", "dns", "dns", Protocol::Udp)).is_some());
}

#[test]
fn unchanged_update_reports_nothing() {
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.apply();
    m.record(&applied_service(dns())).unwrap();
    assert!(m.apply().is_empty());
}

#[test]
fn a_removed_port_is_a_changed_port() {
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.apply();
    m.record(&applied_service(service("kube-system", "dns", "10.96.0.10", &[("dns-tcp", "TCP", 53, 0)]))).unwrap();
    let ch = m.apply();
    assert_eq!(ch.ports, [spn("kube-system", "dns", "dns", Protocol::Udp)].into());
    assert!(!ch.is_empty());
}

fn dns_slice(name: &str, eps: &[Ep]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    slice("kube-system", name, "dns", &[("dns", "UDP", 53), ("dns-tcp", "TCP", 53)], eps)
}

#[test]
fn slices_merge_and_duplicates_prefer_the_local_copy() {
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.record(&applied_slice(dns_slice("dns-a", &[ep("10.244.1.5", "node-b"), ep("10.244.0.5", "node-b")]))).unwrap();
    m.record(&applied_slice(dns_slice("dns-b", &[ep("10.244.0.5", "node-a"), ep("10.244.2.5", "node-c")]))).unwrap();
    m.apply();
    let eps = m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp));
    let got: Vec<(String, bool)> = eps.iter().map(|e| (e.to_string(), e.is_local)).collect();
    assert_eq!(
        got,
        vec![("10.244.0.5:53".into(), true), ("10.244.1.5:53".into(), false), ("10.244.2.5:53".into(), false)]
    );
}

#[test]
fn conditions_default_as_upstream() {
    let mut e = ep("10.244.0.5", "node-a");
    e.ready = None;
    e.serving = None;
    e.terminating = None;
    let mut m = model();
    m.record(&applied_slice(dns_slice("s", &[e]))).unwrap();
    m.apply();
    let got = &m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp))[0];
    assert!(got.ready && got.serving && !got.terminating);
}

#[test]
fn headless_slices_and_other_families_are_ignored() {
    let mut s = dns_slice("s", &[ep("10.244.0.5", "node-a")]);
    s.metadata.labels.as_mut().unwrap().insert(service::LABEL_HEADLESS.into(), "".into());
    let mut v6 = dns_slice("v6", &[ep("fd00::5", "node-a")]);
    v6.address_type = "IPv6".into();
    let mut m = model();
    m.record(&applied_slice(s)).unwrap();
    m.record(&applied_slice(v6)).unwrap();
    assert!(m.apply().ports.is_empty());
}

#[test]
fn deleting_the_last_slice_removes_the_endpoints() {
    let mut m = model();
    let s = dns_slice("s", &[ep("10.244.0.5", "node-a")]);
    m.record(&applied_slice(s.clone())).unwrap();
    m.apply();
    m.record(&deleted_slice(s)).unwrap();
    let ch = m.apply();
    assert_eq!(ch.ports.len(), 2);
    assert!(m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp)).is_empty());
}

fn with_trigger(
    mut s: k8s_openapi::api::discovery::v1::EndpointSlice,
    t: &str,
) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let a = s.metadata.annotations.get_or_insert_with(Default::default);
    a.insert(endpoints::ANNOTATION_TRIGGER_TIME.into(), t.into());
    s
}

#[test]
fn a_sync_takes_the_trigger_times_of_the_changed_slices_only() {
    let (t0, t1, t2) = ("2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z", "2026-01-01T00:00:20Z");
    let mut m = model();
    m.record(&applied_slice(with_trigger(dns_slice("dns-a", &[ep("10.244.1.5", "node-b")]), t0))).unwrap();
    m.record(&applied_slice(with_trigger(dns_slice("dns-b", &[ep("10.244.2.5", "node-b")]), t0))).unwrap();
    assert_eq!(m.apply().trigger_times, vec![t0, t0]);
    // dns-b changes: its time only, not dns-a's older one.
    m.record(&applied_slice(with_trigger(dns_slice("dns-b", &[ep("10.244.3.5", "node-b")]), t1))).unwrap();
    assert_eq!(m.apply().trigger_times, vec![t1]);
    // The same slice written again unchanged: no time, no change.
    m.record(&applied_slice(with_trigger(dns_slice("dns-b", &[ep("10.244.3.5", "node-b")]), t1))).unwrap();
    assert!(m.apply().trigger_times.is_empty());
    // A deleted slice's annotation is from its last update: dropped, as upstream.
    m.record(&applied_slice(with_trigger(dns_slice("dns-b", &[ep("10.244.4.5", "node-b")]), t2))).unwrap();
    m.record(&deleted_slice(dns_slice("dns-a", &[]))).unwrap();
    assert!(m.apply().trigger_times.is_empty());
}

#[test]
fn not_initialized_until_services_and_slices_synced() {
    let mut m = Model::new(IpFamily::V4, "n");
    assert!(!m.is_initialized());
    m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
    assert!(!m.is_initialized());
    m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
    assert!(m.is_initialized());
}

#[test]
fn service_cidrs_do_not_hold_back_the_first_sync() {
    let m = model();
    assert!(m.is_initialized(), "no ServiceCIDR listed (its list failing, or not served): initialized all the same");
    assert_eq!(m.service_cidrs(), &[] as &[ipnet::IpNet]);
}

#[test]
fn the_familys_service_cidrs_are_the_union_of_every_object() {
    let net = |s: &str| s.parse::<ipnet::IpNet>().unwrap();
    let mut m = model();
    m.record(&applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"])).unwrap();
    assert!(m.has_pending());
    assert_eq!(m.service_cidrs(), &[] as &[ipnet::IpNet], "not before apply");
    let ch = m.apply();
    assert!(ch.service_cidrs_changed && !ch.is_empty() && ch.ports.is_empty());
    assert_eq!(m.service_cidrs(), [net("10.96.0.0/16")]);
    m.record(&applied_service_cidr("extra", &["10.100.0.0/24"])).unwrap();
    assert!(m.apply().service_cidrs_changed);
    assert_eq!(m.service_cidrs(), [net("10.96.0.0/16"), net("10.100.0.0/24")]);
    // Another family's range: nothing pending, nothing changed here.
    m.record(&applied_service_cidr("v6", &["fd00:97::/112"])).unwrap();
    assert!(!m.has_pending());
    assert!(!m.apply().service_cidrs_changed);
    // The same ranges again (a relabelled object): no change.
    m.record(&applied_service_cidr("extra", &["10.100.0.0/24"])).unwrap();
    assert!(!m.apply().service_cidrs_changed);
    // A deletion carries the name only.
    m.record(&deleted_service_cidr("extra")).unwrap();
    assert!(m.apply().service_cidrs_changed);
    assert_eq!(m.service_cidrs(), [net("10.96.0.0/16")]);
    // A range that does not parse refuses the object, reported as any bad object.
    let e = m.record(&applied_service_cidr("kubernetes", &["10.96.0.0/33"])).unwrap_err();
    assert_eq!((e.kind, e.field.as_str()), ("ServiceCIDR", "spec.cidrs[0]"));
    assert!(!m.apply().service_cidrs_changed);
    assert_eq!(m.service_cidrs(), [net("10.96.0.0/16")]);
    let mut v6 = Model::new(IpFamily::V6, "node-a");
    v6.record(&applied_service_cidr("kubernetes", &["10.96.0.0/16", "fd00:96::/112"])).unwrap();
    v6.apply();
    assert_eq!(v6.service_cidrs(), [net("fd00:96::/112")]);
}

#[test]
fn node_topology_label_change_is_reported() {
    let mut m = model();
    m.record(&SourceEvent::Node(crate::msgs::Change::Applied(std::sync::Arc::new(node(
        "node-a",
        "192.168.50.2",
        "a",
    )))))
    .unwrap();
    assert!(m.apply().topology_changed);
    m.record(&SourceEvent::Node(crate::msgs::Change::Applied(std::sync::Arc::new(node(
        "node-a",
        "192.168.50.3",
        "a",
    )))))
    .unwrap();
    assert!(!m.apply().topology_changed);
    assert_eq!(m.node().addresses, vec![ip("192.168.50.3")]);
    m.record(&SourceEvent::Node(crate::msgs::Change::Applied(std::sync::Arc::new(node(
        "node-b",
        "192.168.50.9",
        "b",
    )))))
    .unwrap();
    assert!(!m.apply().topology_changed, "another node's object is ignored");
}

fn sp(internal_local: bool, external_local: bool, node_port: u16) -> ServicePort {
    ServicePort {
        name: spn("ns", "s", "p", Protocol::Tcp),
        cluster_ip: ip("10.96.0.1"),
        port: 80,
        node_port,
        external_ips: vec![],
        load_balancer_vips: vec![],
        load_balancer_source_ranges: vec![],
        source_ranges_fail_closed: false,
        affinity_timeout: None,
        health_check_node_port: 0,
        external_policy_local: external_local,
        internal_policy_local: internal_local,
        traffic_distribution: None,
        ipvs_scheduler: None,
    }
}

fn endpoint(ip_: &str, local: bool, ready: bool, serving: bool, terminating: bool) -> Endpoint {
    Endpoint {
        ip: ip(ip_),
        port: 80,
        is_local: local,
        ready,
        serving,
        terminating,
        zone_hints: Default::default(),
        node_hints: Default::default(),
    }
}

#[test]
fn categorize_falls_back_to_serving_terminating_endpoints() {
    let eps = vec![endpoint("10.0.0.1", false, false, true, true), endpoint("10.0.0.2", true, false, false, true)];
    let c = categorize(&eps, &sp(false, false, 0), "node-a", "");
    assert_eq!(c.cluster.len(), 1);
    assert_eq!(c.cluster[0].ip, ip("10.0.0.1"));
    assert!(c.has_any);
}

#[test]
fn categorize_local_policy_uses_local_endpoints_only() {
    let eps = vec![endpoint("10.0.0.1", false, true, true, false), endpoint("10.0.0.2", true, true, true, false)];
    let c = categorize(&eps, &sp(true, false, 0), "node-a", "");
    assert!(c.cluster.is_empty());
    assert_eq!(c.local.len(), 1);
    assert_eq!(c.all_reachable.len(), 1);
    let remote_only = vec![endpoint("10.0.0.1", false, true, true, false)];
    let c = categorize(&remote_only, &sp(true, false, 0), "node-a", "");
    assert!(c.local.is_empty() && c.has_any, "no local endpoint, but some exist: DROP, not REJECT");
}

#[test]
fn categorize_mixed_policies_merge_cluster_and_local() {
    // externalTrafficPolicy Local on a NodePort, internal Cluster.
    let eps = vec![endpoint("10.0.0.1", false, true, true, false), endpoint("10.0.0.2", true, false, true, true)];
    let c = categorize(&eps, &sp(false, true, 30000), "node-a", "");
    assert_eq!(c.cluster.len(), 1);
    assert_eq!(c.local.len(), 1, "local falls back to serving-terminating");
    assert_eq!(c.all_reachable.len(), 2);
}

#[test]
fn categorize_uses_zone_hints_only_when_all_ready_endpoints_have_them() {
    let mut a = endpoint("10.0.0.1", false, true, true, false);
    a.zone_hints.insert("zone-a".into());
    let mut b = endpoint("10.0.0.2", false, true, true, false);
    b.zone_hints.insert("zone-b".into());
    let eps = vec![a.clone(), b.clone()];
    let c = categorize(&eps, &sp(false, false, 0), "node-a", "zone-a");
    assert_eq!(c.cluster.len(), 1);
    assert_eq!(c.cluster[0].ip, ip("10.0.0.1"));
    let c = categorize(&eps, &sp(false, false, 0), "node-a", "zone-c");
    assert_eq!(c.cluster.len(), 2, "no hint for our zone: ignore hints");
    b.zone_hints.clear();
    let eps = [a, b];
    let c = categorize(&eps, &sp(false, false, 0), "node-a", "zone-a");
    assert_eq!(c.cluster.len(), 2, "an endpoint without hints disables topology");
}

#[test]
fn unchanged_endpoints_and_ports_keep_their_shared_values() {
    // The planner recognises what it planned from by identity: an update
    // that changes nothing must not replace the shared values.
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.record(&applied_slice(dns_slice("s", &[ep("10.244.0.5", "node-a")]))).unwrap();
    m.apply();
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    let (port, list) = (m.service_port(&udp).unwrap().clone(), m.endpoint_list(&udp).unwrap().clone());
    m.record(&applied_service(dns())).unwrap();
    m.record(&applied_slice(dns_slice("s", &[ep("10.244.0.5", "node-a")]))).unwrap();
    assert!(m.apply().ports.is_empty());
    assert!(Arc::ptr_eq(m.service_port(&udp).unwrap(), &port));
    assert!(Arc::ptr_eq(m.endpoint_list(&udp).unwrap(), &list));
    m.record(&applied_slice(dns_slice("s", &[ep("10.244.0.6", "node-a")]))).unwrap();
    assert_eq!(m.apply().ports.len(), 2);
    assert!(Arc::ptr_eq(m.service_port(&udp).unwrap(), &port));
    assert!(!Arc::ptr_eq(m.endpoint_list(&udp).unwrap(), &list));
}

#[test]
fn zone_hints_come_from_the_slice_and_only_where_given() {
    let mut m = model();
    let eps = [ep("10.244.0.5", "node-a").zone_hint("zone-a").zone_hint("zone-b"), ep("10.244.1.5", "node-b")];
    m.record(&applied_slice(dns_slice("s", &eps))).unwrap();
    m.apply();
    let got = m.endpoints(&spn("kube-system", "dns", "dns-tcp", Protocol::Tcp));
    assert!(got[0].zone_hints.contains("zone-a") && got[0].zone_hints.contains("zone-b"));
    assert!(!got[0].zone_hints.contains("zone-c") && got[0].node_hints.is_empty());
    assert!(got[1].zone_hints.is_empty());
    assert_eq!(format!("{:?}", got[0].zone_hints), r#"{"zone-a", "zone-b"}"#);
    let no_hints = dns_slice("s", &[ep("10.244.0.5", "node-a"), ep("10.244.1.5", "node-b")]);
    m.record(&applied_slice(no_hints)).unwrap();
    m.apply();
    assert!(m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp)).iter().all(|e| e.zone_hints.is_empty()));
}

#[test]
fn a_slice_moving_to_another_service_leaves_the_first() {
    let mut m = model();
    m.record(&applied_slice(dns_slice("s", &[ep("10.244.0.5", "node-a")]))).unwrap();
    m.apply();
    let moved = slice("kube-system", "s", "other", &[("dns", "UDP", 53)], &[ep("10.244.0.5", "node-a")]);
    m.record(&applied_slice(moved)).unwrap();
    let ch = m.apply();
    assert_eq!(
        ch.endpoints_updated,
        [NamespacedName::new("kube-system", "dns"), NamespacedName::new("kube-system", "other")].into()
    );
    assert!(m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp)).is_empty());
    assert_eq!(m.endpoints(&spn("kube-system", "other", "dns", Protocol::Udp)).len(), 1);
}

/// A model per family, as the daemon runs on a dual-stack node.
fn family_models() -> [Model; 2] {
    [IpFamily::V4, IpFamily::V6].map(|f| {
        let mut m = Model::new(f, "node-a");
        m.record(&SourceEvent::Synced(ResourceKind::Service)).unwrap();
        m.record(&SourceEvent::Synced(ResourceKind::EndpointSlice)).unwrap();
        m
    })
}

/// The dns Service with `ips` as its clusterIPs and the matching ipFamilies.
fn dns_with_ips(ips: &[&str], policy: &str) -> k8s_openapi::api::core::v1::Service {
    let mut s = dns();
    let spec = s.spec.as_mut().unwrap();
    spec.cluster_ip = Some(ips[0].into());
    spec.cluster_ips = Some(ips.iter().map(|s| s.to_string()).collect());
    spec.ip_families = Some(ips.iter().map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" }.to_string()).collect());
    spec.ip_family_policy = Some(policy.into());
    s
}

/// Each family's cluster IP of the dns UDP port, if the family has it.
fn cluster_ips(models: &[Model; 2]) -> [Option<IpAddr>; 2] {
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    [0, 1].map(|i| models[i].service_port(&udp).map(|sp| sp.cluster_ip))
}

#[test]
fn a_service_whose_families_change_is_split_between_the_family_models() {
    let mut models = family_models();
    // (clusterIPs, ipFamilyPolicy, what the IPv4 and IPv6 models see)
    type Step<'a> = (&'a [&'a str], &'a str, [Option<&'a str>; 2]);
    let steps: [Step; 4] = [
        (&["10.96.0.10"], "SingleStack", [Some("10.96.0.10"), None]),
        (&["10.96.0.10", "fd00::10"], "PreferDualStack", [Some("10.96.0.10"), Some("fd00::10")]),
        (&["10.96.0.10"], "SingleStack", [Some("10.96.0.10"), None]),
        (&["fd00::10", "10.96.0.10"], "RequireDualStack", [Some("10.96.0.10"), Some("fd00::10")]),
    ];
    for (ips, policy, want) in steps {
        let ev = applied_service(dns_with_ips(ips, policy));
        for m in &mut models {
            m.record(&ev).unwrap();
            m.apply();
        }
        assert_eq!(cluster_ips(&models), want.map(|w| w.map(ip)), "{policy} {ips:?}");
    }
    // Deleted: gone from both.
    let ev = deleted_service(dns_with_ips(&["fd00::10", "10.96.0.10"], "RequireDualStack"));
    for m in &mut models {
        m.record(&ev).unwrap();
        m.apply();
    }
    assert_eq!(cluster_ips(&models), [None, None]);
}

#[test]
fn external_ips_and_load_balancer_ips_go_to_their_own_family() {
    let mut s = dns_with_ips(&["10.96.0.10", "fd00::10"], "RequireDualStack");
    let spec = s.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_ips = Some(vec!["192.168.60.20".into(), "fd00:60::20".into()]);
    s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [
        {"ip": "192.168.60.10"}, {"ip": "fd00:60::10"}
    ]}})));
    let mut models = family_models();
    for m in &mut models {
        m.record(&applied_service(s.clone())).unwrap();
        m.apply();
    }
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    let [v4, v6] = [0, 1].map(|i| models[i].service_port(&udp).cloned().expect("in both families"));
    assert_eq!(
        (v4.external_ips.clone(), v4.load_balancer_vips.clone()),
        (vec![ip("192.168.60.20")], vec![ip("192.168.60.10")])
    );
    assert_eq!(
        (v6.external_ips.clone(), v6.load_balancer_vips.clone()),
        (vec![ip("fd00:60::20")], vec![ip("fd00:60::10")])
    );
}

#[test]
fn endpoint_slices_of_both_address_types_feed_their_own_family() {
    let mut models = family_models();
    let v4 = dns_slice("dns-v4", &[ep("10.244.0.5", "node-a"), ep("10.244.1.5", "node-b")]);
    let mut v6 = dns_slice("dns-v6", &[ep("fd00:244::5", "node-a")]);
    v6.address_type = "IPv6".into();
    let svc = applied_service(dns_with_ips(&["10.96.0.10", "fd00::10"], "RequireDualStack"));
    for m in &mut models {
        for ev in [&svc, &applied_slice(v4.clone()), &applied_slice(v6.clone())] {
            m.record(ev).unwrap();
        }
        m.apply();
    }
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    let ips = |m: &Model| m.endpoints(&udp).iter().map(|e| e.ip).collect::<Vec<_>>();
    assert_eq!(ips(&models[0]), [ip("10.244.0.5"), ip("10.244.1.5")]);
    assert_eq!(ips(&models[1]), [ip("fd00:244::5")]);
    // The IPv6 slice deleted: IPv4 keeps its endpoints.
    for m in &mut models {
        m.record(&deleted_slice(v6.clone())).unwrap();
        m.apply();
    }
    assert_eq!(ips(&models[0]).len(), 2);
    assert!(ips(&models[1]).is_empty());
}

/// Node hints (PreferSameTrafficDistribution, GA and locked on since 1.35)
/// reach the endpoints, and `categorize` sends this node's traffic to the
/// endpoint hinted for it.
#[test]
fn node_hints_reach_the_endpoints_and_pick_this_nodes_endpoint() {
    let eps = [
        ep("10.244.0.5", "node-a").zone_hint("zone-a").node_hint("node-a"),
        ep("10.244.0.6", "node-b").zone_hint("zone-a").node_hint("node-b"),
        ep("10.244.1.5", "node-c").zone_hint("zone-b").node_hint("node-c"),
    ];
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    let mut m = model();
    m.record(&applied_service(dns())).unwrap();
    m.record(&applied_slice(dns_slice("s", &eps))).unwrap();
    m.apply();
    let sp = m.service_port(&udp).unwrap().clone();
    let endpoints = m.endpoints(&udp).to_vec();
    let cluster = categorize(&endpoints, &sp, "node-a", "zone-a").cluster;
    assert_eq!(cluster.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>(), ["10.244.0.5"]);
    let cluster = categorize(&endpoints, &sp, "node-x", "zone-a").cluster;
    assert_eq!(cluster.len(), 2, "no hint for this node: this zone's endpoints");
}

/// MultiCIDRServiceAllocator off: ServiceCIDRs are not recorded, as
/// upstream then starts no ServiceCIDR informer.
#[test]
fn service_cidrs_are_ignored_without_the_multi_cidr_service_allocator_gate() {
    let mut m = model().with_gates(ModelGates { service_cidrs: false });
    m.record(&applied_service_cidr("kubernetes", &["10.96.0.0/16"])).unwrap();
    assert!(!m.has_pending());
    assert!(!m.apply().service_cidrs_changed);
    assert_eq!(m.service_cidrs(), &[] as &[ipnet::IpNet]);
}

fn applied_node(n: k8s_openapi::api::core::v1::Node) -> SourceEvent {
    SourceEvent::Node(crate::msgs::Change::Applied(std::sync::Arc::new(n)))
}

/// Every IP and CIDR field reads leading zeros as decimal, as upstream's
/// sloppy parsers do.
#[test]
fn leading_zeros_are_decimal_in_every_address_field() {
    let mut s = dns_with_ips(&["010.096.000.010", "fd00::10"], "RequireDualStack");
    let spec = s.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_ips = Some(vec!["192.168.060.020".into()]);
    spec.load_balancer_source_ranges = Some(vec!["192.168.050.000/024".into(), "203.0.113.000/025".into()]);
    s.status = Some(from_json(serde_json::json!({"loadBalancer": {"ingress": [{"ip": "192.168.060.010"}]}})));
    let mut n = node("node-a", "192.168.050.002", "z");
    n.spec.as_mut().unwrap().pod_cidrs = Some(vec!["010.244.000.000/016".into()]);
    let mut m = model();
    for ev in
        [applied_service(s), applied_slice(dns_slice("dns-1", &[ep("010.244.001.005", "node-a")])), applied_node(n)]
    {
        m.record(&ev).unwrap();
    }
    m.apply();
    let sp = m.service_port(&spn("kube-system", "dns", "dns", Protocol::Udp)).unwrap();
    assert_eq!(sp.cluster_ip, ip("10.96.0.10"));
    assert_eq!(sp.external_ips, [ip("192.168.60.20")]);
    assert_eq!(sp.load_balancer_vips, [ip("192.168.60.10")]);
    let ranges: Vec<String> = sp.load_balancer_source_ranges.iter().map(|n| n.to_string()).collect();
    assert_eq!(ranges, ["192.168.50.0/24", "203.0.113.0/25"]);
    assert!(!sp.source_ranges_fail_closed && sp.restricts_sources());
    let eps = m.endpoints(&spn("kube-system", "dns", "dns", Protocol::Udp));
    assert_eq!(eps.iter().map(|e| e.ip).collect::<Vec<_>>(), [ip("10.244.1.5")]);
    assert_eq!(m.node().addresses, [ip("192.168.50.2")]);
    assert_eq!(m.node().pod_cidrs, ["10.244.0.0/16".parse::<ipnet::IpNet>().unwrap()]);
}

/// Values that do not parse are skipped, the rest of the object taken.
#[test]
fn values_that_do_not_parse_are_skipped_and_the_object_taken() {
    let mut s = dns();
    let spec = s.spec.as_mut().unwrap();
    spec.type_ = Some("LoadBalancer".into());
    spec.external_ips = Some(vec!["bogus".into(), "192.168.60.20".into(), "".into()]);
    s.status = Some(from_json(
        serde_json::json!({"loadBalancer": {"ingress": [{"ip": "not-an-ip"}, {"ip": "192.168.60.10"}]}}),
    ));
    let mut sl =
        dns_slice("dns-1", &[ep("10.244.0.5", "node-a"), ep("10.244.0.999", "node-a"), ep("fd00::5", "node-a")]);
    sl.endpoints[0].addresses.push("also ignored: only the first counts".into());
    let mut n = node("node-a", "bogus", "z");
    n.spec.as_mut().unwrap().pod_cidrs = Some(vec!["bogus".into()]);
    n.status.as_mut().unwrap().addresses.as_mut().unwrap().push(from_json(serde_json::json!(
        {"type": "InternalIP", "address": "192.168.50.2"}
    )));
    let mut m = model();
    for ev in [applied_service(s), applied_slice(sl), applied_node(n)] {
        m.record(&ev).unwrap();
    }
    m.apply();
    let udp = spn("kube-system", "dns", "dns", Protocol::Udp);
    let sp = m.service_port(&udp).unwrap();
    assert_eq!(
        (sp.external_ips.as_slice(), sp.load_balancer_vips.as_slice()),
        (&[ip("192.168.60.20")][..], &[ip("192.168.60.10")][..])
    );
    assert_eq!(m.endpoints(&udp).iter().map(|e| e.ip).collect::<Vec<_>>(), [ip("10.244.0.5")]);
    assert_eq!(m.node().addresses, [ip("192.168.50.2")]);
    // podCIDRs without a value that parses: the podCIDR.
    assert_eq!(m.node().pod_cidrs, ["10.244.0.0/24".parse::<ipnet::IpNet>().unwrap()]);
}

/// loadBalancerSourceRanges, per family: the ranges that parse are used
/// (as upstream); a family left with none while some value does not
/// parse admits no source (upstream would admit every one); blank values
/// and a family merely without ranges change nothing (as upstream).
#[test]
fn source_ranges_that_do_not_parse_fail_closed_per_family() {
    /// Per family (IPv4, IPv6): the ranges used, and whether it fails closed.
    type Want<'a> = [(&'a [&'a str], bool); 2];
    let cases: [(&[&str], Want); 5] = [
        (&["bogus"], [(&[], true), (&[], true)]),
        (&["bogus", "192.168.050.0/24"], [(&["192.168.50.0/24"], false), (&[], true)]),
        (&["10.0.0.0/33", "fd00::/64"], [(&[], true), (&["fd00::/64"], false)]),
        (&["192.168.50.0/24"], [(&["192.168.50.0/24"], false), (&[], false)]),
        (&["", " "], [(&[], false), (&[], false)]),
    ];
    for (ranges, want) in cases {
        let mut s = dns_with_ips(&["10.96.0.10", "fd00::10"], "RequireDualStack");
        let spec = s.spec.as_mut().unwrap();
        spec.type_ = Some("LoadBalancer".into());
        spec.load_balancer_source_ranges = Some(ranges.iter().map(|r| r.to_string()).collect());
        let mut models = family_models();
        for (m, (nets, closed)) in models.iter_mut().zip(want) {
            m.record(&applied_service(s.clone())).unwrap();
            m.apply();
            let sp = m.service_port(&spn("kube-system", "dns", "dns", Protocol::Udp)).unwrap();
            let got: Vec<String> = sp.load_balancer_source_ranges.iter().map(|n| n.to_string()).collect();
            let got: Vec<&str> = got.iter().map(String::as_str).collect();
            assert_eq!((got.as_slice(), sp.source_ranges_fail_closed), (nets, closed), "{ranges:?} {:?}", m.family());
            assert_eq!(sp.restricts_sources(), closed || !nets.is_empty());
        }
    }
}
