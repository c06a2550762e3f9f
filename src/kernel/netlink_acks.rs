//! What the netlink clients (IPVS, conntrack) share: the kernel's errno, and
//! mapping a pipelined batch's acks back to its requests.

use std::{fmt, io};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};

/// How many requests go in one datagram: the kernel queues every ack before
/// we read any, and an overflowing receive buffer would lose acks.
pub const MAX_BATCH: usize = 64;

/// An errno from the kernel (positive, e.g. 17 for EEXIST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    pub const ENOENT: Errno = Errno(2);
    pub const ESRCH: Errno = Errno(3);
    pub const EEXIST: Errno = Errno(17);

    /// From a netlink error code (a negated errno).
    pub fn from_code(code: i32) -> Errno {
        Errno(code.saturating_neg())
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        io::Error::from_raw_os_error(self.0).fmt(f)
    }
}

impl std::error::Error for Errno {}

/// Why a whole batch has no per-request answer: the connection closed, or
/// the acks did not come (or did not map one-to-one): outcome unknown.
pub enum BatchFailure {
    Closed(std::sync::Arc<netlink_proto::NetlinkProtoError>),
    NoReply,
}

/// Maps a batch's acks back to its requests. The requests of one batch get
/// consecutive sequence numbers and the kernel answers them in order, so the
/// first answer is request 0. Anything but exactly one answer per request
/// (lost acks, an overrun) means every outcome is unknown: `None`.
pub fn codes_in_order<T>(replies: &[NetlinkMessage<T>], n: usize) -> Option<Vec<i32>> {
    let mut acks = Vec::with_capacity(replies.len());
    for m in replies {
        match &m.payload {
            NetlinkPayload::Error(e) => acks.push((m.header.sequence_number, e.raw_code())),
            NetlinkPayload::Overrun(_) => return None,
            _ => {}
        }
    }
    let base = acks.first()?.0;
    let mut codes = vec![None; n];
    for (seq, code) in &acks {
        let slot = codes.get_mut(usize::try_from(seq.wrapping_sub(base)).ok()?)?;
        if slot.replace(*code).is_some() {
            return None;
        }
    }
    codes.into_iter().collect()
}
