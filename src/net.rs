//! Small network vocabulary shared by the model, the planner and the kernel
//! layer: L4 protocol, IP family, address formatting.

use std::fmt;
use std::net::IpAddr;

/// The L4 protocols a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// Parses the Kubernetes spelling ("TCP", "UDP", "SCTP"); empty means TCP,
    /// as the API server defaults it.
    pub fn from_k8s(s: &str) -> Option<Protocol> {
        match s {
            "" | "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower case, as iptables, ipset and ipvsadm spell it.
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Upper case, as Kubernetes spells it.
    pub fn upper(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The IP protocol number (IPPROTO_*).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    pub fn from_number(n: u8) -> Option<Protocol> {
        match n {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            132 => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.upper())
    }
}

/// IPv4 or IPv6. kube-proxy runs one proxier per family: the primary one
/// (bindAddress's, else the Node's first address's) and, on a node where
/// both work, the other one too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum IpFamily {
    #[default]
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn matches(self, ip: &IpAddr) -> bool {
        IpFamily::of(ip) == self
    }

    /// The other family.
    pub fn other(self) -> IpFamily {
        match self {
            IpFamily::V4 => IpFamily::V6,
            IpFamily::V6 => IpFamily::V4,
        }
    }

    /// `ipv4` or `ipv6`: the suffix of the secondary family's `--dry-run`
    /// sections and actor names.
    pub fn lower(self) -> &'static str {
        match self {
            IpFamily::V4 => "ipv4",
            IpFamily::V6 => "ipv6",
        }
    }

    /// Host prefix length: 32 or 128.
    pub fn host_bits(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    /// ipset's family keyword.
    pub fn ipset_family(self) -> &'static str {
        match self {
            IpFamily::V4 => "inet",
            IpFamily::V6 => "inet6",
        }
    }

    /// The EndpointSlice addressType for this family.
    pub fn slice_address_type(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

/// Upstream's `v1.IPFamily` spelling (`IPv4`, `IPv6`): the `ip_family`
/// label of metrics, the keys of the health answers' per-family `status`.
pub fn ip_family_label(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "IPv4",
        IpFamily::V6 => "IPv6",
    }
}

/// An address on one of the node's interfaces (the kernel layer reads them,
/// the planner picks NodePort addresses and the node IP from them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LocalAddr {
    pub ifname: String,
    pub ip: IpAddr,
}

/// `ip:port`, with brackets for IPv6 (`[fd00::1]:80`), as Go's JoinHostPort.
pub fn join_host_port(ip: &IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// Parses an IP the way upstream's `ParseIPSloppy` does for what we accept:
/// plain IPv4/IPv6 text, leading zeros in IPv4 octets tolerated.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    // Go's legacy parser accepted leading zeros ("010.001.002.003"), read as decimal.
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sloppy_parse_accepts_leading_zeros_and_rejects_garbage() {
        assert_eq!(parse_ip_sloppy("010.096.000.001"), Some("10.96.0.1".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("10.96.0"), None);
        assert_eq!(parse_ip_sloppy("10.96.0.256"), None);
        assert_eq!(parse_ip_sloppy("bogus"), None);
    }

    #[test]
    fn host_port_brackets_v6() {
        assert_eq!(join_host_port(&"10.0.0.1".parse().unwrap(), 80), "10.0.0.1:80");
        assert_eq!(join_host_port(&"fd00::1".parse().unwrap(), 80), "[fd00::1]:80");
    }
}
