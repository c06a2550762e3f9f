//! `--init-only`'s part of upstream's proxier set-up that a serving daemon
//! does at its first sync: in iptables mode, route_localnet when IPv4 runs
//! and localhost NodePorts need it (upstream's `NewProxier` before its
//! `initOnly` return). The conntrack settings, and IPVS mode's sysctls and
//! timeouts, are set before it, as for a daemon that serves. A failure is
//! fatal, as upstream's.

use crate::config::{KubeProxyConfiguration, ProxyMode};
use crate::kernel::{addrs, sysctl, KernelError};
use crate::model::NodeInfo;
use crate::net::IpFamily;
use crate::plan::iptables::context::SYSCTL_ROUTE_LOCALNET;
use crate::plan::iptables::HostFeatures;
use crate::settings;

/// Why the node could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("reading the node's addresses: {0}")]
    Addresses(#[source] std::io::Error),
    /// Upstream's `NewProxier` error, as `createProxier` words it.
    #[error("unable to create proxier: {0}")]
    RouteLocalnet(#[source] KernelError),
}

/// Sets route_localnet to 1, which localhost NodePorts need (upstream's
/// NewProxier), if it is not.
pub fn ensure_route_localnet() -> Result<(), KernelError> {
    if sysctl::ensure_sysctl(SYSCTL_ROUTE_LOCALNET, 1)? {
        tracing::info!(
            sysctl = SYSCTL_ROUTE_LOCALNET,
            "Setting route_localnet=1 to allow node-ports on localhost; to change this either disable \
             iptables.localhostNodePorts (--iptables-localhost-nodeports) or set nodePortAddresses \
             (--nodeport-addresses) to filter loopback addresses"
        );
    }
    Ok(())
}

/// The set-up of a node whose proxier runs IPv4 (`runs_ipv4`) or not, with
/// `node` as found at start.
pub fn privileged_init(
    cfg: &KubeProxyConfiguration,
    runs_ipv4: bool,
    node_name: &str,
    node: Option<&NodeInfo>,
) -> Result<(), InitError> {
    if cfg.proxy_mode() != ProxyMode::Iptables || !runs_ipv4 {
        return Ok(());
    }
    let s = settings::derive(cfg, IpFamily::V4, node_name, HostFeatures::default());
    let node = node.cloned().unwrap_or_else(|| NodeInfo { name: node_name.to_string(), ..NodeInfo::default() });
    let addrs = addrs::local_addrs().map_err(InitError::Addresses)?;
    if s.iptables_context(&node, &addrs).needs_route_localnet() {
        ensure_route_localnet().map_err(InitError::RouteLocalnet)?;
    }
    Ok(())
}
