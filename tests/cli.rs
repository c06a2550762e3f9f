//! The binary's command line: --dry-run on the demo cluster (inside a
//! network namespace this test creates, so node addresses are known, and
//! unprivileged), --write-config-to, and the one-line errors for bad input.

mod common;

use std::process::Command;

use common::{bin, Netns};
use serde::Deserialize;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin()).args(args).output().expect("run kube-proxy-rs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kube-proxy-rs ARGS --write-config-to <a temp file>`: exit code, stdout,
/// stderr and the file written.
fn write_config(args: &[&str]) -> (i32, String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("effective.yaml");
    let (code, stdout, stderr) = run(&[args, &["--write-config-to", out.to_str().unwrap()]].concat());
    (code, stdout, stderr, std::fs::read_to_string(&out).unwrap_or_default())
}

fn demo(path: &str) -> String {
    format!("{}/config/{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn dry_run_prints_the_demo_plan_for_the_namespaces_addresses() {
    let mut ns = Netns::new("kpr-dry");
    ns.veth_to_host("192.168.50.2/24", "192.168.50.1/24");
    let golden = std::fs::read_to_string(demo("../tests/golden/demo-ipvs.txt")).expect("golden file");
    // As nobody: --dry-run needs no privilege and touches nothing.
    let out =
        ns.exec_as_nobody(&[&bin(), "--config", &demo("demo-ipvs.yaml"), "--manifests", &demo("demo"), "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let got = String::from_utf8_lossy(&out.stdout);
    if got != golden {
        let path = std::env::temp_dir().join("demo-ipvs.got.txt");
        let _ = std::fs::write(&path, got.as_bytes());
        panic!("dry-run output differs from tests/golden/demo-ipvs.txt; got {}", path.display());
    }
    // Sections in order, each line of the ipvs section sorted.
    let heads: Vec<&str> = golden.lines().filter(|l| l.starts_with("# ")).collect();
    assert_eq!(heads, ["# ipvs", "# ipset", "# addresses kube-ipvs0", "# iptables"]);
    let ipvs: Vec<&str> = golden.lines().skip(1).take_while(|l| !l.starts_with('#')).collect();
    let mut sorted = ipvs.clone();
    sorted.sort();
    assert_eq!(ipvs, sorted);
    // NodePorts are on the namespace's address, never on loopback.
    assert!(golden.contains("-A -t 192.168.50.2:30080 -s rr"));
    assert!(!golden.contains("127.0.0.1:30080"));
}

/// The arguments of `--dry-run --proxy-mode iptables` on the demo.
fn dry_run_iptables_mode_args() -> Vec<String> {
    let args = ["--dry-run", "--proxy-mode", "iptables", "--hostname-override", "demo-node"];
    [bin(), "--manifests".into(), demo("demo")].into_iter().chain(args.map(String::from)).collect()
}

/// `--dry-run --proxy-mode iptables` on the demo, as root in a fresh
/// namespace `ns` (so both families' iptables answer); stdout and stderr.
fn dry_run_iptables_mode_in(ns: &Netns) -> (String, String) {
    let args = dry_run_iptables_mode_args();
    let out = ns.exec(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "{stderr}");
    (stdout, stderr)
}

/// The text of section `heading` (`# iptables`, `# iptables ipv6`).
fn section<'a>(out: &'a str, heading: &str) -> &'a str {
    let start = out.find(&format!("{heading}\n")).unwrap_or_else(|| panic!("no {heading:?} in:\n{out}"));
    let body = &out[start + heading.len() + 1..];
    let end = body.find("\n# iptables").map_or(body.len(), |i| i + 1);
    &body[..end]
}

#[test]
fn dry_run_in_iptables_mode_prints_one_iptables_section_per_family() {
    let ns = Netns::new("kpr-dryds");
    let (out, err) = dry_run_iptables_mode_in(&ns);
    assert!(out.starts_with("# iptables\n"), "{out}");
    assert!(!out.contains("# ipvs"));
    let heads: Vec<&str> = out.lines().filter(|l| l.starts_with("# iptables")).collect();
    assert_eq!(heads, ["# iptables", "# iptables ipv6"], "{err}");
    for heading in ["# iptables", "# iptables ipv6"] {
        let text = section(&out, heading);
        for want in [":KUBE-SERVICES - [0:0]", "-A KUBE-SERVICES", "COMMIT"] {
            assert!(text.contains(want), "{heading}: missing {want:?}:\n{text}");
        }
        // What a full sync restores on an empty kernel: the jumps from the built-in chains too.
        for jump in kube_proxy_rs::plan::iptables::JUMPS.iter().chain(&kube_proxy_rs::plan::iptables::KUBELET_JUMPS) {
            let line = format!("{}\n", jump.insert_line());
            assert_eq!(text.matches(&line).count(), 1, "{heading}: {line}:\n{text}");
        }
        assert!(text.contains(":KUBE-FIREWALL - [0:0]"), "kubelet's chain declared for its jumps:\n{text}");
    }
    // The demo's Services are IPv4: service chains only there; no localhost NodePorts in IPv6.
    let (v4, v6) = (section(&out, "# iptables"), section(&out, "# iptables ipv6"));
    assert!(v4.contains("KUBE-SVC-") && v4.contains("KUBE-SEP-"), "{v4}");
    assert!(!v6.contains("KUBE-SVC-") && !v6.contains("KUBE-SEP-"), "{v6}");
    assert!(v4.contains("127.0.0.0/8") && !v6.contains("127.0.0.0/8"), "{v6}");
    // As root, with nfnetlink_acct and the nfacct match in this kernel: the
    // counting rules the daemon would write (it would create the objects).
    let invalid = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n";
    assert!(v4.contains(invalid) && v6.contains(invalid), "{out}");
    assert!(v4.contains("-d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts"), "{v4}");
}

/// Without privileges the dry run cannot ask nfnetlink_acct (`EPERM`): the
/// plain rules, and no failure.
#[test]
fn dry_run_in_iptables_mode_as_nobody_prints_rules_without_nfacct() {
    let ns = Netns::new("kpr-drynob");
    let args = dry_run_iptables_mode_args();
    let out = ns.exec_as_nobody(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"), "{stdout}");
    assert!(!stdout.contains("nfacct"), "{stdout}");
}

/// IPv6 switched off in the node's namespace: single-stack, with upstream's log lines.
#[test]
fn dry_run_without_ipv6_plans_the_primary_family_alone_and_says_why() {
    let ns = Netns::new("kpr-dryno6");
    ns.ok(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
    let (out, err) = dry_run_iptables_mode_in(&ns);
    let heads: Vec<&str> = out.lines().filter(|l| l.starts_with("# ")).collect();
    assert_eq!(heads, ["# iptables"], "{out}");
    assert!(err.contains("No kernel support for family") && err.contains("IPv6"), "{err}");
    assert!(err.contains("kube-proxy running in single-stack mode"), "{err}");
}

/// `--dry-run`'s iptables-mode output is accepted by `iptables-restore` and
/// `ip6tables-restore` in a fresh network namespace, as is (both
/// flavours): the input of a full sync from an empty kernel, exactly.
#[test]
fn dry_run_in_iptables_mode_restores_into_an_empty_namespace() {
    let (out, _) = dry_run_iptables_mode_in(&Netns::new("kpr-dryipt"));
    for flavour in ["legacy", "nft"] {
        let ns = Netns::new(&format!("kpr-dryipt-{flavour}"));
        // The daemon creates the nfacct objects its rules name before its first restore.
        let created = ns.block_on(|| async {
            let nfacct = kube_proxy_rs::kernel::nfacct::NetlinkNfacct::new().expect("netfilter netlink socket");
            nfacct.ensure(&kube_proxy_rs::proxier::nfacct::OBJECTS).await
        });
        assert!(created.iter().all(Result::is_ok), "{created:?}");
        for (tool, heading) in [("iptables", "# iptables"), ("ip6tables", "# iptables ipv6")] {
            ns.pipe(&[&format!("{tool}-{flavour}-restore"), "-w", "5", "--noflush"], section(&out, heading));
            let saved = ns.ok(&[&format!("{tool}-{flavour}-save")]);
            assert_eq!(
                saved.matches("-j KUBE-SERVICES").count(),
                4,
                "{tool}: filter FORWARD/OUTPUT, nat OUTPUT/PREROUTING:\n{saved}"
            );
            assert!(saved.contains("-A INPUT -j KUBE-FIREWALL"), "{tool}: {saved}");
        }
    }
}

#[test]
fn a_malformed_manifest_is_named_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: x\n").unwrap();
    for f in ["web.yaml", "node.yaml"] {
        std::fs::copy(demo(&format!("demo/{f}")), dir.path().join(f)).unwrap();
    }
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = run(&["--config", &demo("demo-ipvs.yaml"), "--manifests", d, "--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("bad.yaml"), "the bad file is named: {err}");
    assert!(out.contains("-A -t 10.96.0.20:80 -s rr"), "the good files still count: {out}");
}

fn config_file(body: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    let text = format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}");
    std::fs::write(f.path(), text).unwrap();
    f
}

/// Bad config: exit code 1, one error line naming the field and the value, nothing printed on stdout.
fn assert_config_error(body: &str, field: &str, value: &str) {
    let f = config_file(body);
    let (code, out, err) = run(&["--config", f.path().to_str().unwrap(), "--manifests", &demo("demo"), "--dry-run"]);
    assert_eq!(code, 1, "{body}: {err}");
    assert!(out.is_empty(), "nothing planned or printed: {out}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].contains(field) && lines[0].contains(value), "{body}: {err}");
}

#[test]
fn bad_config_files_fail_with_one_line_naming_field_and_value() {
    assert_config_error("mode: bogus\n", "mode", "bogus");
    assert_config_error("modez: ipvs\n", "modez", "modez");
    assert_config_error("ipvs:\n  syncPeriod: 30x\n", "syncPeriod", "30x");
    assert_config_error("mode: iptables\nclusterCIDR: 10.244.0.0/33\n", "clusterCIDR", "10.244.0.0/33");
}

#[test]
fn bad_flags_fail_with_exit_code_1() {
    let (code, _, err) = run(&["--proxy-mode", "bogus", "--dry-run", "--manifests", &demo("demo")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("bogus"), "{err}");
    let (code, _, err) = run(&["--ipvs-sync-period", "soon"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("soon"), "{err}");
}

#[test]
fn write_config_to_writes_the_effective_config_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("effective.yaml");
    let (code, _, err) = run(&["--config", &demo("demo-ipvs.yaml"), "--write-config-to", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).unwrap();
    for want in
        ["mode: ipvs", "metricsBindAddress: 127.0.0.1:10249", "healthzBindAddress: 0.0.0.0:10256", "syncPeriod: 30s"]
    {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // The written file is itself a valid config.
    let again = dir.path().join("again.yaml");
    let (code, _, err) = run(&["--config", out.to_str().unwrap(), "--write-config-to", again.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&again).unwrap(), text);
}

/// The host kernel (and CI's) has no IPVS: the daemon says so in one line and exits 1.
#[test]
fn ipvs_mode_without_ipvs_in_the_kernel_exits_with_one_line() {
    assert!(!std::path::Path::new("/proc/net/ip_vs").exists(), "this test expects a kernel without IPVS");
    let (code, out, err) =
        run(&["--proxy-mode", "ipvs", "--manifests", &demo("demo"), "--hostname-override", "demo-node"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty());
    let errors: Vec<&str> = err.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].contains("IPVS is not available in this kernel: load the ip_vs module, or choose another mode (the config file's `mode`, or --proxy-mode when there is no --config)"),
        "{err}"
    );
    assert!(err.contains(kube_proxy_rs::config::IPVS_DEPRECATED), "upstream's deprecation warning: {err}");
}

/// A `--manifests` path that is missing or a file: exit 1 with one line
/// naming it, before anything touches the node: no sysctl set, no port
/// bound (each HTTP server logs a `serving HTTP` line when it binds; one
/// line in all means none did).
#[test]
fn a_bad_manifests_path_is_refused_before_touching_the_node() {
    let ns = Netns::new("kpr-badm");
    let file = tempfile::NamedTempFile::new().unwrap();
    let missing = "/nonexistent/kube-proxy-rs-manifests";
    for path in [missing, file.path().to_str().unwrap()] {
        let daemon = [&bin(), "--proxy-mode", "iptables", "--manifests", path, "--hostname-override", "n"];
        let out = ns.exec(&[&["timeout", "20"][..], &daemon[..]].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{path}: {err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].contains("--manifests") && lines[0].contains(path), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let localnet = ns.ok(&["sysctl", "-n", "net.ipv4.conf.all.route_localnet"]);
    assert_eq!(localnet.trim(), "0", "route_localnet untouched");
}

/// A second daemon names the first by the PID the first has in the
/// second's PID namespace (`SO_PEERCRED`), not by the one the first has in
/// its own: here the first runs in a PID namespace of its own, as in a pod,
/// where it is PID 1.
#[test]
fn a_second_daemon_names_a_first_in_another_pid_namespace_by_its_pid_here() {
    let ns = Netns::new("kpr-pidns");
    let dir = tempfile::tempdir().unwrap();
    let daemon =
        [&bin(), "--proxy-mode", "iptables", "--manifests", dir.path().to_str().unwrap(), "--hostname-override", "n"];
    // --kill-child: the daemon goes with unshare, which the guard kills whatever happens.
    let unshare = ["ip", "netns", "exec", &ns.name, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc"];
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let first = Kill(
        Command::new(unshare[0])
            .args(&unshare[1..])
            .args(daemon)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("unshare"),
    );
    let children = format!("/proc/{0}/task/{0}/children", first.0.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let pid = loop {
        let pid = std::fs::read_to_string(&children).unwrap_or_default().trim().to_string();
        let bound = ns.ok(&["cat", "/proc/net/unix"]).contains("@kube-proxy-rs");
        if bound && !pid.is_empty() {
            break pid;
        }
        assert!(std::time::Instant::now() < deadline, "the first daemon never bound @kube-proxy-rs");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let out = ns.exec(&[&["timeout", "20"][..], &daemon[..]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("another kube-proxy-rs (pid {pid}) already runs in this network namespace")),
        "{err}"
    );
}

/// `--dry-run` without `--manifests` lists the objects once from the API
/// server (`--master`, the test API server in the namespace) and prints the
/// same plan as for the same objects as files.
#[test]
fn dry_run_from_the_cluster_prints_the_plan_of_the_same_objects_as_files() {
    let mut ns = Netns::new("kpr-dryapi");
    ns.veth_to_host("192.168.50.2/24", "192.168.50.1/24");
    let (api, _serving) = ns.api_server();
    let mut objects = 0;
    for entry in std::fs::read_dir(demo("demo")).expect("the demo manifests") {
        let path = entry.expect("a demo file").path();
        let text = std::fs::read_to_string(&path).expect("read a demo file");
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc).expect("a YAML document");
            let items = match value.get("kind").and_then(|k| k.as_str()) {
                Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
                Some(_) => vec![value],
                None => Vec::new(),
            };
            for item in items {
                api.create(&item).unwrap_or_else(|e| panic!("create from {}: {e:?}", path.display()));
                objects += 1;
            }
        }
    }
    assert!(objects >= 5, "the demo has a node, services and slices: {objects}");
    let config = demo("demo-ipvs.yaml");
    let files = ns.exec(&[&bin(), "--config", &config, "--manifests", &demo("demo"), "--dry-run"]);
    let cluster = ns.exec(&[&bin(), "--config", &config, "--master", &api.url(), "--dry-run"]);
    assert_eq!(cluster.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&cluster.stderr));
    let (files, cluster) = (String::from_utf8_lossy(&files.stdout), String::from_utf8_lossy(&cluster.stdout));
    assert!(files.contains("-A -t 192.168.50.2:30080 -s rr"), "{files}");
    assert_eq!(cluster, files, "the same plan from the API server as from the files");
    // nftables mode: the demo's ServiceCIDR, listed from the API server,
    // drops unallocated ClusterIPs as the file does.
    let (bin, dir, url) = (bin(), demo("demo"), api.url());
    let nft = ["--proxy-mode", "nftables", "--dry-run", "--hostname-override", "demo-node"];
    let files = ns.exec(&[&[bin.as_str(), "--manifests", &dir][..], &nft].concat());
    let cluster = ns.exec(&[&[bin.as_str(), "--master", &url][..], &nft].concat());
    assert_eq!(cluster.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&cluster.stderr));
    let (files, cluster) = (String::from_utf8_lossy(&files.stdout), String::from_utf8_lossy(&cluster.stdout));
    let drop = "cluster-ips-check ip daddr { 10.96.0.0/12 } drop comment \"Drop traffic to unallocated ClusterIPs\"";
    assert!(files.contains(drop), "{files}");
    assert_eq!(cluster, files, "the same nftables plan from the API server as from the files");
    let requests = api.requests();
    assert!(requests.iter().all(|r| !r.contains("watch=")), "one list per kind, no watch: {requests:?}");
}

/// The demo's iptables-mode rules written into `ns` by the tools, as a
/// node running upstream's iptables mode holds them: `iptables-restore`
/// (and `ip6tables-restore`) of the dry run's own sections, which follow
/// upstream's format, through `tool` (`iptables` or `iptables-legacy`).
fn write_iptables_mode_rules(ns: &Netns, out: &str, tool: &str) {
    let created = ns.block_on(|| async {
        let nfacct = kube_proxy_rs::kernel::nfacct::NetlinkNfacct::new().expect("netfilter netlink socket");
        nfacct.ensure(&kube_proxy_rs::proxier::nfacct::OBJECTS).await
    });
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    let v6 = tool.replacen("iptables", "ip6tables", 1);
    ns.pipe(&[&format!("{tool}-restore"), "-w", "5", "--noflush"], section(out, "# iptables"));
    ns.pipe(&[&format!("{v6}-restore"), "-w", "5", "--noflush"], section(out, "# iptables ipv6"));
}

/// `--dry-run --diff` in `ns` with `args` (the dry run's own besides).
fn dry_run_diff_in(ns: &Netns, manifests: &str, mode: &str) -> String {
    let args =
        ["--manifests", manifests, "--dry-run", "--diff", "--proxy-mode", mode, "--hostname-override", "demo-node"];
    let out = ns.exec(&[&[bin().as_str()][..], &args].concat());
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    stdout.into_owned()
}

/// The summary's line for `section` (`iptables nft`): (add, remove, kept).
fn summary_of(diff: &str, section: &str) -> (usize, usize, usize) {
    let summary = diff.split("# summary\n").nth(1).unwrap_or_else(|| panic!("no summary:\n{diff}"));
    let line = summary
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{section}: ")))
        .unwrap_or_else(|| panic!("no {section:?} in the summary:\n{summary}"));
    let n: Vec<usize> = line.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    (n[0], n[1], n[2])
}

/// The migration preview in a namespace holding upstream-format iptables
/// rules written by the tools: the same objects in the same mode change
/// nothing; a Service gone is listed as removed, with its chains; IPVS mode
/// asked instead lists iptables mode's chains removed and IPVS mode's
/// sets, servers, addresses and chains added; the backend `iptables` does
/// not use is read and its rules of kube-proxy's named. The node's rules
/// are not changed by the preview.
#[test]
fn dry_run_diff_previews_what_the_first_sync_would_change() {
    let ns = Netns::new("kpr-diff");
    let (out, _) = dry_run_iptables_mode_in(&ns);
    let version = ns.ok(&["iptables", "--version"]);
    let (used, unused) = if version.contains("nf_tables") { ("nft", "legacy") } else { ("legacy", "nft") };
    write_iptables_mode_rules(&ns, &out, "iptables");
    let before = ns.ok(&["iptables-save"]);

    // The same objects, the same mode: nothing to add or remove anywhere.
    let same = dry_run_diff_in(&ns, &demo("demo"), "iptables");
    let summary = same.split("# summary\n").nth(1).expect("a summary");
    for line in summary.lines() {
        assert!(line.contains(": 0 to add, 0 to remove,"), "{line}\n{same}");
    }
    let (_, _, kept) = summary_of(&same, &format!("iptables {used}"));
    assert!(kept > 100, "{same}");
    assert!(!same.lines().any(|l| l.starts_with("+-A") || l.starts_with("--A")), "{same}");

    // kube-dns gone from the manifests: its rules and chains removed, nothing added.
    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["edge-cases.yaml", "exposed.yaml", "node.yaml", "web.yaml"] {
        std::fs::copy(demo(&format!("demo/{f}")), dir.path().join(f)).expect("copy a manifest");
    }
    let gone = dry_run_diff_in(&ns, dir.path().to_str().expect("utf-8 path"), "iptables");
    let (added, removed, _) = summary_of(&gone, &format!("iptables {used}"));
    assert_eq!(added, 0, "{gone}");
    assert!(removed >= 6, "{gone}");
    let services: Vec<&str> = gone.lines().filter(|l| l.starts_with("--A KUBE-SERVICES ")).collect();
    assert!(!services.is_empty() && services.iter().all(|l| l.contains("kube-system/kube-dns")), "{gone}");
    assert!(gone.lines().any(|l| l.starts_with("-:KUBE-SVC-")) && gone.lines().any(|l| l.starts_with("-:KUBE-SEP-")));

    // A mode switch: iptables mode's chains go, IPVS mode's state comes.
    let switch = dry_run_diff_in(&ns, &demo("demo"), "ipvs");
    for want in ["-:KUBE-EXTERNAL-SERVICES", "-:KUBE-NODEPORTS", "+:KUBE-LOAD-BALANCER", "+:KUBE-IPVS-FILTER"] {
        assert!(switch.lines().any(|l| l == want), "no {want:?}:\n{switch}");
    }
    assert!(switch.lines().any(|l| l.starts_with("-:KUBE-SVC-")), "{switch}");
    let steps = "# mode switch\nfirst: ipvs mode's first sync, complete and committed\n\
                 then: remove iptables mode's iptables jumps and chains (keeping those ipvs mode writes too)\n";
    assert!(switch.starts_with(steps), "the switch's steps first:\n{switch}");
    assert!(!gone.contains("# mode switch"), "no switch in the same mode:\n{gone}");
    assert!(switch.contains("\n+create KUBE-CLUSTER-IP hash:ip,port family inet"), "{switch}");
    assert!(switch.contains("\n+add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n"), "{switch}");
    assert!(switch.contains("\n+-A -u 10.96.0.10:53 -s rr\n"), "{switch}");
    assert!(switch.contains("# addresses kube-ipvs0\n+10.96.0.10\n") || switch.contains("\n+10.96.0.10\n"));
    let (added, removed, _) = summary_of(&switch, &format!("iptables {used}"));
    assert!(added > 10 && removed > 10, "{switch}");

    // The other backend holding kube-proxy's rules too: named, not touched.
    write_iptables_mode_rules(&ns, &out, &format!("iptables-{unused}"));
    let both = dry_run_diff_in(&ns, &demo("demo"), "iptables");
    assert!(both.contains(&format!("in iptables-{unused} are not touched and stay active")), "{both}");
    assert_eq!(summary_of(&both, &format!("iptables {used}")).0, 0, "{both}");

    // Read-only: the node's rules are as the tools left them.
    assert_eq!(
        ns.ok(&["iptables-save"]).lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>(),
        before.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>()
    );
}

/// The migration preview in nftables mode, in a namespace holding the
/// table `nft -f` wrote from the dry run's text (upstream's own way of
/// writing it): the same objects change nothing; kube-dns gone from the
/// manifests lists exactly its rules, chains and elements as removed; a
/// switch to iptables mode lists the whole table as removed. The table is
/// only read.
#[test]
fn dry_run_diff_previews_nftables_mode() {
    let ns = Netns::new("kpr-diff-nft");
    let args =
        ["--manifests", &demo("demo"), "--dry-run", "--proxy-mode", "nftables", "--hostname-override", "demo-node"];
    let out = ns.exec(&[&[bin().as_str()][..], &args].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // Both families' tables (the namespace has IPv6: the daemon would run both).
    for heading in ["# nftables", "# nftables ipv6"] {
        let text: String = stdout
            .lines()
            .skip_while(|l| *l != heading)
            .skip(1)
            .take_while(|l| !l.starts_with("# "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(text.starts_with("add table ip"), "{heading}: {stdout}");
        ns.pipe(&["nft", "-f", "-"], &text);
    }
    let before = ns.ok(&["nft", "list", "ruleset"]);

    let same = dry_run_diff_in(&ns, &demo("demo"), "nftables");
    let summary = same.split("# summary\n").nth(1).expect("a summary");
    assert_eq!(summary.lines().count(), 4, "nftables and conntrack, per family: {same}");
    for line in summary.lines() {
        assert!(line.contains(": 0 to add, 0 to remove,"), "{line}\n{same}");
    }
    assert!(summary_of(&same, "nftables").2 > 100, "{same}");

    let dir = tempfile::tempdir().expect("temp dir");
    for f in ["edge-cases.yaml", "exposed.yaml", "node.yaml", "web.yaml", "service-cidr.yaml"] {
        std::fs::copy(demo(&format!("demo/{f}")), dir.path().join(f)).expect("copy a manifest");
    }
    let gone = dry_run_diff_in(&ns, dir.path().to_str().expect("utf-8 path"), "nftables");
    let (added, removed, _) = summary_of(&gone, "nftables");
    assert_eq!(added, 0, "{gone}");
    assert!(removed >= 4, "{gone}");
    let changed: Vec<&str> = gone.lines().filter(|l| l.starts_with('+') || l.starts_with('-')).collect();
    assert_eq!(changed.len(), removed, "{gone}");
    assert!(changed.iter().all(|l| l.contains("kube-system/kube-dns") || l.contains("10.96.0.10")), "{gone}");
    assert!(changed.iter().any(|l| l.starts_with("-chain ip kube-proxy service-")), "{gone}");
    assert!(changed.iter().any(|l| l.starts_with("-element ip kube-proxy service-ips { 10.96.0.10 . ")), "{gone}");

    let switch = dry_run_diff_in(&ns, &demo("demo"), "iptables");
    let (added, removed, kept) = summary_of(&switch, "nftables");
    assert_eq!((added, kept), (0, 0), "{switch}");
    assert!(removed > 100 && switch.contains("nftables mode's table: removed by the switch"), "{switch}");

    assert_eq!(ns.ok(&["nft", "list", "ruleset"]), before, "only read");
}

/// The migration preview lists the live UDP conntrack entries the first
/// sync's reconcile deletes: in a namespace where one flow to kube-dns's
/// ClusterIP was DNATed to an address that is none of its endpoints and
/// another to its endpoint 10.244.0.5:53, the first is removed and the
/// second kept. The table is only read.
#[test]
fn dry_run_diff_lists_the_conntrack_entries_the_first_sync_deletes() {
    let ns = Netns::new("kpr-diff-ct");
    for a in ["10.0.0.1", "10.96.0.10", "10.244.9.9", "10.244.0.5"] {
        ns.ok(&["ip", "addr", "add", &format!("{a}/32"), "dev", "lo"]);
    }
    let flows = [(40001, "10.244.9.9:53"), (40002, "10.244.0.5:53")];
    for (sport, to) in flows {
        let sport = sport.to_string();
        let rule = ["-t", "nat", "-A", "OUTPUT", "-p", "udp", "-d", "10.96.0.10", "--dport", "53", "--sport", &sport];
        ns.ok(&[&["iptables"][..], &rule, &["-j", "DNAT", "--to-destination", to]].concat());
    }
    ns.run(|| {
        for (sport, _) in flows {
            let s = std::net::UdpSocket::bind(("10.0.0.1", sport)).expect("bind");
            s.send_to(b"?", "10.96.0.10:53").expect("send");
        }
    });
    let diff = dry_run_diff_in(&ns, &demo("demo"), "iptables");
    let removed: Vec<&str> = section(&diff, "# conntrack").lines().filter(|l| l.starts_with("-udp")).collect();
    let stale =
        "-udp src=10.0.0.1 dst=10.96.0.10 sport=40001 dport=53 src=10.244.9.9 dst=10.0.0.1 sport=53 dport=40001";
    assert_eq!(removed, [stale], "{diff}");
    assert_eq!(summary_of(&diff, "conntrack"), (0, 1, 1), "{diff}");
    let left = ns.ok(&["conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.0.10"]);
    assert_eq!(left.lines().count(), 2, "only read: {left}");
}

#[test]
fn diff_without_dry_run_is_refused() {
    let (code, _, err) = run(&["--diff", "--manifests", &demo("demo")]);
    assert_eq!(code, 1);
    assert!(err.contains("--diff needs --dry-run"), "{err}");
}

/// As the daemon: `conntrack.tcpBeLiberal` (here its flag), or the
/// namespace's `nf_conntrack_tcp_be_liberal` already 1, means no
/// INVALID-drop rule (upstream's proxier reads the sysctl).
#[test]
fn dry_run_in_iptables_mode_drops_no_invalid_packets_when_tcp_is_liberal() {
    let ns = Netns::new("kpr-drylib");
    let invalid = "--ctstate INVALID";
    let (plain, _) = dry_run_iptables_mode_in(&ns);
    assert!(plain.contains(invalid), "{plain}");
    let mut args = dry_run_iptables_mode_args();
    args.push("--conntrack-tcp-be-liberal=true".into());
    let flagged = ns.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!flagged.contains(invalid), "{flagged}");
    ns.ok(&["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=1"]);
    let (read, _) = dry_run_iptables_mode_in(&ns);
    assert!(!read.contains(invalid), "{read}");
}

/// An unknown feature gate is refused at start, from the flag and from the
/// config file alike: exit 1, one line with upstream's message; nothing
/// is planned or printed. So are a locked gate set away from its default
/// and a gate Kubernetes removed by 1.36.
#[test]
fn an_unknown_feature_gate_is_refused_from_flags_and_file() {
    let demo_dir = demo("demo");
    let flag = ["--feature-gates", "NoSuchGate=true", "--dry-run", "--manifests", &demo_dir];
    let file = config_file("featureGates:\n  NoSuchGate: true\n");
    let from_file = ["--config", file.path().to_str().unwrap(), "--dry-run", "--manifests", &demo_dir];
    for args in [&flag[..], &from_file[..]] {
        let (code, out, err) = run(args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(out.is_empty(), "{out}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(lines[0].contains("unrecognized feature gate: NoSuchGate"), "{err}");
    }
    let locked = ["--feature-gates=MultiCIDRServiceAllocator=false", "--dry-run", "--manifests", &demo_dir];
    let (code, _, err) = run(&locked);
    assert_eq!(code, 1, "{err}");
    let refusal = "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true";
    assert!(err.contains(refusal), "{err}");
    // Removed in 1.36, so unknown to it.
    let (code, _, err) = run(&["--feature-gates=TopologyAwareHints=true", "--dry-run", "--manifests", &demo_dir]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unrecognized feature gate: TopologyAwareHints"), "{err}");
}

/// KubeProxyIPVS=false refuses IPVS mode before anything runs, naming the
/// modes left; the other modes run.
#[test]
fn kube_proxy_ipvs_off_refuses_ipvs_mode() {
    let demo_dir = demo("demo");
    let base = ["--feature-gates=KubeProxyIPVS=false", "--dry-run", "--manifests", &demo_dir];
    let (code, out, err) = run(&[&base[..], &["--proxy-mode=ipvs"]].concat());
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains(r#"mode: Invalid value: "ipvs": must be iptables, nftables or blank"#),
        "upstream's list of the modes left: {err}"
    );
    let (code, out, err) = run(&[&base[..], &["--proxy-mode=iptables", "--hostname-override=demo-node"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("# iptables"), "{out}");
}

/// An unset mode runs iptables mode with upstream 1.37's warning; a mode
/// given says nothing of it.
#[test]
fn an_unset_mode_is_warned_about() {
    let (code, _, err, written) = write_config(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(kube_proxy_rs::config::UNSET_MODE_WARNING), "{err}");
    assert!(written.contains("mode: iptables"), "{written}");
    let (code, _, err, _) = write_config(&["--proxy-mode=iptables"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("No proxy mode specified"), "{err}");
}

/// `--logging-format=json`, and `logging.format: json` in the config file,
/// write klog's JSON lines: `ts` (milliseconds), `caller`, `msg`, `v`, then
/// the key/values; an error line carries `err` and no `v`.
#[test]
fn json_logs_have_klogs_field_names_from_the_flag_and_the_file() {
    let file = config_file("mode: iptables\nlogging:\n  format: json\n");
    let from_flag = ["--proxy-mode=iptables", "--logging-format=json"];
    let from_file = ["--config", file.path().to_str().unwrap()];
    for args in [&from_flag[..], &from_file[..]] {
        let (code, _, err, _) = write_config(args);
        assert_eq!(code, 0, "{err}");
        let wrote = err.lines().find(|l| l.contains("wrote the effective configuration")).expect(&err);
        let v: serde_json::Value = serde_json::from_str(wrote).unwrap_or_else(|e| panic!("{e}: {wrote}"));
        assert!(v["ts"].as_f64().is_some_and(|ts| ts > 1.7e12), "{wrote}");
        assert!(v["caller"].as_str().is_some_and(|c| c.starts_with("src/main.rs:")), "{wrote}");
        assert_eq!((v["msg"].as_str(), v["v"].as_u64()), (Some("wrote the effective configuration"), Some(0)));
        assert!(v["path"].as_str().is_some_and(|p| p.ends_with("effective.yaml")), "{wrote}");
        let keys: Vec<&str> = ["\"ts\"", "\"caller\"", "\"msg\"", "\"v\"", "\"path\""]
            .into_iter()
            .filter(|k| wrote.contains(k))
            .collect();
        assert_eq!(keys.len(), 5, "{wrote}");
        let pos: Vec<usize> = keys.iter().map(|k| wrote.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "klog's order: {wrote}");
    }
    let (code, _, err) = run(&["--logging-format=json", "--feature-gates=NoSuchGate=true"]);
    assert_eq!(code, 1, "{err}");
    let v: serde_json::Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["msg"].as_str(), Some("failed complete: unrecognized feature gate: NoSuchGate"), "{err}");
    assert!(v.get("v").is_none(), "{err}");
}

/// `-v` and `logging.verbosity` in the file: 2 shows debug lines (here the
/// one that says the configuration is loaded), the default 0 does not.
#[test]
fn verbosity_from_the_flag_and_the_file_shows_debug_lines() {
    let quiet = config_file("mode: iptables\n");
    let verbose = config_file("mode: iptables\nlogging:\n  verbosity: 2\n");
    let with = |args: &[&str]| {
        let (code, _, err, _) = write_config(args);
        assert_eq!(code, 0, "{err}");
        err.contains("configuration loaded")
    };
    assert!(!with(&["--proxy-mode=iptables"]), "v=0: no debug line");
    assert!(with(&["--proxy-mode=iptables", "-v", "2"]), "-v 2");
    assert!(!with(&["--config", quiet.path().to_str().unwrap()]), "file without verbosity");
    assert!(with(&["--config", verbose.path().to_str().unwrap()]), "the file's logging.verbosity: 2");
}

/// `logging.options.json.splitStream` (beta, on by default) and
/// `logging.options.text.splitStream` (alpha: with LoggingAlphaOptions),
/// from the file or `--log-*-split-stream`, send the format's info lines to
/// stdout and keep errors on stderr.
#[test]
fn split_stream_sends_info_lines_to_stdout() {
    let json =
        config_file("mode: iptables\nlogging:\n  format: json\n  options:\n    json:\n      splitStream: true\n");
    let text = config_file(
        "mode: iptables\nfeatureGates:\n  LoggingAlphaOptions: true\nlogging:\n  options:\n    text:\n      splitStream: true\n",
    );
    let plain = config_file("mode: iptables\n");
    let (json, text, plain) =
        (json.path().to_str().unwrap(), text.path().to_str().unwrap(), plain.path().to_str().unwrap());
    let cases: [(&[&str], bool); 5] = [
        (&["--config", json], true),
        (&["--config", text], true),
        (&["--config", plain], false),
        // The flags, over a file too, as the other logging flags.
        (&["--config", plain, "--logging-format=json", "--log-json-split-stream"], true),
        (&["--proxy-mode=iptables", "--log-json-split-stream"], false),
    ];
    for (args, split) in cases {
        let (code, stdout, stderr, _) = write_config(args);
        assert_eq!(code, 0, "{stderr}");
        let wrote = "wrote the effective configuration";
        assert_eq!(stdout.contains(wrote), split, "stdout: {stdout}");
        assert_eq!(stderr.contains(wrote), !split, "stderr: {stderr}");
    }
    // An error after the file's logging applies (--diff without --dry-run) stays on stderr.
    let (code, stdout, stderr) = run(&["--config", json, "--diff"]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty() && stderr.contains("--diff needs --dry-run"), "{stdout} / {stderr}");
}
