//! The names of the `maps` ruleset's own objects (all `maps-…`), and the
//! endpoint families and pick classes they are named for: what the ruleset's
//! planner ([`super::maps`]), the typed table ([`super::ruleset`]) and the
//! transactions ([`super::transactions`]) share.

use crate::msgs::nftables::Field;
use crate::net::IpFamily;

/// Every object of this ruleset that upstream's has not is named so.
pub const PREFIX: &str = "maps-";

// Top-level chains.
pub const DISPATCH: &str = "maps-dispatch";
pub const EXTERNAL_LOCAL: &str = "maps-external-local";
pub const NODEPORT_DISPATCH: &str = "maps-nodeport-dispatch";
pub const NODEPORT_EXTERNAL_LOCAL: &str = "maps-nodeport-external-local";

// Key sets.
/// Addresses, protocols and ports with endpoints here.
pub const SERVICE_KEYS: &str = "maps-service-keys";
/// Protocols and NodePorts with endpoints here.
pub const NODEPORT_KEYS: &str = "maps-nodeport-keys";
/// externalIPs and LoadBalancer IPs of externalTrafficPolicy Cluster: masqueraded.
pub const EXTERNAL_CLUSTER_KEYS: &str = "maps-external-cluster-keys";
/// externalIPs and LoadBalancer IPs of externalTrafficPolicy Local.
pub const EXTERNAL_LOCAL_KEYS: &str = "maps-external-local-keys";
/// ClusterIPs of internalTrafficPolicy Local.
pub const INTERNAL_LOCAL_KEYS: &str = "maps-internal-local-keys";
/// NodePorts of externalTrafficPolicy Local.
pub const NODEPORT_EXTERNAL_LOCAL_KEYS: &str = "maps-nodeport-external-local-keys";
/// Every endpoint address twice: a DNATed connection from an endpoint to itself.
pub const HAIRPIN: &str = "maps-hairpin";

/// Whether `name` is one of this ruleset's own objects.
pub fn is_maps_object(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// Whether `name` is one of this ruleset's maps (its other objects are sets
/// and chains).
pub fn is_maps_map(name: &str) -> bool {
    EndpointFamily::ALL.iter().any(|f| f.endpoints() == name)
}

/// The endpoints a key is sent to: by the kind of key (an address, protocol
/// and port; or a protocol and NodePort) and the traffic policy's choice
/// (all of the Service's endpoints, or this node's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointFamily {
    Cluster,
    Local,
    NodePortCluster,
    NodePortLocal,
}

impl EndpointFamily {
    pub const ALL: [EndpointFamily; 4] = [
        EndpointFamily::Cluster,
        EndpointFamily::Local,
        EndpointFamily::NodePortCluster,
        EndpointFamily::NodePortLocal,
    ];

    fn name(self) -> &'static str {
        match self {
            EndpointFamily::Cluster => "cluster",
            EndpointFamily::Local => "local",
            EndpointFamily::NodePortCluster => "nodeport-cluster",
            EndpointFamily::NodePortLocal => "nodeport-local",
        }
    }

    fn node_port(self) -> bool {
        matches!(self, EndpointFamily::NodePortCluster | EndpointFamily::NodePortLocal)
    }

    /// The fields of the family's keys.
    pub fn key(self, family: IpFamily) -> Vec<Field> {
        match self.node_port() {
            true => node_port_key(),
            false => address_key(family),
        }
    }

    /// The family's endpoints map: key and slot → address and port.
    pub fn endpoints(self) -> String {
        format!("{PREFIX}{}-endpoints", self.name())
    }

    /// The chain that picks one of a key's endpoints.
    pub fn pick(self) -> String {
        format!("{PREFIX}{}-pick", self.name())
    }

    /// The chain that DNATs to slot `slot` and remembers the client for
    /// `timeout` seconds.
    pub(super) fn slot_chain(self, timeout: u32, slot: u32) -> String {
        format!("{PREFIX}{}-slot-{slot}-affinity-{timeout}", self.name())
    }

    /// The clients slot `slot` of a key was chosen for in the last `timeout` seconds.
    pub(super) fn affinity_set(self, timeout: u32, slot: u32) -> String {
        format!("{PREFIX}{}-affinity-{timeout}-slot-{slot}", self.name())
    }
}

/// `ip daddr . meta l4proto . th dport`.
pub(super) fn address_key(family: IpFamily) -> Vec<Field> {
    vec![Field::Daddr(family), Field::L4proto, Field::Dport]
}

/// `meta l4proto . th dport`.
pub(super) fn node_port_key() -> Vec<Field> {
    vec![Field::L4proto, Field::Dport]
}

/// How the keys with the same number of endpoints of a family, and the same
/// affinity, are picked from: a set, a rule in the family's pick chain that
/// goes to the class's chain, and that chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PickClass {
    pub family: EndpointFamily,
    /// ClientIP affinity's timeout in seconds.
    pub affinity: Option<u32>,
    pub endpoints: u32,
}

impl PickClass {
    /// The set of the keys in the class.
    pub fn set(&self) -> String {
        let base = format!("{PREFIX}{}-{}", self.family.name(), self.endpoints);
        match self.affinity {
            Some(t) => format!("{base}-affinity-{t}"),
            None => base,
        }
    }

    /// The chain of a class without affinity: its one rule DNATs from the
    /// family's endpoints map.
    pub(super) fn chain(&self) -> String {
        format!("{}-{}", self.family.pick(), self.endpoints)
    }

    /// The chain that applies affinity.
    pub(super) fn affinity_chain(&self, timeout: u32) -> String {
        format!("{PREFIX}{}-affinity-{}-{timeout}", self.family.name(), self.endpoints)
    }
}
