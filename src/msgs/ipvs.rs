//! Deltas for the IPVS actor: virtual services and their real servers.
//! `Display` prints `ipvsadm -S -n` lines, so `--dry-run` output and test
//! diffs read like the tool operators know.

use std::fmt;
use std::net::IpAddr;

use crate::net::{join_host_port, Protocol};

/// IP_VS_SVC_F_PERSISTENT: session affinity (ClientIP).
pub const FLAG_PERSISTENT: u32 = 0x1;
/// IP_VS_SVC_F_HASHED: set by the kernel on every service; ignored when comparing.
pub const FLAG_HASHED: u32 = 0x2;
/// IP_VS_SVC_F_SCHED1: "sh-fallback"/"mh-fallback" (a Service's scheduler-flags annotation).
pub const FLAG_SCHED_FALLBACK: u32 = 0x8;
/// IP_VS_SVC_F_SCHED2: "sh-port"/"mh-port", upstream's FlagSourceHash for the mh scheduler.
pub const FLAG_SCHED_PORT: u32 = 0x10;
/// IP_VS_SVC_F_SCHED3: no scheduler of ours uses it; printed as ipvsadm does.
const FLAG_SCHED3: u32 = 0x20;

/// A virtual service: address, protocol, port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsKey {
    pub addr: IpAddr,
    pub protocol: Protocol,
    pub port: u16,
}

/// What kube-proxy sets on a virtual service besides its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VsSpec {
    pub scheduler: String,
    /// IP_VS_SVC_F_* flags, without FLAG_HASHED.
    pub flags: u32,
    /// Persistence timeout in seconds (0 unless FLAG_PERSISTENT).
    pub timeout: u32,
}

/// A real server (destination) of a virtual service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestKey {
    pub addr: IpAddr,
    pub port: u16,
}

/// kube-proxy always uses masquerading (NAT) forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestSpec {
    pub weight: i32,
}

impl Default for DestSpec {
    fn default() -> Self {
        DestSpec { weight: 1 }
    }
}

/// One IPVS change. Variant order is apply order: parents before children
/// on add, children before parents on delete.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpvsOp {
    AddService(VsKey, VsSpec),
    EditService(VsKey, VsSpec),
    AddDest(VsKey, DestKey, DestSpec),
    EditDest(VsKey, DestKey, DestSpec),
    DelDest(VsKey, DestKey),
    DelService(VsKey),
}

impl IpvsOp {
    pub fn vs(&self) -> &VsKey {
        match self {
            IpvsOp::AddService(k, _)
            | IpvsOp::EditService(k, _)
            | IpvsOp::AddDest(k, _, _)
            | IpvsOp::EditDest(k, _, _)
            | IpvsOp::DelDest(k, _)
            | IpvsOp::DelService(k) => k,
        }
    }
}

fn proto_flag(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp => "--sctp-service",
    }
}

impl fmt::Display for VsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", proto_flag(self.protocol), join_host_port(&self.addr, self.port))
    }
}

impl fmt::Display for DestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&join_host_port(&self.addr, self.port))
    }
}

impl fmt::Display for VsSpec {
    /// As `ipvsadm -S -n`: `-s sh -p 10800 -b sh-fallback,sh-port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "-s {}", self.scheduler)?;
        if self.flags & FLAG_PERSISTENT != 0 {
            write!(f, " -p {}", self.timeout)?;
        }
        let names: Vec<String> =
            [(FLAG_SCHED_FALLBACK, "fallback", 1), (FLAG_SCHED_PORT, "port", 2), (FLAG_SCHED3, "", 3)]
                .into_iter()
                .filter(|(bit, _, _)| self.flags & bit != 0)
                .map(|(_, name, n)| match self.scheduler.as_str() {
                    s @ ("sh" | "mh") if !name.is_empty() => format!("{s}-{name}"),
                    _ => format!("flag-{n}"),
                })
                .collect();
        if !names.is_empty() {
            write!(f, " -b {}", names.join(","))?;
        }
        Ok(())
    }
}

impl fmt::Display for IpvsOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpvsOp::AddService(k, s) => write!(f, "-A {k} {s}"),
            IpvsOp::EditService(k, s) => write!(f, "-E {k} {s}"),
            IpvsOp::AddDest(k, d, s) => write!(f, "-a {k} -r {d} -m -w {}", s.weight),
            IpvsOp::EditDest(k, d, s) => write!(f, "-e {k} -r {d} -m -w {}", s.weight),
            IpvsOp::DelDest(k, d) => write!(f, "-d {k} -r {d}"),
            IpvsOp::DelService(k) => write!(f, "-D {k}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_ipvsadm_save_syntax() {
        let vs = VsKey { addr: "10.96.0.10".parse().unwrap(), protocol: Protocol::Udp, port: 53 };
        let spec = VsSpec { scheduler: "rr".into(), flags: FLAG_PERSISTENT, timeout: 10800 };
        assert_eq!(IpvsOp::AddService(vs, spec).to_string(), "-A -u 10.96.0.10:53 -s rr -p 10800");
        // Scheduler flags after persistence, named for the scheduler, as ipvsadm -S prints them.
        let sh = VsSpec {
            scheduler: "sh".into(),
            flags: FLAG_PERSISTENT | FLAG_SCHED_FALLBACK | FLAG_SCHED_PORT,
            timeout: 100,
        };
        assert_eq!(IpvsOp::AddService(vs, sh).to_string(), "-A -u 10.96.0.10:53 -s sh -p 100 -b sh-fallback,sh-port");
        let mh = VsSpec { scheduler: "mh".into(), flags: FLAG_SCHED_PORT, timeout: 0 };
        assert_eq!(IpvsOp::EditService(vs, mh).to_string(), "-E -u 10.96.0.10:53 -s mh -b mh-port");
        let rr = VsSpec { scheduler: "rr".into(), flags: FLAG_SCHED_FALLBACK, timeout: 0 };
        assert_eq!(rr.to_string(), "-s rr -b flag-1");
        let d = DestKey { addr: "fd00::5".parse().unwrap(), port: 53 };
        let v6 = VsKey { addr: "fd00::10".parse().unwrap(), protocol: Protocol::Tcp, port: 53 };
        assert_eq!(
            IpvsOp::AddDest(v6, d, DestSpec::default()).to_string(),
            "-a -t [fd00::10]:53 -r [fd00::5]:53 -m -w 1"
        );
    }

    #[test]
    fn op_order_puts_parents_first_on_add_and_last_on_delete() {
        let vs = VsKey { addr: "10.0.0.1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
        let d = DestKey { addr: "10.1.0.1".parse().unwrap(), port: 80 };
        let mut ops = [
            IpvsOp::DelService(vs),
            IpvsOp::AddDest(vs, d, DestSpec::default()),
            IpvsOp::DelDest(vs, d),
            IpvsOp::AddService(vs, VsSpec { scheduler: "rr".into(), flags: 0, timeout: 0 }),
        ];
        ops.sort();
        assert!(matches!(ops[0], IpvsOp::AddService(..)));
        assert!(matches!(ops[1], IpvsOp::AddDest(..)));
        assert!(matches!(ops[2], IpvsOp::DelDest(..)));
        assert!(matches!(ops[3], IpvsOp::DelService(..)));
    }
}
