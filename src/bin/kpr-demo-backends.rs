//! kpr-demo-backends: the pods of the demo lab (`deploy/demo/netns.sh`),
//! read from a manifest directory with the daemon's own reader, so the lab
//! gets one backend namespace per endpoint address the daemon programs.
//!
//! ```sh
//! kpr-demo-backends config/demo
//! # 10.244.0.5 demo-node coredns-76f75df574-x7k2m tcp:53 udp:53
//! # 10.244.0.11 demo-node web-5d8f7c9b6-a1b2c tcp:8080
//! ```
//!
//! One line per IPv4 endpoint address of the EndpointSlices, by address:
//! the address, its `nodeName`, its pod (the endpoint's `targetRef` name,
//! else `SERVICE-A-B-C-D`) and every `proto:port` of the slices it is in.
//! The lab is IPv4: slices of another address type are left out. A file
//! the daemon would skip, an endpoint without `nodeName`, an address on
//! two nodes, or a port without number or of a protocol other than TCP
//! and UDP is an error (exit 1, one line each on stderr).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use kube_proxy_rs::actors::source::manifests::{ManifestDir, ManifestError};
use kube_proxy_rs::msgs::{Change, SourceEvent};

/// One pod of the lab.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backend {
    node: String,
    pod: String,
    /// `tcp:8080`, `udp:53`, ...
    ports: BTreeSet<String>,
}

/// Why the lab cannot be built from the slices.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum BackendError {
    #[error("EndpointSlice {slice}: endpoint {address} has no nodeName: the lab runs each pod on its node")]
    NoNode { slice: String, address: String },
    #[error("EndpointSlice {slice}: {address} is not an IPv4 address")]
    BadAddress { slice: String, address: String },
    #[error("EndpointSlice {slice}: {address} is on node {node}, and on {other} in an endpoint before")]
    TwoNodes { slice: String, address: String, node: String, other: String },
    #[error("EndpointSlice {slice}: a port without a number: the lab listens on numbered ports")]
    NoPort { slice: String },
    #[error("EndpointSlice {slice}: protocol {protocol}: the lab's pods answer TCP and UDP")]
    Protocol { slice: String, protocol: String },
}

/// Every IPv4 endpoint address of `slices` and the pod the lab runs for it.
/// Pure: the slices in, the backends or every problem found out.
fn backends(slices: &[EndpointSlice]) -> Result<BTreeMap<Ipv4Addr, Backend>, Vec<BackendError>> {
    let mut out: BTreeMap<Ipv4Addr, Backend> = BTreeMap::new();
    let mut errors = Vec::new();
    for slice in slices.iter().filter(|s| s.address_type == "IPv4") {
        let name = slice_name(slice);
        let ports = match slice_ports(slice, &name) {
            Ok(ports) => ports,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let service = (slice.metadata.labels.as_ref())
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .cloned()
            .unwrap_or_else(|| slice.metadata.name.clone().unwrap_or_default());
        for ep in &slice.endpoints {
            for address in &ep.addresses {
                let Ok(ip) = address.parse::<Ipv4Addr>() else {
                    errors.push(BackendError::BadAddress { slice: name.clone(), address: address.clone() });
                    continue;
                };
                let Some(node) = ep.node_name.clone() else {
                    errors.push(BackendError::NoNode { slice: name.clone(), address: address.clone() });
                    continue;
                };
                let pod = (ep.target_ref.as_ref())
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| r.name.clone())
                    .unwrap_or_else(|| format!("{service}-{}", address.replace('.', "-")));
                match out.get_mut(&ip) {
                    Some(b) if b.node != node => errors.push(BackendError::TwoNodes {
                        slice: name.clone(),
                        address: address.clone(),
                        node,
                        other: b.node.clone(),
                    }),
                    Some(b) => b.ports.extend(ports.iter().cloned()),
                    None => {
                        out.insert(ip, Backend { node, pod, ports: ports.clone() });
                    }
                }
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn slice_name(slice: &EndpointSlice) -> String {
    let m = &slice.metadata;
    format!("{}/{}", m.namespace.as_deref().unwrap_or("default"), m.name.as_deref().unwrap_or(""))
}

/// The slice's ports as `proto:port` (protocol TCP when not given, as the API's default).
fn slice_ports(slice: &EndpointSlice, name: &str) -> Result<BTreeSet<String>, BackendError> {
    let mut out = BTreeSet::new();
    for p in slice.ports.iter().flatten() {
        let protocol = p.protocol.as_deref().unwrap_or("TCP");
        if protocol != "TCP" && protocol != "UDP" {
            return Err(BackendError::Protocol { slice: name.to_string(), protocol: protocol.to_string() });
        }
        let port = p.port.ok_or_else(|| BackendError::NoPort { slice: name.to_string() })?;
        out.insert(format!("{}:{port}", protocol.to_lowercase()));
    }
    Ok(out)
}

/// The lines printed: `ADDRESS NODE POD PORT...`.
struct Listing<'a>(&'a BTreeMap<Ipv4Addr, Backend>);

impl fmt::Display for Listing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (ip, b) in self.0 {
            write!(f, "{ip} {} {}", b.node, b.pod)?;
            for p in &b.ports {
                write!(f, " {p}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// The EndpointSlices of `dir` as the daemon reads them (files as they are
/// now, without waiting for them to settle), or the files it would skip.
fn read_slices(dir: PathBuf) -> Result<Vec<EndpointSlice>, Vec<ManifestError>> {
    let scan = ManifestDir::new(dir).with_settle(Duration::ZERO).scan();
    if !scan.errors.is_empty() {
        return Err(scan.errors);
    }
    Ok((scan.events.into_iter())
        .filter_map(|ev| match ev {
            SourceEvent::EndpointSlice(Change::Applied(slice)) => Some((*slice).clone()),
            _ => None,
        })
        .collect())
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: kpr-demo-backends MANIFEST_DIR");
        return ExitCode::from(2);
    };
    let slices = match read_slices(PathBuf::from(dir)) {
        Ok(slices) => slices,
        Err(errors) => {
            for e in errors {
                eprintln!("kpr-demo-backends: {e}");
            }
            return ExitCode::FAILURE;
        }
    };
    match backends(&slices) {
        Ok(b) => {
            print!("{}", Listing(&b));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in errors {
                eprintln!("kpr-demo-backends: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice from YAML, as a manifest file would hold it.
    fn slice(yaml: &str) -> EndpointSlice {
        yaml_serde::from_str(yaml).expect("test slice")
    }

    fn web(endpoints: &str) -> EndpointSlice {
        slice(&format!(
            "metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}\n\
             addressType: IPv4\nports: [{{port: 8080}}]\nendpoints:\n{endpoints}"
        ))
    }

    #[test]
    fn one_line_per_address_by_address_with_pod_node_and_ports() {
        let dns = slice(
            "metadata: {name: dns-1, labels: {kubernetes.io/service-name: kube-dns}}\naddressType: IPv4\n\
             ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]\n\
             endpoints: [{addresses: [10.244.0.5], nodeName: demo-node, targetRef: {kind: Pod, name: coredns-a}}]",
        );
        let w = web("- {addresses: [10.244.0.11], nodeName: demo-node, targetRef: {kind: Pod, name: web-a}}\n\
             - {addresses: [10.244.1.21], nodeName: other-node}");
        let b = backends(&[w, dns]).unwrap();
        assert_eq!(
            Listing(&b).to_string(),
            "10.244.0.5 demo-node coredns-a tcp:53 udp:53\n\
             10.244.0.11 demo-node web-a tcp:8080\n\
             10.244.1.21 other-node web-10-244-1-21 tcp:8080\n"
        );
    }

    #[test]
    fn an_address_in_two_slices_serves_both_ports() {
        let other = slice(
            "metadata: {name: admin-1, labels: {kubernetes.io/service-name: admin}}\naddressType: IPv4\n\
             ports: [{port: 9090}]\nendpoints: [{addresses: [10.244.0.11], nodeName: demo-node}]",
        );
        let w = web("- {addresses: [10.244.0.11], nodeName: demo-node, targetRef: {kind: Pod, name: web-a}}");
        let b = backends(&[w, other]).unwrap();
        let ports: Vec<&str> = b[&Ipv4Addr::new(10, 244, 0, 11)].ports.iter().map(String::as_str).collect();
        assert_eq!(ports, ["tcp:8080", "tcp:9090"]);
        assert_eq!(b[&Ipv4Addr::new(10, 244, 0, 11)].pod, "web-a");
    }

    #[test]
    fn ipv6_slices_are_left_out() {
        let v6 = slice(
            "metadata: {name: web-v6}\naddressType: IPv6\nports: [{port: 8080}]\n\
             endpoints: [{addresses: ['fd00::11'], nodeName: demo-node}]",
        );
        assert_eq!(backends(&[v6]).unwrap(), BTreeMap::new());
    }

    #[test]
    fn what_the_lab_cannot_run_is_refused_with_every_reason() {
        let w = web("- {addresses: [10.244.0.11]}\n\
             - {addresses: [10.244.0.300], nodeName: demo-node}\n\
             - {addresses: [10.244.1.21], nodeName: other-node}\n\
             - {addresses: [10.244.1.21], nodeName: demo-node}");
        let sctp = slice(
            "metadata: {name: s-1, namespace: kube-system}\naddressType: IPv4\n\
             ports: [{port: 9, protocol: SCTP}]\nendpoints: []",
        );
        let unnumbered = slice("metadata: {name: all-1}\naddressType: IPv4\nports: [{}]\nendpoints: []");
        let errors = backends(&[w, sctp, unnumbered]).unwrap_err();
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                "EndpointSlice default/web-1: endpoint 10.244.0.11 has no nodeName: the lab runs each pod on its node",
                "EndpointSlice default/web-1: 10.244.0.300 is not an IPv4 address",
                "EndpointSlice default/web-1: 10.244.1.21 is on node demo-node, and on other-node in an endpoint before",
                "EndpointSlice kube-system/s-1: protocol SCTP: the lab's pods answer TCP and UDP",
                "EndpointSlice default/all-1: a port without a number: the lab listens on numbered ports",
            ]
        );
    }
}
