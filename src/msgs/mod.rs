//! The typed messages between actors, and nothing else.
//!
//! Sources send [`source::SourceBatch`] to the coordinator. The coordinator
//! sends each subsystem actor a [`Batch`] of that actor's ops, stamped with a
//! sync generation; the actor applies it and answers with an [`Ack`] naming
//! the ops that failed.

pub mod chains;
pub mod conntrack;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod link;
pub mod source;

pub use conntrack::ConntrackOp;
pub use ipset::{IpsetOp, SetEntry, SetSpec, SetType};
pub use iptables::{IptablesOp, RestoreInput};
pub use ipvs::{DestKey, DestSpec, IpvsOp, VsKey, VsSpec};
pub use link::LinkOp;
pub use source::{Change, ResourceKind, SourceBatch, SourceEvent};

/// How an actor should treat a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Apply these ops to the applied view; no kernel reads.
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
/// the kernel's error. A failure without an op is a failed kernel read (a
/// full resync could not dump the kernel). Empty `failed`: all in place.
/// `drift`: a `Verify` batch found the kernel changed beyond what it could
/// repair; this actor needs a full batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack<Op> {
    pub generation: u64,
    pub failed: Vec<(Option<Op>, String)>,
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
