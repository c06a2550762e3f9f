//! SIGHUP: which config changes apply live and which need a restart.
//! Pure ([`plan`]): compares the running configuration with a newly
//! loaded one; [`live`] applies the plan to the running daemon.
//!
//! Live: sync periods, the IPVS scheduler, timeouts and strictARP,
//! masqueradeAll, localhostNodePorts, clusterCIDR and detect-local, nodePortAddresses, log
//! verbosity, and nftables mode's ruleset (`nftables.ruleset`, ours: the
//! reload's full resync writes the new ruleset and removes the other's
//! objects, as a start over the other's table does). Everything else (mode, bind addresses, client connection,
//! hostname, exclude CIDRs, ...) is named in one log line and left as it was.
//!
//! A field left as it was changes nothing else either: the new file is
//! finished (platform defaults, validation) with those fields at their
//! running values, so a default that follows them (nftables mode's
//! `nodePortAddresses: [primary]`) follows the running mode, not the
//! refused one.

pub mod live;

use serde_json::Value;

use crate::config::{ConfigError, KubeProxyConfiguration, Merged};

/// Field paths (camelCase, as in the file) whose change applies live.
const LIVE: [&str; 18] = [
    "iptables.syncPeriod",
    "iptables.minSyncPeriod",
    "iptables.masqueradeAll",
    "iptables.localhostNodePorts",
    "ipvs.syncPeriod",
    "ipvs.minSyncPeriod",
    "ipvs.scheduler",
    "ipvs.tcpTimeout",
    "ipvs.tcpFinTimeout",
    "ipvs.udpTimeout",
    "ipvs.strictARP",
    "nftables.syncPeriod",
    "nftables.minSyncPeriod",
    "nftables.ruleset",
    "clusterCIDR",
    "nodePortAddresses",
    "detectLocalMode",
    "logging.verbosity",
];

/// Prefixes that also apply live (nested objects).
const LIVE_PREFIXES: [&str; 1] = ["detectLocal."];

/// What a reload does.
#[derive(Debug, Clone, PartialEq)]
pub struct Reload {
    /// The configuration to run with: the running configuration with the
    /// live fields of the new file (finished with the other fields at their
    /// running values).
    pub effective: KubeProxyConfiguration,
    /// Changed fields that took effect.
    pub applied: Vec<String>,
    /// Changed fields that need a restart and were left as they were.
    pub needs_restart: Vec<String>,
}

/// Why a reload changes nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The new file is invalid as written.
    #[error("{source}")]
    Invalid {
        #[source]
        source: ConfigError,
    },
    /// The new file's live fields are invalid beside the running values of
    /// the fields that need a restart.
    #[error("with {fields} as running (a restart applies the file's): {source}")]
    InvalidWithRunning {
        /// The fields kept at their running values, comma separated.
        fields: String,
        #[source]
        source: Box<ConfigError>,
    },
    /// A configuration did not convert to or from its JSON form.
    #[error("comparing the configurations: {source}")]
    Compare {
        #[from]
        source: serde_json::Error,
    },
}

fn is_live(path: &str) -> bool {
    LIVE.contains(&path) || LIVE_PREFIXES.iter().any(|p| path.starts_with(p))
}

/// Leaf paths (`a.b.c`) whose values differ; arrays compare whole.
fn changed_paths(old: &Value, new: &Value, prefix: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                let null = Value::Null;
                changed_paths(a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null), &path, out);
            }
        }
        (a, b) if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

/// Sets the value at `path`, or removes the key when `value` is `None`
/// (a map entry, such as a feature gate, the other side does not have).
fn set_path(root: &mut Value, path: &str, value: Option<Value>) {
    let mut cur = root;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        let Value::Object(map) = cur else { return };
        if i == parts.len() - 1 {
            match value {
                Some(v) => map.insert((*p).to_string(), v),
                None => map.remove(*p),
            };
            return;
        }
        cur = map.entry((*p).to_string()).or_insert(Value::Object(Default::default()));
    }
}

fn get_path<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(root, |v, p| v.get(p))
}

/// `to` with the values `from` has at `paths`.
fn copy_paths(from: &Value, to: &mut Value, paths: &[String]) {
    for p in paths {
        set_path(to, p, get_path(from, p).cloned());
    }
}

/// Compares the running configuration with a newly loaded one (`loaded`:
/// merged, not yet finished). The fields that need a restart are set to
/// their running values before `loaded` is finished, so that what applies
/// is what the file would give in the running mode.
pub fn plan(running: &KubeProxyConfiguration, loaded: Merged) -> Result<Reload, ReloadError> {
    let asked = loaded.clone().finish().map_err(|source| ReloadError::Invalid { source })?;
    let old = serde_json::to_value(running)?;
    let mut needs_restart = Vec::new();
    changed_paths(&old, &serde_json::to_value(&asked)?, "", &mut needs_restart);
    needs_restart.retain(|p| !is_live(p));
    let mut pinned = serde_json::to_value(&loaded.0)?;
    copy_paths(&old, &mut pinned, &needs_restart);
    let kept = Merged(serde_json::from_value(pinned)?)
        .finish()
        .map_err(|e| ReloadError::InvalidWithRunning { fields: needs_restart.join(", "), source: Box::new(e) })?;
    let new = serde_json::to_value(&kept)?;
    let mut applied = Vec::new();
    changed_paths(&old, &new, "", &mut applied);
    applied.retain(|p| is_live(p));
    let mut merged = old;
    copy_paths(&new, &mut merged, &applied);
    let effective = serde_json::from_value(merged)?;
    Ok(Reload { effective, applied, needs_restart })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::{parse_str, GoDuration, NodePortAddresses, ProxyMode};

    /// A file's body, parsed and defaulted as the loader merges it.
    fn merged(body: &str) -> Merged {
        let text = format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}");
        let mut cfg = parse_str(&text, "kp.yaml").expect("a valid file");
        cfg.set_defaults();
        Merged(cfg)
    }

    /// The configuration a daemon started with `body` runs.
    fn running(body: &str) -> KubeProxyConfiguration {
        merged(body).finish().expect("a valid file")
    }

    #[test]
    fn live_fields_apply_and_restart_fields_stay() {
        let running = running("mode: ipvs\n");
        let loaded = merged(
            "mode: iptables\nmetricsBindAddress: 0.0.0.0:10249\nclusterCIDR: 10.0.0.0/8\n\
             ipvs:\n  scheduler: wrr\n  syncPeriod: 10s\n",
        );
        let r = plan(&running, loaded).unwrap();
        assert_eq!(r.applied, vec!["clusterCIDR", "ipvs.scheduler", "ipvs.syncPeriod"]);
        assert_eq!(r.needs_restart, vec!["metricsBindAddress", "mode"]);
        assert_eq!(r.effective.ipvs.scheduler, "wrr");
        assert_eq!(r.effective.cluster_cidr, "10.0.0.0/8");
        assert_eq!(r.effective.mode, "ipvs", "mode kept until restart");
        assert_eq!(r.effective.metrics_bind_address, running.metrics_bind_address);
    }

    #[test]
    fn unchanged_file_changes_nothing() {
        let r = plan(&running("mode: ipvs\n"), merged("mode: ipvs\n")).unwrap();
        assert!(r.applied.is_empty() && r.needs_restart.is_empty());
        assert_eq!(r.effective, running("mode: ipvs\n"));
    }

    #[test]
    fn verbosity_and_node_port_addresses_are_live() {
        let loaded = merged("mode: ipvs\nlogging:\n  verbosity: 4\nnodePortAddresses: [192.168.0.0/16]\n");
        let r = plan(&running("mode: ipvs\n"), loaded).unwrap();
        assert_eq!(r.applied, vec!["logging.verbosity", "nodePortAddresses"]);
        assert_eq!(r.effective.verbosity(), 4);
    }

    /// How the effective configuration differs from the running one.
    type Edit = fn(&mut KubeProxyConfiguration);

    /// A case: its name, the running file, the new file, the fields
    /// applied and refused, and the edit that gives the effective configuration.
    struct Row(&'static str, &'static str, &'static str, &'static [&'static str], &'static [&'static str], Edit);

    /// A refused field changes nothing through the defaults that follow it
    /// (upstream's platform defaults, per-mode sections, listen addresses
    /// defaulted from bindAddress).
    #[test]
    fn refused_fields_change_nothing_through_defaults() {
        let none: Edit = |_| {};
        let rows = [
            Row(
                "nftables asked of iptables mode: nodePortAddresses stay all local IPs",
                "mode: iptables\n",
                "mode: nftables\nlogging:\n  verbosity: 2\n",
                &["logging.verbosity"],
                &["mode"],
                |c| c.logging.verbosity = 2,
            ),
            Row("nftables asked of an unset mode (iptables)", "", "mode: nftables\n", &[], &["mode"], none),
            Row(
                "iptables asked of nftables mode: nodePortAddresses stay primary",
                "mode: nftables\n",
                "mode: iptables\n",
                &[],
                &["mode"],
                none,
            ),
            Row("an unset mode asked of nftables mode", "mode: nftables\n", "", &[], &["mode"], none),
            Row(
                "nodePortAddresses written in the file apply whatever the mode asked",
                "mode: iptables\n",
                "mode: nftables\nnodePortAddresses: [10.0.0.0/8]\n",
                &["nodePortAddresses"],
                &["mode"],
                |c| c.node_port_addresses = vec!["10.0.0.0/8".into()],
            ),
            Row(
                "ipvs asked of iptables mode: ipvs.syncPeriod applies, iptables mode's stays active",
                "mode: iptables\n",
                "mode: ipvs\nipvs:\n  syncPeriod: 10s\n",
                &["ipvs.syncPeriod"],
                &["mode"],
                |c| c.ipvs.sync_period = GoDuration::from_secs(10),
            ),
            Row(
                "nftables asked of iptables mode: nftables.masqueradeAll waits for it",
                "mode: iptables\n",
                "mode: nftables\nnftables:\n  masqueradeAll: true\n",
                &[],
                &["mode", "nftables.masqueradeAll"],
                none,
            ),
            Row(
                "bindAddress refused: the listen addresses defaulted from it stay",
                "",
                "bindAddress: \"::\"\n",
                &[],
                &["bindAddress", "healthzBindAddress", "metricsBindAddress"],
                none,
            ),
            Row("an unset detectLocalMode is ClusterCIDR", "detectLocalMode: ClusterCIDR\n", "", &[], &[], none),
            Row(
                "detectLocalMode applies",
                "clusterCIDR: 10.244.0.0/16\n",
                "clusterCIDR: 10.244.0.0/16\ndetectLocalMode: NodeCIDR\n",
                &["detectLocalMode"],
                &[],
                |c| c.detect_local_mode = "NodeCIDR".into(),
            ),
            Row(
                "a feature gate added waits for a restart (the running map is empty)",
                "",
                "featureGates:\n  LoggingAlphaOptions: true\n",
                &[],
                &["featureGates"],
                none,
            ),
        ];
        for Row(name, run, file, applied, restart, edit) in rows {
            let running = running(run);
            let r = plan(&running, merged(file)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(r.applied, applied, "{name}: applied");
            assert_eq!(r.needs_restart, restart, "{name}: refused");
            let mut want = running.clone();
            edit(&mut want);
            assert_eq!(r.effective, want, "{name}: effective");
            assert_eq!(r.effective.proxy_mode(), running.proxy_mode(), "{name}");
        }
    }

    /// `nftables.ruleset` applies live, in nftables mode as in the others
    /// (where it waits, unused, as nftables.syncPeriod does); a bad name
    /// refuses the file.
    #[test]
    fn the_nftables_ruleset_applies_live() {
        for mode in ["nftables", "iptables"] {
            let r = plan(
                &running(&format!("mode: {mode}\n")),
                merged(&format!("mode: {mode}\nnftables:\n  ruleset: maps\n")),
            );
            let r = r.unwrap();
            assert_eq!(r.applied, ["nftables.ruleset"], "{mode}");
            assert!(r.needs_restart.is_empty(), "{mode}: {:?}", r.needs_restart);
            assert_eq!(r.effective.nftables.ruleset, "maps", "{mode}");
        }
        let back = plan(&running("mode: nftables\nnftables:\n  ruleset: maps\n"), merged("mode: nftables\n")).unwrap();
        assert_eq!(
            (back.applied, back.effective.nftables.ruleset),
            (vec!["nftables.ruleset".to_string()], String::new())
        );
        let err =
            plan(&running("mode: nftables\n"), merged("mode: nftables\nnftables:\n  ruleset: Maps\n")).unwrap_err();
        assert!(err.to_string().contains("nftables.ruleset: Invalid value: \"Maps\""), "{err}");
    }

    #[test]
    fn what_the_daemon_derives_follows_the_running_mode() {
        let r = plan(&running("mode: iptables\n"), merged("mode: nftables\n")).unwrap();
        assert_eq!(r.effective.proxy_mode(), ProxyMode::Iptables);
        assert_eq!(r.effective.node_port_addresses(), NodePortAddresses::All);
        let r = plan(&running("mode: nftables\n"), merged("mode: iptables\n")).unwrap();
        assert_eq!(r.effective.node_port_addresses(), NodePortAddresses::Primary);
        let r = plan(&running("mode: iptables\n"), merged("mode: ipvs\nipvs:\n  syncPeriod: 10s\n")).unwrap();
        assert_eq!(r.effective.sync_period(), Duration::from_secs(30), "iptables mode's period");
    }

    #[test]
    fn feature_gates_added_or_removed_wait_for_a_restart() {
        let running = running("featureGates:\n  LoggingAlphaOptions: true\n");
        let r = plan(&running, merged("featureGates:\n  LoggingAlphaOptions: true\n  ContextualLogging: true\n"));
        let r = r.unwrap();
        assert_eq!(r.needs_restart, ["featureGates.ContextualLogging"]);
        assert_eq!(r.effective, running, "a gate the running map lacks stays out of it");
        let r = plan(&running, merged("")).unwrap();
        assert_eq!(r.needs_restart, ["featureGates"]);
        assert_eq!(r.effective, running);
    }

    /// Validation follows the mode too: iptables mode's periods are checked
    /// in iptables mode, whatever mode the file asks for.
    #[test]
    fn live_fields_invalid_beside_the_running_mode_are_refused() {
        let loaded = merged("mode: nftables\niptables:\n  minSyncPeriod: 60s\n");
        assert!(loaded.clone().finish().is_ok(), "valid as written (nftables mode)");
        let err = plan(&running("mode: iptables\n"), loaded).unwrap_err().to_string();
        assert!(err.starts_with("with mode as running (a restart applies the file's): "), "{err}");
        assert!(err.contains("iptables.syncPeriod: Invalid value: 1m0s"), "{err}");
        let err = plan(&running(""), merged("mode: foo\n")).unwrap_err().to_string();
        assert!(err.starts_with(r#"invalid KubeProxyConfiguration: mode: Invalid value: "foo""#), "{err}");
    }
}
