//! The Service/Endpoint model and its change tracking. Pure: no I/O, no
//! async, no clock.
//!
//! Events are recorded as they arrive (converted and validated at once, so
//! a bad object is reported when it shows up and costs nothing later);
//! [`Model::apply`] folds the pending changes into the current state and
//! reports what changed, as upstream's service and endpoint change trackers do.

pub mod addresses;
pub mod endpoints;
pub mod intake;
pub mod node;
pub mod node_change;
pub mod node_ports;
pub mod notice;
pub mod scheduler;
pub mod service;
pub mod service_cidrs;
pub mod topology;

#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use ipnet::IpNet;

pub use endpoints::{Endpoint, EndpointList, Hints, PortEndpoints};
pub use node::NodeInfo;
pub use service::{NamespacedName, ServicePort, ServicePortName, ServicePorts};

use crate::msgs::{Change, ResourceKind, SourceEvent};
use crate::net::IpFamily;
use endpoints::{parse_slice, SliceCache, SliceKind};
use service::{find_port, namespaced_name};

/// A bad object: which one, which field, what value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {object}: invalid {field}: {value:?}")]
pub struct ModelError {
    pub kind: &'static str,
    pub object: String,
    pub field: String,
    pub value: String,
}

impl ModelError {
    pub fn field(object: &NamespacedName, kind: &'static str, field: &str, value: &str) -> ModelError {
        ModelError { kind, object: object.to_string(), field: field.to_string(), value: value.to_string() }
    }
}

/// What one [`Model::apply`] changed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModelChanges {
    /// Service ports whose service info or endpoints changed (added, updated or removed).
    pub ports: BTreeSet<ServicePortName>,
    /// Services whose service object changed.
    pub services_updated: BTreeSet<NamespacedName>,
    /// Services whose endpoints changed.
    pub endpoints_updated: BTreeSet<NamespacedName>,
    /// The node's topology labels changed: plan everything again.
    pub topology_changed: bool,
    /// The family's ServiceCIDRs changed ([`Model::service_cidrs`]).
    pub service_cidrs_changed: bool,
    /// last-change-trigger-time annotations of the slices that changed.
    pub trigger_times: Vec<String>,
}

impl ModelChanges {
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && !self.topology_changed && !self.service_cidrs_changed
    }
}

/// What the model knows of one Service: its ports, and the endpoints its
/// slices give each port. Either may be there without the other.
#[derive(Debug, Default)]
struct ServiceState {
    /// Empty when the Service does not exist (or yields no ports).
    ports: ServicePorts,
    /// Ports with endpoints, sorted by port name and protocol.
    endpoints: Vec<PortEndpoints>,
}

impl ServiceState {
    fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.endpoints.is_empty()
    }
}

/// What feature gates change in the model (upstream reads them where it
/// starts its informers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelGates {
    /// MultiCIDRServiceAllocator: ServiceCIDRs are recorded (off: ignored).
    pub service_cidrs: bool,
}

impl Default for ModelGates {
    fn default() -> ModelGates {
        ModelGates { service_cidrs: true }
    }
}

/// Services, endpoints and the node, with pending changes tracked per key.
///
/// Service ports and their endpoints are filed under their Service: a
/// lookup by [`ServicePortName`] finds the Service, then the port among its
/// few, so a Service's name is stored once.
#[derive(Debug)]
pub struct Model {
    family: IpFamily,
    node_name: String,
    /// Services with ports or endpoints.
    services: HashMap<NamespacedName, ServiceState>,
    pending_services: HashMap<NamespacedName, ServicePorts>,
    slices: SliceCache,
    pending_endpoints: HashSet<NamespacedName>,
    node: NodeInfo,
    pending_node: Option<NodeInfo>,
    /// Every ServiceCIDR's ranges, as recorded.
    service_cidrs: service_cidrs::ServiceCidrs,
    /// The family's ranges as of the last [`Model::apply`].
    cidrs: Vec<IpNet>,
    /// The family's ranges differ from `cidrs`.
    pending_cidrs: bool,
    synced: BTreeSet<ResourceKind>,
    gates: ModelGates,
}

impl Model {
    pub fn new(family: IpFamily, node_name: &str) -> Model {
        Model {
            family,
            node_name: node_name.to_string(),
            services: HashMap::new(),
            pending_services: HashMap::new(),
            slices: SliceCache::default(),
            pending_endpoints: HashSet::new(),
            node: NodeInfo { name: node_name.to_string(), ..NodeInfo::default() },
            pending_node: None,
            service_cidrs: service_cidrs::ServiceCidrs::default(),
            cidrs: Vec::new(),
            pending_cidrs: false,
            synced: BTreeSet::new(),
            gates: ModelGates::default(),
        }
    }

    /// The same model with other feature gates than the defaults.
    pub fn with_gates(mut self, gates: ModelGates) -> Model {
        self.gates = gates;
        self
    }

    pub fn family(&self) -> IpFamily {
        self.family
    }

    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The family's ServiceCIDRs as of the last [`Model::apply`] (the union
    /// of every object's, sorted): what nftables mode drops unallocated
    /// addresses of. Empty without ServiceCIDR objects.
    pub fn service_cidrs(&self) -> &[IpNet] {
        &self.cidrs
    }

    /// Services and EndpointSlices have both completed their initial list
    /// (upstream's isInitialized): before that, nothing is synced. Nodes and
    /// ServiceCIDRs are not waited for (upstream's neither): a kind whose
    /// list fails does not hold back the sync.
    pub fn is_initialized(&self) -> bool {
        self.synced.contains(&ResourceKind::Service) && self.synced.contains(&ResourceKind::EndpointSlice)
    }

    /// Something is waiting for [`Model::apply`].
    pub fn has_pending(&self) -> bool {
        !self.pending_services.is_empty()
            || !self.pending_endpoints.is_empty()
            || self.pending_node.is_some()
            || self.pending_cidrs
    }

    pub fn pending_counts(&self) -> (usize, usize) {
        (self.pending_services.len(), self.pending_endpoints.len())
    }

    /// Records one source event. A bad object is reported and skipped: its
    /// last good state stays, and nothing else is affected.
    pub fn record(&mut self, ev: &SourceEvent) -> Result<(), ModelError> {
        match ev {
            SourceEvent::Service(Change::Applied(svc)) => {
                let nn = namespaced_name(&svc.metadata);
                let map = service::service_ports(svc, self.family)?.unwrap_or_default();
                self.pending_services.insert(nn, map);
            }
            SourceEvent::Service(Change::Deleted(svc)) => {
                self.pending_services.insert(namespaced_name(&svc.metadata), ServicePorts::new());
            }
            SourceEvent::EndpointSlice(Change::Applied(slice)) => {
                let nn = namespaced_name(&slice.metadata);
                match parse_slice(slice, self.family, &self.node_name)? {
                    SliceKind::Slice { service, info } => {
                        self.pending_endpoints.extend(self.slices.upsert(nn, service, info))
                    }
                    SliceKind::Ignored(_) => self.pending_endpoints.extend(self.slices.remove(&nn)),
                }
            }
            SourceEvent::EndpointSlice(Change::Deleted(slice)) => {
                let nn = namespaced_name(&slice.metadata);
                self.pending_endpoints.extend(self.slices.remove(&nn));
            }
            SourceEvent::Node(change) => self.record_node(change),
            SourceEvent::ServiceCidr(_) if !self.gates.service_cidrs => {}
            SourceEvent::ServiceCidr(change) => {
                self.service_cidrs.record(change)?;
                // Another family's ranges change nothing here.
                self.pending_cidrs = self.service_cidrs.of_family(self.family) != self.cidrs;
            }
            SourceEvent::Synced(kind) => {
                self.synced.insert(*kind);
            }
        }
        Ok(())
    }

    fn record_node(&mut self, change: &Change<k8s_openapi::api::core::v1::Node>) {
        let node = change.object();
        if node.metadata.name.as_deref() != Some(self.node_name.as_str()) {
            return;
        }
        let mut info = NodeInfo::from_node(node);
        if matches!(change, Change::Deleted(_)) {
            info.deleting = true;
        }
        self.pending_node = Some(info);
    }

    /// Folds pending changes into the current state; reports what changed.
    pub fn apply(&mut self) -> ModelChanges {
        let mut out = ModelChanges::default();
        if let Some(node) = self.pending_node.take() {
            out.topology_changed = node.topology_labels() != self.node.topology_labels();
            self.node = node;
        }
        if std::mem::take(&mut self.pending_cidrs) {
            let cidrs = self.service_cidrs.of_family(self.family);
            out.service_cidrs_changed = cidrs != self.cidrs;
            self.cidrs = cidrs;
        }
        // Taken, not drained: a cold sync's pending tables are large, and
        // would otherwise stay allocated, empty, until the next one.
        for (nn, new) in std::mem::take(&mut self.pending_services) {
            self.apply_service(nn, new, &mut out);
        }
        for nn in std::mem::take(&mut self.pending_endpoints) {
            self.apply_endpoints(nn, &mut out);
        }
        out
    }

    /// The state of `nn`, created empty if need be; [`Model::tidy`] drops it if it stays empty.
    fn state(&mut self, nn: NamespacedName) -> &mut ServiceState {
        self.services.entry(nn).or_default()
    }

    fn tidy(&mut self, nn: &NamespacedName) {
        if self.services.get(nn).is_some_and(ServiceState::is_empty) {
            self.services.remove(nn);
        }
    }

    fn apply_service(&mut self, nn: NamespacedName, new: ServicePorts, out: &mut ModelChanges) {
        let old = self.services.get(&nn).map(|s| s.ports.as_slice()).unwrap_or_default();
        // Unchanged: the old values stay, and what was planned from them still holds.
        if *old == *new {
            return;
        }
        for sp in old {
            if find_port(&new, &sp.name).is_none() {
                out.ports.insert(sp.name.clone());
            }
        }
        for sp in &new {
            if find_port(old, &sp.name) != Some(sp) {
                out.ports.insert(sp.name.clone());
            }
        }
        out.services_updated.insert(nn.clone());
        self.state(nn.clone()).ports = new;
        self.tidy(&nn);
    }

    fn apply_endpoints(&mut self, nn: NamespacedName, out: &mut ModelChanges) {
        let new = self.slices.endpoints_for(&nn);
        let old = self.services.get_mut(&nn).map(|s| std::mem::take(&mut s.endpoints)).unwrap_or_default();
        let mut changed = false;
        for gone in old.iter().filter(|o| !new.iter().any(|n| n.same_port(o))) {
            out.ports.insert(gone.port_name(&nn));
            changed = true;
        }
        let mut current = Vec::with_capacity(new.len());
        for list in new {
            let before = old.iter().find(|o| o.same_port(&list));
            if let Some(before) = before.filter(|b| b.endpoints == list.endpoints) {
                // Unchanged: the old list stays, and what was planned from it still holds.
                current.push(before.clone());
                continue;
            }
            out.ports.insert(list.port_name(&nn));
            current.push(list);
            changed = true;
        }
        let triggers = self.slices.take_trigger_times(&nn);
        if changed {
            out.trigger_times.extend(triggers);
            out.endpoints_updated.insert(nn.clone());
        }
        if current.is_empty() {
            self.tidy(&nn);
        } else {
            self.state(nn).endpoints = current;
        }
    }

    pub fn service_port(&self, spn: &ServicePortName) -> Option<&Arc<ServicePort>> {
        find_port(&self.services.get(&spn.service)?.ports, spn)
    }

    /// The endpoints of a service port (empty if none).
    pub fn endpoints(&self, spn: &ServicePortName) -> &[Endpoint] {
        self.endpoint_list(spn).map_or(&[], |l| l)
    }

    /// The endpoints of a service port, shared; `None` if it has none. The
    /// list is replaced, never modified, when they change.
    pub fn endpoint_list(&self, spn: &ServicePortName) -> Option<&EndpointList> {
        let ports = &self.services.get(&spn.service)?.endpoints;
        ports.iter().find(|p| p.is_port(spn)).map(|p| &p.endpoints)
    }

    /// Every service port, in no particular order.
    pub fn service_ports(&self) -> impl Iterator<Item = &Arc<ServicePort>> {
        self.services.values().flat_map(|s| &s.ports)
    }

    /// Services with at least one port.
    pub fn service_count(&self) -> usize {
        self.services.values().filter(|s| !s.ports.is_empty()).count()
    }
}
