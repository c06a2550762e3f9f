//! Chain names, as upstream's portProtoHash and servicePortEndpointChainName
//! (pkg/proxy/iptables/proxier.go) compute them: the first 16 characters of
//! the standard base32 encoding of a sha256 digest.

use sha2::{Digest, Sha256};

use crate::model::{Endpoint, ServicePortName};

pub use crate::kernel::iptables::chains::{
    is_service_chain, EXT_PREFIX, FW_PREFIX, SEP_PREFIX, SERVICE_CHAIN_PREFIXES, SVC_PREFIX, SVL_PREFIX,
};

const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// RFC 4648 standard base32 (upper case, `=` padding), as Go's
/// `base32.StdEncoding.EncodeToString`.
pub fn base32(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    for chunk in data.chunks(5) {
        let mut block = [0u8; 5];
        block[..chunk.len()].copy_from_slice(chunk);
        let bits = block.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        // Characters that carry data for a chunk of 1..=5 bytes: ceil(8n/5).
        let used = (chunk.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < used {
                let idx = (bits >> (35 - 5 * i)) & 0x1f;
                out.push(char::from(ALPHABET[idx as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The first 16 characters of base32(sha256(text)).
fn hash16(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    let mut s = base32(&h.finalize());
    s.truncate(16);
    s
}

/// Upstream's portProtoHash(servicePortName, protocol): the suffix shared by
/// a service port's SVC, SVL, EXT and FW chains.
pub fn port_proto_hash(spn: &ServicePortName) -> String {
    hash16(&[&spn.to_string(), spn.protocol.lower()])
}

/// The per-service-port chain names (upstream's servicePortInfo fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChains {
    /// `KUBE-SVC-…` (servicePortPolicyClusterChain).
    pub svc: String,
    /// `KUBE-SVL-…` (servicePortPolicyLocalChainName).
    pub svl: String,
    /// `KUBE-EXT-…` (serviceExternalChainName).
    pub ext: String,
    /// `KUBE-FW-…` (serviceFirewallChainName).
    pub fw: String,
}

impl ServiceChains {
    pub fn new(spn: &ServicePortName) -> ServiceChains {
        let h = port_proto_hash(spn);
        ServiceChains {
            svc: format!("{SVC_PREFIX}{h}"),
            svl: format!("{SVL_PREFIX}{h}"),
            ext: format!("{EXT_PREFIX}{h}"),
            fw: format!("{FW_PREFIX}{h}"),
        }
    }
}

/// Upstream's servicePortEndpointChainName: `KUBE-SEP-` + hash of
/// `ns/name:port` + protocol + `ip:port` (`[ip]:port` for IPv6).
pub fn endpoint_chain(spn: &ServicePortName, ep: &Endpoint) -> String {
    format!("{SEP_PREFIX}{}", hash16(&[&spn.to_string(), spn.protocol.lower(), &ep.to_string()]))
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

    #[test]
    fn base32_matches_rfc4648_test_vectors() {
        let cases = [
            ("", ""),
            ("f", "MY======"),
            ("fo", "MZXQ===="),
            ("foo", "MZXW6==="),
            ("foob", "MZXW6YQ="),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI======"),
        ];
        for (input, want) in cases {
            assert_eq!(base32(input.as_bytes()), want, "{input:?}");
        }
    }

    /// docs/upstream/iptables.md section 2.
    #[test]
    fn service_chain_names_match_upstreams_test_vectors() {
        let cases = [
            (spn("ns1", "svc1", "p80", Protocol::Tcp), "XPGD46QRK7WJZT7O"),
            (spn("ns2", "svc2", "p80", Protocol::Tcp), "GNZBNJ2PO5MGZ6GT"),
            (spn("ns3", "svc3", "p80", Protocol::Tcp), "X27LE4BHSL4DOUIK"),
            (spn("ns4", "svc4", "p80", Protocol::Tcp), "4SW47YFZTEDKD3PK"),
            (spn("ns5", "svc5", "p80", Protocol::Tcp), "NUKIZ6OKUXPJNT4C"),
            (spn("ns2", "svc2", "p8080", Protocol::Tcp), "2VJB64SDSIJUP5T6"),
            (spn("kube-system", "kube-dns", "dns", Protocol::Udp), "TCOU7JCQXEZGVUNU"),
            (spn("default", "kubernetes", "https", Protocol::Tcp), "NPX46M4PTMTKRN6Y"),
        ];
        for (s, h) in cases {
            assert_eq!(port_proto_hash(&s), h, "{s}");
            let c = ServiceChains::new(&s);
            assert_eq!(c.svc, format!("KUBE-SVC-{h}"));
            assert_eq!(c.svl, format!("KUBE-SVL-{h}"));
            assert_eq!(c.ext, format!("KUBE-EXT-{h}"));
            assert_eq!(c.fw, format!("KUBE-FW-{h}"));
        }
    }

    #[test]
    fn endpoint_chain_names_match_upstreams_test_vectors() {
        let cases = [
            ("ns1", "svc1", "10.180.0.1", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
            ("ns2", "svc2", "10.180.0.2", "KUBE-SEP-RS4RBKLTHTF2IUXJ"),
            ("ns3", "svc3", "10.180.0.3", "KUBE-SEP-OYPFS5VJICHGATKP"),
            ("ns4", "svc4", "10.180.0.4", "KUBE-SEP-UKSFD7AGPMPPLUHC"),
            ("ns4", "svc4", "10.180.0.5", "KUBE-SEP-C6EBXVWJJZMIWKLZ"),
            ("ns5", "svc5", "10.180.0.3", "KUBE-SEP-I77PXRDZVX7PMWMN"),
            ("ns1", "svc1", "10.0.1.1", "KUBE-SEP-SNQ3ZNILQDEJNDQO"),
            ("ns3", "svc3", "10.0.3.2", "KUBE-SEP-DKCFIS26GWF2WLWC"),
        ];
        for (ns, name, ip, want) in cases {
            assert_eq!(endpoint_chain(&spn(ns, name, "p80", Protocol::Tcp), &ep(ip, 80)), want);
        }
    }

    #[test]
    fn unnamed_ports_and_ipv6_endpoints_hash_upstreams_strings() {
        // `ns/name` without `:port`, and `[ip]:port`: the hash input is the
        // same text upstream hashes.
        let s = spn("default", "web", "", Protocol::Tcp);
        assert_eq!(port_proto_hash(&s), hash16(&["default/webtcp"]));
        let e = ep("fd00::1", 80);
        assert_eq!(endpoint_chain(&s, &e), format!("KUBE-SEP-{}", hash16(&["default/webtcp[fd00::1]:80"])));
        assert!(is_service_chain("KUBE-SEP-X") && is_service_chain("KUBE-FW-X"));
        assert!(!is_service_chain("KUBE-SERVICES") && !is_service_chain("KUBE-NODEPORTS"));
    }
}
