//! Events from a source (the manifest directory or the Kubernetes API) to the
//! coordinator. Both sources emit exactly these; nothing downstream knows
//! which one is in use.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// The kinds of object kube-proxy watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    Service,
    EndpointSlice,
    Node,
    /// `networking.k8s.io/v1` ServiceCIDR (cluster-scoped): the ranges
    /// ClusterIPs are allocated from (upstream's ServiceCIDRConfig).
    ServiceCidr,
}

impl ResourceKind {
    /// Every watched kind, in the order sources emit them.
    pub const ALL: [ResourceKind; 4] =
        [ResourceKind::Service, ResourceKind::EndpointSlice, ResourceKind::Node, ResourceKind::ServiceCidr];
}

impl std::fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResourceKind::Service => "Service",
            ResourceKind::EndpointSlice => "EndpointSlice",
            ResourceKind::Node => "Node",
            ResourceKind::ServiceCidr => "ServiceCIDR",
        })
    }
}

/// One object created/changed (the whole new object) or deleted (at least
/// its identity, name and namespace: the sources keep no more of the objects
/// they sent; our own Node is kept and sent whole).
#[derive(Debug, Clone)]
pub enum Change<T> {
    Applied(Arc<T>),
    Deleted(Arc<T>),
}

impl<T> Change<T> {
    pub fn object(&self) -> &Arc<T> {
        match self {
            Change::Applied(o) | Change::Deleted(o) => o,
        }
    }
}

#[derive(Debug, Clone)]
pub enum SourceEvent {
    Service(Change<Service>),
    EndpointSlice(Change<EndpointSlice>),
    Node(Change<Node>),
    /// A ServiceCIDR created or changed (whole) or deleted (its identity:
    /// the model keeps each object's CIDRs by name).
    ServiceCidr(Change<ServiceCIDR>),
    /// The initial list of this kind is complete (upstream's HasSynced). A
    /// source that relists emits `Deleted` for objects that vanished and then
    /// `Synced` again; the coordinator treats the second one as a no-op.
    Synced(ResourceKind),
}

/// What a source sends: a batch of events, applied in order.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct SourceBatch(pub Vec<SourceEvent>);
