use super::*;

fn metrics(mode: ProxyMode) -> ProxyMetrics {
    ProxyMetrics::new(mode, StatsRegistry::default())
}

/// The HELP and TYPE lines of `name` (text format).
fn meta(name: &str, help: &str, kind: &str) -> String {
    format!("# HELP {name} {help}\n# TYPE {name} {kind}\n")
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

/// Drives every upstream metric once, so each family has a series.
fn touch_all(m: &ProxyMetrics) {
    let now = SystemTime::now();
    m.sync_queued(IpFamily::V4, now);
    m.sync_done(IpFamily::V4, true, Duration::from_millis(3));
    m.sync_done(IpFamily::V4, false, Duration::from_millis(1));
    m.sync_succeeded(IpFamily::V4, now);
    m.changes_pending(2, 5);
    m.changes_seen(3, 7);
    m.programming_latency_since(IpFamily::V4, now, now + Duration::from_millis(1500));
    m.no_local_endpoints(IpFamily::V4, 1, 2);
    m.iptables_restore_failed(IpFamily::V4);
    m.iptables_partial_restore_failed(IpFamily::V4);
    m.iptables_rules(IpFamily::V4, "nat", 40, 4);
    m.nftables_sync_failed(IpFamily::V4);
    m.nftables_cleanup_failed(IpFamily::V4);
    m.conntrack_reconciled(IpFamily::V4, Duration::from_millis(2), 3);
    m.healthz_served(200);
    m.livez_served(503);
    m.config_reload_failed();
    m.bind_failed("metrics");
    m.refusals_counted("Service");
    m.refusals_counted("EndpointSlice");
    m.object_refused("EndpointSlice", "default/a", "endpoints: invalid type");
    m.object_refused("EndpointSlice", "default/b", "endpoints: invalid type");
}

#[test]
fn upstream_names_help_and_types_in_ipvs_mode() {
    let m = metrics(ProxyMode::Ipvs);
    touch_all(&m);
    let text = m.encode_text();
    for (name, help, kind) in [
        ("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds", "histogram"),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            "histogram",
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            "histogram",
        ),
        (
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            "gauge",
        ),
        (
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            "gauge",
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            "histogram",
        ),
        ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes", "gauge"),
        ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes", "counter"),
        ("kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes", "gauge"),
        ("kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes", "counter"),
        (
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            "gauge",
        ),
        (
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "Cumulative proxy iptables restore failures",
            "counter",
        ),
        (
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            "histogram",
        ),
        (
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            "counter",
        ),
        ("kubeproxy_proxy_healthz_total", "Cumulative proxy healthz HTTP status", "counter"),
        ("kubeproxy_proxy_livez_total", "Cumulative proxy livez HTTP status", "counter"),
    ] {
        assert!(text.contains(&meta(name, help, kind)), "missing {name}:\n{text}");
    }
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
}

#[test]
fn backend_metrics_follow_the_mode_as_upstream_registers_them() {
    let cases = [
        (ProxyMode::Ipvs, &["iptables_restore_failures"][..], &["iptables_partial", "iptables_total", "nftables"][..]),
        (
            ProxyMode::Iptables,
            &["iptables_restore_failures", "iptables_partial", "iptables_total", "iptables_last"],
            &["nftables"],
        ),
        (ProxyMode::Nftables, &["nftables_sync_failures", "nftables_cleanup_failures"], &["iptables"]),
    ];
    for (mode, present, absent) in cases {
        let m = metrics(mode);
        touch_all(&m);
        let text = m.encode_text();
        for p in present {
            assert!(text.contains(&format!("# TYPE kubeproxy_sync_proxy_rules_{p}")), "{mode}: {p} missing");
        }
        for a in absent {
            assert!(!text.contains(&format!("kubeproxy_sync_proxy_rules_{a}")), "{mode}: {a} present");
        }
    }
}

#[test]
fn series_carry_upstreams_labels() {
    let m = metrics(ProxyMode::Iptables);
    touch_all(&m);
    let text = m.encode_text();
    for line in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 2",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending 5",
        "kubeproxy_sync_proxy_rules_service_changes_pending 2",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 7",
        "kubeproxy_sync_proxy_rules_service_changes_total 3",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"} 1.0",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"} 2.0",
        "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 40.0",
        "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv4\",table=\"nat\"} 4.0",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 3",
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
        "kubeproxy_proxy_livez_total{code=\"503\"} 1",
        "kube_proxy_rs_bind_failures_total{server=\"metrics\"} 1",
        "kube_proxy_rs_source_objects_refused_total{kind=\"Service\"} 0",
        "kube_proxy_rs_source_objects_refused_total{kind=\"EndpointSlice\"} 2",
    ] {
        assert!(has_line(&text, line), "missing line {line}\n{text}");
    }
    let reloads = text.lines().find_map(|l| l.strip_prefix("kube_proxy_rs_config_reload_failures_total "));
    assert!(reloads.and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n >= 1), "{text}");
    assert!(text.contains(&meta(
        "kube_proxy_rs_config_reload_failures_total",
        "Configuration reloads refused (the running configuration was kept)",
        "counter"
    )));
}

#[test]
fn histograms_use_upstreams_buckets() {
    let m = metrics(ProxyMode::Ipvs);
    touch_all(&m);
    let text = m.encode_text();
    let les = |name: &str| -> Vec<String> {
        let prefix = format!("{name}_bucket{{le=\"");
        text.lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|r| r.split('"').next().unwrap_or("").to_string())
            .collect()
    };
    let sync = les("kubeproxy_sync_proxy_rules_duration_seconds");
    assert_eq!(sync.len(), 16, "15 buckets and +Inf: {sync:?}");
    assert_eq!((sync[0].as_str(), sync[14].as_str(), sync[15].as_str()), ("0.001", "16.384", "+Inf"));
    assert_eq!(les("kubeproxy_conntrack_reconciler_sync_duration_seconds"), sync);
    let prog = les("kubeproxy_network_programming_duration_seconds");
    assert_eq!(prog.len(), 82, "MergeBuckets' 0, 2 + 59 + 12 + 7 buckets, +Inf: {prog:?}");
    let want = ["0.0", "0.25", "0.5", "1.0", "59.0", "60.0", "115.0", "120.0", "300.0", "+Inf"];
    for le in want {
        assert!(prog.iter().any(|p| p == le), "no le={le} in {prog:?}");
    }
    assert!(has_line(&text, "kubeproxy_network_programming_duration_seconds_bucket{le=\"1.0\",ip_family=\"IPv4\"} 0"));
    assert!(has_line(&text, "kubeproxy_network_programming_duration_seconds_bucket{le=\"2.0\",ip_family=\"IPv4\"} 1"));
}

#[test]
fn programming_latency_parses_the_annotation_and_skips_old_or_bad_ones() {
    let m = metrics(ProxyMode::Ipvs);
    let trigger = m.started + Duration::from_secs(10);
    let text = jiff::Timestamp::try_from(trigger).unwrap().to_string();
    let took = m.programming_latency(IpFamily::V6, &text, trigger + Duration::from_millis(700));
    assert!(took.is_some_and(|s| (s - 0.7).abs() < 1e-6), "{took:?}");
    assert_eq!(m.programming_latency(IpFamily::V6, "2001-01-01T00:00:00Z", SystemTime::now()), None, "before start");
    assert_eq!(m.programming_latency(IpFamily::V6, "yesterday", SystemTime::now()), None);
    let out = m.encode_text();
    assert!(has_line(&out, "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv6\"} 1"), "{out}");
    assert!(has_line(&out, "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.5\",ip_family=\"IPv6\"} 0"));
    assert!(has_line(&out, "kubeproxy_network_programming_duration_seconds_bucket{le=\"1.0\",ip_family=\"IPv6\"} 1"));
    assert_eq!(
        parse_trigger_time("2024-05-01T10:00:00.5+02:00"),
        Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_714_550_400_500))
    );
}

#[test]
fn actor_series_are_read_from_the_stats_registry_at_scrape_time() {
    let reg = StatsRegistry::default();
    let m = ProxyMetrics::new(ProxyMode::Ipvs, reg.clone());
    let ipvs = reg.register("ipvs");
    ipvs.enqueued();
    ipvs.enqueued();
    ipvs.dequeued();
    ipvs.applied(9, 4, 1, Duration::from_millis(3));
    ipvs.set_failing(3, Vec::new());
    ipvs.retried(2);
    let text = m.encode_text();
    assert!(text.contains(&meta(
        "kube_proxy_rs_actor_messages_total",
        "Messages the actor took from its mailbox",
        "counter"
    )));
    assert!(text.contains(&meta(
        "kube_proxy_rs_actor_apply_duration_seconds",
        "Time the actor took to apply one batch, in seconds",
        "histogram"
    )));
    for line in [
        "kube_proxy_rs_actor_mailbox_depth{actor=\"ipvs\"} 1",
        "kube_proxy_rs_actor_messages_total{actor=\"ipvs\"} 1",
        "kube_proxy_rs_actor_ops_total{actor=\"ipvs\"} 4",
        "kube_proxy_rs_actor_errors_total{actor=\"ipvs\"} 1",
        "kube_proxy_rs_actor_last_acked_generation{actor=\"ipvs\"} 9",
        "kube_proxy_rs_actor_failing_keys{actor=\"ipvs\"} 3",
        "kube_proxy_rs_actor_retries_total{actor=\"ipvs\"} 2",
        "kube_proxy_rs_actor_apply_duration_seconds_count{actor=\"ipvs\"} 1",
        "kube_proxy_rs_actor_apply_duration_seconds_bucket{le=\"0.0032\",actor=\"ipvs\"} 1",
        "kube_proxy_rs_actor_apply_duration_seconds_bucket{le=\"+Inf\",actor=\"ipvs\"} 1",
    ] {
        assert!(has_line(&text, line), "missing line {line}\n{text}");
    }
}

#[test]
fn openmetrics_keeps_its_own_conventions() {
    let m = metrics(ProxyMode::Ipvs);
    m.changes_seen(1, 1);
    let om = m.encode_openmetrics();
    assert!(om.contains("# TYPE kubeproxy_sync_proxy_rules_service_changes counter\n"), "{om}");
    assert!(om.ends_with("# EOF\n"));
}

#[test]
fn process_metrics_are_exported() {
    let text = metrics(ProxyMode::Ipvs).encode_text();
    assert!(text.contains("# TYPE process_resident_memory_bytes gauge\n"), "{text}");
    assert!(text.contains("# TYPE process_start_time_seconds gauge\n"), "{text}");
}

#[test]
fn upstreams_histograms_and_counters_exist_at_zero_from_start() {
    let m = metrics(ProxyMode::Iptables);
    let before = m.encode_text();
    assert!(!before.contains("kubeproxy_network_programming_duration_seconds_count"), "{before}");
    m.families_started(&[IpFamily::V4, IpFamily::V6]);
    let text = m.encode_text();
    for family in ["IPv4", "IPv6"] {
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_count",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
            "kubeproxy_network_programming_duration_seconds_count",
            "kubeproxy_conntrack_reconciler_sync_duration_seconds_count",
            "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
            "kubeproxy_conntrack_reconciler_deleted_entries_total",
        ] {
            let line = format!("{name}{{ip_family=\"{family}\"}} 0");
            assert!(has_line(&text, &line), "missing {line}\n{text}");
        }
    }
    for probe in ["healthz", "livez"] {
        for code in ["200", "503"] {
            let line = format!("kubeproxy_proxy_{probe}_total{{code=\"{code}\"}} 0");
            assert!(has_line(&text, &line), "missing {line}\n{text}");
        }
    }
    assert!(!text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{"), "no timestamp before a sync");
    assert!(!text.contains("nftables_sync_failures"), "not registered in iptables mode");
}

/// Upstream's nfacct metrics: counters without labels, with upstream's
/// names and help, read from the kernel (here a closure) at each scrape;
/// only the objects the rules count into, and only in iptables mode.
#[tokio::test]
async fn nfacct_counters_are_read_at_each_scrape() {
    use crate::plan::iptables::context::{NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS};
    use futures::FutureExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const CT: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
    const LOCAL: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
    let m = metrics(ProxyMode::Iptables);
    assert!(!m.scrape_text().await.contains("kubeproxy_iptables_"), "nothing before the counters are set up");
    let packets = Arc::new(AtomicU64::new(0));
    let seen = packets.clone();
    let reader: NfacctReader = Arc::new(move |object: &'static str| {
        let n = seen.load(Ordering::Relaxed);
        async move {
            if object == NFACCT_CT_STATE_INVALID {
                Ok(n)
            } else {
                Err(NfacctReadError::Gone(object))
            }
        }
        .boxed()
    });
    m.nfacct_counters(&[NFACCT_CT_STATE_INVALID, NFACCT_LOCALHOST_NODEPORTS], reader.clone());
    let text = m.encode_text();
    assert!(text.contains(&format!(
        "{}{CT} 0\n",
        meta(CT, "packets dropped by iptables to work around conntrack problems", "counter")
    )));
    assert!(
        text.contains(&format!(
            "{}{LOCAL} 0\n",
            meta(LOCAL, "Number of packets accepted on nodeports of loopback interface", "counter")
        )),
        "present at 0 from the start:\n{text}"
    );
    packets.store(42, Ordering::Relaxed);
    let text = m.scrape_text().await;
    assert!(has_line(&text, &format!("{CT} 42")), "{text}");
    assert!(!text.contains(LOCAL), "a counter that cannot be read has no sample, as upstream:\n{text}");

    let m = metrics(ProxyMode::Iptables);
    m.nfacct_counters(&[NFACCT_CT_STATE_INVALID], reader.clone());
    assert!(!m.scrape_text().await.contains(LOCAL), "an object no rule counts into has no metric");
    let m = metrics(ProxyMode::Ipvs);
    m.nfacct_counters(&[NFACCT_CT_STATE_INVALID], reader);
    assert!(!m.scrape_text().await.contains(CT), "iptables mode only");
}

#[test]
fn ignored_values_are_counted_by_kind_and_field_and_the_newest_is_shown() {
    let registry = StatsRegistry::default();
    let m = ProxyMetrics::new(ProxyMode::Iptables, registry.clone());
    let ranges = "spec.loadBalancerSourceRanges";
    m.value_ignored("Service", "shop/web", ranges, "spec.loadBalancerSourceRanges[0]", "first");
    m.value_ignored("Service", "shop/api", ranges, "spec.loadBalancerSourceRanges[2]", "second");
    m.value_ignored("Node", "node-a", "spec.podCIDRs", "spec.podCIDRs[0]", "third");
    let text = m.encode_text();
    for line in [
        "kube_proxy_rs_ignored_values_total{kind=\"Service\",field=\"spec.loadBalancerSourceRanges\"} 2",
        "kube_proxy_rs_ignored_values_total{kind=\"Node\",field=\"spec.podCIDRs\"} 1",
    ] {
        assert!(has_line(&text, line), "missing line {line}\n{text}");
    }
    assert!(text.contains("# TYPE kube_proxy_rs_ignored_values_total counter\n"), "{text}");
    let seen = registry.ignored_values();
    assert_eq!(seen.total, 3);
    let last = seen.last.expect("the newest");
    assert_eq!((last.kind.as_str(), last.object.as_str(), last.field.as_str()), ("Node", "node-a", "spec.podCIDRs[0]"));
    let listed = registry.refusals();
    assert_eq!(listed.len(), 3);
    assert_eq!((listed[0].reason.as_str(), listed[0].detail.as_str()), ("invalid_value", "third"));
}

/// A mode switch's drain shows in our namespace while it lasts (virtual
/// servers and connections left), and stays at 0 once it is done; before
/// any drain there is no series.
#[test]
fn a_mode_switchs_drain_is_reported_while_it_lasts() {
    let stats = StatsRegistry::default();
    let m = ProxyMetrics::new(ProxyMode::Nftables, stats.clone());
    assert!(!m.encode_text().contains("kube_proxy_rs_mode_switch"), "no switch, no series");
    let drain = |draining, virtual_servers, connections| crate::stats::SwitchDrain {
        mode: "ipvs",
        family: "IPv4",
        draining,
        virtual_servers,
        connections,
        since_ms: 0,
        timeout_s: 0,
    };
    stats.drain_progress(drain(true, 2, 5));
    let text = m.encode_text();
    let help = "1 while the earlier mode's state drains after a mode switch, else 0";
    assert!(text.contains(&meta("kube_proxy_rs_mode_switch_draining", help, "gauge")), "{text}");
    for line in [
        r#"kube_proxy_rs_mode_switch_draining{mode="ipvs",ip_family="IPv4"} 1"#,
        r#"kube_proxy_rs_mode_switch_remaining_connections{mode="ipvs",ip_family="IPv4"} 5"#,
        r#"kube_proxy_rs_mode_switch_remaining_virtual_servers{mode="ipvs",ip_family="IPv4"} 2"#,
    ] {
        assert!(has_line(&text, line), "{line}: {text}");
    }
    stats.drain_progress(drain(false, 0, 0));
    let text = m.encode_text();
    assert!(has_line(&text, r#"kube_proxy_rs_mode_switch_draining{mode="ipvs",ip_family="IPv4"} 0"#), "{text}");
}
