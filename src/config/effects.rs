//! What every flag and every `KubeProxyConfiguration` field does here, as
//! data: each is either shown by a named test ([`Effect::Tested`]) or
//! accepted for a documented reason ([`Effect::Documented`]). The tests
//! below walk clap's flags and the configuration's fields and fail on one
//! without an entry, an entry without a flag or field, a named test that
//! does not exist, and a flag whose entry names a field it does not set.
//! The flag table of docs/configuration.md is [`flag_table_markdown`], checked by a test.

use std::collections::BTreeMap;

use serde_json::Value;

use super::types::KubeProxyConfiguration;

/// Why a flag or field is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Its effect is shown by these test functions (in `src/` or `tests/`).
    Tested(&'static [&'static str]),
    /// It has no effect here, for this reason.
    Documented(&'static str),
}

/// One command-line flag.
#[derive(Debug, Clone, Copy)]
pub struct FlagEffect {
    /// The long name, without dashes.
    pub flag: &'static str,
    /// The configuration field it sets (v1alpha1 path), if any; its effect
    /// is then the field's too.
    pub field: Option<&'static str>,
    /// Arguments that make the flag set its field to something else than
    /// the default (checked by a test).
    pub sample: &'static [&'static str],
    /// What it does here, for the flag table of docs/configuration.md.
    pub does: &'static str,
    pub effect: Effect,
}

/// One configuration field (v1alpha1 path; maps and lists are one field).
#[derive(Debug, Clone, Copy)]
pub struct FieldEffect {
    pub field: &'static str,
    pub effect: Effect,
}

const fn flag(
    flag: &'static str,
    field: Option<&'static str>,
    sample: &'static [&'static str],
    does: &'static str,
    effect: Effect,
) -> FlagEffect {
    FlagEffect { flag, field, sample, does, effect }
}

const fn field(field: &'static str, effect: Effect) -> FieldEffect {
    FieldEffect { field, effect }
}

use Effect::{Documented, Tested};

const WINDOWS: Effect = Documented("Windows only: accepted and ignored on Linux, as upstream");
const SAME_AS_FIELD: Effect = Tested(&["every_flag_bound_to_a_field_sets_it"]);

/// Every flag, in `--help` order.
pub const FLAGS: &[FlagEffect] = &[
    flag("config", None, &[], "reads the KubeProxyConfiguration file; it replaces the flags bound to fields, except the logging flags and `--hostname-override`", Tested(&["with_config_the_file_wins_except_logging_and_hostname_override"])),
    flag("write-config-to", None, &[], "writes the effective configuration and exits", Tested(&["write_config_to_writes_the_effective_config_and_exits"])),
    flag("cleanup", None, &[], "removes the rules of every mode and exits", Tested(&["cleanup_removes_our_chains_and_jumps_and_nothing_else"])),
    flag("init-only", None, &[], "upstream's privileged initialization, then exit 0: the conntrack settings, IPVS mode's sysctls and timeouts, the other modes' leftovers removed, and in iptables mode route_localnet when IPv4 localhost NodePorts need it; no HTTP server, rule, table, set or nfacct object", Tested(&["init_only_sets_up_the_node_and_exits_without_serving"])),
    flag("master", None, &[], "API server URL over the kubeconfig's", Tested(&["master_overrides_the_kubeconfig_server"])),
    flag("manifests", None, &[], "reads Services, EndpointSlices, Nodes and ServiceCIDRs from YAML files instead of the API (kube-proxy-rs only)", Tested(&["demo_in_iptables_mode"])),
    flag("dry-run", None, &[], "prints the kernel state it would program and exits (kube-proxy-rs only)", Tested(&["dry_run_prints_the_demo_plan_for_the_namespaces_addresses"])),
    flag("diff", None, &[], "with `--dry-run`: what the first sync would change on this node (kube-proxy-rs only)", Tested(&["dry_run_diff_previews_what_the_first_sync_would_change"])),
    flag("feature-gates", Some("featureGates"), &["--feature-gates=ComponentFlagz=true"], "`featureGates`: every Kubernetes gate is known; unknown or locked ones are refused", SAME_AS_FIELD),
    flag("kubeconfig", Some("clientConnection.kubeconfig"), &["--kubeconfig=/k"], "`clientConnection.kubeconfig`", SAME_AS_FIELD),
    flag("kube-api-content-type", Some("clientConnection.contentType"), &["--kube-api-content-type=application/json"], "`clientConnection.contentType` (accepted, JSON is used)", SAME_AS_FIELD),
    flag("kube-api-burst", Some("clientConnection.burst"), &["--kube-api-burst=99"], "`clientConnection.burst` (accepted, not applied)", SAME_AS_FIELD),
    flag("kube-api-qps", Some("clientConnection.qps"), &["--kube-api-qps=99"], "`clientConnection.qps` (accepted, not applied)", SAME_AS_FIELD),
    flag("hostname-override", Some("hostnameOverride"), &["--hostname-override=node-x"], "`hostnameOverride`, also over `--config`", SAME_AS_FIELD),
    flag("bind-address", Some("bindAddress"), &["--bind-address=10.0.0.1"], "`bindAddress`", SAME_AS_FIELD),
    flag("healthz-bind-address", Some("healthzBindAddress"), &["--healthz-bind-address=127.0.0.1:9"], "`healthzBindAddress`", SAME_AS_FIELD),
    flag("metrics-bind-address", Some("metricsBindAddress"), &["--metrics-bind-address=127.0.0.1:9"], "`metricsBindAddress`", SAME_AS_FIELD),
    flag("healthz-port", Some("healthzBindAddress"), &["--healthz-port=0"], "deprecated: the health server's port, 0 disables it (not with `--config`)", SAME_AS_FIELD),
    flag("metrics-port", Some("metricsBindAddress"), &["--metrics-bind-address=127.0.0.1", "--metrics-port=1234"], "deprecated: the metrics server's port for a `--metrics-bind-address` without one (not with `--config`)", SAME_AS_FIELD),
    flag("bind-address-hard-fail", Some("bindAddressHardFail"), &["--bind-address-hard-fail"], "`bindAddressHardFail`", SAME_AS_FIELD),
    flag("profiling", Some("enableProfiling"), &["--profiling"], "`enableProfiling` (warned about, no profiler)", SAME_AS_FIELD),
    flag("show-hidden-metrics-for-version", Some("showHiddenMetricsForVersion"), &["--show-hidden-metrics-for-version=1.35"], "`showHiddenMetricsForVersion` (validated; no metric is hidden)", SAME_AS_FIELD),
    flag("proxy-mode", Some("mode"), &["--proxy-mode=nftables"], "`mode`", SAME_AS_FIELD),
    flag("nftables-ruleset", Some("nftables.ruleset"), &["--nftables-ruleset=maps"], "`nftables.ruleset` (kube-proxy-rs only)", SAME_AS_FIELD),
    flag("iptables-masquerade-bit", Some("iptables.masqueradeBit"), &["--iptables-masquerade-bit=3"], "`iptables.masqueradeBit`", SAME_AS_FIELD),
    flag("masquerade-all", Some("iptables.masqueradeAll"), &["--masquerade-all"], "`iptables.masqueradeAll` (`nftables.masqueradeAll` in nftables mode)", SAME_AS_FIELD),
    flag("iptables-localhost-nodeports", Some("iptables.localhostNodePorts"), &["--iptables-localhost-nodeports=false"], "`iptables.localhostNodePorts`", SAME_AS_FIELD),
    flag("iptables-sync-period", Some("iptables.syncPeriod"), &["--iptables-sync-period=7s"], "`iptables.syncPeriod` (`nftables.syncPeriod` in nftables mode; ignored in ipvs mode)", SAME_AS_FIELD),
    flag("iptables-min-sync-period", Some("iptables.minSyncPeriod"), &["--iptables-min-sync-period=7s"], "`iptables.minSyncPeriod` (`nftables.minSyncPeriod` in nftables mode; ignored in ipvs mode)", SAME_AS_FIELD),
    flag("ipvs-sync-period", Some("ipvs.syncPeriod"), &["--proxy-mode=ipvs", "--ipvs-sync-period=7s"], "`ipvs.syncPeriod` (ipvs mode only)", SAME_AS_FIELD),
    flag("ipvs-min-sync-period", Some("ipvs.minSyncPeriod"), &["--proxy-mode=ipvs", "--ipvs-min-sync-period=7s"], "`ipvs.minSyncPeriod` (ipvs mode only)", SAME_AS_FIELD),
    flag("ipvs-scheduler", Some("ipvs.scheduler"), &["--ipvs-scheduler=lc"], "`ipvs.scheduler`", SAME_AS_FIELD),
    flag("ipvs-exclude-cidrs", Some("ipvs.excludeCIDRs"), &["--ipvs-exclude-cidrs=10.0.0.0/8"], "`ipvs.excludeCIDRs`", SAME_AS_FIELD),
    flag("ipvs-strict-arp", Some("ipvs.strictARP"), &["--ipvs-strict-arp"], "`ipvs.strictARP`", SAME_AS_FIELD),
    flag("ipvs-tcp-timeout", Some("ipvs.tcpTimeout"), &["--ipvs-tcp-timeout=7s"], "`ipvs.tcpTimeout`", SAME_AS_FIELD),
    flag("ipvs-tcpfin-timeout", Some("ipvs.tcpFinTimeout"), &["--ipvs-tcpfin-timeout=7s"], "`ipvs.tcpFinTimeout`", SAME_AS_FIELD),
    flag("ipvs-udp-timeout", Some("ipvs.udpTimeout"), &["--ipvs-udp-timeout=7s"], "`ipvs.udpTimeout`", SAME_AS_FIELD),
    flag("ipvs-switch-drain-timeout", Some("ipvs.switchDrainTimeout"), &["--ipvs-switch-drain-timeout=7s"], "`ipvs.switchDrainTimeout` (kube-proxy-rs only)", SAME_AS_FIELD),
    flag("detect-local-mode", Some("detectLocalMode"), &["--detect-local-mode=NodeCIDR"], "`detectLocalMode`", SAME_AS_FIELD),
    flag("pod-bridge-interface", Some("detectLocal.bridgeInterface"), &["--pod-bridge-interface=cbr0"], "`detectLocal.bridgeInterface`", SAME_AS_FIELD),
    flag("pod-interface-name-prefix", Some("detectLocal.interfaceNamePrefix"), &["--pod-interface-name-prefix=veth"], "`detectLocal.interfaceNamePrefix`", SAME_AS_FIELD),
    flag("cluster-cidr", Some("clusterCIDR"), &["--cluster-cidr=10.0.0.0/8"], "`clusterCIDR`", SAME_AS_FIELD),
    flag("nodeport-addresses", Some("nodePortAddresses"), &["--nodeport-addresses=primary"], "`nodePortAddresses`", SAME_AS_FIELD),
    flag("oom-score-adj", Some("oomScoreAdj"), &["--oom-score-adj=-5"], "`oomScoreAdj` (default -999): written to `/proc/self/oom_score_adj` when the proxy starts serving (not with `--init-only`); a refusal is a warning naming the value", SAME_AS_FIELD),
    flag("conntrack-max-per-core", Some("conntrack.maxPerCore"), &["--conntrack-max-per-core=7"], "`conntrack.maxPerCore`", SAME_AS_FIELD),
    flag("conntrack-min", Some("conntrack.min"), &["--conntrack-min=7"], "`conntrack.min`", SAME_AS_FIELD),
    flag("conntrack-tcp-timeout-established", Some("conntrack.tcpEstablishedTimeout"), &["--conntrack-tcp-timeout-established=7s"], "`conntrack.tcpEstablishedTimeout`", SAME_AS_FIELD),
    flag("conntrack-tcp-timeout-close-wait", Some("conntrack.tcpCloseWaitTimeout"), &["--conntrack-tcp-timeout-close-wait=7s"], "`conntrack.tcpCloseWaitTimeout`", SAME_AS_FIELD),
    flag("conntrack-tcp-be-liberal", Some("conntrack.tcpBeLiberal"), &["--conntrack-tcp-be-liberal"], "`conntrack.tcpBeLiberal`", SAME_AS_FIELD),
    flag("conntrack-udp-timeout", Some("conntrack.udpTimeout"), &["--conntrack-udp-timeout=7s"], "`conntrack.udpTimeout`", SAME_AS_FIELD),
    flag("conntrack-udp-timeout-stream", Some("conntrack.udpStreamTimeout"), &["--conntrack-udp-timeout-stream=7s"], "`conntrack.udpStreamTimeout`", SAME_AS_FIELD),
    flag("config-sync-period", Some("configSyncPeriod"), &["--config-sync-period=7m"], "`configSyncPeriod`", SAME_AS_FIELD),
    flag("logging-format", Some("logging.format"), &["--logging-format=json"], "`logging.format`, also over `--config`", SAME_AS_FIELD),
    flag("log-flush-frequency", Some("logging.flushFrequency"), &["--log-flush-frequency=7s"], "`logging.flushFrequency`, also over `--config`", SAME_AS_FIELD),
    flag("v", Some("logging.verbosity"), &["--v=3"], "`logging.verbosity`, also over `--config`", SAME_AS_FIELD),
    flag("log-text-split-stream", Some("logging.options.text.splitStream"), &["--feature-gates=LoggingAlphaOptions=true", "--log-text-split-stream"], "`logging.options.text.splitStream` (alpha), also over `--config`", SAME_AS_FIELD),
    flag("log-text-info-buffer-size", Some("logging.options.text.infoBufferSize"), &["--feature-gates=LoggingAlphaOptions=true", "--log-text-info-buffer-size=1Mi"], "`logging.options.text.infoBufferSize` (alpha), also over `--config`", SAME_AS_FIELD),
    flag("log-json-split-stream", Some("logging.options.json.splitStream"), &["--log-json-split-stream"], "`logging.options.json.splitStream`, also over `--config`", SAME_AS_FIELD),
    flag("log-json-info-buffer-size", Some("logging.options.json.infoBufferSize"), &["--log-json-info-buffer-size=1Mi"], "`logging.options.json.infoBufferSize`, also over `--config`", SAME_AS_FIELD),
    flag("vmodule", Some("logging.vmodule"), &["--vmodule=proxier*=4"], "`logging.vmodule`, also over `--config` (validated, no effect)", SAME_AS_FIELD),
];

/// Every configuration field.
pub const FIELDS: &[FieldEffect] = &[
    field("apiVersion", Tested(&["api_version_and_kind_are_checked"])),
    field("kind", Tested(&["api_version_and_kind_are_checked"])),
    field("featureGates", Tested(&["kube_proxy_ipvs_off_refuses_ipvs_mode", "zpages_are_served_on_the_metrics_server_behind_their_gates", "node_hints_steer_traffic_and_prefer_same_traffic_distribution_is_locked_on"])),
    field("clientConnection.kubeconfig", Tested(&["kubeconfig_reaches_the_api_server_directly_as_the_pods_service_account"])),
    field("clientConnection.acceptContentTypes", Documented("the API client speaks JSON only (kube-rs); objects read are the same; logged at debug")),
    field("clientConnection.contentType", Documented("the API client speaks JSON only (kube-rs); objects read are the same; logged at debug")),
    field("clientConnection.qps", Documented("kube-rs has no client-side rate limiter; the daemon makes one list and one watch per kind, re-listing with backoff; logged at debug")),
    field("clientConnection.burst", Documented("kube-rs has no client-side rate limiter; the daemon makes one list and one watch per kind, re-listing with backoff; logged at debug")),
    field("logging.format", Tested(&["json_logs_have_klogs_field_names_from_the_flag_and_the_file"])),
    field("logging.flushFrequency", Documented("logging flag, applied by the logging setup: lines are written unbuffered, so there is nothing to flush")),
    field("logging.verbosity", Tested(&["verbosity_from_the_flag_and_the_file_shows_debug_lines"])),
    field("logging.vmodule", Documented("validated as upstream; its patterns name Go source files, which match nothing here")),
    field("logging.options.text.splitStream", Tested(&["split_stream_sends_info_lines_to_stdout"])),
    field("logging.options.text.infoBufferSize", Documented("logging option, applied by the logging setup: info lines are written unbuffered")),
    field("logging.options.json.splitStream", Tested(&["split_stream_sends_info_lines_to_stdout"])),
    field("logging.options.json.infoBufferSize", Documented("logging option, applied by the logging setup: info lines are written unbuffered")),
    field("hostnameOverride", Tested(&["hostname_is_trimmed_and_lowercased", "demo_in_iptables_mode"])),
    field("bindAddress", Tested(&["ipv4_is_a_fallback_only_without_bind_address_and_node_addresses", "ipv6_bind_address_gives_ipv6_listen_defaults"])),
    field("healthzBindAddress", Tested(&["start_http_servers_binds_both_and_hard_fail_returns_the_error", "probes_reach_the_configured_health_server"])),
    field("metricsBindAddress", Tested(&["start_http_servers_binds_both_and_hard_fail_returns_the_error"])),
    field("bindAddressHardFail", Tested(&["start_http_servers_binds_both_and_hard_fail_returns_the_error"])),
    field("enableProfiling", Documented("Go's /debug/pprof profiler has no counterpart here: a warning says it is ignored")),
    field("showHiddenMetricsForVersion", Documented("validated as upstream; no metric of this daemon is hidden, so there is nothing to show")),
    field("mode", Tested(&["the_daemon_runs_in_nftables_mode", "node_port_answers_on_the_node_ip_and_on_localhost", "ipvs_scenarios_in_a_vm"])),
    field("iptables.masqueradeBit", Tested(&["masquerade_settings_follow_the_mode", "matches_upstreams_rules_for_the_worked_example"])),
    field("iptables.masqueradeAll", Tested(&["masquerade_settings_follow_the_mode", "local_detectors_and_masquerade_all_shape_the_masquerade_rules"])),
    field("iptables.localhostNodePorts", Tested(&["the_node_ports_tail_follows_node_port_addresses_and_localhost_setting", "node_port_answers_on_the_node_ip_and_on_localhost"])),
    field("iptables.syncPeriod", Tested(&["proxy_mode_and_its_sync_periods", "the_sync_period_writes_nothing_while_the_cluster_is_quiet"])),
    field("iptables.minSyncPeriod", Tested(&["proxy_mode_and_its_sync_periods", "burst_then_min_sync_period"])),
    field("ipvs.syncPeriod", Tested(&["proxy_mode_and_its_sync_periods"])),
    field("ipvs.minSyncPeriod", Tested(&["proxy_mode_and_its_sync_periods"])),
    field("ipvs.scheduler", Tested(&["the_active_modes_periods_and_the_scheduler_are_taken", "dry_run_prints_a_services_own_scheduler_in_ipvsadm_syntax"])),
    field("ipvs.excludeCIDRs", Tested(&["the_active_modes_periods_and_the_scheduler_are_taken"])),
    field("ipvs.strictARP", Tested(&["upstreams_list_in_order_with_strict_arp"])),
    field("ipvs.tcpTimeout", Tested(&["ipvs_timeouts_are_whole_seconds_and_all_zero_sets_none", "set_timeouts_bytes"])),
    field("ipvs.tcpFinTimeout", Tested(&["ipvs_timeouts_are_whole_seconds_and_all_zero_sets_none", "set_timeouts_bytes"])),
    field("ipvs.udpTimeout", Tested(&["ipvs_timeouts_are_whole_seconds_and_all_zero_sets_none", "set_timeouts_bytes"])),
    field("ipvs.switchDrainTimeout", Tested(&["the_ipvs_switch_drain_timeout_limits_the_drain", "a_drain_round_removes_the_servers_without_connections_and_keeps_the_rest", "the_timeout_removes_every_server_and_says_it_cut_connections"])),
    field("nftables.masqueradeBit", Tested(&["masquerade_settings_follow_the_mode", "the_nftables_config_section_shapes_the_ruleset"])),
    field("nftables.masqueradeAll", Tested(&["masquerade_settings_follow_the_mode", "masquerade_all_and_other_local_detectors"])),
    field("nftables.syncPeriod", Tested(&["proxy_mode_and_its_sync_periods", "the_sync_period_repairs_a_deleted_table_and_ignores_other_tables"])),
    field("nftables.minSyncPeriod", Tested(&["proxy_mode_and_its_sync_periods"])),
    field("nftables.ruleset", Tested(&["the_nftables_ruleset_field_picks_the_ruleset", "the_nftables_ruleset_applies_live", "a_reload_switches_the_ruleset_and_drops_no_connection"])),
    field("winkernel.networkName", WINDOWS),
    field("winkernel.sourceVip", WINDOWS),
    field("winkernel.enableDSR", WINDOWS),
    field("winkernel.rootHnsEndpointName", WINDOWS),
    field("winkernel.forwardHealthCheckVip", WINDOWS),
    field("detectLocalMode", Tested(&["node_cidr_detection_waits_for_the_node", "local_detectors_and_masquerade_all_shape_the_masquerade_rules", "a_pod_cidr_change_in_node_cidr_mode_exits_for_a_restart"])),
    field("detectLocal.bridgeInterface", Tested(&["node_cidr_detection_waits_for_the_node", "local_detectors_in_nft_syntax"])),
    field("detectLocal.interfaceNamePrefix", Tested(&["node_cidr_detection_waits_for_the_node", "local_detectors_in_nft_syntax"])),
    field("clusterCIDR", Tested(&["each_family_gets_its_own_cluster_cidr_and_node_port_addresses", "a_backend_reaches_itself_through_its_service_with_masquerade"])),
    field("nodePortAddresses", Tested(&["each_family_gets_its_own_cluster_cidr_and_node_port_addresses", "the_node_ports_tail_follows_node_port_addresses_and_localhost_setting", "a_node_ip_change_exits_for_a_restart"])),
    field("oomScoreAdj", Tested(&["oom_score_adj_is_written_at_start"])),
    field("conntrack.maxPerCore", Tested(&["the_table_size_scales_per_core_with_a_floor_and_a_cap"])),
    field("conntrack.min", Tested(&["the_table_size_scales_per_core_with_a_floor_and_a_cap"])),
    field("conntrack.tcpEstablishedTimeout", Tested(&["timeouts_and_liberal_are_written_when_set_and_non_zero"])),
    field("conntrack.tcpCloseWaitTimeout", Tested(&["timeouts_and_liberal_are_written_when_set_and_non_zero"])),
    field("conntrack.tcpBeLiberal", Tested(&["conntrack_settings_are_applied_and_tcp_be_liberal_drops_the_invalid_rule"])),
    field("conntrack.udpTimeout", Tested(&["conntrack_settings_are_applied_and_tcp_be_liberal_drops_the_invalid_rule"])),
    field("conntrack.udpStreamTimeout", Tested(&["timeouts_and_liberal_are_written_when_set_and_non_zero"])),
    field("configSyncPeriod", Documented("the informers' resync period: upstream's periodic re-delivery of unchanged objects changes nothing in its proxiers; the watches here re-list after a failure instead")),
    field("portRange", Documented("unused since the userspace proxy was removed; validated as upstream")),
    field("windowsRunAsService", WINDOWS),
];

/// The value of `path` (`a.b.c`) in `value`.
pub fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

/// A value as pflag prints a flag's value: strings bare, lists `[a,b]`,
/// maps `k=v,...`, nothing for null.
fn flag_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!("[{}]", items.iter().map(flag_text).collect::<Vec<_>>().join(",")),
        Value::Object(map) => map.iter().map(|(k, v)| format!("{k}={}", flag_text(v))).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// The default value of `flag`, as `/flagz` shows a flag not given: its
/// field's in the defaulted configuration; `None` for a flag without one.
pub fn flag_default(flag: &str) -> Option<String> {
    let field = FLAGS.iter().find(|f| f.flag == flag)?.field?;
    let defaults = serde_json::to_value(KubeProxyConfiguration::with_defaults()).ok()?;
    Some(at_path(&defaults, field).map(flag_text).unwrap_or_default())
}

/// The flag table of docs/configuration.md: one row per flag, what it does here.
pub fn flag_table_markdown() -> String {
    let mut out = String::from("| flag | what it does here |\n| --- | --- |\n");
    for f in FLAGS {
        out.push_str(&format!("| `--{}` | {} |\n", f.flag, f.does));
    }
    out
}

/// The leaf field paths of `value` (objects recursed, lists and the
/// `featureGates` map as one field).
pub fn field_paths(value: &Value) -> Vec<String> {
    fn walk(prefix: &str, value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) if prefix != "featureGates" => {
                for (k, v) in map {
                    let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                    walk(&path, v, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    walk("", value, &mut out);
    out
}

/// Every field path of the configuration: the defaults, with the fields
/// that are not written while empty given a value.
pub fn config_field_paths() -> Vec<String> {
    let mut cfg = KubeProxyConfiguration::with_defaults();
    cfg.feature_gates = BTreeMap::from([("ComponentFlagz".to_string(), true)]);
    cfg.windows_run_as_service = true;
    cfg.nftables.ruleset = "maps".into();
    cfg.ipvs.switch_drain_timeout = super::GoDuration::from_secs(1);
    cfg.logging.format = "text".into();
    cfg.logging.vmodule = vec![super::VModuleItem { file_pattern: "a".into(), verbosity: 1 }];
    for o in [&mut cfg.logging.options.text, &mut cfg.logging.options.json] {
        o.split_stream = true;
        o.info_buffer_size = super::Quantity("1".into());
    }
    field_paths(&serde_json::to_value(cfg).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use clap::CommandFactory;

    use super::*;
    use crate::config::{load, Flags};

    /// Every `fn NAME` in the repository's `src/` and `tests/`.
    fn function_names() -> BTreeSet<String> {
        fn scan(dir: &Path, out: &mut BTreeSet<String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    scan(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    for rest in text.split("fn ").skip(1) {
                        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        out.insert(name);
                    }
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut out = BTreeSet::new();
        scan(&root.join("src"), &mut out);
        scan(&root.join("tests"), &mut out);
        out
    }

    fn tests_named(effect: Effect) -> &'static [&'static str] {
        match effect {
            Effect::Tested(tests) => tests,
            Effect::Documented(_) => &[],
        }
    }

    /// The walk: (a) every flag clap accepts and every configuration field
    /// has an entry; (b) every entry names a flag or field that exists;
    /// (c) every test an entry names exists; a documented reason is given.
    #[test]
    fn every_flag_and_field_has_an_effect_or_a_reason() {
        let clap_flags: BTreeSet<String> =
            Flags::command().get_arguments().filter_map(|a| a.get_long()).map(str::to_string).collect();
        let table_flags: BTreeSet<String> = FLAGS.iter().map(|f| f.flag.to_string()).collect();
        assert_eq!(FLAGS.len(), table_flags.len(), "one entry per flag");
        let missing: Vec<_> = clap_flags.difference(&table_flags).collect();
        assert!(missing.is_empty(), "flags accepted without an entry in FLAGS: {missing:?}");
        let gone: Vec<_> = table_flags.difference(&clap_flags).collect();
        assert!(gone.is_empty(), "FLAGS names flags that do not exist: {gone:?}");

        let config_fields: BTreeSet<String> = config_field_paths().into_iter().collect();
        let table_fields: BTreeSet<String> = FIELDS.iter().map(|f| f.field.to_string()).collect();
        assert_eq!(FIELDS.len(), table_fields.len(), "one entry per field");
        let missing: Vec<_> = config_fields.difference(&table_fields).collect();
        assert!(missing.is_empty(), "fields accepted without an entry in FIELDS: {missing:?}");
        let gone: Vec<_> = table_fields.difference(&config_fields).collect();
        assert!(gone.is_empty(), "FIELDS names fields that do not exist: {gone:?}");
        for f in FLAGS.iter().filter_map(|f| f.field) {
            assert!(table_fields.contains(f), "a flag names field {f}, which does not exist");
        }

        let functions = function_names();
        let named = FLAGS.iter().map(|f| f.effect).chain(FIELDS.iter().map(|f| f.effect));
        let mut unknown: BTreeSet<&str> = BTreeSet::new();
        for effect in named {
            match effect {
                Effect::Tested(tests) => {
                    assert!(!tests.is_empty(), "a Tested entry names a test");
                    unknown.extend(tests.iter().copied().filter(|t| !functions.contains(*t)));
                }
                Effect::Documented(reason) => assert!(reason.len() > 20, "a real reason: {reason:?}"),
            }
        }
        assert!(unknown.is_empty(), "entries name tests that do not exist: {unknown:?}");
    }

    /// Each flag bound to a field sets that field: its sample arguments
    /// load into a configuration whose field differs from the default one.
    #[test]
    fn every_flag_bound_to_a_field_sets_it() {
        let parse = |args: &[&str]| {
            let argv = std::iter::once("kube-proxy-rs").chain(args.iter().copied());
            let flags = Flags::try_parse_args(argv).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let cfg = load(&flags).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            serde_json::to_value(cfg).unwrap()
        };
        let defaults = parse(&[]);
        for f in FLAGS {
            let Some(field) = f.field else {
                assert!(f.sample.is_empty(), "--{}: a sample needs a field", f.flag);
                assert!(f.effect != SAME_AS_FIELD, "--{} sets no field", f.flag);
                continue;
            };
            assert!(f.sample.iter().any(|a| a.starts_with(&format!("--{}", f.flag))), "--{} in its sample", f.flag);
            let got = parse(f.sample);
            assert_ne!(at_path(&got, field), at_path(&defaults, field), "--{} sets {field}", f.flag);
            if f.effect == SAME_AS_FIELD {
                let of_field = FIELDS.iter().find(|x| x.field == field).map(|x| x.effect);
                assert!(of_field.is_some(), "--{}: {field} has an entry", f.flag);
            }
        }
        assert!(tests_named(SAME_AS_FIELD).contains(&"every_flag_bound_to_a_field_sets_it"));
    }

    /// The flag table of docs/configuration.md is [`flag_table_markdown`], so it says what
    /// every flag does here and cannot fall behind the flags.
    #[test]
    fn the_flag_table_in_the_docs_is_the_effects_table() {
        let readme =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md")).unwrap();
        let table = flag_table_markdown();
        assert!(readme.contains(&table), "docs/configuration.md must hold this flag table:\n{table}");
    }

    #[test]
    fn flag_defaults_come_from_the_defaulted_configuration() {
        assert_eq!(flag_default("iptables-sync-period").as_deref(), Some("30s"));
        assert_eq!(flag_default("masquerade-all").as_deref(), Some("false"));
        assert_eq!(flag_default("proxy-mode").as_deref(), Some(""));
        assert_eq!(flag_default("ipvs-exclude-cidrs").as_deref(), Some("[]"));
        assert_eq!(flag_default("feature-gates").as_deref(), Some(""));
        assert_eq!(flag_default("cleanup"), None);
    }
}
