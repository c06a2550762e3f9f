//! Dual-stack clusters for the benchmarks: the generator's IPv4 cluster
//! with an IPv6 half, as a dual-stack cluster's API server shows it. Every
//! Service becomes RequireDualStack with an IPv6 ClusterIP (and its
//! externalIPs and load-balancer IPs gain IPv6 twins), every IPv4
//! EndpointSlice gets an IPv6 twin (`<name>-v6`, addressType IPv6) with the
//! same endpoints' IPv6 addresses, and the Node an IPv6 InternalIP.
//! IPv4 addresses map one to one into fd00::/16 (`fd00::a60:1` for
//! 10.96.0.1), so changes to the IPv4 cluster map to the same changes in
//! the IPv6 half.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use serde_json::Value;

use crate::fixtures::from_json;
use crate::msgs::{Change, SourceEvent};

/// The IPv6 twin of an IPv4 address.
pub fn v6_of(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from((0xfd00u128 << 112) | u128::from(u32::from(v4)))
}

/// The IPv6 twin of an address text; other text unchanged.
fn twin(text: &str) -> Option<String> {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => Some(v6_of(v4).to_string()),
        _ => None,
    }
}

/// Appends the IPv6 twins of the strings in array `v`.
fn add_twins(v: &mut Value) {
    if let Some(list) = v.as_array_mut() {
        let twins: Vec<Value> = list.iter().filter_map(Value::as_str).filter_map(twin).map(Value::from).collect();
        list.extend(twins);
    }
}

fn dual_service(svc: &k8s_openapi::api::core::v1::Service) -> k8s_openapi::api::core::v1::Service {
    let mut v = serde_json::to_value(svc).unwrap_or_default();
    if let Some(spec) = v.get_mut("spec") {
        add_twins(&mut spec["clusterIPs"]);
        if !spec["externalIPs"].is_null() {
            add_twins(&mut spec["externalIPs"]);
        }
        spec["ipFamilies"] = serde_json::json!(["IPv4", "IPv6"]);
        spec["ipFamilyPolicy"] = Value::from("RequireDualStack");
    }
    if let Some(ingress) = v.pointer_mut("/status/loadBalancer/ingress").and_then(Value::as_array_mut) {
        let twins: Vec<Value> = ingress
            .iter()
            .filter_map(|i| i["ip"].as_str().and_then(twin))
            .map(|ip| serde_json::json!({"ip": ip}))
            .collect();
        ingress.extend(twins);
    }
    from_json(v)
}

fn v6_slice(
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> Option<k8s_openapi::api::discovery::v1::EndpointSlice> {
    if slice.address_type != "IPv4" {
        return None;
    }
    let mut v = serde_json::to_value(slice).ok()?;
    let name = format!("{}-v6", v["metadata"]["name"].as_str().unwrap_or_default());
    v["metadata"]["name"] = Value::from(name);
    v["addressType"] = Value::from("IPv6");
    if let Some(eps) = v["endpoints"].as_array_mut() {
        for ep in eps {
            if let Some(addrs) = ep["addresses"].as_array_mut() {
                for a in addrs.iter_mut() {
                    if let Some(t) = a.as_str().and_then(twin) {
                        *a = Value::from(t);
                    }
                }
            }
        }
    }
    Some(from_json(v))
}

fn dual_node(node: &k8s_openapi::api::core::v1::Node) -> k8s_openapi::api::core::v1::Node {
    let mut v = serde_json::to_value(node).unwrap_or_default();
    if let Some(addrs) = v.pointer_mut("/status/addresses").and_then(Value::as_array_mut) {
        let twins: Vec<Value> = addrs
            .iter()
            .filter(|a| a["type"] == "InternalIP")
            .filter_map(|a| a["address"].as_str().and_then(twin))
            .map(|ip| serde_json::json!({"type": "InternalIP", "address": ip}))
            .collect();
        addrs.extend(twins);
    }
    from_json(v)
}

fn same<T>(change: &Change<T>, object: T) -> Change<T> {
    match change {
        Change::Applied(_) => Change::Applied(Arc::new(object)),
        Change::Deleted(_) => Change::Deleted(Arc::new(object)),
    }
}

/// `events` of an IPv4 cluster, as the same cluster's dual-stack twin sends them.
pub fn dual_stack(events: &[SourceEvent]) -> Vec<SourceEvent> {
    dual_stack_every(events, 1)
}

/// `events` of an IPv4 cluster on a dual-stack node where every `every`-th
/// Service (the first, then every `every`-th in event order) is dual-stack
/// with its slices' IPv6 twins; the other Services stay IPv4 only. With
/// `every` over 1 a slice is twinned only when its Service's event came
/// earlier in `events`.
pub fn dual_stack_every(events: &[SourceEvent], every: usize) -> Vec<SourceEvent> {
    let every = every.max(1);
    let mut dual = std::collections::HashSet::new();
    let mut services = 0usize;
    let mut out = Vec::with_capacity(events.len() * 2);
    for ev in events {
        match ev {
            SourceEvent::Service(c) => {
                services += 1;
                if (services - 1) % every != 0 {
                    out.push(ev.clone());
                    continue;
                }
                let meta = &c.object().metadata;
                dual.insert((meta.namespace.clone(), meta.name.clone()));
                out.push(SourceEvent::Service(same(c, dual_service(c.object()))));
            }
            SourceEvent::EndpointSlice(c) => {
                out.push(ev.clone());
                let meta = &c.object().metadata;
                let service = meta.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).cloned();
                // With every Service dual-stack, every slice has its twin, also
                // in a batch of slice changes without their Services.
                if every > 1 && !dual.contains(&(meta.namespace.clone(), service)) {
                    continue;
                }
                if let Some(s) = v6_slice(c.object()) {
                    out.push(SourceEvent::EndpointSlice(same(c, s)));
                }
            }
            SourceEvent::Node(c) => out.push(SourceEvent::Node(same(c, dual_node(c.object())))),
            SourceEvent::ServiceCidr(_) | SourceEvent::Synced(_) => out.push(ev.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::model::Model;
    use crate::net::IpFamily;

    #[test]
    fn every_second_service_is_dual_stack_with_its_slices_twins() {
        let svc = |name, ip| applied_service(service("default", name, ip, &[("http", "TCP", 80, 0)]));
        let sl =
            |name, svc| applied_slice(slice("default", name, svc, &[("http", "TCP", 8080)], &[ep("10.1.0.5", "n")]));
        let events = [svc("a", "10.96.0.1"), svc("b", "10.96.0.2"), sl("a-1", "a"), sl("b-1", "b")];
        let out = dual_stack_every(&events, 2);
        let families: Vec<Option<Vec<String>>> = (out.iter())
            .filter_map(|e| match e {
                SourceEvent::Service(c) => Some(c.object().spec.as_ref().and_then(|s| s.ip_families.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(families, [Some(vec!["IPv4".to_string(), "IPv6".to_string()]), None]);
        let slices: Vec<String> = (out.iter())
            .filter_map(|e| match e {
                SourceEvent::EndpointSlice(c) => c.object().metadata.name.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(slices, ["a-1", "a-1-v6", "b-1"]);
    }

    #[test]
    fn a_batch_of_slice_changes_alone_gets_its_twins() {
        let sl = applied_slice(slice("default", "a-1", "a", &[("http", "TCP", 8080)], &[ep("10.1.0.5", "n")]));
        let names: Vec<String> = (dual_stack(&[sl]).iter())
            .filter_map(|e| match e {
                SourceEvent::EndpointSlice(c) => c.object().metadata.name.clone(),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["a-1", "a-1-v6"]);
    }

    #[test]
    fn the_twin_cluster_has_the_same_ports_and_endpoints_in_each_family() {
        let svc = service("default", "web", "10.96.0.1", &[("http", "TCP", 80, 30080)]);
        let sl = slice("default", "web-1", "web", &[("http", "TCP", 8080)], &[ep("10.1.0.5", "node-0")]);
        let events = dual_stack(&[applied_service(svc), applied_slice(sl)]);
        assert_eq!(events.len(), 3);
        for family in [IpFamily::V4, IpFamily::V6] {
            let mut m = Model::new(family, "node-0");
            for ev in &events {
                m.record(ev).unwrap();
            }
            m.apply();
            let ports: Vec<_> = m.service_ports().collect();
            assert_eq!(ports.len(), 1, "{family:?}");
            let want: IpAddr = match family {
                IpFamily::V4 => "10.96.0.1".parse().unwrap(),
                IpFamily::V6 => "fd00::a60:1".parse().unwrap(),
            };
            assert_eq!(ports[0].cluster_ip, want);
            let eps = m.endpoints(&ports[0].name);
            assert_eq!(eps.len(), 1, "{family:?}");
            assert!(family.matches(&eps[0].ip));
        }
    }
}
