//! The soak (convergence under churn and faults): a varied cluster and its
//! seeded change stream ([`cluster`]), and the pure verdicts on a run
//! ([`check`]). The soak tests (`tests/soak_*.rs`, `tests/common/soak.rs`)
//! and `kpr-bench soak` drive the daemon binary with them.

pub mod check;
pub mod cluster;
pub mod run;
