//! The pure half of an nfnetlink exchange ([`super::Nfnl`]): requests
//! numbered and written into one datagram, the datagrams the kernel sends
//! back split into messages, and what each reply means for the exchange
//! (an ack, an entry of a dump, the end, a refusal). No I/O.

use netlink_packet_core::{
    DecodeError, NetlinkBuffer, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_MULTIPART,
    NLM_F_REQUEST,
};
use netlink_packet_netfilter::none::ControlMessage;
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};

use super::{Errno, RawNfnl};

/// One nfnetlink message as it goes out or comes back.
pub type Msg = NetlinkMessage<RawNfnl>;

/// `raw` as a request with `flags` (`NLM_F_REQUEST` always among them).
/// Its length is set; its sequence number is the exchange's to give.
pub fn request(raw: RawNfnl, flags: u16) -> Msg {
    let mut msg = NetlinkMessage::new(Default::default(), NetlinkPayload::InnerMessage(raw));
    msg.header.flags = flags | NLM_F_REQUEST;
    msg.finalize();
    msg
}

/// The sequence numbers of one exchange's requests: `first`, `first + 1`,
/// ... (wrapping). A reply with another number belongs to an earlier
/// exchange whose answer came late: it is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbered {
    pub first: u32,
    pub count: usize,
}

impl Numbered {
    /// The request a reply with sequence number `seq` answers.
    pub fn index(&self, seq: u32) -> Option<usize> {
        let i = usize::try_from(seq.wrapping_sub(self.first)).ok()?;
        (i < self.count).then_some(i)
    }
}

/// Numbers `msgs` from `first` on and writes them, one after the other
/// (each starting at a multiple of 4 bytes), into one datagram.
pub fn datagram(msgs: &mut [Msg], first: u32) -> (Vec<u8>, Numbered) {
    let len = msgs.iter().map(|m| m.buffer_len().next_multiple_of(4)).sum();
    let mut out = Vec::with_capacity(len);
    for (i, m) in msgs.iter_mut().enumerate() {
        m.header.sequence_number = first.wrapping_add(i as u32);
        put(&mut out, m);
    }
    (out, Numbered { first, count: msgs.len() })
}

/// Appends `msg` (its length set) to `out`, padded to a multiple of 4 bytes.
fn put(out: &mut Vec<u8>, msg: &mut Msg) {
    msg.finalize();
    let n = msg.buffer_len();
    let at = out.len();
    out.resize(at + n.next_multiple_of(4), 0);
    msg.serialize(&mut out[at..at + n]);
}

/// One transaction of an nfnetlink subsystem written into its datagram as
/// its messages are made: the batch begin marker, the messages (asking no
/// ack: a large transaction's acks would overflow any receive buffer), the
/// end marker ([`Batch::end`]). Only the bytes are held, never the
/// messages; the sequence numbers are written when it is sent
/// ([`Batch::number`]).
#[derive(Debug)]
pub struct Batch {
    bytes: Vec<u8>,
    /// Messages written, the markers included.
    count: usize,
    end: Option<Msg>,
}

impl Batch {
    /// An open transaction of `subsystem`: its begin marker.
    pub fn new(subsystem: u16) -> Batch {
        let (mut begin, end) = batch_markers(subsystem);
        let mut bytes = Vec::new();
        put(&mut bytes, &mut begin);
        Batch { bytes, count: 1, end: Some(end) }
    }

    /// Appends `msg`, asking no ack.
    pub fn push(&mut self, mut msg: Msg) {
        msg.header.flags &= !NLM_F_ACK;
        put(&mut self.bytes, &mut msg);
        self.count += 1;
    }

    /// The messages pushed (the markers left out).
    pub fn messages(&self) -> usize {
        self.count.saturating_sub(1 + usize::from(self.end.is_none()))
    }

    /// Closes the transaction with its end marker.
    pub fn end(mut self) -> Batch {
        if let Some(mut end) = self.end.take() {
            put(&mut self.bytes, &mut end);
            self.count += 1;
        }
        self.bytes.shrink_to_fit();
        self
    }

    /// The datagram's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Numbers the messages from `first` on, in place.
    pub fn number(&mut self, first: u32) -> Numbered {
        let mut at = 0;
        let mut i: u32 = 0;
        while let Some(header) = self.bytes.get_mut(at..at + 16) {
            let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
            header[8..12].copy_from_slice(&first.wrapping_add(i).to_ne_bytes());
            i = i.wrapping_add(1);
            at += len.max(16).next_multiple_of(4);
        }
        Numbered { first, count: self.count }
    }
}

/// The messages of a datagram the kernel sent, each with its sequence
/// number; a message that does not parse ends the datagram with its error.
pub fn messages(datagram: &[u8]) -> impl Iterator<Item = Result<Msg, DecodeError>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = datagram.get(at..).filter(|r| !r.is_empty())?;
        let parsed = NetlinkBuffer::new_checked(rest).and_then(|b| {
            let len = b.length() as usize;
            Msg::deserialize(&rest[..len]).map(|m| (m, len))
        });
        match parsed {
            Ok((m, len)) => {
                at += len.next_multiple_of(4);
                Some(Ok(m))
            }
            Err(e) => {
                at = datagram.len();
                Some(Err(e))
            }
        }
    })
}

/// What one reply means to the exchange that asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An object (of a dump, or a get's answer); `last` when it is the
    /// whole answer (not part of a dump, and no ack was asked).
    Object { raw: RawNfnl, last: bool },
    /// `NLMSG_DONE` with status 0, or the ack of a request: the answer is complete.
    End,
    /// The kernel refused the request (`NLMSG_ERROR`, or a dump's
    /// `NLMSG_DONE` with a status).
    Refused(Errno),
    /// The kernel says our receive buffer overflowed: replies were lost.
    Overrun,
    /// Nothing for the exchange (`NLMSG_NOOP`).
    Nothing,
}

/// Reads a reply to a request that asked an ack (`acked`) or not; the
/// flag says whether the kernel marked it `NLM_F_DUMP_INTR` (the dump it
/// belongs to saw the objects change while it ran).
pub fn reply(msg: Msg, acked: bool) -> (Reply, bool) {
    let interrupted = msg.header.flags & NLM_F_DUMP_INTR != 0;
    let multipart = msg.header.flags & NLM_F_MULTIPART != 0;
    let reply = match msg.payload {
        NetlinkPayload::InnerMessage(raw) => Reply::Object { raw, last: !multipart && !acked },
        NetlinkPayload::Error(e) if e.code.is_some() => Reply::Refused(Errno::from_code(e.raw_code())),
        NetlinkPayload::Error(_) => Reply::End,
        NetlinkPayload::Done(d) if d.code != 0 => Reply::Refused(Errno::from_code(d.code)),
        NetlinkPayload::Done(_) => Reply::End,
        NetlinkPayload::Overrun(_) => Reply::Overrun,
        _ => Reply::Nothing,
    };
    (reply, interrupted)
}

/// Whether `msg` asks the kernel for an ack.
pub fn asks_ack(msg: &Msg) -> bool {
    msg.header.flags & NLM_F_ACK != 0
}

/// The acks of a batch of requests that each asked one: the code of each
/// request (0 for an ack), in request order, once every one came.
#[derive(Debug)]
pub struct Acks {
    codes: Vec<Option<i32>>,
    missing: usize,
}

/// Why a batch's acks cannot be read one per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckFault {
    /// Two answers to one request.
    Twice,
    /// The receive buffer overflowed: acks were lost.
    Overrun,
}

impl Acks {
    pub fn new(count: usize) -> Acks {
        Acks { codes: vec![None; count], missing: count }
    }

    /// Takes the reply to request `index`; `Ok(true)` once every request
    /// has its answer. Objects (an echo) are not answers.
    pub fn take(&mut self, index: usize, msg: &Msg) -> Result<bool, AckFault> {
        let code = match &msg.payload {
            NetlinkPayload::Error(e) => e.raw_code(),
            NetlinkPayload::Overrun(_) => return Err(AckFault::Overrun),
            _ => return Ok(self.missing == 0),
        };
        let slot = self.codes.get_mut(index).ok_or(AckFault::Twice)?;
        if slot.replace(code).is_some() {
            return Err(AckFault::Twice);
        }
        self.missing -= 1;
        Ok(self.missing == 0)
    }

    /// Each request's code; `None` until every one came.
    pub fn codes(self) -> Option<Vec<i32>> {
        self.codes.into_iter().collect()
    }
}

/// nfnetlink's batch markers (`NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`)
/// for `subsystem`: a transaction is `begin`, its messages, `end`.
pub fn batch_markers(subsystem: u16) -> (Msg, Msg) {
    let marker = |m: ControlMessage| {
        let header = NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, subsystem);
        request(RawNfnl::emitted(&NetfilterMessage::new(header, m)), 0)
    };
    (marker(ControlMessage::BatchBegin), marker(ControlMessage::BatchEnd))
}

/// What the kernel refused of one transaction, by the message it named.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Refusals {
    /// (index among the transaction's messages, errno), in arrival order.
    pub messages: Vec<(usize, Errno)>,
    /// Refusals naming a batch marker: the transaction itself (its commit
    /// failed, or the subsystem refused the batch).
    pub batch: Vec<Errno>,
}

impl Refusals {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.batch.is_empty()
    }

    /// Files a reply to a transaction numbered `numbered` (its markers
    /// included): a refusal of a message or of the batch; acks and replies
    /// to other exchanges are not refusals.
    pub fn take(&mut self, numbered: Numbered, msg: &Msg) {
        let NetlinkPayload::Error(e) = &msg.payload else { return };
        let (Some(_), Some(i)) = (e.code, numbered.index(msg.header.sequence_number)) else { return };
        let errno = Errno::from_code(e.raw_code());
        match i.checked_sub(1).filter(|m| *m + 2 < numbered.count) {
            Some(m) => self.messages.push((m, errno)),
            None => self.batch.push(errno),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::replies::{ack, bytes_of, done, msg};
    use super::*;

    fn raw(ty: u16, payload: &[u8]) -> RawNfnl {
        RawNfnl { message_type: ty, payload: payload.to_vec() }
    }

    #[test]
    fn a_datagram_numbers_its_requests_and_splits_back_into_them() {
        let mut msgs = vec![request(raw(0x0a10, &[0, 0, 0, 0]), 0), request(raw(0x0a04, &[2, 0, 0, 0, 9]), 0x300)];
        let (bytes, numbered) = datagram(&mut msgs, u32::MAX);
        assert_eq!(numbered, Numbered { first: u32::MAX, count: 2 });
        assert_eq!(bytes.len(), 20 + 24, "the second message padded to 4 bytes");
        let back: Vec<Msg> = messages(&bytes).collect::<Result<_, _>>().expect("parses");
        assert_eq!(back.iter().map(|m| m.header.sequence_number).collect::<Vec<_>>(), [u32::MAX, 0], "wraps");
        assert_eq!(back[1].header.flags, 0x300 | NLM_F_REQUEST);
        assert_eq!(bytes_of(&back[0]), bytes[..20]);
        assert_eq!(numbered.index(0), Some(1));
        assert_eq!(numbered.index(1), None);
        assert_eq!(numbered.index(u32::MAX - 1), None, "an earlier exchange's");
    }

    #[test]
    fn a_garbled_datagram_ends_with_its_error() {
        let mut msgs = vec![request(raw(0x0a10, &[0, 0, 0, 0]), 0)];
        let (mut bytes, _) = datagram(&mut msgs, 1);
        bytes.extend([40, 0, 0, 0, 1, 2]); // claims 40 bytes, has 6
        let got: Vec<_> = messages(&bytes).collect();
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok() && got[1].is_err());
    }

    #[test]
    fn replies_end_a_get_a_dump_or_an_acked_request() {
        let object = |flags| msg(3, flags, NetlinkPayload::InnerMessage(raw(0x0a03, &[0; 4])));
        assert!(matches!(reply(object(0), false), (Reply::Object { last: true, .. }, false)), "a get's one answer");
        assert!(matches!(reply(object(0), true), (Reply::Object { last: false, .. }, false)), "its ack comes next");
        let part = reply(object(NLM_F_MULTIPART | NLM_F_DUMP_INTR), false);
        assert!(matches!(part, (Reply::Object { last: false, .. }, true)), "a dump's, interrupted");
        assert_eq!(reply(done(NLM_F_MULTIPART, 0), false), (Reply::End, false));
        assert_eq!(reply(done(NLM_F_MULTIPART, -1), false), (Reply::Refused(Errno(1)), false));
        assert_eq!(reply(ack(3, 0), true), (Reply::End, false));
        assert_eq!(reply(ack(3, -2), false), (Reply::Refused(Errno::ENOENT), false));
        assert_eq!(reply(msg(3, 0, NetlinkPayload::Overrun(Vec::new())), false).0, Reply::Overrun);
    }

    #[test]
    fn acks_map_back_to_their_requests() {
        let mut acks = Acks::new(3);
        assert_eq!(acks.take(2, &ack(9, -17)), Ok(false));
        assert_eq!(acks.take(0, &msg(7, 0, NetlinkPayload::InnerMessage(raw(0x0700, &[])))), Ok(false), "an echo");
        assert_eq!(acks.take(0, &ack(7, 0)), Ok(false));
        assert_eq!(acks.take(1, &ack(8, -2)), Ok(true));
        assert_eq!(acks.codes(), Some(vec![0, -2, -17]));
        let mut twice = Acks::new(2);
        assert_eq!(twice.take(0, &ack(1, 0)), Ok(false));
        assert_eq!(twice.take(0, &ack(1, 0)), Err(AckFault::Twice));
        assert_eq!(Acks::new(1).take(0, &msg(1, 0, NetlinkPayload::Overrun(Vec::new()))), Err(AckFault::Overrun));
        assert_eq!(Acks::new(2).codes(), None);
    }

    #[test]
    fn a_transactions_refusals_name_its_messages_or_the_batch() {
        // Begin (seq 10), three messages (11..=13), end (14).
        let numbered = Numbered { first: 10, count: 5 };
        let mut r = Refusals::default();
        for m in [ack(12, -17), ack(11, 0), ack(13, -2), ack(10, -95), ack(14, -1), ack(9, -22), ack(15, -22)] {
            r.take(numbered, &m);
        }
        assert_eq!(r.messages, [(1, Errno::EEXIST), (2, Errno::ENOENT)]);
        assert_eq!(r.batch, [Errno(95), Errno(1)], "begin and end: the batch; 9 and 15 are not ours");
        assert!(Refusals::default().is_empty());
    }

    /// A transaction written message by message, numbered when sent: the
    /// bytes of its markers and messages numbered and written together.
    #[test]
    fn a_batch_written_as_made_is_the_framed_datagram() {
        let raw = |t: u16, payload: Vec<u8>| RawNfnl { message_type: t, payload };
        let made = || [raw(0x0a03, vec![1, 2, 3]), raw(0x0a06, vec![7; 9]), raw(0x0a0c, vec![])];
        let mut batch = Batch::new(10);
        for r in made() {
            batch.push(request(r, NLM_F_ACK | 0x400));
        }
        assert_eq!(batch.messages(), 3);
        let mut batch = batch.end();
        assert_eq!(batch.messages(), 3);
        let numbered = batch.number(u32::MAX - 1);
        let (begin, end) = batch_markers(10);
        let mut framed = vec![begin];
        framed.extend(made().into_iter().map(|r| request(r, 0x400)));
        framed.push(end);
        let (want, want_numbered) = datagram(&mut framed, u32::MAX - 1);
        assert_eq!(batch.bytes(), &want[..]);
        assert_eq!(numbered, want_numbered);
        assert_eq!(numbered.index(2), Some(4), "numbers wrap");
    }

    /// The markers `nft` sends: type 0x10 / 0x11 (subsystem none), the
    /// nfgenmsg naming nf_tables (10, network order) as the resource.
    #[test]
    fn batch_markers_name_the_subsystem() {
        let (begin, end) = batch_markers(10);
        let (mut begin, mut end) = (begin, end);
        let (bytes, _) = datagram(std::slice::from_mut(&mut begin), 7);
        assert_eq!(bytes, [20, 0, 0, 0, 0x10, 0, 1, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10]);
        let (bytes, _) = datagram(std::slice::from_mut(&mut end), 8);
        assert_eq!(&bytes[4..6], [0x11, 0]);
    }
}
