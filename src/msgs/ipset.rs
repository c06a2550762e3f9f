//! Deltas for the ipset actors (one actor per set). `Display` prints
//! `ipset save` lines.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::net::{IpFamily, Protocol};

/// The set types upstream's IPVS proxier uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetType {
    HashIp,
    HashIpPort,
    HashIpPortIp,
    HashIpPortNet,
    BitmapPort,
}

impl SetType {
    pub fn as_str(self) -> &'static str {
        match self {
            SetType::HashIp => "hash:ip",
            SetType::HashIpPort => "hash:ip,port",
            SetType::HashIpPortIp => "hash:ip,port,ip",
            SetType::HashIpPortNet => "hash:ip,port,net",
            SetType::BitmapPort => "bitmap:port",
        }
    }

    pub fn parse(s: &str) -> Option<SetType> {
        Some(match s {
            "hash:ip" => SetType::HashIp,
            "hash:ip,port" => SetType::HashIpPort,
            "hash:ip,port,ip" => SetType::HashIpPortIp,
            "hash:ip,port,net" => SetType::HashIpPortNet,
            "bitmap:port" => SetType::BitmapPort,
            _ => return None,
        })
    }
}

/// A set as kube-proxy creates it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SetSpec {
    pub name: String,
    pub set_type: SetType,
    pub family: IpFamily,
    pub comment: &'static str,
}

impl SetSpec {
    /// The `create` line of `ipset save`/`ipset restore`, with upstream's
    /// defaults (hashsize 1024, maxelem 65536; bitmap range 0-65535).
    pub fn create_line(&self) -> String {
        match self.set_type {
            SetType::BitmapPort => format!("create {} bitmap:port range 0-65535", self.name),
            t => format!(
                "create {} {} family {} hashsize 1024 maxelem 65536",
                self.name,
                t.as_str(),
                self.family.ipset_family()
            ),
        }
    }
}

/// One member of a set; the variant must match the set's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetEntry {
    Ip(IpAddr),
    IpPort(IpAddr, Protocol, u16),
    IpPortIp(IpAddr, Protocol, u16, IpAddr),
    IpPortNet(IpAddr, Protocol, u16, IpNet),
    Port(u16),
}

impl SetEntry {
    pub fn set_type(&self) -> SetType {
        match self {
            SetEntry::Ip(_) => SetType::HashIp,
            SetEntry::IpPort(..) => SetType::HashIpPort,
            SetEntry::IpPortIp(..) => SetType::HashIpPortIp,
            SetEntry::IpPortNet(..) => SetType::HashIpPortNet,
            SetEntry::Port(_) => SetType::BitmapPort,
        }
    }
}

impl fmt::Display for SetEntry {
    /// ipset's member syntax: `10.96.0.10,udp:53`, `10.244.1.5,tcp:80,10.244.1.5`, `30080`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetEntry::Ip(ip) => write!(f, "{ip}"),
            SetEntry::IpPort(ip, p, port) => write!(f, "{ip},{}:{port}", p.lower()),
            SetEntry::IpPortIp(ip, p, port, ip2) => write!(f, "{ip},{}:{port},{ip2}", p.lower()),
            SetEntry::IpPortNet(ip, p, port, net) => write!(f, "{ip},{}:{port},{net}", p.lower()),
            SetEntry::Port(port) => write!(f, "{port}"),
        }
    }
}

/// One change to a set's members.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpsetOp {
    Add(SetEntry),
    Del(SetEntry),
}

/// An op with the set it is for, for printing (`add SET entry`).
pub struct SetLine<'a>(pub &'a str, pub &'a IpsetOp);

impl fmt::Display for SetLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.1 {
            IpsetOp::Add(e) => write!(f, "add {} {e}", self.0),
            IpsetOp::Del(e) => write!(f, "del {} {e}", self.0),
        }
    }
}

impl fmt::Display for IpsetOp {
    /// Without the set name (`add 10.96.0.10,udp:53`); see [`SetLine`] for the full line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpsetOp::Add(e) => write!(f, "add {e}"),
            IpsetOp::Del(e) => write!(f, "del {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_ipset_save_syntax() {
        let e = SetEntry::IpPort("10.96.0.10".parse().unwrap(), Protocol::Udp, 53);
        assert_eq!(SetLine("KUBE-CLUSTER-IP", &IpsetOp::Add(e)).to_string(), "add KUBE-CLUSTER-IP 10.96.0.10,udp:53");
        let n = SetEntry::IpPortNet("1.2.3.4".parse().unwrap(), Protocol::Tcp, 80, "192.168.0.0/16".parse().unwrap());
        assert_eq!(n.to_string(), "1.2.3.4,tcp:80,192.168.0.0/16");
        let s = SetSpec {
            name: "KUBE-CLUSTER-IP".into(),
            set_type: SetType::HashIpPort,
            family: IpFamily::V4,
            comment: "",
        };
        assert_eq!(s.create_line(), "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536");
    }
}
