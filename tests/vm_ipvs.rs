//! IPVS mode on a real kernel: boots a Debian kernel with ip_vs and dummy
//! links under qemu (tests/vm/run-vm-test.sh) with the daemon and
//! tests/vm/guest/ipvs-scenarios.sh, which asserts with real packets. A
//! failing scenario fails this test with its name and what it saw.
//!
//! Needs root, qemu and the packages `.ci/install-deps.sh` installs; it
//! fails (never skips) when they are missing.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[test]
fn ipvs_scenarios_in_a_vm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let daemon = env!("CARGO_BIN_EXE_kube-proxy-rs");
    let log = std::env::temp_dir().join(format!("kpr-vm-ipvs-{}.log", std::process::id()));
    let started = Instant::now();
    let out = Command::new(root.join("tests/vm/run-vm-test.sh"))
        .args(["--quiet", "--timeout", "1500", "--mem", "768"])
        .args(["--bin", daemon])
        .arg("--file")
        .arg(format!("{}:/scenarios", root.join("tests/vm/scenarios").display()))
        .arg("--log")
        .arg(&log)
        .arg(root.join("tests/vm/guest/ipvs-scenarios.sh"))
        .output()
        .expect("run tests/vm/run-vm-test.sh (is qemu installed? run .ci/install-deps.sh)");
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    let results: Vec<&&str> = lines.iter().filter(|l| l.starts_with("SCENARIO ")).collect();
    let failed: Vec<&&str> = results.iter().copied().filter(|l| l.contains(": FAIL")).collect();
    eprintln!(
        "VM run took {:.1}s; {} scenarios, console log {}",
        started.elapsed().as_secs_f64(),
        results.len(),
        log.display()
    );
    for r in &results {
        eprintln!("  {r}");
    }
    assert!(
        failed.is_empty(),
        "failed scenarios:\n{}",
        failed.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("\n")
    );
    assert!(
        out.status.success(),
        "VM run failed (exit {:?}) without a failing scenario line; stderr:\n{}\nconsole tail:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        lines.iter().rev().take(40).rev().copied().collect::<Vec<_>>().join("\n")
    );
    assert!(results.len() >= 20, "expected every scenario to report; got {}", results.len());
}
