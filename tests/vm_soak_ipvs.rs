//! Convergence under churn and faults, IPVS mode, on a real kernel: as
//! `soak_iptables` (`common::soak`: ≥ 300 Services of every kind changed
//! ten times a second through the test API server, each fault followed by
//! `--dry-run --diff` clean and the probe Services answering from their
//! ready backends, then RSS flat and no unexplained WARN/ERROR), in the
//! qemu VM (IPVS is not on the host). One boot runs both families at once,
//! each in its own lab (network namespaces: IPVS is per namespace), each
//! with the whole churn time (`SOAK_SECONDS`, default 120): single-stack
//! with kill -9 in a sync, a `KUBE-CLUSTER-IP` member deleted, the API
//! server answering 500s, the watches closed and a burst of 1,000
//! changes; dual-stack with a real server removed (`ipvsadm -d`), a
//! kube-ipvs0 address deleted, the API server restarting and 410 Gone.
//!
//! The daemon and this test in the VM are release builds
//! ([`common::vm::ReleaseBuild`]): under TCG a debug daemon's user space
//! was most of the time (its first full sync after a restart 137–143 s
//! against ≈ 10 s), and the debug harness and test API servers half of
//! the guest's CPU.
//!
//! On the host the test boots the VM (tests/vm/run-vm-test.sh) with the
//! release build of this test binary and the daemon inside; there it runs
//! again (VMTEST=1).
//! `SOAK_FAMILIES=4` or `=6` runs one family only (to iterate).
//!
//! Needs root, qemu and the packages `.ci/install-deps.sh` installs; it
//! fails (never skips) when they are missing.

mod common;

use std::process::Command;
use std::time::Instant;

use common::soak::{Fault, Mode, SoakLab, SoakPlan};
use common::vm::{ReleaseBuild, VmRun};

const TEST: &str = "ipvs_converges_under_churn_kill_foreign_writes_and_api_faults";

#[test]
fn ipvs_converges_under_churn_kill_foreign_writes_and_api_faults() {
    if std::env::var_os("VMTEST").is_some() {
        guest();
        return;
    }
    let release = ReleaseBuild::of("vm_soak_ipvs");
    let started = Instant::now();
    let env: Vec<String> = ["SOAK_SECONDS", "SOAK_FAMILIES"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| format!("{name}={v}")))
        .collect();
    // The release build of this test in the guest: as debug code under TCG
    // its harness and the test API servers took half of the guest's CPU.
    // The timeout is a hang guard, not a budget (165-176 s at load 1-2);
    // no second boot, a hang would double it.
    let run = VmRun::test_of(release.tests.as_ref(), TEST, 900, 0, 1536, &release.daemon, &env);
    let soak: Vec<&str> = run.console.lines().filter(|l| l.contains("soak: ")).collect();
    eprintln!("{}", soak.join("\n"));
    eprintln!("VM soak took {:.0} s", started.elapsed().as_secs_f64());
    run.assert_passed();
}

/// In the VM: the daemon binary is on PATH (`--bin`); the harness runs the
/// path the host built the test's daemon at.
fn guest() {
    let host_path = std::path::PathBuf::from(common::bin());
    std::fs::create_dir_all(host_path.parent().expect("a directory")).expect("the binary's directory");
    let _ = std::os::unix::fs::symlink("/usr/local/bin/kube-proxy-rs", &host_path);
    // The set types' modules, loaded before the two families' ipset actors
    // ask for them at once (the kernel's on-demand load answered one of
    // two concurrent requests "no such set type" under TCG); nf_tables,
    // which the daemon's start-up asks for nftables mode's table (its
    // on-demand load answered the first daemon EINVAL); the iptables tables
    // both labs' daemons probe at once (one start failed with `iptables -t
    // nat`: "Interrupted system call" while the other loaded the module).
    let modules = [
        "ip_set_hash_ip",
        "ip_set_hash_ipport",
        "ip_set_hash_ipportip",
        "ip_set_hash_ipportnet",
        "ip_set_bitmap_port",
        "nf_tables",
        "iptable_nat",
        "iptable_filter",
        "iptable_mangle",
        "ip6table_nat",
        "ip6table_filter",
        "ip6table_mangle",
    ];
    let loaded = Command::new("modprobe").arg("-a").args(modules).status().expect("modprobe");
    assert!(loaded.success(), "modprobe -a {modules:?}: {loaded}");
    let families = std::env::var("SOAK_FAMILIES").unwrap_or_else(|_| "4,6".into());
    let runs: Vec<(&str, bool, u64, Vec<Fault>)> = [
        // Each lab's checks cost about the same (the slower lab is the wall
        // time, ≈ 7 s a check): five faults and four, a daemon restart in
        // each (kill -9 in one, the removed real server's full resync in the
        // other), an API server fault on either side.
        (
            "ipvs4",
            false,
            51,
            vec![Fault::Kill9, Fault::DeleteElement, Fault::Api500, Fault::CloseWatches, Fault::Burst],
        ),
        (
            "ipvs6",
            true,
            52,
            vec![Fault::RemoveRealServer, Fault::DeleteServiceAddress, Fault::ApiRestart, Fault::Gone410],
        ),
    ]
    .into_iter()
    .filter(|(_, dual, ..)| families.split(',').any(|f| f == if *dual { "6" } else { "4" }))
    .collect();
    assert!(!runs.is_empty(), "SOAK_FAMILIES={families}: 4, 6 or 4,6");
    std::thread::scope(|s| {
        let labs: Vec<_> = runs
            .into_iter()
            .map(|(tag, dual_stack, seed, faults)| {
                s.spawn(move || {
                    let mut lab = SoakLab::start(tag, Mode::Ipvs, dual_stack, seed);
                    lab.run(&SoakPlan::ci(&faults));
                    lab.stop();
                })
            })
            .collect();
        let failed = labs.into_iter().map(|l| l.join()).filter(Result::is_err).count();
        eprintln!("soak: {}", cpu_seconds());
        assert_eq!(failed, 0, "a family's soak failed (its panic is above)");
    });
}

/// Where the guest's CPU went: this test binary's threads (the harness
/// and the test API servers), the children it waited for (daemons, dry
/// runs, tools), and all CPUs busy since boot, in seconds
/// (`/proc/self/stat`, `/proc/stat`; USER_HZ is 100 on Linux).
fn cpu_seconds() -> String {
    let ticks = |words: &[&str], at: std::ops::Range<usize>| -> f64 {
        words.get(at).unwrap_or_default().iter().filter_map(|w| w.parse::<u64>().ok()).sum::<u64>() as f64 / 100.0
    };
    let me = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command's closing parenthesis, from the state (field 3).
    let fields: Vec<&str> = me.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu: Vec<&str> = stat.lines().next().unwrap_or_default().split_whitespace().skip(1).collect();
    let all = ticks(&cpu, 0..cpu.len());
    let idle = ticks(&cpu, 3..5);
    format!(
        "CPU: the test binary {:.0} s, its children {:.0} s; all CPUs busy {:.0} s of {:.0} s",
        ticks(&fields, 11..13),
        ticks(&fields, 13..15),
        all - idle,
        all
    )
}
