//! The soak's cluster: a varied set of Services and EndpointSlices as the
//! API server serves them (JSON objects), and a seeded stream of changes of
//! every kind, each one a few writes for the test API server.
//!
//! The mix: ClusterIP, NodePort and LoadBalancer Services (ingress IPs,
//! source ranges), externalIPs; TCP, UDP and SCTP ports, one to three per
//! Service; ClientIP session affinity; external and internal traffic
//! policy Local; one to three EndpointSlices per Service and family with
//! ready, not-ready and terminating (serving or not) endpoints, local
//! ([`NODE`]) or on other nodes. On a dual-stack cluster Services are
//! IPv4, IPv6 or both.
//!
//! Probe Services are the ones packets are sent to: ClusterIP, TCP and UDP
//! port 80 to [`PROBE_TARGET_PORT`], their endpoints the lab's backends
//! `b1..bN` (10.244.N.2, fd00:244:N::2) on this node. The stream changes
//! them too (a backend added, removed, made not-ready or terminating), and
//! always leaves each with at least one ready backend;
//! [`SoakCluster::probe_expectations`] says which backends each must reach.
//!
//! Everything follows from the seed ([`SplitMix64`]): the same spec gives
//! the same cluster and the same changes. Cluster IPs, external and
//! ingress IPs and pod IPs are never reused; NodePorts are, once freed.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::bench::gen::SplitMix64;

/// The node the daemon under test runs as.
pub const NODE: &str = "node-a";
/// Other nodes endpoints live on.
const OTHER_NODES: [&str; 3] = ["node-b", "node-c", "node-d"];
/// The port the lab's backends serve on (TCP and UDP).
pub const PROBE_TARGET_PORT: u16 = 8080;
/// The Services' namespace.
const NAMESPACE: &str = "soak";
/// NodePort range, as upstream's default.
const NODE_PORTS: std::ops::Range<u16> = 30000..32768;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    pub seed: u64,
    /// Services besides the probes.
    pub services: usize,
    /// Probe Services (packets are sent to them).
    pub probes: usize,
    /// The lab's backends `b1..=bN`.
    pub backends: usize,
    /// IPv6 and dual-stack Services too.
    pub dual_stack: bool,
}

/// One write for the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    Create(Value),
    Update(Value),
    Delete(Value),
}

/// The kinds of change the stream makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ChangeKind {
    AddService,
    DeleteService,
    /// A port added, removed, or its protocol or number changed.
    ServicePorts,
    /// Session affinity or a traffic policy toggled.
    ServicePolicy,
    /// ClusterIP, NodePort and LoadBalancer turned into another.
    ServiceType,
    /// A LoadBalancer's ingress IPs or source ranges changed.
    LoadBalancer,
    ExternalIps,
    AddSlice,
    DeleteSlice,
    EndpointAdded,
    EndpointRemoved,
    /// `ready` flipped.
    EndpointReady,
    /// Made terminating (serving or not), or back.
    EndpointTerminating,
    /// A probe Service's backends changed.
    ProbeBackends,
}

impl ChangeKind {
    /// Every kind, in the order [`SoakCluster::next_change`] draws from.
    pub const ALL: [ChangeKind; 14] = [
        ChangeKind::AddService,
        ChangeKind::DeleteService,
        ChangeKind::ServicePorts,
        ChangeKind::ServicePolicy,
        ChangeKind::ServiceType,
        ChangeKind::LoadBalancer,
        ChangeKind::ExternalIps,
        ChangeKind::AddSlice,
        ChangeKind::DeleteSlice,
        ChangeKind::EndpointAdded,
        ChangeKind::EndpointRemoved,
        ChangeKind::EndpointReady,
        ChangeKind::EndpointTerminating,
        ChangeKind::ProbeBackends,
    ];

    /// Relative weight in the stream: endpoint changes are the common case.
    fn weight(self) -> u64 {
        match self {
            ChangeKind::EndpointReady | ChangeKind::EndpointAdded | ChangeKind::EndpointRemoved => 12,
            ChangeKind::EndpointTerminating | ChangeKind::ProbeBackends => 8,
            ChangeKind::AddService | ChangeKind::DeleteService => 6,
            _ => 4,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn address_type(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SvcType {
    ClusterIp,
    NodePort,
    LoadBalancer,
}

#[derive(Debug, Clone)]
struct Port {
    name: String,
    protocol: &'static str,
    port: u16,
    target: u16,
    node_port: Option<u16>,
}

#[derive(Debug, Clone)]
struct Endpoint {
    /// Index into the address counter (its IP per family follows from it).
    ip: String,
    node: &'static str,
    ready: bool,
    serving: bool,
    terminating: bool,
}

#[derive(Debug, Clone)]
struct Slice {
    name: String,
    family: Family,
    endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone)]
struct Svc {
    name: String,
    probe: bool,
    kind: SvcType,
    /// (family, cluster IP), primary first.
    cluster_ips: Vec<(Family, String)>,
    ports: Vec<Port>,
    affinity: bool,
    etp_local: bool,
    /// A LoadBalancer with externalTrafficPolicy Local has one (the API
    /// server allocates it).
    health_check_node_port: Option<u16>,
    itp_local: bool,
    external_ips: Vec<String>,
    ingress: Vec<String>,
    source_ranges: Vec<String>,
    slices: Vec<Slice>,
}

/// The cluster and the generator that changes it.
#[derive(Debug, Clone)]
pub struct SoakCluster {
    spec: SoakSpec,
    rng: SplitMix64,
    services: BTreeMap<String, Svc>,
    /// Counters of never-reused names and addresses.
    next_service: u64,
    next_slice: u64,
    next_pod: u64,
    next_vip: u64,
    free_node_ports: BTreeSet<u16>,
}

impl SoakCluster {
    /// The initial cluster of `spec`.
    pub fn new(spec: SoakSpec) -> SoakCluster {
        let rng = SplitMix64::new(spec.seed);
        let mut c = SoakCluster {
            rng,
            services: BTreeMap::new(),
            next_service: 0,
            next_slice: 0,
            next_pod: 0,
            next_vip: 0,
            free_node_ports: NODE_PORTS.collect(),
            spec,
        };
        for i in 0..c.spec.probes {
            let svc = c.new_probe(i);
            c.services.insert(svc.name.clone(), svc);
        }
        for _ in 0..c.spec.services {
            let svc = c.new_service();
            c.services.insert(svc.name.clone(), svc);
        }
        c
    }

    /// The Node object of [`NODE`] with its address(es).
    pub fn node(node_ip: &str, node_ip6: Option<&str>) -> Value {
        let mut addresses = vec![json!({"type": "InternalIP", "address": node_ip})];
        let mut cidrs = vec!["10.244.0.0/16"];
        if let Some(ip6) = node_ip6 {
            addresses.push(json!({"type": "InternalIP", "address": ip6}));
            cidrs.push("fd00:244::/48");
        }
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
            "spec": {"podCIDRs": cidrs},
            "status": {"addresses": addresses},
        })
    }

    /// Every object of the cluster now, Services first.
    pub fn objects(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self.services.values().map(service_json).collect();
        for svc in self.services.values() {
            out.extend(svc.slices.iter().map(|s| slice_json(svc, s, None)));
        }
        out
    }

    /// How many Services (probes included) there are now.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// Each probe Service's addresses (`ip:80`, per family) and the lab
    /// backends it must reach now: its ready endpoints, else its serving
    /// terminating ones.
    pub fn probe_expectations(&self) -> Vec<(Vec<String>, BTreeSet<String>)> {
        self.services
            .values()
            .filter(|s| s.probe)
            .map(|s| {
                let addrs = s.cluster_ips.iter().map(|(f, ip)| socket(*f, ip, 80)).collect();
                (addrs, expected_backends(s))
            })
            .collect()
    }

    /// The next change: its kind and writes. `trigger` (RFC 3339) goes
    /// into each written slice's `last-change-trigger-time` annotation.
    pub fn next_change(&mut self, trigger: Option<&str>) -> (ChangeKind, Vec<Write>) {
        loop {
            let kind = self.pick_kind();
            if let Some(writes) = self.apply(kind, trigger) {
                return (kind, writes);
            }
        }
    }

    fn pick_kind(&mut self) -> ChangeKind {
        let total: u64 = ChangeKind::ALL.iter().map(|k| k.weight()).sum();
        let mut n = self.rng.below(total);
        for k in ChangeKind::ALL {
            if n < k.weight() {
                return k;
            }
            n -= k.weight();
        }
        ChangeKind::EndpointReady
    }

    /// Makes a change of `kind`; `None` if none applies now (the caller draws again).
    fn apply(&mut self, kind: ChangeKind, trigger: Option<&str>) -> Option<Vec<Write>> {
        match kind {
            ChangeKind::AddService => {
                let svc = self.new_service();
                let mut writes = vec![Write::Create(service_json(&svc))];
                writes.extend(svc.slices.iter().map(|s| Write::Create(slice_json(&svc, s, trigger))));
                self.services.insert(svc.name.clone(), svc);
                Some(writes)
            }
            ChangeKind::DeleteService => {
                // Keep the cluster near its size: delete only above it.
                if self.services.len() <= self.spec.services + self.spec.probes {
                    return None;
                }
                let name = self.pick_service(false)?;
                let svc = self.services.remove(&name)?;
                self.free_node_ports.extend(svc.ports.iter().filter_map(|p| p.node_port));
                self.free_node_ports.extend(svc.health_check_node_port);
                let mut writes: Vec<Write> =
                    svc.slices.iter().map(|s| Write::Delete(slice_json(&svc, s, None))).collect();
                writes.push(Write::Delete(service_json(&svc)));
                Some(writes)
            }
            ChangeKind::ServicePorts => self.change_service(trigger, true, |c, svc| c.change_ports(svc)),
            ChangeKind::ServicePolicy => self.change_service(trigger, false, |c, svc| c.change_policy(svc)),
            ChangeKind::ServiceType => self.change_service(trigger, false, |c, svc| c.change_type(svc)),
            ChangeKind::LoadBalancer => self.change_service(trigger, false, |c, svc| {
                if svc.kind != SvcType::LoadBalancer {
                    return false;
                }
                c.change_load_balancer(svc);
                true
            }),
            ChangeKind::ExternalIps => self.change_service(trigger, false, |c, svc| {
                if svc.external_ips.is_empty() || c.rng.percent(50) {
                    let ip = c.vip(Family::V4, 192);
                    svc.external_ips.push(ip);
                } else {
                    svc.external_ips.pop();
                }
                true
            }),
            ChangeKind::AddSlice => self.change_slices(trigger, |c, svc| {
                if svc.slices.len() >= 6 {
                    return None;
                }
                let family = c.pick(&svc.cluster_ips.iter().map(|(f, _)| *f).collect::<Vec<_>>())?;
                let n = 1 + c.rng.below(4) as usize;
                let slice = c.new_slice(&svc.name, family, n);
                svc.slices.push(slice);
                Some((svc.slices.len() - 1, false))
            }),
            ChangeKind::DeleteSlice => self.change_slices(trigger, |c, svc| {
                (svc.slices.len() > 1).then(|| (c.rng.below(svc.slices.len() as u64) as usize, true))
            }),
            ChangeKind::EndpointAdded => self.change_endpoints(trigger, |c, slice| {
                if slice.endpoints.len() >= 8 {
                    return false;
                }
                let ep = c.new_endpoint(slice.family);
                slice.endpoints.push(ep);
                true
            }),
            ChangeKind::EndpointRemoved => self.change_endpoints(trigger, |c, slice| {
                if slice.endpoints.is_empty() {
                    return false;
                }
                let i = c.rng.below(slice.endpoints.len() as u64) as usize;
                slice.endpoints.remove(i);
                true
            }),
            ChangeKind::EndpointReady => self.change_endpoints(trigger, |c, slice| {
                let Some(ep) = c.pick_mut(&mut slice.endpoints) else { return false };
                ep.ready = !ep.ready;
                ep.serving = ep.ready || ep.serving;
                ep.terminating = ep.terminating && !ep.ready;
                true
            }),
            ChangeKind::EndpointTerminating => self.change_endpoints(trigger, |c, slice| {
                let serving = c.rng.percent(60);
                let Some(ep) = c.pick_mut(&mut slice.endpoints) else { return false };
                terminate_or_revive(ep, serving);
                true
            }),
            ChangeKind::ProbeBackends => self.change_probe(trigger),
        }
    }

    /// Changes one non-probe Service with `f` (false: not applicable);
    /// its slices are rewritten too when `with_slices` (their ports follow
    /// the Service's).
    fn change_service(
        &mut self,
        trigger: Option<&str>,
        with_slices: bool,
        f: impl FnOnce(&mut Self, &mut Svc) -> bool,
    ) -> Option<Vec<Write>> {
        let name = self.pick_service(false)?;
        let mut svc = self.services.remove(&name)?;
        let changed = f(self, &mut svc);
        self.health_check_port(&mut svc);
        let mut writes = Vec::new();
        if changed {
            writes.push(Write::Update(service_json(&svc)));
            if with_slices {
                writes.extend(svc.slices.iter().map(|s| Write::Update(slice_json(&svc, s, trigger))));
            }
        }
        self.services.insert(name, svc);
        changed.then_some(writes)
    }

    /// Adds or deletes a slice of one non-probe Service: `f` says which
    /// slice and whether it goes.
    fn change_slices(
        &mut self,
        trigger: Option<&str>,
        f: impl FnOnce(&mut Self, &mut Svc) -> Option<(usize, bool)>,
    ) -> Option<Vec<Write>> {
        let name = self.pick_service(false)?;
        let mut svc = self.services.remove(&name)?;
        let writes = f(self, &mut svc).map(|(i, delete)| {
            if delete {
                let slice = svc.slices.remove(i);
                vec![Write::Delete(slice_json(&svc, &slice, None))]
            } else {
                vec![Write::Create(slice_json(&svc, &svc.slices[i], trigger))]
            }
        });
        self.services.insert(name, svc);
        writes
    }

    /// Changes the endpoints of one slice of one non-probe Service.
    fn change_endpoints(
        &mut self,
        trigger: Option<&str>,
        f: impl FnOnce(&mut Self, &mut Slice) -> bool,
    ) -> Option<Vec<Write>> {
        let name = self.pick_service(false)?;
        let mut svc = self.services.remove(&name)?;
        let i = self.rng.below(svc.slices.len() as u64) as usize;
        let mut slice = svc.slices.get(i).cloned();
        let changed = slice.as_mut().is_some_and(|s| f(self, s));
        let writes = match slice {
            Some(s) if changed => {
                let write = Write::Update(slice_json(&svc, &s, trigger));
                svc.slices[i] = s;
                Some(vec![write])
            }
            _ => None,
        };
        self.services.insert(name, svc);
        writes
    }

    /// A probe's backends changed: one added, removed, made not ready or
    /// terminating, or back; at least one stays ready.
    fn change_probe(&mut self, trigger: Option<&str>) -> Option<Vec<Write>> {
        let name = self.pick_service(true)?;
        let mut svc = self.services.remove(&name)?;
        let all: Vec<usize> = (1..=self.spec.backends).collect();
        let action = self.rng.below(4);
        let pick = self.rng.below(self.spec.backends as u64) as usize + 1;
        let serving = self.rng.percent(50);
        for slice in &mut svc.slices {
            let present = slice.endpoints.iter().position(|e| e.ip == backend_ip(slice.family, pick));
            match (action, present) {
                (0, None) => slice.endpoints.push(backend_endpoint(slice.family, pick)),
                (1, Some(i)) => {
                    slice.endpoints.remove(i);
                }
                (2, Some(i)) => slice.endpoints[i].ready = !slice.endpoints[i].ready,
                (_, Some(i)) => terminate_or_revive(&mut slice.endpoints[i], serving),
                _ => {}
            }
            // At least one ready backend: the first one missing comes back.
            if !slice.endpoints.iter().any(|e| e.ready) {
                let revive = all.iter().find(|n| **n != pick).copied().unwrap_or(pick);
                slice.endpoints.retain(|e| e.ip != backend_ip(slice.family, revive));
                slice.endpoints.push(backend_endpoint(slice.family, revive));
            }
        }
        let writes = svc.slices.iter().map(|s| Write::Update(slice_json(&svc, s, trigger))).collect();
        self.services.insert(name, svc);
        Some(writes)
    }

    /// Allocates or frees the Service's healthCheckNodePort as its type and
    /// external traffic policy now ask.
    fn health_check_port(&mut self, svc: &mut Svc) {
        let wanted = svc.kind == SvcType::LoadBalancer && svc.etp_local;
        match (wanted, svc.health_check_node_port) {
            (true, None) => svc.health_check_node_port = self.node_port(),
            (false, Some(port)) => {
                self.free_node_ports.insert(port);
                svc.health_check_node_port = None;
            }
            _ => {}
        }
    }

    fn change_ports(&mut self, svc: &mut Svc) -> bool {
        match self.rng.below(3) {
            0 if svc.ports.len() < 3 => {
                let port = self.new_port(svc.kind, svc.ports.len());
                svc.ports.push(port);
            }
            1 if svc.ports.len() > 1 => {
                let gone = svc.ports.pop();
                self.free_node_ports.extend(gone.and_then(|p| p.node_port));
            }
            _ => {
                let i = self.rng.below(svc.ports.len() as u64) as usize;
                let protocol = self.protocol();
                let p = &mut svc.ports[i];
                p.protocol = protocol;
                // Port numbers stay unique per Service: port i is 1000 + 100·i + 0..100.
                p.port = 1000 + 100 * i as u16 + (p.port + 1) % 100;
                p.target = p.target % 60000 + 1;
            }
        }
        true
    }

    fn change_policy(&mut self, svc: &mut Svc) -> bool {
        match self.rng.below(3) {
            0 => svc.affinity = !svc.affinity,
            1 if svc.kind != SvcType::ClusterIp => svc.etp_local = !svc.etp_local,
            _ => svc.itp_local = !svc.itp_local,
        }
        true
    }

    fn change_type(&mut self, svc: &mut Svc) -> bool {
        let kind = self.svc_type();
        if kind == svc.kind {
            return false;
        }
        svc.kind = kind;
        for p in &mut svc.ports {
            match (kind, p.node_port) {
                (SvcType::ClusterIp, Some(np)) => {
                    self.free_node_ports.insert(np);
                    p.node_port = None;
                }
                (SvcType::NodePort | SvcType::LoadBalancer, None) => p.node_port = self.node_port(),
                _ => {}
            }
        }
        if kind == SvcType::ClusterIp {
            svc.etp_local = false;
        }
        svc.ingress.clear();
        svc.source_ranges.clear();
        if kind == SvcType::LoadBalancer {
            self.change_load_balancer(svc);
        }
        true
    }

    fn change_load_balancer(&mut self, svc: &mut Svc) {
        svc.ingress = svc.cluster_ips.iter().map(|(f, _)| self.vip(*f, 203)).collect();
        svc.source_ranges = match self.rng.below(3) {
            0 => Vec::new(),
            1 => vec!["192.168.50.0/24".into()],
            _ => vec![format!("198.51.{}.0/24", self.rng.below(250))],
        };
        if svc.cluster_ips.iter().any(|(f, _)| *f == Family::V6) && !svc.source_ranges.is_empty() {
            svc.source_ranges.push("fd00:50::/64".into());
        }
    }

    fn new_service(&mut self) -> Svc {
        self.next_service += 1;
        let name = format!("s{}", self.next_service);
        let families = self.families();
        let kind = self.svc_type();
        let nports = 1 + self.rng.below(3) as usize;
        let ports = (0..nports).map(|i| self.new_port(kind, i)).collect();
        let cluster_ips = families.iter().map(|f| (*f, self.vip(*f, 96))).collect();
        let mut svc = Svc {
            name: name.clone(),
            probe: false,
            kind,
            cluster_ips,
            ports,
            affinity: self.rng.percent(15),
            etp_local: kind != SvcType::ClusterIp && self.rng.percent(30),
            health_check_node_port: None,
            itp_local: self.rng.percent(10),
            external_ips: Vec::new(),
            ingress: Vec::new(),
            source_ranges: Vec::new(),
            slices: Vec::new(),
        };
        if self.rng.percent(10) {
            svc.external_ips.push(self.vip(Family::V4, 192));
        }
        if kind == SvcType::LoadBalancer {
            self.change_load_balancer(&mut svc);
        }
        self.health_check_port(&mut svc);
        for f in families {
            for _ in 0..1 + self.rng.below(3) {
                let n = self.rng.below(5) as usize;
                let slice = self.new_slice(&name, f, n);
                svc.slices.push(slice);
            }
        }
        svc
    }

    fn new_probe(&mut self, i: usize) -> Svc {
        let name = format!("probe{i}");
        let mut families = vec![Family::V4];
        if self.spec.dual_stack && i % 2 == 1 {
            families.push(Family::V6);
        }
        let cluster_ips = families.iter().map(|f| (*f, probe_ip(*f, i))).collect();
        let ports = ["TCP", "UDP"]
            .iter()
            .map(|proto| Port {
                name: proto.to_lowercase(),
                protocol: proto,
                port: 80,
                target: PROBE_TARGET_PORT,
                node_port: None,
            })
            .collect();
        let slices = families
            .iter()
            .map(|f| {
                self.next_slice += 1;
                let endpoints = (1..=self.spec.backends).map(|n| backend_endpoint(*f, n)).collect();
                Slice { name: format!("{name}-{}", self.next_slice), family: *f, endpoints }
            })
            .collect();
        Svc {
            name,
            probe: true,
            kind: SvcType::ClusterIp,
            cluster_ips,
            ports,
            affinity: false,
            etp_local: false,
            health_check_node_port: None,
            itp_local: false,
            external_ips: Vec::new(),
            ingress: Vec::new(),
            source_ranges: Vec::new(),
            slices,
        }
    }

    fn new_slice(&mut self, service: &str, family: Family, n: usize) -> Slice {
        self.next_slice += 1;
        let endpoints = (0..n).map(|_| self.new_endpoint(family)).collect();
        Slice { name: format!("{service}-{}", self.next_slice), family, endpoints }
    }

    fn new_endpoint(&mut self, family: Family) -> Endpoint {
        self.next_pod += 1;
        let n = self.next_pod;
        let ip = match family {
            Family::V4 => format!("10.{}.{}.{}", 200 + n / 62500 % 50, n / 250 % 250, n % 250 + 1),
            Family::V6 => format!("fd00:200::{:x}:{:x}", n >> 16, n & 0xffff),
        };
        let node = if self.rng.percent(30) { NODE } else { OTHER_NODES[self.rng.below(3) as usize] };
        let mut ep = Endpoint { ip, node, ready: true, serving: true, terminating: false };
        if self.rng.percent(15) {
            ep.ready = false;
            ep.serving = false;
        } else if self.rng.percent(10) {
            let serving = self.rng.percent(50);
            terminate_or_revive(&mut ep, serving);
        }
        ep
    }

    fn new_port(&mut self, kind: SvcType, i: usize) -> Port {
        Port {
            name: format!("p{i}"),
            protocol: self.protocol(),
            port: 1000 + 100 * i as u16 + self.rng.below(100) as u16,
            target: 1 + self.rng.below(60000) as u16,
            node_port: if kind == SvcType::ClusterIp { None } else { self.node_port() },
        }
    }

    fn protocol(&mut self) -> &'static str {
        match self.rng.below(10) {
            0..=5 => "TCP",
            6..=8 => "UDP",
            _ => "SCTP",
        }
    }

    fn svc_type(&mut self) -> SvcType {
        match self.rng.below(10) {
            0..=5 => SvcType::ClusterIp,
            6..=7 => SvcType::NodePort,
            _ => SvcType::LoadBalancer,
        }
    }

    fn families(&mut self) -> Vec<Family> {
        if !self.spec.dual_stack {
            return vec![Family::V4];
        }
        match self.rng.below(10) {
            0..=3 => vec![Family::V4],
            4..=5 => vec![Family::V6],
            6..=7 => vec![Family::V4, Family::V6],
            _ => vec![Family::V6, Family::V4],
        }
    }

    /// A free NodePort (random), or none when all are taken.
    fn node_port(&mut self) -> Option<u16> {
        let n = self.free_node_ports.len() as u64;
        let port = self.free_node_ports.iter().nth(self.rng.below(n) as usize).copied()?;
        self.free_node_ports.remove(&port);
        Some(port)
    }

    /// A never-used address: `10.<block>.x.y` (96: cluster IPs),
    /// `192.0.x.y` (192: external IPs), `203.0.x.y` (203: ingress IPs), or
    /// the IPv6 twin in `fd00:<block>::/64`.
    fn vip(&mut self, family: Family, block: u16) -> String {
        self.next_vip += 1;
        let n = self.next_vip;
        match (family, block) {
            (Family::V4, 96) => format!("10.96.{}.{}", n / 250 % 250, n % 250 + 1),
            (Family::V4, b) => format!("{b}.{}.{}.{}", n / 62500 % 250, n / 250 % 250, n % 250 + 1),
            (Family::V6, b) => format!("fd00:{b}::{:x}:{:x}", n >> 16, n & 0xffff),
        }
    }

    /// A random Service's name (a probe or not).
    fn pick_service(&mut self, probe: bool) -> Option<String> {
        let names: Vec<&String> = self.services.values().filter(|s| s.probe == probe).map(|s| &s.name).collect();
        let i = self.rng.below(names.len() as u64) as usize;
        names.get(i).map(|n| n.to_string())
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> Option<T> {
        let i = self.rng.below(items.len() as u64) as usize;
        items.get(i).copied()
    }

    fn pick_mut<'a, T>(&mut self, items: &'a mut [T]) -> Option<&'a mut T> {
        let i = self.rng.below(items.len() as u64) as usize;
        items.get_mut(i)
    }
}

/// Terminating (serving or not) if it was not, else ready again.
fn terminate_or_revive(ep: &mut Endpoint, serving: bool) {
    if ep.terminating {
        *ep = Endpoint { ready: true, serving: true, terminating: false, ..ep.clone() };
    } else {
        *ep = Endpoint { ready: false, serving, terminating: true, ..ep.clone() };
    }
}

/// Lab backend `bN`'s address.
fn backend_ip(family: Family, n: usize) -> String {
    match family {
        Family::V4 => format!("10.244.{n}.2"),
        Family::V6 => format!("fd00:244:{n}::2"),
    }
}

fn backend_endpoint(family: Family, n: usize) -> Endpoint {
    Endpoint { ip: backend_ip(family, n), node: NODE, ready: true, serving: true, terminating: false }
}

/// Probe `i`'s cluster IP.
fn probe_ip(family: Family, i: usize) -> String {
    match family {
        Family::V4 => format!("10.97.0.{}", i + 1),
        Family::V6 => format!("fd00:97::{:x}", i + 1),
    }
}

fn socket(family: Family, ip: &str, port: u16) -> String {
    match family {
        Family::V4 => format!("{ip}:{port}"),
        Family::V6 => format!("[{ip}]:{port}"),
    }
}

/// The lab backends (`bN`) a probe's traffic goes to: the ready
/// endpoints, else the serving terminating ones (upstream's fallback).
fn expected_backends(svc: &Svc) -> BTreeSet<String> {
    let name = |ip: &str| {
        let n = ip.trim_start_matches("10.244.").trim_start_matches("fd00:244:");
        format!("b{}", n.split(['.', ':']).next().unwrap_or_default())
    };
    let eps: Vec<&Endpoint> = svc.slices.iter().flat_map(|s| &s.endpoints).collect();
    let ready: BTreeSet<String> = eps.iter().filter(|e| e.ready).map(|e| name(&e.ip)).collect();
    if !ready.is_empty() {
        return ready;
    }
    eps.iter().filter(|e| e.serving && e.terminating).map(|e| name(&e.ip)).collect()
}

fn service_json(svc: &Svc) -> Value {
    let kind = match svc.kind {
        SvcType::ClusterIp => "ClusterIP",
        SvcType::NodePort => "NodePort",
        SvcType::LoadBalancer => "LoadBalancer",
    };
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .map(|p| {
            let mut v = json!({"name": p.name, "protocol": p.protocol, "port": p.port, "targetPort": p.target});
            if let Some(np) = p.node_port {
                v["nodePort"] = json!(np);
            }
            v
        })
        .collect();
    let ips: Vec<&str> = svc.cluster_ips.iter().map(|(_, ip)| ip.as_str()).collect();
    let families: Vec<&str> = svc.cluster_ips.iter().map(|(f, _)| f.address_type()).collect();
    let policy = if ips.len() == 2 { "RequireDualStack" } else { "SingleStack" };
    let mut spec = json!({
        "type": kind, "clusterIP": ips[0], "clusterIPs": ips, "ipFamilies": families, "ipFamilyPolicy": policy,
        "ports": ports,
        "internalTrafficPolicy": if svc.itp_local { "Local" } else { "Cluster" },
    });
    if svc.kind != SvcType::ClusterIp {
        spec["externalTrafficPolicy"] = json!(if svc.etp_local { "Local" } else { "Cluster" });
    }
    if let Some(port) = svc.health_check_node_port {
        spec["healthCheckNodePort"] = json!(port);
    }
    if svc.affinity {
        spec["sessionAffinity"] = json!("ClientIP");
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 600}});
    }
    if !svc.external_ips.is_empty() {
        spec["externalIPs"] = json!(svc.external_ips);
    }
    if !svc.source_ranges.is_empty() {
        spec["loadBalancerSourceRanges"] = json!(svc.source_ranges);
    }
    let mut out = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": NAMESPACE},
        "spec": spec,
    });
    if !svc.ingress.is_empty() {
        let ingress: Vec<Value> = svc.ingress.iter().map(|ip| json!({"ip": ip})).collect();
        out["status"] = json!({"loadBalancer": {"ingress": ingress}});
    }
    out
}

fn slice_json(svc: &Svc, slice: &Slice, trigger: Option<&str>) -> Value {
    let ports: Vec<Value> =
        svc.ports.iter().map(|p| json!({"name": p.name, "protocol": p.protocol, "port": p.target})).collect();
    let endpoints: Vec<Value> = slice
        .endpoints
        .iter()
        .map(|e| {
            json!({"addresses": [e.ip], "nodeName": e.node,
                "conditions": {"ready": e.ready, "serving": e.serving, "terminating": e.terminating}})
        })
        .collect();
    let mut metadata = json!({
        "name": slice.name, "namespace": NAMESPACE,
        "labels": {"kubernetes.io/service-name": svc.name,
            "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
    });
    if let Some(t) = trigger {
        metadata["annotations"] = json!({"endpoints.kubernetes.io/last-change-trigger-time": t});
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": slice.family.address_type(),
        "ports": ports,
        "endpoints": endpoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dual_stack: bool) -> SoakSpec {
        SoakSpec { seed: 7, services: 300, probes: 4, backends: 3, dual_stack }
    }

    fn kinds_of(objects: &[Value], kind: &str) -> usize {
        objects.iter().filter(|o| o["kind"] == kind).count()
    }

    #[test]
    fn the_same_seed_gives_the_same_cluster_and_changes() {
        let (mut a, mut b) = (SoakCluster::new(spec(true)), SoakCluster::new(spec(true)));
        assert_eq!(a.objects(), b.objects());
        for _ in 0..500 {
            assert_eq!(a.next_change(Some("t")), b.next_change(Some("t")));
        }
    }

    #[test]
    fn the_cluster_has_every_kind_of_service_the_soak_asks_for() {
        let objects = SoakCluster::new(spec(true)).objects();
        assert_eq!(kinds_of(&objects, "Service"), 304);
        let text = serde_json::to_string(&objects).unwrap();
        for needle in [
            "\"NodePort\"",
            "\"LoadBalancer\"",
            "loadBalancerSourceRanges",
            "externalIPs",
            "\"SCTP\"",
            "\"UDP\"",
            "\"ClientIP\"",
            "\"externalTrafficPolicy\":\"Local\"",
            "\"internalTrafficPolicy\":\"Local\"",
            "\"terminating\":true",
            "\"RequireDualStack\"",
            "\"IPv6\"",
        ] {
            assert!(text.contains(needle), "{needle}");
        }
        let slices_per_service = kinds_of(&objects, "EndpointSlice") as f64 / 304.0;
        assert!(slices_per_service > 1.5, "{slices_per_service}");
        let multi_port = objects.iter().filter(|o| o["spec"]["ports"].as_array().is_some_and(|p| p.len() > 1)).count();
        assert!(multi_port > 50, "{multi_port}");
    }

    #[test]
    fn the_stream_makes_every_kind_of_change_and_keeps_addresses_unique() {
        let mut c = SoakCluster::new(spec(true));
        let mut seen = BTreeSet::new();
        for _ in 0..3000 {
            let (kind, writes) = c.next_change(None);
            assert!(!writes.is_empty(), "{kind:?}");
            seen.insert(kind);
        }
        assert_eq!(seen.len(), ChangeKind::ALL.len(), "{seen:?}");
        let objects = c.objects();
        let mut ips = BTreeSet::new();
        let mut node_ports = BTreeSet::new();
        for svc in objects.iter().filter(|o| o["kind"] == "Service") {
            for ip in svc["spec"]["clusterIPs"].as_array().unwrap() {
                assert!(ips.insert(ip.as_str().unwrap().to_string()), "{ip} twice");
            }
            for p in svc["spec"]["ports"].as_array().unwrap().iter().filter_map(|p| p["nodePort"].as_u64()) {
                assert!(node_ports.insert(p), "nodePort {p} twice");
            }
        }
        let size = c.service_count();
        assert!((300..=360).contains(&size), "the cluster stays near its size: {size}");
    }

    #[test]
    fn probes_always_keep_a_ready_lab_backend() {
        let mut c = SoakCluster::new(spec(true));
        for _ in 0..3000 {
            c.next_change(None);
            for (addrs, want) in c.probe_expectations() {
                assert!(!want.is_empty(), "{addrs:?}");
                assert!(want.iter().all(|b| ["b1", "b2", "b3"].contains(&b.as_str())), "{want:?}");
            }
        }
        let probes = c.probe_expectations();
        assert_eq!(probes.len(), 4);
        assert_eq!(probes[1].0, vec!["10.97.0.2:80".to_string(), "[fd00:97::2]:80".to_string()]);
    }

    #[test]
    fn a_probe_with_only_terminating_backends_expects_the_serving_ones() {
        let mut c = SoakCluster::new(SoakSpec { seed: 1, services: 0, probes: 1, backends: 2, dual_stack: false });
        let probe = c.services.get_mut("probe0").unwrap();
        terminate_or_revive(&mut probe.slices[0].endpoints[0], true);
        terminate_or_revive(&mut probe.slices[0].endpoints[1], false);
        assert_eq!(expected_backends(probe), BTreeSet::from(["b1".to_string()]));
    }
}
