//! Benchmark support (issue 7): a deterministic synthetic cluster and churn
//! generator, used by the `kpr-bench` binary and by tests that need a
//! realistic cluster of a given size.

pub mod gen;
pub mod iptables_kernel;
pub mod ipvs_kernel;
pub mod stats;
