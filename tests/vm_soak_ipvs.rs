//! Convergence under churn and faults, IPVS mode, on a real kernel: as
//! `soak_iptables` (`common::soak`: ≥ 300 Services of every kind changed
//! ten times a second through the test API server, each fault followed by
//! `--dry-run --diff` clean and the probe Services answering from their
//! ready backends, then RSS flat and no unexplained WARN/ERROR), in the
//! qemu VM (IPVS is not on the host). One boot runs both families, one
//! after the other: single-stack with kill -9 in a sync and a
//! `KUBE-CLUSTER-IP` member deleted, dual-stack with a real server removed
//! (`ipvsadm -d`) and a kube-ipvs0 address deleted. The churn time
//! (`SOAK_SECONDS`, default [`VM_CHURN_SECONDS`]) is split over the families run.
//!
//! On the host the test boots the VM (tests/vm/run-vm-test.sh) with this
//! test binary and the daemon inside; there it runs again (VMTEST=1).
//! `SOAK_FAMILIES=4` or `=6` runs one family only (to iterate).
//!
//! Needs root, qemu and the packages `.ci/install-deps.sh` installs; it
//! fails (never skips) when they are missing.

mod common;

use std::process::Command;
use std::time::Instant;

use common::soak::{Fault, Mode, SoakLab, SoakPlan};
use common::vm::VmRun;

const TEST: &str = "ipvs_converges_under_churn_kill_and_foreign_writes";
/// Seconds of churn in the VM over both families.
const VM_CHURN_SECONDS: u32 = 120;

#[test]
fn ipvs_converges_under_churn_kill_and_foreign_writes() {
    if std::env::var_os("VMTEST").is_some() {
        guest();
        return;
    }
    let started = Instant::now();
    let seconds = std::env::var("SOAK_SECONDS").unwrap_or_else(|_| VM_CHURN_SECONDS.to_string());
    let mut env = vec![format!("SOAK_SECONDS={seconds}")];
    env.extend(std::env::var("SOAK_FAMILIES").map(|f| format!("SOAK_FAMILIES={f}")));
    // Both families take 17-20 min under TCG on 2 cores (one family alone
    // 8-12 min); no second boot: a hang would double the CI time.
    let run = VmRun::this_test(TEST, 1800, 0, 1536, &env);
    let soak: Vec<&str> = run.console.lines().filter(|l| l.contains("soak: ")).collect();
    eprintln!("{}", soak.join("\n"));
    eprintln!("VM soak took {:.0} s", started.elapsed().as_secs_f64());
    run.assert_passed();
}

/// In the VM: the daemon binary is on PATH (`--bin`); the harness runs the
/// path the host built it at.
fn guest() {
    let host_path = std::path::PathBuf::from(common::bin());
    std::fs::create_dir_all(host_path.parent().expect("a directory")).expect("the binary's directory");
    let _ = std::os::unix::fs::symlink("/usr/local/bin/kube-proxy-rs", &host_path);
    // The set types' modules, loaded before the two families' ipset actors
    // ask for them at once (the kernel's on-demand load answered one of
    // two concurrent requests "no such set type" under TCG).
    let modules =
        ["ip_set_hash_ip", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet", "ip_set_bitmap_port"];
    let loaded = Command::new("modprobe").arg("-a").args(modules).status().expect("modprobe");
    assert!(loaded.success(), "modprobe -a {modules:?}: {loaded}");
    let families = std::env::var("SOAK_FAMILIES").unwrap_or_else(|_| "4,6".into());
    let runs: Vec<(&str, bool, u64, [Fault; 2])> = [
        ("ipvs4", false, 51, [Fault::Kill9, Fault::DeleteElement]),
        ("ipvs6", true, 52, [Fault::RemoveRealServer, Fault::DeleteServiceAddress]),
    ]
    .into_iter()
    .filter(|(_, dual, ..)| families.split(',').any(|f| f == if *dual { "6" } else { "4" }))
    .collect();
    assert!(!runs.is_empty(), "SOAK_FAMILIES={families}: 4, 6 or 4,6");
    let share = runs.len() as u32;
    for (tag, dual_stack, seed, faults) in runs {
        let mut plan = SoakPlan::ci(&faults);
        plan.churn /= share;
        let mut lab = SoakLab::start(tag, Mode::Ipvs, dual_stack, seed);
        lab.run(&plan);
        lab.stop();
    }
}
