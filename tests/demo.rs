//! The README's demo, run as documented so it cannot rot:
//! `deploy/demo/netns.sh up`, `run` (the daemon in iptables mode on
//! config/demo.yaml and config/demo/, inside the node namespace), `try` from
//! the client and node namespaces, SIGTERM, `down`.
//!
//! The script gets this test's daemon binary (`KPR_DEMO_BIN`) and its own
//! namespace prefix (`KPR_DEMO_PREFIX`, ending in the pid), so parallel runs
//! and a user's demo do not collide. Checked:
//! - the script's backend table covers every endpoint of config/demo's
//!   EndpointSlices (address, node, ports, pod name where the slice has one);
//! - `up` is idempotent, and before the daemon runs the web ClusterIP does
//!   not answer (so the answers below come through the daemon's rules);
//! - with the daemon running: the web ClusterIP from the client answers from
//!   each of its three backends (one on other-node), from the node too; the
//!   NodePort on 192.168.50.2 answers from a web-nodeport backend; DNS over
//!   UDP answers from a coredns pod; the LoadBalancer IP
//!   (externalTrafficPolicy Local) answers from its one ready local pod and
//!   the pod sees the client's own address; the service without endpoints
//!   is refused; the node's iptables-save holds the demo's chains;
//! - SIGTERM stops the daemon with exit 0, `down` (twice) removes every
//!   namespace;
//! - the host's own iptables and ip6tables rules (legacy and nft, read with
//!   the -save tools, counters ignored) and its ip_forward/route_localnet
//!   sysctls are the same before and after.
//!
//! Needs root, iproute2, socat, iptables (all in .ci/install-deps.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube_proxy_rs::actors::source::manifests::ManifestDir;
use kube_proxy_rs::msgs::{Change, SourceEvent};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/demo/netns.sh");
const DEMO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo");
/// How long the daemon may take from `run` to the first answer.
const START_DEADLINE: Duration = Duration::from_secs(60);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One row of `netns.sh list`.
#[derive(Debug, Clone)]
struct Backend {
    node: String,
    pod: String,
    /// `tcp:8080`, `udp:53`, ...
    ports: BTreeSet<String>,
}

/// One backend's answer: `POD IP:PORT/PROTO on NODE, client ADDR:PORT`.
#[derive(Debug)]
struct Answer {
    pod: String,
    ip: String,
    node: String,
    client_ip: String,
}

fn parse_answer(line: &str) -> Answer {
    let w: Vec<&str> = line.trim().split(' ').collect();
    let (Some(ip), Some((client_ip, _)), [_, _, "on", _, "client", _]) =
        (w[1..].first().and_then(|a| a.split_once(':')), w.last().and_then(|c| c.rsplit_once(':')), &w[..])
    else {
        panic!("not a backend's answer: {line:?}");
    };
    Answer {
        pod: w[0].to_string(),
        ip: ip.0.to_string(),
        node: w[3].trim_end_matches(',').to_string(),
        client_ip: client_ip.to_string(),
    }
}

/// Endpoints of config/demo's EndpointSlices, as the daemon reads them:
/// address → (service, node, pod name if any, `proto:port`s).
fn demo_endpoints() -> BTreeMap<String, (String, String, Option<String>, BTreeSet<String>)> {
    let scan = ManifestDir::new(DEMO_DIR).scan();
    assert!(scan.errors.is_empty(), "config/demo: {:?}", scan.errors);
    let mut out = BTreeMap::new();
    for ev in scan.events {
        let SourceEvent::EndpointSlice(Change::Applied(slice)) = ev else { continue };
        let labels = slice.metadata.labels.clone().unwrap_or_default();
        let svc = labels.get("kubernetes.io/service-name").cloned().expect("slice without service-name");
        let ports: BTreeSet<String> = (slice.ports.iter().flatten())
            .map(|p| {
                let proto = p.protocol.as_deref().unwrap_or("TCP").to_lowercase();
                format!("{proto}:{}", p.port.expect("slice port without number"))
            })
            .collect();
        for ep in &slice.endpoints {
            let node = ep.node_name.clone().expect("endpoint without nodeName");
            let pod = ep.target_ref.as_ref().and_then(|r| r.name.clone());
            for addr in &ep.addresses {
                let prev = out.insert(addr.clone(), (svc.clone(), node.clone(), pod.clone(), ports.clone()));
                assert!(prev.is_none(), "{addr} is an endpoint of two slices; the demo's backends answer for one");
            }
        }
    }
    out
}

fn host_sysctl(path: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{path}")).unwrap_or_else(|e| panic!("read /proc/sys/{path}: {e}"))
}

/// The host's own rules, as the four -save tools print them, without
/// comments and counters (traffic changes those), and two sysctls. Read-only.
fn host_state() -> String {
    let mut out = String::new();
    for tool in ["iptables-legacy-save", "iptables-nft-save", "ip6tables-legacy-save", "ip6tables-nft-save"] {
        let o = Command::new(tool).output().unwrap_or_else(|e| panic!("{tool} (from the iptables package): {e}"));
        assert!(o.status.success(), "{tool} failed: {}", text(&o.stderr));
        out.push_str(&format!("## {tool}\n"));
        for line in text(&o.stdout).lines().filter(|l| !l.starts_with('#')) {
            // ":INPUT ACCEPT [12:345]" -> ":INPUT ACCEPT"; "[1:2] -A ..." (with -c) cannot occur.
            let line = match (line.starts_with(':'), line.rfind(" [")) {
                (true, Some(i)) => &line[..i],
                _ => line,
            };
            out.push_str(line);
            out.push('\n');
        }
    }
    for path in ["net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet"] {
        out.push_str(&format!("{path} = {}", host_sysctl(path)));
    }
    out
}

/// Namespaces whose name is the prefix or starts with `prefix-`.
fn namespaces_of(prefix: &str) -> Vec<String> {
    let o = Command::new("ip").args(["netns", "list"]).output().expect("ip netns list");
    assert!(o.status.success(), "ip netns list: {}", text(&o.stderr));
    (text(&o.stdout).lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n == prefix || n.starts_with(&format!("{prefix}-")))
        .map(str::to_string)
        .collect()
}

/// The demo lab of one test run; on drop (a failed assertion included) the
/// daemon is killed and `down` runs, and on a failure the daemon's log is
/// printed.
struct Lab {
    prefix: String,
    daemon: Option<Child>,
    log: PathBuf,
}

impl Lab {
    fn new() -> Lab {
        let prefix = format!("kprdemo{}", std::process::id());
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("demo-{prefix}.log"));
        Lab { prefix, daemon: None, log }
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut c = Command::new(SCRIPT);
        c.args(args)
            .env("KPR_DEMO_PREFIX", &self.prefix)
            .env("KPR_DEMO_BIN", env!("CARGO_BIN_EXE_kube-proxy-rs"))
            .stdin(Stdio::null());
        c
    }

    fn output(&self, args: &[&str], timeout_secs: u32) -> Output {
        self.script(args)
            .env("KPR_DEMO_TIMEOUT", timeout_secs.to_string())
            .output()
            .unwrap_or_else(|e| panic!("{SCRIPT}: {e}"))
    }

    /// Runs a subcommand that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.output(args, 3);
        assert!(o.status.success(), "netns.sh {args:?} failed: {}{}", text(&o.stdout), text(&o.stderr));
        text(&o.stdout)
    }

    /// `try TARGET FROM`: the answer, or the script's error.
    fn try_(&self, target: &str, from: &str, timeout_secs: u32) -> Result<String, String> {
        let o = self.output(&["try", target, from], timeout_secs);
        if o.status.success() {
            Ok(text(&o.stdout))
        } else {
            Err(format!("{}{}", text(&o.stdout), text(&o.stderr)))
        }
    }

    fn answer(&self, target: &str, from: &str) -> Answer {
        parse_answer(&self.try_(target, from, 3).unwrap_or_else(|e| panic!("try {target} from {from}: {e}")))
    }

    fn start_daemon(&mut self) {
        let log = std::fs::File::create(&self.log).expect("daemon log file");
        let child = (self.script(&["run", "--v", "2"]))
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("netns.sh run");
        self.daemon = Some(child);
    }

    /// SIGTERM (the script execs the daemon, so the child is the daemon) and
    /// its exit status within 20 s.
    fn stop_daemon(&mut self) -> std::process::ExitStatus {
        let mut child = self.daemon.take().expect("daemon running");
        let st = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(st.success(), "kill -TERM {}", child.id());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().expect("wait for the daemon") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon did not exit within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.script(&["down"]).stdout(Stdio::null()).status();
        if std::thread::panicking() {
            eprintln!("--- daemon log ({}) ---\n{}", self.log.display(), self.daemon_log());
        }
    }
}

#[test]
fn readme_demo_in_network_namespaces() {
    let t0 = Instant::now();
    let host_before = host_state();
    let endpoints = demo_endpoints();
    let mut lab = Lab::new();
    assert!(namespaces_of(&lab.prefix).is_empty(), "namespaces of {} exist before the test", lab.prefix);

    // The script's backends are exactly the slices' endpoints.
    let mut backends = BTreeMap::new();
    for line in lab.ok(&["list"]).lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert!(w.len() >= 4, "list line {line:?}");
        let ports = w[3..].iter().map(|p| p.to_string()).collect();
        backends.insert(w[0].to_string(), Backend { node: w[1].into(), pod: w[2].into(), ports });
    }
    assert_eq!(
        backends.keys().collect::<Vec<_>>(),
        endpoints.keys().collect::<Vec<_>>(),
        "netns.sh's backend table vs config/demo's endpoints"
    );
    for (ip, (svc, node, pod, ports)) in &endpoints {
        let b = &backends[ip];
        assert_eq!(&b.node, node, "{ip} ({svc}): node");
        assert_eq!(&b.ports, ports, "{ip} ({svc}): ports");
        if let Some(pod) = pod {
            assert_eq!(&b.pod, pod, "{ip} ({svc}): pod name from the slice's targetRef");
        }
    }
    let backends_of = |svc: &str| -> BTreeSet<String> {
        (endpoints.iter()).filter(|(_, (s, ..))| s == svc).map(|(ip, _)| ip.clone()).collect()
    };
    // An answer from a backend of `svc`, consistent with the table.
    let check = |a: &Answer, svc: &str| {
        assert!(backends_of(svc).contains(&a.ip), "{a:?} is not a backend of {svc}");
        assert_eq!(a.pod, backends[&a.ip].pod, "{a:?}: pod name");
        assert_eq!(a.node, backends[&a.ip].node, "{a:?}: node");
    };

    let t = Instant::now();
    let out = lab.ok(&["up"]);
    let up_time = t.elapsed();
    assert!(out.contains("up:"), "up said: {out}");
    let ns = namespaces_of(&lab.prefix);
    assert_eq!(ns.len(), 3 + endpoints.len(), "namespaces after up: {ns:?}");
    let out = lab.ok(&["up"]);
    assert!(out.contains("already up"), "a second up said: {out}");
    assert_eq!(namespaces_of(&lab.prefix), ns, "a second up changed the namespaces");

    // Without the daemon nothing answers on the ClusterIP.
    let err = lab.try_("web", "client", 1).expect_err("web answered before the daemon ran");
    assert!(err.contains("no answer"), "{err}");

    let t = Instant::now();
    lab.start_daemon();
    let deadline = Instant::now() + START_DEADLINE;
    let first = loop {
        match lab.try_("web", "client", 1) {
            Ok(a) => break parse_answer(&a),
            Err(e) => {
                if let Some(st) = lab.daemon.as_mut().and_then(|c| c.try_wait().expect("try_wait")) {
                    panic!("the daemon exited ({st}) before web answered; last try: {e}");
                }
                assert!(Instant::now() < deadline, "web did not answer within {START_DEADLINE:?}: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    let first_answer_time = t.elapsed();
    check(&first, "web");

    // Every web backend answers in turn (random choice: 3 × (2/3)^60 ≈ 1e-10
    // to miss one by chance), the one on other-node included.
    let mut seen = BTreeSet::from([first.ip.clone()]);
    for _ in 0..60 {
        if seen.len() == 3 {
            break;
        }
        let a = lab.answer("web", "client");
        check(&a, "web");
        seen.insert(a.ip);
    }
    assert_eq!(seen, backends_of("web"), "web backends that answered");

    check(&lab.answer("web", "node"), "web");
    check(&lab.answer("nodeport", "client"), "web-nodeport");
    check(&lab.answer("dns", "client"), "kube-dns");
    // externalTrafficPolicy Local: the ready local pod only, source kept.
    let lb = lab.answer("lb", "client");
    check(&lb, "web-lb");
    assert_eq!((lb.ip.as_str(), lb.client_ip.as_str()), ("10.244.0.13", "192.168.50.10"), "{lb:?}");
    let refused = lab.try_("no-endpoints", "client", 3).expect("try no-endpoints reports the refusal as expected");
    assert!(refused.contains("refused, as expected"), "no-endpoints should be rejected: {refused}");

    // The rules, as the README shows them.
    let o = Command::new("ip").args(["netns", "exec", &lab.prefix, "iptables-save"]).output().expect("iptables-save");
    assert!(o.status.success(), "iptables-save in {}: {}", lab.prefix, text(&o.stderr));
    let rules = text(&o.stdout);
    for needle in ["-A KUBE-SERVICES", "default/web:http cluster IP", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY"] {
        assert!(rules.contains(needle), "no {needle:?} in the node's iptables-save:\n{rules}");
    }

    let status = lab.stop_daemon();
    assert!(status.success(), "the daemon's exit after SIGTERM: {status}");
    assert!(lab.daemon_log().contains("SIGTERM"), "the daemon did not log the SIGTERM:\n{}", lab.daemon_log());

    lab.ok(&["down"]);
    assert_eq!(namespaces_of(&lab.prefix), Vec::<String>::new(), "namespaces left after down");
    lab.ok(&["down"]);
    assert_eq!(host_state(), host_before, "the host's own rules or sysctls changed");
    eprintln!(
        "demo: up {:.2?}, run → first answer {:.2?}, whole test {:.2?}",
        up_time,
        first_answer_time,
        t0.elapsed()
    );
}
