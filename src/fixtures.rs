//! Builders for Services, EndpointSlices, Nodes and ServiceCIDRs, for
//! tests, benchmarks and the cluster generator. Not used by the daemon itself.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{json, Value};

use crate::msgs::{Change, SourceEvent};

/// A Service port: (name, protocol, port, nodePort).
pub type PortSpec<'a> = (&'a str, &'a str, i32, i32);

/// A ClusterIP Service. `ports` are (name, protocol, port, nodePort); a
/// non-zero nodePort makes it type NodePort.
pub fn service(ns: &str, name: &str, cluster_ip: &str, ports: &[PortSpec]) -> Service {
    let node_port = ports.iter().any(|p| p.3 != 0);
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, proto, port, np)| {
            let mut p = json!({"name": n, "protocol": proto, "port": port, "targetPort": port});
            if *np != 0 {
                p["nodePort"] = json!(np);
            }
            p
        })
        .collect();
    from_json(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {
            "type": if node_port { "NodePort" } else { "ClusterIP" },
            "clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": ports,
        }
    }))
}

/// `svc` with these annotations added.
pub fn annotated(mut svc: Service, annotations: &[(&str, &str)]) -> Service {
    let map = svc.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in annotations {
        map.insert(k.to_string(), v.to_string());
    }
    svc
}

/// One endpoint of a slice.
#[derive(Debug, Clone)]
pub struct Ep {
    pub ip: String,
    pub node: Option<String>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub zones: Vec<String>,
    pub nodes: Vec<String>,
}

/// A ready endpoint on `node`.
pub fn ep(ip: &str, node: &str) -> Ep {
    Ep {
        ip: ip.into(),
        node: Some(node.into()),
        ready: Some(true),
        serving: Some(true),
        terminating: Some(false),
        zones: vec![],
        nodes: vec![],
    }
}

impl Ep {
    /// Terminating but still serving.
    pub fn terminating(mut self) -> Ep {
        self.ready = Some(false);
        self.serving = Some(true);
        self.terminating = Some(true);
        self
    }

    pub fn not_ready(mut self) -> Ep {
        self.ready = Some(false);
        self.serving = Some(false);
        self
    }

    pub fn zone_hint(mut self, zone: &str) -> Ep {
        self.zones.push(zone.into());
        self
    }

    pub fn node_hint(mut self, node: &str) -> Ep {
        self.nodes.push(node.into());
        self
    }
}

/// An EndpointSlice of service `svc`; `ports` are (name, protocol, port).
pub fn slice(ns: &str, name: &str, svc: &str, ports: &[(&str, &str, i32)], eps: &[Ep]) -> EndpointSlice {
    let ports: Vec<Value> = ports.iter().map(|(n, p, port)| json!({"name": n, "protocol": p, "port": port})).collect();
    let eps: Vec<Value> = eps
        .iter()
        .map(|e| {
            let mut v = json!({
                "addresses": [e.ip],
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating},
            });
            if let Some(n) = &e.node {
                v["nodeName"] = json!(n);
            }
            if !e.zones.is_empty() {
                let z: Vec<Value> = e.zones.iter().map(|z| json!({"name": z})).collect();
                v["hints"]["forZones"] = json!(z);
            }
            if !e.nodes.is_empty() {
                let n: Vec<Value> = e.nodes.iter().map(|n| json!({"name": n})).collect();
                v["hints"]["forNodes"] = json!(n);
            }
            v
        })
        .collect();
    from_json(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "ports": ports, "endpoints": eps,
    }))
}

/// A Node with one InternalIP and a zone label.
pub fn node(name: &str, ip: &str, zone: &str) -> Node {
    from_json(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone, "kubernetes.io/hostname": name}},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}]},
    }))
}

/// Deserializes a literal object. Panics on a bad literal: fixtures only.
pub fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    match serde_json::from_value(v) {
        Ok(t) => t,
        Err(e) => panic!("bad fixture: {e}"),
    }
}

pub fn applied_service(s: Service) -> SourceEvent {
    SourceEvent::Service(Change::Applied(Arc::new(s)))
}

pub fn deleted_service(s: Service) -> SourceEvent {
    SourceEvent::Service(Change::Deleted(Arc::new(s)))
}

pub fn applied_slice(s: EndpointSlice) -> SourceEvent {
    SourceEvent::EndpointSlice(Change::Applied(Arc::new(s)))
}

pub fn deleted_slice(s: EndpointSlice) -> SourceEvent {
    SourceEvent::EndpointSlice(Change::Deleted(Arc::new(s)))
}

/// A ServiceCIDR named `name` holding `cidrs`.
pub fn service_cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
    ServiceCIDR {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        spec: Some(ServiceCIDRSpec { cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()) }),
        status: None,
    }
}

pub fn applied_service_cidr(name: &str, cidrs: &[&str]) -> SourceEvent {
    SourceEvent::ServiceCidr(Change::Applied(Arc::new(service_cidr(name, cidrs))))
}

/// A ServiceCIDR's deletion, as the sources send it: its name alone.
pub fn deleted_service_cidr(name: &str) -> SourceEvent {
    SourceEvent::ServiceCidr(Change::Deleted(Arc::new(service_cidr(name, &[]))))
}

/// iptables-mode settings as a test or benchmark node has them: masquerade
/// bit 14, `--random-fully`, localhost NodePorts on, no local detector, no
/// nfacct, `tcp_be_liberal` off.
pub fn iptables_settings(
    family: crate::net::IpFamily,
    node_name: &str,
    node_ports: crate::plan::context::NodePortFilter,
) -> crate::plan::iptables::IptablesSettings {
    crate::plan::iptables::IptablesSettings {
        family,
        node_name: node_name.to_string(),
        masquerade_all: false,
        masquerade_bit: 14,
        local: crate::plan::local::LocalDetector::None,
        random_fully: true,
        localhost_node_ports: true,
        node_ports,
        conntrack_tcp_liberal: false,
        nfacct_ct_state_invalid: false,
        nfacct_localhost_node_ports: false,
    }
}
