//! Turns for large syncs between coordinators that share them (the
//! families' proxiers of a dual-stack node in iptables and IPVS mode).
//!
//! A large sync ([`is_large`]: a full one, or one of many changed service
//! ports) plans megabytes (at 10,000 services an iptables full sync's
//! restore input is ≈ 45 MB) and holds them until its actors acked. Two
//! families planning theirs at once (both initialize from the same source
//! batches, on the one actor thread) hold both inputs at the same time; with
//! turns the second family plans once the first one's sync is acked and its
//! input freed. Small syncs never wait: a family's endpoint change is not
//! held up by the other family's full resync.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A sync of at least this many changed service ports is a large one, as
/// a full sync is: it takes a turn, and a heap trim follows it.
pub const LARGE_SYNC_PORTS: usize = 1000;

/// Whether a sync (`full`, or with `ports` changed service ports) is a
/// large one.
pub fn is_large(full: bool, ports: usize) -> bool {
    full || ports >= LARGE_SYNC_PORTS
}

/// Turns shared by coordinators: one large sync at a time among them, in
/// the order they asked.
#[derive(Clone, Debug)]
pub struct SyncTurns(Arc<Semaphore>);

impl Default for SyncTurns {
    fn default() -> SyncTurns {
        SyncTurns(Arc::new(Semaphore::new(1)))
    }
}

/// A turn, held until the sync that took it is done.
#[derive(Debug)]
pub struct Turn(#[allow(dead_code)] OwnedSemaphorePermit);

impl SyncTurns {
    /// Waits for a turn. `None` only if the turns were closed, which
    /// nothing does: the sync then runs without one.
    pub fn take(&self) -> impl std::future::Future<Output = Option<Turn>> + 'static {
        let turns = self.0.clone();
        async move { turns.acquire_owned().await.ok().map(Turn) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_syncs_and_syncs_of_many_ports_are_large() {
        assert!(is_large(true, 0));
        assert!(is_large(false, LARGE_SYNC_PORTS));
        assert!(!is_large(false, LARGE_SYNC_PORTS - 1));
        assert!(!is_large(false, 1));
    }

    #[test]
    fn one_turn_at_a_time_in_the_order_asked() {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let turns = SyncTurns::default();
            let first = turns.take().await.expect("a turn");
            let mut second = Box::pin(turns.take());
            assert!(futures::poll!(second.as_mut()).is_pending(), "the second waits while the first holds its turn");
            drop(first);
            assert!(futures::poll!(second.as_mut()).is_ready(), "and gets it once the first is done");
        });
    }
}
