//! A deterministic cluster generator.
//!
//! [`Cluster::new`] builds a realistic mix of Services (ClusterIP mostly, some
//! NodePort and LoadBalancer with ingress IPs; TCP mostly, some UDP; some
//! ClientIP affinity; some external/internal traffic policy Local) with their
//! EndpointSlices spread over `nodes` nodes (this node is [`THIS_NODE`]).
//! [`Cluster::initial_events`] is what a source would emit for the initial
//! list; [`Cluster::next_change`] and [`Cluster::churn`] then produce a
//! stream of changes (endpoint added, removed, made not-ready or ready again;
//! service added, removed) as [`SourceEvent`] batches.
//!
//! Everything follows from [`ClusterSpec::seed`] through a SplitMix64 PRNG:
//! the same spec gives the same events. Cluster IPs are unique in
//! 10.96.0.0/12, pod IPs unique in 10.0.0.0/8 outside 10.96.0.0/12, and
//! neither is ever reused, not even after a removal.

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use crate::fixtures::{applied_service, applied_slice, deleted_service, deleted_slice, from_json, node};
use crate::msgs::{ResourceKind, SourceEvent};

/// The node the proxy runs on; endpoints on it are local.
pub const THIS_NODE: &str = "node-0";

/// Most endpoints an EndpointSlice holds (the EndpointSlice controller's default).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// Size of the 10.96.0.0/12 service range.
const CLUSTER_IP_SPACE: u32 = 1 << 20;
/// Size of the 10.0.0.0/8 pod range.
const POD_IP_SPACE: u32 = 1 << 24;
/// Offset of 10.96.0.0/12 inside 10.0.0.0/8 (pod IPs skip it).
const SERVICE_RANGE_IN_PODS: std::ops::Range<u32> = (96 << 16)..(112 << 16);
/// NodePort range, as upstream's default.
const NODE_PORTS: std::ops::RangeInclusive<i32> = 30000..=32767;
/// Namespaces the services are spread over.
const NAMESPACES: u64 = 50;

/// SplitMix64: a tiny, fast, well-mixed PRNG; enough for benchmarks.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterSpec {
    pub services: usize,
    pub endpoints_per_service: usize,
    pub nodes: usize,
    pub seed: u64,
}

/// A spec the generator cannot satisfy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenError {
    #[error("nodes must be at least 1")]
    NoNodes,
    #[error("{services} services do not fit in 10.96.0.0/12 with room for churn (at most {max})")]
    TooManyServices { services: usize, max: usize },
    #[error("{pods} endpoints do not fit in 10.0.0.0/8 with room for churn (at most {max})")]
    TooManyEndpoints { pods: usize, max: usize },
}

/// A Service's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

impl ServiceType {
    fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIp => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenPort {
    pub name: &'static str,
    pub protocol: &'static str,
    pub port: i32,
    pub target_port: i32,
    /// 0: none.
    pub node_port: i32,
}

/// One endpoint (pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenEndpoint {
    pub ip: Ipv4Addr,
    /// Index of the node it runs on (`node-{node}`).
    pub node: usize,
    pub ready: bool,
}

/// One EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenSlice {
    pub name: String,
    pub endpoints: Vec<GenEndpoint>,
}

/// One Service with its slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenService {
    pub namespace: String,
    pub name: String,
    pub type_: ServiceType,
    pub cluster_ip: Ipv4Addr,
    pub ports: Vec<GenPort>,
    /// LoadBalancer ingress IP.
    pub lb_ip: Option<Ipv4Addr>,
    /// 0: none (only LoadBalancer with externalTrafficPolicy Local has one).
    pub health_check_node_port: i32,
    pub client_ip_affinity: bool,
    pub external_local: bool,
    pub internal_local: bool,
    pub slices: Vec<GenSlice>,
    /// Slices created so far (names are never reused).
    next_slice: usize,
}

impl GenService {
    /// Every endpoint, over all slices.
    pub fn endpoints(&self) -> impl Iterator<Item = &GenEndpoint> {
        self.slices.iter().flat_map(|s| s.endpoints.iter())
    }

    /// The Service object.
    pub fn to_service(&self) -> k8s_openapi::api::core::v1::Service {
        let ports: Vec<Value> = self
            .ports
            .iter()
            .map(|p| {
                let mut v =
                    json!({"name": p.name, "protocol": p.protocol, "port": p.port, "targetPort": p.target_port});
                if p.node_port != 0 {
                    v["nodePort"] = json!(p.node_port);
                }
                v
            })
            .collect();
        let mut spec = json!({
            "type": self.type_.as_str(),
            "clusterIP": self.cluster_ip.to_string(),
            "clusterIPs": [self.cluster_ip.to_string()],
            "ports": ports,
            "selector": {"app": self.name},
            "sessionAffinity": if self.client_ip_affinity { "ClientIP" } else { "None" },
            "internalTrafficPolicy": if self.internal_local { "Local" } else { "Cluster" },
        });
        if self.client_ip_affinity {
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
        }
        if self.type_ != ServiceType::ClusterIp {
            spec["externalTrafficPolicy"] = json!(if self.external_local { "Local" } else { "Cluster" });
        }
        if self.health_check_node_port != 0 {
            spec["healthCheckNodePort"] = json!(self.health_check_node_port);
        }
        let mut svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": spec,
        });
        if let Some(ip) = self.lb_ip {
            svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip.to_string(), "ipMode": "VIP"}]}});
        }
        from_json(svc)
    }

    /// One of its EndpointSlice objects.
    pub fn to_slice(&self, slice: &GenSlice) -> k8s_openapi::api::discovery::v1::EndpointSlice {
        let ports: Vec<Value> =
            self.ports.iter().map(|p| json!({"name": p.name, "protocol": p.protocol, "port": p.target_port})).collect();
        let eps: Vec<Value> = slice
            .endpoints
            .iter()
            .map(|e| {
                json!({
                    "addresses": [e.ip.to_string()],
                    "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false},
                    "nodeName": node_name(e.node),
                    "zone": zone(e.node),
                })
            })
            .collect();
        from_json(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "namespace": self.namespace, "name": slice.name,
                "labels": {"kubernetes.io/service-name": self.name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
            },
            "addressType": "IPv4", "ports": ports, "endpoints": eps,
        }))
    }

    fn applied(&self) -> Vec<SourceEvent> {
        let mut out = vec![applied_service(self.to_service())];
        out.extend(self.slices.iter().map(|s| applied_slice(self.to_slice(s))));
        out
    }

    fn deleted(&self) -> Vec<SourceEvent> {
        let mut out = vec![deleted_service(self.to_service())];
        out.extend(self.slices.iter().map(|s| deleted_slice(self.to_slice(s))));
        out
    }
}

/// `node-{i}`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// The InternalIP of node `i`: 192.168.0.0/16, node-0 is 192.168.0.1.
pub fn node_ip(i: usize) -> Ipv4Addr {
    let n = (i % 65_000) as u32 + 1;
    Ipv4Addr::from(u32::from(Ipv4Addr::new(192, 168, 0, 0)) + n)
}

/// Nodes are spread over three zones.
fn zone(i: usize) -> String {
    format!("zone-{}", i % 3)
}

/// The kinds of change the churn stream makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChurnKind {
    EndpointAdded,
    EndpointRemoved,
    EndpointNotReady,
    /// A not-ready endpoint becomes ready again (keeps the mix steady).
    EndpointReady,
    ServiceAdded,
    ServiceRemoved,
}

/// A generated cluster: its current state and the generator that changes it.
#[derive(Debug, Clone)]
pub struct Cluster {
    spec: ClusterSpec,
    rng: SplitMix64,
    services: Vec<GenService>,
    /// Services created so far (names are never reused).
    created: usize,
    cluster_ips: Permutation,
    pod_ips: Permutation,
    lb_ips: u32,
    free_node_ports: Vec<i32>,
}

/// A bijection of `0..space` (multiply by an odd number, add, mod a power
/// of two): unique addresses in a seed-dependent order.
#[derive(Debug, Clone)]
struct Permutation {
    space: u32,
    mul: u32,
    add: u32,
    next: u32,
}

impl Permutation {
    fn new(space: u32, rng: &mut SplitMix64) -> Permutation {
        let mul = (rng.next_u64() as u32 | 1) & (space - 1);
        let add = rng.next_u64() as u32 & (space - 1);
        Permutation { space, mul: mul.max(1), add, next: 0 }
    }

    /// The next offset accepted by `ok`; None once the space is used up.
    fn next(&mut self, ok: impl Fn(u32) -> bool) -> Option<u32> {
        while self.next < self.space {
            let v = self.next.wrapping_mul(self.mul).wrapping_add(self.add) & (self.space - 1);
            self.next += 1;
            if ok(v) {
                return Some(v);
            }
        }
        None
    }
}

/// A usable host address: not the network's .0 nor a .255.
fn host_octets_ok(v: u32) -> bool {
    let last = v & 0xff;
    last != 0 && last != 255
}

impl Cluster {
    /// Generates the initial cluster.
    pub fn new(spec: ClusterSpec) -> Result<Cluster, GenError> {
        if spec.nodes == 0 {
            return Err(GenError::NoNodes);
        }
        let max_services = (CLUSTER_IP_SPACE / 2) as usize;
        if spec.services > max_services {
            return Err(GenError::TooManyServices { services: spec.services, max: max_services });
        }
        let pods = spec.services.saturating_mul(spec.endpoints_per_service);
        let max_pods = (POD_IP_SPACE / 2) as usize;
        if pods > max_pods {
            return Err(GenError::TooManyEndpoints { pods, max: max_pods });
        }
        let mut rng = SplitMix64::new(spec.seed);
        let cluster_ips = Permutation::new(CLUSTER_IP_SPACE, &mut rng);
        let pod_ips = Permutation::new(POD_IP_SPACE, &mut rng);
        let mut c = Cluster {
            spec,
            rng,
            services: Vec::with_capacity(spec.services),
            created: 0,
            cluster_ips,
            pod_ips,
            lb_ips: 0,
            free_node_ports: NODE_PORTS.rev().collect(),
        };
        for _ in 0..spec.services {
            match c.new_service() {
                Some(s) => c.services.push(s),
                None => break,
            }
        }
        Ok(c)
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// The current services.
    pub fn services(&self) -> &[GenService] {
        &self.services
    }

    /// What a source emits for the initial list: this node, every Service
    /// and EndpointSlice, then `Synced` for both kinds.
    pub fn initial_events(&self) -> Vec<SourceEvent> {
        let mut out = Vec::with_capacity(2 * self.services.len() + 3);
        out.push(SourceEvent::Node(crate::msgs::Change::Applied(std::sync::Arc::new(node(
            THIS_NODE,
            &node_ip(0).to_string(),
            &zone(0),
        )))));
        for s in &self.services {
            out.extend(s.applied());
        }
        out.push(SourceEvent::Synced(ResourceKind::Service));
        out.push(SourceEvent::Synced(ResourceKind::EndpointSlice));
        out
    }

    fn cluster_ip(&mut self) -> Option<Ipv4Addr> {
        let v = self.cluster_ips.next(|v| v >= 2 && host_octets_ok(v))?;
        Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + v))
    }

    fn pod_ip(&mut self) -> Option<Ipv4Addr> {
        let v = self.pod_ips.next(|v| !SERVICE_RANGE_IN_PODS.contains(&v) && host_octets_ok(v))?;
        Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + v))
    }

    /// LoadBalancer ingress IPs: 172.16.0.0/12, in order.
    fn lb_ip(&mut self) -> Option<Ipv4Addr> {
        loop {
            if self.lb_ips >= 1 << 20 {
                return None;
            }
            let v = self.lb_ips;
            self.lb_ips += 1;
            if host_octets_ok(v) {
                return Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + v));
            }
        }
    }

    fn endpoint(&mut self) -> Option<GenEndpoint> {
        let ip = self.pod_ip()?;
        let node = self.rng.below(self.spec.nodes as u64) as usize;
        Some(GenEndpoint { ip, node, ready: true })
    }

    /// A new service with its endpoints; None once addresses run out.
    fn new_service(&mut self) -> Option<GenService> {
        let i = self.created;
        self.created += 1;
        let cluster_ip = self.cluster_ip()?;
        let r = &mut self.rng;
        let mut type_ = match r.below(100) {
            0..85 => ServiceType::ClusterIp,
            85..95 => ServiceType::NodePort,
            _ => ServiceType::LoadBalancer,
        };
        let mut ports = match r.below(100) {
            // DNS-like: the same port over UDP and TCP.
            0..3 => vec![port("dns", "UDP", 53, 53), port("dns-tcp", "TCP", 53, 53)],
            3..10 => vec![port("udp", "UDP", 5000 + r.below(1000) as i32, 5000)],
            10..30 => vec![port("http", "TCP", 80, 8080), port("https", "TCP", 443, 8443)],
            _ => vec![port("http", "TCP", 80 + r.below(2) as i32 * 8000, 8080)],
        };
        let client_ip_affinity = r.percent(5);
        let internal_local = r.percent(3);
        let mut external_local = r.percent(30);
        if type_ != ServiceType::ClusterIp {
            let needed = ports.len() + usize::from(type_ == ServiceType::LoadBalancer && external_local);
            if self.free_node_ports.len() < needed {
                type_ = ServiceType::ClusterIp;
            } else {
                for p in &mut ports {
                    p.node_port = self.free_node_ports.pop().unwrap_or(0);
                }
            }
        }
        if type_ == ServiceType::ClusterIp {
            external_local = false;
        }
        let health_check_node_port = if type_ == ServiceType::LoadBalancer && external_local {
            self.free_node_ports.pop().unwrap_or(0)
        } else {
            0
        };
        let lb_ip = if type_ == ServiceType::LoadBalancer { self.lb_ip() } else { None };
        let mut svc = GenService {
            namespace: format!("ns-{}", i as u64 % NAMESPACES),
            name: format!("svc-{i}"),
            type_,
            cluster_ip,
            ports,
            lb_ip,
            health_check_node_port,
            client_ip_affinity,
            external_local,
            internal_local,
            slices: Vec::new(),
            next_slice: 0,
        };
        for _ in 0..self.spec.endpoints_per_service {
            let ep = self.endpoint()?;
            self.push_endpoint(&mut svc, ep);
        }
        if svc.slices.is_empty() {
            // The controller keeps one (empty) slice for a service without endpoints.
            new_slice(&mut svc);
        }
        Some(svc)
    }

    /// Appends to the last slice, or a new one if that is full; returns the slice's index.
    fn push_endpoint(&mut self, svc: &mut GenService, ep: GenEndpoint) -> usize {
        let idx = match svc.slices.last() {
            Some(s) if s.endpoints.len() < MAX_ENDPOINTS_PER_SLICE => svc.slices.len() - 1,
            _ => new_slice(svc),
        };
        svc.slices[idx].endpoints.push(ep);
        idx
    }

    fn release(&mut self, svc: &GenService) {
        self.free_node_ports.extend(svc.ports.iter().map(|p| p.node_port).filter(|p| *p != 0));
        if svc.health_check_node_port != 0 {
            self.free_node_ports.push(svc.health_check_node_port);
        }
    }

    /// One change of the steady churn mix: 30% endpoint added, 30% removed,
    /// 15% made not-ready, 15% made ready again, 5% service added, 5%
    /// service removed. Returns what it did and the events a source emits.
    /// A change that is impossible right now (nothing to remove, addresses
    /// used up) falls back to another kind.
    pub fn next_change(&mut self) -> (ChurnKind, Vec<SourceEvent>) {
        let kind = match self.rng.below(100) {
            0..90 => return self.next_endpoint_change(),
            90..95 => ChurnKind::ServiceAdded,
            _ => ChurnKind::ServiceRemoved,
        };
        if let Some(ev) = self.service_change(kind) {
            return (kind, ev);
        }
        self.next_endpoint_change()
    }

    /// One endpoint change (added, removed, made not-ready, made ready
    /// again) in one random service: one EndpointSlice update.
    pub fn next_endpoint_change(&mut self) -> (ChurnKind, Vec<SourceEvent>) {
        let first = match self.rng.below(90) {
            0..30 => ChurnKind::EndpointAdded,
            30..60 => ChurnKind::EndpointRemoved,
            60..75 => ChurnKind::EndpointNotReady,
            _ => ChurnKind::EndpointReady,
        };
        // If the pick is impossible in this service, try the other kinds in turn.
        let order = [
            ChurnKind::EndpointAdded,
            ChurnKind::EndpointRemoved,
            ChurnKind::EndpointNotReady,
            ChurnKind::EndpointReady,
        ];
        let start = order.iter().position(|k| *k == first).unwrap_or(0);
        if self.services.is_empty() {
            if let Some(ev) = self.service_change(ChurnKind::ServiceAdded) {
                return (ChurnKind::ServiceAdded, ev);
            }
            return (ChurnKind::ServiceAdded, Vec::new());
        }
        let si = self.rng.below(self.services.len() as u64) as usize;
        for k in 0..order.len() {
            let kind = order[(start + k) % order.len()];
            if let Some(ev) = self.endpoint_change(si, kind) {
                return (kind, ev);
            }
        }
        (first, Vec::new())
    }

    /// `batches` batches of `per_batch` changes each (the stream a source
    /// emits when several changes arrive together).
    pub fn churn(&mut self, batches: usize, per_batch: usize) -> Vec<Vec<SourceEvent>> {
        (0..batches).map(|_| (0..per_batch).flat_map(|_| self.next_change().1).collect()).collect()
    }

    fn endpoint_change(&mut self, si: usize, kind: ChurnKind) -> Option<Vec<SourceEvent>> {
        let slice_idx = match kind {
            ChurnKind::EndpointAdded => {
                let ep = self.endpoint()?;
                let mut svc = std::mem::take(&mut self.services[si]);
                let idx = self.push_endpoint(&mut svc, ep);
                self.services[si] = svc;
                idx
            }
            ChurnKind::EndpointRemoved | ChurnKind::EndpointNotReady | ChurnKind::EndpointReady => {
                let want_ready = kind != ChurnKind::EndpointReady;
                let svc = &self.services[si];
                let candidates: Vec<(usize, usize)> = svc
                    .slices
                    .iter()
                    .enumerate()
                    .flat_map(|(s, sl)| sl.endpoints.iter().enumerate().map(move |(e, ep)| (s, e, ep.ready)))
                    .filter(|(_, _, ready)| kind == ChurnKind::EndpointRemoved || *ready == want_ready)
                    .map(|(s, e, _)| (s, e))
                    .collect();
                if candidates.is_empty() {
                    return None;
                }
                let (s, e) = candidates[self.rng.below(candidates.len() as u64) as usize];
                let eps = &mut self.services[si].slices[s].endpoints;
                match kind {
                    ChurnKind::EndpointRemoved => {
                        eps.remove(e);
                    }
                    _ => eps[e].ready = !want_ready,
                }
                s
            }
            ChurnKind::ServiceAdded | ChurnKind::ServiceRemoved => return None,
        };
        let svc = &self.services[si];
        Some(vec![applied_slice(svc.to_slice(&svc.slices[slice_idx]))])
    }

    fn service_change(&mut self, kind: ChurnKind) -> Option<Vec<SourceEvent>> {
        match kind {
            ChurnKind::ServiceAdded => {
                let svc = self.new_service()?;
                let ev = svc.applied();
                self.services.push(svc);
                Some(ev)
            }
            ChurnKind::ServiceRemoved if self.services.len() > 1 => {
                let si = self.rng.below(self.services.len() as u64) as usize;
                let svc = self.services.swap_remove(si);
                self.release(&svc);
                Some(svc.deleted())
            }
            _ => None,
        }
    }
}

impl Default for GenService {
    fn default() -> GenService {
        GenService {
            namespace: String::new(),
            name: String::new(),
            type_: ServiceType::ClusterIp,
            cluster_ip: Ipv4Addr::UNSPECIFIED,
            ports: Vec::new(),
            lb_ip: None,
            health_check_node_port: 0,
            client_ip_affinity: false,
            external_local: false,
            internal_local: false,
            slices: Vec::new(),
            next_slice: 0,
        }
    }
}

fn port(name: &'static str, protocol: &'static str, port: i32, target_port: i32) -> GenPort {
    GenPort { name, protocol, port, target_port, node_port: 0 }
}

/// Adds an empty slice; returns its index.
fn new_slice(svc: &mut GenService) -> usize {
    let name = format!("{}-{}", svc.name, svc.next_slice);
    svc.next_slice += 1;
    svc.slices.push(GenSlice { name, endpoints: Vec::new() });
    svc.slices.len() - 1
}

/// The initial events of a cluster (see [`Cluster::initial_events`]).
pub fn generate(spec: ClusterSpec) -> Result<Vec<SourceEvent>, GenError> {
    Ok(Cluster::new(spec)?.initial_events())
}

#[cfg(test)]
mod tests;
