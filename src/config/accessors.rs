//! Typed views of a validated configuration, for the daemon: the active
//! proxy mode and its sync periods, parsed CIDRs, the node name.
//! On an unvalidated configuration they fall back to defaults rather than
//! fail (bad CIDRs are skipped).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::defaults::DEFAULT_MASQUERADE_BIT;
use super::features::FeatureGates;
use super::netutil::{parse_cidr_sloppy, parse_ip_sloppy, split_host_port};
use super::types::KubeProxyConfiguration;
use super::ConfigError;
use crate::net::IpFamily;

/// The proxy backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// `iptables` (also `""`, the Linux default).
    Iptables,
    /// `ipvs`.
    Ipvs,
    /// `nftables`.
    Nftables,
}

impl ProxyMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }
}

impl fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which node IPs serve NodePorts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// All local IPs (nodePortAddresses empty, outside nftables mode).
    All,
    /// The Node object's primary IP(s) (`primary`; the nftables default).
    Primary,
    /// Local IPs inside these CIDRs.
    Cidrs(Vec<IpNet>),
}

/// How local (pod-originated) traffic is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalMode {
    /// Source IP inside clusterCIDR (also `""`).
    ClusterCidr,
    /// Source IP inside the Node's podCIDR(s).
    NodeCidr,
    /// Arrives from detectLocal.bridgeInterface.
    BridgeInterface,
    /// Arrives from an interface named detectLocal.interfaceNamePrefix*.
    InterfaceNamePrefix,
}

impl KubeProxyConfiguration {
    /// The proxy mode; `""` (and anything unvalidated) is iptables.
    pub fn proxy_mode(&self) -> ProxyMode {
        match self.mode.as_str() {
            "ipvs" => ProxyMode::Ipvs,
            "nftables" => ProxyMode::Nftables,
            _ => ProxyMode::Iptables,
        }
    }

    /// The active mode's syncPeriod (maximum interval between full syncs).
    pub fn sync_period(&self) -> Duration {
        match self.proxy_mode() {
            ProxyMode::Iptables => self.iptables.sync_period.get(),
            ProxyMode::Ipvs => self.ipvs.sync_period.get(),
            ProxyMode::Nftables => self.nftables.sync_period.get(),
        }
    }

    /// The active mode's minSyncPeriod (minimum interval between syncs).
    pub fn min_sync_period(&self) -> Duration {
        match self.proxy_mode() {
            ProxyMode::Iptables => self.iptables.min_sync_period.get(),
            ProxyMode::Ipvs => self.ipvs.min_sync_period.get(),
            ProxyMode::Nftables => self.nftables.min_sync_period.get(),
        }
    }

    /// masqueradeAll for the active mode (nftables has its own; iptables'
    /// serves ipvs too, as upstream's conversion does).
    pub fn masquerade_all(&self) -> bool {
        match self.proxy_mode() {
            ProxyMode::Nftables => self.nftables.masquerade_all,
            _ => self.iptables.masquerade_all,
        }
    }

    /// masqueradeBit for the active mode (iptables' serves ipvs too).
    pub fn masquerade_bit(&self) -> u32 {
        let bit = match self.proxy_mode() {
            ProxyMode::Nftables => self.nftables.masquerade_bit,
            _ => self.iptables.masquerade_bit,
        };
        u32::try_from(bit.unwrap_or(DEFAULT_MASQUERADE_BIT)).unwrap_or(14)
    }

    /// The clusterCIDR entries (comma separated in the file), parsed.
    pub fn cluster_cidrs(&self) -> Vec<IpNet> {
        self.cluster_cidr.split(',').filter_map(|c| parse_cidr_sloppy(c.trim())).collect()
    }

    /// nodePortAddresses: empty means all local IPs, except in nftables
    /// mode where it means the primary IPs (upstream's platform default).
    pub fn node_port_addresses(&self) -> NodePortAddresses {
        match self.node_port_addresses.as_slice() {
            [] if self.proxy_mode() == ProxyMode::Nftables => NodePortAddresses::Primary,
            [] => NodePortAddresses::All,
            [p] if p == "primary" => NodePortAddresses::Primary,
            list => NodePortAddresses::Cidrs(list.iter().filter_map(|c| parse_cidr_sloppy(c)).collect()),
        }
    }

    /// nodePortAddresses as one family's proxier sees them (upstream's
    /// NewNodePortAddresses): the CIDRs of that family; none of them means
    /// every address of the family.
    pub fn node_port_addresses_for(&self, family: IpFamily) -> NodePortAddresses {
        match self.node_port_addresses() {
            NodePortAddresses::Cidrs(nets) => {
                let ours: Vec<IpNet> = nets.into_iter().filter(|n| family.matches(&n.addr())).collect();
                if ours.is_empty() {
                    NodePortAddresses::All
                } else {
                    NodePortAddresses::Cidrs(ours)
                }
            }
            other => other,
        }
    }

    /// ipvs.excludeCIDRs, parsed.
    pub fn ipvs_exclude_cidrs(&self) -> Vec<IpNet> {
        self.ipvs.exclude_cidrs.iter().filter_map(|c| parse_cidr_sloppy(c)).collect()
    }

    /// The IPVS timeouts to set (TCP, TCP after FIN, UDP; whole seconds,
    /// 0 leaving the kernel's), as upstream's `ipvs.ConfigureTimeouts`;
    /// `None` when all three are 0.
    pub fn ipvs_timeouts(&self) -> Option<(u32, u32, u32)> {
        let secs = |d: &super::GoDuration| u32::try_from(d.get().as_secs()).unwrap_or(u32::MAX);
        let t = (secs(&self.ipvs.tcp_timeout), secs(&self.ipvs.tcp_fin_timeout), secs(&self.ipvs.udp_timeout));
        (t != (0, 0, 0)).then_some(t)
    }

    /// How long IPVS mode's virtual servers may drain when the node starts
    /// in another mode (`ipvs.switchDrainTimeout`); `None` (0): until their
    /// connections end.
    pub fn ipvs_switch_drain_timeout(&self) -> Option<std::time::Duration> {
        let t = self.ipvs.switch_drain_timeout;
        (!t.is_zero()).then(|| t.get())
    }

    /// The IPVS scheduler; `""` means `rr`.
    pub fn ipvs_scheduler(&self) -> &str {
        match self.ipvs.scheduler.as_str() {
            "" => "rr",
            s => s,
        }
    }

    /// detectLocalMode; `""` means ClusterCIDR.
    pub fn local_mode(&self) -> LocalMode {
        match self.detect_local_mode.as_str() {
            "NodeCIDR" => LocalMode::NodeCidr,
            "BridgeInterface" => LocalMode::BridgeInterface,
            "InterfaceNamePrefix" => LocalMode::InterfaceNamePrefix,
            _ => LocalMode::ClusterCidr,
        }
    }

    /// The health check server address; `None` when disabled (empty).
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        socket_addr(&self.healthz_bind_address)
    }

    /// The metrics server address; `None` when empty.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        socket_addr(&self.metrics_bind_address)
    }

    /// The feature gates `featureGates` sets, over every gate's default;
    /// all defaults when the map is refused (a validated configuration's
    /// never is).
    pub fn gates(&self) -> FeatureGates {
        FeatureGates::from_map(&self.feature_gates).map(|(g, _)| g).unwrap_or_default()
    }

    /// Log verbosity (`logging.verbosity`, `-v`).
    pub fn verbosity(&self) -> u32 {
        self.logging.verbosity
    }

    /// The node name: hostnameOverride if set, else the OS hostname;
    /// trimmed and lowercased (upstream's `nodeutil.GetHostname`).
    pub fn hostname(&self) -> Result<String, ConfigError> {
        node_hostname(&self.hostname_override, os_hostname)
    }
}

fn socket_addr(s: &str) -> Option<SocketAddr> {
    let (host, port) = split_host_port(s)?;
    Some(SocketAddr::new(parse_ip_sloppy(host)?, port.parse().ok()?))
}

/// `nodeutil.GetHostname` with the OS lookup injected.
fn node_hostname(hostname_override: &str, os: impl FnOnce() -> io::Result<String>) -> Result<String, ConfigError> {
    let name = if hostname_override.is_empty() {
        os().map_err(|source| ConfigError::Hostname { source })?
    } else {
        hostname_override.to_string()
    };
    let name = name.trim();
    if name.is_empty() {
        return Err(ConfigError::EmptyHostname);
    }
    Ok(name.to_lowercase())
}

/// The kernel's hostname (what Go's `os.Hostname` reads on Linux).
fn os_hostname() -> io::Result<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").or_else(|_| std::fs::read_to_string("/etc/hostname"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::duration::GoDuration;

    fn cfg(mode: &str) -> KubeProxyConfiguration {
        let mut c = KubeProxyConfiguration::with_defaults();
        c.mode = mode.to_string();
        c
    }

    #[test]
    fn proxy_mode_and_its_sync_periods() {
        assert_eq!(cfg("").proxy_mode(), ProxyMode::Iptables);
        assert_eq!(cfg("nftables").proxy_mode(), ProxyMode::Nftables);
        let mut c = cfg("ipvs");
        c.ipvs.sync_period = GoDuration::from_secs(7);
        assert_eq!(
            (c.proxy_mode(), c.sync_period(), c.min_sync_period()),
            (ProxyMode::Ipvs, Duration::from_secs(7), Duration::ZERO)
        );
        let c = cfg("iptables");
        assert_eq!((c.sync_period(), c.min_sync_period()), (Duration::from_secs(30), Duration::from_secs(1)));
    }

    #[test]
    fn masquerade_settings_follow_the_mode() {
        let mut c = cfg("nftables");
        c.nftables.masquerade_all = true;
        c.iptables.masquerade_bit = Some(3);
        assert!(c.masquerade_all());
        assert_eq!(c.masquerade_bit(), 14);
        c.mode = "ipvs".into();
        assert!(!c.masquerade_all());
        assert_eq!(c.masquerade_bit(), 3);
    }

    #[test]
    fn cidrs_and_node_port_addresses() {
        let mut c = cfg("ipvs");
        c.cluster_cidr = "10.0.0.0/8,fd00::/48".into();
        assert_eq!(c.cluster_cidrs().len(), 2);
        assert_eq!(c.node_port_addresses(), NodePortAddresses::All);
        assert_eq!(cfg("nftables").node_port_addresses(), NodePortAddresses::Primary);
        c.node_port_addresses = vec!["primary".into()];
        assert_eq!(c.node_port_addresses(), NodePortAddresses::Primary);
        c.node_port_addresses = vec!["10.1.0.0/16".into()];
        let want: IpNet = "10.1.0.0/16".parse().unwrap();
        assert_eq!(c.node_port_addresses(), NodePortAddresses::Cidrs(vec![want]));
    }

    #[test]
    fn scheduler_local_mode_and_listen_addresses() {
        let mut c = cfg("ipvs");
        assert_eq!(c.ipvs_scheduler(), "rr");
        c.ipvs.scheduler = "mh".into();
        assert_eq!(c.ipvs_scheduler(), "mh");
        assert_eq!(c.local_mode(), LocalMode::ClusterCidr);
        assert_eq!(c.metrics_addr(), "127.0.0.1:10249".parse().ok());
        c.healthz_bind_address.clear();
        assert_eq!(c.healthz_addr(), None);
        c.metrics_bind_address = "[::1]:9".into();
        assert_eq!(c.metrics_addr(), "[::1]:9".parse().ok());
    }

    #[test]
    fn ipvs_timeouts_are_whole_seconds_and_all_zero_sets_none() {
        let mut c = cfg("ipvs");
        assert_eq!(c.ipvs_timeouts(), None, "the defaults leave the kernel's");
        c.ipvs.tcp_timeout = GoDuration::from_secs(900);
        c.ipvs.udp_timeout = GoDuration(Duration::from_millis(300_500));
        assert_eq!(c.ipvs_timeouts(), Some((900, 0, 300)));
    }

    #[test]
    fn the_ipvs_switch_drain_timeout_limits_the_drain() {
        let mut c = cfg("nftables");
        assert_eq!(c.ipvs_switch_drain_timeout(), None, "by default: until the connections end");
        c.ipvs.switch_drain_timeout = GoDuration::from_secs(600);
        assert_eq!(c.ipvs_switch_drain_timeout(), Some(Duration::from_secs(600)));
    }

    #[test]
    fn hostname_is_trimmed_and_lowercased() {
        let os = || Ok::<_, io::Error>(" Node-A.Example\n".to_string());
        assert_eq!(node_hostname("", os).unwrap(), "node-a.example");
        assert_eq!(node_hostname("MyNode", os).unwrap(), "mynode");
        let blank = || Ok::<_, io::Error>("  \n".to_string());
        assert!(matches!(node_hostname("", blank), Err(ConfigError::EmptyHostname)));
        let fail = || Err(io::Error::other("boom"));
        let err = node_hostname("", fail).unwrap_err();
        assert!(err.to_string().contains("couldn't determine hostname"), "{err}");
        assert!(!cfg("").hostname().unwrap().is_empty());
    }
}
