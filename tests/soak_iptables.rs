//! Convergence under churn and faults, iptables mode (iptables-legacy, so
//! the xtables lock applies): the daemon binary against the test API
//! server in the packet lab, ≥ 300 Services of every kind changed ten
//! times a second for two minutes (`SOAK_SECONDS`), faults injected on the
//! way, each followed by the convergence check (`common::soak`: `--dry-run
//! --diff` clean, probe Services answering from their ready backends),
//! then RSS flat and no unexplained WARN/ERROR. Faults here: kill -9 in a
//! sync, the xtables lock held 10 s, `KUBE-SERVICES` flushed, a rule of a
//! `KUBE-SVC-` chain deleted (single-stack); the API server restarting,
//! answering 500s, closing watches, 410 Gone, and a burst of 1,000
//! changes in a second (dual-stack).
//!
//! Needs root, iproute2, iptables-legacy, flock; nothing is skipped.

mod common;

use common::soak::{Fault, Mode, SoakLab, SoakPlan};

#[test]
fn iptables_converges_under_churn_kill_lock_and_foreign_writes() {
    let mut lab = SoakLab::start("ipt4", Mode::Iptables, false, 31);
    lab.run(&SoakPlan::ci(&[Fault::Kill9, Fault::XtablesLock, Fault::FlushChain, Fault::DeleteElement]));
    lab.stop();
}

#[test]
fn iptables_dual_stack_converges_under_churn_and_api_server_faults() {
    let mut lab = SoakLab::start("ipt6", Mode::Iptables, true, 32);
    let faults = [Fault::ApiRestart, Fault::Api500, Fault::CloseWatches, Fault::Gone410, Fault::Burst];
    lab.run(&SoakPlan::ci(&faults));
    lab.stop();
}
