//! The node's interface addresses, as upstream reads them for NodePorts
//! (net.Interfaces + Addrs). Works unprivileged and inside a network
//! namespace (`ip netns exec X kube-proxy-rs --dry-run`).

use std::net::IpAddr;

use nix::ifaddrs::getifaddrs;

use crate::net::LocalAddr;

/// Every address on every interface, sorted. Errors are returned, not hidden.
pub fn local_addrs() -> std::io::Result<Vec<LocalAddr>> {
    let mut out = Vec::new();
    for ifa in getifaddrs().map_err(std::io::Error::from)? {
        let Some(addr) = ifa.address else { continue };
        let ip: Option<IpAddr> = if let Some(v4) = addr.as_sockaddr_in() {
            Some(IpAddr::V4(v4.ip()))
        } else {
            addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
        };
        if let Some(ip) = ip {
            out.push(LocalAddr { ifname: ifa.interface_name.clone(), ip });
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed() {
        let addrs = local_addrs().expect("getifaddrs");
        assert!(addrs.iter().any(|a| a.ip == IpAddr::from([127, 0, 0, 1])), "{addrs:?}");
    }
}
