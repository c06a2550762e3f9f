//! nf_tables over netlink: the transactions nftables mode's actor sends,
//! carrying only what changed, as typed ops ([`crate::msgs::nftables`]).
//!
//! - Codec: `netlink-packet-netfilter` (rust-netlink, MIT; already the
//!   ctnetlink codec here) has nf_tables' tables, chains, sets, set
//!   elements, rules and the batch markers; expressions it does not model
//!   go through its `Expressions::Other` (name and attributes). The ops are
//!   encoded in [`codec`] (rules in [`expr`]); this module sends them.
//! - [`NftablesTable`] is the actor's handle on one family's table, over
//!   [`NfTables`]: this socket, or the in-memory kernel in tests.
//! - One [`NetlinkNftables::apply`] is one transaction: `NFNL_MSG_BATCH_BEGIN`,
//!   the ops, `NFNL_MSG_BATCH_END`, in one datagram on a socket of its own.
//!   The kernel applies all or nothing; ops ask no ack (as `nft`), every
//!   refusal comes back and names the op ([`TransactionError`]).
//! - [`NetlinkNftables::generation`] and [`NetlinkNftables::table_info`]
//!   are the cheap drift check: two small gets, no listing.

mod attrs;
pub mod codec;
pub mod expr;
pub mod table;
pub mod types;
mod udata;

use std::future::Future;
use std::sync::Arc;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::NetfilterMessage;
use netlink_proto::sys::protocols::NETLINK_NETFILTER;

pub use self::codec::TableInfo;
pub use self::expr::EncodeError;
pub use self::table::NftablesTable;
use crate::kernel::netlink::{Client, Errno, RawNfnl};
pub use crate::msgs::nftables::NftOp;
use crate::msgs::nftables::Transaction;
use crate::net::IpFamily;

/// Why a transaction (or a get) changed nothing, or may have.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransactionError {
    /// The kernel refused op `index` (the first refused one) with `errno`;
    /// the whole transaction was aborted.
    #[error("nf_tables refused op {index} ({op}): {errno}; nothing of the transaction applied")]
    Refused { index: usize, op: String, errno: Errno },
    /// No answer, or not one per op: whether it was committed is unknown.
    #[error("nf_tables {what}: outcome unknown: {why}")]
    Unknown { what: String, why: String },
    /// The socket failed while sending or reading: outcome unknown.
    #[error("nf_tables {what}: {source}; outcome unknown")]
    Io {
        what: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// An op the codec cannot encode; nothing was sent.
    #[error("{0}; nothing sent")]
    Encode(#[from] EncodeError),
    /// The datagram was refused whole (larger than the socket may send,
    /// e.g. without CAP_NET_ADMIN to raise its buffer): nothing applied.
    #[error("nf_tables transaction of {ops} ops refused whole ({source}); nothing applied")]
    TooLarge {
        ops: usize,
        #[source]
        source: Arc<std::io::Error>,
    },
}

impl TransactionError {
    /// Whether nothing of it took effect (else the outcome is unknown).
    pub fn outcome_known(&self) -> bool {
        !matches!(self, TransactionError::Unknown { .. } | TransactionError::Io { .. })
    }

    fn unknown(what: impl Into<String>, why: impl Into<String>) -> TransactionError {
        TransactionError::Unknown { what: what.into(), why: why.into() }
    }
}

/// The nf_tables calls one family's table handle ([`NftablesTable`])
/// makes: the kernel's over netlink ([`NetlinkNftables`]), or an in-memory
/// kernel's in tests.
pub trait NfTables: Clone + Unpin + 'static {
    /// Applies `tx` to table `table` of its family as one transaction.
    fn transact(
        &self,
        table: &str,
        tx: Arc<Transaction>,
    ) -> impl Future<Output = Result<(), TransactionError>> + 'static;

    /// The chains and sets (maps included; anonymous sets left out) of
    /// table `table` of `family`. A missing table lists nothing.
    fn list(&self, family: IpFamily, table: &str) -> impl Future<Output = Result<Listed, TransactionError>> + 'static;

    /// The ruleset's generation: it moves on with every commit in this
    /// network namespace, ours or anybody's.
    fn generation(&self) -> impl Future<Output = Result<u32, TransactionError>> + 'static;

    /// Table `table` of `family` as a get reports it (`None`: no such table).
    fn table_info(
        &self,
        family: IpFamily,
        table: &str,
    ) -> impl Future<Output = Result<Option<TableInfo>, TransactionError>> + 'static;
}

/// A netfilter netlink socket for nf_tables, in the network namespace of
/// the thread that opened it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct NetlinkNftables {
    client: Client<RawNfnl>,
    sender: std::sync::Arc<Sender>,
    seq: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// The last anonymous set id used: ids (and so the sets' names, see
    /// [`expr::anon_name`]) stay unique in the table across transactions.
    anon_ids: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl NetlinkNftables {
    /// Opens the socket and spawns its connection task (inside a Tokio runtime).
    pub fn new() -> std::io::Result<NetlinkNftables> {
        Ok(NetlinkNftables {
            client: Client::open(NETLINK_NETFILTER)?,
            sender: std::sync::Arc::new(Sender::open()?),
            seq: std::sync::Arc::new(std::sync::atomic::AtomicU32::new(1)),
            anon_ids: std::sync::Arc::new(std::sync::atomic::AtomicU32::new(anon_id_seed())),
        })
    }

    /// Netlink messages sent so far (batch markers included).
    pub fn messages_sent(&self) -> u64 {
        self.client.messages_sent()
    }

    /// Applies `ops` to table `table` of `family` as one transaction (an
    /// op the codec cannot encode: nothing is sent).
    pub async fn apply(&self, family: IpFamily, table: &str, ops: &[NftOp]) -> Result<(), TransactionError> {
        let Some(Encoded { batch, seq0, owner }) = self.encode(family, table, ops)? else { return Ok(()) };
        let sender = self.sender.clone();
        let errors = tokio::task::spawn_blocking(move || sender.send(&batch))
            .await
            .map_err(|e| TransactionError::unknown("transaction", format!("the sending thread: {e}")))?
            .map_err(|e| match e.raw_os_error() {
                // Refused whole before any op ran: nothing applied.
                Some(libc::EMSGSIZE) | Some(libc::ENOBUFS) => {
                    TransactionError::TooLarge { ops: ops.len(), source: Arc::new(e) }
                }
                _ => TransactionError::Io { what: "sending the transaction".into(), source: Arc::new(e) },
            })?;
        // The first refused message (the batch markers are not ops).
        let refused = errors
            .iter()
            .filter_map(|(seq, code)| Some((seq.wrapping_sub(seq0).checked_sub(1)? as usize, *code)))
            .filter(|(i, _)| *i < owner.len())
            .min();
        match refused {
            None if errors.is_empty() => Ok(()),
            None => Err(TransactionError::unknown(
                "transaction",
                format!("the kernel refused the batch itself: {errors:?}"),
            )),
            Some((m, code)) => {
                let index = owner[m];
                Err(TransactionError::Refused { index, op: ops[index].to_string(), errno: Errno::from_code(code) })
            }
        }
    }

    /// The datagram of one transaction: the batch markers around the ops'
    /// messages, numbered from `seq0`; `None` for no ops.
    fn encode(&self, family: IpFamily, table: &str, ops: &[NftOp]) -> Result<Option<Encoded>, TransactionError> {
        if ops.is_empty() {
            return Ok(None);
        }
        // One transaction at a time per socket (the actor's), so the ids it takes are its own.
        let mut next_id = self.anon_ids.load(std::sync::atomic::Ordering::Relaxed);
        let requests = codec::requests(family, table, ops, &mut next_id)?;
        self.anon_ids.store(next_id, std::sync::atomic::Ordering::Relaxed);
        let owner: Vec<usize> = requests.iter().map(|r| r.op).collect();
        let begin = request(&codec::batch_begin(), 0);
        let end = request(&codec::batch_end(), 0);
        let msgs = requests.iter().map(|r| request(&r.msg, r.flags));
        let seq0 = self.next_seq(owner.len() as u32 + 2);
        let mut batch = Vec::new();
        for (i, mut m) in std::iter::once(begin).chain(msgs).chain(std::iter::once(end)).enumerate() {
            m.header.sequence_number = seq0.wrapping_add(i as u32);
            m.finalize();
            let at = batch.len();
            batch.resize(at + m.buffer_len(), 0);
            m.serialize(&mut batch[at..]);
        }
        Ok(Some(Encoded { batch, seq0, owner }))
    }

    fn next_seq(&self, n: u32) -> u32 {
        self.seq.fetch_add(n, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Where a socket's anonymous set ids start: at random in the upper half of
/// the ids (`nft` and upstream's kube-proxy have the kernel number theirs
/// from 0 up), so names stay clear of theirs and of an earlier run's
/// still in the table; a clash would be refused and the next full sync
/// would take new ids.
fn anon_id_seed() -> u32 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let random = std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id()));
    // 2^31 .. 2^31 + 2^30: room for 2^30 more before the counter wraps.
    (1 << 31) | (random as u32 & ((1 << 30) - 1))
}

/// The transactions' own socket. A batch is processed by the kernel within
/// the `send` that carries it (nfnetlink runs in the sender's context), so
/// when `send` returns every error it has to report is queued: read them
/// without waiting. Ops ask no ack (as `nft`): a large transaction's acks
/// would overflow any receive buffer; only refusals come back.
#[derive(Debug)]
struct Sender {
    socket: std::sync::Mutex<netlink_sys::Socket>,
}

impl Sender {
    fn open() -> std::io::Result<Sender> {
        let mut socket = netlink_sys::Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        // Room for many refusals (each echoes its request's header only).
        socket.set_cap_ack(true)?;
        set_buffer(&socket, libc::SO_RCVBUFFORCE, 4 << 20);
        Ok(Sender { socket: std::sync::Mutex::new(socket) })
    }

    /// Sends `batch` in one datagram; the (sequence, error code) of every
    /// message the kernel refused.
    fn send(&self, batch: &[u8]) -> std::io::Result<Vec<(u32, i32)>> {
        let socket = crate::sync::lock(&self.socket);
        // A datagram must fit the send buffer (the kernel checks its length against it).
        set_buffer(&socket, libc::SO_SNDBUFFORCE, batch.len() + (64 << 10));
        socket.set_non_blocking(false)?;
        socket.send(batch, 0)?;
        socket.set_non_blocking(true)?;
        let mut errors = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match socket.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(errors),
                Err(e) => return Err(e),
            };
            errors.extend(codec::errors_in(&buf[..n]));
        }
    }
}

/// SO_SNDBUFFORCE / SO_RCVBUFFORCE (CAP_NET_ADMIN; the daemon runs with
/// it); without the privilege the kernel's default stays and a too large
/// transaction fails with EMSGSIZE, named.
fn set_buffer(socket: &netlink_sys::Socket, option: libc::c_int, bytes: usize) {
    use std::os::fd::AsRawFd;
    let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt reads one c_int from the pointer given, for its length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            std::ptr::from_ref(&size).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), option, "cannot size the nf_tables socket");
    }
}

/// A transaction ready to send: its datagram, its first sequence number,
/// the op of each message.
struct Encoded {
    batch: Vec<u8>,
    seq0: u32,
    owner: Vec<usize>,
}

/// The names of a table's chains and sets, as a dump lists them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listed {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
}

impl NetlinkNftables {
    /// The chains and sets (maps included; anonymous sets left out) of
    /// table `table` of `family`: two dumps. A missing table lists nothing.
    pub async fn list(&self, family: IpFamily, table: &str) -> Result<Listed, TransactionError> {
        let chains = self.dump_names(family, table, codec::DumpKind::Chains).await?;
        let sets = self.dump_names(family, table, codec::DumpKind::Sets).await?;
        Ok(Listed { chains, sets: sets.into_iter().filter(|s| !s.starts_with("__")).collect() })
    }

    /// The ruleset's generation (`NFT_MSG_GETGEN`): it moves on with every
    /// commit in this network namespace, ours or anybody's.
    pub async fn generation(&self) -> Result<u32, TransactionError> {
        let what = "get the ruleset generation";
        let reply = self.get_one(codec::generation_request(), what).await?;
        reply
            .as_ref()
            .and_then(|r| codec::generation_id(r.payload()))
            .ok_or_else(|| TransactionError::unknown(what, "no generation in the reply"))
    }

    /// Table `table` of `family` as a get reports it (`None`: no such table).
    pub async fn table_info(&self, family: IpFamily, table: &str) -> Result<Option<TableInfo>, TransactionError> {
        let what = format!("get table {table}");
        match self.get_one(codec::table_request(family, table), &what).await? {
            None => Ok(None),
            Some(r) => codec::table_info(r.payload())
                .map(Some)
                .ok_or_else(|| TransactionError::unknown(what.clone(), "no handle or use count in the reply")),
        }
    }

    /// The one reply of a get (`None` when the kernel says ENOENT).
    async fn get_one(&self, msg: NetfilterMessage, what: &str) -> Result<Option<RawNfnl>, TransactionError> {
        let mut replies = self
            .client
            .request(vec![request(&msg, 0)])
            .map_err(|e| TransactionError::unknown(what.to_string(), format!("netlink connection closed: {e}")))?;
        match replies.next().await {
            Ok(Some(m)) => match m.payload {
                NetlinkPayload::InnerMessage(raw) => Ok(Some(raw)),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    let errno = Errno::from_code(e.raw_code());
                    if errno == Errno::ENOENT {
                        return Ok(None);
                    }
                    Err(TransactionError::Refused { index: 0, op: what.to_string(), errno })
                }
                other => Err(TransactionError::unknown(what, format!("unexpected reply {other:?}"))),
            },
            Ok(None) => Err(TransactionError::unknown(what, "no reply")),
            Err(_) => Err(TransactionError::unknown(what, "no reply in time")),
        }
    }

    async fn dump_names(
        &self,
        family: IpFamily,
        table: &str,
        kind: codec::DumpKind,
    ) -> Result<Vec<String>, TransactionError> {
        let what = format!("list {kind:?} of table {table}");
        let dump = request(&codec::dump_request(family, table, kind), netlink_packet_core::NLM_F_DUMP);
        let mut replies = self
            .client
            .request(vec![dump])
            .map_err(|e| TransactionError::unknown(what.to_string(), format!("netlink connection closed: {e}")))?;
        let mut names = Vec::new();
        loop {
            let msg = match replies.next().await {
                Ok(Some(m)) => m,
                Ok(None) => return Err(TransactionError::unknown(what, "the dump ended early")),
                Err(_) => return Err(TransactionError::unknown(what, "no reply in time")),
            };
            match msg.payload {
                NetlinkPayload::InnerMessage(raw) => {
                    if let Some(name) = codec::name_in_table(raw.payload(), table, kind) {
                        names.push(name);
                    }
                }
                NetlinkPayload::Done(_) => return Ok(names),
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    let errno = Errno::from_code(e.raw_code());
                    // No such table (or family): nothing of ours there.
                    if errno == Errno::ENOENT {
                        return Ok(Vec::new());
                    }
                    return Err(TransactionError::Refused { index: 0, op: what, errno });
                }
                _ => {}
            }
        }
    }
}

/// `msg` as a request of the shared raw connection, with `flags` besides
/// `NLM_F_REQUEST`.
fn request(msg: &NetfilterMessage, flags: u16) -> NetlinkMessage<RawNfnl> {
    let mut nl = NetlinkMessage::new(NetlinkHeader::default(), NetlinkPayload::InnerMessage(RawNfnl::emitted(msg)));
    nl.header.flags = netlink_packet_core::NLM_F_REQUEST | flags;
    nl.finalize();
    nl
}

impl NfTables for NetlinkNftables {
    fn transact(
        &self,
        table: &str,
        tx: Arc<Transaction>,
    ) -> impl Future<Output = Result<(), TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.apply(tx.family, &table, &tx.ops).await }
    }

    fn list(&self, family: IpFamily, table: &str) -> impl Future<Output = Result<Listed, TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.list(family, &table).await }
    }

    fn generation(&self) -> impl Future<Output = Result<u32, TransactionError>> + 'static {
        let me = self.clone();
        async move { me.generation().await }
    }

    fn table_info(
        &self,
        family: IpFamily,
        table: &str,
    ) -> impl Future<Output = Result<Option<TableInfo>, TransactionError>> + 'static {
        let (me, table) = (self.clone(), table.to_string());
        async move { me.table_info(family, &table).await }
    }
}
