use std::collections::HashSet;
use std::net::IpAddr;

use super::*;
use crate::model::Model;
use crate::msgs::Change;
use crate::net::IpFamily;

fn spec(services: usize, eps: usize) -> ClusterSpec {
    ClusterSpec { services, endpoints_per_service: eps, nodes: 20, seed: 42 }
}

fn debug(evs: &[SourceEvent]) -> Vec<String> {
    evs.iter().map(|e| format!("{e:?}")).collect()
}

#[test]
fn same_seed_same_events_other_seed_other_events() {
    let a = generate(spec(300, 5)).unwrap();
    let b = generate(spec(300, 5)).unwrap();
    assert_eq!(debug(&a), debug(&b));
    let c = generate(ClusterSpec { seed: 43, ..spec(300, 5) }).unwrap();
    assert_ne!(debug(&a), debug(&c));
    let mut x = Cluster::new(spec(300, 5)).unwrap();
    let mut y = Cluster::new(spec(300, 5)).unwrap();
    let cx: Vec<_> = x.churn(50, 3).iter().map(|b| debug(b)).collect();
    let cy: Vec<_> = y.churn(50, 3).iter().map(|b| debug(b)).collect();
    assert_eq!(cx, cy);
}

#[test]
fn counts() {
    let c = Cluster::new(spec(1000, 10)).unwrap();
    assert_eq!(c.services().len(), 1000);
    assert!(c.services().iter().all(|s| s.endpoints().count() == 10 && s.slices.len() == 1));
    let evs = c.initial_events();
    let count = |f: fn(&SourceEvent) -> bool| evs.iter().filter(|e| f(e)).count();
    assert_eq!(count(|e| matches!(e, SourceEvent::Service(Change::Applied(_)))), 1000);
    assert_eq!(count(|e| matches!(e, SourceEvent::EndpointSlice(Change::Applied(_)))), 1000);
    assert_eq!(count(|e| matches!(e, SourceEvent::Node(_))), 1);
    assert_eq!(count(|e| matches!(e, SourceEvent::Synced(_))), 2);
    // The mix: each kind is present, ClusterIP and TCP dominate.
    let n = |f: &dyn Fn(&GenService) -> bool| c.services().iter().filter(|s| f(s)).count();
    let cluster_ip = n(&|s| s.type_ == ServiceType::ClusterIp);
    assert!((780..=920).contains(&cluster_ip), "{cluster_ip}");
    assert!(n(&|s| s.type_ == ServiceType::NodePort) > 50);
    assert!(n(&|s| s.type_ == ServiceType::LoadBalancer && s.lb_ip.is_some()) > 20);
    assert!(n(&|s| s.ports.iter().any(|p| p.protocol == "UDP")) > 50);
    assert!(n(&|s| s.client_ip_affinity) > 20);
    assert!(n(&|s| s.external_local) > 20);
    assert!(n(&|s| s.internal_local) > 5);
    assert!(n(&|s| s.health_check_node_port != 0) > 5);
    let local = c.services().iter().flat_map(|s| s.endpoints()).filter(|e| e.node == 0).count();
    assert!((250..=750).contains(&local), "about 1/20 of 10000 endpoints on this node: {local}");
    // Large services are split into slices of at most 100.
    let big = Cluster::new(spec(3, 250)).unwrap();
    assert!(big
        .services()
        .iter()
        .all(|s| s.slices.iter().map(|sl| sl.endpoints.len()).collect::<Vec<_>>() == vec![100, 100, 50]));
}

fn assert_unique(c: &Cluster) {
    let mut ips = HashSet::new();
    let mut node_ports = HashSet::new();
    let svc_range: ipnet::Ipv4Net = "10.96.0.0/12".parse().unwrap();
    let pod_range: ipnet::Ipv4Net = "10.0.0.0/8".parse().unwrap();
    for s in c.services() {
        assert!(svc_range.contains(&s.cluster_ip), "{}", s.cluster_ip);
        assert!(ips.insert(s.cluster_ip), "duplicate cluster IP {}", s.cluster_ip);
        if let Some(ip) = s.lb_ip {
            assert!(ips.insert(ip), "duplicate LB IP {ip}");
        }
        for p in s.ports.iter().map(|p| p.node_port).chain([s.health_check_node_port]).filter(|p| *p != 0) {
            assert!(node_ports.insert(p), "duplicate node port {p}");
        }
        for e in s.endpoints() {
            assert!(pod_range.contains(&e.ip) && !svc_range.contains(&e.ip), "{}", e.ip);
            assert!(ips.insert(e.ip), "duplicate pod IP {}", e.ip);
        }
    }
}

#[test]
fn addresses_and_node_ports_are_unique_also_after_churn() {
    let mut c = Cluster::new(spec(5000, 10)).unwrap();
    assert_unique(&c);
    let mut kinds = HashSet::new();
    for _ in 0..3000 {
        kinds.insert(c.next_change().0);
    }
    assert_eq!(kinds.len(), 6, "every kind of change happens: {kinds:?}");
    assert_unique(&c);
}

#[test]
fn the_model_takes_every_event_and_sees_the_endpoints() {
    let mut c = Cluster::new(spec(200, 4)).unwrap();
    let mut model = Model::new(IpFamily::V4, THIS_NODE);
    for ev in c.initial_events() {
        model.record(&ev).unwrap();
    }
    let changes = model.apply();
    assert!(model.is_initialized());
    assert_eq!(model.service_count(), 200);
    let ports: usize = c.services().iter().map(|s| s.ports.len()).sum();
    assert_eq!(changes.ports.len(), ports);
    let eps: usize = model.service_ports().map(|sp| model.endpoints(&sp.name).len()).sum();
    let want: usize = c.services().iter().map(|s| s.ports.len() * s.endpoints().count()).sum();
    assert_eq!(eps, want);
    let lb = model.service_ports().filter(|sp| !sp.load_balancer_vips.is_empty()).count();
    assert!(lb > 0);
    for _ in 0..200 {
        let (kind, evs) = c.next_endpoint_change();
        assert_eq!(evs.len(), 1, "{kind:?}");
        for ev in &evs {
            model.record(ev).unwrap();
        }
        assert!(!model.apply().ports.is_empty(), "{kind:?} changed something");
    }
    let local: Vec<IpAddr> = model
        .service_ports()
        .flat_map(|sp| model.endpoints(&sp.name).iter().filter(|e| e.is_local).map(|e| e.ip))
        .collect();
    assert!(!local.is_empty());
}

#[test]
fn bad_specs_are_errors() {
    assert_eq!(Cluster::new(ClusterSpec { nodes: 0, ..spec(1, 1) }).err(), Some(GenError::NoNodes));
    assert!(matches!(Cluster::new(spec(1 << 20, 1)), Err(GenError::TooManyServices { .. })));
    assert!(matches!(Cluster::new(spec(100_000, 100)), Err(GenError::TooManyEndpoints { .. })));
}
