//! The conntrack actor's message: reconcile one family's conntrack table
//! against the UDP Service frontends, as upstream's conntrack reconciler
//! (`conntrack.CleanStaleEntries`, pkg/proxy/conntrack/cleanup.go) does
//! after a sync in which UDP Services or their endpoints changed.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use super::KernelError;
use crate::net::IpFamily;

/// The serving endpoints of a frontend: address and target port, as the
/// reply source of an entry DNATed to one of them reads.
pub type Backends = Arc<BTreeSet<SocketAddr>>;

/// One family's UDP Service frontends that have serving endpoints, each
/// with those endpoints: upstream's `serviceIPEndpoints` and
/// `serviceNodePortEndpoints`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServingFrontends {
    /// ClusterIPs, externalIPs and LoadBalancer IPs, with the service port.
    pub ips: HashMap<SocketAddr, Backends>,
    /// NodePorts, on any address of the family.
    pub node_ports: HashMap<u16, Backends>,
}

impl ServingFrontends {
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.node_ports.is_empty()
    }

    /// The frontends alone.
    pub fn keys(&self) -> Frontends {
        Frontends { ips: self.ips.keys().copied().collect(), node_ports: self.node_ports.keys().copied().collect() }
    }
}

/// A set of frontends, without their endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frontends {
    pub ips: HashSet<SocketAddr>,
    pub node_ports: HashSet<u16>,
}

impl Frontends {
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty() && self.node_ports.is_empty()
    }

    /// The frontends of `self` that `other` lacks.
    pub fn without(&self, other: &Frontends) -> Frontends {
        Frontends {
            ips: self.ips.difference(&other.ips).copied().collect(),
            node_ports: self.node_ports.difference(&other.node_ports).copied().collect(),
        }
    }

    /// Adds `other`'s frontends to `self`.
    pub fn extend(&mut self, other: Frontends) {
        self.ips.extend(other.ips);
        self.node_ports.extend(other.node_ports);
    }
}

/// Reconcile `family`'s conntrack table: one dump, then the deletion of
/// each UDP entry that is stale (see `kernel::conntrack::filter`):
/// - its original destination is a frontend of `serving` (an address and
///   port, or a NodePort) and its reply source is none of that frontend's
///   endpoints (upstream's rule);
/// - or its original destination is a frontend of `gone` (one an earlier
///   reconcile checked and that has no serving endpoints now: its Service,
///   port or address was removed, or its endpoints all went) and it was
///   DNATed (the reply source is not the original destination).
#[derive(Debug, Clone)]
pub struct ReconcileConntrack {
    pub generation: u64,
    pub family: IpFamily,
    pub serving: Arc<ServingFrontends>,
    pub gone: Arc<Frontends>,
}

/// What a reconcile did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// UDP entries of the family's table.
    pub udp_entries: usize,
    /// Entries deleted (not counting ones already gone).
    pub deleted: u64,
}

impl actix::Message for ReconcileConntrack {
    type Result = Result<Reconciled, KernelError>;
}
