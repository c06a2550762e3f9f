//! Deltas for the dummy-link actor: the service addresses bound to kube-ipvs0.

use std::fmt;
use std::net::IpAddr;

/// The device upstream's IPVS proxier binds service addresses to.
pub const DUMMY_LINK: &str = "kube-ipvs0";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkOp {
    Bind(IpAddr),
    Unbind(IpAddr),
}

impl LinkOp {
    pub fn addr(&self) -> &IpAddr {
        match self {
            LinkOp::Bind(a) | LinkOp::Unbind(a) => a,
        }
    }
}

impl fmt::Display for LinkOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkOp::Bind(a) => write!(f, "bind {a} dev {DUMMY_LINK}"),
            LinkOp::Unbind(a) => write!(f, "unbind {a} dev {DUMMY_LINK}"),
        }
    }
}
