//! Per-key retries: an op the kernel refused is retried alone, with a
//! backoff, instead of sending its actor a full resync.
//!
//! Pure bookkeeping, time as an argument. One [`Retries`] per actor. A
//! refused op waits for its turn (100 ms, doubling, at most a minute); a
//! newer op on the same key replaces it (the planner's latest word wins);
//! a batch that carried the retried op settles it: gone when it went
//! through, back in line with a longer wait when it failed again. Ops
//! whose outcome is unknown never come here: only a read of the kernel (a
//! full resync of that actor) can settle them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::msgs::{KernelError, Keyed};

/// The first retry's wait; each failure doubles it.
pub const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between two attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(60);

/// The wait after `attempts` failures.
pub fn backoff(attempts: u32) -> Duration {
    FIRST_RETRY.saturating_mul(1u32 << attempts.saturating_sub(1).min(16)).min(MAX_RETRY)
}

/// A refused op waiting for its retry.
#[derive(Debug, Clone)]
pub struct Pending<Op> {
    pub op: Op,
    /// Failures so far (1 after the first).
    pub attempts: u32,
    pub due: Instant,
    pub error: KernelError,
    /// Sent in the batch in flight; settled by its ack.
    in_flight: bool,
}

/// One actor's refused ops, by key.
#[derive(Debug, Clone)]
pub struct Retries<Op: Keyed> {
    keys: BTreeMap<Op::Key, Pending<Op>>,
}

impl<Op: Keyed> Default for Retries<Op> {
    fn default() -> Self {
        Retries { keys: BTreeMap::new() }
    }
}

impl<Op: Keyed + Clone + Ord> Retries<Op> {
    /// Newer ops from the planner: the refused ops they decide are dropped.
    pub fn superseded_by<'a>(&mut self, ops: impl IntoIterator<Item = &'a Op>)
    where
        Op: 'a,
    {
        if self.keys.is_empty() {
            return;
        }
        for op in ops {
            let key = op.key();
            // Keys an op covers sort from its own key on (a virtual server's
            // real servers follow it).
            let covered: Vec<Op::Key> =
                self.keys.range(key..).map(|(k, _)| k).take_while(|k| op.covers(k)).cloned().collect();
            for k in covered {
                self.keys.remove(&k);
            }
        }
    }

    /// The ops due at `now`, in apply order; they count as in flight until
    /// [`settle`](Self::settle).
    pub fn take_due(&mut self, now: Instant) -> Vec<Op> {
        let mut due: Vec<Op> = self
            .keys
            .values_mut()
            .filter(|p| !p.in_flight && p.due <= now)
            .map(|p| {
                p.in_flight = true;
                p.op.clone()
            })
            .collect();
        due.sort();
        due
    }

    /// A full batch carries every desired op: every waiting key is in flight.
    pub fn all_in_flight(&mut self) {
        for p in self.keys.values_mut() {
            p.in_flight = true;
        }
    }

    /// Takes the ack of the batch in flight: `refused` are its ops that
    /// failed with a known outcome; the retried ops not among them went
    /// through. Returns how many retries went through.
    pub fn settle(&mut self, refused: impl IntoIterator<Item = (Op, KernelError)>, now: Instant) -> usize {
        for (op, error) in refused {
            let key = op.key();
            let attempts = self.keys.get(&key).map_or(0, |p| p.attempts) + 1;
            let due = now + backoff(attempts);
            self.keys.insert(key, Pending { op, attempts, due, error, in_flight: false });
        }
        let before = self.keys.len();
        self.keys.retain(|_, p| !p.in_flight);
        before - self.keys.len()
    }

    /// Forgets every key (the actor resyncs in full and its failures start over).
    pub fn clear(&mut self) {
        self.keys.clear();
    }

    /// When the next retry is due (in-flight ones excluded).
    pub fn next_due(&self) -> Option<Instant> {
        self.keys.values().filter(|p| !p.in_flight).map(|p| p.due).min()
    }

    pub fn is_pending(&self, key: &Op::Key) -> bool {
        self.keys.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Pending<Op>> {
        self.keys.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::{DestKey, DestSpec, IpvsOp, VsKey, VsSpec};
    use crate::net::Protocol;

    fn vs(port: u16) -> VsKey {
        VsKey { addr: "10.96.0.1".parse().unwrap(), protocol: Protocol::Tcp, port }
    }
    fn dest(last: u8) -> DestKey {
        DestKey { addr: format!("10.1.0.{last}").parse().unwrap(), port: 8080 }
    }
    fn add_dest(port: u16, last: u8) -> IpvsOp {
        IpvsOp::AddDest(vs(port), dest(last), DestSpec::default())
    }
    fn refused(op: &IpvsOp) -> (IpvsOp, KernelError) {
        (op.clone(), KernelError::errno(op, libc::ENOMEM))
    }

    #[test]
    fn backoff_starts_at_100ms_and_stops_at_a_minute() {
        let waits: Vec<u64> = (1..=12).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits[..4], [100, 200, 400, 800]);
        assert_eq!(waits[9], 51_200);
        assert_eq!(waits[10..], [60_000, 60_000]);
        assert_eq!(backoff(u32::MAX), MAX_RETRY);
    }

    #[test]
    fn a_refused_op_waits_then_retries_and_waits_longer_each_time() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        let op = add_dest(80, 1);
        r.settle([refused(&op)], t0);
        assert_eq!(r.next_due(), Some(t0 + FIRST_RETRY));
        assert!(r.take_due(t0).is_empty(), "not yet due");
        let t1 = t0 + FIRST_RETRY;
        assert_eq!(r.take_due(t1), vec![op.clone()]);
        assert_eq!(r.next_due(), None, "in flight");
        assert_eq!(r.settle([refused(&op)], t1), 0);
        assert_eq!(r.next_due(), Some(t1 + FIRST_RETRY * 2));
        assert_eq!(r.iter().next().map(|p| p.attempts), Some(2));
        let t2 = t1 + FIRST_RETRY * 2;
        assert_eq!(r.take_due(t2).len(), 1);
        assert_eq!(r.settle([], t2), 1, "went through");
        assert!(r.is_empty());
    }

    #[test]
    fn a_newer_op_on_the_key_replaces_the_refused_one() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        r.settle([refused(&add_dest(80, 1)), refused(&add_dest(80, 2)), refused(&add_dest(81, 1))], t0);
        r.superseded_by(&[IpvsOp::DelDest(vs(80), dest(2))]);
        assert!(r.is_pending(&(vs(80), Some(dest(1)))) && !r.is_pending(&(vs(80), Some(dest(2)))));
        // Deleting a virtual server decides its real servers too.
        r.superseded_by(&[IpvsOp::DelService(vs(80))]);
        assert_eq!(r.len(), 1);
        assert!(r.is_pending(&(vs(81), Some(dest(1)))));
        // Re-adding a virtual server does not: its real servers still wait.
        let spec = VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 };
        r.superseded_by(&[IpvsOp::AddService(vs(81), spec)]);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn due_ops_come_in_apply_order_and_a_full_batch_settles_them_all() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        let spec = VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 };
        let service = IpvsOp::AddService(vs(80), spec);
        r.settle([refused(&add_dest(80, 1)), refused(&service)], t0);
        assert_eq!(r.take_due(t0 + MAX_RETRY), vec![service.clone(), add_dest(80, 1)]);
        r.settle([], t0 + MAX_RETRY);
        r.settle([refused(&service)], t0);
        r.all_in_flight();
        assert_eq!(r.settle([], t0), 1);
        assert!(r.is_empty());
    }
}
