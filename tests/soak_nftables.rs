//! Convergence under churn and faults, nftables mode: as `soak_iptables`
//! (`common::soak`), with the nftables faults: kill -9 in a sync, the
//! `services` chain flushed, a `service-ips` element deleted, our table
//! deleted so that transactions are refused until a full sync writes it
//! again (single-stack); the API server restarting, answering 500s,
//! closing watches, 410 Gone, and a burst of 1,000 changes in a second
//! (dual-stack).
//!
//! Needs root, iproute2, nft, iptables; nothing is skipped.

mod common;

use common::soak::{Fault, Mode, SoakLab, SoakPlan};

#[test]
fn nftables_converges_under_churn_kill_and_foreign_writes() {
    let mut lab = SoakLab::start("nft4", Mode::Nftables, false, 41);
    lab.run(&SoakPlan::ci(&[Fault::Kill9, Fault::FlushChain, Fault::DeleteElement, Fault::RefuseOps]));
    lab.stop();
}

#[test]
fn nftables_dual_stack_converges_under_churn_and_api_server_faults() {
    let mut lab = SoakLab::start("nft6", Mode::Nftables, true, 42);
    let faults = [Fault::ApiRestart, Fault::Api500, Fault::CloseWatches, Fault::Gone410, Fault::Burst];
    lab.run(&SoakPlan::ci(&faults));
    lab.stop();
}
