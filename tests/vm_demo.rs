//! The README's demo in IPVS mode, which needs a kernel with IPVS: boots
//! the qemu VM (tests/vm/run-vm-test.sh) with the daemon, the backend
//! lister, deploy/demo and config, and runs tests/vm/guest/demo.sh there:
//! `netns.sh up`, `run ipvs`, `try` every target `help` lists, `down`.
//! It is the command `netns.sh run ipvs` names on a kernel without IPVS.
//!
//! Needs root, qemu and the packages `.ci/install-deps.sh` installs; it
//! fails (never skips) when they are missing.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

#[test]
fn demo_in_ipvs_mode_in_a_vm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let log = std::env::temp_dir().join(format!("kpr-vm-demo-{}.log", std::process::id()));
    let started = Instant::now();
    let out = Command::new(root.join("tests/vm/run-vm-test.sh"))
        .current_dir(root)
        .args(["--quiet", "--timeout", "600"])
        .args(["--bin", env!("CARGO_BIN_EXE_kube-proxy-rs"), "--bin", env!("CARGO_BIN_EXE_kpr-demo-backends")])
        .args(["--file", "deploy/demo", "--file", "config"])
        .arg("--log")
        .arg(&log)
        .arg("tests/vm/guest/demo.sh")
        .output()
        .expect("run tests/vm/run-vm-test.sh (is qemu installed? run .ci/install-deps.sh)");
    let console = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    let steps: Vec<&&str> = lines.iter().filter(|l| l.starts_with("==== ")).collect();
    eprintln!("VM run took {:.1}s; console log {}", started.elapsed().as_secs_f64(), log.display());
    for s in &steps {
        eprintln!("  {s}");
    }
    let tail = lines.iter().rev().take(60).rev().copied().collect::<Vec<_>>().join("\n");
    assert!(
        out.status.success(),
        "VM run failed (exit {:?}); stderr:\n{}\nconsole tail:\n{tail}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let tries = steps.iter().filter(|s| s.starts_with("==== step try ")).count();
    assert!(tries >= 12, "every target of help and web from the node: {tries} tries\n{tail}");
    assert!(lines.iter().any(|l| l.starts_with("==== PASS")), "no PASS line\n{tail}");
}
