//! What the daemon does at start besides building its proxiers, each as
//! upstream's server start-up does it: the conntrack settings
//! ([`conntrack`]), `--init-only`'s set-up ([`init_only`]), the OOM score
//! ([`oom`]), what start-up waits say while they wait ([`wait`]), and the
//! watch on the Node the daemon started with ([`node_watch`]).

pub mod conntrack;
pub mod init_only;
pub mod node_watch;
pub mod oom;
pub mod wait;
