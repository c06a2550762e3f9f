//! The handles that talk to the kernel, each behind a trait with a real
//! implementation and an in-memory one for tests. Knows no Kubernetes types.
//!
//! Every handle is a cheap `Clone` (the real ones wrap a socket or a path;
//! the in-memory ones an `Arc<Mutex<_>>`), so an actor can move a clone into
//! the future that does the I/O.

pub mod addrs;
pub mod conntrack;
pub mod ipset;
pub mod iptables;
pub mod iptables_probe;
pub mod ipvs;
pub mod link;
#[cfg(any(test, feature = "testkit"))]
pub mod mem;
pub mod netlink;
pub mod nfacct;
pub mod nft_split;
pub mod sysctl;
pub mod tool;
pub mod xtables_gen;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use std::future::Future;

use crate::msgs::{
    ConntrackOp, DestKey, DestSpec, IpsetOp, IptablesOp, IpvsOp, LinkOp, SetEntry, SetSpec, VsKey, VsSpec,
};

pub use crate::msgs::error::{Cause, KernelError};

pub type KResult<T> = Result<T, KernelError>;
/// The ops a full resync applied, each with its result.
pub type Applied<Op> = KResult<(Vec<Op>, Vec<KResult<()>>)>;

/// What a cheap check found: the ops it applied to repair (with their
/// results), and whether drift remains that only a full resync repairs.
pub struct Checked<Op> {
    pub applied: Vec<Op>,
    pub results: Vec<KResult<()>>,
    pub drift: bool,
}

/// A real server as dumped, with its connection counts (graceful termination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestState {
    pub spec: DestSpec,
    pub active: u32,
    pub inactive: u32,
}

/// The IPVS table as read from the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsTable {
    pub services: BTreeMap<VsKey, VsSpec>,
    pub dests: BTreeMap<(VsKey, DestKey), DestState>,
}

/// What every kernel handle does: apply a batch of ops, one result per op,
/// in order. Adding what exists and deleting what is gone succeed.
pub trait Subsystem: Clone + Unpin + 'static {
    type Op: Clone + fmt::Debug + fmt::Display + Ord + Send + 'static;

    fn apply(&self, ops: Vec<Self::Op>) -> impl Future<Output = Vec<KResult<()>>> + 'static;

    /// Full resync: read what the kernel has, and turn `desired` (all adds)
    /// into the ops that make the kernel match, removing what we own but
    /// don't want. Returns those ops, applied, with their results.
    fn reconcile(&self, desired: Vec<Self::Op>) -> impl Future<Output = Applied<Self::Op>> + 'static;

    /// The syncPeriod's check ([`crate::msgs::SyncMode::Verify`]): by
    /// default a reconcile, for handles whose kernel reads are cheap (the
    /// dummy link's addresses). Handles whose full read is expensive
    /// override it with a cheaper comparison.
    fn verify(&self, desired: Vec<Self::Op>) -> impl Future<Output = KResult<Checked<Self::Op>>> + 'static {
        let reconciled = self.reconcile(desired);
        async move {
            let (applied, results) = reconciled.await?;
            Ok(Checked { applied, results, drift: false })
        }
    }

    /// Periodic housekeeping the actor runs between batches (graceful
    /// termination of IPVS real servers, the iptables canary), and its interval.
    fn periodic(&self) -> Option<std::time::Duration> {
        None
    }

    /// Runs the housekeeping; `true` means the kernel drifted from what we
    /// programmed (e.g. our canary chain vanished) and needs a full resync.
    fn run_periodic(&self) -> impl Future<Output = bool> + 'static {
        async { false }
    }
}

/// IPVS: virtual and real servers.
pub trait IpvsKernel: Subsystem<Op = IpvsOp> {
    fn dump(&self) -> impl Future<Output = KResult<IpvsTable>> + 'static;
}

/// One ipset. The handle knows which set it is for.
pub trait IpsetKernel: Subsystem<Op = IpsetOp> {
    fn spec(&self) -> &SetSpec;
    /// Creates the set if it doesn't exist.
    fn ensure(&self) -> impl Future<Output = KResult<()>> + 'static;
    fn members(&self) -> impl Future<Output = KResult<BTreeSet<SetEntry>>> + 'static;
}

/// The dummy link and its addresses.
pub trait LinkKernel: Subsystem<Op = LinkOp> {
    fn addresses(&self) -> impl Future<Output = KResult<BTreeSet<IpAddr>>> + 'static;
}

/// iptables, through iptables-restore.
pub trait IptablesKernel: Subsystem<Op = IptablesOp> {}

/// Conntrack entry deletion.
pub trait ConntrackKernel: Subsystem<Op = ConntrackOp> {}

/// Ops that turn `have` into `want` for a set-like state: adds for what's
/// missing, deletes for the extras.
pub fn set_diff<T: Ord + Clone, Op>(
    want: &BTreeSet<T>,
    have: &BTreeSet<T>,
    add: impl Fn(T) -> Op,
    del: impl Fn(T) -> Op,
) -> Vec<Op> {
    let mut ops: Vec<Op> = want.difference(have).cloned().map(add).collect();
    ops.extend(have.difference(want).cloned().map(del));
    ops
}

/// Whether the virtual servers read from the kernel differ from the
/// AddService ops in `desired` (a missing, extra or changed one). Services
/// outside `owned` are not compared.
pub fn ipvs_services_differ(
    desired: &[IpvsOp],
    have: impl IntoIterator<Item = (VsKey, VsSpec)>,
    owned: impl Fn(&VsKey) -> bool,
) -> bool {
    let want: BTreeMap<&VsKey, &VsSpec> = desired
        .iter()
        .filter_map(|op| match op {
            IpvsOp::AddService(k, s) => Some((k, s)),
            _ => None,
        })
        .collect();
    let mut seen = 0;
    for (k, s) in have {
        if !owned(&k) {
            continue;
        }
        match want.get(&k) {
            Some(w) if **w == s => seen += 1,
            _ => return true,
        }
    }
    seen != want.len()
}

/// Ops that turn the dumped IPVS table into `desired` (AddService/AddDest ops).
/// Services outside `owned` (another family, excludeCIDRs) are left alone.
pub fn ipvs_diff(desired: &[IpvsOp], have: &IpvsTable, owned: impl Fn(&VsKey) -> bool) -> Vec<IpvsOp> {
    let mut want_vs = BTreeMap::new();
    let mut want_dests = BTreeMap::new();
    for op in desired {
        match op {
            IpvsOp::AddService(k, s) => {
                want_vs.insert(*k, s.clone());
            }
            IpvsOp::AddDest(k, d, s) => {
                want_dests.insert((*k, *d), *s);
            }
            _ => {}
        }
    }
    let mut ops = Vec::new();
    for (k, s) in &want_vs {
        match have.services.get(k) {
            None => ops.push(IpvsOp::AddService(*k, s.clone())),
            Some(h) if h != s => ops.push(IpvsOp::EditService(*k, s.clone())),
            _ => {}
        }
    }
    for ((k, d), s) in &want_dests {
        match have.dests.get(&(*k, *d)) {
            None => ops.push(IpvsOp::AddDest(*k, *d, *s)),
            Some(h) if h.spec != *s => ops.push(IpvsOp::EditDest(*k, *d, *s)),
            _ => {}
        }
    }
    for (k, d) in have.dests.keys() {
        if !want_dests.contains_key(&(*k, *d)) && want_vs.contains_key(k) {
            ops.push(IpvsOp::DelDest(*k, *d));
        }
    }
    for k in have.services.keys() {
        if !want_vs.contains_key(k) && owned(k) {
            ops.push(IpvsOp::DelService(*k));
        }
    }
    ops.sort();
    ops
}
