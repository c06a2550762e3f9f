//! IPVS over generic netlink: the codec, the client, and graceful termination.

pub mod codec;
pub mod graceful;
pub mod netlink;
