//! The `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` type,
//! field for field as upstream's
//! `staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go` (with
//! `ClientConnectionConfiguration` from component-base and
//! `LoggingConfiguration` from component-base/logs/api/v1).
//!
//! Go pointer fields (`*int32`, `*bool`, `*metav1.Duration`) are `Option`s
//! here, because defaulting tells "unset" from "zero" for them. Every field
//! accepts YAML/JSON `null` as "unset", as Go's decoder does, so files
//! written by upstream's `--write-config-to` (`excludeCIDRs: null`) load.
//! Unknown fields are refused at every level.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::duration::GoDuration;

/// The only `apiVersion` accepted.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The only `kind` accepted.
pub const KIND: &str = "KubeProxyConfiguration";

/// Deserializes `null` as the type's default (Go's decoder leaves the field
/// at its zero value).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Everything needed to configure the proxy (upstream `KubeProxyConfiguration`).
///
/// `Default` is the Go zero value (nothing set); use
/// [`KubeProxyConfiguration::with_defaults`] for upstream's defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyConfiguration {
    /// Must be [`API_VERSION`].
    #[serde(default, deserialize_with = "nullable")]
    pub api_version: String,
    /// Must be [`KIND`].
    #[serde(default, deserialize_with = "nullable")]
    pub kind: String,
    /// Feature names to enabled/disabled.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    /// Kubeconfig file and API client settings.
    #[serde(default, deserialize_with = "nullable")]
    pub client_connection: ClientConnectionConfiguration,
    /// Logging options.
    #[serde(default, deserialize_with = "nullable")]
    pub logging: LoggingConfiguration,
    /// Node name to use instead of the OS hostname, if non-empty.
    #[serde(default, deserialize_with = "nullable")]
    pub hostname_override: String,
    /// Overrides the node's primary IP (no socket is bound to it).
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address: String,
    /// `IP:port` of the health check server; empty disables it.
    #[serde(default, deserialize_with = "nullable")]
    pub healthz_bind_address: String,
    /// `IP:port` of the metrics server.
    #[serde(default, deserialize_with = "nullable")]
    pub metrics_bind_address: String,
    /// Treat failure to bind a port as fatal.
    #[serde(default, deserialize_with = "nullable")]
    pub bind_address_hard_fail: bool,
    /// Serve /debug/pprof-style profiling on the metrics server.
    #[serde(default, deserialize_with = "nullable")]
    pub enable_profiling: bool,
    /// Previous version whose hidden metrics are shown.
    #[serde(default, deserialize_with = "nullable")]
    pub show_hidden_metrics_for_version: String,
    /// `""`, `iptables`, `ipvs` or `nftables`.
    #[serde(default, deserialize_with = "nullable")]
    pub mode: String,
    /// iptables mode settings.
    #[serde(default, deserialize_with = "nullable")]
    pub iptables: KubeProxyIPTablesConfiguration,
    /// ipvs mode settings.
    #[serde(default, deserialize_with = "nullable")]
    pub ipvs: KubeProxyIPVSConfiguration,
    /// nftables mode settings.
    #[serde(default, deserialize_with = "nullable")]
    pub nftables: KubeProxyNFTablesConfiguration,
    /// Windows settings (accepted, unused on Linux).
    #[serde(default, deserialize_with = "nullable")]
    pub winkernel: KubeProxyWinkernelConfiguration,
    /// `ClusterCIDR`, `NodeCIDR`, `BridgeInterface`, `InterfaceNamePrefix` or `""`.
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local_mode: String,
    /// Settings for the interface-based detect-local modes.
    #[serde(default, deserialize_with = "nullable")]
    pub detect_local: DetectLocalConfiguration,
    /// Pod CIDR(s), comma separated (at most one per IP family).
    #[serde(default, rename = "clusterCIDR", deserialize_with = "nullable")]
    pub cluster_cidr: String,
    /// CIDRs of node IPs that serve NodePorts, or `["primary"]`; empty = all.
    #[serde(default, deserialize_with = "nullable")]
    pub node_port_addresses: Vec<String>,
    /// oom_score_adj for the process, in [-1000, 1000].
    #[serde(default)]
    pub oom_score_adj: Option<i32>,
    /// conntrack sysctls.
    #[serde(default, deserialize_with = "nullable")]
    pub conntrack: KubeProxyConntrackConfiguration,
    /// How often configuration from the API server is refreshed.
    #[serde(default, deserialize_with = "nullable")]
    pub config_sync_period: GoDuration,
    /// Unused (was for the userspace proxy); must still parse as a port range.
    #[serde(default, deserialize_with = "nullable")]
    pub port_range: String,
    /// Windows service integration (accepted, unused on Linux).
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "is_false")]
    pub windows_run_as_service: bool,
}

/// API client settings (component-base `ClientConnectionConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConnectionConfiguration {
    /// Path to a kubeconfig file.
    #[serde(default, deserialize_with = "nullable")]
    pub kubeconfig: String,
    /// Accept header sent to the API server.
    #[serde(default, deserialize_with = "nullable")]
    pub accept_content_types: String,
    /// Content type of requests sent to the API server.
    #[serde(default, deserialize_with = "nullable")]
    pub content_type: String,
    /// Client queries per second.
    #[serde(default, deserialize_with = "nullable", serialize_with = "ser_float")]
    pub qps: f32,
    /// Extra queries allowed in a burst.
    #[serde(default, deserialize_with = "nullable")]
    pub burst: i32,
}

/// Writes whole floats as integers (`qps: 5`), as Go's encoder does.
fn ser_float<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f32(*v)
    }
}

/// iptables mode settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyIPTablesConfiguration {
    /// fwmark bit marking packets for SNAT (iptables and ipvs modes), 0..=31.
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    /// Allow NodePorts on localhost (IPv4, iptables mode only).
    #[serde(default)]
    pub localhost_node_ports: Option<bool>,
    /// Maximum interval between full resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
}

/// ipvs mode settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyIPVSConfiguration {
    /// Maximum interval between full resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    /// IPVS scheduler; `""` means `rr`.
    #[serde(default, deserialize_with = "nullable")]
    pub scheduler: String,
    /// CIDRs whose IPVS services cleanup must not touch.
    #[serde(default, rename = "excludeCIDRs", deserialize_with = "nullable")]
    pub exclude_cidrs: Vec<String>,
    /// Set arp_ignore=1 / arp_announce=2.
    #[serde(default, rename = "strictARP", deserialize_with = "nullable")]
    pub strict_arp: bool,
    /// Idle TCP session timeout; 0 leaves the kernel's value.
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_timeout: GoDuration,
    /// TCP-after-FIN timeout; 0 leaves the kernel's value.
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_fin_timeout: GoDuration,
    /// UDP timeout; 0 leaves the kernel's value.
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
    /// kube-proxy-rs only: a start in another mode leaves IPVS mode's
    /// virtual servers with connections draining at most this long; 0 (the
    /// default) waits until their connections end, as graceful termination
    /// waits for a real server's. Left out of a written config when 0.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "GoDuration::is_zero_ref")]
    pub switch_drain_timeout: GoDuration,
}

/// nftables mode settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyNFTablesConfiguration {
    /// fwmark bit marking packets for SNAT, 0..=31.
    #[serde(default)]
    pub masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[serde(default, deserialize_with = "nullable")]
    pub masquerade_all: bool,
    /// Maximum interval between full resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub sync_period: GoDuration,
    /// Minimum interval between resyncs.
    #[serde(default, deserialize_with = "nullable")]
    pub min_sync_period: GoDuration,
    /// kube-proxy-rs only: the ruleset written, `upstream` (`""`, the
    /// default) or `maps`. Left out of a written config when empty.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "String::is_empty")]
    pub ruleset: String,
}

/// Windows/HNS settings; parsed for compatibility, unused on Linux.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyWinkernelConfiguration {
    /// HNS network name.
    #[serde(default, deserialize_with = "nullable")]
    pub network_name: String,
    /// Source VIP for NAT.
    #[serde(default, deserialize_with = "nullable")]
    pub source_vip: String,
    /// Create HNS policies with DSR.
    #[serde(default, rename = "enableDSR", deserialize_with = "nullable")]
    pub enable_dsr: bool,
    /// Root HNS endpoint name.
    #[serde(default, deserialize_with = "nullable")]
    pub root_hns_endpoint_name: String,
    /// Forward the service VIP for health check ports.
    #[serde(default, deserialize_with = "nullable")]
    pub forward_health_check_vip: bool,
}

/// Settings for the interface-based detect-local modes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DetectLocalConfiguration {
    /// Bridge whose traffic is local (`BridgeInterface` mode).
    #[serde(default, deserialize_with = "nullable")]
    pub bridge_interface: String,
    /// Interface name prefix whose traffic is local (`InterfaceNamePrefix` mode).
    #[serde(default, deserialize_with = "nullable")]
    pub interface_name_prefix: String,
}

/// conntrack settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeProxyConntrackConfiguration {
    /// Max NAT connections per CPU core (0 leaves the limit and ignores `min`).
    #[serde(default)]
    pub max_per_core: Option<i32>,
    /// Minimum conntrack table size.
    #[serde(default)]
    pub min: Option<i32>,
    /// Idle timeout of established TCP connections (0 leaves as-is).
    #[serde(default)]
    pub tcp_established_timeout: Option<GoDuration>,
    /// Timeout of TCP connections in CLOSE_WAIT (0 leaves as-is).
    #[serde(default)]
    pub tcp_close_wait_timeout: Option<GoDuration>,
    /// Set nf_conntrack_tcp_be_liberal=1.
    #[serde(default, deserialize_with = "nullable")]
    pub tcp_be_liberal: bool,
    /// Idle timeout of UNREPLIED UDP entries (0 leaves as-is).
    #[serde(default, deserialize_with = "nullable")]
    pub udp_timeout: GoDuration,
    /// Idle timeout of ASSURED UDP entries (0 leaves as-is).
    #[serde(default, deserialize_with = "nullable")]
    pub udp_stream_timeout: GoDuration,
}

/// Logging options (component-base `LoggingConfiguration`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoggingConfiguration {
    /// `text` or `json`.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "String::is_empty")]
    pub format: String,
    /// Maximum time between log flushes.
    #[serde(default, deserialize_with = "nullable")]
    pub flush_frequency: FlushFrequency,
    /// Log verbosity (`-v`).
    #[serde(default, deserialize_with = "nullable")]
    pub verbosity: u32,
    /// Per-file verbosity overrides (text format only).
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub vmodule: Vec<VModuleItem>,
    /// Per-format options.
    #[serde(default, deserialize_with = "nullable")]
    pub options: FormatOptions,
}

/// One `vmodule` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VModuleItem {
    /// File name or glob, without `=` or `,`.
    #[serde(default, deserialize_with = "nullable")]
    pub file_pattern: String,
    /// Verbosity for matching files.
    #[serde(default, deserialize_with = "nullable")]
    pub verbosity: u32,
}

/// Options per log format.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatOptions {
    /// Options of the `text` format.
    #[serde(default, deserialize_with = "nullable")]
    pub text: OutputRoutingOptions,
    /// Options of the `json` format.
    #[serde(default, deserialize_with = "nullable")]
    pub json: OutputRoutingOptions,
}

/// Output routing shared by the `text` and `json` formats.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputRoutingOptions {
    /// Errors to stderr, info to stdout (alpha; needs LoggingAlphaOptions).
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "is_false")]
    pub split_stream: bool,
    /// Info stream buffer size, a Kubernetes quantity such as `"0"` or `"5Mi"`.
    #[serde(default, deserialize_with = "nullable", skip_serializing_if = "Quantity::is_empty")]
    pub info_buffer_size: Quantity,
}

/// A Kubernetes resource quantity kept as text (`"0"`, `"512"`, `"5Mi"`);
/// accepts a YAML/JSON number too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Quantity(pub String);

impl Quantity {
    /// True when unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True for unset or a zero amount (`"0"`, `"0Mi"`, `"0.0"`).
    pub fn is_zero(&self) -> bool {
        let digits = self.0.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        digits.is_empty() || digits.parse::<f64>().map(|v| v == 0.0).unwrap_or(false)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl serde::de::Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a quantity such as \"0\" or \"5Mi\"")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
        Ok(Quantity(v.to_string()))
    }
}

/// `flushFrequency`: a Go duration string, or (legacy) an integer number of
/// nanoseconds. It is written back in the form it was read in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushFrequency {
    /// The interval.
    pub duration: GoDuration,
    /// Write as a duration string (true) or as integer nanoseconds (false).
    pub as_string: bool,
}

impl Serialize for FlushFrequency {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.as_string {
            self.duration.serialize(s)
        } else {
            let nanos = u64::try_from(self.duration.get().as_nanos()).unwrap_or(u64::MAX);
            s.serialize_u64(nanos)
        }
    }
}

impl<'de> Deserialize<'de> for FlushFrequency {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FlushFrequencyVisitor)
    }
}

struct FlushFrequencyVisitor;

impl serde::de::Visitor<'_> for FlushFrequencyVisitor {
    type Value = FlushFrequency;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a Go duration string such as \"5s\" or a number of nanoseconds")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<FlushFrequency, E> {
        Ok(FlushFrequency { duration: v.parse().map_err(E::custom)?, as_string: true })
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<FlushFrequency, E> {
        Ok(FlushFrequency { duration: GoDuration(std::time::Duration::from_nanos(v)), as_string: false })
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<FlushFrequency, E> {
        let nanos = u64::try_from(v)
            .map_err(|_| E::custom(format!("invalid duration {v}: negative durations are not allowed")))?;
        self.visit_u64(nanos)
    }
}
