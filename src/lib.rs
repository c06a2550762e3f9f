//! kube-proxy-rs: a Kubernetes node proxy (IPVS, iptables and nftables
//! modes) built as actors that each own one piece of kernel state.

pub mod actors;
#[cfg(any(test, feature = "testkit"))]
pub mod bench;
pub mod cleanup;
pub mod config;
pub mod dry_run;
#[cfg(any(test, feature = "testkit"))]
pub mod fixtures;
pub mod health;
pub mod heap;
pub mod http;
pub mod instance;
pub mod kernel;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod msgs;
pub mod mutex;
pub mod net;
pub mod observe;
pub mod plan;
pub mod preview;
pub mod proxier;
pub mod reload;
pub mod schedule;
pub mod settings;
pub mod signals;
pub mod startup;
pub mod stats;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod trace_scenarios;
