use super::*;
use crate::health::ProxierHealth;
use crate::stats::SyncRecord;
use serde_json::{json, Value};

const V4: IpFamily = IpFamily::V4;
const V6: IpFamily = IpFamily::V6;

fn about(mode: ProxyMode, families: &[IpFamily]) -> About {
    About { mode, node: "node-a".into(), families: families.to_vec() }
}

fn snap(name: &str, received: u64, ops: u64) -> StatsSnapshot {
    StatsSnapshot { name: name.into(), received, ops, ..StatsSnapshot::default() }
}

fn counters(received: u64, ops: u64, peak_depth: i64) -> ActorCounters {
    ActorCounters { received, ops, peak_depth }
}

/// A health report at `now` (seconds) with each family's verdict.
fn report(families: &[(&'static str, bool)]) -> HealthReport {
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    HealthReport {
        last_updated: Some(at),
        current_time: at,
        node_eligible: None,
        healthy: families.iter().all(|(_, ok)| *ok),
        status: families.iter().map(|(f, ok)| (*f, ProxierHealth { last_updated: at, healthy: *ok })).collect(),
    }
}

fn inputs(snaps: Vec<StatsSnapshot>) -> Inputs {
    Inputs {
        unix_ms: 1_700_000_000_500,
        health: report(&[("IPv4", true)]),
        node_eligible: true,
        counts: BTreeMap::new(),
        snaps,
        buckets: BTreeMap::new(),
        syncs: Vec::new(),
    }
}

/// A sampler with samples a second apart, from `counts` per second.
fn sampled(seconds: &[&[(&str, ActorCounters)]]) -> (Sampler, Instant) {
    let t0 = Instant::now();
    let mut s = Sampler::default();
    for (i, counts) in seconds.iter().enumerate() {
        let map = counts.iter().map(|(n, c)| (n.to_string(), *c)).collect();
        s.observe(t0 + Duration::from_secs(i as u64), 1_000 * i as u64, map);
    }
    (s, t0)
}

#[test]
fn the_json_says_what_runs_its_health_and_every_actor_with_rates_and_history() {
    let (sampler, _) = sampled(&[&[("ipvs", counters(10, 20, 0))], &[("ipvs", counters(14, 30, 3))]]);
    let mut ipvs = snap("ipvs", 14, 30);
    (ipvs.mailbox_depth, ipvs.errors, ipvs.last_generation, ipvs.p50_ms, ipvs.p99_ms) = (2, 1, 9, 0.5, 3.25);
    let mut i = inputs(vec![ipvs]);
    i.buckets = [("ipvs".to_string(), vec![1; 19])].into();
    i.counts = [("IPv4", ModelCounts { services: 3, service_ports: 4, endpoints: 9 })].into();
    let data = dashboard_data(&about(ProxyMode::Ipvs, &[V4]), i, &sampler);
    let v = serde_json::to_value(&data).unwrap();
    assert_eq!(
        v["about"],
        json!({"mode": "ipvs", "node": "node-a", "version": env!("CARGO_PKG_VERSION"), "families": ["IPv4"]})
    );
    assert_eq!((v["healthy"].clone(), v["node_eligible"].clone()), (json!(true), json!(true)));
    assert_eq!(
        v["families"],
        json!([{"family": "IPv4", "healthy": true, "last_updated_unix_ms": 1_700_000_000_000u64,
                "counts": {"services": 3, "service_ports": 4, "endpoints": 9}}])
    );
    assert_eq!(v["rate_window_secs"], json!(1.0));
    assert_eq!(v["apply_bucket_bounds_ms"].as_array().map(Vec::len), Some(APPLY_BUCKETS.len()));
    assert_eq!(v["apply_bucket_bounds_ms"][0], json!(0.1));
    assert_eq!(v["history_unix_ms"], json!([1000]));
    assert_eq!(
        v["actors"][0],
        json!({
            "name": "ipvs", "mailbox_depth": 2, "received": 14, "ops": 30, "errors": 1,
            "last_generation": 9, "p50_ms": 0.5, "p99_ms": 3.25,
            "failing_keys": 0, "failing": [], "retries": 0,
            "msgs_per_sec": 4.0, "ops_per_sec": 10.0, "apply_buckets": vec![1; 19], "msgs_history": [4.0],
        })
    );
    assert_eq!(
        v["groups"],
        json!([{"title": "IPVS mode: IPVS", "family": "IPv4", "actors": ["ipvs"], "depth_history": [3]}])
    );
    assert_eq!((v["syncs"].clone(), v["schedulers"].clone()), (json!([]), json!([])));
}

#[test]
fn each_family_has_its_verdict_and_counts_once_it_synced() {
    let mut i = inputs(vec![]);
    i.health = report(&[("IPv4", true), ("IPv6", false)]);
    i.counts = [("IPv4", ModelCounts { services: 2, service_ports: 2, endpoints: 4 })].into();
    let data = dashboard_data(&about(ProxyMode::Nftables, &[V4, V6]), i, &Sampler::default());
    assert!(!data.healthy, "one family late is unhealthy");
    let families: Vec<(&str, bool, Option<usize>)> =
        data.families.iter().map(|f| (f.family, f.healthy, f.counts.map(|c| c.endpoints))).collect();
    assert_eq!(families, [("IPv4", true, Some(4)), ("IPv6", false, None)]);
    assert_eq!(data.about.families, ["IPv4", "IPv6"]);
}

#[test]
fn syncs_pass_through_newest_first_with_their_family() {
    let sync = |family, unix_ms, generation| FamilySync {
        family,
        unix_ms,
        record: SyncRecord { generation, full: generation == 1, duration_ms: 1.5, ops: 7, ..SyncRecord::default() },
        programming_ms: Some(12.0),
    };
    let mut i = inputs(vec![]);
    i.syncs = vec![sync("IPv6", 20, 2), sync("IPv4", 10, 1)];
    let v =
        serde_json::to_value(dashboard_data(&about(ProxyMode::Iptables, &[V4, V6]), i, &Sampler::default())).unwrap();
    assert_eq!(
        v["syncs"][0],
        json!({"family": "IPv6", "unix_ms": 20, "generation": 2, "full": false, "periodic": false,
               "duration_ms": 1.5, "ports_changed": 0, "ops": 7, "failed": 0, "programming_ms": 12.0})
    );
    assert_eq!(v["syncs"][1]["family"], json!("IPv4"));
}

#[test]
fn without_two_samples_there_is_no_rate_nor_history() {
    let (one, _) = sampled(&[&[("conntrack", counters(0, 0, 0))]]);
    let data = dashboard_data(&about(ProxyMode::Iptables, &[V4]), inputs(vec![snap("conntrack", 0, 0)]), &one);
    let v = serde_json::to_value(&data).unwrap();
    assert_eq!(v["rate_window_secs"], Value::Null);
    assert_eq!(v["actors"][0]["msgs_per_sec"], Value::Null);
    assert_eq!(v["actors"][0]["msgs_history"], json!([]));
    assert_eq!(v["actors"][0]["apply_buckets"], json!([]));
    assert_eq!(v["history_unix_ms"], json!([]));
    assert_eq!(v["groups"][0]["depth_history"], json!([]));
}

#[test]
fn actors_are_listed_per_family_in_pipeline_order() {
    let names = [
        "conntrack ipv6",
        "conntrack",
        "dummy-link",
        "ipset/KUBE-NODE-PORT-TCP",
        "iptables ipv6",
        "iptables",
        "ipvs ipv6",
        "ipvs",
        "ipset/KUBE-6-CLUSTER-IP ipv6",
        "ipset/KUBE-CLUSTER-IP",
        "zz",
    ];
    let snaps = names.iter().map(|n| snap(n, 0, 0)).collect();
    let data = dashboard_data(&about(ProxyMode::Ipvs, &[V4, V6]), inputs(snaps), &Sampler::default());
    let order: Vec<&str> = data.actors.iter().map(|a| a.stats.name.as_str()).collect();
    assert_eq!(
        order,
        [
            "ipvs",
            "ipset/KUBE-CLUSTER-IP",
            "ipset/KUBE-NODE-PORT-TCP",
            "dummy-link",
            "iptables",
            "conntrack",
            "zz",
            "ipvs ipv6",
            "ipset/KUBE-6-CLUSTER-IP ipv6",
            "iptables ipv6",
            "conntrack ipv6",
        ]
    );
}

/// `(title, members)` of the groups of `names` in `mode`.
fn groups(mode: ProxyMode, families: &[IpFamily], names: &[&str]) -> Vec<(String, Vec<String>)> {
    actor_groups(&about(mode, families), names).into_iter().map(|g| (g.title, g.actors)).collect()
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn actor_groups_are_named_for_the_mode_that_runs_them() {
    let ipvs = ["ipvs", "ipset/KUBE-CLUSTER-IP", "ipset/KUBE-LOOP-BACK", "dummy-link", "iptables", "conntrack"];
    assert_eq!(
        groups(ProxyMode::Ipvs, &[V4], &ipvs),
        [
            (
                "IPVS mode: IPVS, kube-ipvs0, iptables, conntrack".to_string(),
                strings(&[ipvs[0], ipvs[3], ipvs[4], ipvs[5]])
            ),
            ("IPVS mode: ipsets".to_string(), strings(&ipvs[1..3])),
        ]
    );
    assert_eq!(
        groups(ProxyMode::Iptables, &[V6], &["iptables", "conntrack"]),
        [("iptables mode: iptables, conntrack".to_string(), strings(&["iptables", "conntrack"]))]
    );
    let dual = ["nftables", "conntrack", "nftables ipv6", "conntrack ipv6"];
    assert_eq!(
        groups(ProxyMode::Nftables, &[V4, V6], &dual),
        [
            ("nftables mode, IPv4: nftables, conntrack".to_string(), strings(&dual[..2])),
            ("nftables mode, IPv6: nftables, conntrack".to_string(), strings(&dual[2..])),
        ]
    );
    let v6_first = ["iptables", "iptables ipv4"];
    let titles: Vec<String> = groups(ProxyMode::Iptables, &[V6, V4], &v6_first).into_iter().map(|g| g.0).collect();
    assert_eq!(titles, ["iptables mode, IPv6: iptables", "iptables mode, IPv4: iptables"], "primary IPv6");
}

#[test]
fn a_groups_depth_history_sums_its_members_peaks_per_step() {
    let (sampler, _) = sampled(&[
        &[("ipvs", counters(0, 0, 0)), ("iptables", counters(0, 0, 0)), ("ipset/A", counters(0, 0, 9))],
        &[("ipvs", counters(5, 5, 2)), ("iptables", counters(1, 1, 1)), ("ipset/A", counters(1, 1, 9))],
        &[("ipvs", counters(5, 5, 0)), ("iptables", counters(1, 1, 4)), ("ipset/A", counters(1, 1, 0))],
    ]);
    let snaps = ["ipvs", "iptables", "ipset/A"].iter().map(|n| snap(n, 0, 0)).collect();
    let data = dashboard_data(&about(ProxyMode::Ipvs, &[V4]), inputs(snaps), &sampler);
    let depth: Vec<(&str, Vec<i64>)> =
        data.groups.iter().map(|g| (g.title.as_str(), g.depth_history.clone())).collect();
    assert_eq!(depth, [("IPVS mode: IPVS, iptables", vec![3, 4]), ("IPVS mode: ipsets", vec![9, 0])]);
    assert_eq!(data.history_unix_ms, [1000, 2000]);
}

#[test]
fn rates_come_from_the_newest_step() {
    let (sampler, _) =
        sampled(&[&[("ipvs", counters(0, 0, 0))], &[("ipvs", counters(10, 20, 0))], &[("ipvs", counters(40, 80, 0))]]);
    let rates = sampler.rates();
    assert_eq!(rates.window, Some(Duration::from_secs(1)));
    assert_eq!(rates.per_actor["ipvs"], Rate { msgs_per_sec: 30.0, ops_per_sec: 60.0 });
    assert_eq!(sampler.msgs_history("ipvs"), [10.0, 30.0]);
}

#[test]
fn a_step_shorter_than_a_quarter_second_gives_no_rate() {
    let t0 = Instant::now();
    let mut s = Sampler::default();
    s.observe(t0, 0, [("ipvs".to_string(), counters(0, 0, 0))].into());
    s.observe(t0 + Duration::from_millis(100), 100, [("ipvs".to_string(), counters(5, 5, 0))].into());
    assert_eq!(s.rates(), Rates::default());
}

#[test]
fn a_new_actor_has_no_rate_until_its_second_sample_and_a_reset_counter_does_not_go_negative() {
    let (sampler, _) =
        sampled(&[&[("ipvs", counters(10, 10, 0))], &[("ipvs", counters(0, 0, 0)), ("iptables", counters(3, 3, 0))]]);
    let rates = sampler.rates();
    assert_eq!(rates.per_actor["ipvs"], Rate { msgs_per_sec: 0.0, ops_per_sec: 0.0 });
    assert!(!rates.per_actor.contains_key("iptables"));
    assert_eq!(sampler.msgs_history("iptables"), Vec::<f64>::new());
}

#[test]
fn the_history_keeps_the_newest_steps_and_a_late_actor_ends_aligned() {
    let t0 = Instant::now();
    let mut s = Sampler::default();
    for i in 0..HISTORY_POINTS as u64 + 30 {
        let mut counts: BTreeMap<String, ActorCounters> = [("ipvs".to_string(), counters(i, 0, 0))].into();
        if i >= HISTORY_POINTS as u64 + 25 {
            counts.insert("late".into(), counters(2 * i, 0, 0));
        }
        s.observe(t0 + Duration::from_secs(i), 1_000 * i, counts);
    }
    let times = s.times();
    assert_eq!(times.len(), HISTORY_POINTS);
    assert_eq!(times.last(), Some(&(1_000 * (HISTORY_POINTS as u64 + 29))));
    assert_eq!(s.msgs_history("ipvs"), vec![1.0; HISTORY_POINTS]);
    assert_eq!(s.msgs_history("late"), vec![2.0; 4], "the newest four steps");
}

/// While a mode switch drains, the data carries it (the page's line above
/// the panels): the mode, family, what is left and the limit.
#[test]
fn a_mode_switchs_drain_is_in_the_data_while_it_lasts() {
    let registry = StatsRegistry::default();
    let health = Arc::new(ProxyHealth::new(Duration::from_secs(60)));
    let state = State { about: about(ProxyMode::Nftables, &[V4]), registry, health, sampler: Mutex::default() };
    assert_eq!(serde_json::to_value(state.collect()).unwrap()["drains"], json!([]));
    state.registry.drain_progress(SwitchDrain {
        mode: "ipvs",
        family: "IPv4",
        draining: true,
        virtual_servers: 2,
        connections: 7,
        since_ms: 1000,
        timeout_s: 600,
    });
    assert_eq!(
        serde_json::to_value(state.collect()).unwrap()["drains"],
        json!([{"mode": "ipvs", "family": "IPv4", "draining": true, "virtual_servers": 2, "connections": 7,
                "since_ms": 1000, "timeout_s": 600}])
    );
    assert!(PAGE.contains("renderDrain(d.drains"), "the page shows it");
}
