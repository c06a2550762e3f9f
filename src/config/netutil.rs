//! Address parsing with Go's rules, as upstream's validation uses them:
//! `netutils.ParseIPSloppy` and `netutils.ParseCIDRSloppy` (the crate's,
//! from [`crate::net`]), `net.SplitHostPort` and
//! `proxyutil.AppendPortIfNeeded`.

use std::fmt::Display;
use std::net::IpAddr;

/// The crate's one pair of sloppy parsers, for the config's fields.
pub use crate::net::{parse_cidr_sloppy, parse_ip_sloppy};

/// Splits `host:port` / `[host]:port` as Go's `net.SplitHostPort` does;
/// the host loses its brackets. `None` when the form is wrong.
pub fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        if host.contains('[') || host.contains(']') || port.contains(['[', ']']) {
            return None;
        }
        return Some((host, port));
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.contains(':') || s.contains(['[', ']']) {
        return None;
    }
    Some((host, port))
}

/// Adds `:port` to a bare IP (`[ip]:port` for IPv6); anything else
/// (already `host:port`, or invalid) is returned unchanged for validation
/// to judge.
pub fn append_port_if_needed(addr: &str, port: impl Display) -> String {
    if split_host_port(addr).is_some() {
        return addr.to_string();
    }
    match parse_ip_sloppy(addr) {
        Some(IpAddr::V4(_)) => format!("{addr}:{port}"),
        Some(IpAddr::V6(_)) => format!("[{addr}]:{port}"),
        None => addr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splitting_follows_go() {
        assert_eq!(split_host_port("0.0.0.0:10256"), Some(("0.0.0.0", "10256")));
        assert_eq!(split_host_port("[::1]:10249"), Some(("::1", "10249")));
        assert_eq!(split_host_port(":80"), Some(("", "80")));
        assert_eq!(split_host_port("1.2.3.4:"), Some(("1.2.3.4", "")));
        for bad in ["1.2.3.4", "::1", "::1:80", "[::1]", "[::1]80", "[[::1]]:80"] {
            assert_eq!(split_host_port(bad), None, "{bad}");
        }
    }

    #[test]
    fn appends_port_only_to_bare_ips() {
        assert_eq!(append_port_if_needed("0.0.0.0", 10256), "0.0.0.0:10256");
        assert_eq!(append_port_if_needed("::", 10256), "[::]:10256");
        assert_eq!(append_port_if_needed("1.2.3.4:99", 10256), "1.2.3.4:99");
        assert_eq!(append_port_if_needed("junk", 10256), "junk");
        assert_eq!(append_port_if_needed("", 10256), "");
    }
}
