//! IPVS over generic netlink: the codec, the client, and graceful termination.

pub mod codec;
pub mod graceful;
pub mod netlink;

use std::future::Future;

/// Reads of the virtual servers a [`services_agreed`] read makes at most.
pub const SERVICE_READS: usize = 4;

/// The virtual servers as two reads in a row saw them (sorted), after
/// `first` when the caller already has a read. The kernel dumps its
/// service table by position (each part of a dump resumes at the index
/// where the last one stopped, counted over every network namespace's
/// services), so a virtual server added or deleted anywhere during a dump
/// makes it skip one or return one twice. Gives the last read when no two
/// of [`SERVICE_READS`] agree.
pub async fn services_agreed<T: Ord, E, F: Future<Output = Result<Vec<T>, E>>>(
    first: Option<Vec<T>>,
    mut read: impl FnMut() -> F,
) -> Result<Vec<T>, E> {
    let mut last = first.map(sorted);
    let mut reads = usize::from(last.is_some());
    loop {
        let next = sorted(read().await?);
        reads += 1;
        if last.as_ref() == Some(&next) || reads >= SERVICE_READS {
            if last.as_ref() != Some(&next) {
                tracing::debug!(reads, "IPVS service dumps kept changing: the last one is used");
            }
            return Ok(next);
        }
        last = Some(next);
    }
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort_unstable();
    v
}
