//! The netlink layer of the kernel handles that speak netlink themselves.
//!
//! - [`Nfnl`]: the nfnetlink socket type under ipset, nfacct, conntrack
//!   and nf_tables: request/ack/dump handling, pipelined batches with one
//!   ack each, nf_tables' transactions (batch begin/end framing), errno
//!   mapping, reply timeouts, interrupted dumps; every exchange on tokio's
//!   blocking pool ([`nfnl`]; the pure half in [`exchange`]).
//! - [`Client`]: a generic netlink socket and its connection task
//!   (netlink-proto) for IPVS, whose many small dumps an async socket
//!   serves without blocking: requests pipelined in batches whose acks map
//!   back to their requests, replies read with a per-reply timeout.
//!
//! rtnetlink (the dummy link and its addresses) is another family, spoken
//! through the rtnetlink crate. The protocols' codecs and meanings stay
//! with their handles.

pub mod exchange;
pub mod nfnl;

pub use self::exchange::{request, Batch, Msg, Refusals};
pub use self::nfnl::{Nfnl, NfnlError, DUMP_ATTEMPTS};

use std::fmt::Debug;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use std::{fmt, io};

use futures::{Stream, StreamExt};
use netlink_packet_core::{NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable};
use netlink_proto::sys::SocketAddr;
use netlink_proto::{ConnectionHandle, NetlinkProtoError};
use tracing::trace;

/// How long a reply may take before the request's outcome is unknown.
pub const DEFAULT_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

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
        fmt::Display::fmt(&io::Error::from_raw_os_error(self.0), f)
    }
}

impl std::error::Error for Errno {}

/// Why a whole batch has no per-request answer: the connection closed, or
/// the acks did not come (or did not map one-to-one): outcome unknown.
#[derive(Debug, Clone)]
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

/// A netlink socket of one protocol, as a cheap `Clone` handle: clones
/// share the socket and the counters, and `&self` methods may run
/// concurrently. The connection task ends when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Client<T: Debug> {
    handle: ConnectionHandle<T>,
    counters: Arc<Counters>,
    reply_timeout: Duration,
}

#[derive(Debug, Default)]
struct Counters {
    messages: AtomicU64,
    datagrams: AtomicU64,
}

/// The replies to one request, as they come.
pub struct Replies<T> {
    stream: Pin<Box<dyn Stream<Item = NetlinkMessage<T>> + Send>>,
    timeout: Duration,
}

/// A reply did not come within the client's reply timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overdue;

impl<T> Replies<T> {
    /// The next reply; `None` when the kernel is done (or the connection
    /// went away: a dump then lacks its `NLMSG_DONE`).
    pub async fn next(&mut self) -> Result<Option<NetlinkMessage<T>>, Overdue> {
        tokio::time::timeout(self.timeout, self.stream.next()).await.map_err(|_elapsed| Overdue)
    }

    /// Every reply to the end; `None` if one is overdue.
    pub async fn collect(mut self) -> Option<Vec<NetlinkMessage<T>>> {
        let mut out = Vec::new();
        while let Some(msg) = self.next().await.ok()? {
            out.push(msg);
        }
        Some(out)
    }
}

impl<T> Client<T>
where
    T: NetlinkSerializable + NetlinkDeserializable + Debug + Clone + Send + Unpin + 'static,
{
    /// Opens a socket of `protocol` (in the calling thread's network
    /// namespace) and spawns its connection task, which passes every ack
    /// and a dump's final status on: must run inside a Tokio runtime.
    pub fn open(protocol: isize) -> io::Result<Client<T>> {
        let (mut conn, handle, _unsolicited) = netlink_proto::new_connection::<T>(protocol)?;
        conn.set_forward_ack(true);
        conn.set_forward_done(true);
        tokio::spawn(conn);
        Ok(Client { handle, counters: Arc::default(), reply_timeout: DEFAULT_REPLY_TIMEOUT })
    }

    /// Sets how long to wait for each reply.
    pub fn with_reply_timeout(mut self, timeout: Duration) -> Client<T> {
        self.reply_timeout = timeout;
        self
    }

    /// Netlink messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.counters.messages.load(Ordering::Relaxed)
    }

    /// Datagrams (sendmsg calls) sent so far; a batch is one datagram.
    pub fn datagrams_sent(&self) -> u64 {
        self.counters.datagrams.load(Ordering::Relaxed)
    }

    /// Sends `msgs` in one datagram and returns their replies as they come.
    pub fn request(&self, msgs: Vec<NetlinkMessage<T>>) -> Result<Replies<T>, NetlinkProtoError> {
        self.counters.messages.fetch_add(msgs.len() as u64, Ordering::Relaxed);
        self.counters.datagrams.fetch_add(1, Ordering::Relaxed);
        let stream = self.handle.request_batch(msgs, SocketAddr::new(0, 0))?;
        Ok(Replies { stream: Box::pin(stream), timeout: self.reply_timeout })
    }

    /// Sends `msgs` in one datagram and returns every reply until the
    /// kernel is done.
    pub async fn exchange(&self, msgs: Vec<NetlinkMessage<T>>) -> Result<Vec<NetlinkMessage<T>>, BatchFailure> {
        let replies = self.request(msgs).map_err(|e| BatchFailure::Closed(Arc::new(e)))?;
        replies.collect().await.ok_or(BatchFailure::NoReply)
    }

    /// Sends `msgs` (each asking for an ack) in one datagram; returns each
    /// request's error code (0 for an ack), in request order.
    pub async fn send_batch(&self, msgs: Vec<NetlinkMessage<T>>) -> Result<Vec<i32>, BatchFailure> {
        let n = msgs.len();
        trace!(messages = n, "netlink: sending batch");
        let replies = self.exchange(msgs).await?;
        codes_in_order(&replies, n).ok_or(BatchFailure::NoReply)
    }
}

/// `Emitable` and `NetlinkSerializable` for an nfnetlink message struct
/// with fields `header` (`NetfilterHeader`), `command` (into `u8`) and
/// `attrs` (a `Vec` of `Nla`s) of subsystem `$subsys`: the nfgenmsg header,
/// then the attributes; the message type is `subsys << 8 | command`.
macro_rules! nfnl_message {
    ($ty:ty, $subsys:expr) => {
        impl netlink_packet_core::Emitable for $ty {
            fn buffer_len(&self) -> usize {
                self.header.buffer_len() + self.attrs.as_slice().buffer_len()
            }

            fn emit(&self, buf: &mut [u8]) {
                self.header.emit(buf);
                self.attrs.as_slice().emit(&mut buf[self.header.buffer_len()..]);
            }
        }

        impl netlink_packet_core::NetlinkSerializable for $ty {
            fn message_type(&self) -> u16 {
                (u16::from($subsys) << 8) | u16::from(u8::from(self.command))
            }

            fn buffer_len(&self) -> usize {
                netlink_packet_core::Emitable::buffer_len(self)
            }

            fn serialize(&self, buf: &mut [u8]) {
                netlink_packet_core::Emitable::emit(self, buf)
            }
        }
    };
}
pub(crate) use nfnl_message;

/// A nfnetlink payload kept as bytes (conntrack's and nfacct's sockets
/// carry it), so the connection never parses: a reply that does not parse
/// must fail the request that wanted it, not vanish in the connection task
/// (netlink-proto drops what its message type cannot decode with only a log
/// line). Each handle parses the bytes with its own codec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawNfnl {
    pub(crate) message_type: u16,
    pub(crate) payload: Vec<u8>,
}

impl RawNfnl {
    /// The bytes of a typed message.
    pub fn emitted<M: NetlinkSerializable>(msg: &M) -> RawNfnl {
        let mut payload = vec![0; msg.buffer_len()];
        msg.serialize(&mut payload);
        RawNfnl { message_type: msg.message_type(), payload }
    }

    /// The netlink message type (`subsystem << 8 | command` for nfnetlink).
    pub fn message_type(&self) -> u16 {
        self.message_type
    }

    /// The payload after the netlink header.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl NetlinkSerializable for RawNfnl {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buf: &mut [u8]) {
        buf[..self.payload.len()].copy_from_slice(&self.payload);
    }
}

impl NetlinkDeserializable for RawNfnl {
    type Error = std::convert::Infallible;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<RawNfnl, Self::Error> {
        Ok(RawNfnl { message_type: header.message_type, payload: payload.to_vec() })
    }
}

/// Replies as the kernel sends them, for the clients' unit tests.
#[cfg(test)]
pub(crate) mod replies {
    use std::num::NonZeroI32;

    use netlink_packet_core::{
        DoneMessage, ErrorMessage, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    };

    /// The bytes `m` goes out as (to compare a typed request with its raw form).
    pub fn bytes_of<T: NetlinkSerializable>(m: &NetlinkMessage<T>) -> Vec<u8> {
        let mut buf = vec![0; m.buffer_len()];
        m.serialize(&mut buf);
        buf
    }

    pub fn msg<T>(seq: u32, flags: u16, payload: NetlinkPayload<T>) -> NetlinkMessage<T> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = seq;
        header.flags = flags;
        NetlinkMessage::new(header, payload)
    }

    /// The ack (code 0) or error of request `seq`.
    pub fn ack<T>(seq: u32, code: i32) -> NetlinkMessage<T> {
        let mut e = ErrorMessage::default();
        e.code = NonZeroI32::new(code);
        msg(seq, 0, NetlinkPayload::Error(e))
    }

    /// A dump's end, with its status.
    pub fn done<T>(flags: u16, code: i32) -> NetlinkMessage<T> {
        let mut d = DoneMessage::default();
        d.code = code;
        msg(9, flags, NetlinkPayload::Done(d))
    }
}

#[cfg(test)]
mod tests {
    use super::replies::{ack, msg};
    use super::*;

    type Msg = NetlinkMessage<()>;

    #[test]
    fn acks_map_back_to_requests_by_sequence() {
        assert_eq!(codes_in_order::<()>(&[ack(5, 0), ack(6, -17), ack(7, 0)], 3), Some(vec![0, -17, 0]));
        let wrapped: [Msg; 2] = [ack(u32::MAX, 0), ack(0, -2)];
        assert_eq!(codes_in_order(&wrapped, 2), Some(vec![0, -2]), "sequence numbers wrap");
    }

    #[test]
    fn missing_stray_or_overrun_acks_make_the_whole_batch_unknown() {
        assert_eq!(codes_in_order::<()>(&[ack(5, 0), ack(6, 0)], 3), None);
        assert_eq!(codes_in_order::<()>(&[ack(5, 0), ack(5, 0)], 2), None);
        assert_eq!(codes_in_order::<()>(&[ack(5, 0), ack(9, 0)], 2), None);
        assert_eq!(codes_in_order(&[] as &[Msg], 1), None);
        assert_eq!(codes_in_order::<()>(&[ack(5, 0), msg(0, 0, NetlinkPayload::Overrun(Vec::new()))], 1), None);
    }
}
