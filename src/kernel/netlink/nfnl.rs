//! [`Nfnl`]: the one nfnetlink socket type. ipset, nfacct, conntrack and
//! nf_tables (nftables mode's transactions and reads, iptables-nft's chain
//! listing and ruleset generation) all go through it.
//!
//! - One socket (`NETLINK_NETFILTER`, opened in the calling thread's
//!   network namespace) per handle; one exchange at a time on it, run on
//!   tokio's blocking pool ([`crate::kernel::blocking`]), so a long dump
//!   never holds the thread the actors share.
//! - Every read waits at most the reply timeout (`SO_RCVTIMEO`, set when
//!   the socket opens: a socket without it is not opened): a reply that
//!   does not come fails the exchange with [`NfnlError::Overdue`].
//! - Exchanges: [`Nfnl::acked`] pipelines requests, [`MAX_BATCH`] per
//!   datagram, one ack each; [`Nfnl::get`] and [`Nfnl::dump`] read an
//!   answer to its end (a dump's `NLMSG_DONE`); [`Nfnl::transaction`] sends
//!   messages between nfnetlink's batch markers as one transaction.
//! - Replies are matched to requests by sequence number; a late reply to
//!   an earlier exchange is dropped. A kernel refusal is
//!   [`NfnlError::Refused`] with its errno; what an errno means (a missing
//!   object, say) is the caller's to decide.
//! - A dump whose objects changed while it ran (`NLM_F_DUMP_INTR`) is read
//!   again from the start, up to [`DUMP_ATTEMPTS`] times; then it fails with
//!   [`NfnlError::Interrupted`].

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netlink_packet_core::{DecodeError, NLM_F_ACK};
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;
use tracing::trace;

use super::exchange::{self, AckFault, Acks, Batch, Msg, Numbered, Refusals, Reply};
use super::{Errno, RawNfnl, DEFAULT_REPLY_TIMEOUT, MAX_BATCH};
use crate::kernel::blocking::{off_thread, PoolError};

/// How many times a dump the kernel marks interrupted is read.
pub const DUMP_ATTEMPTS: usize = 3;

/// The receive buffer asked for (`SO_RCVBUFFORCE`): room for a
/// transaction's refusals and a batch's acks.
const RECEIVE_BUFFER: usize = 4 << 20;

/// The largest datagram read: dumps come in parts of at most 32 KiB, other
/// replies are one message each.
const MAX_DATAGRAM: usize = 1 << 17;

/// Why an exchange has no (complete) answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NfnlError {
    /// The kernel refused the request.
    #[error("{0}")]
    Refused(#[source] Errno),
    /// No reply within the reply timeout: the outcome is unknown.
    #[error("no reply from the kernel within {0:?}, outcome unknown")]
    Overdue(Duration),
    /// The socket's receive buffer overflowed: replies were lost.
    #[error("the netlink receive buffer overflowed, replies lost")]
    Overrun,
    /// Two answers to one request: no answer can be trusted.
    #[error("the kernel answered one request twice, outcome unknown")]
    Twice,
    /// The objects changed during every attempt to dump them.
    #[error("dump interrupted by concurrent changes {0} times in a row")]
    Interrupted(usize),
    /// A reply that is not netlink.
    #[error("malformed reply: {0}")]
    Malformed(#[source] Arc<DecodeError>),
    /// A datagram larger than any the kernel sends for these requests.
    #[error("a reply datagram of {0} bytes, more than the {MAX_DATAGRAM} read")]
    Truncated(usize),
    /// The request could not be sent, or reading failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: Arc<io::Error>,
    },
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl NfnlError {
    /// The kernel's errno, if it refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NfnlError::Refused(errno) => Some(*errno),
            _ => None,
        }
    }

    /// True when the request may have been carried out anyway.
    pub fn is_unknown_outcome(&self) -> bool {
        !matches!(self, NfnlError::Refused(_) | NfnlError::Interrupted(_))
    }

    fn io(what: &'static str, e: io::Error) -> NfnlError {
        NfnlError::Io { what, source: Arc::new(e) }
    }
}

impl From<AckFault> for NfnlError {
    fn from(f: AckFault) -> NfnlError {
        match f {
            AckFault::Twice => NfnlError::Twice,
            AckFault::Overrun => NfnlError::Overrun,
        }
    }
}

/// An nfnetlink socket: a cheap `Clone` handle (clones share the socket
/// and its counters). Exchanges on one socket take turns.
#[derive(Debug, Clone)]
pub struct Nfnl {
    engine: Arc<tokio::sync::Mutex<Engine>>,
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    messages: AtomicU64,
    datagrams: AtomicU64,
}

impl Nfnl {
    /// Opens a socket in the calling thread's network namespace whose
    /// reads wait at most [`DEFAULT_REPLY_TIMEOUT`].
    pub fn open() -> io::Result<Nfnl> {
        Nfnl::with_reply_timeout(DEFAULT_REPLY_TIMEOUT)
    }

    /// [`Nfnl::open`] with another reply timeout.
    pub fn with_reply_timeout(timeout: Duration) -> io::Result<Nfnl> {
        let counters = Arc::new(Counters::default());
        let engine = Engine::open(timeout, counters.clone())?;
        Ok(Nfnl { engine: Arc::new(tokio::sync::Mutex::new(engine)), counters })
    }

    /// Netlink messages sent so far (batch markers included).
    pub fn messages_sent(&self) -> u64 {
        self.counters.messages.load(Ordering::Relaxed)
    }

    /// Datagrams (sendmsg calls) sent so far.
    pub fn datagrams_sent(&self) -> u64 {
        self.counters.datagrams.load(Ordering::Relaxed)
    }

    /// Sends `msgs`, [`MAX_BATCH`] per datagram, each asking an ack; one
    /// result per request, in order. A batch without one answer per
    /// request fails all of its requests (outcome unknown).
    pub async fn acked(&self, mut msgs: Vec<Msg>) -> Vec<Result<(), NfnlError>> {
        let n = msgs.len();
        if n == 0 {
            return Vec::new();
        }
        msgs.iter_mut().for_each(|m| m.header.flags |= NLM_F_ACK);
        let results = self
            .run("netlink requests", move |engine| {
                let mut out = Vec::with_capacity(n);
                for chunk in msgs.chunks_mut(MAX_BATCH) {
                    match engine.acked(chunk) {
                        Ok(results) => out.extend(results),
                        // Whether it was carried out is unknown: the rest is not sent.
                        Err(e) => {
                            out.resize(n, Err(e));
                            break;
                        }
                    }
                }
                out
            })
            .await;
        results.unwrap_or_else(|e| vec![Err(e); n])
    }

    /// Sends `msg` and returns the objects of its answer, read to the end.
    pub async fn get(&self, msg: Msg) -> Result<Vec<RawNfnl>, NfnlError> {
        let collected = self.dump(msg, Vec::new(), |out: &mut Vec<RawNfnl>, raw| {
            out.push(raw);
            Ok::<(), Infallible>(())
        });
        Ok(collected.await?.unwrap_or_else(|never| match never {}))
    }

    /// Sends `msg` (a dump, or a get) and hands each object of the answer
    /// to `visit`, with `state` (a clone of it per attempt: an interrupted
    /// dump is read again from the start). The visitor runs on the blocking
    /// pool, as the objects arrive; after its first error the rest of the
    /// answer is read and dropped, and that error is the inner result.
    pub async fn dump<S, E>(
        &self,
        msg: Msg,
        state: S,
        mut visit: impl FnMut(&mut S, RawNfnl) -> Result<(), E> + Send + 'static,
    ) -> Result<Result<S, E>, NfnlError>
    where
        S: Clone + Send + 'static,
        E: Send + 'static,
    {
        self.run("netlink dump", move |engine| {
            for attempt in 1..=DUMP_ATTEMPTS {
                let mut s = state.clone();
                match engine.answer(msg.clone(), &mut |raw| visit(&mut s, raw))? {
                    Answer::Complete(Ok(())) => return Ok(Ok(s)),
                    Answer::Complete(Err(e)) => return Ok(Err(e)),
                    Answer::Interrupted => trace!(attempt, "netlink dump interrupted; reading it again"),
                }
            }
            Err(NfnlError::Interrupted(DUMP_ATTEMPTS))
        })
        .await?
    }

    /// Sends `batch` as one transaction (in one datagram, ended with its
    /// marker) and returns what the kernel refused: nothing when it
    /// committed. The messages ask no ack (a large transaction's acks would
    /// overflow any receive buffer), so only refusals come back, and they
    /// are all queued once the send returns (nfnetlink processes a batch
    /// within the send).
    pub async fn transaction(&self, batch: Batch) -> Result<Refusals, NfnlError> {
        let mut batch = batch.end();
        self.run("netlink transaction", move |engine| engine.transaction(&mut batch)).await?
    }

    /// Runs `job` on the socket, on the blocking pool, once the exchanges
    /// before it are done.
    async fn run<T: Send + 'static>(
        &self,
        what: &'static str,
        job: impl FnOnce(&mut Engine) -> T + Send + 'static,
    ) -> Result<T, NfnlError> {
        let mut engine = self.engine.clone().lock_owned().await;
        Ok(off_thread(what, move || job(&mut engine)).await?)
    }
}

/// How an answer ended.
enum Answer<E> {
    /// Read to its end; the visitor's first error, if any.
    Complete(Result<(), E>),
    /// Read to its end, but the kernel marked it interrupted.
    Interrupted,
}

/// The socket itself, used by one exchange at a time on a blocking-pool
/// thread.
#[derive(Debug)]
struct Engine {
    socket: netlink_sys::Socket,
    next_seq: u32,
    buf: Vec<u8>,
    timeout: Duration,
    counters: Arc<Counters>,
}

impl Engine {
    fn open(timeout: Duration, counters: Arc<Counters>) -> io::Result<Engine> {
        let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        // Errors echo only the request's header.
        socket.set_cap_ack(true)?;
        let tv = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
        setsockopt(&socket, sockopt::ReceiveTimeout, &tv).map_err(io::Error::from)?;
        force_buffer(&socket, sockopt::RcvBufForce, RECEIVE_BUFFER);
        Ok(Engine { socket, next_seq: 1, buf: Vec::with_capacity(MAX_DATAGRAM), timeout, counters })
    }

    /// Numbers `msgs` and sends them in one datagram.
    fn send(&mut self, msgs: &mut [Msg]) -> Result<Numbered, NfnlError> {
        let (bytes, numbered) = exchange::datagram(msgs, self.next_seq);
        self.send_numbered(&bytes, numbered)
    }

    /// Sends a datagram whose messages are numbered `numbered`, from the
    /// next sequence number on.
    fn send_numbered(&mut self, bytes: &[u8], numbered: Numbered) -> Result<Numbered, NfnlError> {
        self.next_seq = self.next_seq.wrapping_add(numbered.count as u32);
        self.counters.messages.fetch_add(numbered.count as u64, Ordering::Relaxed);
        self.counters.datagrams.fetch_add(1, Ordering::Relaxed);
        self.socket.send(bytes, 0).map_err(|e| NfnlError::io("sending", e))?;
        Ok(numbered)
    }

    /// One datagram from the kernel, waiting at most the reply timeout
    /// (`wait`) or not at all; `None` when none came.
    fn receive(&mut self, wait: bool) -> Result<Option<&[u8]>, NfnlError> {
        self.buf.clear();
        let flags = libc::MSG_TRUNC | if wait { 0 } else { libc::MSG_DONTWAIT };
        match self.socket.recv(&mut self.buf, flags) {
            Ok(n) if n > self.buf.len() => Err(NfnlError::Truncated(n)),
            Ok(n) => Ok(Some(&self.buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && wait => Err(NfnlError::Overdue(self.timeout)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Err(NfnlError::Overrun),
            Err(e) => Err(NfnlError::io("receiving", e)),
        }
    }

    /// Reads replies to `numbered` (dropping other exchanges'), handing
    /// each to `take` with its request's index until `take` says done.
    fn replies(
        &mut self,
        numbered: Numbered,
        mut take: impl FnMut(usize, Msg) -> Result<bool, NfnlError>,
    ) -> Result<(), NfnlError> {
        loop {
            let datagram = self.receive(true)?.unwrap_or_default();
            for msg in exchange::messages(datagram) {
                let msg = msg.map_err(|e| NfnlError::Malformed(Arc::new(e)))?;
                let Some(i) = numbered.index(msg.header.sequence_number) else {
                    trace!(seq = msg.header.sequence_number, "netlink: dropping a late reply");
                    continue;
                };
                if take(i, msg)? {
                    return Ok(());
                }
            }
        }
    }

    /// One batch of acked requests in one datagram: a result per request,
    /// or why the batch as a whole has none.
    fn acked(&mut self, msgs: &mut [Msg]) -> Result<Vec<Result<(), NfnlError>>, NfnlError> {
        let mut acks = Acks::new(msgs.len());
        let numbered = self.send(msgs)?;
        self.replies(numbered, |i, msg| Ok(acks.take(i, &msg)?))?;
        let codes = acks.codes().ok_or(NfnlError::Twice)?;
        let result = |c: i32| if c == 0 { Ok(()) } else { Err(NfnlError::Refused(Errno::from_code(c))) };
        Ok(codes.into_iter().map(result).collect())
    }

    /// The answer to `msg`, each object handed to `visit`.
    fn answer<E>(&mut self, msg: Msg, visit: &mut dyn FnMut(RawNfnl) -> Result<(), E>) -> Result<Answer<E>, NfnlError> {
        let acked = exchange::asks_ack(&msg);
        let numbered = self.send(&mut [msg])?;
        let (mut failed, mut interrupted, mut refused) = (None, false, None);
        self.replies(numbered, |_, msg| {
            let (reply, intr) = exchange::reply(msg, acked);
            interrupted |= intr;
            Ok(match reply {
                Reply::Object { raw, last } => {
                    if failed.is_none() {
                        failed = visit(raw).err();
                    }
                    last
                }
                Reply::End => true,
                Reply::Refused(errno) => {
                    refused = Some(errno);
                    true
                }
                Reply::Overrun => return Err(NfnlError::Overrun),
                Reply::Nothing => false,
            })
        })?;
        if let Some(errno) = refused {
            return Err(NfnlError::Refused(errno));
        }
        Ok(match (interrupted, failed) {
            (true, _) => Answer::Interrupted,
            (false, failed) => Answer::Complete(failed.map_or(Ok(()), Err)),
        })
    }

    /// Sends a transaction and collects the refusals already queued.
    fn transaction(&mut self, batch: &mut Batch) -> Result<Refusals, NfnlError> {
        // A datagram must fit the send buffer (the kernel checks its length against it).
        force_buffer(&self.socket, sockopt::SndBufForce, batch.bytes().len() + (64 << 10));
        let numbered = batch.number(self.next_seq);
        let numbered = self.send_numbered(batch.bytes(), numbered)?;
        let mut refusals = Refusals::default();
        while let Some(datagram) = self.receive(false)? {
            for msg in exchange::messages(datagram) {
                refusals.take(numbered, &msg.map_err(|e| NfnlError::Malformed(Arc::new(e)))?);
            }
        }
        Ok(refusals)
    }
}

/// `SO_RCVBUFFORCE` / `SO_SNDBUFFORCE` (CAP_NET_ADMIN; the daemon runs with
/// it); without the privilege the kernel's default stays (a transaction
/// larger than it then fails with EMSGSIZE, named).
fn force_buffer<O>(socket: &netlink_sys::Socket, option: O, bytes: usize)
where
    O: nix::sys::socket::SetSockOpt<Val = usize> + std::fmt::Debug + Copy,
{
    if let Err(e) = setsockopt(socket, option, &bytes) {
        tracing::debug!(error = %e, ?option, bytes, "cannot size the netlink socket's buffer");
    }
}
