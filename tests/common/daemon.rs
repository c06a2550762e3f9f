//! The daemon binary under test, as `iptables_daemon` and `nftables_daemon`
//! run it: a child process in the node namespace with its log in a file,
//! stopped with SIGTERM (exit 0 asserted), killed by a guard if a panicking
//! test left it running (its log printed then); its dashboard's sync list
//! and `/metrics` read over the metrics port.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::apiserver::ApiServer;
use super::lab::{addr, BACKEND_PORT};
use super::Netns;

/// Polls `f` every 100 ms until it succeeds; panics with its last error after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => panic!("timed out after {timeout:?} waiting for {what}: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One entry of the dashboard's sync list.
#[derive(Debug, Clone)]
pub struct SyncRec {
    pub generation: u64,
    pub full: bool,
    pub periodic: bool,
    pub ops: u64,
    pub ports_changed: u64,
    pub failed: u64,
}

/// The primary family's syncs in the dashboard's sync list of the daemon
/// in `node`, newest first.
pub fn syncs(node: &Netns) -> Result<Vec<SyncRec>, String> {
    let body = http_get(node, "/dashboard/data")?;
    let data: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    let primary = &data["about"]["families"][0];
    let syncs = data["syncs"].as_array().ok_or_else(|| format!("no syncs in {data}"))?;
    Ok(syncs
        .iter()
        .filter(|s| &s["family"] == primary)
        .map(|s| SyncRec {
            generation: s["generation"].as_u64().unwrap(),
            full: s["full"].as_bool().unwrap(),
            periodic: s["periodic"].as_bool().unwrap(),
            ops: s["ops"].as_u64().unwrap(),
            ports_changed: s["ports_changed"].as_u64().unwrap_or(0),
            failed: s["failed"].as_u64().unwrap(),
        })
        .collect())
}

/// `/metrics` of the daemon in `node`: the sum of `family`'s samples
/// (`ip_family="IPv4"`) named `name`; `None` if there is none.
pub fn family_metric(node: &Netns, name: &str, family: &str) -> Option<f64> {
    let text = http_get(node, "/metrics").unwrap_or_else(|e| panic!("/metrics: {e}"));
    let label = format!("ip_family=\"{family}\"");
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') && rest.contains(&label)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (!samples.is_empty()).then(|| samples.iter().sum())
}

/// A running daemon; SIGTERMed (then SIGKILLed) on drop if still running,
/// and its log printed if the test is failing.
pub struct Daemon {
    pub child: Option<Child>,
    pub log: PathBuf,
    pub node: String,
}

impl Daemon {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the log) if the daemon exited.
    pub fn assert_running(&mut self) {
        let child = self.child.as_mut().expect("daemon was started");
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the daemon in {} exited ({status}); log:\n{}", self.node, self.log());
        }
    }

    /// Waits up to `timeout` for the daemon to exit by itself; panics
    /// (the log is printed on drop) if it keeps running.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("daemon was started");
        wait_for("the daemon to exit", timeout, || child.try_wait().unwrap().ok_or_else(|| "running".to_string()))
    }

    /// SIGHUP: the daemon reloads its config file.
    pub fn reload(&self) {
        let pid = self.child.as_ref().expect("daemon running").id().to_string();
        let sent = Command::new("kill").args(["-HUP", &pid]).status().expect("run kill");
        assert!(sent.success(), "kill -HUP {pid}");
    }

    /// SIGTERM; the daemon must exit 0 within 10 s. Returns its log.
    pub fn stop(mut self) -> String {
        let status = terminate(self.child.take().expect("daemon running"), Duration::from_secs(10));
        let log = self.log();
        assert_eq!(status.and_then(|s| s.code()), Some(0), "SIGTERM: clean exit; log:\n{log}");
        assert!(log.contains("kernel state left in place"), "{log}");
        log
    }
}

/// `status` field `field` (`VmHWM`, `VmRSS`) of `pid`, in kB.
pub fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = (status.lines())
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// Starts `command` (the daemon's, run in `node`) with its output in `log`.
pub fn spawn(mut command: Command, node: &Netns, log: PathBuf) -> Daemon {
    let out = std::fs::File::create(&log).unwrap();
    let err = out.try_clone().unwrap();
    let child = command
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start kube-proxy-rs");
    Daemon { child: Some(child), log, node: node.name.clone() }
}

/// SIGTERM, then SIGKILL after `grace`; the exit status if it exited in time.
pub fn terminate(mut child: Child, grace: Duration) -> Option<std::process::ExitStatus> {
    if let Ok(Some(s)) = child.try_wait() {
        return Some(s);
    }
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child, Duration::from_secs(5));
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log {} ----\n{}---- end of daemon log ----", self.log.display(), self.log());
        }
    }
}

/// `GET path` on the daemon's metrics server (127.0.0.1:10249 in `ns`): the body of a 200.
pub fn http_get(ns: &Netns, path: &str) -> Result<String, String> {
    let (head, body) = http_exchange(ns, 10249, path)?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head);
    }
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return Err(format!("chunked bodies are not parsed here: {head}"));
    }
    Ok(body)
}

/// `GET path` on `127.0.0.1:port` in `ns`, one connection: the response's
/// head and body.
pub fn http_exchange(ns: &Netns, port: u16, path: &str) -> Result<(String, String), String> {
    http_exchange_with(ns, port, path, "")
}

/// [`http_exchange`] with extra request header lines (each ending in `\r\n`).
pub fn http_exchange_with(ns: &Netns, port: u16, path: &str, headers: &str) -> Result<(String, String), String> {
    ns.run(|| {
        let mut s = TcpStream::connect_timeout(&addr(&format!("127.0.0.1:{port}")), Duration::from_secs(1))
            .map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Connection: close\r\n\r\n")
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text).map_err(|e| format!("read: {e}"))?;
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no header end: {text}"))?;
        Ok((head.to_string(), body.to_string()))
    })
}

/// Creates every item of a `List` manifest (e.g. [`dual_stack_service_manifest`]'s) in `api`.
pub fn create_items(api: &ApiServer, list: &Value) {
    for item in list["items"].as_array().expect("a List's items") {
        api.create(item).unwrap_or_else(|e| panic!("create {item}: {e:?}"));
    }
}

/// NodePort Service `default/<name>` with `cluster_ips` (their families, in
/// order, are its ipFamilies; two make it RequireDualStack), ports `http`
/// 80/TCP and `dns` 80/UDP to 8080 on `node_port`, and one EndpointSlice
/// per family with the named backends (ready, on this node).
pub fn dual_stack_service_manifest(name: &str, cluster_ips: &[&str], node_port: u16, backends: &[&str]) -> Value {
    let ports = [("http", "TCP", 80, BACKEND_PORT, node_port), ("dns", "UDP", 80, BACKEND_PORT, node_port)];
    service_manifest(name, "NodePort", cluster_ips, &ports, &[], backends)
}

/// A Service port: (name, protocol, port, targetPort, nodePort; 0 for none).
pub type PortSpec<'a> = (&'a str, &'a str, u16, u16, u16);

/// Service `default/<name>` of type `kind` with `cluster_ips` (their
/// families, in order, are its ipFamilies; two make it RequireDualStack),
/// `ports`, the LoadBalancer ingress IPs `lb_ips`, and one EndpointSlice per
/// family with the named backends (ready, on this node) on the ports'
/// target ports.
pub fn service_manifest(
    name: &str,
    kind: &str,
    cluster_ips: &[&str],
    ports: &[PortSpec],
    lb_ips: &[&str],
    backends: &[&str],
) -> Value {
    let family = |ip: &str| if ip.contains(':') { "IPv6" } else { "IPv4" };
    let families: Vec<&str> = cluster_ips.iter().map(|ip| family(ip)).collect();
    let policy = if cluster_ips.len() == 2 { "RequireDualStack" } else { "SingleStack" };
    let service_ports: Vec<Value> = ports
        .iter()
        .map(|(port_name, protocol, port, target, node_port)| {
            let mut p = json!({"name": port_name, "protocol": protocol, "port": port, "targetPort": target});
            if *node_port != 0 {
                p["nodePort"] = json!(node_port);
            }
            p
        })
        .collect();
    let mut service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "type": kind, "clusterIP": cluster_ips[0], "clusterIPs": cluster_ips,
            "ipFamilies": families, "ipFamilyPolicy": policy, "ports": service_ports,
        },
    });
    if !lb_ips.is_empty() {
        let ingress: Vec<Value> = lb_ips.iter().map(|ip| json!({"ip": ip})).collect();
        service["status"] = json!({"loadBalancer": {"ingress": ingress}});
    }
    let mut items = vec![service];
    let slice_ports: Vec<Value> = ports
        .iter()
        .map(|(port_name, protocol, _, target, _)| json!({"name": port_name, "protocol": protocol, "port": target}))
        .collect();
    for fam in families {
        let endpoints: Vec<Value> = backends
            .iter()
            .map(|b| {
                let n: usize = b[1..].parse().unwrap();
                let ip = if fam == "IPv6" { format!("fd00:244:{n}::2") } else { format!("10.244.{n}.2") };
                json!({"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": "node-a"})
            })
            .collect();
        items.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-{}", fam.to_lowercase()), "namespace": "default",
                "labels": {"kubernetes.io/service-name": name,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": fam,
            "ports": slice_ports,
            "endpoints": endpoints,
        }));
    }
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
}

/// [`dual_stack_service_manifest`]'s Service with ClientIP session
/// affinity (`timeout_seconds`): its clients stick to one endpoint.
pub fn sticky_service_manifest(
    name: &str,
    cluster_ips: &[&str],
    node_port: u16,
    backends: &[&str],
    timeout_seconds: u32,
) -> Value {
    let mut list = dual_stack_service_manifest(name, cluster_ips, node_port, backends);
    let spec = &mut list["items"][0]["spec"];
    spec["sessionAffinity"] = json!("ClientIP");
    spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout_seconds}});
    list
}

/// `--dry-run --diff` with `--config CONFIG --manifests MANIFESTS`, run by
/// `run` (a lab's way to run the binary in its node), twice a second
/// apart: its output, after checking that every section has nothing to add
/// or remove and that both runs print the same.
pub fn preview_twice_unchanged(run: impl Fn(&[&str]) -> Output, config: &Path, manifests: &Path) -> String {
    let (config, manifests) = (config.to_str().expect("utf-8"), manifests.to_str().expect("utf-8"));
    let preview = || {
        let out = run(&["--config", config, "--manifests", manifests, "--dry-run", "--diff"]);
        assert!(out.status.success(), "--dry-run --diff: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = preview();
    let summary = first.split("# summary\n").nth(1).unwrap_or_else(|| panic!("no summary:\n{first}"));
    assert!(summary.lines().count() > 0, "{first}");
    for line in summary.lines() {
        assert!(line.contains(": 0 to add, 0 to remove,"), "{line}\n{first}");
    }
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(preview(), first, "the same preview a second later");
    first
}

/// A LoadBalancer Service of the source-range tests (both modes).
pub struct SourceRangeCase {
    pub name: &'static str,
    cluster_ip: &'static str,
    pub node_port: u16,
    /// The ingress IP as the manifest writes it.
    written_vip: &'static str,
    /// The same, as traffic addresses it.
    pub vip: &'static str,
    ranges: &'static [&'static str],
    /// The lab's client (192.168.50.10) reaches the load balancer IP.
    pub admitted: bool,
}

/// The source-range Services, each with endpoint b1 (lb-in's address
/// written `010.244.001.002`): leading zeros in a range, an ingress IP and
/// an endpoint address are read as upstream reads them (lb-in admits the
/// client, lb-out's range leaves it out); a range that does not parse
/// closes the load balancer IP (lb-bogus: where upstream would open it to
/// everyone), or is skipped beside one that parses (lb-mixed).
pub const SOURCE_RANGE_CASES: [SourceRangeCase; 4] = [
    SourceRangeCase {
        name: "lb-in",
        cluster_ip: "10.96.0.60",
        node_port: 30060,
        written_vip: "203.000.113.010",
        vip: "203.0.113.10",
        ranges: &["192.168.050.000/024"],
        admitted: true,
    },
    SourceRangeCase {
        name: "lb-out",
        cluster_ip: "10.96.0.61",
        node_port: 30061,
        written_vip: "203.0.113.11",
        vip: "203.0.113.11",
        ranges: &["198.051.100.000/024"],
        admitted: false,
    },
    SourceRangeCase {
        name: "lb-bogus",
        cluster_ip: "10.96.0.62",
        node_port: 30062,
        written_vip: "203.0.113.12",
        vip: "203.0.113.12",
        ranges: &["192.168.50.0/240"],
        admitted: false,
    },
    SourceRangeCase {
        name: "lb-mixed",
        cluster_ip: "10.96.0.63",
        node_port: 30063,
        written_vip: "203.0.113.13",
        vip: "203.0.113.13",
        ranges: &["bogus", "192.168.50.0/24"],
        admitted: true,
    },
];

/// `case`'s Service and EndpointSlice ([`dual_stack_service_manifest`]
/// made a LoadBalancer).
pub fn source_range_manifest(case: &SourceRangeCase) -> Value {
    let mut list = dual_stack_service_manifest(case.name, &[case.cluster_ip], case.node_port, &["b1"]);
    let svc = &mut list["items"][0];
    svc["spec"]["type"] = json!("LoadBalancer");
    svc["spec"]["loadBalancerSourceRanges"] = json!(case.ranges);
    svc["status"] = json!({"loadBalancer": {"ingress": [{"ip": case.written_vip}]}});
    if case.name == "lb-in" {
        list["items"][1]["endpoints"][0]["addresses"] = json!(["010.244.001.002"]);
    }
    list
}

/// Once the daemon in `node` programmed [`SOURCE_RANGE_CASES`]: the client
/// in `client` reaches (b1) the load balancer IPs that admit it, and no
/// other within `drop_wait`, while every NodePort answers (source ranges
/// do not apply to them, as upstream); the two ranges that do not parse
/// are counted in `/metrics` and shown on the dashboard.
pub fn assert_source_ranges(node: &Netns, client: &Netns, drop_wait: Duration, change_wait: Duration) {
    for case in &SOURCE_RANGE_CASES {
        let (vip, node_port) = (format!("{}:80", case.vip), format!("{}:{}", super::lab::NODE_IP, case.node_port));
        wait_for(&format!("{}: {node_port} to answer", case.name), change_wait, || {
            let got = super::lab::ask(client, &node_port, 2, false, drop_wait);
            got.iter().all(|a| matches!(a, Ok((b, _)) if b == "b1")).then_some(()).ok_or(format!("{got:?}"))
        });
        let got = super::lab::ask(client, &vip, 4, false, drop_wait);
        if case.admitted {
            assert!(
                got.iter().all(|a| matches!(a, Ok((b, _)) if b == "b1")),
                "{}: {vip} admits the client: {got:?}",
                case.name
            );
        } else {
            let dropped = got.iter().all(|a| *a == Err(std::io::ErrorKind::TimedOut));
            assert!(dropped, "{}: {vip} drops the client: {got:?}", case.name);
        }
    }
    let sample = "kube_proxy_rs_ignored_values_total{kind=\"Service\",field=\"spec.loadBalancerSourceRanges\"} 2";
    let metrics = http_get(node, "/metrics").expect("/metrics");
    assert!(metrics.lines().any(|l| l == sample), "{sample} in\n{metrics}");
    let body = http_get(node, "/dashboard/data").expect("/dashboard/data");
    let data: Value = serde_json::from_str(&body).expect("dashboard JSON");
    let ignored = &data["ignored_values"];
    assert_eq!(ignored["total"], 2, "{ignored}");
    // Files are read in name order: lb-mixed's is the newest.
    assert_eq!(ignored["last"]["object"], "default/lb-mixed", "{ignored}");
    assert_eq!(ignored["last"]["field"], "spec.loadBalancerSourceRanges[0]", "{ignored}");
    let listed: Vec<&Value> =
        data["refused"].as_array().expect("refused").iter().filter(|r| r["reason"] == "invalid_value").collect();
    assert_eq!(listed.len(), 2, "{}", data["refused"]);
    assert!(listed
        .iter()
        .any(|r| r["detail"].as_str().is_some_and(|d| d.contains("\"192.168.50.0/240\" is not a CIDR"))));
}

/// The daemon's log after [`assert_source_ranges`]: each range that does
/// not parse warned of once, and lb-bogus named as closed.
pub fn assert_source_ranges_logged(log: &str) {
    for (object, value) in [("default/lb-bogus", "192.168.50.0/240"), ("default/lb-mixed", "bogus")] {
        let warned = log.lines().filter(|l| l.contains("ignoring a value") && l.contains(object)).collect::<Vec<_>>();
        assert_eq!(warned.len(), 1, "{object} warned of once:\n{log}");
        assert!(warned[0].contains("WARN") && warned[0].contains(value), "{}", warned[0]);
    }
    let closed = log.lines().filter(|l| l.contains("fail closed")).collect::<Vec<_>>();
    assert!(!closed.is_empty() && closed.iter().all(|l| l.contains("default/lb-bogus")), "{log}");
}
