//! End to end: the daemon binary, started with a kubeconfig pointing at the
//! test API server (src/testkit/apiserver), programs IPVS on a real kernel
//! and follows creates, updates and deletes of Services and EndpointSlices,
//! across a forced watch drop and a 410 relist.
//!
//! IPVS needs the VM: on the host this test boots it (tests/vm/run-vm-test.sh)
//! with this very test binary and the daemon inside, and the test runs again
//! there (VMTEST=1), the API server on the guest's loopback.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::apiserver::ApiServer;
use common::vm::VmRun;
use kube_proxy_rs::fixtures::{ep, from_json, node, service, slice};

const TEST: &str = "daemon_follows_the_api_server_on_a_real_kernel";
const DAEMON_LOG: &str = "/tmp/daemon.log";

#[test]
fn daemon_follows_the_api_server_on_a_real_kernel() {
    if std::env::var_os("VMTEST").is_some() {
        guest();
        return;
    }
    VmRun::this_test(TEST, 600, 1, 768, &common::bin(), &[]).assert_passed();
}

fn ipvs() -> String {
    let out = Command::new("ipvsadm").args(["-S", "-n"]).output().expect("ipvsadm");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls until `pred(ipvsadm -S -n)` holds, or fails with `what`.
async fn until(what: &str, secs: u64, pred: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let state = ipvs();
        if pred(&state) {
            return;
        }
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(DAEMON_LOG).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            let tail = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
            panic!("{what}: not reached in {secs}s; IPVS:\n{state}\ndaemon log tail:\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn start_daemon(kubeconfig: &str, log: &str) -> Child {
    let log = std::fs::File::create(log).expect("daemon log");
    Command::new("kube-proxy-rs")
        .args(["--proxy-mode", "ipvs", "--kubeconfig", kubeconfig, "--hostname-override", "node-a"])
        .args(["--ipvs-min-sync-period", "0s", "--ipvs-sync-period", "60s", "--v", "2"])
        .stderr(Stdio::from(log))
        .spawn()
        .expect("start kube-proxy-rs")
}

fn syncs_in(log: &str) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().matches("sync finished").count()
}

fn web(ips: &[&str]) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let eps: Vec<_> = ips.iter().map(|ip| ep(ip, "node-b")).collect();
    slice("default", "web-1", "web", &[("http", "TCP", 8080)], &eps)
}

fn guest() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let api = ApiServer::start().await;
        api.create(&node("node-a", "192.168.50.2", "zone-a")).unwrap();
        api.create(&service("default", "web", "10.96.0.20", &[("http", "TCP", 80, 0)])).unwrap();
        api.create(&web(&["10.244.1.5"])).unwrap();
        let kubeconfig = "/tmp/kubeconfig";
        std::fs::write(kubeconfig, kubeconfig_text(&api.url())).unwrap();
        let log = DAEMON_LOG;
        let mut daemon = start_daemon(kubeconfig, log);

        until("initial list programmed", 60, |s| s.contains("-a -t 10.96.0.20:80 -r 10.244.1.5:8080")).await;
        // create
        api.create(&service("default", "dns", "10.96.0.10", &[("dns", "UDP", 53, 0)])).unwrap();
        until("created service", 20, |s| s.contains("-A -u 10.96.0.10:53")).await;
        // update
        api.update(&web(&["10.244.1.5", "10.244.2.5"])).unwrap();
        until("updated slice", 20, |s| s.contains("-r 10.244.2.5:8080")).await;
        // a dropped watch resumes
        assert!(api.cut_watches() > 0, "the daemon had open watches");
        api.create(&service("default", "after-cut", "10.96.0.30", &[("http", "TCP", 80, 0)])).unwrap();
        until("service created after a watch drop", 30, |s| s.contains("-A -t 10.96.0.30:80")).await;
        // a 410 relist of unchanged objects writes nothing to the kernel
        tokio::time::sleep(Duration::from_secs(2)).await;
        let before = syncs_in(log);
        api.compact();
        api.cut_watches();
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(syncs_in(log), before, "a relist of the same objects caused a sync");
        // a delete missed while the watch was down shows up after the relist
        api.compact();
        api.cut_watches();
        let gone: k8s_openapi::api::core::v1::Service =
            from_json(serde_json::json!({"metadata": {"namespace": "default", "name": "dns"}}));
        api.delete(&gone).unwrap();
        until("deleted service", 30, |s| !s.contains("10.96.0.10")).await;
        // delete the last endpoint
        api.update(&web(&["10.244.2.5"])).unwrap();
        until("removed endpoint", 20, |s| !s.contains("10.244.1.5") && s.contains("10.244.2.5")).await;

        let _ = daemon.kill();
        let _ = daemon.wait();
    });
}

fn kubeconfig_text(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n\
         current-context: test\nusers:\n- name: test\n  user: {{}}\n"
    )
}
