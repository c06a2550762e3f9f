//! `NetlinkNfacct`: the kernel's extended accounting objects (nfnetlink_acct,
//! the `nfacct` tool's objects) that iptables mode's `-m nfacct
//! --nfacct-name NAME` rules count packets into, as upstream's
//! `pkg/proxy/util/nfacct` drives them: create the objects iptables mode
//! names (idempotent: an existing one keeps its counts), read one's
//! packet count (the metrics, at scrape time), delete one (tests).
//!
//! Objects live in the network namespace of the socket (the daemon's), one
//! set for both IP families. Requests go over the shared netlink client
//! ([`crate::kernel::netlink`]) as raw bytes ([`RawNfnl`]) and replies are
//! parsed here ([`codec`]), so a malformed reply fails its request.
//!
//! Not every kernel has the subsystem (`CONFIG_NETFILTER_NETLINK_ACCT`):
//! without it every request fails with `EINVAL`, and without
//! `CAP_NET_ADMIN` with `EPERM` ([`NfacctError::errno`]). The caller
//! decides what that means (iptables mode writes its rules without the
//! match).

pub mod codec;

use std::fmt;
use std::io;
use std::sync::Arc;

use netlink_packet_core::{DecodeError, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_proto::sys::protocols::NETLINK_NETFILTER;
use netlink_proto::NetlinkProtoError;

use self::codec::{AcctMessage, Counter, NameError};
use crate::kernel::netlink::{BatchFailure, Client, Errno, RawNfnl};

/// `EBUSY`: `NFNL_MSG_ACCT_NEW` of a name that exists (without `NLM_F_EXCL`),
/// or `DEL` of an object a rule uses.
const EBUSY: Errno = Errno(16);

/// What was asked of the kernel, printed as `nfacct` arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    Add(String),
    Get(String),
    Delete(String),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Add(n) => write!(f, "nfacct add {n}"),
            Request::Get(n) => write!(f, "nfacct get {n}"),
            Request::Delete(n) => write!(f, "nfacct delete {n}"),
        }
    }
}

/// Errors of the nfacct client; each names the request and keeps the cause.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NfacctError {
    #[error("{request}: {errno}")]
    Kernel {
        request: Request,
        #[source]
        errno: Errno,
    },
    #[error("{request}: no reply from the kernel, outcome unknown")]
    NoReply { request: Request },
    #[error("{request}: netlink connection closed: {source}")]
    ConnectionClosed {
        request: Request,
        #[source]
        source: Arc<NetlinkProtoError>,
    },
    #[error("{request}: malformed reply: {source}")]
    Decode {
        request: Request,
        #[source]
        source: Arc<DecodeError>,
    },
    #[error("{request}: unusable reply: {what}")]
    Reply { request: Request, what: String },
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] Arc<io::Error>),
    #[error(transparent)]
    Name(#[from] NameError),
}

impl NfacctError {
    /// The kernel's errno, if the kernel refused the request.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            NfacctError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    fn batch(failure: &BatchFailure, request: Request) -> NfacctError {
        match failure {
            BatchFailure::Closed(source) => NfacctError::ConnectionClosed { request, source: source.clone() },
            BatchFailure::NoReply => NfacctError::NoReply { request },
        }
    }
}

type Msg = NetlinkMessage<RawNfnl>;

/// The bytes of [`codec::netlink_request`], in the connection's type.
fn raw_request(msg: &AcctMessage) -> Msg {
    let mut nl = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(RawNfnl::emitted(msg)));
    nl.header.flags = codec::request_flags(msg);
    nl.finalize();
    nl
}

/// The nfacct client: a cheap `Clone` handle over one netlink socket
/// (clones share it); `&self` methods may run concurrently.
#[derive(Debug, Clone)]
pub struct NetlinkNfacct {
    client: Client<RawNfnl>,
}

impl NetlinkNfacct {
    /// Opens the socket in the calling thread's network namespace and spawns
    /// its connection task: must run inside a Tokio runtime. Opening works
    /// on every kernel; whether the subsystem answers shows at the first
    /// request.
    pub fn new() -> Result<NetlinkNfacct, NfacctError> {
        let client = Client::open(NETLINK_NETFILTER).map_err(|e| NfacctError::Socket(Arc::new(e)))?;
        Ok(NetlinkNfacct { client })
    }

    /// Netlink messages sent so far.
    pub fn messages_sent(&self) -> u64 {
        self.client.messages_sent()
    }

    /// Creates each object of `names` that does not exist (one datagram);
    /// one result per name, in order. An existing object is left as it is,
    /// counts included.
    pub async fn ensure(&self, names: &[&str]) -> Vec<Result<(), NfacctError>> {
        let mut out: Vec<Option<Result<(), NfacctError>>> =
            names.iter().map(|n| codec::check_name(n).err().map(|e| Err(e.into()))).collect();
        let valid: Vec<usize> = (0..names.len()).filter(|&i| out[i].is_none()).collect();
        if !valid.is_empty() {
            let msgs = valid.iter().map(|&i| raw_request(&codec::new_request(names[i]))).collect();
            match self.client.send_batch(msgs).await {
                Ok(codes) => {
                    for (&i, code) in valid.iter().zip(codes) {
                        out[i] = Some(ensure_outcome(names[i], code));
                    }
                }
                Err(failure) => {
                    for &i in &valid {
                        out[i] = Some(Err(NfacctError::batch(&failure, Request::Add(names[i].to_string()))));
                    }
                }
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    /// The object `name`, `None` if there is none.
    pub async fn get(&self, name: &str) -> Result<Option<Counter>, NfacctError> {
        codec::check_name(name)?;
        let request = Request::Get(name.to_string());
        let replies = self
            .client
            .exchange(vec![raw_request(&codec::get_request(name))])
            .await
            .map_err(|f| NfacctError::batch(&f, request.clone()))?;
        get_outcome(&request, replies)
    }

    /// Deletes the object `name`; `Ok(false)` if there was none. An object
    /// a rule still references cannot go (`EBUSY`).
    pub async fn delete(&self, name: &str) -> Result<bool, NfacctError> {
        codec::check_name(name)?;
        let request = Request::Delete(name.to_string());
        let codes = self
            .client
            .send_batch(vec![raw_request(&codec::delete_request(name))])
            .await
            .map_err(|f| NfacctError::batch(&f, request.clone()))?;
        match codes.first().copied().unwrap_or(0) {
            0 => Ok(true),
            code if Errno::from_code(code) == Errno::ENOENT => Ok(false),
            code => Err(NfacctError::Kernel { request, errno: Errno::from_code(code) }),
        }
    }
}

/// A create's result from its netlink error code: created (0) or already
/// there (`EBUSY`, or `EEXIST` from a kernel that treats us as exclusive).
fn ensure_outcome(name: &str, code: i32) -> Result<(), NfacctError> {
    match Errno::from_code(code) {
        Errno(0) => Ok(()),
        e if e == EBUSY || e == Errno::EEXIST => Ok(()),
        errno => Err(NfacctError::Kernel { request: Request::Add(name.to_string()), errno }),
    }
}

/// A `GET`'s replies: the object's description then the ack, or the error.
fn get_outcome(request: &Request, replies: Vec<Msg>) -> Result<Option<Counter>, NfacctError> {
    let mut found = None;
    for reply in replies {
        match reply.payload {
            NetlinkPayload::InnerMessage(raw) => {
                let msg = codec::parse(raw.message_type(), raw.payload())
                    .map_err(|e| NfacctError::Decode { request: request.clone(), source: Arc::new(e) })?;
                let counter = Counter::from_message(&msg)
                    .map_err(|what| NfacctError::Reply { request: request.clone(), what })?;
                found = Some(counter);
            }
            NetlinkPayload::Error(e) if e.code.is_some() => {
                let errno = Errno::from_code(e.raw_code());
                if errno == Errno::ENOENT {
                    return Ok(None);
                }
                return Err(NfacctError::Kernel { request: request.clone(), errno });
            }
            _ => {}
        }
    }
    match found {
        Some(c) => Ok(Some(c)),
        None => Err(NfacctError::Reply { request: request.clone(), what: "an ack without the object".into() }),
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::NLM_F_MULTIPART;

    use super::codec::{AcctAttr, AcctCommand};
    use super::*;
    use crate::kernel::netlink::replies::{ack, bytes_of, msg};

    fn described(name: &str, packets: u64) -> Msg {
        let m = AcctMessage::request(
            AcctCommand::New,
            vec![AcctAttr::Name(name.into()), AcctAttr::Packets(packets), AcctAttr::Bytes(packets * 60)],
        );
        msg(5, NLM_F_MULTIPART, NetlinkPayload::InnerMessage(RawNfnl::emitted(&m)))
    }

    fn get(name: &str) -> Request {
        Request::Get(name.into())
    }

    #[test]
    fn raw_requests_have_the_codec_bytes() {
        let m = codec::new_request("ct_state_invalid_dropped_pkts");
        let typed = codec::netlink_request(m.clone());
        let raw = raw_request(&m);
        assert_eq!(bytes_of(&typed), bytes_of(&raw));
    }

    #[test]
    fn a_get_reads_the_description_before_the_ack() {
        let got = get_outcome(&get("x"), vec![described("x", 7), ack(5, 0)]).expect("a counter");
        assert_eq!(got, Some(Counter { name: "x".into(), packets: 7, bytes: 420 }));
    }

    #[test]
    fn a_missing_object_is_none_and_other_errors_keep_the_errno() {
        assert_eq!(get_outcome(&get("x"), vec![ack(5, -2)]).ok(), Some(None));
        let err = get_outcome(&get("x"), vec![ack(5, -22)]).expect_err("EINVAL: no subsystem");
        assert_eq!(err.errno(), Some(Errno(22)));
        assert_eq!(err.to_string(), "nfacct get x: Invalid argument (os error 22)");
        let err = get_outcome(&get("x"), vec![ack(5, 0)]).expect_err("ack alone");
        assert!(matches!(err, NfacctError::Reply { .. }), "{err:?}");
    }

    #[test]
    fn an_unreadable_description_fails_the_get() {
        let garbage = RawNfnl { message_type: 0x0700, payload: vec![0, 0, 0, 0, 0x08, 0x00, 0x02, 0x00, 1, 2, 3, 4] };
        let err =
            get_outcome(&get("x"), vec![msg(5, NLM_F_MULTIPART, NetlinkPayload::InnerMessage(garbage)), ack(5, 0)])
                .expect_err("decode");
        assert!(matches!(err, NfacctError::Decode { .. }), "{err:?}");
    }

    #[test]
    fn creating_what_exists_succeeds_and_other_errors_name_the_object() {
        assert!(ensure_outcome("x", 0).is_ok());
        assert!(ensure_outcome("x", -16).is_ok(), "EBUSY: it exists");
        assert!(ensure_outcome("x", -17).is_ok(), "EEXIST");
        let err = ensure_outcome("x", -1).expect_err("EPERM");
        assert_eq!(err.to_string(), "nfacct add x: Operation not permitted (os error 1)");
    }

    #[tokio::test]
    async fn bad_names_never_reach_the_kernel() {
        let nfacct = NetlinkNfacct::new().expect("netfilter netlink socket");
        let long = "x".repeat(40);
        let results = nfacct.ensure(&[""]).await;
        assert!(matches!(results[0], Err(NfacctError::Name(NameError::Empty))));
        assert!(matches!(nfacct.get(&long).await, Err(NfacctError::Name(NameError::TooLong(_)))));
        assert_eq!(nfacct.messages_sent(), 0);
    }
}
