//! Object names, as upstream's nftables proxier computes them
//! (pkg/proxy/nftables/proxier.go: hashAndTruncate, servicePortChainNameBase,
//! servicePortEndpointChainNameBase): per-service chains are named
//! `<prefix><HASH>-<namespace>/<name>/<protocol>/<port>`, where HASH is the
//! first 8 characters of the standard base32 encoding of the sha256 digest
//! of the rest of the name.

use sha2::{Digest, Sha256};

use crate::model::{Endpoint, ServicePortName};
use crate::plan::iptables::names::base32;

pub use crate::msgs::nftables::{TABLE, TABLE_COMMENT};

// Base chains.
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
pub const FILTER_INPUT: &str = "filter-input";
pub const FILTER_FORWARD: &str = "filter-forward";
pub const FILTER_OUTPUT: &str = "filter-output";
pub const NAT_PREROUTING: &str = "nat-prerouting";
pub const NAT_OUTPUT: &str = "nat-output";
pub const NAT_POSTROUTING: &str = "nat-postrouting";

// Service dispatch.
pub const SERVICES: &str = "services";
pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// IPs that accept NodePort traffic (absent when nodePortAddresses matches all).
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Active ClusterIPs.
pub const CLUSTER_IPS: &str = "cluster-ips";

// Services without endpoints.
pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const REJECT_CHAIN: &str = "reject-chain";

/// Traffic to unallocated ClusterIPs and undefined ports of ClusterIPs.
pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";

// loadBalancerSourceRanges.
pub const FIREWALL_IPS: &str = "firewall-ips";
pub const FIREWALL_CHECK: &str = "firewall-check";

// Masquerading.
pub const MARK_MASQ: &str = "mark-for-masquerade";
pub const MASQUERADING: &str = "masquerading";

// Per-service prefixes.
pub const SERVICE_PREFIX: &str = "service-";
pub const LOCAL_PREFIX: &str = "local-";
pub const EXTERNAL_PREFIX: &str = "external-";
pub const ENDPOINT_PREFIX: &str = "endpoint-";
pub const AFFINITY_PREFIX: &str = "affinity-";
pub const FIREWALL_PREFIX: &str = "firewall-";

/// knftables.NameLengthMax (256) less the longest prefix (16).
const BASE_LENGTH_MAX: usize = 256 - 16;

/// Upstream's hashAndTruncate: `HASH8-name`, cut to 240 bytes with `...`.
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut out = base32(&digest);
    out.truncate(8);
    out.push('-');
    out.push_str(name);
    if out.len() > BASE_LENGTH_MAX {
        // The name is ASCII (namespace, service and port names, IPs).
        let mut cut = BASE_LENGTH_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// Upstream's servicePortChainNameBase: `HASH-ns/name/protocol/port`.
pub fn service_base(spn: &ServicePortName) -> String {
    let s = &spn.service;
    hash_and_truncate(&format!("{}/{}/{}/{}", s.namespace, s.name, spn.protocol.lower(), spn.port))
}

/// Upstream's servicePortEndpointChainNameBase:
/// `HASH-ns/name/protocol/port__ip/port`, IPv6 colons written as dots. `ip`
/// is the address as text (Go and Rust print addresses alike, RFC 5952).
pub fn endpoint_base(spn: &ServicePortName, ip: &str, port: u16) -> String {
    let s = &spn.service;
    let ip = ip.replace(':', ".");
    hash_and_truncate(&format!("{}/{}/{}/{}__{}/{}", s.namespace, s.name, spn.protocol.lower(), spn.port, ip, port))
}

/// The chain names of one service port (upstream's servicePortInfo fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `service-…`: endpoints for Cluster policy.
    pub cluster: String,
    /// `local-…`: endpoints for Local policy.
    pub local: String,
    /// `external-…`: NodePort, LoadBalancer and externalIP traffic.
    pub external: String,
    /// `firewall-…`: loadBalancerSourceRanges.
    pub firewall: String,
}

impl ServiceChains {
    pub fn new(spn: &ServicePortName) -> ServiceChains {
        let base = service_base(spn);
        ServiceChains {
            cluster: format!("{SERVICE_PREFIX}{base}"),
            local: format!("{LOCAL_PREFIX}{base}"),
            external: format!("{EXTERNAL_PREFIX}{base}"),
            firewall: format!("{FIREWALL_PREFIX}{base}"),
        }
    }
}

/// An endpoint's chain (`endpoint-…`) and affinity set (`affinity-…`).
pub fn endpoint_names(spn: &ServicePortName, ep: &Endpoint) -> (String, String) {
    let base = endpoint_base(spn, &ep.ip.to_string(), ep.port);
    (format!("{ENDPOINT_PREFIX}{base}"), format!("{AFFINITY_PREFIX}{base}"))
}

/// Upstream's isServiceChainName: per-service chain names, and only they, contain `/`.
pub fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

/// Upstream's isAffinitySetName.
pub fn is_affinity_set(name: &str) -> bool {
    name.starts_with(AFFINITY_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NamespacedName;
    use crate::net::Protocol;

    fn spn(ns: &str, name: &str, port: &str, protocol: Protocol) -> ServicePortName {
        ServicePortName { service: NamespacedName::new(ns, name), port: port.into(), protocol }
    }

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            is_local: false,
            ready: true,
            serving: true,
            terminating: false,
            zone_hints: Default::default(),
            node_hints: Default::default(),
        }
    }

    const LONG_NS: &str = "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx";
    const LONG_SVC: &str = "very-long-service-name-why-would-you-even-do-this-i-mean-really";
    const LONG_PORT: &str = "port-443-providing-the-hypertext-transmission-protocol-with-tls";

    /// Upstream's Test_servicePortChainNameBase.
    #[test]
    fn service_bases_match_upstreams_vectors() {
        let cases = [
            (spn("testing", "service", "http", Protocol::Tcp), "P4ZYZVCF-testing/service/tcp/http".to_string()),
            (spn("testing", "service", "https", Protocol::Tcp), "LZBRENCP-testing/service/tcp/https".to_string()),
            (
                spn(LONG_NS, LONG_SVC, LONG_PORT, Protocol::Sctp),
                format!("KR6NACJP-{LONG_NS}/{LONG_SVC}/sctp/{LONG_PORT}"),
            ),
        ];
        for (s, want) in cases {
            assert_eq!(service_base(&s), want);
        }
    }

    /// Upstream's Test_servicePortEndpointChainNameBase, including truncation.
    #[test]
    fn endpoint_bases_match_upstreams_vectors() {
        let http = spn("testing", "service", "http", Protocol::Tcp);
        let long = spn(LONG_NS, LONG_SVC, LONG_PORT, Protocol::Sctp);
        let head = format!("{LONG_NS}/{LONG_SVC}/sctp/{LONG_PORT}");
        // Upstream's vectors, with the address text they hash (the last two
        // are not canonical text: no endpoint prints so, but the hash is of the text).
        let cases = [
            (&http, "10.180.0.1", 80, "JO2XBXZR-testing/service/tcp/http__10.180.0.1/80".to_string()),
            (&http, "10.180.0.2", 80, "5S6H3H22-testing/service/tcp/http__10.180.0.2/80".to_string()),
            (
                &http,
                "fd80:abcd:12::a1b2:c3d4:e5f6:9999",
                80,
                "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80".to_string(),
            ),
            (
                &long,
                "1234:5678:9abc:def0::abc:1234",
                443,
                format!("5YS7AFEA-{head}__1234.5678.9abc.def0..abc.1234/443"),
            ),
            (
                &long,
                "1234:5678:9abc:def0::abcd:1234:5678",
                443,
                format!("CI6C53Q3-{head}__1234.5678.9abc.def0..abcd.1234..."),
            ),
            (
                &long,
                "1234:5678:9abc:def0::abcd:1234:8765",
                443,
                format!("2FLXFK6X-{head}__1234.5678.9abc.def0..abcd.1234..."),
            ),
        ];
        for (s, ip, port, want) in cases {
            assert_eq!(endpoint_base(s, ip, port), want, "{ip}");
        }
        // An IPv6 endpoint hashes its RFC 5952 text, as Go prints it.
        let e = ep("fd00:10:180:0:0:0:0:1", 80);
        let want = hash_and_truncate("testing/service/tcp/http__fd00.10.180..1/80");
        assert_eq!(endpoint_names(&http, &e).0, format!("endpoint-{want}"));
    }

    #[test]
    fn chain_names_of_the_overall_fixture() {
        let c = ServiceChains::new(&spn("ns1", "svc1", "p80", Protocol::Tcp));
        assert_eq!(c.cluster, "service-ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(c.external, "external-ULMVA6XW-ns1/svc1/tcp/p80");
        let (chain, set) = endpoint_names(&spn("ns5", "svc5", "p80", Protocol::Tcp), &ep("10.180.0.3", 80));
        assert_eq!(chain, "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80");
        assert_eq!(set, "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80");
        assert!(is_service_chain(&chain) && !is_service_chain(SERVICES));
        assert!(is_affinity_set(&set) && !is_affinity_set(CLUSTER_IPS));
    }
}
