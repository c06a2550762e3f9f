//! Upstream's defaulting, in two steps as upstream does it:
//!
//! - `set_defaults`: `SetDefaults_KubeProxyConfiguration`
//!   (`pkg/proxy/apis/config/v1alpha1/defaults.go`) plus component-base's
//!   `SetRecommendedLoggingConfiguration`. Applied to a parsed file, and to
//!   the empty configuration that flags start from.
//! - `apply_platform_defaults`: the Linux
//!   `platformApplyDefaults` (`cmd/kube-proxy/app/server_linux.go`), run
//!   after flags and file are merged.
//!
//! As upstream, a zero duration / zero number / empty string in a
//! non-pointer field means "unset": `iptables.minSyncPeriod: 0s` in a file
//! becomes 1s. Pointer fields (`Option` here) keep an explicit zero.

use std::net::IpAddr;
use std::time::Duration;

use super::duration::GoDuration;
use super::netutil::{append_port_if_needed, parse_ip_sloppy};
use super::types::{KubeProxyConfiguration, LoggingConfiguration, OutputRoutingOptions, Quantity};

/// Default healthz port (`ports.ProxyHealthzPort`).
pub const PROXY_HEALTHZ_PORT: u16 = 10256;
/// Default metrics port (`ports.ProxyStatusPort`).
pub const PROXY_STATUS_PORT: u16 = 10249;
/// Default oom_score_adj (`qos.KubeProxyOOMScoreAdj`).
pub const KUBE_PROXY_OOM_SCORE_ADJ: i32 = -999;
/// Default fwmark bit for SNAT.
pub const DEFAULT_MASQUERADE_BIT: i32 = 14;
/// Default API content type.
pub const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const SEC: Duration = Duration::from_secs(1);
const HOUR: Duration = Duration::from_secs(3600);

/// Sets `d` to `value` when it is zero.
fn default_duration(d: &mut GoDuration, value: Duration) {
    if d.is_zero() {
        *d = GoDuration(value);
    }
}

impl KubeProxyConfiguration {
    /// The configuration upstream starts from: the zero value with
    /// apiVersion/kind set and [`set_defaults`](Self::set_defaults) applied.
    pub fn with_defaults() -> Self {
        let mut cfg = KubeProxyConfiguration {
            api_version: super::types::API_VERSION.to_string(),
            kind: super::types::KIND.to_string(),
            ..Default::default()
        };
        cfg.set_defaults();
        cfg
    }

    /// Fills unset fields with upstream's defaults
    /// (`SetDefaults_KubeProxyConfiguration`).
    pub fn set_defaults(&mut self) {
        self.default_addresses();
        self.oom_score_adj.get_or_insert(KUBE_PROXY_OOM_SCORE_ADJ);
        self.default_iptables_ipvs_nftables();
        self.default_conntrack();
        default_duration(&mut self.config_sync_period, 15 * 60 * SEC);
        self.default_client_connection();
        default_logging(&mut self.logging);
    }

    fn default_addresses(&mut self) {
        if self.bind_address.is_empty() {
            self.bind_address = "0.0.0.0".to_string();
        }
        let (healthz_host, metrics_host) = default_hosts(&self.bind_address);
        self.healthz_bind_address = match self.healthz_bind_address.as_str() {
            "" => format!("{healthz_host}:{PROXY_HEALTHZ_PORT}"),
            addr => append_port_if_needed(addr, PROXY_HEALTHZ_PORT),
        };
        self.metrics_bind_address = match self.metrics_bind_address.as_str() {
            "" => format!("{metrics_host}:{PROXY_STATUS_PORT}"),
            addr => append_port_if_needed(addr, PROXY_STATUS_PORT),
        };
    }

    fn default_iptables_ipvs_nftables(&mut self) {
        let ipt = &mut self.iptables;
        default_duration(&mut ipt.sync_period, 30 * SEC);
        default_duration(&mut ipt.min_sync_period, SEC);
        ipt.localhost_node_ports.get_or_insert(true);
        ipt.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);
        // ipvs.minSyncPeriod has no default: 0 means "sync on every change".
        default_duration(&mut self.ipvs.sync_period, 30 * SEC);
        let nft = &mut self.nftables;
        default_duration(&mut nft.sync_period, 30 * SEC);
        default_duration(&mut nft.min_sync_period, SEC);
        nft.masquerade_bit.get_or_insert(DEFAULT_MASQUERADE_BIT);
    }

    fn default_conntrack(&mut self) {
        let ct = &mut self.conntrack;
        ct.max_per_core.get_or_insert(32 * 1024);
        ct.min.get_or_insert(128 * 1024);
        ct.tcp_established_timeout.get_or_insert(GoDuration(24 * HOUR));
        ct.tcp_close_wait_timeout.get_or_insert(GoDuration(HOUR));
    }

    fn default_client_connection(&mut self) {
        let cc = &mut self.client_connection;
        if cc.content_type.is_empty() {
            cc.content_type = DEFAULT_CONTENT_TYPE.to_string();
        }
        if cc.qps == 0.0 {
            cc.qps = 5.0;
        }
        if cc.burst == 0 {
            cc.burst = 10;
        }
    }

    /// Linux `platformApplyDefaults`: mode `""` becomes `iptables`; nftables
    /// mode with no nodePortAddresses serves NodePorts on the primary IPs
    /// only; detectLocalMode `""` becomes `ClusterCIDR`.
    pub fn apply_platform_defaults(&mut self) {
        if self.mode.is_empty() {
            self.mode = "iptables".to_string();
        }
        if self.mode == "nftables" && self.node_port_addresses.is_empty() {
            self.node_port_addresses = vec!["primary".to_string()];
        }
        if self.detect_local_mode.is_empty() {
            self.detect_local_mode = "ClusterCIDR".to_string();
        }
    }
}

/// Default healthz and metrics hosts for a bind address: IPv4 ones unless
/// the bind address is not an IPv4 (or IPv4-mapped) address.
fn default_hosts(bind_address: &str) -> (&'static str, &'static str) {
    match parse_ip_sloppy(bind_address) {
        Some(IpAddr::V4(_)) => ("0.0.0.0", "127.0.0.1"),
        Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_some() => ("0.0.0.0", "127.0.0.1"),
        _ => ("[::]", "[::1]"),
    }
}

/// component-base `SetRecommendedLoggingConfiguration`.
fn default_logging(logging: &mut LoggingConfiguration) {
    if logging.format.is_empty() {
        logging.format = "text".to_string();
    }
    if logging.flush_frequency.duration.is_zero() {
        logging.flush_frequency.duration = GoDuration(5 * SEC);
        logging.flush_frequency.as_string = true;
    }
    default_output_routing(&mut logging.options.text);
    default_output_routing(&mut logging.options.json);
}

fn default_output_routing(o: &mut OutputRoutingOptions) {
    if o.info_buffer_size.is_empty() {
        o.info_buffer_size = Quantity("0".to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's defaulted v1alpha1 object, as in
    /// pkg/proxy/apis/config/scheme/testdata/KubeProxyConfiguration/after/v1alpha1.yaml.
    const UPSTREAM_DEFAULTS: &str = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 10
  contentType: application/vnd.kubernetes.protobuf
  kubeconfig: ""
  qps: 5
clusterCIDR: ""
configSyncPeriod: 15m0s
conntrack:
  maxPerCore: 32768
  min: 131072
  tcpBeLiberal: false
  tcpCloseWaitTimeout: 1h0m0s
  tcpEstablishedTimeout: 24h0m0s
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: 0.0.0.0:10256
hostnameOverride: ""
iptables:
  localhostNodePorts: true
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 5s
  format: text
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 127.0.0.1:10249
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
nodePortAddresses: null
oomScoreAdj: -999
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"#;

    #[test]
    fn defaults_match_upstream_defaulted_object() {
        let upstream: KubeProxyConfiguration = yaml_serde::from_str(UPSTREAM_DEFAULTS).unwrap();
        assert_eq!(KubeProxyConfiguration::with_defaults(), upstream);
    }

    #[test]
    fn defaults_spot_checks() {
        let c = KubeProxyConfiguration::with_defaults();
        assert_eq!(c.metrics_bind_address, "127.0.0.1:10249");
        assert_eq!(c.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(c.iptables.sync_period.get(), 30 * SEC);
        assert_eq!(c.ipvs.min_sync_period, GoDuration::ZERO);
        assert_eq!(c.ipvs.scheduler, "");
        assert_eq!(c.oom_score_adj, Some(-999));
        assert!(c.feature_gates.is_empty());
    }

    #[test]
    fn ipv6_bind_address_gives_ipv6_listen_defaults() {
        let mut c = KubeProxyConfiguration { bind_address: "fd00::1".into(), ..Default::default() };
        c.set_defaults();
        assert_eq!(c.healthz_bind_address, "[::]:10256");
        assert_eq!(c.metrics_bind_address, "[::1]:10249");
    }

    #[test]
    fn bare_listen_ips_get_default_ports() {
        let mut c = KubeProxyConfiguration {
            healthz_bind_address: "10.0.0.1".into(),
            metrics_bind_address: "::".into(),
            ..Default::default()
        };
        c.set_defaults();
        assert_eq!(c.healthz_bind_address, "10.0.0.1:10256");
        assert_eq!(c.metrics_bind_address, "[::]:10249");
    }

    #[test]
    fn explicit_zero_pointer_fields_are_kept_but_zero_periods_are_defaulted() {
        let mut c = KubeProxyConfiguration::default();
        c.conntrack.max_per_core = Some(0);
        c.conntrack.tcp_established_timeout = Some(GoDuration::ZERO);
        c.iptables.masquerade_bit = Some(0);
        c.set_defaults();
        assert_eq!(c.conntrack.max_per_core, Some(0));
        assert_eq!(c.conntrack.tcp_established_timeout, Some(GoDuration::ZERO));
        assert_eq!(c.iptables.masquerade_bit, Some(0));
        assert_eq!(c.iptables.min_sync_period.get(), SEC);
    }

    #[test]
    fn platform_defaults_fill_mode_detect_local_and_nftables_nodeports() {
        let mut c = KubeProxyConfiguration::with_defaults();
        c.apply_platform_defaults();
        assert_eq!((c.mode.as_str(), c.detect_local_mode.as_str()), ("iptables", "ClusterCIDR"));
        assert!(c.node_port_addresses.is_empty());
        let mut c = KubeProxyConfiguration { mode: "nftables".into(), ..Default::default() };
        c.apply_platform_defaults();
        assert_eq!(c.node_port_addresses, vec!["primary".to_string()]);
    }
}
