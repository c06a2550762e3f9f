//! Small network vocabulary shared by the model, the planner and the kernel
//! layer: L4 protocol, IP family, address formatting, and the one parser of
//! IP and CIDR text (upstream's sloppy ones) for the objects and the config.

use std::fmt;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};

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

/// Parses an IP address as upstream's `netutils.ParseIPSloppy`
/// (k8s.io/utils/net) does: Go's `net.ParseIP` (no zone, brackets, port or
/// whitespace) and, failing that, the same text with the leading zeros of
/// its trailing dotted-decimal part stripped, read as decimal (`010.000.0.1`
/// is 10.0.0.1, `::ffff:0192.0168.0.5` is 192.168.0.5). An IPv4-mapped
/// IPv6 address is the IPv4 address, as Go treats it.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    parse_ip(s).or_else(|| parse_ip(&strip_leading_zeros(s)?))
}

/// Parses a CIDR as upstream's `netutils.ParseCIDRSloppy` does and returns
/// its network, host bits cleared (Go's `*net.IPNet`): Go's
/// `net.ParseCIDR` (the prefix length is decimal digits, leading zeros
/// allowed, at most the address's bits) and, failing that, the text with
/// the leading zeros of its trailing dotted-decimal part and prefix
/// stripped (`203.0.113.000/025` is 203.0.113.0/25). An IPv4-mapped network
/// with a prefix of 96 or more is the IPv4 network (`::ffff:1.1.1.0/120`
/// is 1.1.1.0/24), as Go treats it.
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    parse_cidr(s).or_else(|| parse_cidr(&strip_leading_zeros(s)?))
}

/// Go's `net.ParseIP`, IPv4-mapped addresses as IPv4.
fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Go's `net.ParseCIDR`, the network only; IPv4-mapped as IPv4.
fn parse_cidr(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.split_once('/')?;
    let ip = addr.parse::<IpAddr>().ok()?;
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix = match prefix.trim_start_matches('0') {
        "" => 0,
        digits => digits.parse::<u8>().ok()?,
    };
    let net = IpNet::new(ip, prefix).ok()?.trunc();
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => Ipv4Net::new(v4, v6.prefix_len() - 96).ok().map(IpNet::V4),
            None => Some(net),
        },
        _ => Some(net),
    }
}

/// Upstream's `matchZeros` rewrite: when `s` ends (after its last `:`, if
/// any) in four dot-separated decimal numbers, optionally followed by
/// `/` and a decimal number, those numbers without their leading zeros.
/// `None` when it does not end so.
fn strip_leading_zeros(s: &str) -> Option<String> {
    let (head, tail) = s.split_at(s.rfind(':').map_or(0, |i| i + 1));
    let (dotted, prefix) = match tail.split_once('/') {
        Some((dotted, prefix)) => (dotted, Some(prefix)),
        None => (tail, None),
    };
    let octets: Vec<&str> = dotted.split('.').collect();
    let numbers = || octets.iter().copied().chain(prefix);
    if octets.len() != 4 || !numbers().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let strip = |n: &str| match n.trim_start_matches('0') {
        "" => "0".to_string(),
        digits => digits.to_string(),
    };
    let mut out = format!("{head}{}", octets.iter().map(|o| strip(o)).collect::<Vec<_>>().join("."));
    if let Some(p) = prefix {
        out.push('/');
        out.push_str(&strip(p));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Upstream's own cases (k8s.io/utils/net ips_test.go, as its
    // TestParseIPSloppy and TestParseCIDRSloppy use them), then ours.

    /// (what, texts that parse, what they parse to).
    const GOOD_IPS: &[(&str, &[&str], &str)] = &[
        ("IPv4", &["192.168.0.5", "192.168.000.005"], "192.168.0.5"),
        ("IPv4 all-zeros", &["0.0.0.0", "000.000.000.000"], "0.0.0.0"),
        ("IPv4 broadcast", &["255.255.255.255"], "255.255.255.255"),
        ("IPv6", &["2001:db8::5", "2001:0db8::0005", "2001:DB8::5"], "2001:db8::5"),
        ("IPv6 all-zeros", &["::", "0:0:0:0:0:0:0:0", "0000:0000:0000:0000:0000:0000:0000:0000", "0::0"], "::"),
        ("IPv6 loopback", &["::1", "0000:0000:0000:0000:0000:0000:0000:0001"], "::1"),
        ("IPv4-mapped IPv6", &["192.168.0.5", "::ffff:192.168.0.5", "::ffff:0192.0168.0000.0005"], "192.168.0.5"),
        // Ours: the issue's, upstream's rewrite applied to longer runs of zeros, mapped in hex.
        ("leading zeros", &["010.000.0.1", "0010.0.00.0001", "10.0.0.000000000001"], "10.0.0.1"),
        ("IPv4-mapped, hex", &["::ffff:c0a8:5", "0:0:0:0:0:ffff:192.168.0.5"], "192.168.0.5"),
    ];

    const BAD_IPS: &[(&str, &[&str])] = &[
        ("empty string is not an IP", &[""]),
        ("random non-IP string is not an IP", &["bad ip"]),
        ("domain name is not an IP", &["www.example.com"]),
        ("mangled IPv4 addresses are invalid", &["1.2.3.400", "1.2..4", "1.2.3", "1.2.3.4.5"]),
        (
            "mangled IPv6 addresses are invalid",
            &["1:2::12345", "1::2::3", "1:2:::3", "1:2:3", "1:2:3:4:5:6:7:8:9", "1:2:3:4::6:7:8:9"],
        ),
        (
            "IPs do not have ports or brackets",
            &["1.2.3.4:80", "[2001:db8::5]", "[2001:db8::5]:80", "www.example.com:80"],
        ),
        ("IPs with zones are invalid", &["169.254.169.254%eth0", "fe80::1234%eth0"]),
        ("CIDR strings are not IPs", &["1.2.3.0/24", "2001:db8::/64"]),
        ("IPs with whitespace are invalid", &[" 1.2.3.4", "1.2.3.4 ", " 2001:db8::5", "2001:db8::5 "]),
        // Ours.
        ("leading zeros do not rescue a value", &["0256.0.0.1", "1.2.3.0400", "01.2.3", "-1.2.3.4", "+1.2.3.4"]),
        ("a leading-zero IPv4 part must end the text", &["01.2.3.4:80", "::ffff:01.2.3.4%eth0", "01.2.3.4/32"]),
        ("only dotted parts lose their zeros", &["1:2:3:4:5:6:7:00008", "::ffff:1.2.3.04.5"]),
    ];

    /// (what, texts that parse, the network they parse to).
    const GOOD_CIDRS: &[(&str, &[&str], &str)] = &[
        ("IPv4", &["1.2.3.0/24"], "1.2.3.0/24"),
        ("IPv4, single IP", &["1.1.1.1/32"], "1.1.1.1/32"),
        ("IPv4, all IPs", &["0.0.0.0/0", "000.000.000.000/000"], "0.0.0.0/0"),
        ("IPv4 ifaddr (masked)", &["1.2.3.0/24", "1.2.3.4/24", "1.2.3.255/24"], "1.2.3.0/24"),
        ("IPv6", &["2001:db8::/64", "2001:db8:0:0:0:0:0:0/64", "2001:DB8::/64"], "2001:db8::/64"),
        ("IPv6, all IPs", &["::/0"], "::/0"),
        ("IPv6, single IP", &["::1/128"], "::1/128"),
        (
            "IPv6 ifaddr (masked)",
            &["2001:db8::/64", "2001:db8::1/64", "2001:db8::f00f:f0f0:0f0f:000f/64"],
            "2001:db8::/64",
        ),
        ("IPv4-mapped IPv6", &["1.1.1.0/24", "::ffff:1.1.1.0/120", "::ffff:01.01.01.00/0120"], "1.1.1.0/24"),
        // Ours: the issue's, Go's own leading zeros in a prefix, mapped below /96.
        ("leading zeros", &["203.0.113.000/025", "203.000.113.001/25", "203.0.113.0/0025"], "203.0.113.0/25"),
        ("leading zeros in an IPv6 prefix", &["fd00::/064", "fd00::/00000064"], "fd00::/64"),
        ("IPv4-mapped, /96", &["::ffff:1.2.3.4/96", "::ffff:0:0/96"], "0.0.0.0/0"),
        ("IPv4-mapped, under /96", &["::ffff:1.2.3.4/64", "::/64"], "::/64"),
    ];

    const BAD_CIDRS: &[(&str, &[&str])] = &[
        ("empty string is not a CIDR", &[""]),
        ("random unparseable string is not a CIDR", &["bad cidr"]),
        ("CIDR with invalid IP is invalid", &["1.2.300.0/24", "2001:db8000::/64"]),
        ("CIDR with invalid prefix length is invalid", &["1.2.3.4/64", "2001:db8::5/192", "1.2.3.0/-8", "1.2.3.0/+24"]),
        ("URLs (that aren't also valid CIDRs) are invalid", &["www.example.com/24", "192.168.0.1/0/99"]),
        ("plain IP is not a CIDR", &["1.2.3.4", "2001:db8::1"]),
        ("CIDR with whitespace is invalid", &[" 1.2.3.0/24", "1.2.3.0/24 "]),
        // Ours.
        (
            "prefix beyond the family's bits",
            &["10.0.0.0/33", "010.0.0.0/033", "::/129", "1.2.3.0/256", "1.2.3.0/99999"],
        ),
        ("no address or no prefix", &["10.0.0.0/", "/8", "x/8", "010.0.0.0/", "fe80::/64%eth0", "fe80::%eth0/64"]),
    ];

    #[test]
    fn sloppy_ips_parse_as_upstreams() {
        for (what, texts, want) in GOOD_IPS {
            for text in *texts {
                assert_eq!(parse_ip_sloppy(text), want.parse().ok(), "{what}: {text:?}");
            }
        }
        for (what, texts) in BAD_IPS {
            for text in *texts {
                assert_eq!(parse_ip_sloppy(text), None, "{what}: {text:?}");
            }
        }
    }

    #[test]
    fn sloppy_cidrs_parse_as_upstreams() {
        for (what, texts, want) in GOOD_CIDRS {
            for text in *texts {
                let got = parse_cidr_sloppy(text).map(|n| n.to_string());
                assert_eq!(got.as_deref(), Some(*want), "{what}: {text:?}");
            }
        }
        for (what, texts) in BAD_CIDRS {
            for text in *texts {
                assert_eq!(parse_cidr_sloppy(text), None, "{what}: {text:?}");
            }
        }
    }

    #[test]
    fn ipv4_mapped_values_are_of_the_ipv4_family() {
        let ip = parse_ip_sloppy("::ffff:10.96.0.1").expect("mapped");
        assert_eq!(IpFamily::of(&ip), IpFamily::V4);
        let net = parse_cidr_sloppy("::ffff:10.96.0.0/112").expect("mapped");
        assert!(matches!(net, IpNet::V4(_)), "{net}");
        assert_eq!(net.to_string(), "10.96.0.0/16");
    }

    #[test]
    fn host_port_brackets_v6() {
        assert_eq!(join_host_port(&"10.0.0.1".parse().unwrap(), 80), "10.0.0.1:80");
        assert_eq!(join_host_port(&"fd00::1".parse().unwrap(), 80), "[fd00::1]:80");
    }
}
