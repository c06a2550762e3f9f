//! Stale UDP conntrack entries to delete after a sync, as upstream's
//! conntrack.CleanStaleEntries (deleteStaleServiceConntrackEntries and
//! deleteStaleEndpointConntrackEntries) decides them.

use std::collections::BTreeSet;

use crate::model::{Model, ModelChanges};
use crate::msgs::ConntrackOp;
use crate::net::Protocol;

/// The flushes implied by `changes`, given the model after the change.
pub fn conntrack_ops(model: &Model, changes: &ModelChanges) -> Vec<ConntrackOp> {
    let udp = Protocol::Udp;
    let mut ops = BTreeSet::new();
    for ip in &changes.deleted_udp_cluster_ips {
        ops.insert(ConntrackOp::FlushServiceIp { ip: *ip, protocol: udp });
    }
    for spn in &changes.newly_active_udp {
        let Some(sp) = model.service_port(spn) else {
            continue;
        };
        let ips = std::iter::once(&sp.cluster_ip).chain(&sp.external_ips).chain(&sp.load_balancer_vips);
        for ip in ips {
            ops.insert(ConntrackOp::FlushServiceIp { ip: *ip, protocol: udp });
        }
        if sp.node_port != 0 {
            ops.insert(ConntrackOp::FlushNodePort { port: sp.node_port, protocol: udp });
        }
    }
    for stale in &changes.deleted_udp_endpoints {
        let Some(sp) = model.service_port(&stale.port) else {
            continue;
        };
        if sp.node_port != 0 {
            ops.insert(ConntrackOp::FlushNodePortEndpoint { port: sp.node_port, endpoint_ip: stale.ip, protocol: udp });
        }
        let ips = std::iter::once(&sp.cluster_ip).chain(&sp.external_ips).chain(&sp.load_balancer_vips);
        for ip in ips {
            ops.insert(ConntrackOp::FlushEndpoint { service_ip: *ip, endpoint_ip: stale.ip, protocol: udp });
        }
    }
    ops.into_iter().collect()
}
