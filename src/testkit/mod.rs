//! Test kit pieces that are not fixtures: the in-process API server the
//! integration tests and `kpr-bench daemon --source api` run the daemon
//! against.

pub mod apiserver;
