//! Helpers shared by the integration tests: the binary's path and network
//! namespaces that clean up after themselves.

#![allow(dead_code)]

pub use kube_proxy_rs::testkit::apiserver;
pub mod conntrack;
pub mod daemon;
pub mod lab;
pub mod nft;
pub mod soak;
pub mod vm;

use std::io::Write;
use std::process::{Command, Output, Stdio};

pub fn bin() -> String {
    env!("CARGO_BIN_EXE_kube-proxy-rs").to_string()
}

fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// A network namespace, deleted on drop. Needs root (CI runs as root).
pub struct Netns {
    pub name: String,
    host_if: Option<String>,
}

impl Netns {
    pub fn new(prefix: &str) -> Netns {
        let name = format!("{prefix}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh(&["ip", "netns", "add", &name]);
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Netns { name, host_if: None }
    }

    /// The test API server, listening on 127.0.0.1 inside this namespace
    /// (a thread of its own entered into it), until the sender is dropped.
    pub fn api_server(&self) -> (apiserver::ApiServer, std::sync::mpsc::Sender<()>) {
        apiserver::ApiServer::start_in_netns(&self.name)
    }

    /// A veth pair between the host and this namespace; `inner` goes inside.
    pub fn veth_to_host(&mut self, inner: &str, outer: &str) -> &mut Self {
        let host_if = format!("vh{}", std::process::id() % 100_000);
        let _ = Command::new("ip").args(["link", "del", &host_if]).output();
        sh(&["ip", "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &self.name]);
        sh(&["ip", "addr", "add", outer, "dev", &host_if]);
        sh(&["ip", "link", "set", &host_if, "up"]);
        sh(&["ip", "-n", &self.name, "addr", "add", inner, "dev", "eth0"]);
        sh(&["ip", "-n", &self.name, "link", "set", "eth0", "up"]);
        self.host_if = Some(host_if);
        self
    }

    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip").args(["netns", "exec", &self.name]).args(args).output().expect("ip netns exec")
    }

    /// Runs unprivileged (uid/gid 65534) inside the namespace.
    pub fn exec_as_nobody(&self, args: &[&str]) -> Output {
        let mut cmd = vec!["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
        cmd.extend_from_slice(args);
        self.exec(&cmd)
    }
}

impl Netns {
    /// Runs `f` on a thread that entered this namespace with setns(2): the
    /// sockets it opens and the processes it starts (ipset, iptables) live
    /// here, while the test's own thread and the host stay untouched. A
    /// panic in `f` fails the test.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.name, f)
    }

    /// [`Netns::run`] with a current-thread Tokio runtime on that thread;
    /// `f` builds the future there (kernel handles' futures are not Send).
    pub fn block_on<T: Send, F: std::future::Future<Output = T>>(&self, f: impl FnOnce() -> F + Send) -> T {
        self.run(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            rt.block_on(f())
        })
    }

    /// Runs a command inside the namespace; panics unless it succeeds.
    /// Returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(out.status.success(), "{args:?} in {} failed: {}", self.name, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command inside the namespace with `input` on its stdin;
    /// panics unless it succeeds.
    pub fn pipe(&self, args: &[&str], input: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{args:?} in {}: {e}", self.name));
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} in {} failed: {err}\n{input}", self.name);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(h) = &self.host_if {
            let _ = Command::new("ip").args(["link", "del", h]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// [`Netns::run`] for any named namespace (`/run/netns/NAME`), also one
/// this process did not create.
pub fn run_in<T: Send>(ns_name: &str, f: impl FnOnce() -> T + Send) -> T {
    let path = format!("/run/netns/{ns_name}");
    std::thread::scope(|s| {
        let inner = s.spawn(|| {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|e| panic!("setns {path}: {e}"));
            f()
        });
        inner.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}
