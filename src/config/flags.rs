//! Command-line flags, named and parsed as upstream kube-proxy's pflag
//! flags (`cmd/kube-proxy/app/options.go`, `AddFlags`, plus component-base
//! logging flags): `--flag=value` and `--flag value`; booleans as `--flag`
//! or `--flag=true|false` (Go's `strconv.ParseBool` spellings); integers
//! in Go's base-prefixed forms; durations in Go form; lists comma
//! separated, repeated flags appending.
//!
//! Flags bound to configuration fields are `Option`s / empty `Vec`s when
//! not given, so only flags given on the command line override anything.
//! How they combine with `--config` is described on [`super::load`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser};

use super::defaults::{PROXY_HEALTHZ_PORT, PROXY_STATUS_PORT};
use super::duration::GoDuration;
use super::netutil::{append_port_if_needed, parse_ip_sloppy, split_host_port};
use super::types::{KubeProxyConfiguration, LoggingConfiguration, Quantity, VModuleItem};
use super::ConfigError;

/// kube-proxy-rs command-line flags.
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "kube-proxy-rs",
    version,
    about = "Kubernetes network proxy: programs Services into IPVS, iptables or nftables on this node"
)]
pub struct Flags {
    /// Path to a KubeProxyConfiguration file (YAML or JSON). When given, the
    /// file replaces the flags, except logging flags and --hostname-override.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Write the effective configuration to this file and exit.
    #[arg(long = "write-config-to", value_name = "PATH")]
    pub write_config_to: Option<PathBuf>,
    /// Remove the rules this proxy installs, then exit.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_bool)]
    pub cleanup: bool,
    /// Do the privileged initialisation steps, then exit.
    #[arg(long = "init-only", value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_bool)]
    pub init_only: bool,
    /// API server address (overrides the kubeconfig's).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
    /// Read Services/EndpointSlices/Node from YAML files in this directory
    /// instead of the API server (kube-proxy-rs only).
    #[arg(long, value_name = "DIR")]
    pub manifests: Option<PathBuf>,
    /// Print the kernel state that would be programmed, then exit
    /// (kube-proxy-rs only).
    #[arg(long = "dry-run", value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_bool)]
    pub dry_run: bool,
    /// With `--dry-run`: read this node's kernel state (read-only) and print
    /// what the first sync would change, as `+`/`-` lines per section, and
    /// a summary (kube-proxy-rs only).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set, num_args = 0..=1,
          require_equals = true, default_value = "false", default_missing_value = "true",
          value_parser = parse_bool)]
    pub diff: bool,

    /// Feature gates, `Name=true|false` pairs, comma separated.
    #[arg(long = "feature-gates", value_name = "NAME=BOOL,...", value_parser = parse_feature_gates)]
    pub feature_gates: Vec<FeatureGateList>,
    /// Path to a kubeconfig file.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<String>,
    /// Content type of requests to the API server.
    #[arg(long = "kube-api-content-type", value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// API client burst.
    #[arg(long = "kube-api-burst", value_name = "N", allow_hyphen_values = true, value_parser = parse_i32)]
    pub kube_api_burst: Option<i32>,
    /// API client queries per second.
    #[arg(long = "kube-api-qps", value_name = "QPS", allow_hyphen_values = true)]
    pub kube_api_qps: Option<f32>,
    /// Node name to use instead of the hostname.
    #[arg(long = "hostname-override", value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Overrides the node's primary IP.
    #[arg(long = "bind-address", value_name = "IP", value_parser = parse_ip_flag)]
    pub bind_address: Option<String>,
    /// `IP[:port]` of the health check server (empty disables it).
    #[arg(long = "healthz-bind-address", value_name = "IP:PORT", value_parser = parse_ip_port_flag)]
    pub healthz_bind_address: Option<String>,
    /// `IP[:port]` of the metrics server.
    #[arg(long = "metrics-bind-address", value_name = "IP:PORT", value_parser = parse_ip_port_flag)]
    pub metrics_bind_address: Option<String>,
    /// Deprecated: health check port (0 disables).
    #[arg(long = "healthz-port", hide = true, allow_hyphen_values = true, value_parser = parse_i32)]
    pub healthz_port: Option<i32>,
    /// Deprecated: metrics port (0 disables).
    #[arg(long = "metrics-port", hide = true, allow_hyphen_values = true, value_parser = parse_i32)]
    pub metrics_port: Option<i32>,
    /// Exit if a port cannot be bound.
    #[arg(long = "bind-address-hard-fail", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub bind_address_hard_fail: Option<bool>,
    /// Enable profiling handlers on the metrics server.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub profiling: Option<bool>,
    /// Previous version whose hidden metrics are shown (`X.Y`).
    #[arg(long = "show-hidden-metrics-for-version", value_name = "X.Y")]
    pub show_hidden_metrics_for_version: Option<String>,
    /// Proxy mode: iptables (default), ipvs or nftables.
    #[arg(long = "proxy-mode", value_name = "MODE")]
    pub proxy_mode: Option<String>,
    /// nftables mode's ruleset: upstream (default) or maps (kube-proxy-rs only).
    #[arg(long = "nftables-ruleset", value_name = "RULESET")]
    pub nftables_ruleset: Option<String>,

    /// fwmark bit for SNAT, 0..=31.
    #[arg(long = "iptables-masquerade-bit", value_name = "BIT", allow_hyphen_values = true, value_parser = parse_i32)]
    pub iptables_masquerade_bit: Option<i32>,
    /// SNAT all traffic sent to Service cluster IPs.
    #[arg(long = "masquerade-all", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub masquerade_all: Option<bool>,
    /// Allow NodePorts on localhost (iptables mode, IPv4).
    #[arg(long = "iptables-localhost-nodeports", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub iptables_localhost_nodeports: Option<bool>,
    /// Full resync interval (iptables/nftables modes).
    #[arg(long = "iptables-sync-period", value_name = "DURATION")]
    pub iptables_sync_period: Option<GoDuration>,
    /// Minimum interval between resyncs (iptables/nftables modes).
    #[arg(long = "iptables-min-sync-period", value_name = "DURATION")]
    pub iptables_min_sync_period: Option<GoDuration>,
    /// Full resync interval (ipvs mode).
    #[arg(long = "ipvs-sync-period", value_name = "DURATION")]
    pub ipvs_sync_period: Option<GoDuration>,
    /// Minimum interval between resyncs (ipvs mode).
    #[arg(long = "ipvs-min-sync-period", value_name = "DURATION")]
    pub ipvs_min_sync_period: Option<GoDuration>,
    /// IPVS scheduler (default rr).
    #[arg(long = "ipvs-scheduler", value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,
    /// CIDRs that IPVS cleanup must not touch, comma separated.
    #[arg(long = "ipvs-exclude-cidrs", value_name = "CIDR,...", value_parser = parse_list)]
    pub ipvs_exclude_cidrs: Vec<CommaList>,
    /// Set arp_ignore=1 and arp_announce=2.
    #[arg(long = "ipvs-strict-arp", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub ipvs_strict_arp: Option<bool>,
    /// Idle IPVS TCP timeout (0 leaves as-is).
    #[arg(long = "ipvs-tcp-timeout", value_name = "DURATION")]
    pub ipvs_tcp_timeout: Option<GoDuration>,
    /// IPVS TCP-after-FIN timeout (0 leaves as-is).
    #[arg(long = "ipvs-tcpfin-timeout", value_name = "DURATION")]
    pub ipvs_tcpfin_timeout: Option<GoDuration>,
    /// IPVS UDP timeout (0 leaves as-is).
    #[arg(long = "ipvs-udp-timeout", value_name = "DURATION")]
    pub ipvs_udp_timeout: Option<GoDuration>,
    /// Leaving IPVS mode: how long its virtual servers may drain (0: until
    /// their connections end; kube-proxy-rs only).
    #[arg(long = "ipvs-switch-drain-timeout", value_name = "DURATION")]
    pub ipvs_switch_drain_timeout: Option<GoDuration>,

    /// How to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix.
    #[arg(long = "detect-local-mode", value_name = "MODE")]
    pub detect_local_mode: Option<String>,
    /// Bridge for BridgeInterface mode.
    #[arg(long = "pod-bridge-interface", value_name = "NAME")]
    pub pod_bridge_interface: Option<String>,
    /// Interface prefix for InterfaceNamePrefix mode.
    #[arg(long = "pod-interface-name-prefix", value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,
    /// Pod CIDR(s), comma separated (one per IP family).
    #[arg(long = "cluster-cidr", value_name = "CIDR[,CIDR]")]
    pub cluster_cidr: Option<String>,
    /// CIDRs of node IPs serving NodePorts, or `primary`; comma separated.
    #[arg(long = "nodeport-addresses", value_name = "CIDR,...", value_parser = parse_list)]
    pub nodeport_addresses: Vec<CommaList>,
    /// oom_score_adj of this process, in [-1000, 1000].
    #[arg(long = "oom-score-adj", value_name = "N", allow_hyphen_values = true, value_parser = parse_i32)]
    pub oom_score_adj: Option<i32>,

    /// Conntrack entries per CPU core (0 leaves the limit as-is).
    #[arg(long = "conntrack-max-per-core", value_name = "N", allow_hyphen_values = true, value_parser = parse_i32)]
    pub conntrack_max_per_core: Option<i32>,
    /// Minimum conntrack table size.
    #[arg(long = "conntrack-min", value_name = "N", allow_hyphen_values = true, value_parser = parse_i32)]
    pub conntrack_min: Option<i32>,
    /// Idle timeout of established TCP connections (0 leaves as-is).
    #[arg(long = "conntrack-tcp-timeout-established", value_name = "DURATION")]
    pub conntrack_tcp_timeout_established: Option<GoDuration>,
    /// Timeout of TCP connections in CLOSE_WAIT.
    #[arg(long = "conntrack-tcp-timeout-close-wait", value_name = "DURATION")]
    pub conntrack_tcp_timeout_close_wait: Option<GoDuration>,
    /// Set nf_conntrack_tcp_be_liberal=1.
    #[arg(long = "conntrack-tcp-be-liberal", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// Idle timeout of UNREPLIED UDP entries (0 leaves as-is).
    #[arg(long = "conntrack-udp-timeout", value_name = "DURATION")]
    pub conntrack_udp_timeout: Option<GoDuration>,
    /// Idle timeout of ASSURED UDP entries (0 leaves as-is).
    #[arg(long = "conntrack-udp-timeout-stream", value_name = "DURATION")]
    pub conntrack_udp_timeout_stream: Option<GoDuration>,
    /// How often configuration from the API server is refreshed.
    #[arg(long = "config-sync-period", value_name = "DURATION")]
    pub config_sync_period: Option<GoDuration>,

    /// Log format: text or json.
    #[arg(long = "logging-format", value_name = "FORMAT")]
    pub logging_format: Option<String>,
    /// Maximum time between log flushes.
    #[arg(long = "log-flush-frequency", value_name = "DURATION")]
    pub log_flush_frequency: Option<GoDuration>,
    /// Log verbosity.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", value_parser = parse_verbosity)]
    pub v: Option<u32>,
    /// Per-file verbosity, `pattern=N` pairs, comma separated.
    #[arg(long, value_name = "PATTERN=N,...", value_parser = parse_vmodule)]
    pub vmodule: Vec<VModuleList>,
    /// Text format: info lines to stdout, errors to stderr (alpha).
    #[arg(long = "log-text-split-stream", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub log_text_split_stream: Option<bool>,
    /// Text format: size of the info stream's buffer, a quantity (alpha).
    #[arg(long = "log-text-info-buffer-size", value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
    /// JSON format: info lines to stdout, errors to stderr (beta).
    #[arg(long = "log-json-split-stream", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_bool)]
    pub log_json_split_stream: Option<bool>,
    /// JSON format: size of the info stream's buffer, a quantity (beta).
    #[arg(long = "log-json-info-buffer-size", value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,

    /// Long names of the flags given on the command line.
    #[arg(skip)]
    given: Vec<String>,
    /// The values of the flags given, as typed (repeated ones joined by `,`).
    #[arg(skip)]
    given_values: BTreeMap<String, String>,
}

/// A comma-separated flag value, split (pflag `StringSlice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommaList(pub Vec<String>);

impl CommaList {
    /// All items of repeated flags, in order.
    pub fn join(lists: &[CommaList]) -> Vec<String> {
        lists.iter().flat_map(|l| l.0.iter().cloned()).collect()
    }
}

/// One `--feature-gates` value: `(name, enabled)` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGateList(pub Vec<(String, bool)>);

/// One `--vmodule` value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VModuleList(pub Vec<VModuleItem>);

/// Why a flag's value was refused; clap prints it after the flag's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagValueError {
    #[error("{0:?} is not a boolean (true or false)")]
    NotBool(String),
    #[error("{0:?} is not a 32-bit integer")]
    NotI32(String),
    #[error("{0:?} is not a verbosity level (0..2147483647)")]
    NotVerbosity(String),
    #[error("missing bool value for {0}")]
    GateWithoutValue(String),
    #[error("invalid value of {pair}: {source}")]
    GateValue {
        pair: String,
        #[source]
        source: Box<FlagValueError>,
    },
    #[error("{0:?} is not a valid IP address")]
    NotIp(String),
    #[error("{0:?} is not in a valid format (ip or ip:port)")]
    NotIpPort(String),
    #[error("{0:?} is not a valid port number")]
    NotPort(String),
    #[error("{0:?} does not have the pattern=N format")]
    NotVModule(String),
    #[error("parsing verbosity in {0:?}: invalid level")]
    VModuleLevel(String),
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Result<bool, FlagValueError> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(FlagValueError::NotBool(s.to_string())),
    }
}

/// Go's `strconv.ParseInt(s, 0, 32)`: optional sign, `0x`/`0o`/`0b`/`0` prefixes.
fn parse_i32(s: &str) -> Result<i32, FlagValueError> {
    let err = || FlagValueError::NotI32(s.to_string());
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body) = match lower.as_bytes() {
        [b'0', b'x', ..] => (16, &lower[2..]),
        [b'0', b'o', ..] => (8, &lower[2..]),
        [b'0', b'b', ..] => (2, &lower[2..]),
        [b'0', _, ..] => (8, &lower[1..]),
        _ => (10, lower.as_str()),
    };
    if body.is_empty() || body.starts_with(['+', '-']) {
        return Err(err());
    }
    let magnitude = i64::from_str_radix(body, radix).ok().ok_or_else(err)?;
    i32::try_from(if neg { -magnitude } else { magnitude }).ok().ok_or_else(err)
}

/// klog's verbosity: `strconv.ParseUint(s, 0, 31)`.
fn parse_verbosity(s: &str) -> Result<u32, FlagValueError> {
    match parse_i32(s) {
        Ok(v) if v >= 0 && !s.starts_with(['-', '+']) => Ok(v as u32),
        _ => Err(FlagValueError::NotVerbosity(s.to_string())),
    }
}

/// cliflag `MapStringBool`: `Name=bool` pairs, comma separated.
fn parse_feature_gates(s: &str) -> Result<FeatureGateList, FlagValueError> {
    let mut gates = Vec::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(|| FlagValueError::GateWithoutValue(pair.to_string()))?;
        let enabled = parse_bool(value.trim())
            .map_err(|e| FlagValueError::GateValue { pair: pair.to_string(), source: Box::new(e) })?;
        gates.push((name.trim().to_string(), enabled));
    }
    Ok(FeatureGateList(gates))
}

/// pflag `StringSlice`: comma separated; an empty value is an empty list.
fn parse_list(s: &str) -> Result<CommaList, std::convert::Infallible> {
    Ok(CommaList(if s.is_empty() { Vec::new() } else { s.split(',').map(|p| p.trim().to_string()).collect() }))
}

/// `utilflag.IPVar`: an IP address, or empty.
fn parse_ip_flag(s: &str) -> Result<String, FlagValueError> {
    let t = s.trim();
    if t.is_empty() || parse_ip_sloppy(t).is_some() {
        Ok(t.to_string())
    } else {
        Err(FlagValueError::NotIp(s.to_string()))
    }
}

/// `utilflag.IPPortVar`: an IP, `IP:port`, or empty.
fn parse_ip_port_flag(s: &str) -> Result<String, FlagValueError> {
    let t = s.trim();
    if t.is_empty() || parse_ip_sloppy(t).is_some() {
        return Ok(t.to_string());
    }
    let (host, port) = split_host_port(t).ok_or_else(|| FlagValueError::NotIpPort(s.to_string()))?;
    if parse_ip_sloppy(host).is_none() {
        return Err(FlagValueError::NotIp(host.to_string()));
    }
    if port.parse::<u16>().is_err() {
        return Err(FlagValueError::NotPort(port.to_string()));
    }
    Ok(t.to_string())
}

/// component-base vmodule flag: `pattern=N` pairs, comma separated.
fn parse_vmodule(s: &str) -> Result<VModuleList, FlagValueError> {
    s.split(',')
        .map(|item| {
            let (pattern, level) = item
                .split_once('=')
                .filter(|(_, l)| !l.contains('='))
                .ok_or_else(|| FlagValueError::NotVModule(item.to_string()))?;
            let verbosity = level.parse::<u32>().ok().filter(|v| *v <= i32::MAX as u32);
            let verbosity = verbosity.ok_or_else(|| FlagValueError::VModuleLevel(item.to_string()))?;
            Ok(VModuleItem { file_pattern: pattern.to_string(), verbosity })
        })
        .collect::<Result<_, FlagValueError>>()
        .map(VModuleList)
}

/// Flags that still apply with `--config`: command-line-only flags,
/// logging flags and `--hostname-override` (see [`super::load`]).
const KEPT_WITH_CONFIG: [&str; 17] = [
    "config",
    "write-config-to",
    "cleanup",
    "init-only",
    "master",
    "manifests",
    "dry-run",
    "diff",
    "hostname-override",
    "logging-format",
    "log-flush-frequency",
    "v",
    "vmodule",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
];

/// Copies a given flag value over a config field.
fn set<T: Clone>(dst: &mut T, flag: &Option<T>) {
    if let Some(v) = flag {
        *dst = v.clone();
    }
}

/// Copies a given flag value over an optional config field.
fn set_opt<T: Clone>(dst: &mut Option<T>, flag: &Option<T>) {
    if flag.is_some() {
        dst.clone_from(flag);
    }
}

impl Flags {
    /// Parses flags from an argument list (first item is the program
    /// name), recording which flags were given on the command line.
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let command = Flags::command();
        let matches = command.clone().try_get_matches_from(args)?;
        let mut flags = Flags::from_arg_matches(&matches)?;
        let on_command_line = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
        for arg in command.get_arguments().filter(|arg| on_command_line(arg.get_id().as_str())) {
            let Some(long) = arg.get_long() else { continue };
            flags.given.push(long.to_string());
            let raw = matches.get_raw(arg.get_id().as_str()).into_iter().flatten();
            let values: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
            flags.given_values.insert(long.to_string(), values.join(","));
        }
        Ok(flags)
    }

    /// Parses the process's arguments; on error (or `--help`/`--version`)
    /// prints clap's message and exits. Use this rather than clap's
    /// `Flags::parse()`, which does not record [`given`](Self::given).
    pub fn from_env() -> Self {
        Flags::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Long names of the flags given on the command line, in declaration order.
    pub fn given(&self) -> &[String] {
        &self.given
    }

    /// Every flag with its value, as `/flagz` shows them (pflag's
    /// `VisitAll`): the value given on the command line, else `default`'s
    /// answer for the flag (its default), else clap's default, else empty.
    pub fn values(&self, default: impl Fn(&str) -> Option<String>) -> BTreeMap<String, String> {
        let command = Flags::command();
        let mut out = BTreeMap::new();
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let value = match self.given_values.get(long) {
                Some(v) => v.clone(),
                None => default(long).unwrap_or_else(|| {
                    let defaults: Vec<String> =
                        arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
                    defaults.join(",")
                }),
            };
            out.insert(long.to_string(), value);
        }
        out
    }

    /// The given flags that a `--config` file overrides: all that map to a
    /// configuration field except logging flags and `--hostname-override`.
    pub fn ignored_with_config(&self) -> Vec<&str> {
        self.given.iter().map(String::as_str).filter(|name| !KEPT_WITH_CONFIG.contains(name)).collect()
    }

    /// Applies every given configuration flag (the no-`--config` path).
    pub(super) fn apply_to(&self, cfg: &mut KubeProxyConfiguration) {
        for (name, enabled) in self.feature_gates.iter().flat_map(|l| &l.0) {
            cfg.feature_gates.insert(name.clone(), *enabled);
        }
        self.apply_general(cfg);
        self.apply_modes(cfg);
        self.apply_conntrack(cfg);
        self.apply_logging(&mut cfg.logging);
    }

    fn apply_general(&self, cfg: &mut KubeProxyConfiguration) {
        let cc = &mut cfg.client_connection;
        set(&mut cc.kubeconfig, &self.kubeconfig);
        set(&mut cc.content_type, &self.kube_api_content_type);
        set(&mut cc.burst, &self.kube_api_burst);
        set(&mut cc.qps, &self.kube_api_qps);
        set(&mut cfg.bind_address, &self.bind_address);
        set(&mut cfg.healthz_bind_address, &self.healthz_bind_address);
        set(&mut cfg.metrics_bind_address, &self.metrics_bind_address);
        set(&mut cfg.bind_address_hard_fail, &self.bind_address_hard_fail);
        set(&mut cfg.enable_profiling, &self.profiling);
        set(&mut cfg.show_hidden_metrics_for_version, &self.show_hidden_metrics_for_version);
        set(&mut cfg.detect_local_mode, &self.detect_local_mode);
        set(&mut cfg.detect_local.bridge_interface, &self.pod_bridge_interface);
        set(&mut cfg.detect_local.interface_name_prefix, &self.pod_interface_name_prefix);
        set(&mut cfg.cluster_cidr, &self.cluster_cidr);
        if !self.nodeport_addresses.is_empty() {
            cfg.node_port_addresses = CommaList::join(&self.nodeport_addresses);
        }
        set_opt(&mut cfg.oom_score_adj, &self.oom_score_adj);
        set(&mut cfg.config_sync_period, &self.config_sync_period);
    }

    /// Mode flags. As upstream's `processV1Alpha1Flags` and v1alpha1
    /// conversion: `--iptables-*sync-period` and `--masquerade-all` go to
    /// the nftables section in nftables mode, and the sync-period flags of
    /// the other mode family are ignored.
    fn apply_modes(&self, cfg: &mut KubeProxyConfiguration) {
        set(&mut cfg.mode, &self.proxy_mode);
        set(&mut cfg.nftables.ruleset, &self.nftables_ruleset);
        set_opt(&mut cfg.iptables.masquerade_bit, &self.iptables_masquerade_bit);
        set_opt(&mut cfg.iptables.localhost_node_ports, &self.iptables_localhost_nodeports);
        let ipvs = &mut cfg.ipvs;
        set(&mut ipvs.scheduler, &self.ipvs_scheduler);
        if !self.ipvs_exclude_cidrs.is_empty() {
            ipvs.exclude_cidrs = CommaList::join(&self.ipvs_exclude_cidrs);
        }
        set(&mut ipvs.strict_arp, &self.ipvs_strict_arp);
        set(&mut ipvs.tcp_timeout, &self.ipvs_tcp_timeout);
        set(&mut ipvs.tcp_fin_timeout, &self.ipvs_tcpfin_timeout);
        set(&mut ipvs.udp_timeout, &self.ipvs_udp_timeout);
        set(&mut ipvs.switch_drain_timeout, &self.ipvs_switch_drain_timeout);
        match cfg.mode.as_str() {
            "ipvs" => {
                set(&mut cfg.ipvs.sync_period, &self.ipvs_sync_period);
                set(&mut cfg.ipvs.min_sync_period, &self.ipvs_min_sync_period);
                set(&mut cfg.iptables.masquerade_all, &self.masquerade_all);
            }
            "nftables" => {
                set(&mut cfg.nftables.sync_period, &self.iptables_sync_period);
                set(&mut cfg.nftables.min_sync_period, &self.iptables_min_sync_period);
                set(&mut cfg.nftables.masquerade_all, &self.masquerade_all);
            }
            _ => {
                set(&mut cfg.iptables.sync_period, &self.iptables_sync_period);
                set(&mut cfg.iptables.min_sync_period, &self.iptables_min_sync_period);
                set(&mut cfg.iptables.masquerade_all, &self.masquerade_all);
            }
        }
    }

    fn apply_conntrack(&self, cfg: &mut KubeProxyConfiguration) {
        let ct = &mut cfg.conntrack;
        set_opt(&mut ct.max_per_core, &self.conntrack_max_per_core);
        set_opt(&mut ct.min, &self.conntrack_min);
        set_opt(&mut ct.tcp_established_timeout, &self.conntrack_tcp_timeout_established);
        set_opt(&mut ct.tcp_close_wait_timeout, &self.conntrack_tcp_timeout_close_wait);
        set(&mut ct.tcp_be_liberal, &self.conntrack_tcp_be_liberal);
        set(&mut ct.udp_timeout, &self.conntrack_udp_timeout);
        set(&mut ct.udp_stream_timeout, &self.conntrack_udp_timeout_stream);
    }

    /// Applies the given logging flags (also over a `--config` file, as
    /// upstream's `copyLogsFromFlags`): vmodule entries from flags come
    /// first, the file's after them.
    pub(super) fn apply_logging(&self, logging: &mut LoggingConfiguration) {
        set(&mut logging.format, &self.logging_format);
        if let Some(freq) = self.log_flush_frequency {
            logging.flush_frequency.duration = freq;
            logging.flush_frequency.as_string = true;
        }
        set(&mut logging.verbosity, &self.v);
        let text = &mut logging.options.text;
        set(&mut text.split_stream, &self.log_text_split_stream);
        if let Some(size) = &self.log_text_info_buffer_size {
            text.info_buffer_size = Quantity(size.clone());
        }
        let json = &mut logging.options.json;
        set(&mut json.split_stream, &self.log_json_split_stream);
        if let Some(size) = &self.log_json_info_buffer_size {
            json.info_buffer_size = Quantity(size.clone());
        }
        if !self.vmodule.is_empty() {
            let mut items: Vec<VModuleItem> = self.vmodule.iter().flat_map(|l| l.0.clone()).collect();
            items.append(&mut logging.vmodule);
            logging.vmodule = items;
        }
    }

    /// The deprecated `--healthz-port` / `--metrics-port` (upstream applies
    /// them only without `--config` and `--write-config-to`): port 0
    /// disables the server, otherwise a bare IP gets that port.
    pub(super) fn apply_deprecated_ports(&self, cfg: &mut KubeProxyConfiguration) {
        let with_port = |addr: &str, port: i32| match port {
            0 => String::new(),
            p => append_port_if_needed(addr, p),
        };
        let healthz = self.healthz_port.unwrap_or(i32::from(PROXY_HEALTHZ_PORT));
        let metrics = self.metrics_port.unwrap_or(i32::from(PROXY_STATUS_PORT));
        cfg.healthz_bind_address = with_port(&cfg.healthz_bind_address, healthz);
        cfg.metrics_bind_address = with_port(&cfg.metrics_bind_address, metrics);
    }

    /// `--hostname-override`, applied over the file too: trimmed and
    /// lowercased; an all-blank value is an error.
    pub(super) fn apply_hostname_override(&self, cfg: &mut KubeProxyConfiguration) -> Result<(), ConfigError> {
        match self.hostname_override.as_deref() {
            None | Some("") => Ok(()),
            Some(name) if name.trim().is_empty() => Err(ConfigError::Flag {
                flag: "hostname-override",
                reason: "empty hostname-override is invalid".to_string(),
            }),
            Some(name) => {
                cfg.hostname_override = name.trim().to_lowercase();
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
