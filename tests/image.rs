//! The container image, built by `deploy/image/build.sh` (this test's debug
//! binary in it, tagged `localhost/kube-proxy-rs:test`, so a developer's
//! `:dev` image stays), run by rootful podman the way `deploy/daemonset.yaml`
//! runs it: the DaemonSet's command and environment, its volumes (the
//! ConfigMap's files, the xtables lock, `/lib/modules`), privileged, and
//! the node's network namespace as the host network (`--network
//! ns:/run/netns/NODE`). The node is the README demo's (`deploy/demo/netns.sh
//! up`, namespaces `kpri<pid>...`), on config/demo's manifests. Two things
//! differ from a node, both said where they are made: the ConfigMap's
//! `mode: iptables` is checked as it is (this kernel has no IPVS; the VM
//! tests cover IPVS mode), and `--manifests` is added, config/demo mounted,
//! in place of the API server.
//!
//! Checked: the image holds every package of deploy/image/packages, no
//! package manager's caches, apt or compiler, the Dockerfile's entrypoint and
//! the commit's label, also in its OCI archive; started before any rule
//! exists in the node, the backend wrapper picks the backend that already
//! holds the node's rules (legacy, then nft with rules in both), the
//! daemon's rules land there and only there, /healthz and /metrics answer,
//! the web ClusterIP answers from the client namespace, and `podman stop`
//! (SIGTERM) ends the container with exit code 0 and the rules, and the
//! traffic they carry, in place. In the qemu VM (tests/vm), the image's
//! root filesystem runs IPVS mode: the daemon chrooted into it, through a
//! set of tests/vm's IPVS scenarios.
//!
//! Needs root, podman, buildah, mmdebstrap, skopeo and Debian's archive for
//! the first build (.ci/install-deps.sh); the root filesystem is cached (see
//! deploy/image/build.sh). Run it under `flock /tmp/kpr-netns.lock`, as the
//! other tests that make namespaces.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use serde::Deserialize;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TAG: &str = "localhost/kube-proxy-rs:test";
/// config/demo's node: the DaemonSet's `spec.nodeName` here.
const NODE_NAME: &str = "demo-node";
/// Where config/demo is mounted for `--manifests`.
const MANIFESTS_MOUNT: &str = "/etc/kube-proxy-rs/manifests";
/// The demo's web Service: its ClusterIP as iptables-save writes it.
const WEB_CLUSTER_IP: &str = "10.96.0.20/32";
/// From `podman run` to the first sync's rules.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// One pod at a time: each test runs the demo lab and a container.
static SERIAL: Mutex<()> = Mutex::new(());

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn output(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// Runs `cmd`; panics with its stderr unless it succeeds; its stdout.
fn ok(cmd: &mut Command) -> String {
    let o = output(cmd);
    assert!(o.status.success(), "{cmd:?} failed: {}{}", text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

// ------------------------------------------------------------------ image

/// The image this test binary built, and how podman runs containers here.
struct Image {
    oci: PathBuf,
    podman: Podman,
}

/// podman's options that this host needs and a node would not (see [`Podman::probe`]).
#[derive(Debug, Clone, Default)]
struct Podman {
    global: Vec<String>,
    run: Vec<String>,
}

impl Podman {
    fn command(&self) -> Command {
        let mut c = Command::new("podman");
        c.args(&self.global);
        c
    }

    /// `podman run` with this host's options; the caller adds the rest.
    fn run(&self) -> Command {
        let mut c = self.command();
        c.arg("run").args(&self.run);
        c
    }

    /// The first option set with which a privileged container starts.
    /// Measured on the development machines (Debian 12, podman 4.3.1):
    /// - crun 1.8 refuses hybrid cgroups with controllers on the v2
    ///   hierarchy ("cgroups in hybrid mode not supported, drop all
    ///   controllers from cgroupv2"), even with `--cgroups=disabled`; runc
    ///   runs there;
    /// - without CAP_SYS_RESOURCE (a sandbox's bounding set) the runtime
    ///   cannot raise RLIMIT_NOFILE to podman's default 1048576, nor
    ///   RLIMIT_NPROC above podman's own (32768 there: /proc/PID/limits),
    ///   so the limits are given at most at those values.
    ///
    /// Where nothing is needed (a plain Debian machine), nothing is added.
    fn probe(tag: &str) -> Podman {
        let ulimits = || {
            let hard = |resource| {
                let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                // SAFETY: getrlimit writes the struct it is given.
                assert_eq!(unsafe { libc::getrlimit(resource, &mut limit) }, 0, "getrlimit");
                limit.rlim_max
            };
            let nofile = hard(libc::RLIMIT_NOFILE);
            let nproc = hard(libc::RLIMIT_NPROC).min(32768);
            [
                "--ulimit".into(),
                format!("nofile={nofile}:{nofile}"),
                "--ulimit".into(),
                format!("nproc={nproc}:{nproc}"),
            ]
            .to_vec()
        };
        let runc = || vec!["--runtime".to_string(), "runc".to_string()];
        let candidates = [
            Podman::default(),
            Podman { global: runc(), run: vec![] },
            Podman { global: vec![], run: ulimits() },
            Podman { global: runc(), run: ulimits() },
        ];
        let mut errors = Vec::new();
        for p in candidates {
            let o =
                output(p.run().args(["--rm", "--privileged", "--network", "none", "--entrypoint", "/bin/true", tag]));
            if o.status.success() {
                if !errors.is_empty() {
                    eprintln!("podman needs {:?} {:?} on this host; without them: {errors:#?}", p.global, p.run);
                }
                return p;
            }
            errors.push(format!("{:?} {:?}: {}", p.global, p.run, text(&o.stderr).trim()));
        }
        panic!("podman cannot start a privileged container here: {errors:#?}");
    }
}

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let oci = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-proxy-rs-test.oci.tar");
        let t = Instant::now();
        let build = format!("{ROOT}/deploy/image/build.sh");
        let o = output(
            Command::new(&build)
                .args(["--bin", env!("CARGO_BIN_EXE_kube-proxy-rs"), "--tag", TAG])
                .arg("--oci")
                .arg(&oci),
        );
        assert!(o.status.success(), "{build} failed:\n{}", text(&o.stderr));
        eprintln!("image built in {:.1} s:\n{}", t.elapsed().as_secs_f64(), text(&o.stderr));
        Image { oci, podman: Podman::probe(TAG) }
    })
}

/// A command run inside the image (`--entrypoint`), no network; its stdout.
fn in_image(args: &[&str]) -> String {
    let image = image();
    ok(image.podman.run().args(["--rm", "--network", "none", "--entrypoint", args[0], TAG]).args(&args[1..]))
}

/// deploy/image/packages, without comments.
fn listed_packages() -> Vec<String> {
    let text = std::fs::read_to_string(format!("{ROOT}/deploy/image/packages")).expect("deploy/image/packages");
    text.lines()
        .filter_map(|l| l.split('#').next())
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

/// deploy/Dockerfile's ENTRYPOINT, as JSON.
fn dockerfile_entrypoint() -> Value {
    let text = std::fs::read_to_string(format!("{ROOT}/deploy/Dockerfile")).expect("deploy/Dockerfile");
    let lines: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("ENTRYPOINT ")).collect();
    assert_eq!(lines.len(), 1, "one ENTRYPOINT in deploy/Dockerfile");
    serde_json::from_str(lines[0]).expect("ENTRYPOINT in JSON form")
}

#[test]
fn image_holds_the_listed_packages_the_dockerfiles_entrypoint_and_the_commit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    let inspect: Value = serde_json::from_str(&ok(image.podman.command().args(["image", "inspect", TAG]))).unwrap();
    let config = &inspect[0]["Config"];
    assert_eq!(config["Entrypoint"], dockerfile_entrypoint(), "{config:#}");
    let head = ok(Command::new("git").args(["-C", ROOT, "rev-parse", "HEAD"])).trim().to_string();
    let revision = config["Labels"]["org.opencontainers.image.revision"].as_str().unwrap_or_default();
    assert!(revision == head || revision == format!("{head}-dirty"), "revision label {revision:?}, HEAD {head}");
    let size: u64 = inspect[0]["Size"].as_u64().expect("image size");
    eprintln!("image size {} MB (podman image inspect)", size / 1_000_000);

    // The OCI archive holds the same image.
    let archive = format!("oci-archive:{}", image.oci.display());
    let skopeo: Value = serde_json::from_str(&ok(Command::new("skopeo").args(["inspect", &archive]))).unwrap();
    assert_eq!(skopeo["Labels"], config["Labels"], "{archive}");

    let installed: BTreeSet<String> = in_image(&["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n"])
        .lines()
        .filter(|l| l.ends_with(" ii "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    for package in listed_packages() {
        assert!(installed.contains(&package), "{package} (deploy/image/packages) is not installed: {installed:?}");
    }
    for absent in ["apt", "gcc-12", "cpp-12", "libc6-dev", "perl"] {
        assert!(!installed.contains(absent), "{absent} is installed");
    }
    let leftovers = in_image(&["find", "/var/lib/apt/lists", "/var/cache/apt", "/var/log", "-mindepth", "1"]);
    assert_eq!(leftovers, "", "package manager caches and logs");
    for tool in ["iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"] {
        let target = in_image(&["readlink", "-f", &format!("/usr/sbin/{tool}")]);
        assert_eq!(target.trim(), "/usr/sbin/iptables-wrapper", "{tool}");
    }
    for tool in ["iptables-legacy-restore", "iptables-nft-restore", "ipset", "conntrack", "modprobe"] {
        in_image(&["sh", "-c", &format!("command -v {tool}")]);
    }
}

// ---------------------------------------------------------------- the pod

/// deploy/'s DaemonSet and ConfigMap.
struct Deploy {
    pod: PodSpec,
    config_map: ConfigMap,
}

fn load<T: for<'de> Deserialize<'de>>(file: &str) -> T {
    let path = format!("{ROOT}/deploy/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

impl Deploy {
    fn load() -> Deploy {
        let ds: DaemonSet = load("daemonset.yaml");
        let pod = ds.spec.expect("DaemonSet spec").template.spec.expect("pod spec");
        Deploy { pod, config_map: load("configmap.yaml") }
    }

    fn container(&self) -> &Container {
        assert_eq!(self.pod.containers.len(), 1);
        &self.pod.containers[0]
    }

    /// The ConfigMap's files in `dir`, as they are: config.conf must set
    /// `mode: iptables` (no IPVS in this kernel; these tests are about the
    /// iptables backend the pod picks).
    fn write_config_map(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, value) in self.config_map.data.iter().flatten() {
            if name == "config.conf" {
                let modes: Vec<&str> = value.lines().filter(|l| l.starts_with("mode:")).collect();
                assert_eq!(modes, ["mode: iptables"], "config.conf sets mode: iptables once: {value}");
            }
            std::fs::write(dir.join(name), value).unwrap();
        }
    }

    /// `podman run` arguments for the DaemonSet's container on the node
    /// whose network namespace is `node_ns`, with the ConfigMap in
    /// `config_dir`, plus `--manifests` (config/demo mounted).
    fn podman_args(&self, name: &str, node_ns: &str, config_dir: &Path) -> Vec<String> {
        let c = self.container();
        let mut args: Vec<String> = vec!["--detach".into(), "--name".into(), name.into()];
        assert_eq!(self.pod.host_network, Some(true), "hostNetwork");
        args.extend(["--network".into(), format!("ns:/run/netns/{node_ns}")]);
        let privileged = c.security_context.as_ref().and_then(|s| s.privileged);
        assert_eq!(privileged, Some(true), "privileged");
        args.push("--privileged".into());
        let mut vars = Vec::new();
        for env in c.env.iter().flatten() {
            let field = env.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
            let value = match field {
                Some("spec.nodeName") => NODE_NAME.to_string(),
                other => panic!("env {}: unexpected source {other:?}", env.name),
            };
            args.extend(["--env".into(), format!("{}={value}", env.name)]);
            vars.push((format!("$({})", env.name), value));
        }
        for mount in c.volume_mounts.iter().flatten() {
            let volume = (self.pod.volumes.iter().flatten()).find(|v| v.name == mount.name).expect("mounted volume");
            let source = if volume.config_map.is_some() {
                config_dir.to_path_buf()
            } else {
                let host = volume.host_path.as_ref().expect("configMap or hostPath volume");
                host_path(&host.path, host.type_.as_deref())
            };
            let ro = if mount.read_only == Some(true) { ":ro" } else { "" };
            args.extend(["--volume".into(), format!("{}:{}{ro}", source.display(), mount.mount_path)]);
        }
        args.extend(["--volume".into(), format!("{ROOT}/config/demo:{MANIFESTS_MOUNT}:ro")]);
        // command replaces the image's entrypoint, args its cmd; $(VAR)
        // expanded by the kubelet, not a shell.
        let expand = |w: &String| vars.iter().fold(w.clone(), |w, (var, value)| w.replace(var, value));
        let command: Vec<String> = c.command.iter().flatten().map(expand).collect();
        args.extend(["--entrypoint".into(), serde_json::to_string(&command).unwrap(), TAG.into()]);
        args.extend(c.args.iter().flatten().map(expand));
        args.push(format!("--manifests={MANIFESTS_MOUNT}"));
        args
    }
}

/// A hostPath volume's source as the kubelet makes it: `FileOrCreate`
/// creates an empty file. This machine has no `/lib/modules` (its kernel
/// has no loadable modules): an empty directory of the test's stands in.
fn host_path(path: &str, kind: Option<&str>) -> PathBuf {
    match kind {
        Some("FileOrCreate") => {
            std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
            PathBuf::from(path)
        }
        _ if Path::new(path).exists() => PathBuf::from(path),
        _ => {
            let stand_in =
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hostpath{}", path.replace('/', "-")));
            std::fs::create_dir_all(&stand_in).unwrap();
            stand_in
        }
    }
}

/// The demo lab (deploy/demo/netns.sh, prefix `kpri<pid><case>`) and the
/// pod in it; on drop the container is removed (its log printed on a
/// failure) and the lab taken down.
struct Node {
    prefix: String,
    container: String,
    podman: Podman,
}

impl Node {
    fn up(case: &str) -> Node {
        let prefix = format!("kpri{}{case}", std::process::id());
        let node = Node { container: format!("{prefix}-pod"), prefix, podman: image().podman.clone() };
        let out = node.script(&["up"]);
        assert!(out.contains("up:"), "netns.sh up: {out}");
        node
    }

    fn script(&self, args: &[&str]) -> String {
        ok(Command::new(format!("{ROOT}/deploy/demo/netns.sh")).args(args).env("KPR_DEMO_PREFIX", &self.prefix))
    }

    /// The node's namespace (where the pod's host network is).
    fn ns(&self) -> &str {
        &self.prefix
    }

    fn exec(&self, args: &[&str]) -> String {
        ok(Command::new("ip").args(["netns", "exec", self.ns()]).args(args))
    }

    fn start_pod(&self) {
        let deploy = Deploy::load();
        let config_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-config", self.prefix));
        deploy.write_config_map(&config_dir);
        let args = deploy.podman_args(&self.container, self.ns(), &config_dir);
        ok(self.podman.run().args(&args));
    }

    /// The nat table as `backend`'s iptables-save prints it in the node.
    fn nat(&self, backend: &str) -> String {
        self.exec(&[&format!("iptables-{backend}-save"), "-t", "nat"])
    }

    fn programmed(&self, backend: &str) -> bool {
        self.nat(backend).lines().any(|l| l.starts_with("-A KUBE-SERVICES") && l.contains(WEB_CLUSTER_IP))
    }

    fn wait_programmed(&self, backend: &str) {
        let deadline = Instant::now() + START_DEADLINE;
        while !self.programmed(backend) {
            assert!(self.running(), "the container stopped:\n{}", self.logs());
            assert!(
                Instant::now() < deadline,
                "no web rule in iptables-{backend} after {START_DEADLINE:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn inspect(&self, format: &str) -> String {
        ok(self.podman.command().args(["inspect", "--format", format, &self.container])).trim().to_string()
    }

    fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    fn logs(&self) -> String {
        let o = output(self.podman.command().args(["logs", &self.container]));
        format!("{}{}", text(&o.stdout), text(&o.stderr))
    }

    /// `GET path` on 127.0.0.1:port in the node: status and body.
    fn http(&self, port: u16, path: &str) -> Result<(u16, String), String> {
        common::run_in(self.ns(), || {
            let addr = format!("127.0.0.1:{port}").parse().unwrap();
            let mut s =
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .map_err(|e| e.to_string())?;
            let mut text = String::new();
            s.read_to_string(&mut text).map_err(|e| format!("read: {e}"))?;
            let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no header end: {text}"))?;
            let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| format!("status: {head}"))?;
            Ok((code, body.to_string()))
        })
    }

    /// `netns.sh try web` from the client: the web pod that answered.
    fn try_web(&self) -> String {
        let answer = self.script(&["try", "web", "client"]);
        let pod = answer.split_whitespace().next().unwrap_or_default().to_string();
        assert!(pod.starts_with("web-"), "web answered {answer:?}");
        pod
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- container {} log ---\n{}", self.container, self.logs());
        }
        let _ = output(self.podman.command().args(["rm", "--force", "--time", "5", &self.container]));
        let _ = output(
            Command::new(format!("{ROOT}/deploy/demo/netns.sh")).arg("down").env("KPR_DEMO_PREFIX", &self.prefix),
        );
    }
}

/// The node's rules before the pod starts, and which backend the wrapper
/// must pick: legacy when only legacy holds rules; nft when both do and
/// nft holds more (so nft wins by its rules, not as the default on a tie).
fn seed(node: &Node, legacy_rules: usize, nft_rules: usize) {
    for (backend, n) in [("legacy", legacy_rules), ("nft", nft_rules)] {
        for i in 0..n {
            node.exec(&[
                &format!("iptables-{backend}"),
                "-A",
                "INPUT",
                "-s",
                &format!("203.0.113.{}", i + 1),
                "-j",
                "ACCEPT",
            ]);
        }
    }
}

/// The whole pod life on the demo node, with the wrapper expected to pick `backend`.
fn pod_on_the_demo_node(case: &str, backend: &str, other: &str, legacy_rules: usize, nft_rules: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let node = Node::up(case);
    seed(&node, legacy_rules, nft_rules);
    let t = Instant::now();
    node.start_pod();
    node.wait_programmed(backend);
    eprintln!("{case}: rules in iptables-{backend} {:.1} s after podman run", t.elapsed().as_secs_f64());
    assert!(!node.nat(other).contains("KUBE-SERVICES"), "rules in iptables-{other} too:\n{}", node.nat(other));
    // The wrapper's choice, in the container: the alternatives point at it.
    let chosen = ok(node.podman.command().args(["exec", &node.container, "readlink", "/etc/alternatives/iptables"]));
    assert_eq!(chosen.trim(), format!("/usr/sbin/iptables-{backend}"), "the wrapper's choice");

    let deadline = Instant::now() + START_DEADLINE;
    loop {
        match node.http(10256, "/healthz") {
            Ok((200, _)) => break,
            other => assert!(Instant::now() < deadline, "/healthz: {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, metrics) = node.http(10249, "/metrics").expect("/metrics");
    assert_eq!(code, 200, "/metrics");
    assert!(metrics.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds"), "{metrics}");

    let pod = node.try_web();
    eprintln!("{case}: web ClusterIP answered from {pod}");

    // SIGTERM, as the kubelet stops a pod: exit 0, the rules stay and carry traffic.
    let stop_signal = node.inspect("{{.Config.StopSignal}}");
    assert!(matches!(stop_signal.as_str(), "" | "15" | "SIGTERM" | "TERM"), "stop signal {stop_signal}");
    ok(node.podman.command().args(["stop", "--time", "20", &node.container]));
    assert_eq!(node.inspect("{{.State.ExitCode}}"), "0", "exit code after podman stop:\n{}", node.logs());
    assert!(node.programmed(backend), "rules gone after stop:\n{}", node.nat(backend));
    node.try_web();
}

#[test]
fn daemon_set_pod_picks_iptables_legacy_when_the_node_uses_it() {
    pod_on_the_demo_node("l", "legacy", "nft", 1, 0);
}

#[test]
fn daemon_set_pod_picks_iptables_nft_when_it_holds_more_rules() {
    pod_on_the_demo_node("n", "nft", "legacy", 1, 2);
}

// ------------------------------------------------------------ IPVS mode in the VM

/// tests/vm/guest/ipvs-scenarios.sh's scenarios run against the image: a
/// start that takes over stale state, Services of each kind carrying
/// packets, a switch to iptables mode and back through the image's
/// iptables, `--cleanup`.
const VM_SCENARIOS: [&str; 7] = [
    "takeover-start",
    "clusterip-tcp-every-backend",
    "clusterip-udp-every-backend",
    "nodeport-on-node-ip",
    "lb-ingress-ip",
    "switch-modes-cleans-the-other-modes-state",
    "cleanup-removes-everything",
];

/// This host's kernel has no IPVS: the image's root filesystem (`podman
/// export` of a container of it: exactly its files) goes into the qemu VM
/// (tests/vm), where tests/vm/guest/image-ipvs.sh runs the daemon chrooted
/// into it, in IPVS mode, through [`VM_SCENARIOS`].
#[test]
fn image_root_filesystem_runs_ipvs_mode_in_the_vm() {
    let image = image();
    let tar = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kube-proxy-rs-test-rootfs.tar");
    let id = ok(image.podman.command().args(["create", "--entrypoint", "/bin/true", TAG])).trim().to_string();
    let export = output(image.podman.command().args(["export", "--output"]).arg(&tar).arg(&id));
    let _ = output(image.podman.command().args(["rm", &id]));
    assert!(export.status.success(), "podman export: {}", text(&export.stderr));

    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("image-vm.log");
    let t = Instant::now();
    let out = output(
        Command::new(format!("{ROOT}/tests/vm/run-vm-test.sh"))
            .args(["--quiet", "--timeout", "600", "--mem", "1280"])
            .arg("--file")
            .arg(format!("{}:/image.tar", tar.display()))
            .args(["--file", &format!("{ROOT}/tests/vm/scenarios:/scenarios")])
            .args(["--file", &format!("{ROOT}/tests/vm/guest/ipvs-scenarios.sh:/ipvs-scenarios.sh")])
            .args(["--env", &format!("KPR_SCENARIOS={}", VM_SCENARIOS.join(" "))])
            .arg("--log")
            .arg(&log)
            .arg(format!("{ROOT}/tests/vm/guest/image-ipvs.sh")),
    );
    let _ = std::fs::remove_file(&tar);
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    let results: Vec<&str> = lines.iter().copied().filter(|l| l.starts_with("SCENARIO ")).collect();
    eprintln!("VM run with the image took {:.1} s (console log {}):", t.elapsed().as_secs_f64(), log.display());
    for line in lines.iter().filter(|l| l.starts_with("image: ") || l.starts_with("SCENARIO ")) {
        eprintln!("  {line}");
    }
    for name in VM_SCENARIOS {
        let line = results.iter().find(|l| l.starts_with(&format!("SCENARIO {name}: ")));
        assert_eq!(line.map(|l| l.ends_with(": PASS")), Some(true), "{name}: {line:?}\n{}", lines.join("\n"));
    }
    assert_eq!(results.len(), VM_SCENARIOS.len(), "{results:#?}");
    assert!(out.status.success(), "VM run failed: {}\n{}", text(&out.stderr), lines.join("\n"));
}
