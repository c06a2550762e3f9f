//! kube-proxy's configuration: the `kubeproxy.config.k8s.io/v1alpha1`
//! `KubeProxyConfiguration` file, upstream's flags, defaults and
//! validation, and typed accessors for the daemon.
//!
//! - [`load`]: flags (+ `--config` file) → defaulted, validated config;
//!   in two steps, [`merge`] then [`Merged::finish`] (a SIGHUP reload
//!   pins the fields it refuses between the two).
//! - [`load_file`]: file → defaulted, validated config.
//! - [`validate`], [`to_yaml`] (for `--write-config-to`).
//! - [`GoDuration`]: durations in Go's text form.
//!
//! Upstream sources followed: `staging/src/k8s.io/kube-proxy/config/v1alpha1/types.go`,
//! `pkg/proxy/apis/config/v1alpha1/{defaults,conversion}.go`,
//! `pkg/proxy/apis/config/validation/validation.go`,
//! `cmd/kube-proxy/app/options.go` and `server_linux.go`.

mod accessors;
mod defaults;
mod duration;
pub mod effects;
mod features;
mod flags;
mod load;
mod netutil;
mod types;
mod validation;

use std::io;
use std::path::PathBuf;

pub use accessors::{LocalMode, NodePortAddresses, ProxyMode};
pub use defaults::{DEFAULT_CONTENT_TYPE, KUBE_PROXY_OOM_SCORE_ADJ, PROXY_HEALTHZ_PORT, PROXY_STATUS_PORT};
pub use duration::{DurationParseError, GoDuration};
pub use effects::flag_default;
pub use features::{FeatureGateError, FeatureGates, Gate, GateSpec, Stage, KNOWN_GATES};
pub use flags::{CommaList, FeatureGateList, Flags, VModuleList};
pub use load::{load, load_file, merge, parse_str, to_yaml, validate, Merged, IPVS_DEPRECATED, UNSET_MODE_WARNING};
pub use types::{
    ClientConnectionConfiguration, DetectLocalConfiguration, FlushFrequency, FormatOptions, KubeProxyConfiguration,
    KubeProxyConntrackConfiguration, KubeProxyIPTablesConfiguration, KubeProxyIPVSConfiguration,
    KubeProxyNFTablesConfiguration, KubeProxyWinkernelConfiguration, LoggingConfiguration, OutputRoutingOptions,
    Quantity, VModuleItem, API_VERSION, KIND,
};
pub use validation::{FieldError, FieldErrorKind, NFTABLES_RULESETS};

/// Why a configuration could not be loaded, parsed or accepted. Every
/// message is one line and names the file, flag or field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("reading config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The text is not valid YAML/JSON for a KubeProxyConfiguration
    /// (syntax, unknown or duplicate field, wrong type, bad duration). The
    /// parser's message starts with the field path (`iptables.syncPeriod:`)
    /// and ends with the line and column.
    #[error("{origin}: {source}")]
    Parse {
        /// The file name, or `<input>`.
        origin: String,
        /// The parser's error.
        #[source]
        source: yaml_serde::Error,
    },
    /// apiVersion or kind is missing or not ours.
    #[error("{origin}: {error}")]
    TypeMeta {
        /// The file name, or `<input>`.
        origin: String,
        /// Which of the two is wrong, and how.
        error: FieldError,
    },
    /// Validation failed; all failures, in upstream's order.
    #[error("invalid KubeProxyConfiguration: {}", join_errors(.errors))]
    Invalid {
        /// The failures.
        errors: Vec<FieldError>,
    },
    /// A `featureGates` entry (file or `--feature-gates`) is unknown, or
    /// sets a locked gate away from its default; worded as upstream's
    /// `Options.Complete` error.
    #[error("failed complete: {0}")]
    FeatureGates(#[source] FeatureGateError),
    /// A flag value was refused after parsing.
    #[error("invalid --{flag}: {reason}")]
    Flag {
        /// The flag name, without dashes.
        flag: &'static str,
        /// Why.
        reason: String,
    },
    /// The OS hostname could not be read.
    #[error("couldn't determine hostname: {source}")]
    Hostname {
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The node name is blank.
    #[error("empty hostname is invalid")]
    EmptyHostname,
    /// The configuration could not be written out.
    #[error("serializing KubeProxyConfiguration: {source}")]
    Serialize {
        /// The serializer's error.
        #[source]
        source: yaml_serde::Error,
    },
}

/// One error as is; several as upstream's aggregate: `[a, b]`.
fn join_errors(errors: &[FieldError]) -> String {
    let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    match texts.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}
