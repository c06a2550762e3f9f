//! The actors: the coordinator, one kernel actor per subsystem, and the sources.

pub mod conntrack;
pub mod coordinator;
pub mod kernel_actor;
pub mod nftables;
pub mod source;
pub mod wiring;
