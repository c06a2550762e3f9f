//! Reading, merging, validating and writing the configuration.
//!
//! # Flags versus `--config`: upstream's rule
//!
//! Read in `cmd/kube-proxy/app/options.go`, `Options.Complete` (and
//! `AddFlags`, `processV1Alpha1Flags`, `processHostnameOverrideFlag`,
//! `copyLogsFromFlags`): pflag writes flag values straight into a
//! defaulted config object; then, if `--config` is given, the decoded and
//! defaulted file *replaces that object wholesale*. So with `--config`:
//!
//! - the file wins over every flag bound to a config field (`--proxy-mode`,
//!   `--kubeconfig`, `--masquerade-all`, `--iptables-sync-period`,
//!   `--feature-gates`, ...), given or not; those flags are ignored (several
//!   of their help texts say "ignored if a config file is specified");
//! - except the logging flags (`-v`, `--vmodule`, `--logging-format`,
//!   `--log-flush-frequency`), which `copyLogsFromFlags` copies over the
//!   file when given (vmodule: flag entries first, then the file's), and
//! - `--hostname-override`, applied after the file when non-empty
//!   (trimmed, lowercased; all-blank is an error).
//!
//! Without `--config`, every given flag overrides the defaults. Sync-period
//! flags follow the mode (`processV1Alpha1Flags`): `--iptables-*` apply
//! unless the mode is ipvs (in nftables mode they set the nftables
//! section, as upstream's v1alpha1 conversion does), `--ipvs-*` only in
//! ipvs mode; the deprecated `--healthz-port`/`--metrics-port` apply only
//! without `--config` and `--write-config-to`.
//!
//! Then, in both cases, the Linux platform defaults (mode `iptables`,
//! detectLocalMode `ClusterCIDR`, nftables NodePorts on primary IPs) and
//! validation. Flags that exist only on the command line (`--master`,
//! `--cleanup`, `--write-config-to`, `--manifests`, `--dry-run`,
//! `--init-only`) are read from [`Flags`] directly by the daemon.
//!
//! Unlike upstream, which retries a failed strict decode leniently and only
//! logs a warning, unknown and duplicate fields are errors here.

use std::path::Path;

use yaml_serde::Value;

use super::features::FeatureGates;
use super::flags::Flags;
use super::types::{KubeProxyConfiguration, API_VERSION, KIND};
use super::validation::{quote, validate_fields, FieldError};
use super::ConfigError;

/// Builds the effective configuration from the command line, following
/// upstream's precedence (see the module docs): `--config` file (YAML or
/// JSON) or flags over defaults, then logging flags and
/// `--hostname-override`, platform defaults, validation.
pub fn load(flags: &Flags) -> Result<KubeProxyConfiguration, ConfigError> {
    merge(flags)?.finish()
}

/// A configuration as the flags and the file give it, with upstream's
/// per-field defaults (`set_defaults`), before the Linux platform defaults
/// (which depend on the mode: nftables mode's `nodePortAddresses`) and
/// validation. A reload pins the fields it refuses here, so that the
/// platform defaults follow the running values ([`crate::reload`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Merged(pub KubeProxyConfiguration);

impl Merged {
    /// The platform defaults, then validation: the configuration to run with.
    pub fn finish(self) -> Result<KubeProxyConfiguration, ConfigError> {
        let mut cfg = self.0;
        check_feature_gates(&cfg)?;
        warn_unset_mode(&cfg);
        cfg.apply_platform_defaults();
        validate(&cfg)?;
        Ok(cfg)
    }
}

/// The first half of [`load`]: the `--config` file or the flags over the
/// defaults, the logging flags and `--hostname-override`.
pub fn merge(flags: &Flags) -> Result<Merged, ConfigError> {
    let mut cfg = match &flags.config {
        Some(path) => {
            let mut cfg = read_defaulted(path)?;
            warn_ignored_flags(flags);
            flags.apply_logging(&mut cfg.logging);
            cfg
        }
        None => {
            let mut cfg = KubeProxyConfiguration::with_defaults();
            flags.apply_to(&mut cfg);
            if flags.write_config_to.is_none() {
                flags.apply_deprecated_ports(&mut cfg);
            }
            cfg
        }
    };
    flags.apply_hostname_override(&mut cfg)?;
    Ok(Merged(cfg))
}

/// Reads a config file on its own (no flags): parse, defaults, platform
/// defaults, validation.
pub fn load_file(path: &Path) -> Result<KubeProxyConfiguration, ConfigError> {
    Merged(read_defaulted(path)?).finish()
}

/// `featureGates` as upstream's `SetFromMap` takes them: an unknown or
/// locked gate is an error; setting a GA or deprecated gate is a warning.
fn check_feature_gates(cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
    let (_, warnings) = FeatureGates::from_map(&cfg.feature_gates).map_err(ConfigError::FeatureGates)?;
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// What upstream (1.35 on) says when it starts in IPVS mode.
pub const IPVS_DEPRECATED: &str =
    "The ipvs proxier is now deprecated and may be removed in a future release. Please use 'nftables' instead.";

/// What upstream 1.37 says when it defaults an unset `mode` to iptables.
pub const UNSET_MODE_WARNING: &str = "No proxy mode specified; defaulting to iptables. The default proxy mode on \
     Linux will change to nftables in a future release: set mode (--proxy-mode) explicitly to keep iptables";

fn warn_unset_mode(cfg: &KubeProxyConfiguration) {
    if cfg.mode.is_empty() {
        tracing::warn!("{UNSET_MODE_WARNING}");
    }
}

fn read_defaulted(path: &Path) -> Result<KubeProxyConfiguration, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    let mut cfg = parse_str(&text, &path.display().to_string())?;
    cfg.set_defaults();
    Ok(cfg)
}

fn warn_ignored_flags(flags: &Flags) {
    let ignored = flags.ignored_with_config();
    if !ignored.is_empty() {
        tracing::warn!(flags = ?ignored, "flags ignored because --config is given; set these in the config file");
    }
}

/// Parses a KubeProxyConfiguration from YAML or JSON text, checking
/// apiVersion and kind; no defaults applied. `origin` names the source in
/// errors (a file name).
pub fn parse_str(text: &str, origin: &str) -> Result<KubeProxyConfiguration, ConfigError> {
    let parse_error = |source| ConfigError::Parse { origin: origin.to_string(), source };
    let raw: Value = yaml_serde::from_str(text).map_err(parse_error)?;
    check_type_meta(&raw).map_err(|error| ConfigError::TypeMeta { origin: origin.to_string(), error })?;
    yaml_serde::from_str(text).map_err(parse_error)
}

/// apiVersion and kind must be ours (checked before the strict parse, so a
/// different kind of file is named as such rather than by its fields).
fn check_type_meta(raw: &Value) -> Result<(), FieldError> {
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match raw.get(field) {
            None | Some(Value::Null) => {
                return Err(FieldError::required(field, format!("must be {}", quote(want))));
            }
            Some(Value::String(s)) if s == want => {}
            Some(Value::String(s)) => return Err(FieldError::not_supported(field, s, &[want])),
            Some(other) => {
                let shown = yaml_serde::to_string(other).unwrap_or_default();
                return Err(FieldError::not_supported(field, shown.trim(), &[want]));
            }
        }
    }
    Ok(())
}

/// Validates as upstream does on Linux; every failure is reported, each
/// naming its field path.
pub fn validate(cfg: &KubeProxyConfiguration) -> Result<(), ConfigError> {
    let errors = validate_fields(cfg);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid { errors })
    }
}

/// The configuration as YAML with apiVersion/kind, every field, keys
/// sorted and durations in Go form, like upstream's `--write-config-to`.
/// [`load_file`] reads it back unchanged.
pub fn to_yaml(cfg: &KubeProxyConfiguration) -> Result<String, ConfigError> {
    let mut cfg = cfg.clone();
    cfg.api_version = API_VERSION.to_string();
    cfg.kind = KIND.to_string();
    let value = yaml_serde::to_value(&cfg).map_err(|source| ConfigError::Serialize { source })?;
    yaml_serde::to_string(&sort_keys(value)).map_err(|source| ConfigError::Serialize { source })
}

fn sort_keys(value: Value) -> Value {
    match value {
        Value::Mapping(map) => {
            let mut entries: Vec<(Value, Value)> = map.into_iter().map(|(k, v)| (k, sort_keys(v))).collect();
            entries.sort_by(|(a, _), (b, _)| a.as_str().cmp(&b.as_str()));
            Value::Mapping(entries.into_iter().collect())
        }
        Value::Sequence(items) => Value::Sequence(items.into_iter().map(sort_keys).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;
    use crate::config::duration::GoDuration;

    const HEAD: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

    fn parse_err(body: &str) -> String {
        parse_str(&format!("{HEAD}{body}"), "kp.yaml").unwrap_err().to_string()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_args(std::iter::once("kube-proxy-rs").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn unknown_fields_are_refused_by_name_at_every_level() {
        let err = parse_err("bogusTop: 1\n");
        assert!(err.starts_with("kp.yaml: unknown field `bogusTop`") && err.contains("line 3"), "{err}");
        let err = parse_err("iptables:\n  masqueradeBits: 14\n");
        assert!(err.contains("iptables: unknown field `masqueradeBits`"), "{err}");
        let err = parse_err("logging:\n  options:\n    text:\n      color: true\n");
        assert!(err.contains("logging.options.text: unknown field `color`"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn bad_values_name_field_value_and_line() {
        let err = parse_err("iptables:\n  syncPeriod: 30x\n");
        assert!(err.contains(r#"iptables.syncPeriod: invalid duration "30x""#) && err.contains("line 4"), "{err}");
        let err = parse_err("conntrack:\n  tcpCloseWaitTimeout: -1s\n");
        assert!(err.contains(r#"conntrack.tcpCloseWaitTimeout: invalid duration "-1s": negative"#), "{err}");
        let err = parse_err("oomScoreAdj: abc\n");
        assert!(err.contains(r#"oomScoreAdj: invalid type: string "abc""#), "{err}");
        let err = parse_err("ipvs:\n  syncPeriod: 30\n");
        assert!(err.contains(r#"ipvs.syncPeriod: invalid duration "30": missing unit"#), "{err}");
        let err = parse_err("nodePortAddresses: 10.0.0.0/8\n");
        assert!(err.contains("nodePortAddresses: invalid type"), "{err}");
        let err = parse_err("mode: ipvs\nmode: iptables\n");
        assert!(err.contains(r#"duplicate entry with key "mode""#), "{err}");
    }

    #[test]
    fn api_version_and_kind_are_checked() {
        let err = parse_str("mode: ipvs\n", "kp.yaml").unwrap_err().to_string();
        assert_eq!(err, r#"kp.yaml: apiVersion: Required value: must be "kubeproxy.config.k8s.io/v1alpha1""#);
        let err =
            parse_str("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n", "k").unwrap_err();
        assert!(err.to_string().contains(r#"apiVersion: Unsupported value: "kubelet.config.k8s.io/v1beta1""#), "{err}");
        let err = parse_str("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: Pod\n", "k").unwrap_err();
        assert!(err
            .to_string()
            .contains(r#"kind: Unsupported value: "Pod": supported values: "KubeProxyConfiguration""#));
        assert!(parse_str("", "k").unwrap_err().to_string().contains("apiVersion: Required value"));
    }

    #[test]
    fn json_and_nulls_are_accepted() {
        let json = r#"{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration",
            "mode":"ipvs","ipvs":{"scheduler":"wrr","excludeCIDRs":null},"oomScoreAdj":null}"#;
        let cfg = parse_str(json, "kp.json").unwrap();
        assert_eq!((cfg.mode.as_str(), cfg.ipvs.scheduler.as_str(), cfg.oom_score_adj), ("ipvs", "wrr", None));
        let cfg = parse_str(&format!("{HEAD}hostnameOverride:\nclusterCIDR: ~\nfeatureGates: null\n"), "k").unwrap();
        assert_eq!(cfg.hostname_override, "");
    }

    #[test]
    fn legacy_integer_flush_frequency_round_trips_as_integer() {
        let cfg = parse_str(&format!("{HEAD}logging:\n  flushFrequency: 2000000000\n"), "k").unwrap();
        assert_eq!(cfg.logging.flush_frequency.duration.get(), Duration::from_secs(2));
        assert!(to_yaml(&cfg).unwrap().contains("flushFrequency: 2000000000"));
    }

    #[test]
    fn load_file_defaults_and_validates() {
        let f = file(&format!("{HEAD}mode: ipvs\nipvs:\n  scheduler: wrr\n"));
        let cfg = load_file(f.path()).unwrap();
        assert_eq!((cfg.ipvs_scheduler(), cfg.sync_period()), ("wrr", Duration::from_secs(30)));
        assert_eq!(cfg.detect_local_mode, "ClusterCIDR");
        let f = file(&format!("{HEAD}mode: userspace\n"));
        let err = load_file(f.path()).unwrap_err().to_string();
        assert!(err.starts_with(r#"invalid KubeProxyConfiguration: mode: Invalid value: "userspace""#), "{err}");
        let err = load_file(Path::new("/nonexistent/kp.yaml")).unwrap_err().to_string();
        assert!(err.starts_with("reading config file /nonexistent/kp.yaml: "), "{err}");
    }

    #[test]
    fn to_yaml_round_trips_through_load_file() {
        let mut cfg = load(&flags(&["--proxy-mode=ipvs", "--ipvs-exclude-cidrs=10.0.0.0/8", "--v=3"])).unwrap();
        cfg.feature_gates.insert("ComponentFlagz".into(), true);
        cfg.logging.vmodule = vec![crate::config::VModuleItem { file_pattern: "a*".into(), verbosity: 4 }];
        let text = to_yaml(&cfg).unwrap();
        assert!(text.starts_with("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nbindAddress: 0.0.0.0\n"), "{text}");
        for line in
            ["configSyncPeriod: 15m0s", "  tcpEstablishedTimeout: 24h0m0s", "  qps: 5", "kind: KubeProxyConfiguration"]
        {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        let f = file(&text);
        assert_eq!(load_file(f.path()).unwrap(), cfg);
    }

    #[test]
    fn without_config_given_flags_override_defaults() {
        let cfg = load(&flags(&[
            "--proxy-mode",
            "ipvs",
            "--ipvs-sync-period=10s",
            "--ipvs-min-sync-period=2s",
            "--iptables-sync-period=5s",
            "--masquerade-all",
            "--cluster-cidr=10.0.0.0/8",
            "--metrics-bind-address=0.0.0.0",
            "--conntrack-max-per-core=0",
            "--feature-gates=ComponentStatusz=false",
            "--nodeport-addresses=10.1.0.0/16,10.2.0.0/16",
            "--kubeconfig=/k",
            "--oom-score-adj=-500",
        ]))
        .unwrap();
        assert_eq!((cfg.sync_period(), cfg.min_sync_period()), (Duration::from_secs(10), Duration::from_secs(2)));
        // --iptables-sync-period is ignored in ipvs mode, as upstream.
        assert_eq!(cfg.iptables.sync_period, GoDuration::from_secs(30));
        assert!(cfg.masquerade_all());
        assert_eq!(cfg.metrics_bind_address, "0.0.0.0:10249");
        assert_eq!((cfg.conntrack.max_per_core, cfg.oom_score_adj), (Some(0), Some(-500)));
        assert!(!cfg.gates().enabled(crate::config::Gate::ComponentStatusz));
        assert_eq!(cfg.node_port_addresses.len(), 2);
        assert_eq!((cfg.client_connection.kubeconfig.as_str(), cfg.cluster_cidrs().len()), ("/k", 1));
        // Flags not given keep their defaults.
        assert_eq!(cfg.conntrack.min, Some(131072));
    }

    #[test]
    fn iptables_flags_set_the_nftables_section_in_nftables_mode() {
        let cfg =
            load(&flags(&["--proxy-mode=nftables", "--iptables-sync-period=1m", "--masquerade-all=true"])).unwrap();
        assert_eq!(cfg.nftables.sync_period, GoDuration::from_secs(60));
        assert!(cfg.nftables.masquerade_all && !cfg.iptables.masquerade_all);
        assert_eq!(cfg.node_port_addresses, vec!["primary".to_string()]);
    }

    #[test]
    fn with_config_the_file_wins_except_logging_and_hostname_override() {
        let body = "mode: ipvs\nclientConnection:\n  kubeconfig: /from/file\nlogging:\n  verbosity: 1\n  vmodule:\n  - filePattern: file\n    verbosity: 2\n";
        let f = file(&format!("{HEAD}{body}"));
        let path = f.path().to_str().unwrap();
        let given = flags(&[
            "--config",
            path,
            "--proxy-mode=iptables",
            "--kubeconfig=/from/flag",
            "--masquerade-all",
            "--feature-gates=A=true",
            "-v",
            "4",
            "--vmodule=flag=5",
            "--hostname-override=  Node-1 ",
        ]);
        assert_eq!(given.ignored_with_config(), ["feature-gates", "kubeconfig", "proxy-mode", "masquerade-all"]);
        let cfg = load(&given).unwrap();
        assert_eq!((cfg.mode.as_str(), cfg.client_connection.kubeconfig.as_str()), ("ipvs", "/from/file"));
        assert!(!cfg.masquerade_all() && cfg.feature_gates.is_empty());
        assert_eq!(cfg.verbosity(), 4);
        let patterns: Vec<&str> = cfg.logging.vmodule.iter().map(|v| v.file_pattern.as_str()).collect();
        assert_eq!(patterns, ["flag", "file"]);
        assert_eq!(cfg.hostname_override, "node-1");
    }

    #[test]
    fn unknown_and_locked_feature_gates_are_refused_from_flags_and_file() {
        let err = load(&flags(&["--feature-gates=NoSuchGate=true"])).unwrap_err().to_string();
        assert_eq!(err, "failed complete: unrecognized feature gate: NoSuchGate");
        let f = file(&format!("{HEAD}featureGates:\n  KubeProxyIPVS: true\n  NoSuchGate: false\n"));
        let err = load(&flags(&["--config", f.path().to_str().unwrap()])).unwrap_err().to_string();
        assert_eq!(err, "failed complete: unrecognized feature gate: NoSuchGate");
        assert_eq!(load_file(f.path()).unwrap_err().to_string(), err, "a reload refuses it too");
        let err = load(&flags(&["--feature-gates=MultiCIDRServiceAllocator=false"])).unwrap_err().to_string();
        assert_eq!(
            err,
            "failed complete: cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true"
        );
        let err = load(&flags(&["--feature-gates=TopologyAwareHints=true"])).unwrap_err().to_string();
        assert_eq!(err, "failed complete: unrecognized feature gate: TopologyAwareHints", "removed in 1.36");
        let cfg = load(&flags(&["--feature-gates=KubeProxyIPVS=false,ComponentFlagz=false"])).unwrap();
        let gates = cfg.gates();
        assert!(
            !gates.enabled(crate::config::Gate::KubeProxyIPVS) && !gates.enabled(crate::config::Gate::ComponentFlagz)
        );
    }

    #[test]
    fn logging_format_flag_applies_over_the_file() {
        let f = file(&format!("{HEAD}logging:\n  format: text\n"));
        let cfg = load(&flags(&["--config", f.path().to_str().unwrap(), "--logging-format=json"])).unwrap();
        assert_eq!(cfg.logging.format, "json");
    }

    #[test]
    fn blank_hostname_override_is_an_error() {
        let err = load(&flags(&["--hostname-override=   "])).unwrap_err().to_string();
        assert_eq!(err, "invalid --hostname-override: empty hostname-override is invalid");
    }

    #[test]
    fn deprecated_port_flags() {
        let cfg =
            load(&flags(&["--healthz-port=0", "--metrics-port=9999", "--metrics-bind-address=10.0.0.1"])).unwrap();
        assert_eq!((cfg.healthz_bind_address.as_str(), cfg.metrics_bind_address.as_str()), ("", "10.0.0.1:9999"));
        // Not applied with --write-config-to, as upstream.
        let cfg = load(&flags(&["--healthz-port=0", "--write-config-to=/tmp/x"])).unwrap();
        assert_eq!(cfg.healthz_bind_address, "0.0.0.0:10256");
    }

    #[test]
    fn flag_values_are_validated_too() {
        let err = load(&flags(&["--proxy-mode=userspace"])).unwrap_err().to_string();
        assert!(err.contains(r#"mode: Invalid value: "userspace""#), "{err}");
        let err = load(&flags(&["--iptables-masquerade-bit=40"])).unwrap_err().to_string();
        assert!(err.contains("iptables.masqueradeBit: Invalid value: 40"), "{err}");
    }
}
