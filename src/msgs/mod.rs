//! The typed messages between actors, and nothing else.
//!
//! Sources send [`source::SourceBatch`] to the coordinator. The coordinator
//! sends each subsystem actor a [`Batch`] of that actor's ops, stamped with a
//! sync generation; the actor applies it and answers with an [`Ack`] naming
//! the ops that failed.

pub mod conntrack;
pub mod error;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod link;
pub mod nftables;
pub mod source;

pub use conntrack::{Backends, Frontends, ReconcileConntrack, Reconciled, ServingFrontends};
pub use error::KernelError;
pub use ipset::{IpsetOp, SetEntry, SetSpec, SetType};
pub use iptables::{IptablesOp, RestoreInput};
pub use ipvs::{DestKey, DestSpec, IpvsOp, VsKey, VsSpec};
pub use link::LinkOp;
pub use source::{Change, ResourceKind, SourceBatch, SourceEvent};

/// How an actor should treat a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Apply these ops as they are: no full read of the kernel (a handle
    /// may read what one op needs, as a real server's connections before
    /// it is removed).
    Incremental,
    /// The ops (all adds) are the complete desired state: read the kernel,
    /// add what is missing, fix what differs and remove what we own but is
    /// not desired (drift repair).
    Full,
    /// The syncPeriod's cheap check: the ops are the desired state as for
    /// `Full` (IPVS: its virtual servers only); the handle compares what it
    /// can read cheaply, repairs what it can, and acks `drift` when only a
    /// full batch can repair the rest.
    Verify,
}

/// A sync's worth of ops for one actor.
#[derive(Debug, Clone)]
pub struct Batch<Op> {
    pub generation: u64,
    pub mode: SyncMode,
    pub ops: Vec<Op>,
}

/// What an actor answers: the generation it applied and what failed, with
/// the kernel's error (refused, or of unknown outcome: [`KernelError`]). A
/// failure without an op is a failed kernel read (a full resync could not
/// dump the kernel). Empty `failed`: all in place.
/// `drift`: a `Verify` batch found the kernel changed beyond what it could
/// repair; this actor needs a full batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack<Op> {
    pub generation: u64,
    pub failed: Vec<(Option<Op>, KernelError)>,
    pub drift: bool,
}

impl<Op> Ack<Op> {
    pub fn ok(generation: u64) -> Self {
        Ack { generation, failed: Vec::new(), drift: false }
    }
    pub fn is_ok(&self) -> bool {
        self.failed.is_empty()
    }
}

/// The kernel object an op is about: a newer op on the same key replaces
/// an older one that failed (per-key retries), and `covers` says which
/// keys an op makes moot (deleting a virtual server drops its real servers).
pub trait Keyed {
    type Key: Ord + Clone + std::fmt::Debug;
    fn key(&self) -> Self::Key;
    /// Whether this op decides the fate of `key` too (by default only its own).
    fn covers(&self, key: &Self::Key) -> bool {
        self.key() == *key
    }
}

impl Keyed for IpvsOp {
    /// The virtual server, and the real server for dest ops.
    type Key = (VsKey, Option<DestKey>);
    fn key(&self) -> Self::Key {
        match self {
            IpvsOp::AddService(k, _) | IpvsOp::EditService(k, _) | IpvsOp::DelService(k) => (*k, None),
            IpvsOp::AddDest(k, d, _) | IpvsOp::EditDest(k, d, _) | IpvsOp::DelDest(k, d) => (*k, Some(*d)),
        }
    }
    fn covers(&self, key: &Self::Key) -> bool {
        match self {
            IpvsOp::DelService(k) => key.0 == *k,
            _ => self.key() == *key,
        }
    }
}

impl Keyed for IpsetOp {
    type Key = SetEntry;
    fn key(&self) -> SetEntry {
        match self {
            IpsetOp::Add(e) | IpsetOp::Del(e) => *e,
        }
    }
}

impl Keyed for LinkOp {
    type Key = std::net::IpAddr;
    fn key(&self) -> std::net::IpAddr {
        match self {
            LinkOp::Bind(a) | LinkOp::Unbind(a) => *a,
        }
    }
}

/// An actor found the kernel changed behind our back: the coordinator
/// schedules a full resync.
#[derive(Debug, Clone, actix::Message)]
#[rtype(result = "()")]
pub struct DriftDetected {
    pub actor: String,
}

impl<Op: 'static> actix::Message for Batch<Op> {
    type Result = Ack<Op>;
}
