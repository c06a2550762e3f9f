//! The README's demo, run as documented so it cannot rot:
//! `deploy/demo/netns.sh up`, `run MODE` (the daemon on config/demo/ in the
//! node namespace, the config file chosen by the mode), `try` every target
//! `help` lists, `forward`, and `down` with all of it running; in iptables
//! and in nftables mode. IPVS mode needs a kernel with IPVS: here `run ipvs`
//! must say so in one line and name the VM harness.
//!
//! The script gets this test's binaries (`KPR_DEMO_BIN`,
//! `KPR_DEMO_BACKENDS_BIN`) and its own namespace prefix
//! (`KPR_DEMO_PREFIX`, ending in the pid and the test), so parallel runs and
//! a user's demo do not collide. Checked:
//! - `list` is every endpoint of config/demo's EndpointSlices (address,
//!   node, ports, pod name), read here independently of the script;
//! - `up` is idempotent, and before the daemon runs the web ClusterIP does
//!   not answer (so the answers below come through the daemon's rules);
//! - in each mode, with the daemon running: every target of `help` answers
//!   from a backend of its service (web from each of its three, one on
//!   other-node; local-only and the LoadBalancer IP, with their Local
//!   policies, from their local pod; the LoadBalancer IP with the client's
//!   own address), no-endpoints is refused, web answers from the node too;
//!   the node's rules are the mode's; `forward` serves /proxyMode naming the
//!   mode on the host's loopback;
//! - `down` with the daemon and `forward` running stops both (the daemon
//!   with exit 0 after its SIGTERM), leaves no namespace, no pid file,
//!   nothing listening on the forward's port; a second `down` is a no-op;
//! - an endpoint address added to the manifests gets its pod from `down` +
//!   `up`, and from `up` beside a running daemon, which then sends traffic
//!   to it; one removed loses its pod on `up`;
//! - `run --proxy-mode MODE` is `run MODE`, `--config` is refused;
//! - the host's own iptables and ip6tables rules (legacy and nft, read with
//!   the -save tools, counters ignored) and its ip_forward/route_localnet
//!   sysctls are the same before and after.
//!
//! Needs root, iproute2, socat, iptables, nftables (.ci/install-deps.sh).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube_proxy_rs::actors::source::manifests::ManifestDir;
use kube_proxy_rs::msgs::{Change, SourceEvent};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/demo/netns.sh");
const DEMO_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/demo");
/// How long the daemon may take from `run` to the first answer.
const START_DEADLINE: Duration = Duration::from_secs(60);
/// Where `forward` records its pid.
const RUN_DIR: &str = "/run/kpr-demo-lab";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// One row of `netns.sh list`.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Endpoints of a manifest directory's EndpointSlices, read here as the
/// daemon reads them: address → (services, backend).
fn endpoints_of(dir: &Path) -> BTreeMap<Ipv4Addr, (BTreeSet<String>, Backend)> {
    let scan = ManifestDir::new(dir).with_settle(Duration::ZERO).scan();
    assert!(scan.errors.is_empty(), "{}: {:?}", dir.display(), scan.errors);
    let mut out: BTreeMap<Ipv4Addr, (BTreeSet<String>, Backend)> = BTreeMap::new();
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
            let pod = ep.target_ref.as_ref().and_then(|r| r.name.clone()).expect("demo endpoint without targetRef");
            for addr in &ep.addresses {
                let ip: Ipv4Addr = addr.parse().expect("an IPv4 endpoint");
                let e = out.entry(ip).or_insert_with(|| {
                    (BTreeSet::new(), Backend { node: node.clone(), pod: pod.clone(), ports: BTreeSet::new() })
                });
                e.0.insert(svc.clone());
                e.1.ports.extend(ports.iter().cloned());
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

/// A port on the host's loopback that nothing listens on now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// `GET path` on the host's 127.0.0.1:port: the body of a 200.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1))
        .map_err(|e| format!("connect 127.0.0.1:{port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).map_err(|e| format!("read: {e}"))?;
    match answer.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") => {
            Ok(body.to_string())
        }
        _ => Err(format!("GET {path}: {answer:?}")),
    }
}

/// Waits for a child to exit within `limit`: its status, or None.
fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The demo lab of one test; on drop (a failed assertion included) the
/// children are killed and `down` runs, and on a failure the daemon's log is
/// printed.
struct Lab {
    prefix: String,
    manifests: PathBuf,
    daemon: Option<Child>,
    forward: Option<Child>,
    log: PathBuf,
}

impl Lab {
    /// A lab named for this process and `case`, on the manifests in `manifests`.
    fn new(case: &str, manifests: &Path) -> Lab {
        let prefix = format!("kprdemo{}{case}", std::process::id());
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("demo-{prefix}.log"));
        let lab = Lab { prefix, manifests: manifests.to_path_buf(), daemon: None, forward: None, log };
        assert!(namespaces_of(&lab.prefix).is_empty(), "namespaces of {} exist before the test", lab.prefix);
        lab
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut c = Command::new(SCRIPT);
        c.args(args)
            .env("KPR_DEMO_PREFIX", &self.prefix)
            .env("KPR_DEMO_BIN", env!("CARGO_BIN_EXE_kube-proxy-rs"))
            .env("KPR_DEMO_BACKENDS_BIN", env!("CARGO_BIN_EXE_kpr-demo-backends"))
            .env("KPR_DEMO_MANIFESTS", &self.manifests)
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

    /// Runs a subcommand that must fail; its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let o = self.output(args, 3);
        assert!(!o.status.success(), "netns.sh {args:?} succeeded: {}", text(&o.stdout));
        text(&o.stderr)
    }

    /// `list`: address → backend.
    fn list(&self) -> BTreeMap<Ipv4Addr, Backend> {
        (self.ok(&["list"]).lines())
            .map(|line| {
                let w: Vec<&str> = line.split_whitespace().collect();
                assert!(w.len() >= 4, "list line {line:?}");
                let ports = w[3..].iter().map(|p| p.to_string()).collect();
                let ip = w[0].parse().unwrap_or_else(|e| panic!("list line {line:?}: {e}"));
                (ip, Backend { node: w[1].into(), pod: w[2].into(), ports })
            })
            .collect()
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

    /// The answer to `try TARGET FROM`, asked a second time when the first
    /// gets none: a datagram or a backend's start can be late on a loaded
    /// machine; a missing or wrong rule fails both times.
    fn answer(&self, target: &str, from: &str) -> Answer {
        let text = self
            .try_(target, from, 3)
            .or_else(|_| self.try_(target, from, 3))
            .unwrap_or_else(|e| panic!("try {target} from {from}, twice: {e}"));
        parse_answer(&text)
    }

    /// `run ARGS...` in the background, its output in the log file.
    fn start_daemon(&mut self, args: &[&str]) {
        let log = std::fs::File::create(&self.log).expect("daemon log file");
        let child = (self.script(&[&["run"], args, &["--v", "2"]].concat()))
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("netns.sh run");
        self.daemon = Some(child);
    }

    /// Tries web until it answers (the daemon has synced): that answer.
    fn first_web_answer(&mut self) -> Answer {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            match self.try_("web", "client", 1) {
                Ok(a) => return parse_answer(&a),
                Err(e) => {
                    if let Some(st) = self.daemon.as_mut().and_then(|c| c.try_wait().expect("try_wait")) {
                        panic!("the daemon exited ({st}) before web answered; last try: {e}");
                    }
                    assert!(Instant::now() < deadline, "web did not answer within {START_DEADLINE:?}: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// `forward PORT` in the background, once its port answers.
    fn start_forward(&mut self, port: u16) {
        let child = (self.script(&["forward", &port.to_string()]))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("netns.sh forward");
        self.forward = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "forward: nothing listens on 127.0.0.1:{port} after 10 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn daemon_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The forward pid files of this lab.
    fn forward_pid_files(&self) -> Vec<PathBuf> {
        let Ok(dir) = std::fs::read_dir(RUN_DIR) else { return Vec::new() };
        (dir.flatten())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{}.forward.", self.prefix)))
            })
            .collect()
    }

    /// `down` with the daemon and forward running: both stop (the daemon
    /// with exit 0), and nothing of the lab is left.
    fn down_stops_everything(&mut self, forward_port: u16) {
        let out = self.ok(&["down"]);
        assert!(out.contains("down:"), "down said: {out}");
        // Taken once they exited: on a failed assertion, drop kills them.
        let forward = self.forward.as_mut().expect("forward running");
        assert!(wait_exit(forward, Duration::from_secs(5)).is_some(), "forward still runs after down");
        self.forward = None;
        let daemon = self.daemon.as_mut().expect("daemon running");
        let status = wait_exit(daemon, Duration::from_secs(5)).expect("the daemon still runs after down");
        self.daemon = None;
        assert!(status.success(), "the daemon's exit after down's SIGTERM: {status}");
        assert!(self.daemon_log().contains("SIGTERM"), "the daemon did not log the SIGTERM:\n{}", self.daemon_log());
        assert_eq!(namespaces_of(&self.prefix), Vec::<String>::new(), "namespaces left after down");
        assert_eq!(self.forward_pid_files(), Vec::<PathBuf>::new(), "forward pid files left after down");
        let listening = TcpStream::connect(("127.0.0.1", forward_port));
        assert!(listening.is_err(), "something still listens on 127.0.0.1:{forward_port} after down");
        let out = self.ok(&["down"]);
        assert!(out.contains("down:"), "a second down said: {out}");
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for mut child in [self.daemon.take(), self.forward.take()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.script(&["down"]).stdout(Stdio::null()).status();
        if std::thread::panicking() {
            eprintln!("--- daemon log ({}) ---\n{}", self.log.display(), self.daemon_log());
        }
    }
}

/// The targets `help` lists, by name.
fn targets(lab: &Lab) -> Vec<String> {
    let help = lab.ok(&["help"]);
    let list = help.split_once("try targets").expect("help lists the try targets").1;
    (list.lines().skip(1))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| !name.contains(':'))
        .map(str::to_string)
        .collect()
}

/// What each target must answer: the service whose backends may answer,
/// and the one backend that must when its traffic policy is Local (the
/// client's own address kept for the LoadBalancer IP); None: refused.
fn expected(target: &str) -> Option<(&'static str, Option<&'static str>)> {
    match target {
        "web" => Some(("web", None)),
        "sticky" => Some(("sticky", None)),
        "local-only" => Some(("local-only", Some("10.244.0.16"))),
        "no-endpoints" => None,
        "web-nodeport" | "nodeport" => Some(("web-nodeport", None)),
        "lb" | "lb-nodeport" => Some(("web-lb", Some("10.244.0.13"))),
        "external" => Some(("web-external", None)),
        "dns" | "dns-tcp" => Some(("kube-dns", None)),
        other => panic!("help lists target {other:?}: say here what it must answer"),
    }
}

/// The demo in one mode, as the README runs it.
fn demo(mode: &str, case: &str, rules: &[&str], rules_needles: &[&str]) {
    let t0 = Instant::now();
    let host_before = host_state();
    let endpoints = endpoints_of(Path::new(DEMO_DIR));
    let mut lab = Lab::new(case, Path::new(DEMO_DIR));
    let backends_of = |svc: &str| -> BTreeSet<String> {
        (endpoints.iter()).filter(|(_, (s, _))| s.contains(svc)).map(|(ip, _)| ip.to_string()).collect()
    };
    // An answer from a backend of `svc`, consistent with the manifests.
    let check = |a: &Answer, svc: &str| {
        assert!(backends_of(svc).contains(&a.ip), "{a:?} is not a backend of {svc}");
        let b = &endpoints[&a.ip.parse::<Ipv4Addr>().expect("answer's address")].1;
        assert_eq!((a.pod.as_str(), a.node.as_str()), (b.pod.as_str(), b.node.as_str()), "{a:?}: pod, node");
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
    lab.start_daemon(&[mode]);
    let first = lab.first_web_answer();
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

    let targets = targets(&lab);
    assert!(targets.len() >= 11, "help lists {targets:?}");
    for target in &targets {
        match expected(target) {
            Some((svc, only)) => {
                let a = lab.answer(target, "client");
                check(&a, svc);
                if let Some(ip) = only {
                    assert_eq!(a.ip, ip, "{target}: Local policy, the local ready pod only: {a:?}");
                }
                if svc == "web-lb" {
                    assert_eq!(a.client_ip, "192.168.50.10", "{target}: the client's own address kept: {a:?}");
                }
            }
            None => {
                let refused = lab.try_(target, "client", 3).expect("try reports the refusal as expected");
                assert!(refused.contains("refused, as expected"), "{target} should be rejected: {refused}");
            }
        }
    }

    // The rules, as the README shows them.
    let o = Command::new("ip").args(["netns", "exec", &lab.prefix]).args(rules).output().expect("rules");
    assert!(o.status.success(), "{rules:?} in {}: {}", lab.prefix, text(&o.stderr));
    let listing = text(&o.stdout);
    for needle in rules_needles {
        assert!(listing.contains(needle), "no {needle:?} in the node's {rules:?}:\n{listing}");
    }

    // The dashboard's server on the host's loopback, through forward.
    let port = free_port();
    lab.start_forward(port);
    let proxy_mode = http_get(port, "/proxyMode").expect("/proxyMode through forward");
    assert_eq!(proxy_mode.trim(), mode, "/proxyMode through forward");

    lab.down_stops_everything(port);
    assert_eq!(host_state(), host_before, "the host's own rules or sysctls changed");
    eprintln!(
        "demo ({mode}): up {:.2?}, run → first answer {:.2?}, whole test {:.2?}",
        up_time,
        first_answer_time,
        t0.elapsed()
    );
}

#[test]
fn demo_in_iptables_mode() {
    demo(
        "iptables",
        "i",
        &["iptables-save"],
        &["-A KUBE-SERVICES", "default/web:http cluster IP", "KUBE-NODEPORTS", "KUBE-PROXY-CANARY"],
    );
}

#[test]
fn demo_in_nftables_mode() {
    demo(
        "nftables",
        "n",
        &["nft", "list", "table", "ip", "kube-proxy"],
        &["table ip kube-proxy", "chain services", "default/web/tcp/http", "chain nodeport-endpoints-check"],
    );
}

/// `list` is every endpoint of config/demo's EndpointSlices.
#[test]
fn list_is_every_endpoint_of_the_demo() {
    let lab = Lab::new("l", Path::new(DEMO_DIR));
    let want: BTreeMap<Ipv4Addr, Backend> =
        endpoints_of(Path::new(DEMO_DIR)).into_iter().map(|(ip, (_, b))| (ip, b)).collect();
    assert_eq!(lab.list(), want);
}

/// A copy of config/demo in a temporary directory.
fn demo_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for e in std::fs::read_dir(DEMO_DIR).expect("config/demo") {
        let p = e.expect("config/demo entry").path();
        std::fs::copy(&p, dir.path().join(p.file_name().expect("file name"))).expect("copy a manifest");
    }
    dir
}

/// web.yaml with one more web endpoint on other-node, or without it.
fn set_extra_web_endpoint(dir: &Path, present: bool) {
    const AFTER: &str = "      name: web-5d8f7c9b6-g5h6i\n";
    const EXTRA: &str = "  - addresses:\n      - 10.244.1.22\n    conditions:\n      ready: true\n    \
                         nodeName: other-node\n    targetRef:\n      kind: Pod\n      name: web-5d8f7c9b6-new01\n";
    let original = std::fs::read_to_string(Path::new(DEMO_DIR).join("web.yaml")).expect("web.yaml");
    assert_eq!(original.matches(AFTER).count(), 1, "web.yaml's endpoint {AFTER:?}");
    let text = if present { original.replacen(AFTER, &format!("{AFTER}{EXTRA}"), 1) } else { original };
    // Renamed into place: the daemon reads it at once, as a whole.
    let tmp = dir.join(".web.yaml.new");
    std::fs::write(&tmp, text).expect("write web.yaml");
    std::fs::rename(&tmp, dir.join("web.yaml")).expect("rename web.yaml");
}

#[test]
fn an_endpoint_added_to_the_manifests_gets_its_pod_from_up() {
    let manifests = demo_copy();
    let mut lab = Lab::new("e", manifests.path());
    let extra_ns = format!("{}-10.244.1.22", lab.prefix);
    lab.ok(&["up"]);
    assert!(!namespaces_of(&lab.prefix).contains(&extra_ns));

    // Added, then down + up: its namespace.
    set_extra_web_endpoint(manifests.path(), true);
    let extra = lab.list().remove(&Ipv4Addr::new(10, 244, 1, 22)).expect("list shows the new endpoint");
    assert_eq!((extra.node.as_str(), extra.pod.as_str()), ("other-node", "web-5d8f7c9b6-new01"));
    lab.ok(&["down"]);
    lab.ok(&["up"]);
    assert!(namespaces_of(&lab.prefix).contains(&extra_ns), "no {extra_ns} after down + up");

    // Removed, then up beside the running daemon: its pod stops, the rest
    // keeps answering.
    lab.start_daemon(&["iptables"]);
    lab.first_web_answer();
    set_extra_web_endpoint(manifests.path(), false);
    let out = lab.ok(&["up"]);
    assert!(out.contains("0 started, 1 stopped"), "up after removing an endpoint said: {out}");
    assert!(!namespaces_of(&lab.prefix).contains(&extra_ns), "{extra_ns} left after up");

    // Added again beside the running daemon: up starts its pod, and the
    // daemon (following the file) sends web traffic to it.
    set_extra_web_endpoint(manifests.path(), true);
    let out = lab.ok(&["up"]);
    assert!(out.contains("1 started, 0 stopped"), "up after adding an endpoint said: {out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = lab.answer("web", "client");
        if a.ip == "10.244.1.22" {
            assert_eq!(a.pod, "web-5d8f7c9b6-new01");
            break;
        }
        assert!(Instant::now() < deadline, "web never answered from the added endpoint in 30 s");
    }
    assert!(lab.daemon.as_mut().expect("daemon").try_wait().expect("try_wait").is_none(), "up stopped the daemon");
}

/// Each mode's config leaves nf_conntrack_max alone (`maxPerCore: 0`): in
/// the node's network namespace it is read-only, and a daemon that must
/// raise it (CPUs × maxPerCore above the host's value) does not start.
#[test]
fn demo_configs_leave_nf_conntrack_max_alone() {
    for file in ["demo.yaml", "demo-nftables.yaml", "demo-ipvs.yaml"] {
        let path = format!("{ROOT}/config/{file}");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let cfg = kube_proxy_rs::config::parse_str(&text, &path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg.conntrack.max_per_core, Some(0), "{file}: conntrack.maxPerCore");
    }
}

/// The mode picks the config file: `--proxy-mode` is taken as the mode (so
/// `--proxy-mode ipvs` gets the IPVS message, not iptables mode), `--config`
/// is refused. Needs no lab: these are refused before anything runs.
#[test]
fn run_picks_the_config_by_mode() {
    let lab = Lab::new("r", Path::new(DEMO_DIR));
    for args in [&["run", "ipvs"][..], &["run", "--proxy-mode", "ipvs"], &["run", "--proxy-mode=ipvs", "--v", "2"]] {
        let err = lab.fails(args);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: one line: {err}");
        for needle in ["no IPVS in this kernel", "tests/vm/run-vm-test.sh", "tests/vm/guest/demo.sh", "run nftables"] {
            assert!(err.contains(needle), "{args:?}: no {needle:?} in {err}");
        }
    }
    let err = lab.fails(&["run", "iptables", "--proxy-mode", "nftables"]);
    assert!(err.contains("choose one"), "{err}");
    let err = lab.fails(&["run", "nftables", "--config", &format!("{ROOT}/config/demo.yaml")]);
    assert!(err.contains("picks the config file by mode"), "{err}");
    let err = lab.fails(&["run", "userspace"]);
    assert!(err.contains("unknown mode 'userspace'"), "{err}");
}
