//! EndpointSlices merge into endpoints per service port, as upstream's
//! EndpointSliceCache does (pkg/proxy/endpointslicecache.go).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::service::{namespaced_name, NamespacedName, ServicePortName, LABEL_HEADLESS};
use super::ModelError;
use crate::net::{join_host_port, parse_ip_sloppy, IpFamily, Protocol};

/// Label naming the Service an EndpointSlice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Annotation with the time of the change that triggered this slice's update.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// One backend of a service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    pub is_local: bool,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub zone_hints: BTreeSet<String>,
    pub node_hints: BTreeSet<String>,
}

impl fmt::Display for Endpoint {
    /// `ip:port`, the endpoint's identity upstream.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&join_host_port(&self.ip, self.port))
    }
}

/// An endpoint as read from a slice, before the port is known.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawEndpoint {
    ip: IpAddr,
    node_name: Option<String>,
    ready: bool,
    serving: bool,
    terminating: bool,
    zone_hints: BTreeSet<String>,
    node_hints: BTreeSet<String>,
}

/// The parts of one EndpointSlice the proxy uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceInfo {
    pub service: NamespacedName,
    pub name: String,
    ports: Vec<(String, Protocol, u16)>,
    endpoints: Vec<RawEndpoint>,
    pub trigger_time: Option<String>,
}

/// What a slice means to this proxier.
pub enum SliceKind {
    /// No service-name label, headless, or another address family: ignored.
    Ignored(&'static str),
    Slice(SliceInfo),
}

/// Parses a slice for `family`. Bad endpoint IPs are logged and skipped;
/// a slice without a service-name label is ignored as upstream does.
pub fn parse_slice(slice: &EndpointSlice, family: IpFamily) -> Result<SliceKind, ModelError> {
    let nn = namespaced_name(&slice.metadata);
    let labels = slice.metadata.labels.as_ref();
    if labels.is_some_and(|l| l.contains_key(LABEL_HEADLESS)) {
        return Ok(SliceKind::Ignored("headless"));
    }
    let Some(svc_name) = labels.and_then(|l| l.get(LABEL_SERVICE_NAME)).filter(|s| !s.is_empty()) else {
        return Ok(SliceKind::Ignored("no kubernetes.io/service-name label"));
    };
    if slice.address_type != family.slice_address_type() {
        return Ok(SliceKind::Ignored("other address type"));
    }
    let service = NamespacedName::new(&nn.namespace, svc_name);
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let Some(name) = p.name.clone() else {
            tracing::warn!(endpointslice = %nn, field = %format!("ports[{i}].name"), "ignoring port with nil name");
            continue;
        };
        let proto_text = p.protocol.as_deref().unwrap_or("TCP");
        let protocol = Protocol::from_k8s(proto_text)
            .ok_or_else(|| ModelError::field(&nn, "EndpointSlice", &format!("ports[{i}].protocol"), proto_text))?;
        match p.port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n != 0) {
            Some(port) => ports.push((name, protocol, port)),
            None => {
                tracing::warn!(endpointslice = %nn, field = %format!("ports[{i}].port"), value = ?p.port, "ignoring invalid endpoint port")
            }
        }
    }
    let mut endpoints = Vec::new();
    for (i, ep) in slice.endpoints.iter().enumerate() {
        let Some(addr) = ep.addresses.first() else {
            tracing::debug!(endpointslice = %nn, index = i, "ignoring endpoint with no addresses");
            continue;
        };
        let Some(ip) = parse_ip_sloppy(addr) else {
            tracing::warn!(endpointslice = %nn, field = %format!("endpoints[{i}].addresses[0]"), value = %addr, "ignoring invalid endpoint IP");
            continue;
        };
        if !family.matches(&ip) {
            continue;
        }
        let c = ep.conditions.as_ref();
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        let hints = ep.hints.as_ref();
        endpoints.push(RawEndpoint {
            ip,
            node_name: ep.node_name.clone(),
            ready,
            serving: c.and_then(|c| c.serving).unwrap_or(ready),
            terminating: c.and_then(|c| c.terminating).unwrap_or(false),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect(),
        });
    }
    let trigger_time = slice.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_TRIGGER_TIME)).cloned();
    Ok(SliceKind::Slice(SliceInfo { service, name: nn.name, ports, endpoints, trigger_time }))
}

/// Endpoints of one service port, sorted by address.
pub type EndpointList = Arc<Vec<Endpoint>>;

/// All current slices, grouped by service, with an index from slice to service.
#[derive(Debug, Default)]
pub struct SliceCache {
    by_service: BTreeMap<NamespacedName, BTreeMap<String, Arc<SliceInfo>>>,
    owner: HashMap<NamespacedName, NamespacedName>,
}

impl SliceCache {
    /// Stores (or replaces) a slice. Returns the services whose endpoints may
    /// have changed: its service, and the one it was filed under before if
    /// its service-name label changed.
    pub fn upsert(&mut self, slice: NamespacedName, info: SliceInfo) -> Vec<NamespacedName> {
        let svc = info.service.clone();
        let mut dirty = vec![svc.clone()];
        if let Some(old) = self.owner.get(&slice).filter(|old| **old != svc).cloned() {
            self.remove(&slice);
            dirty.push(old);
        }
        self.by_service.entry(svc.clone()).or_default().insert(info.name.clone(), Arc::new(info));
        self.owner.insert(slice, svc);
        dirty
    }

    /// Removes a slice by its namespace/name. Returns the service it belonged to.
    pub fn remove(&mut self, slice: &NamespacedName) -> Option<NamespacedName> {
        let svc = self.owner.remove(slice)?;
        if let Some(slices) = self.by_service.get_mut(&svc) {
            slices.remove(&slice.name);
            if slices.is_empty() {
                self.by_service.remove(&svc);
            }
        }
        Some(svc)
    }

    /// Merges every slice of `svc` into endpoints per service port (upstream's
    /// endpointInfoByServicePort + addEndpoints): slices in name order; the same
    /// ip:port in two slices is kept once, a local copy winning.
    pub fn endpoints_for(&self, svc: &NamespacedName, node_name: &str) -> BTreeMap<ServicePortName, EndpointList> {
        let mut by_port: BTreeMap<ServicePortName, BTreeMap<(IpAddr, u16), Endpoint>> = BTreeMap::new();
        for slice in self.by_service.get(svc).into_iter().flat_map(|m| m.values()) {
            for (port_name, protocol, port) in &slice.ports {
                let spn = ServicePortName { service: svc.clone(), port: port_name.clone(), protocol: *protocol };
                let set = by_port.entry(spn).or_default();
                for raw in &slice.endpoints {
                    let is_local = raw.node_name.as_deref() == Some(node_name);
                    let key = (raw.ip, *port);
                    if set.contains_key(&key) && !is_local {
                        continue;
                    }
                    set.insert(
                        key,
                        Endpoint {
                            ip: raw.ip,
                            port: *port,
                            is_local,
                            ready: raw.ready,
                            serving: raw.serving,
                            terminating: raw.terminating,
                            zone_hints: raw.zone_hints.clone(),
                            node_hints: raw.node_hints.clone(),
                        },
                    );
                }
            }
        }
        by_port.into_iter().map(|(spn, eps)| (spn, Arc::new(eps.into_values().collect()))).collect()
    }

    /// The trigger-time annotations of a service's slices.
    pub fn trigger_times(&self, svc: &NamespacedName) -> Vec<String> {
        self.by_service.get(svc).into_iter().flat_map(|m| m.values()).filter_map(|s| s.trigger_time.clone()).collect()
    }
}
