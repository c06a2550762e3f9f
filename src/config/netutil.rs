//! Address parsing with Go's rules, as upstream's validation uses them:
//! `netutils.ParseIPSloppy` (IPv4 parts may have leading zeros),
//! `netutils.ParseCIDRSloppy`, `net.SplitHostPort` and
//! `proxyutil.AppendPortIfNeeded`.

use std::fmt::Display;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address, accepting IPv4 parts with leading zeros
/// (`010.0.0.1` is 10.0.0.1) as Go's `ParseIPSloppy` does.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// Parses `address/prefix` (host bits may be set, as Go allows).
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.split_once('/')?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    IpNet::new(parse_ip_sloppy(addr)?, prefix.parse().ok()?).ok()
}

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
    fn sloppy_ip_accepts_leading_zeros() {
        assert_eq!(parse_ip_sloppy("010.000.0.1"), "10.0.0.1".parse().ok());
        assert_eq!(parse_ip_sloppy("::1"), "::1".parse().ok());
        for bad in ["", "1.2.3", "1.2.3.4.5", "256.0.0.1", "1.2.3.4:80", "a.b.c.d", "fe80::1%eth0"] {
            assert_eq!(parse_ip_sloppy(bad), None, "{bad}");
        }
    }

    #[test]
    fn cidr_parsing() {
        assert!(parse_cidr_sloppy("10.0.0.1/8").is_some());
        assert!(parse_cidr_sloppy("fd00::/64").is_some());
        for bad in ["10.0.0.0", "10.0.0.0/33", "10.0.0.0/", "/8", "::/129", "x/8", "10.0.0.0/+8"] {
            assert!(parse_cidr_sloppy(bad).is_none(), "{bad}");
        }
    }

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
