pub mod codec;
pub mod netlink;
