//! One set of service health-check servers for every family's proxier.
//!
//! A dual-stack LoadBalancer service with `externalTrafficPolicy: Local`
//! is planned by both families' coordinators, each with its own view of
//! the service's local endpoints; its `healthCheckNodePort` is one port on
//! the node. Each family reports its health checks here; the servers serve
//! the union of the services, each with the larger of the families' local
//! endpoint counts (a dual-stack pod is one endpoint in each family's slice).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use super::ServiceHealthServers;
use crate::model::service::NamespacedName;
use crate::mutex::lock;
use crate::net::IpFamily;

/// What one family last reported.
#[derive(Debug, Default)]
struct FamilyChecks {
    ports: BTreeMap<NamespacedName, u16>,
    endpoints: BTreeMap<NamespacedName, usize>,
}

struct Inner {
    servers: ServiceHealthServers,
    families: BTreeMap<IpFamily, FamilyChecks>,
}

/// Health-check servers shared by the families' coordinators. Cheap to clone.
#[derive(Clone)]
pub struct SharedServiceHealth(Arc<Mutex<Inner>>);

impl From<ServiceHealthServers> for SharedServiceHealth {
    fn from(servers: ServiceHealthServers) -> SharedServiceHealth {
        SharedServiceHealth(Arc::new(Mutex::new(Inner { servers, families: BTreeMap::new() })))
    }
}

impl SharedServiceHealth {
    /// `family`'s health checks after one of its syncs: service →
    /// healthCheckNodePort, and service → local ready endpoints. Opens and
    /// closes listeners for the union of every family's services. Must run
    /// inside the tokio runtime.
    pub fn sync(
        &self,
        family: IpFamily,
        ports: BTreeMap<NamespacedName, u16>,
        endpoints: BTreeMap<NamespacedName, usize>,
    ) {
        let mut inner = lock(&self.0);
        inner.families.insert(family, FamilyChecks { ports, endpoints });
        let (ports, endpoints) = merged(&inner.families);
        inner.servers.sync_services(&ports);
        inner.servers.sync_endpoints(&endpoints);
    }

    /// The open health checks and their bound addresses.
    pub fn listening(&self) -> BTreeMap<NamespacedName, Vec<SocketAddr>> {
        lock(&self.0).servers.listening()
    }
}

/// The union of the families' services (the primary family's port where
/// they differ, which only a changing Service shows between two syncs) and
/// the larger local endpoint count.
fn merged(
    families: &BTreeMap<IpFamily, FamilyChecks>,
) -> (BTreeMap<NamespacedName, u16>, BTreeMap<NamespacedName, usize>) {
    let mut ports = BTreeMap::new();
    let mut endpoints: BTreeMap<NamespacedName, usize> = BTreeMap::new();
    for checks in families.values() {
        for (nn, port) in &checks.ports {
            ports.entry(nn.clone()).or_insert(*port);
        }
        for (nn, n) in &checks.endpoints {
            let e = endpoints.entry(nn.clone()).or_insert(0);
            *e = (*e).max(*n);
        }
    }
    (ports, endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nn(name: &str) -> NamespacedName {
        NamespacedName { namespace: "default".into(), name: name.into() }
    }

    #[test]
    fn families_merge_to_the_union_with_the_larger_count() {
        let mut families = BTreeMap::new();
        families.insert(
            IpFamily::V4,
            FamilyChecks {
                ports: [(nn("both"), 31000), (nn("v4only"), 31001)].into(),
                endpoints: [(nn("both"), 2)].into(),
            },
        );
        families.insert(
            IpFamily::V6,
            FamilyChecks {
                ports: [(nn("both"), 31000), (nn("v6only"), 31002)].into(),
                endpoints: [(nn("both"), 3), (nn("v6only"), 1)].into(),
            },
        );
        let (ports, endpoints) = merged(&families);
        assert_eq!(ports, [(nn("both"), 31000), (nn("v4only"), 31001), (nn("v6only"), 31002)].into());
        assert_eq!(endpoints, [(nn("both"), 3), (nn("v6only"), 1)].into());
        // The IPv6 side dropping the service leaves the IPv4 side's view.
        families.insert(IpFamily::V6, FamilyChecks::default());
        let (ports, endpoints) = merged(&families);
        assert_eq!(ports, [(nn("both"), 31000), (nn("v4only"), 31001)].into());
        assert_eq!(endpoints, [(nn("both"), 2)].into());
    }
}
