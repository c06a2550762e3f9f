//! Deltas for the conntrack actor: which stale UDP (and SCTP) entries to delete.
//! Mirrors upstream's conntrack.ClearEntriesFor* helpers.

use std::fmt;
use std::net::IpAddr;

use crate::net::{join_host_port, Protocol};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConntrackOp {
    /// Entries whose original destination is this service IP (a service
    /// going from 0 to N endpoints, or a removed service port).
    FlushServiceIp { ip: IpAddr, protocol: Protocol },
    /// Entries to a service IP that were NATed to this endpoint (a removed endpoint).
    FlushEndpoint { service_ip: IpAddr, endpoint_ip: IpAddr, protocol: Protocol },
    /// Entries to a node port (a NodePort service going from 0 to N endpoints).
    FlushNodePort { port: u16, protocol: Protocol },
    /// Entries to a node port that were NATed to this endpoint.
    FlushNodePortEndpoint { port: u16, endpoint_ip: IpAddr, protocol: Protocol },
}

impl fmt::Display for ConntrackOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConntrackOp::FlushServiceIp { ip, protocol } => {
                write!(f, "conntrack -D -p {} --orig-dst {ip}", protocol.lower())
            }
            ConntrackOp::FlushEndpoint { service_ip, endpoint_ip, protocol } => {
                write!(f, "conntrack -D -p {} --orig-dst {service_ip} --dst-nat {endpoint_ip}", protocol.lower())
            }
            ConntrackOp::FlushNodePort { port, protocol } => {
                write!(f, "conntrack -D -p {} --orig-port-dst {port}", protocol.lower())
            }
            ConntrackOp::FlushNodePortEndpoint { port, endpoint_ip, protocol } => write!(
                f,
                "conntrack -D -p {} --orig-port-dst {port} --dst-nat {}",
                protocol.lower(),
                join_host_port(endpoint_ip, 0).trim_end_matches(":0")
            ),
        }
    }
}
