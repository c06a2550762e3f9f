//! Model → desired kernel state, and desired-before vs desired-after →
//! deltas. Pure: no I/O, no async.
//!
//! One planner per mode ([`ipvs`], [`iptables`], [`nftables`]), the
//! conntrack reconcile every mode runs after its sync ([`conntrack`]), what
//! every planner takes besides the model ([`context`], [`local`]), and the
//! packet tracer that follows a packet through planned rules in tests
//! ([`trace`]), and a mode switch's steps ([`switch`]).

pub mod conntrack;
pub mod context;
pub mod iptables;
pub mod ipvs;
pub mod local;
pub mod nftables;
pub mod switch;
pub mod trace;
