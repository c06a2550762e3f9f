//! Which IP families this node's daemon runs a proxier for (upstream's
//! platform check and metaproxier): the primary family, from the bind
//! address or the Node, and the other one where the kernel and the mode's
//! tools support it too.

use std::path::Path;

use crate::config::{KubeProxyConfiguration, NodePortAddresses, ProxyMode};
use crate::kernel::iptables;
use crate::kernel::nftables;
use crate::model::NodeInfo;
use crate::net::{ip_family_label, parse_ip_sloppy, IpFamily};

/// The family this proxy programs: the bind address's if set, else the
/// Node's primary address's, else IPv4.
pub fn primary_family(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> IpFamily {
    bind_ip(cfg)
        .or_else(|| node.and_then(|n| n.addresses.first().copied()))
        .map(|ip| IpFamily::of(&ip))
        .unwrap_or_default()
}

/// The families this daemon runs a proxier for: the primary one, and the
/// other one where the node can do both (upstream's metaproxier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Families {
    pub primary: IpFamily,
    pub secondary: Option<IpFamily>,
}

impl Families {
    pub fn single(primary: IpFamily) -> Families {
        Families { primary, secondary: None }
    }

    pub fn dual(primary: IpFamily) -> Families {
        Families { primary, secondary: Some(primary.other()) }
    }

    /// The primary family first.
    pub fn all(&self) -> impl Iterator<Item = IpFamily> {
        std::iter::once(self.primary).chain(self.secondary)
    }

    pub fn is_dual(&self) -> bool {
        self.secondary.is_some()
    }

    /// What names of `family`'s `--dry-run` sections and actors end with:
    /// nothing for the primary family, ` ipv6` (or ` ipv4`) for the
    /// secondary one, so single-stack names stay as they always were.
    pub fn suffix(&self, family: IpFamily) -> String {
        if family == self.primary {
            String::new()
        } else {
            format!(" {}", family.lower())
        }
    }
}

/// Why `family` cannot be proxied on this node in `mode`, if it cannot: the
/// kernel has it off (IPv6), or the mode's tool does not work for it
/// (iptables and IPVS mode: its iptables; nftables mode: nf_tables, probed
/// by a dump of the family's `kube-proxy` chains, as upstream tries nft).
pub fn family_support(family: IpFamily, mode: ProxyMode) -> Result<(), FamilyUnsupported> {
    if family == IpFamily::V6 {
        if !Path::new("/proc/net/if_inet6").exists() {
            return Err(FamilyUnsupported::Kernel("/proc/net/if_inet6 is missing".into()));
        }
        let disabled =
            std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").is_ok_and(|v| v.trim() == "1");
        if disabled {
            return Err(FamilyUnsupported::Kernel("net.ipv6.conf.all.disable_ipv6 is 1".into()));
        }
    }
    match mode {
        ProxyMode::Nftables => {
            nftables::probe(family, "kube-proxy").map_err(|e| FamilyUnsupported::Nftables(e.to_string()))
        }
        ProxyMode::Iptables | ProxyMode::Ipvs => {
            iptables::present(family).map_err(|e| FamilyUnsupported::Iptables(e.to_string()))
        }
    }
}

/// Why a family cannot be proxied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FamilyUnsupported {
    /// Upstream's "No kernel support for family".
    #[error("no kernel support: {0}")]
    Kernel(String),
    /// Upstream's "No iptables support for family".
    #[error("no iptables support: {0}")]
    Iptables(String),
    /// Upstream's "No nftables support for family".
    #[error("no nftables support: {0}")]
    Nftables(String),
}

/// The primary family cannot be proxied: the daemon cannot start.
#[derive(Debug, thiserror::Error)]
#[error("no support for primary IP family {family}: {source}")]
pub struct PrimaryFamilyUnsupported {
    pub family: &'static str,
    #[source]
    pub source: FamilyUnsupported,
}

/// Upstream's platform check, pure: the primary family must work (else the
/// daemon cannot start); the secondary one runs where it works too, and
/// otherwise the daemon runs single-stack, saying why. nodePortAddresses of
/// a family that does not run are ignored, with upstream's message.
pub fn choose_families(
    cfg: &KubeProxyConfiguration,
    primary: IpFamily,
    primary_ok: Result<(), FamilyUnsupported>,
    secondary_ok: Result<(), FamilyUnsupported>,
) -> Result<Families, PrimaryFamilyUnsupported> {
    let label = ip_family_label;
    if let Err(e) = primary_ok {
        return Err(PrimaryFamilyUnsupported { family: label(primary), source: e });
    }
    let secondary = primary.other();
    match secondary_ok {
        Ok(()) => {
            tracing::info!(primary_ip_family = label(primary), "kube-proxy running in dual-stack mode");
            Ok(Families::dual(primary))
        }
        Err(e) => {
            match &e {
                FamilyUnsupported::Kernel(why) => {
                    tracing::info!(ip_family = label(secondary), reason = %why, "No kernel support for family")
                }
                FamilyUnsupported::Iptables(why) => {
                    tracing::info!(ip_family = label(secondary), error = %why, "No iptables support for family")
                }
                FamilyUnsupported::Nftables(why) => {
                    tracing::info!(ip_family = label(secondary), error = %why, "No nftables support for family")
                }
            }
            tracing::info!(ip_family = label(primary), "kube-proxy running in single-stack mode");
            let wrong: Vec<String> = match cfg.node_port_addresses() {
                NodePortAddresses::Cidrs(nets) => {
                    nets.iter().filter(|n| secondary.matches(&n.addr())).map(|n| n.to_string()).collect()
                }
                _ => Vec::new(),
            };
            if !wrong.is_empty() {
                tracing::info!(
                    ip_family = label(secondary),
                    addresses = %wrong.join(","),
                    "Ignoring --nodeport-addresses of the wrong family"
                );
            }
            Ok(Families::single(primary))
        }
    }
}

/// The families to run on this node (probes iptables and the kernel).
pub fn detect_families(
    cfg: &KubeProxyConfiguration,
    node: Option<&NodeInfo>,
) -> Result<Families, PrimaryFamilyUnsupported> {
    let primary = primary_family(cfg, node);
    let mode = cfg.proxy_mode();
    choose_families(cfg, primary, family_support(primary, mode), family_support(primary.other(), mode))
}

/// Whether the primary family is IPv4 for want of anything better: no
/// bind address and no Node address (upstream's detectNodeIPs then assumes
/// loopback node IPs).
pub fn primary_family_is_a_fallback(cfg: &KubeProxyConfiguration, node: Option<&NodeInfo>) -> bool {
    bind_ip(cfg).is_none() && node.is_none_or(|n| n.addresses.is_empty())
}

/// `bindAddress` unless unspecified (`0.0.0.0`, `::`).
fn bind_ip(cfg: &KubeProxyConfiguration) -> Option<std::net::IpAddr> {
    parse_ip_sloppy(&cfg.bind_address).filter(|ip| !ip.is_unspecified())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(node_port_addresses: &[&str]) -> KubeProxyConfiguration {
        KubeProxyConfiguration {
            node_port_addresses: node_port_addresses.iter().map(|s| s.to_string()).collect(),
            ..KubeProxyConfiguration::default()
        }
    }

    #[test]
    fn both_families_run_where_both_work_else_the_primary_alone() {
        let c = cfg(&[]);
        let ok = || Ok(());
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), ok()).unwrap(), Families::dual(IpFamily::V4));
        assert_eq!(choose_families(&c, IpFamily::V6, ok(), ok()).unwrap().secondary, Some(IpFamily::V4));
        let no_v6 = Err(FamilyUnsupported::Kernel("net.ipv6.conf.all.disable_ipv6 is 1".into()));
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), no_v6).unwrap(), Families::single(IpFamily::V4));
        let no_ipt = || Err(FamilyUnsupported::Iptables("ip6tables: not found".into()));
        assert_eq!(choose_families(&c, IpFamily::V4, ok(), no_ipt()).unwrap(), Families::single(IpFamily::V4));
        let err = choose_families(&c, IpFamily::V6, no_ipt(), ok()).unwrap_err().to_string();
        assert_eq!(err, "no support for primary IP family IPv6: no iptables support: ip6tables: not found");
    }

    #[test]
    fn ipv4_is_a_fallback_only_without_bind_address_and_node_addresses() {
        let node = |ips: &[&str]| NodeInfo {
            addresses: ips.iter().map(|i| i.parse().unwrap()).collect(),
            ..NodeInfo::default()
        };
        let mut c = cfg(&[]);
        assert!(primary_family_is_a_fallback(&c, None));
        assert!(primary_family_is_a_fallback(&c, Some(&node(&[]))));
        assert!(!primary_family_is_a_fallback(&c, Some(&node(&["fd00::5"]))));
        assert_eq!(primary_family(&c, Some(&node(&["fd00::5"]))), IpFamily::V6);
        c.bind_address = "0.0.0.0".into();
        assert!(primary_family_is_a_fallback(&c, None), "unspecified is no bind address");
        c.bind_address = "fd00::7".into();
        assert!(!primary_family_is_a_fallback(&c, None));
        assert_eq!(primary_family(&c, None), IpFamily::V6);
    }

    #[test]
    fn node_port_addresses_are_split_by_family() {
        let c = cfg(&["10.0.0.0/8", "fd00::/64"]);
        let cidrs = |f| match c.node_port_addresses_for(f) {
            NodePortAddresses::Cidrs(n) => n.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(cidrs(IpFamily::V4), ["10.0.0.0/8"]);
        assert_eq!(cidrs(IpFamily::V6), ["fd00::/64"]);
        // No CIDR of a family: every address of it (upstream's zero CIDR).
        let c = cfg(&["10.0.0.0/8"]);
        assert_eq!(c.node_port_addresses_for(IpFamily::V6), NodePortAddresses::All);
    }

    #[test]
    fn the_secondary_familys_headings_name_it() {
        let families = Families::dual(IpFamily::V4);
        assert_eq!(families.suffix(IpFamily::V4), "");
        assert_eq!(families.suffix(IpFamily::V6), " ipv6");
        assert_eq!(Families::dual(IpFamily::V6).suffix(IpFamily::V4), " ipv4");
    }
}
