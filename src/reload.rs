//! SIGHUP: which config changes apply live and which need a restart.
//! Pure: compares two validated configurations field by field.
//!
//! Live: sync periods, the IPVS scheduler, timeouts and strictARP,
//! masqueradeAll, localhostNodePorts, clusterCIDR and detect-local, nodePortAddresses, and log
//! verbosity. Everything else (mode, bind addresses, client connection,
//! hostname, exclude CIDRs, ...) is named in one log line and left as it was.

use serde_json::Value;

use crate::config::KubeProxyConfiguration;

/// Field paths (camelCase, as in the file) whose change applies live.
const LIVE: [&str; 17] = [
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
    /// The configuration to run with: the new file's live fields on top of
    /// the running configuration.
    pub effective: KubeProxyConfiguration,
    /// Changed fields that took effect.
    pub applied: Vec<String>,
    /// Changed fields that need a restart and were left as they were.
    pub needs_restart: Vec<String>,
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

fn set_path(root: &mut Value, path: &str, value: Value) {
    let mut cur = root;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, p) in parts.iter().enumerate() {
        let Value::Object(map) = cur else { return };
        if i == parts.len() - 1 {
            map.insert((*p).to_string(), value);
            return;
        }
        cur = map.entry((*p).to_string()).or_insert(Value::Object(Default::default()));
    }
}

fn get_path<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(root, |v, p| v.get(p))
}

/// Compares the running configuration with a newly loaded one.
pub fn plan(running: &KubeProxyConfiguration, loaded: &KubeProxyConfiguration) -> Result<Reload, serde_json::Error> {
    let old = serde_json::to_value(running)?;
    let new = serde_json::to_value(loaded)?;
    let mut paths = Vec::new();
    changed_paths(&old, &new, "", &mut paths);
    let (applied, needs_restart): (Vec<String>, Vec<String>) = paths.into_iter().partition(|p| is_live(p));
    let mut merged = old.clone();
    for p in &applied {
        set_path(&mut merged, p, get_path(&new, p).cloned().unwrap_or(Value::Null));
    }
    let effective = serde_json::from_value(merged)?;
    Ok(Reload { effective, applied, needs_restart })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GoDuration;

    fn base() -> KubeProxyConfiguration {
        let mut c = KubeProxyConfiguration::with_defaults();
        c.mode = "ipvs".into();
        c
    }

    #[test]
    fn live_fields_apply_and_restart_fields_stay() {
        let running = base();
        let mut loaded = base();
        loaded.ipvs.scheduler = "wrr".into();
        loaded.ipvs.sync_period = GoDuration::from_secs(10);
        loaded.cluster_cidr = "10.0.0.0/8".into();
        loaded.mode = "iptables".into();
        loaded.metrics_bind_address = "0.0.0.0:10249".into();
        let r = plan(&running, &loaded).unwrap();
        assert_eq!(r.applied, vec!["clusterCIDR", "ipvs.scheduler", "ipvs.syncPeriod"]);
        assert_eq!(r.needs_restart, vec!["metricsBindAddress", "mode"]);
        assert_eq!(r.effective.ipvs.scheduler, "wrr");
        assert_eq!(r.effective.cluster_cidr, "10.0.0.0/8");
        assert_eq!(r.effective.mode, "ipvs", "mode kept until restart");
        assert_eq!(r.effective.metrics_bind_address, running.metrics_bind_address);
    }

    #[test]
    fn unchanged_file_changes_nothing() {
        let r = plan(&base(), &base()).unwrap();
        assert!(r.applied.is_empty() && r.needs_restart.is_empty());
        assert_eq!(r.effective, base());
    }

    #[test]
    fn verbosity_and_node_port_addresses_are_live() {
        let mut loaded = base();
        loaded.logging.verbosity = 4;
        loaded.node_port_addresses = vec!["192.168.0.0/16".into()];
        let r = plan(&base(), &loaded).unwrap();
        assert_eq!(r.applied, vec!["logging.verbosity", "nodePortAddresses"]);
        assert_eq!(r.effective.verbosity(), 4);
    }
}
