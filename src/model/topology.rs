//! Which endpoints a service port sends traffic to, per traffic policy and
//! topology hints: upstream's CategorizeEndpoints (pkg/proxy/topology.go).

use super::endpoints::Endpoint;
use super::service::ServicePort;

/// The endpoint lists one service port uses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Categorized<'a> {
    /// Endpoints for Cluster-policy traffic (ready, topology-filtered; else serving-terminating).
    pub cluster: Vec<&'a Endpoint>,
    /// Endpoints for Local-policy traffic (local ready; else local serving-terminating).
    pub local: Vec<&'a Endpoint>,
    /// Union of the two, for rules that don't care which policy applies.
    pub all_reachable: Vec<&'a Endpoint>,
    /// Some endpoint anywhere can take traffic (drives REJECT vs DROP).
    pub has_any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopologyMode {
    None,
    Node,
    Zone,
}

/// Splits `endpoints` as upstream's CategorizeEndpoints does.
pub fn categorize<'a>(endpoints: &'a [Endpoint], sp: &ServicePort, node_name: &str, zone: &str) -> Categorized<'a> {
    let mut out = Categorized::default();
    if sp.uses_cluster_endpoints() {
        let mode = topology_mode(endpoints, node_name, zone);
        out.cluster = endpoints.iter().filter(|e| e.ready && available(e, mode, node_name, zone)).collect();
        if out.cluster.is_empty() {
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating && available(e, mode, node_name, zone))
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !sp.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let usable = |e: &&Endpoint| e.ready || (e.serving && e.terminating);
    out.has_any |= endpoints.iter().any(|e| usable(&e));
    let local_ready = endpoints.iter().any(|e| e.is_local && e.ready);
    out.local = if local_ready {
        endpoints.iter().filter(|e| e.is_local && e.ready).collect()
    } else {
        endpoints.iter().filter(|e| e.is_local && e.serving && e.terminating).collect()
    };
    if !sp.uses_cluster_endpoints() {
        out.all_reachable = out.local.clone();
        return out;
    }
    let mut all: Vec<&Endpoint> = out.cluster.iter().chain(out.local.iter()).copied().collect();
    all.sort_by_key(|e| (e.ip, e.port));
    all.dedup_by_key(|e| (e.ip, e.port));
    out.all_reachable = all;
    out
}

/// Upstream's topologyModeFromHints: node hints when every ready endpoint
/// has them and one is for this node; else zone hints likewise; else none.
fn topology_mode(endpoints: &[Endpoint], node_name: &str, zone: &str) -> TopologyMode {
    let ready: Vec<&Endpoint> = endpoints.iter().filter(|e| e.ready).collect();
    let all_node_hints = ready.iter().all(|e| !e.node_hints.is_empty());
    if all_node_hints && ready.iter().any(|e| e.node_hints.contains(node_name)) {
        return TopologyMode::Node;
    }
    let all_zone_hints = ready.iter().all(|e| !e.zone_hints.is_empty());
    if all_zone_hints && ready.iter().any(|e| e.zone_hints.contains(zone)) {
        return TopologyMode::Zone;
    }
    TopologyMode::None
}

fn available(e: &Endpoint, mode: TopologyMode, node_name: &str, zone: &str) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::Node => e.node_hints.contains(node_name),
        TopologyMode::Zone => e.zone_hints.contains(zone),
    }
}
