//! The host part of a test whose guest part runs in the qemu VM: boots
//! tests/vm/run-vm-test.sh with the daemon and this very test binary, which
//! runs the named test again inside (`VMTEST=1` is set there).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::Value;

/// One boot: whether the test passed in the guest, and the console.
pub struct VmRun {
    pub passed: bool,
    pub code: Option<i32>,
    pub console: String,
}

impl VmRun {
    /// Runs `test` of the current test binary in the VM (`timeout`,
    /// `retries` and `mem` as run-vm-test.sh's options), `env` passed as
    /// `NAME=VALUE`, the daemon binary `daemon` in the guest's
    /// /usr/local/bin.
    pub fn this_test(test: &str, timeout: u32, retries: u32, mem: u32, daemon: &str, env: &[String]) -> VmRun {
        let root = env!("CARGO_MANIFEST_DIR");
        let me = std::env::current_exe().expect("test binary path");
        let log = std::env::temp_dir().join(format!("kpr-vm-{test}-{}.log", std::process::id()));
        let mut vm = Command::new(format!("{root}/tests/vm/run-vm-test.sh"));
        vm.args(["--quiet", "--timeout", &timeout.to_string(), "--retries", &retries.to_string()]);
        vm.args(["--mem", &mem.to_string(), "--bin", daemon]);
        vm.arg("--log").arg(&log);
        for e in env {
            vm.args(["--env", e]);
        }
        let out = vm
            .arg("--exec")
            .arg(&me)
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .output()
            .expect("run tests/vm/run-vm-test.sh (is qemu installed? run .ci/install-deps.sh)");
        let console = std::fs::read_to_string(&log).unwrap_or_default();
        VmRun { passed: out.status.success(), code: out.status.code(), console }
    }

    /// Fails with the console's last 60 lines unless the test passed.
    pub fn assert_passed(&self) {
        let tail: Vec<&str> = self.console.lines().rev().take(60).collect();
        assert!(
            self.passed,
            "the test failed in the VM (exit {:?}); console tail:\n{}",
            self.code,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// The variables cargo sets for a test binary (a trailing `_`: a prefix).
const CARGO_SETS_FOR_TESTS: [&str; 9] = [
    "CARGO_MANIFEST_DIR",
    "CARGO_MANIFEST_PATH",
    "CARGO_MANIFEST_LINKS",
    "CARGO_CRATE_NAME",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_PKG_",
    "CARGO_BIN_EXE_",
    "OUT_DIR",
];

/// The daemon built with the release profile (`cargo build --release
/// --locked --bin kube-proxy-rs`, which does nothing when it is built:
/// `.ci/run` builds it before the tests), for VM tests whose time under
/// TCG is the daemon's own user space. Its path is the one cargo reports.
pub fn release_daemon() -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let started = Instant::now();
    let mut build = Command::new(cargo);
    // Without what cargo sets for a test (the package's variables): build
    // scripts watch some of them (ring's CARGO_MANIFEST_DIR, CARGO_PKG_NAME),
    // so with them the build `.ci/run` made would be built again.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if CARGO_SETS_FOR_TESTS.iter().any(|set| name == *set || (set.ends_with('_') && name.starts_with(set))) {
            build.env_remove(&*name);
        }
    }
    let out = build
        .args(["build", "--release", "--locked", "--bin", "kube-proxy-rs", "--message-format=json"])
        .arg("--manifest-path")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build --release");
    assert!(out.status.success(), "cargo build --release --bin kube-proxy-rs: {}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "kube-proxy-rs")
        .find_map(|m| m["executable"].as_str().map(String::from))
        .expect("cargo reports the kube-proxy-rs executable");
    eprintln!("the release daemon {path} in {:.1} s", started.elapsed().as_secs_f64());
    path
}
