//! Feature gates as upstream's component-base `featuregate` handles them:
//! every gate kube-proxy 1.36 registers is known ([`KNOWN_GATES`]), an unknown
//! name is refused (`unrecognized feature gate: NAME`), a locked gate can't
//! be set away from its default, `AllAlpha`/`AllBeta` switch every unlocked
//! alpha/beta gate not named on its own, and setting a GA or deprecated
//! gate is allowed with upstream's warning. Pure: the caller logs the
//! warnings.
//!
//! [`Gate`] names the gates kube-proxy acts on; [`FeatureGates::enabled`]
//! answers for them.

mod table;

use std::collections::BTreeMap;
use std::fmt;

pub use table::KNOWN_GATES;

/// A gate's prerelease stage (featuregate's `prerelease`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "GA",
            Stage::Deprecated => "DEPRECATED",
        })
    }
}

/// The upstream registry a gate comes from (the table's module doc says
/// which source each was read from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// k8s.io/kubernetes `pkg/features`.
    Kube,
    /// k8s.io/apiserver `pkg/features`.
    ApiServer,
    /// k8s.io/apiextensions-apiserver `pkg/features`.
    ApiExtensions,
    /// k8s.io/controller-manager `pkg/features`.
    ControllerManager,
    /// k8s.io/component-base `zpages/features`.
    ZPages,
    /// k8s.io/component-base `logs/api/v1`.
    Logs,
    /// k8s.io/component-base `metrics/features`.
    Metrics,
    /// k8s.io/client-go `features`.
    ClientGo,
    /// k8s.io/component-base `featuregate` itself (`AllAlpha`, `AllBeta`).
    FeatureGate,
    /// k8s.io/kubernetes `pkg/features` of 1.37.
    Kube137,
}

/// One known gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateSpec {
    pub name: &'static str,
    pub default: bool,
    pub stage: Stage,
    /// `LockToDefault`: setting it to anything but its default is an error.
    pub locked: bool,
    pub registry: Registry,
}

/// The gates whose value changes what kube-proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gate {
    /// Off: `mode: ipvs` is refused (upstream 1.37, where it is deprecated).
    KubeProxyIPVS,
    /// On: ServiceCIDRs are read (nftables mode drops unallocated
    /// ClusterIPs); locked on since 1.34.
    MultiCIDRServiceAllocator,
    /// On (the default since 1.36): `/flagz` on the metrics server.
    ComponentFlagz,
    /// On (the default since 1.36): `/statusz` on the metrics server.
    ComponentStatusz,
    /// On: `logging.options.text.*` (splitStream, infoBufferSize) are allowed.
    LoggingAlphaOptions,
    /// On: `logging.options.json.*` are allowed.
    LoggingBetaOptions,
}

impl Gate {
    /// Every gate we act on.
    pub const ALL: [Gate; 6] = [
        Gate::KubeProxyIPVS,
        Gate::MultiCIDRServiceAllocator,
        Gate::ComponentFlagz,
        Gate::ComponentStatusz,
        Gate::LoggingAlphaOptions,
        Gate::LoggingBetaOptions,
    ];

    /// The gate's name, as `--feature-gates` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Gate::KubeProxyIPVS => "KubeProxyIPVS",
            Gate::MultiCIDRServiceAllocator => "MultiCIDRServiceAllocator",
            Gate::ComponentFlagz => "ComponentFlagz",
            Gate::ComponentStatusz => "ComponentStatusz",
            Gate::LoggingAlphaOptions => "LoggingAlphaOptions",
            Gate::LoggingBetaOptions => "LoggingBetaOptions",
        }
    }
}

/// The spec of the known gate `name`.
pub fn spec(name: &str) -> Option<&'static GateSpec> {
    KNOWN_GATES.binary_search_by(|g| g.name.cmp(name)).ok().map(|i| &KNOWN_GATES[i])
}

/// Why a feature gate setting is refused, in upstream's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked_to}")]
    Locked { name: String, value: bool, locked_to: bool },
}

/// Resolved feature gates: the known gates' defaults with the settings of
/// a `featureGates` map over them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// The Kubernetes minor version whose gates these are.
    pub const KUBERNETES_VERSION: &'static str = table::KUBERNETES_VERSION;

    /// Every gate at its default.
    pub fn defaults() -> FeatureGates {
        FeatureGates::default()
    }

    /// Applies `settings` as upstream's `SetFromMap`: the first unknown
    /// name is the error; locked gates set away from their default are
    /// errors too. Otherwise returns the gates and upstream's warnings for
    /// GA and deprecated gates that were set.
    pub fn from_map(settings: &BTreeMap<String, bool>) -> Result<(FeatureGates, Vec<String>), FeatureGateError> {
        let mut set = BTreeMap::new();
        let mut warnings = Vec::new();
        for (name, &value) in settings {
            let spec = spec(name).ok_or_else(|| FeatureGateError::Unrecognized(name.clone()))?;
            if spec.locked && spec.default != value {
                return Err(FeatureGateError::Locked { name: name.clone(), value, locked_to: spec.default });
            }
            match spec.stage {
                Stage::Deprecated => warnings.push(format!(
                    "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
                )),
                Stage::Ga => warnings
                    .push(format!("Setting GA feature gate {name}={value}. It will be removed in a future release.")),
                Stage::Alpha | Stage::Beta => {}
            }
            set.insert(spec.name, value);
        }
        Ok((FeatureGates { set }, warnings))
    }

    /// Whether `gate` is on.
    pub fn enabled(&self, gate: Gate) -> bool {
        self.enabled_by_name(gate.name())
    }

    /// Whether the known gate `name` is on (false for an unknown name).
    pub fn enabled_by_name(&self, name: &str) -> bool {
        let Some(spec) = spec(name) else { return false };
        if let Some(&v) = self.set.get(spec.name) {
            return v;
        }
        let all = match spec.stage {
            _ if spec.locked => None,
            Stage::Alpha => self.set.get("AllAlpha"),
            Stage::Beta => self.set.get("AllBeta"),
            Stage::Ga | Stage::Deprecated => None,
        };
        all.copied().unwrap_or(spec.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> Result<(FeatureGates, Vec<String>), FeatureGateError> {
        FeatureGates::from_map(&pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    #[test]
    fn the_table_is_sorted_unique_and_holds_every_gate_we_act_on() {
        assert!(KNOWN_GATES.windows(2).all(|w| w[0].name < w[1].name), "sorted, no duplicates");
        for gate in Gate::ALL {
            assert!(spec(gate.name()).is_some(), "{gate:?} is a known gate");
        }
        assert!(KNOWN_GATES.len() > 200, "the whole default feature gate: {}", KNOWN_GATES.len());
    }

    /// States read in upstream's 1.36 sources (see the table's module doc).
    #[test]
    fn gates_as_kubernetes_1_36_has_them() {
        let state = |name: &str| spec(name).map(|g| (g.default, g.stage, g.locked, g.registry));
        // GA and locked in 1.36: on, and refused off.
        assert_eq!(state("VolumeAttributesClass"), Some((true, Stage::Ga, true, Registry::Kube)));
        assert_eq!(state("UserNamespacesSupport"), Some((true, Stage::Ga, true, Registry::Kube)));
        assert_eq!(state("DeclarativeValidation"), Some((true, Stage::Ga, true, Registry::ApiServer)));
        assert_eq!(state("InOrderInformers"), Some((true, Stage::Ga, true, Registry::ClientGo)));
        // Locked since 1.34: ServiceCIDRs are always read.
        assert_eq!(state("MultiCIDRServiceAllocator"), Some((true, Stage::Ga, true, Registry::Kube)));
        // The z-pages went beta, on by default, in 1.36.
        assert_eq!(state("ComponentFlagz"), Some((true, Stage::Beta, false, Registry::ZPages)));
        assert_eq!(state("ComponentStatusz"), Some((true, Stage::Beta, false, Registry::ZPages)));
        // New in 1.36, and a gate whose name is not its Go constant's.
        assert_eq!(state("AllowServiceExternalIPs"), Some((true, Stage::Ga, false, Registry::Kube)));
        assert_eq!(state("NativeHistograms"), Some((false, Stage::Alpha, false, Registry::Metrics)));
        assert_eq!(state("CustomCPUCFSQuotaPeriod"), Some((true, Stage::Ga, false, Registry::Kube)));
        assert_eq!(state("CPUCFSQuotaPeriod"), None);
        assert_eq!(state("SeparateCacheWatchRPC"), Some((false, Stage::Deprecated, true, Registry::ApiServer)));
        // The one 1.37 gate: deprecated there, on by default.
        assert_eq!(state("KubeProxyIPVS"), Some((true, Stage::Deprecated, false, Registry::Kube137)));
        // Removed by 1.36 (after their last release), so unknown.
        for removed in ["ServiceTrafficDistribution", "TopologyAwareHints", "MemoryManager", "ComponentSLIs"] {
            assert_eq!(state(removed), None, "{removed}");
            assert_eq!(gates(&[(removed, true)]).unwrap_err(), FeatureGateError::Unrecognized(removed.to_string()));
        }
        // Only 1.37 knows these.
        assert_eq!(state("KubeProxyNFTablesLocalhostNodePorts"), None);
        assert_eq!(state("NFTablesNetlink"), None);
    }

    #[test]
    fn defaults_as_upstream() {
        let g = FeatureGates::defaults();
        assert!(g.enabled(Gate::KubeProxyIPVS));
        assert!(g.enabled_by_name("PreferSameTrafficDistribution"), "GA and locked on since 1.35");
        assert!(g.enabled(Gate::MultiCIDRServiceAllocator));
        assert!(g.enabled(Gate::ComponentFlagz) && g.enabled(Gate::ComponentStatusz), "beta, on since 1.36");
        assert!(!g.enabled(Gate::LoggingAlphaOptions) && g.enabled(Gate::LoggingBetaOptions));
    }

    #[test]
    fn an_unknown_gate_is_refused_with_upstreams_message() {
        let err = gates(&[("KubeProxyIPVS", false), ("NoSuchGate", true)]).unwrap_err();
        assert_eq!(err.to_string(), "unrecognized feature gate: NoSuchGate");
        // Names are case-sensitive, as upstream's.
        assert!(gates(&[("kubeproxyipvs", true)]).is_err());
    }

    #[test]
    fn a_locked_gate_keeps_its_default() {
        let err = gates(&[("NFTablesProxyMode", false)]).unwrap_err();
        assert_eq!(err.to_string(), "cannot set feature gate NFTablesProxyMode to false, feature is locked to true");
        let err = gates(&[("MultiCIDRServiceAllocator", false)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true"
        );
        let (g, warnings) = gates(&[("NFTablesProxyMode", true)]).unwrap();
        assert!(g.enabled_by_name("NFTablesProxyMode"));
        assert_eq!(
            warnings,
            ["Setting GA feature gate NFTablesProxyMode=true. It will be removed in a future release."]
        );
    }

    #[test]
    fn set_gates_and_all_alpha_all_beta() {
        let (g, warnings) = gates(&[("KubeProxyIPVS", false), ("ComponentFlagz", false)]).unwrap();
        assert!(
            !g.enabled(Gate::KubeProxyIPVS) && !g.enabled(Gate::ComponentFlagz) && g.enabled(Gate::ComponentStatusz)
        );
        assert_eq!(
            warnings,
            ["Setting deprecated feature gate KubeProxyIPVS=false. It will be removed in a future release."]
        );
        let (g, _) = gates(&[("AllAlpha", true), ("LoggingAlphaOptions", false)]).unwrap();
        assert!(g.enabled_by_name("ClientsAllowCBOR") && g.enabled_by_name("NativeHistograms"));
        assert!(!g.enabled(Gate::LoggingAlphaOptions), "a gate named on its own wins");
        let (g, _) = gates(&[("AllBeta", false)]).unwrap();
        assert!(!g.enabled(Gate::LoggingBetaOptions) && !g.enabled_by_name("WatchListClient"));
        assert!(!g.enabled(Gate::ComponentFlagz) && !g.enabled(Gate::ComponentStatusz));
        assert!(g.enabled(Gate::KubeProxyIPVS), "deprecated gates stay");
        assert!(g.enabled_by_name("PreferSameTrafficDistribution"), "locked gates stay");
        let (_, warnings) = gates(&[("KMSv1", true)]).unwrap();
        assert_eq!(warnings, ["Setting deprecated feature gate KMSv1=true. It will be removed in a future release."]);
    }
}
