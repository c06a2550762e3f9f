//! The handles that talk to the kernel, each behind a trait with a real
//! implementation and an in-memory one for tests. Knows no Kubernetes types.
//!
//! Every handle is a cheap `Clone` (the real ones wrap a socket or a path;
//! the in-memory ones an `Arc<Mutex<_>>`), so an actor can move a clone into
//! the future that does the I/O.

pub mod addrs;
pub mod blocking;
pub mod conntrack;
pub mod ipset;
pub mod iptables;
pub mod ipvs;
pub mod link;
#[cfg(any(test, feature = "testkit"))]
pub mod mem;
pub mod netlink;
pub mod nfacct;
pub mod nftables;
pub mod sysctl;
pub mod tool;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use std::future::Future;

use crate::msgs::nftables::Transaction;
use crate::msgs::{
    DestKey, DestSpec, IpsetOp, IptablesOp, IpvsOp, LinkOp, ReconcileConntrack, Reconciled, SetEntry, SetSpec, VsKey,
    VsSpec,
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

    /// How many kernel operations `op` carries, for the actor's ops
    /// counter: one, or for a transaction, its ops.
    fn kernel_ops(_op: &Self::Op) -> usize {
        1
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

/// Conntrack: one family's table, reconciled against the UDP frontends.
pub trait ConntrackKernel: Clone + Unpin + 'static {
    /// One dump of `rc.family`'s table and the deletion of each entry `rc`
    /// calls stale ([`conntrack::filter::is_stale`]). Fails if the dump or
    /// a delete failed (the other deletes are done all the same).
    fn reconcile(&self, rc: ReconcileConntrack) -> impl Future<Output = KResult<Reconciled>> + 'static;
}

/// One family's nf_tables table: its ops are whole transactions.
pub trait NftablesKernel: Subsystem<Op = std::sync::Arc<Transaction>> {
    /// The table's chains and sets (nothing when there is no table), read
    /// before a full sync is planned.
    fn list(&self) -> impl Future<Output = KResult<nftables::Listed>> + 'static;
}

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

/// The first virtual server (in key order) where the kernel's differ from
/// the plan's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VsDrift {
    /// Planned, not in the kernel.
    Missing(VsKey, VsSpec),
    /// In the kernel, ours, not planned.
    Extra(VsKey, VsSpec),
    /// In both, with another spec.
    Changed { vs: VsKey, want: VsSpec, have: VsSpec },
}

impl fmt::Display for VsDrift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VsDrift::Missing(k, s) => write!(f, "missing: -A {k} {s}"),
            VsDrift::Extra(k, s) => write!(f, "extra: -A {k} {s}"),
            VsDrift::Changed { vs, want, have } => write!(f, "changed: -A {vs} {have}, planned {want}"),
        }
    }
}

/// How the virtual servers read from the kernel differ from the
/// AddService ops in `desired`: the first missing, extra or changed one,
/// or None. Services outside `owned` are not compared, nor those a
/// `DelService` op in `desired` names (an op for them waits for its retry:
/// the kernel may have them or not); a service read twice counts once.
pub fn ipvs_services_differ(
    desired: &[IpvsOp],
    have: impl IntoIterator<Item = (VsKey, VsSpec)>,
    owned: impl Fn(&VsKey) -> bool,
) -> Option<VsDrift> {
    let skipped: BTreeSet<&VsKey> = desired
        .iter()
        .filter_map(|op| match op {
            IpvsOp::DelService(k) => Some(k),
            _ => None,
        })
        .collect();
    let want: BTreeMap<&VsKey, &VsSpec> = desired
        .iter()
        .filter_map(|op| match op {
            IpvsOp::AddService(k, s) if !skipped.contains(k) => Some((k, s)),
            _ => None,
        })
        .collect();
    let have: BTreeMap<VsKey, VsSpec> = have.into_iter().filter(|(k, _)| owned(k) && !skipped.contains(k)).collect();
    let mut want = want.into_iter().peekable();
    for (k, h) in have {
        if let Some((w, s)) = want.next_if(|(w, _)| **w < k) {
            return Some(VsDrift::Missing(*w, s.clone()));
        }
        match want.next_if(|(w, _)| **w == k) {
            Some((_, w)) if *w == h => {}
            Some((_, w)) => return Some(VsDrift::Changed { vs: k, want: w.clone(), have: h }),
            None => return Some(VsDrift::Extra(k, h)),
        }
    }
    want.next().map(|(k, s)| VsDrift::Missing(*k, s.clone()))
}

/// Ops that turn the dumped IPVS table into `desired` (AddService/AddDest ops).
/// Services outside `owned` (another family, excludeCIDRs) are left alone.
///
/// Works in `desired`'s own buffer, with no map beside it: a full resync at
/// 10,000 services diffs ≈ 110,000 ops (maps of them and a second vector
/// were ≈ 20 MB of the daemon's peak).
pub fn ipvs_diff(mut desired: Vec<IpvsOp>, have: &IpvsTable, owned: impl Fn(&VsKey) -> bool) -> Vec<IpvsOp> {
    desired.retain(|op| matches!(op, IpvsOp::AddService(..) | IpvsOp::AddDest(..)));
    // Variant order puts the services first; each kind sorted by its key.
    desired.sort_unstable();
    desired.dedup_by(|b, a| same_key(a, b));
    let services = desired.partition_point(|op| matches!(op, IpvsOp::AddService(..)));
    let (want_vs, want_dests) = desired.split_at(services);
    let wanted_vs = |k: &VsKey| want_vs.binary_search_by(|op| op.vs().cmp(k)).is_ok();
    let wanted_dest = |k: &VsKey, d: &DestKey| {
        want_dests
            .binary_search_by(|op| match op {
                IpvsOp::AddDest(v, w, _) => (v, w).cmp(&(k, d)),
                _ => std::cmp::Ordering::Less,
            })
            .is_ok()
    };
    let mut deletes: Vec<IpvsOp> = have
        .dests
        .keys()
        .filter(|(k, d)| wanted_vs(k) && !wanted_dest(k, d))
        .map(|(k, d)| IpvsOp::DelDest(*k, *d))
        .collect();
    deletes.extend(have.services.keys().filter(|k| !wanted_vs(k) && owned(k)).map(|k| IpvsOp::DelService(*k)));
    desired.retain_mut(|op| match op {
        IpvsOp::AddService(k, s) => match have.services.get(k) {
            None => true,
            Some(h) if *h != *s => {
                let (k, s) = (*k, s.clone());
                *op = IpvsOp::EditService(k, s);
                true
            }
            _ => false,
        },
        IpvsOp::AddDest(k, d, s) => match have.dests.get(&(*k, *d)) {
            None => true,
            Some(h) if h.spec != *s => {
                let (k, d, s) = (*k, *d, *s);
                *op = IpvsOp::EditDest(k, d, s);
                true
            }
            _ => false,
        },
        _ => false,
    });
    let mut ops = desired;
    ops.extend(deletes);
    ops.sort();
    ops
}

/// The same virtual or real server (the op's spec aside).
fn same_key(a: &IpvsOp, b: &IpvsOp) -> bool {
    match (a, b) {
        (IpvsOp::AddService(k, _), IpvsOp::AddService(l, _)) => k == l,
        (IpvsOp::AddDest(k, d, _), IpvsOp::AddDest(l, e, _)) => (k, d) == (l, e),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::DestSpec;
    use crate::net::Protocol;

    fn vs(n: u8) -> VsKey {
        VsKey { addr: format!("10.96.0.{n}").parse().unwrap(), protocol: Protocol::Tcp, port: 80 }
    }

    fn dest(n: u8) -> DestKey {
        DestKey { addr: format!("10.244.0.{n}").parse().unwrap(), port: 8080 }
    }

    fn spec(scheduler: &str) -> VsSpec {
        VsSpec { scheduler: scheduler.into(), flags: 0, timeout: 0 }
    }

    fn state(weight: i32) -> DestState {
        DestState { spec: DestSpec { weight }, active: 0, inactive: 0 }
    }

    #[test]
    fn the_services_check_names_the_first_difference_and_reads_a_repeat_once() {
        let desired: Vec<IpvsOp> = (1..=3).map(|n| IpvsOp::AddService(vs(n), spec("rr"))).collect();
        let have = |list: &[(u8, &str)]| list.iter().map(|(n, s)| (vs(*n), spec(s))).collect::<Vec<_>>();
        // A positional dump under a concurrent write can return one twice.
        assert_eq!(ipvs_services_differ(&desired, have(&[(3, "rr"), (1, "rr"), (2, "rr"), (1, "rr")]), |_| true), None);
        assert_eq!(
            ipvs_services_differ(&desired, have(&[(1, "rr"), (3, "rr")]), |_| true),
            Some(VsDrift::Missing(vs(2), spec("rr")))
        );
        assert_eq!(
            ipvs_services_differ(&desired, have(&[(1, "rr"), (2, "rr"), (3, "rr"), (4, "rr")]), |_| true),
            Some(VsDrift::Extra(vs(4), spec("rr")))
        );
        assert_eq!(
            ipvs_services_differ(&desired, have(&[(1, "rr"), (2, "rr"), (3, "rr"), (4, "rr")]), |k| *k != vs(4)),
            None
        );
        let changed = ipvs_services_differ(&desired, have(&[(1, "rr"), (2, "sh"), (3, "rr")]), |_| true);
        assert_eq!(changed, Some(VsDrift::Changed { vs: vs(2), want: spec("rr"), have: spec("sh") }));
        assert_eq!(changed.map(|d| d.to_string()).as_deref(), Some("changed: -A -t 10.96.0.2:80 -s sh, planned -s rr"));
    }

    #[test]
    fn the_diff_adds_edits_and_deletes_only_what_differs_in_order() {
        let mut have = IpvsTable::default();
        for (n, sched) in [(1, "rr"), (2, "rr"), (3, "rr"), (4, "rr")] {
            have.services.insert(vs(n), spec(sched));
        }
        have.dests.insert((vs(1), dest(1)), state(1));
        have.dests.insert((vs(1), dest(2)), state(1));
        have.dests.insert((vs(1), dest(3)), state(1));
        have.dests.insert((vs(3), dest(1)), state(1));
        // Unsorted, with a duplicate and an op that is not an add.
        let desired = vec![
            IpvsOp::AddDest(vs(1), dest(4), DestSpec::default()),
            IpvsOp::AddService(vs(5), spec("rr")),
            IpvsOp::AddDest(vs(1), dest(2), DestSpec { weight: 2 }),
            IpvsOp::AddService(vs(1), spec("rr")),
            IpvsOp::DelService(vs(2)),
            IpvsOp::AddService(vs(2), spec("sh")),
            IpvsOp::AddDest(vs(1), dest(1), DestSpec::default()),
            IpvsOp::AddDest(vs(1), dest(4), DestSpec::default()),
        ];
        // vs 4 is not ours (another family, an excluded CIDR).
        let ops = ipvs_diff(desired, &have, |k| *k != vs(4));
        assert_eq!(
            ops,
            [
                IpvsOp::AddService(vs(5), spec("rr")),
                IpvsOp::EditService(vs(2), spec("sh")),
                IpvsOp::AddDest(vs(1), dest(4), DestSpec::default()),
                IpvsOp::EditDest(vs(1), dest(2), DestSpec { weight: 2 }),
                IpvsOp::DelDest(vs(1), dest(3)),
                IpvsOp::DelService(vs(3)),
            ]
        );
        assert!(ipvs_diff(Vec::new(), &IpvsTable::default(), |_| true).is_empty());
    }
}
