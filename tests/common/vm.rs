//! The host part of a test whose guest part runs in the qemu VM: boots
//! tests/vm/run-vm-test.sh with the daemon and this very test binary, which
//! runs the named test again inside (`VMTEST=1` is set there).

use std::process::Command;

/// One boot: whether the test passed in the guest, and the console.
pub struct VmRun {
    pub passed: bool,
    pub code: Option<i32>,
    pub console: String,
}

impl VmRun {
    /// Runs `test` of the current test binary in the VM (`timeout`,
    /// `retries` and `mem` as run-vm-test.sh's options), `env` passed as
    /// `NAME=VALUE`.
    pub fn this_test(test: &str, timeout: u32, retries: u32, mem: u32, env: &[String]) -> VmRun {
        let root = env!("CARGO_MANIFEST_DIR");
        let me = std::env::current_exe().expect("test binary path");
        let log = std::env::temp_dir().join(format!("kpr-vm-{test}-{}.log", std::process::id()));
        let mut vm = Command::new(format!("{root}/tests/vm/run-vm-test.sh"));
        vm.args(["--quiet", "--timeout", &timeout.to_string(), "--retries", &retries.to_string()]);
        vm.args(["--mem", &mem.to_string(), "--bin", &super::bin()]);
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
