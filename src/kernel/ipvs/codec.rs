//! The IPVS generic netlink codec: typed messages, pure builders for every
//! request kube-proxy sends, and parsers for the kernel's dump replies.
//!
//! Nothing here does I/O; [`super::netlink`] sends what these functions build.
//!
//! Wire format, from `include/uapi/linux/ip_vs.h` and the attribute policies
//! in `net/netfilter/ipvs/ip_vs_ctl.c`:
//! - family `"IPVS"`, version [`IPVS_GENL_VERSION`], no family header;
//! - a request carries `IPVS_CMD_ATTR_SERVICE` and/or `IPVS_CMD_ATTR_DEST`,
//!   each a nested attribute (sent without `NLA_F_NESTED`, as the kernel's own
//!   replies and ipvsadm do; the kernel parses them leniently either way);
//! - `AF`, `PROTOCOL` and `ADDR_FAMILY` are `u16`, `FWMARK`, `TIMEOUT`,
//!   `NETMASK`, `FWD_METHOD`, `WEIGHT`, thresholds and connection counters are
//!   `u32`, all in host byte order;
//! - ports are `__be16` (network byte order: the kernel stores them as is);
//! - addresses are a 16-byte `union nf_inet_addr` (IPv4 in the first four
//!   bytes, the rest zero). The kernel copies at most 16 bytes and zero-fills,
//!   so a 4-byte IPv4 attribute (moby/ipvs) also works; we send 16 bytes like
//!   ipvsadm's libipvs and like the kernel's own dumps, and accept both;
//! - `FLAGS` is `struct ip_vs_flags { u32 flags; u32 mask; }`: the kernel
//!   keeps the bits outside `mask`, so we send `mask = !0` (as upstream).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    parse_i32, parse_string, parse_u16, parse_u16_be, parse_u32, DecodeError, DefaultNla, Emitable, ErrorContext,
    NetlinkMessage, Nla, NlaBuffer, NlasIterator, Parseable, ParseableParametrized, NLM_F_ACK, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};

use crate::msgs::ipvs::{DestKey, DestSpec, IpvsOp, VsKey, VsSpec, FLAG_HASHED};
use crate::net::Protocol;

/// `IPVS_GENL_NAME`: the generic netlink family name.
pub const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`.
pub const IPVS_GENL_VERSION: u8 = 1;

/// `AF_INET`, as `IPVS_SVC_ATTR_AF` / `IPVS_DEST_ATTR_ADDR_FAMILY` carry it.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// `IP_VS_CONN_F_MASQ`: masquerading (NAT) forwarding, the only one kube-proxy uses.
pub const IP_VS_CONN_F_MASQ: u32 = 0;
/// `IP_VS_CONN_F_FWD_MASK`.
pub const IP_VS_CONN_F_FWD_MASK: u32 = 0x7;
/// Persistence netmask upstream kube-proxy sets on IPv4 services (a /32).
pub const NETMASK_V4: u32 = 0xffff_ffff;
/// Persistence netmask upstream kube-proxy sets on IPv6 services (a prefix length).
pub const NETMASK_V6: u32 = 128;

// Commands (enum IPVS_CMD_*).
const IPVS_CMD_NEW_SERVICE: u8 = 1;
const IPVS_CMD_SET_SERVICE: u8 = 2;
const IPVS_CMD_DEL_SERVICE: u8 = 3;
const IPVS_CMD_GET_SERVICE: u8 = 4;
const IPVS_CMD_NEW_DEST: u8 = 5;
const IPVS_CMD_SET_DEST: u8 = 6;
const IPVS_CMD_DEL_DEST: u8 = 7;
const IPVS_CMD_GET_DEST: u8 = 8;
const IPVS_CMD_NEW_DAEMON: u8 = 9;
const IPVS_CMD_DEL_DAEMON: u8 = 10;
const IPVS_CMD_GET_DAEMON: u8 = 11;
const IPVS_CMD_SET_CONFIG: u8 = 12;
const IPVS_CMD_GET_CONFIG: u8 = 13;
const IPVS_CMD_SET_INFO: u8 = 14;
const IPVS_CMD_GET_INFO: u8 = 15;
const IPVS_CMD_ZERO: u8 = 16;
const IPVS_CMD_FLUSH: u8 = 17;

// First-level attributes (enum IPVS_CMD_ATTR_*).
const IPVS_CMD_ATTR_SERVICE: u16 = 1;
const IPVS_CMD_ATTR_DEST: u16 = 2;
const IPVS_CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const IPVS_CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const IPVS_CMD_ATTR_TIMEOUT_UDP: u16 = 6;

// Service attributes (enum IPVS_SVC_ATTR_*). STATS (10) and STATS64 (12)
// are nested counters we keep as `SvcAttr::Other`.
const IPVS_SVC_ATTR_AF: u16 = 1;
const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
const IPVS_SVC_ATTR_ADDR: u16 = 3;
const IPVS_SVC_ATTR_PORT: u16 = 4;
const IPVS_SVC_ATTR_FWMARK: u16 = 5;
const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
const IPVS_SVC_ATTR_FLAGS: u16 = 7;
const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
const IPVS_SVC_ATTR_NETMASK: u16 = 9;
const IPVS_SVC_ATTR_PE_NAME: u16 = 11;

// Destination attributes (enum IPVS_DEST_ATTR_*). STATS (10), STATS64 (12)
// and the tunnel attributes (13-15) are kept as `DestAttr::Other`.
const IPVS_DEST_ATTR_ADDR: u16 = 1;
const IPVS_DEST_ATTR_PORT: u16 = 2;
const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;

/// An IPVS generic netlink command (`IPVS_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IpvsCmd {
    NewService,
    SetService,
    DelService,
    GetService,
    NewDest,
    SetDest,
    DelDest,
    GetDest,
    NewDaemon,
    DelDaemon,
    GetDaemon,
    SetConfig,
    GetConfig,
    SetInfo,
    GetInfo,
    Zero,
    Flush,
    /// A command this codec does not know, kept as its number.
    Other(u8),
}

const CMD_TABLE: [(IpvsCmd, u8); 17] = [
    (IpvsCmd::NewService, IPVS_CMD_NEW_SERVICE),
    (IpvsCmd::SetService, IPVS_CMD_SET_SERVICE),
    (IpvsCmd::DelService, IPVS_CMD_DEL_SERVICE),
    (IpvsCmd::GetService, IPVS_CMD_GET_SERVICE),
    (IpvsCmd::NewDest, IPVS_CMD_NEW_DEST),
    (IpvsCmd::SetDest, IPVS_CMD_SET_DEST),
    (IpvsCmd::DelDest, IPVS_CMD_DEL_DEST),
    (IpvsCmd::GetDest, IPVS_CMD_GET_DEST),
    (IpvsCmd::NewDaemon, IPVS_CMD_NEW_DAEMON),
    (IpvsCmd::DelDaemon, IPVS_CMD_DEL_DAEMON),
    (IpvsCmd::GetDaemon, IPVS_CMD_GET_DAEMON),
    (IpvsCmd::SetConfig, IPVS_CMD_SET_CONFIG),
    (IpvsCmd::GetConfig, IPVS_CMD_GET_CONFIG),
    (IpvsCmd::SetInfo, IPVS_CMD_SET_INFO),
    (IpvsCmd::GetInfo, IPVS_CMD_GET_INFO),
    (IpvsCmd::Zero, IPVS_CMD_ZERO),
    (IpvsCmd::Flush, IPVS_CMD_FLUSH),
];

impl From<IpvsCmd> for u8 {
    fn from(cmd: IpvsCmd) -> u8 {
        match cmd {
            IpvsCmd::Other(n) => n,
            known => CMD_TABLE.iter().find(|(c, _)| *c == known).map_or(0, |(_, n)| *n),
        }
    }
}

impl From<u8> for IpvsCmd {
    fn from(n: u8) -> IpvsCmd {
        CMD_TABLE.iter().find(|(_, v)| *v == n).map_or(IpvsCmd::Other(n), |(c, _)| *c)
    }
}

/// `struct ip_vs_flags`: the kernel sets `(old & !mask) | (flags & mask)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpvsFlags {
    pub flags: u32,
    pub mask: u32,
}

/// An attribute nested in `IPVS_CMD_ATTR_SERVICE` (`IPVS_SVC_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SvcAttr {
    AddressFamily(u16),
    /// IP protocol number (IPPROTO_*), sent as a u16.
    Protocol(u16),
    /// Raw `union nf_inet_addr` bytes (16, or 4 for IPv4 from some senders).
    Address(Vec<u8>),
    /// Port in host order; big-endian on the wire.
    Port(u16),
    Fwmark(u32),
    SchedName(String),
    Flags(IpvsFlags),
    /// Persistence timeout in seconds.
    Timeout(u32),
    Netmask(u32),
    PeName(String),
    /// Statistics and anything newer kernels add, kept byte for byte.
    Other(DefaultNla),
}

/// An attribute nested in `IPVS_CMD_ATTR_DEST` (`IPVS_DEST_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DestAttr {
    /// Raw `union nf_inet_addr` bytes.
    Address(Vec<u8>),
    /// Port in host order; big-endian on the wire.
    Port(u16),
    /// `IP_VS_CONN_F_*` forwarding method.
    FwdMethod(u32),
    Weight(i32),
    UpperThreshold(u32),
    LowerThreshold(u32),
    ActiveConns(u32),
    InactConns(u32),
    PersistConns(u32),
    AddressFamily(u16),
    /// Statistics, tunnel settings and anything newer, kept byte for byte.
    Other(DefaultNla),
}

/// A first-level IPVS attribute (`IPVS_CMD_ATTR_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpvsAttr {
    Service(Vec<SvcAttr>),
    Dest(Vec<DestAttr>),
    /// Seconds; 0 leaves the kernel's value unchanged.
    TimeoutTcp(u32),
    TimeoutTcpFin(u32),
    TimeoutUdp(u32),
    Other(DefaultNla),
}

/// One IPVS generic netlink message: command plus attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsMessage {
    pub cmd: IpvsCmd,
    pub attrs: Vec<IpvsAttr>,
}

// ---------------------------------------------------------------- emitting

fn put(buf: &mut [u8], bytes: &[u8]) {
    buf[..bytes.len()].copy_from_slice(bytes);
}

fn put_str(buf: &mut [u8], s: &str) {
    put(buf, s.as_bytes());
    buf[s.len()] = 0;
}

impl Nla for SvcAttr {
    fn value_len(&self) -> usize {
        match self {
            SvcAttr::AddressFamily(_) | SvcAttr::Protocol(_) | SvcAttr::Port(_) => 2,
            SvcAttr::Fwmark(_) | SvcAttr::Timeout(_) | SvcAttr::Netmask(_) => 4,
            SvcAttr::Flags(_) => 8,
            SvcAttr::Address(a) => a.len(),
            SvcAttr::SchedName(s) | SvcAttr::PeName(s) => s.len() + 1,
            SvcAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            SvcAttr::AddressFamily(_) => IPVS_SVC_ATTR_AF,
            SvcAttr::Protocol(_) => IPVS_SVC_ATTR_PROTOCOL,
            SvcAttr::Address(_) => IPVS_SVC_ATTR_ADDR,
            SvcAttr::Port(_) => IPVS_SVC_ATTR_PORT,
            SvcAttr::Fwmark(_) => IPVS_SVC_ATTR_FWMARK,
            SvcAttr::SchedName(_) => IPVS_SVC_ATTR_SCHED_NAME,
            SvcAttr::Flags(_) => IPVS_SVC_ATTR_FLAGS,
            SvcAttr::Timeout(_) => IPVS_SVC_ATTR_TIMEOUT,
            SvcAttr::Netmask(_) => IPVS_SVC_ATTR_NETMASK,
            SvcAttr::PeName(_) => IPVS_SVC_ATTR_PE_NAME,
            SvcAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            SvcAttr::AddressFamily(v) | SvcAttr::Protocol(v) => put(buf, &v.to_ne_bytes()),
            SvcAttr::Port(v) => put(buf, &v.to_be_bytes()),
            SvcAttr::Fwmark(v) | SvcAttr::Timeout(v) | SvcAttr::Netmask(v) => put(buf, &v.to_ne_bytes()),
            SvcAttr::Flags(f) => {
                put(buf, &f.flags.to_ne_bytes());
                put(&mut buf[4..], &f.mask.to_ne_bytes());
            }
            SvcAttr::Address(a) => put(buf, a),
            SvcAttr::SchedName(s) | SvcAttr::PeName(s) => put_str(buf, s),
            SvcAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

impl Nla for DestAttr {
    fn value_len(&self) -> usize {
        match self {
            DestAttr::Port(_) | DestAttr::AddressFamily(_) => 2,
            DestAttr::Address(a) => a.len(),
            DestAttr::Other(nla) => nla.value_len(),
            _ => 4,
        }
    }

    fn kind(&self) -> u16 {
        match self {
            DestAttr::Address(_) => IPVS_DEST_ATTR_ADDR,
            DestAttr::Port(_) => IPVS_DEST_ATTR_PORT,
            DestAttr::FwdMethod(_) => IPVS_DEST_ATTR_FWD_METHOD,
            DestAttr::Weight(_) => IPVS_DEST_ATTR_WEIGHT,
            DestAttr::UpperThreshold(_) => IPVS_DEST_ATTR_U_THRESH,
            DestAttr::LowerThreshold(_) => IPVS_DEST_ATTR_L_THRESH,
            DestAttr::ActiveConns(_) => IPVS_DEST_ATTR_ACTIVE_CONNS,
            DestAttr::InactConns(_) => IPVS_DEST_ATTR_INACT_CONNS,
            DestAttr::PersistConns(_) => IPVS_DEST_ATTR_PERSIST_CONNS,
            DestAttr::AddressFamily(_) => IPVS_DEST_ATTR_ADDR_FAMILY,
            DestAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            DestAttr::Address(a) => put(buf, a),
            DestAttr::Port(v) => put(buf, &v.to_be_bytes()),
            DestAttr::AddressFamily(v) => put(buf, &v.to_ne_bytes()),
            DestAttr::Weight(v) => put(buf, &v.to_ne_bytes()),
            DestAttr::FwdMethod(v)
            | DestAttr::UpperThreshold(v)
            | DestAttr::LowerThreshold(v)
            | DestAttr::ActiveConns(v)
            | DestAttr::InactConns(v)
            | DestAttr::PersistConns(v) => put(buf, &v.to_ne_bytes()),
            DestAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

impl Nla for IpvsAttr {
    fn value_len(&self) -> usize {
        match self {
            IpvsAttr::Service(attrs) => attrs.as_slice().buffer_len(),
            IpvsAttr::Dest(attrs) => attrs.as_slice().buffer_len(),
            IpvsAttr::TimeoutTcp(_) | IpvsAttr::TimeoutTcpFin(_) | IpvsAttr::TimeoutUdp(_) => 4,
            IpvsAttr::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            IpvsAttr::Service(_) => IPVS_CMD_ATTR_SERVICE,
            IpvsAttr::Dest(_) => IPVS_CMD_ATTR_DEST,
            IpvsAttr::TimeoutTcp(_) => IPVS_CMD_ATTR_TIMEOUT_TCP,
            IpvsAttr::TimeoutTcpFin(_) => IPVS_CMD_ATTR_TIMEOUT_TCP_FIN,
            IpvsAttr::TimeoutUdp(_) => IPVS_CMD_ATTR_TIMEOUT_UDP,
            IpvsAttr::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buf: &mut [u8]) {
        match self {
            IpvsAttr::Service(attrs) => attrs.as_slice().emit(buf),
            IpvsAttr::Dest(attrs) => attrs.as_slice().emit(buf),
            IpvsAttr::TimeoutTcp(v) | IpvsAttr::TimeoutTcpFin(v) | IpvsAttr::TimeoutUdp(v) => {
                put(buf, &v.to_ne_bytes())
            }
            IpvsAttr::Other(nla) => nla.emit_value(buf),
        }
    }
}

impl Emitable for IpvsMessage {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }

    fn emit(&self, buf: &mut [u8]) {
        self.attrs.as_slice().emit(buf)
    }
}

impl GenlFamily for IpvsMessage {
    fn family_name() -> &'static str {
        IPVS_GENL_NAME
    }

    fn command(&self) -> u8 {
        self.cmd.into()
    }

    fn version(&self) -> u8 {
        IPVS_GENL_VERSION
    }
}

// ---------------------------------------------------------------- parsing

/// Parses a run of attributes. Unknown kinds become `Other`; a known kind
/// with a malformed value is an error (the layout changed: better to say so
/// than to guess).
fn parse_nlas<A>(buf: &[u8]) -> Result<Vec<A>, DecodeError>
where
    A: for<'a> Parseable<NlaBuffer<&'a [u8]>>,
{
    NlasIterator::new(buf).map(|nla| nla.and_then(|nla| A::parse(&nla))).collect()
}

fn parse_flags(v: &[u8]) -> Result<IpvsFlags, DecodeError> {
    if v.len() != 8 {
        return Err(DecodeError::invalid_number(8, v.len()));
    }
    Ok(IpvsFlags { flags: parse_u32(&v[..4])?, mask: parse_u32(&v[4..])? })
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for SvcAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        let kind = buf.kind();
        Ok(match kind {
            IPVS_SVC_ATTR_AF => SvcAttr::AddressFamily(parse_u16(v)?),
            IPVS_SVC_ATTR_PROTOCOL => SvcAttr::Protocol(parse_u16(v)?),
            IPVS_SVC_ATTR_ADDR => SvcAttr::Address(v.to_vec()),
            IPVS_SVC_ATTR_PORT => SvcAttr::Port(parse_u16_be(v)?),
            IPVS_SVC_ATTR_FWMARK => SvcAttr::Fwmark(parse_u32(v)?),
            IPVS_SVC_ATTR_SCHED_NAME => SvcAttr::SchedName(parse_string(v)?),
            IPVS_SVC_ATTR_FLAGS => SvcAttr::Flags(parse_flags(v)?),
            IPVS_SVC_ATTR_TIMEOUT => SvcAttr::Timeout(parse_u32(v)?),
            IPVS_SVC_ATTR_NETMASK => SvcAttr::Netmask(parse_u32(v)?),
            IPVS_SVC_ATTR_PE_NAME => SvcAttr::PeName(parse_string(v)?),
            _ => SvcAttr::Other(DefaultNla::parse(buf)?),
        })
        .with_context(|| format!("invalid IPVS_SVC_ATTR {kind}"))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for DestAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        let kind = buf.kind();
        Ok(match kind {
            IPVS_DEST_ATTR_ADDR => DestAttr::Address(v.to_vec()),
            IPVS_DEST_ATTR_PORT => DestAttr::Port(parse_u16_be(v)?),
            IPVS_DEST_ATTR_FWD_METHOD => DestAttr::FwdMethod(parse_u32(v)?),
            IPVS_DEST_ATTR_WEIGHT => DestAttr::Weight(parse_i32(v)?),
            IPVS_DEST_ATTR_U_THRESH => DestAttr::UpperThreshold(parse_u32(v)?),
            IPVS_DEST_ATTR_L_THRESH => DestAttr::LowerThreshold(parse_u32(v)?),
            IPVS_DEST_ATTR_ACTIVE_CONNS => DestAttr::ActiveConns(parse_u32(v)?),
            IPVS_DEST_ATTR_INACT_CONNS => DestAttr::InactConns(parse_u32(v)?),
            IPVS_DEST_ATTR_PERSIST_CONNS => DestAttr::PersistConns(parse_u32(v)?),
            IPVS_DEST_ATTR_ADDR_FAMILY => DestAttr::AddressFamily(parse_u16(v)?),
            _ => DestAttr::Other(DefaultNla::parse(buf)?),
        })
        .with_context(|| format!("invalid IPVS_DEST_ATTR {kind}"))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for IpvsAttr {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let v = buf.value();
        let kind = buf.kind();
        Ok(match kind {
            IPVS_CMD_ATTR_SERVICE => IpvsAttr::Service(parse_nlas(v)?),
            IPVS_CMD_ATTR_DEST => IpvsAttr::Dest(parse_nlas(v)?),
            IPVS_CMD_ATTR_TIMEOUT_TCP => IpvsAttr::TimeoutTcp(parse_u32(v)?),
            IPVS_CMD_ATTR_TIMEOUT_TCP_FIN => IpvsAttr::TimeoutTcpFin(parse_u32(v)?),
            IPVS_CMD_ATTR_TIMEOUT_UDP => IpvsAttr::TimeoutUdp(parse_u32(v)?),
            _ => IpvsAttr::Other(DefaultNla::parse(buf)?),
        })
        .with_context(|| format!("invalid IPVS_CMD_ATTR {kind}"))
    }
}

impl ParseableParametrized<[u8], GenlHeader> for IpvsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(IpvsMessage {
            cmd: header.cmd.into(),
            attrs: parse_nlas(buf).context("failed to parse IPVS message attributes")?,
        })
    }
}

// ---------------------------------------------------------------- builders

/// The address family number of `ip`.
pub fn af_of(ip: &IpAddr) -> u16 {
    match ip {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// `ip` as the 16-byte `union nf_inet_addr` (IPv4 in the first 4 bytes).
pub fn inet_addr(ip: &IpAddr) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
    out
}

fn netmask_for(ip: &IpAddr) -> u32 {
    match ip {
        IpAddr::V4(_) => NETMASK_V4,
        IpAddr::V6(_) => NETMASK_V6,
    }
}

/// The attributes that identify a service (all the kernel reads for
/// delete, dest commands and dest dumps).
fn svc_key_attrs(vs: &VsKey) -> Vec<SvcAttr> {
    vec![
        SvcAttr::AddressFamily(af_of(&vs.addr)),
        SvcAttr::Protocol(u16::from(vs.protocol.number())),
        SvcAttr::Address(inet_addr(&vs.addr)),
        SvcAttr::Port(vs.port),
    ]
}

/// A full service entry, as add and edit require. FLAG_HASHED is stripped:
/// the kernel sets it itself and refuses to hash a service that has it.
fn svc_full_attrs(vs: &VsKey, spec: &VsSpec) -> Vec<SvcAttr> {
    let mut attrs = svc_key_attrs(vs);
    attrs.extend([
        SvcAttr::SchedName(spec.scheduler.clone()),
        SvcAttr::Flags(IpvsFlags { flags: spec.flags & !FLAG_HASHED, mask: u32::MAX }),
        SvcAttr::Timeout(spec.timeout),
        SvcAttr::Netmask(netmask_for(&vs.addr)),
    ]);
    attrs
}

/// The attributes that identify a destination. ADDR_FAMILY (kernel 3.18+,
/// ignored before) makes the kernel refuse a family mismatch instead of
/// reading an IPv6 address as IPv4.
fn dest_key_attrs(d: &DestKey) -> Vec<DestAttr> {
    vec![DestAttr::AddressFamily(af_of(&d.addr)), DestAttr::Address(inet_addr(&d.addr)), DestAttr::Port(d.port)]
}

/// A full masquerading destination with no connection thresholds.
fn dest_full_attrs(d: &DestKey, spec: &DestSpec) -> Vec<DestAttr> {
    let mut attrs = dest_key_attrs(d);
    attrs.extend([
        DestAttr::FwdMethod(IP_VS_CONN_F_MASQ),
        DestAttr::Weight(spec.weight),
        DestAttr::UpperThreshold(0),
        DestAttr::LowerThreshold(0),
    ]);
    attrs
}

fn message(cmd: IpvsCmd, attrs: Vec<IpvsAttr>) -> IpvsMessage {
    IpvsMessage { cmd, attrs }
}

/// `ipvsadm -A`: IPVS_CMD_NEW_SERVICE with a full service entry.
pub fn add_service(vs: &VsKey, spec: &VsSpec) -> IpvsMessage {
    message(IpvsCmd::NewService, vec![IpvsAttr::Service(svc_full_attrs(vs, spec))])
}

/// `ipvsadm -E`: IPVS_CMD_SET_SERVICE with a full service entry.
pub fn edit_service(vs: &VsKey, spec: &VsSpec) -> IpvsMessage {
    message(IpvsCmd::SetService, vec![IpvsAttr::Service(svc_full_attrs(vs, spec))])
}

/// `ipvsadm -D`: IPVS_CMD_DEL_SERVICE with the identifying attributes.
pub fn del_service(vs: &VsKey) -> IpvsMessage {
    message(IpvsCmd::DelService, vec![IpvsAttr::Service(svc_key_attrs(vs))])
}

fn dest_message(cmd: IpvsCmd, vs: &VsKey, dest: Vec<DestAttr>) -> IpvsMessage {
    message(cmd, vec![IpvsAttr::Service(svc_key_attrs(vs)), IpvsAttr::Dest(dest)])
}

/// `ipvsadm -a -m -w W`: IPVS_CMD_NEW_DEST (masquerading, thresholds 0).
pub fn add_dest(vs: &VsKey, d: &DestKey, spec: &DestSpec) -> IpvsMessage {
    dest_message(IpvsCmd::NewDest, vs, dest_full_attrs(d, spec))
}

/// `ipvsadm -e -m -w W`: IPVS_CMD_SET_DEST.
pub fn edit_dest(vs: &VsKey, d: &DestKey, spec: &DestSpec) -> IpvsMessage {
    dest_message(IpvsCmd::SetDest, vs, dest_full_attrs(d, spec))
}

/// `ipvsadm -d`: IPVS_CMD_DEL_DEST with the identifying attributes.
pub fn del_dest(vs: &VsKey, d: &DestKey) -> IpvsMessage {
    dest_message(IpvsCmd::DelDest, vs, dest_key_attrs(d))
}

/// IPVS_CMD_GET_SERVICE as a dump (send with NLM_F_DUMP): every service.
pub fn dump_services() -> IpvsMessage {
    message(IpvsCmd::GetService, Vec::new())
}

/// IPVS_CMD_GET_DEST as a dump: the destinations of `vs`. The kernel answers
/// an empty dump if the service does not exist.
pub fn dump_dests(vs: &VsKey) -> IpvsMessage {
    message(IpvsCmd::GetDest, vec![IpvsAttr::Service(svc_key_attrs(vs))])
}

/// `ipvsadm --set TCP TCPFIN UDP`: IPVS_CMD_SET_CONFIG. Seconds; the kernel
/// leaves a value unchanged when it is 0.
pub fn set_timeouts(tcp: u32, tcp_fin: u32, udp: u32) -> IpvsMessage {
    message(
        IpvsCmd::SetConfig,
        vec![IpvsAttr::TimeoutTcp(tcp), IpvsAttr::TimeoutTcpFin(tcp_fin), IpvsAttr::TimeoutUdp(udp)],
    )
}

/// `ipvsadm -C`: IPVS_CMD_FLUSH, removes every service and destination.
pub fn flush() -> IpvsMessage {
    message(IpvsCmd::Flush, Vec::new())
}

/// The request for one IPVS op.
pub fn op_message(op: &IpvsOp) -> IpvsMessage {
    match op {
        IpvsOp::AddService(vs, spec) => add_service(vs, spec),
        IpvsOp::EditService(vs, spec) => edit_service(vs, spec),
        IpvsOp::AddDest(vs, d, spec) => add_dest(vs, d, spec),
        IpvsOp::EditDest(vs, d, spec) => edit_dest(vs, d, spec),
        IpvsOp::DelDest(vs, d) => del_dest(vs, d),
        IpvsOp::DelService(vs) => del_service(vs),
    }
}

/// Whether a command is sent as a dump (GET_SERVICE without a service,
/// GET_DEST, GET_DAEMON) rather than as a request to acknowledge.
pub fn is_dump(msg: &IpvsMessage) -> bool {
    match msg.cmd {
        IpvsCmd::GetService => msg.attrs.is_empty(),
        IpvsCmd::GetDest | IpvsCmd::GetDaemon => true,
        _ => false,
    }
}

/// Netlink header flags for a request: dumps get `NLM_F_DUMP`, everything
/// else `NLM_F_ACK`, so every request ends in exactly one ack or error.
pub fn request_flags(msg: &IpvsMessage) -> u16 {
    if is_dump(msg) {
        NLM_F_REQUEST | NLM_F_DUMP
    } else {
        NLM_F_REQUEST | NLM_F_ACK
    }
}

/// Wraps `msg` in generic netlink and netlink headers for the resolved
/// `family_id`. The sequence number is left 0: the connection assigns it.
pub fn netlink_request(msg: IpvsMessage, family_id: u16) -> NetlinkMessage<GenlMessage<IpvsMessage>> {
    let flags = request_flags(&msg);
    let mut genl = GenlMessage::from_payload(msg);
    genl.set_resolved_family_id(family_id);
    let mut nl = NetlinkMessage::from(genl);
    nl.header.flags = flags;
    nl.finalize();
    nl
}

// ---------------------------------------------------------------- replies

/// A dump reply that is well-formed netlink but not a usable IPVS entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplyError {
    #[error("reply lacks attribute {0}")]
    Missing(&'static str),
    #[error("address family {0} is neither AF_INET nor AF_INET6")]
    Family(u16),
    #[error("{attr} has {len} bytes, too few for address family {af}")]
    ShortAddress { attr: &'static str, af: u16, len: usize },
    #[error("weight {0} is negative")]
    Weight(i32),
}

/// A dumped destination: key, spec, active and inactive connection counts.
pub type DestEntry = (DestKey, DestSpec, u32, u32);

macro_rules! attr {
    ($attrs:expr, $variant:path) => {
        $attrs.iter().find_map(|a| match a {
            $variant(v) => Some(v),
            _ => None,
        })
    };
}

fn required<T>(v: Option<T>, name: &'static str) -> Result<T, ReplyError> {
    v.ok_or(ReplyError::Missing(name))
}

/// Reads a `union nf_inet_addr` of family `af` (4 or 16 bytes accepted).
pub fn ip_from_inet_addr(af: u16, bytes: &[u8], attr: &'static str) -> Result<IpAddr, ReplyError> {
    let short = || ReplyError::ShortAddress { attr, af, len: bytes.len() };
    match af {
        AF_INET => {
            let b: [u8; 4] = bytes.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(short)?;
            Ok(IpAddr::V4(Ipv4Addr::from(b)))
        }
        AF_INET6 => {
            let b: [u8; 16] = bytes.get(..16).and_then(|b| b.try_into().ok()).ok_or_else(short)?;
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
        other => Err(ReplyError::Family(other)),
    }
}

fn service_attrs(msg: &IpvsMessage) -> Result<&[SvcAttr], ReplyError> {
    required(attr!(msg.attrs, IpvsAttr::Service), "IPVS_CMD_ATTR_SERVICE").map(Vec::as_slice)
}

fn dest_attrs(msg: &IpvsMessage) -> Result<&[DestAttr], ReplyError> {
    required(attr!(msg.attrs, IpvsAttr::Dest), "IPVS_CMD_ATTR_DEST").map(Vec::as_slice)
}

/// Reads one service of a GET_SERVICE dump.
///
/// `Ok(None)` is a service kube-proxy never creates: a firewall-mark service
/// or one whose L4 protocol is not TCP, UDP or SCTP. Callers skip it (and
/// must not prune it: it is not ours). Flags come back without FLAG_HASHED.
pub fn parse_service(msg: &IpvsMessage) -> Result<Option<(VsKey, VsSpec)>, ReplyError> {
    let attrs = service_attrs(msg)?;
    let af = *required(attr!(attrs, SvcAttr::AddressFamily), "IPVS_SVC_ATTR_AF")?;
    if attr!(attrs, SvcAttr::Fwmark).is_some_and(|m| *m != 0) {
        return Ok(None);
    }
    let proto = *required(attr!(attrs, SvcAttr::Protocol), "IPVS_SVC_ATTR_PROTOCOL")?;
    let Some(protocol) = u8::try_from(proto).ok().and_then(Protocol::from_number) else {
        return Ok(None);
    };
    let addr = required(attr!(attrs, SvcAttr::Address), "IPVS_SVC_ATTR_ADDR")?;
    let key = VsKey {
        addr: ip_from_inet_addr(af, addr, "IPVS_SVC_ATTR_ADDR")?,
        protocol,
        port: *required(attr!(attrs, SvcAttr::Port), "IPVS_SVC_ATTR_PORT")?,
    };
    let flags = required(attr!(attrs, SvcAttr::Flags), "IPVS_SVC_ATTR_FLAGS")?;
    let spec = VsSpec {
        scheduler: required(attr!(attrs, SvcAttr::SchedName), "IPVS_SVC_ATTR_SCHED_NAME")?.clone(),
        flags: flags.flags & flags.mask & !FLAG_HASHED,
        timeout: *required(attr!(attrs, SvcAttr::Timeout), "IPVS_SVC_ATTR_TIMEOUT")?,
    };
    Ok(Some((key, spec)))
}

/// Reads one destination of a GET_DEST dump of service `vs`. Kernels before
/// 3.18 send no ADDR_FAMILY; the destination then has the service's family.
pub fn parse_dest(msg: &IpvsMessage, vs: &VsKey) -> Result<DestEntry, ReplyError> {
    let attrs = dest_attrs(msg)?;
    let af = attr!(attrs, DestAttr::AddressFamily).map_or_else(|| af_of(&vs.addr), |af| *af);
    let addr = required(attr!(attrs, DestAttr::Address), "IPVS_DEST_ATTR_ADDR")?;
    let key = DestKey {
        addr: ip_from_inet_addr(af, addr, "IPVS_DEST_ATTR_ADDR")?,
        port: *required(attr!(attrs, DestAttr::Port), "IPVS_DEST_ATTR_PORT")?,
    };
    let weight = *required(attr!(attrs, DestAttr::Weight), "IPVS_DEST_ATTR_WEIGHT")?;
    if weight < 0 {
        return Err(ReplyError::Weight(weight));
    }
    let active = *required(attr!(attrs, DestAttr::ActiveConns), "IPVS_DEST_ATTR_ACTIVE_CONNS")?;
    let inactive = *required(attr!(attrs, DestAttr::InactConns), "IPVS_DEST_ATTR_INACT_CONNS")?;
    Ok((key, DestSpec { weight }, active, inactive))
}

/// Byte-level tests. How the expected bytes were derived: a netlink message
/// is `struct nlmsghdr { u32 len; u16 type; u16 flags; u32 seq; u32 pid; }`,
/// then `struct genlmsghdr { u8 cmd; u8 version; u16 reserved; }`, then
/// attributes. Each attribute is `struct nlattr { u16 nla_len; u16 nla_type; }`
/// followed by its value padded to 4 bytes; `nla_len` counts header and value
/// but not the padding. Command, attribute numbers and value types come from
/// `include/uapi/linux/ip_vs.h` and the `nla_policy` tables of
/// `net/netfilter/ipvs/ip_vs_ctl.c` (see the module doc); the attribute order
/// follows ipvsadm's libipvs. Multi-byte integers are little endian (x86),
/// except ports, which are big endian. The family id is whatever the kernel
/// assigned at module load; these tests use 0x24, and sequence number 1.
#[cfg(all(test, target_endian = "little"))]
mod tests {
    use super::*;
    use crate::msgs::ipvs::FLAG_PERSISTENT;
    use netlink_packet_core::NetlinkPayload;

    const FAMILY: u16 = 0x24;

    fn emit(msg: IpvsMessage) -> Vec<u8> {
        let mut nl = netlink_request(msg, FAMILY);
        nl.header.sequence_number = 1;
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    fn deserialize(bytes: &[u8]) -> NetlinkMessage<GenlMessage<IpvsMessage>> {
        NetlinkMessage::<GenlMessage<IpvsMessage>>::deserialize(bytes).expect("valid message")
    }

    fn payload(nl: NetlinkMessage<GenlMessage<IpvsMessage>>) -> IpvsMessage {
        match nl.payload {
            NetlinkPayload::InnerMessage(genl) => genl.payload,
            other => panic!("not an IPVS message: {other:?}"),
        }
    }

    /// Emits `msg`, checks the bytes, then parses them back to `msg`.
    fn check(msg: IpvsMessage, expected: &[u8]) {
        let bytes = emit(msg.clone());
        assert_eq!(bytes, expected);
        assert_eq!(payload(deserialize(&bytes)), msg);
    }

    fn vs4() -> VsKey {
        VsKey { addr: "10.96.0.1".parse().unwrap(), protocol: Protocol::Tcp, port: 443 }
    }

    fn dest4() -> DestKey {
        DestKey { addr: "10.244.1.5".parse().unwrap(), port: 8443 }
    }

    fn vs6() -> VsKey {
        VsKey { addr: "fd00::10".parse().unwrap(), protocol: Protocol::Tcp, port: 80 }
    }

    fn dest6() -> DestKey {
        DestKey { addr: "fd00::5".parse().unwrap(), port: 8080 }
    }

    fn persistent_rr() -> VsSpec {
        VsSpec { scheduler: "rr".into(), flags: FLAG_PERSISTENT, timeout: 10800 }
    }

    fn plain_rr() -> VsSpec {
        VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 }
    }

    #[rustfmt::skip]
    const ADD_SERVICE_V4: [u8; 104] = [
        // nlmsghdr
        0x68, 0x00, 0x00, 0x00, // nlmsg_len = 104
        0x24, 0x00,             // nlmsg_type = IPVS family id
        0x05, 0x00,             // nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK
        0x01, 0x00, 0x00, 0x00, // nlmsg_seq = 1
        0x00, 0x00, 0x00, 0x00, // nlmsg_pid = 0
        // genlmsghdr
        0x01, 0x01, 0x00, 0x00, // cmd = IPVS_CMD_NEW_SERVICE, version = 1
        // IPVS_CMD_ATTR_SERVICE, nested, len = 84
        0x54, 0x00, 0x01, 0x00,
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF = AF_INET (u16, 2 pad)
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTOCOL = IPPROTO_TCP (u16)
        0x14, 0x00, 0x03, 0x00,                         // ADDR, 16 bytes:
        0x0a, 0x60, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, //   10.96.0.1, then zeros
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0x00, 0x00, // PORT = 443, big endian
        0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // SCHED_NAME = "rr\0", 1 pad
        0x0c, 0x00, 0x07, 0x00,                         // FLAGS = ip_vs_flags {
        0x01, 0x00, 0x00, 0x00,                         //   flags = PERSISTENT,
        0xff, 0xff, 0xff, 0xff,                         //   mask = !0 }
        0x08, 0x00, 0x08, 0x00, 0x30, 0x2a, 0x00, 0x00, // TIMEOUT = 10800 s
        0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff, // NETMASK = 255.255.255.255
    ];

    #[test]
    fn add_service_v4_bytes() {
        check(add_service(&vs4(), &persistent_rr()), &ADD_SERVICE_V4);
    }

    #[test]
    fn edit_service_v4_bytes_differ_from_add_only_in_the_command() {
        let mut expected = ADD_SERVICE_V4;
        expected[16] = 0x02; // genlmsghdr.cmd = IPVS_CMD_SET_SERVICE
        check(edit_service(&vs4(), &persistent_rr()), &expected);
    }

    #[test]
    fn hashed_flag_is_never_sent() {
        let spec = VsSpec { flags: FLAG_PERSISTENT | FLAG_HASHED, ..persistent_rr() };
        assert_eq!(emit(add_service(&vs4(), &spec)), ADD_SERVICE_V4);
    }

    #[rustfmt::skip]
    const SERVICE_KEY_V4: [u8; 48] = [
        // IPVS_CMD_ATTR_SERVICE, nested, len = 48: identifying attributes only
        0x30, 0x00, 0x01, 0x00,
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00, // AF = AF_INET
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTOCOL = IPPROTO_TCP
        0x14, 0x00, 0x03, 0x00,                         // ADDR = 10.96.0.1
        0x0a, 0x60, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x04, 0x00, 0x01, 0xbb, 0x00, 0x00, // PORT = 443
    ];

    /// nlmsghdr + genlmsghdr for a request of `len` bytes.
    #[rustfmt::skip]
    fn header(len: u8, flags: [u8; 2], cmd: u8) -> Vec<u8> {
        vec![
            len, 0x00, 0x00, 0x00,  // nlmsg_len
            0x24, 0x00,             // nlmsg_type = IPVS family id
            flags[0], flags[1],     // nlmsg_flags
            0x01, 0x00, 0x00, 0x00, // nlmsg_seq = 1
            0x00, 0x00, 0x00, 0x00, // nlmsg_pid = 0
            cmd, 0x01, 0x00, 0x00,  // genlmsghdr: cmd, version 1
        ]
    }

    const ACK: [u8; 2] = [0x05, 0x00]; // NLM_F_REQUEST | NLM_F_ACK
    const DUMP: [u8; 2] = [0x01, 0x03]; // NLM_F_REQUEST | NLM_F_DUMP (ROOT | MATCH)

    #[test]
    fn del_service_v4_bytes() {
        let expected = [header(68, ACK, 0x03), SERVICE_KEY_V4.to_vec()].concat();
        check(del_service(&vs4()), &expected);
    }

    #[rustfmt::skip]
    const DEST_FULL_V4: [u8; 72] = [
        // IPVS_CMD_ATTR_DEST, nested, len = 72
        0x48, 0x00, 0x02, 0x00,
        0x06, 0x00, 0x0b, 0x00, 0x02, 0x00, 0x00, 0x00, // ADDR_FAMILY = AF_INET (u16)
        0x14, 0x00, 0x01, 0x00,                         // ADDR, 16 bytes:
        0x0a, 0xf4, 0x01, 0x05, 0x00, 0x00, 0x00, 0x00, //   10.244.1.5, then zeros
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x02, 0x00, 0x20, 0xfb, 0x00, 0x00, // PORT = 8443, big endian
        0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, // FWD_METHOD = IP_VS_CONN_F_MASQ
        0x08, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00, // WEIGHT = 1
        0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // U_THRESH = 0
        0x08, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, // L_THRESH = 0
    ];

    #[test]
    fn add_dest_v4_bytes() {
        let expected = [
            header(140, ACK, 0x05), // IPVS_CMD_NEW_DEST, 20 + 48 + 72 bytes
            SERVICE_KEY_V4.to_vec(),
            DEST_FULL_V4.to_vec(),
        ]
        .concat();
        check(add_dest(&vs4(), &dest4(), &DestSpec { weight: 1 }), &expected);
    }

    #[test]
    fn edit_dest_v4_bytes() {
        let mut dest = DEST_FULL_V4;
        dest[52] = 0x00; // WEIGHT = 0 (graceful termination)
        let expected = [
            header(140, ACK, 0x06), // IPVS_CMD_SET_DEST
            SERVICE_KEY_V4.to_vec(),
            dest.to_vec(),
        ]
        .concat();
        check(edit_dest(&vs4(), &dest4(), &DestSpec { weight: 0 }), &expected);
    }

    #[test]
    fn del_dest_v4_bytes() {
        let mut dest = DEST_FULL_V4[..40].to_vec(); // ADDR_FAMILY, ADDR, PORT
        dest[0] = 0x28; // nested len = 40
        let expected = [
            header(108, ACK, 0x07), // IPVS_CMD_DEL_DEST, 20 + 48 + 40 bytes
            SERVICE_KEY_V4.to_vec(),
            dest,
        ]
        .concat();
        check(del_dest(&vs4(), &dest4()), &expected);
    }

    #[test]
    fn dump_services_bytes() {
        // IPVS_CMD_GET_SERVICE, no attributes, as a dump.
        check(dump_services(), &header(20, DUMP, 0x04));
    }

    #[test]
    fn dump_dests_bytes() {
        // IPVS_CMD_GET_DEST naming the service, as a dump.
        let expected = [header(68, DUMP, 0x08), SERVICE_KEY_V4.to_vec()].concat();
        check(dump_dests(&vs4()), &expected);
    }

    #[test]
    #[rustfmt::skip]
    fn set_timeouts_bytes() {
        let expected = [
            header(44, ACK, 0x0c), // IPVS_CMD_SET_CONFIG
            vec![
                0x08, 0x00, 0x04, 0x00, 0x84, 0x03, 0x00, 0x00, // TIMEOUT_TCP = 900
                0x08, 0x00, 0x05, 0x00, 0x78, 0x00, 0x00, 0x00, // TIMEOUT_TCP_FIN = 120
                0x08, 0x00, 0x06, 0x00, 0x2c, 0x01, 0x00, 0x00, // TIMEOUT_UDP = 300
            ],
        ]
        .concat();
        check(set_timeouts(900, 120, 300), &expected);
    }

    #[test]
    fn flush_bytes() {
        check(flush(), &header(20, ACK, 0x11)); // IPVS_CMD_FLUSH
    }

    #[rustfmt::skip]
    const SERVICE_KEY_V6: [u8; 48] = [
        0x30, 0x00, 0x01, 0x00,                         // IPVS_CMD_ATTR_SERVICE, len 48
        0x06, 0x00, 0x01, 0x00, 0x0a, 0x00, 0x00, 0x00, // AF = AF_INET6
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, // PROTOCOL = IPPROTO_TCP
        0x14, 0x00, 0x03, 0x00,                         // ADDR = fd00::10
        0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
        0x06, 0x00, 0x04, 0x00, 0x00, 0x50, 0x00, 0x00, // PORT = 80
    ];

    #[test]
    #[rustfmt::skip]
    fn add_service_v6_bytes() {
        let mut service = SERVICE_KEY_V6.to_vec();
        service[0] = 0x54; // nested len = 84
        service.extend([
            0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00, // SCHED_NAME = "rr"
            0x0c, 0x00, 0x07, 0x00,                         // FLAGS {
            0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, //   flags = 0, mask = !0 }
            0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, // TIMEOUT = 0
            0x08, 0x00, 0x09, 0x00, 0x80, 0x00, 0x00, 0x00, // NETMASK = 128 (prefix length)
        ]);
        let expected = [header(104, ACK, 0x01), service].concat();
        check(add_service(&vs6(), &plain_rr()), &expected);
    }

    #[test]
    #[rustfmt::skip]
    fn add_dest_v6_bytes() {
        let dest = vec![
            0x48, 0x00, 0x02, 0x00,                         // IPVS_CMD_ATTR_DEST, len 72
            0x06, 0x00, 0x0b, 0x00, 0x0a, 0x00, 0x00, 0x00, // ADDR_FAMILY = AF_INET6
            0x14, 0x00, 0x01, 0x00,                         // ADDR = fd00::5
            0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
            0x06, 0x00, 0x02, 0x00, 0x1f, 0x90, 0x00, 0x00, // PORT = 8080
            0x08, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, // FWD_METHOD = MASQ
            0x08, 0x00, 0x04, 0x00, 0x01, 0x00, 0x00, 0x00, // WEIGHT = 1
            0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, // U_THRESH = 0
            0x08, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00, 0x00, // L_THRESH = 0
        ];
        let expected = [header(140, ACK, 0x05), SERVICE_KEY_V6.to_vec(), dest].concat();
        check(add_dest(&vs6(), &dest6(), &DestSpec { weight: 1 }), &expected);
    }

    #[test]
    fn every_op_maps_to_its_builder() {
        let (vs, d, spec) = (vs4(), dest4(), DestSpec { weight: 3 });
        let cases = [
            (IpvsOp::AddService(vs, plain_rr()), add_service(&vs, &plain_rr())),
            (IpvsOp::EditService(vs, plain_rr()), edit_service(&vs, &plain_rr())),
            (IpvsOp::AddDest(vs, d, spec), add_dest(&vs, &d, &spec)),
            (IpvsOp::EditDest(vs, d, spec), edit_dest(&vs, &d, &spec)),
            (IpvsOp::DelDest(vs, d), del_dest(&vs, &d)),
            (IpvsOp::DelService(vs), del_service(&vs)),
        ];
        for (op, msg) in cases {
            assert_eq!(op_message(&op), msg, "{op}");
        }
    }

    #[test]
    fn commands_round_trip_including_unknown_ones() {
        for n in 0..=255u8 {
            assert_eq!(u8::from(IpvsCmd::from(n)), n);
        }
        assert_eq!(IpvsCmd::from(17), IpvsCmd::Flush);
        assert_eq!(IpvsCmd::from(99), IpvsCmd::Other(99));
    }

    // ------------------------------------------------------------ replies

    /// One attribute: header, value, padding.
    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let len = u16::try_from(4 + value.len()).unwrap();
        let mut out = [&len.to_le_bytes()[..], &kind.to_le_bytes(), value].concat();
        out.resize(out.len().next_multiple_of(4), 0);
        out
    }

    fn nest(kind: u16, parts: &[Vec<u8>]) -> Vec<u8> {
        nla(kind, &parts.concat())
    }

    /// A dump reply as the kernel sends it: NLM_F_MULTI, our seq and port id.
    fn reply(cmd: u8, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body = attrs.concat();
        let len = u32::try_from(20 + body.len()).unwrap();
        let mut out = len.to_le_bytes().to_vec();
        out.extend(FAMILY.to_le_bytes()); // nlmsg_type
        out.extend(0x0002u16.to_le_bytes()); // NLM_F_MULTI
        out.extend(7u32.to_le_bytes()); // nlmsg_seq
        out.extend(4242u32.to_le_bytes()); // nlmsg_pid: our port id
        out.extend([cmd, 1, 0, 0]); // genlmsghdr
        out.extend(body);
        out
    }

    /// IPVS_*_ATTR_STATS as ip_vs_genl_fill_stats writes it: u32 counters
    /// and rates, u64 byte counts.
    fn stats(kind: u16) -> Vec<u8> {
        let u32s = |k: u16, v: u32| nla(k, &v.to_le_bytes());
        let u64s = |k: u16, v: u64| nla(k, &v.to_le_bytes());
        nest(
            kind,
            &[
                u32s(1, 5),    // CONNS
                u32s(2, 40),   // INPKTS
                u32s(3, 38),   // OUTPKTS
                u64s(4, 3200), // INBYTES
                u64s(5, 5100), // OUTBYTES
                u32s(6, 0),    // CPS
                u32s(7, 1),    // INPPS
                u32s(8, 1),    // OUTPPS
                u32s(9, 80),   // INBPS
                u32s(10, 120), // OUTBPS
            ],
        )
    }

    /// IPVS_*_ATTR_STATS64: the same counters, all u64 (abridged).
    fn stats64(kind: u16) -> Vec<u8> {
        let u64s = |k: u16, v: u64| nla(k, &v.to_le_bytes());
        nest(kind, &[u64s(1, 5), u64s(4, 3200), u64s(5, 5100)])
    }

    fn addr16(ip: [u8; 4]) -> Vec<u8> {
        let mut a = ip.to_vec();
        a.resize(16, 0);
        a
    }

    /// A GET_SERVICE dump entry in the order of ip_vs_genl_fill_service.
    fn service_reply(flags: u32, extra: &[Vec<u8>]) -> Vec<u8> {
        let mut svc = vec![
            nla(1, &AF_INET.to_le_bytes()),                     // AF
            nla(2, &17u16.to_le_bytes()),                       // PROTOCOL = UDP
            nla(3, &addr16([10, 96, 0, 10])),                   // ADDR, 16 bytes
            nla(4, &53u16.to_be_bytes()),                       // PORT
            nla(6, b"rr\0"),                                    // SCHED_NAME
            nla(7, &[flags.to_le_bytes(), [0xff; 4]].concat()), // FLAGS
            nla(8, &10800u32.to_le_bytes()),                    // TIMEOUT
            nla(9, &u32::MAX.to_le_bytes()),                    // NETMASK
            stats(10),                                          // STATS
            stats64(12),                                        // STATS64
        ];
        svc.extend_from_slice(extra);
        reply(IPVS_CMD_NEW_SERVICE, &[nest(1, &svc)])
    }

    #[test]
    fn parses_a_kernel_service_dump_entry_and_keeps_stats_byte_for_byte() {
        let bytes = service_reply(FLAG_PERSISTENT | FLAG_HASHED, &[]);
        let nl = deserialize(&bytes);
        let mut again = vec![0; nl.buffer_len()];
        nl.serialize(&mut again);
        assert_eq!(again, bytes, "unknown attributes must round-trip");

        let msg = payload(nl);
        assert_eq!(msg.cmd, IpvsCmd::NewService);
        let want = VsKey { addr: "10.96.0.10".parse().unwrap(), protocol: Protocol::Udp, port: 53 };
        let spec = VsSpec {
            scheduler: "rr".into(),
            flags: FLAG_PERSISTENT, // FLAG_HASHED dropped
            timeout: 10800,
        };
        assert_eq!(parse_service(&msg), Ok(Some((want, spec))));
    }

    #[test]
    fn unknown_service_attributes_are_kept_as_other() {
        let bytes = service_reply(FLAG_HASHED, &[nla(40, &[1, 2, 3])]);
        let msg = payload(deserialize(&bytes));
        let Some(IpvsAttr::Service(attrs)) = msg.attrs.first() else {
            panic!("no service attribute");
        };
        assert!(attrs.contains(&SvcAttr::Other(DefaultNla::new(40, vec![1, 2, 3]))));
        assert!(parse_service(&msg).is_ok_and(|s| s.is_some()));
    }

    #[test]
    fn firewall_mark_and_foreign_protocol_services_are_skipped() {
        let fwmark = reply(
            IPVS_CMD_NEW_SERVICE,
            &[nest(
                1,
                &[
                    nla(1, &AF_INET.to_le_bytes()),
                    nla(5, &0x4000u32.to_le_bytes()), // FWMARK
                    nla(6, b"rr\0"),
                    nla(7, &[[2, 0, 0, 0], [0xff; 4]].concat()),
                    nla(8, &0u32.to_le_bytes()),
                    nla(9, &u32::MAX.to_le_bytes()),
                ],
            )],
        );
        assert_eq!(parse_service(&payload(deserialize(&fwmark))), Ok(None));

        let mut esp = emit(add_service(&vs4(), &plain_rr()));
        esp[36] = 50; // PROTOCOL value (after nlmsghdr, genlmsghdr, nest and AF) = IPPROTO_ESP
        assert_eq!(parse_service(&payload(deserialize(&esp))), Ok(None));
    }

    #[test]
    fn a_four_byte_ipv4_address_is_accepted() {
        let mut msg = add_service(&vs4(), &plain_rr());
        if let IpvsAttr::Service(attrs) = &mut msg.attrs[0] {
            attrs[2] = SvcAttr::Address(vec![10, 96, 0, 1]);
        }
        let bytes = emit(msg);
        assert_eq!(parse_service(&payload(deserialize(&bytes))), Ok(Some((vs4(), plain_rr()))));
    }

    #[test]
    fn a_service_without_scheduler_is_an_error() {
        let mut msg = add_service(&vs4(), &plain_rr());
        if let IpvsAttr::Service(attrs) = &mut msg.attrs[0] {
            attrs.retain(|a| !matches!(a, SvcAttr::SchedName(_)));
        }
        assert_eq!(parse_service(&msg), Err(ReplyError::Missing("IPVS_SVC_ATTR_SCHED_NAME")));
    }

    #[test]
    fn a_known_attribute_with_a_bad_length_is_a_decode_error() {
        let bytes = reply(
            IPVS_CMD_NEW_SERVICE,
            &[nest(1, &[nla(4, &[0, 80, 0, 0])])], // PORT with 4 bytes
        );
        assert!(NetlinkMessage::<GenlMessage<IpvsMessage>>::deserialize(&bytes).is_err());
    }

    /// A GET_DEST dump entry in the order of ip_vs_genl_fill_dest (6.x).
    fn dest_reply(with_family: bool) -> Vec<u8> {
        let mut dest = vec![
            nla(1, &addr16([10, 244, 2, 7])), // ADDR
            nla(2, &8080u16.to_be_bytes()),   // PORT
            nla(3, &0u32.to_le_bytes()),      // FWD_METHOD = MASQ
            nla(4, &0u32.to_le_bytes()),      // WEIGHT = 0 (terminating)
            nla(13, &[0]),                    // TUN_TYPE (u8)
            nla(14, &0u16.to_be_bytes()),     // TUN_PORT
            nla(15, &0u16.to_le_bytes()),     // TUN_FLAGS
            nla(5, &0u32.to_le_bytes()),      // U_THRESH
            nla(6, &0u32.to_le_bytes()),      // L_THRESH
            nla(7, &3u32.to_le_bytes()),      // ACTIVE_CONNS
            nla(8, &12u32.to_le_bytes()),     // INACT_CONNS
            nla(9, &0u32.to_le_bytes()),      // PERSIST_CONNS
        ];
        if with_family {
            dest.push(nla(11, &AF_INET.to_le_bytes())); // ADDR_FAMILY
        }
        dest.extend([stats(10), stats64(12)]);
        reply(IPVS_CMD_NEW_DEST, &[nest(2, &dest)])
    }

    #[test]
    fn parses_a_kernel_dest_dump_entry_with_connection_counts() {
        let want_key = DestKey { addr: "10.244.2.7".parse().unwrap(), port: 8080 };
        for with_family in [true, false] {
            let bytes = dest_reply(with_family);
            let nl = deserialize(&bytes);
            let mut again = vec![0; nl.buffer_len()];
            nl.serialize(&mut again);
            assert_eq!(again, bytes);
            let entry = parse_dest(&payload(nl), &vs4());
            assert_eq!(entry, Ok((want_key, DestSpec { weight: 0 }, 3, 12)));
        }
    }

    #[test]
    fn dest_family_comes_from_the_service_when_the_kernel_omits_it() {
        let mut msg = add_dest(&vs6(), &dest6(), &DestSpec { weight: 1 });
        if let IpvsAttr::Dest(attrs) = &mut msg.attrs[1] {
            attrs.retain(|a| !matches!(a, DestAttr::AddressFamily(_)));
            attrs.extend([DestAttr::ActiveConns(0), DestAttr::InactConns(0)]);
        }
        let parsed = parse_dest(&payload(deserialize(&emit(msg))), &vs6());
        assert_eq!(parsed, Ok((dest6(), DestSpec { weight: 1 }, 0, 0)));
    }

    #[test]
    fn short_and_unknown_family_addresses_are_errors() {
        assert_eq!(
            ip_from_inet_addr(AF_INET6, &[0; 4], "A"),
            Err(ReplyError::ShortAddress { attr: "A", af: AF_INET6, len: 4 })
        );
        assert_eq!(ip_from_inet_addr(7, &[0; 16], "A"), Err(ReplyError::Family(7)));
    }
}
