use super::*;

fn parse(args: &[&str]) -> Result<Flags, String> {
    let argv = std::iter::once("kube-proxy-rs").chain(args.iter().copied());
    Flags::try_parse_args(argv).map_err(|e| e.to_string())
}

#[test]
fn value_flags_take_equals_or_next_argument() {
    assert_eq!(parse(&["--proxy-mode=ipvs"]).unwrap().proxy_mode.as_deref(), Some("ipvs"));
    assert_eq!(parse(&["--proxy-mode", "ipvs"]).unwrap().proxy_mode.as_deref(), Some("ipvs"));
    assert_eq!(parse(&["--oom-score-adj", "-999"]).unwrap().oom_score_adj, Some(-999));
    assert_eq!(parse(&["--ipvs-scheduler", "lc"]).unwrap().ipvs_scheduler.as_deref(), Some("lc"));
    assert!(parse(&["stray"]).is_err());
}

#[test]
fn verbosity_long_and_short() {
    for args in [&["--v=2"][..], &["--v", "2"], &["-v", "2"], &["-v=2"], &["-v2"]] {
        assert_eq!(parse(args).unwrap().v, Some(2), "{args:?}");
    }
    assert!(parse(&["--v=-1"]).is_err());
}

#[test]
fn booleans_are_pflag_style() {
    assert_eq!(parse(&["--masquerade-all"]).unwrap().masquerade_all, Some(true));
    assert_eq!(parse(&["--masquerade-all=false"]).unwrap().masquerade_all, Some(false));
    assert_eq!(parse(&["--masquerade-all=T"]).unwrap().masquerade_all, Some(true));
    assert_eq!(parse(&[]).unwrap().masquerade_all, None);
    // As with pflag, a bool value must be attached with '='.
    assert!(parse(&["--masquerade-all", "false"]).is_err());
    assert!(parse(&["--masquerade-all=yes"]).is_err());
    let f = parse(&["--cleanup", "--dry-run=true", "--init-only=0"]).unwrap();
    assert!(f.cleanup && f.dry_run && !f.init_only);
}

#[test]
fn durations_are_go_durations() {
    let f = parse(&["--ipvs-min-sync-period=1m30s", "--conntrack-tcp-timeout-close-wait", "1h"]).unwrap();
    assert_eq!(f.ipvs_min_sync_period.map(|d| d.to_string()).as_deref(), Some("1m30s"));
    assert_eq!(f.conntrack_tcp_timeout_close_wait.map(|d| d.to_string()).as_deref(), Some("1h0m0s"));
    let err = parse(&["--iptables-sync-period=-1s"]).unwrap_err();
    assert!(err.contains("--iptables-sync-period") && err.contains("\"-1s\""), "{err}");
    assert!(parse(&["--config-sync-period=15"]).is_err());
}

#[test]
fn lists_split_on_commas_and_repeat() {
    let f = parse(&["--ipvs-exclude-cidrs=10.0.0.0/8,fd00::/8", "--ipvs-exclude-cidrs", "1.2.3.0/24"]).unwrap();
    assert_eq!(CommaList::join(&f.ipvs_exclude_cidrs), ["10.0.0.0/8", "fd00::/8", "1.2.3.0/24"]);
    let f = parse(&["--nodeport-addresses="]).unwrap();
    assert!(CommaList::join(&f.nodeport_addresses).is_empty() && !f.nodeport_addresses.is_empty());
    let f = parse(&["--feature-gates=A=true, B=false", "--feature-gates", "C=1"]).unwrap();
    let gates: Vec<_> = f.feature_gates.iter().flat_map(|l| l.0.clone()).collect();
    assert_eq!(gates, [("A".into(), true), ("B".into(), false), ("C".into(), true)]);
    assert!(parse(&["--feature-gates=A"]).unwrap_err().contains("missing bool value for A"));
    assert!(parse(&["--vmodule=foo"]).unwrap_err().contains("pattern=N"));
}

#[test]
fn addresses_are_checked_at_parse_time() {
    assert_eq!(parse(&["--bind-address=::1"]).unwrap().bind_address.as_deref(), Some("::1"));
    assert!(parse(&["--bind-address=1.2.3.4:5"]).is_err());
    let f = parse(&["--metrics-bind-address=0.0.0.0", "--healthz-bind-address=[::]:1"]).unwrap();
    assert_eq!(
        (f.metrics_bind_address.as_deref(), f.healthz_bind_address.as_deref()),
        (Some("0.0.0.0"), Some("[::]:1"))
    );
    assert_eq!(parse(&["--healthz-bind-address="]).unwrap().healthz_bind_address.as_deref(), Some(""));
    assert!(parse(&["--metrics-bind-address=1.2.3.4:99999"]).is_err());
    assert!(parse(&["--metrics-bind-address=localhost:80"]).is_err());
}

#[test]
fn records_which_flags_were_given() {
    let f = parse(&["-v", "2", "--proxy-mode=ipvs", "--cleanup", "--nodeport-addresses="]).unwrap();
    assert_eq!(f.given(), ["cleanup", "proxy-mode", "nodeport-addresses", "v"]);
    assert_eq!(f.ignored_with_config(), ["proxy-mode", "nodeport-addresses"]);
    assert!(parse(&[]).unwrap().given().is_empty());
}

#[test]
fn values_are_the_given_ones_else_the_defaults() {
    let f =
        parse(&["--v=3", "--ipvs-exclude-cidrs=10.0.0.0/8", "--ipvs-exclude-cidrs", "fd00::/8", "--cleanup"]).unwrap();
    let values = f.values(|flag| (flag == "proxy-mode").then(|| "from-default".to_string()));
    assert_eq!(values["v"], "3");
    assert_eq!(values["ipvs-exclude-cidrs"], "10.0.0.0/8,fd00::/8");
    assert_eq!((values["cleanup"].as_str(), values["dry-run"].as_str()), ("true", "false"));
    assert_eq!((values["proxy-mode"].as_str(), values["kubeconfig"].as_str()), ("from-default", ""));
    assert!(values.contains_key("healthz-port"), "hidden flags too, as pflag's VisitAll");
}

#[test]
fn go_integer_forms() {
    let table =
        [("14", 14), ("-999", -999), ("+5", 5), ("0x1f", 31), ("0o17", 15), ("017", 15), ("0b101", 5), ("0", 0)];
    for (text, want) in table {
        assert_eq!(parse_i32(text), Ok(want), "{text}");
    }
    for bad in ["", "x", "0x", "1.5", "2147483648", "--1", "+-1"] {
        assert!(parse_i32(bad).is_err(), "{bad}");
    }
}

#[test]
fn hostname_override_is_trimmed_and_lowercased() {
    let mut cfg = KubeProxyConfiguration::default();
    parse(&["--hostname-override= Node-A "]).unwrap().apply_hostname_override(&mut cfg).unwrap();
    assert_eq!(cfg.hostname_override, "node-a");
    parse(&["--hostname-override="]).unwrap().apply_hostname_override(&mut cfg).unwrap();
    assert_eq!(cfg.hostname_override, "node-a");
}
