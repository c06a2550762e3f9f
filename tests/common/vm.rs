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
        let me = std::env::current_exe().expect("test binary path");
        VmRun::test_of(&me, test, timeout, retries, mem, daemon, env)
    }

    /// As [`VmRun::this_test`], with `tests` (this test target built
    /// otherwise, e.g. [`ReleaseBuild::tests`]) run in the guest.
    pub fn test_of(
        tests: &std::path::Path,
        test: &str,
        timeout: u32,
        retries: u32,
        mem: u32,
        daemon: &str,
        env: &[String],
    ) -> VmRun {
        let root = env!("CARGO_MANIFEST_DIR");
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
            .arg(tests)
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

/// The release build of a test binary and of the daemon, from one
/// `cargo test --release --locked --features testkit --test TARGET
/// --no-run` (`.ci/run` runs the same command before the tests; then it
/// builds nothing): for VM tests whose time under TCG is user space, the
/// daemon's and the test's own (its harness and the test API server).
/// Paths as cargo reports them.
pub struct ReleaseBuild {
    /// The daemon, built with the test kit as the test binary links it.
    pub daemon: String,
    /// The test binary of `TARGET`.
    pub tests: String,
}

impl ReleaseBuild {
    /// Builds (or finds built) test target `target` and the daemon.
    pub fn of(target: &str) -> ReleaseBuild {
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
        let args = ["test", "--release", "--locked", "--features", "testkit", "--test", target, "--no-run"];
        let out = build
            .args(args)
            .arg("--message-format=json")
            .arg("--manifest-path")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo test --release --no-run");
        assert!(out.status.success(), "cargo {}: {}", args.join(" "), out.status);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let artifacts: Vec<Value> = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["reason"] == "compiler-artifact")
            .collect();
        let executable = |kind: &str, name: &str| {
            artifacts
                .iter()
                .filter(|m| m["target"]["name"] == name && m["target"]["kind"][0] == kind)
                .find_map(|m| m["executable"].as_str().map(String::from))
                .unwrap_or_else(|| panic!("cargo reports the {kind} {name}'s executable"))
        };
        let built = ReleaseBuild { daemon: executable("bin", "kube-proxy-rs"), tests: executable("test", target) };
        eprintln!("the release build of {target} and the daemon in {:.1} s", started.elapsed().as_secs_f64());
        built
    }
}
