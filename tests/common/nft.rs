//! nftables helpers shared by `nftables_mode` and `nftables_daemon`: the
//! sections of `--dry-run --proxy-mode nftables`, a listing's blocks, and
//! `nft monitor` in a namespace.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::daemon::{terminate, wait_for};
use super::Netns;

/// The text of section `heading` (`# nftables`, `# nftables ipv6`) of a
/// dry run's output, if any.
pub fn section<'a>(out: &'a str, heading: &str) -> Option<&'a str> {
    let start = out.find(&format!("{heading}\n"))?;
    let body = &out[start + heading.len() + 1..];
    let end = body.find("\n# ").map_or(body.len(), |i| i + 1);
    Some(&body[..end])
}

#[allow(unused_imports)]
pub use kube_proxy_rs::testkit::listing_blocks as blocks;

/// One nf_tables transaction as `nft monitor` reported it: its events
/// (`delete rule ip kube-proxy CHAIN handle 7`, ...), the process that
/// committed it (`nft`, `kube-proxy-rs`) and when the test read its last
/// line (shortly after the commit).
#[derive(Debug, Clone)]
pub struct MonitoredTx {
    pub at: Instant,
    pub by: String,
    pub events: Vec<String>,
}

/// `nft monitor` running in a namespace, each line it prints kept with the
/// time it was read; stopped on drop.
pub struct Monitor {
    child: Option<Child>,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Monitor {
    /// Starts `nft monitor` in `ns` and returns once it reports events (a
    /// table `kpr-monitor-ready` added and deleted by the test).
    pub fn start(ns: &Netns) -> Monitor {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "nft", "monitor"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Its warnings about elements of sets it has not cached.
            .stderr(Stdio::null())
            .spawn()
            .expect("start nft monitor");
        let out = child.stdout.take().expect("nft monitor's stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().expect("monitor lines").push((Instant::now(), line));
            }
        });
        let monitor = Monitor { child: Some(child), lines };
        wait_for("nft monitor to report", Duration::from_secs(5), || {
            ns.ok(&["nft", "add", "table", "ip", "kpr-monitor-ready"]);
            ns.ok(&["nft", "delete", "table", "ip", "kpr-monitor-ready"]);
            let seen =
                monitor.lines.lock().expect("monitor lines").iter().any(|(_, l)| l.contains("kpr-monitor-ready"));
            seen.then_some(()).ok_or_else(|| "nothing yet".to_string())
        });
        monitor
    }

    /// The transactions reported so far, oldest first (a transaction ends
    /// with its `# new generation N by process PID (NAME)` line).
    pub fn transactions(&self) -> Vec<MonitoredTx> {
        let lines = self.lines.lock().expect("monitor lines").clone();
        let mut out = Vec::new();
        let mut events = Vec::new();
        for (at, line) in lines {
            if let Some(rest) = line.strip_prefix("# new generation ") {
                let by = rest.rsplit_once(" (").map_or("", |(_, n)| n.trim_end_matches(')'));
                out.push(MonitoredTx { at, by: by.to_string(), events: std::mem::take(&mut events) });
            } else if !line.is_empty() {
                events.push(line);
            }
        }
        out
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            terminate(child, Duration::from_secs(2));
        }
    }
}

/// Each test `fn name(ruleset: NftRuleset)` of the test crate as
/// `upstream::name` and `maps::name` (nftables mode's two rulesets).
#[macro_export]
macro_rules! rulesets {
    ($($name:ident),* $(,)?) => {
        mod upstream {
            $(#[test] fn $name() { super::$name(kube_proxy_rs::plan::nftables::NftRuleset::Upstream) })*
        }
        mod maps {
            $(#[test] fn $name() { super::$name(kube_proxy_rs::plan::nftables::NftRuleset::Maps) })*
        }
    };
}
