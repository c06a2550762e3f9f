//! The packet lab's backends and clients, shared by the tests that carry real
//! TCP and UDP through network namespaces (`iptables_mode`, `iptables_daemon`).
//! [`topology`] builds the namespaces; the test files add what they test.
//!
//! Backends: [`serve`] runs a TCP and a UDP server on [`BACKEND_PORT`] in a
//! namespace (threads that `setns(2)` into it), answering every line (TCP)
//! or datagram (UDP) with `<backend> <source IP it saw>\n`. TCP connections
//! stay open until the peer closes them, so one connection can carry many
//! exchanges ([`Conn`]).
//!
//! Clients run on threads in a namespace (`Netns::run`); sockets keep their
//! namespace. `wait` arguments are how long a client waits (to connect, or
//! for a UDP answer) before calling an exchange dropped.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Netns;

/// The port every backend's servers listen on (TCP and UDP).
pub const BACKEND_PORT: u16 = 8080;

/// The node's address on the client link.
pub const NODE_IP: &str = "192.168.50.1";
/// The off-cluster client's address.
pub const CLIENT_IP: &str = "192.168.50.10";
/// The node's IPv6 address on the client link (every link is dual-stack).
pub const NODE_IP6: &str = "fd00:50::1";
/// The off-cluster client's IPv6 address.
pub const CLIENT_IP6: &str = "fd00:50::10";

/// How long a client waits for the answer on an open TCP connection.
const TCP_READ_WAIT: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------- topology

/// A backend: its name (`b1`, `b2`, ...), namespace and servers.
pub type Backend = (&'static str, Netns, Servers);

/// The lab's namespaces, named `<prefix>-n`, `<prefix>-c`, `<prefix>-b1`, ...:
/// a node with a client on 192.168.50.0/24 and fd00:50::/64 (routed through
/// the node), an uplink veth so the node has a default route (172.31.0.254
/// and fd00:31::254, never answered), forwarding on for both families, and
/// each backend `bN` on 10.244.N.0/24 and fd00:244:N::/64 behind its own
/// veth, serving on [`BACKEND_PORT`] in both families. IPv6 addresses skip
/// duplicate address detection, so they work at once.
pub fn topology(prefix: &str, backends: &[&'static str]) -> (Netns, Netns, Vec<Backend>) {
    let sh = |ns: &Netns, cmd: &str| ns.ok(&cmd.split_whitespace().collect::<Vec<_>>());
    let node = Netns::new(&format!("{prefix}-n"));
    let client = Netns::new(&format!("{prefix}-c"));
    sh(&node, &format!("ip link add nc0 type veth peer name eth0 netns {}", client.name));
    sh(&node, &format!("ip addr add {NODE_IP}/24 dev nc0"));
    sh(&node, "ip link set nc0 up");
    sh(&client, &format!("ip addr add {CLIENT_IP}/24 dev eth0"));
    sh(&node, &format!("ip addr add {NODE_IP6}/64 dev nc0 nodad"));
    sh(&client, &format!("ip addr add {CLIENT_IP6}/64 dev eth0 nodad"));
    sh(&client, "ip link set eth0 up");
    sh(&client, &format!("ip route add default via {NODE_IP}"));
    sh(&client, &format!("ip -6 route add default via {NODE_IP6}"));
    sh(&node, "ip link add up0 type veth peer name up1");
    sh(&node, "ip addr add 172.31.0.1/24 dev up0");
    sh(&node, "ip link set up1 up");
    sh(&node, "ip link set up0 up");
    sh(&node, "ip addr add fd00:31::1/64 dev up0 nodad");
    sh(&node, "ip route add default via 172.31.0.254");
    sh(&node, "ip -6 route add default via fd00:31::254");
    sh(&node, "sysctl -q -w net.ipv4.ip_forward=1");
    sh(&node, "sysctl -q -w net.ipv6.conf.all.forwarding=1");
    let mut list = Vec::new();
    for name in backends {
        let n: usize = name[1..].parse().expect("backends are b1, b2, ...");
        let ns = Netns::new(&format!("{prefix}-{name}"));
        sh(&node, &format!("ip link add nb{n} type veth peer name eth0 netns {}", ns.name));
        sh(&node, &format!("ip addr add 10.244.{n}.1/24 dev nb{n}"));
        sh(&node, &format!("ip link set nb{n} up"));
        sh(&ns, &format!("ip addr add 10.244.{n}.2/24 dev eth0"));
        sh(&node, &format!("ip addr add fd00:244:{n}::1/64 dev nb{n} nodad"));
        sh(&ns, &format!("ip addr add fd00:244:{n}::2/64 dev eth0 nodad"));
        sh(&ns, "ip link set eth0 up");
        sh(&ns, &format!("ip route add default via 10.244.{n}.1"));
        sh(&ns, &format!("ip -6 route add default via fd00:244:{n}::1"));
        // IPv6 sockets of their own, beside the IPv4 ones on the same port.
        sh(&ns, "sysctl -q -w net.ipv6.bindv6only=1");
        let servers = serve(&ns, name);
        list.push((*name, ns, servers));
    }
    (node, client, list)
}

// ---------------------------------------------------------------- backends

/// A TCP and a UDP server in one backend namespace; stopped on drop.
pub struct Servers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs `body` on a thread inside `ns`, returning once it has bound (reported through `ready`).
fn spawn_in(ns: &Netns, body: impl FnOnce(mpsc::Sender<Result<(), String>>) + Send + 'static) -> JoinHandle<()> {
    let path = format!("/run/netns/{}", ns.name);
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
        body(tx);
    });
    rx.recv().expect("server thread started").unwrap_or_else(|e| panic!("server in {}: {e}", ns.name));
    t
}

/// Answers each line of one TCP connection until the peer closes or `stop`.
fn serve_connection(mut s: TcpStream, name: &'static str, stop: Arc<AtomicBool>) {
    let Ok(peer) = s.peer_addr() else { return };
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) if line.ends_with('\n') => {
                line.clear();
                if s.write_all(format!("{name} {}\n", peer.ip()).as_bytes()).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Starts backend `name`'s TCP and UDP servers inside `ns`, on IPv4 and,
/// where the namespace has IPv6 sockets of their own (`bindv6only`), IPv6.
pub fn serve(ns: &Netns, name: &'static str) -> Servers {
    serve_port(ns, name, BACKEND_PORT)
}

/// [`serve`] on `port` (a backend's second target port).
pub fn serve_port(ns: &Netns, name: &'static str, port: u16) -> Servers {
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    let v6 = ns.exec(&["sysctl", "-n", "net.ipv6.bindv6only"]);
    let mut hosts = vec!["0.0.0.0"];
    if String::from_utf8_lossy(&v6.stdout).trim() == "1" {
        hosts.push("::");
    }
    for host in hosts {
        threads.extend(serve_on(ns, name, (host, port), &stop));
    }
    Servers { stop, threads }
}

fn serve_on(ns: &Netns, name: &'static str, at: (&'static str, u16), stop: &Arc<AtomicBool>) -> [JoinHandle<()>; 2] {
    let (s1, s2) = (stop.clone(), stop.clone());
    let tcp = spawn_in(ns, move |ready| {
        let l = match TcpListener::bind(at) {
            Ok(l) => l,
            Err(e) => return ready.send(Err(e.to_string())).unwrap(),
        };
        l.set_nonblocking(true).unwrap();
        ready.send(Ok(())).unwrap();
        while !s1.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((s, _)) => {
                    let stop = s1.clone();
                    std::thread::spawn(move || serve_connection(s, name, stop));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => panic!("accept in {name}: {e}"),
            }
        }
    });
    let udp = spawn_in(ns, move |ready| {
        let s = match UdpSocket::bind(at) {
            Ok(s) => s,
            Err(e) => return ready.send(Err(e.to_string())).unwrap(),
        };
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        ready.send(Ok(())).unwrap();
        let mut buf = [0u8; 64];
        while !s2.load(Ordering::Relaxed) {
            if let Ok((_, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(format!("{name} {}\n", peer.ip()).as_bytes(), peer);
            }
        }
    });
    [tcp, udp]
}

// ----------------------------------------------------------------- clients

/// (backend name, source IP it saw), or why the exchange failed.
pub type Answer = Result<(String, String), ErrorKind>;

pub fn parse(text: &str) -> Answer {
    let mut it = text.split_whitespace();
    match (it.next(), it.next()) {
        (Some(n), Some(s)) => Ok((n.to_string(), s.to_string())),
        _ => Err(ErrorKind::UnexpectedEof),
    }
}

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

/// A TCP connection kept open across exchanges (closed on drop).
pub struct Conn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects from the calling thread's namespace, waiting up to `wait`.
    pub fn open(to: SocketAddr, wait: Duration) -> Result<Conn, ErrorKind> {
        let stream = TcpStream::connect_timeout(&to, wait).map_err(|e| e.kind())?;
        stream.set_read_timeout(Some(TCP_READ_WAIT)).map_err(|e| e.kind())?;
        let reader = BufReader::new(stream.try_clone().map_err(|e| e.kind())?);
        Ok(Conn { stream, reader })
    }

    /// One line out, one line back.
    pub fn exchange(&mut self) -> Answer {
        self.stream.write_all(b"?\n").map_err(|e| e.kind())?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err(ErrorKind::UnexpectedEof),
            Ok(_) => parse(&line),
            Err(e) => Err(e.kind()),
        }
    }
}

/// One exchange on a new TCP connection, closed afterwards.
pub fn tcp_ask(to: SocketAddr, wait: Duration) -> Answer {
    Conn::open(to, wait)?.exchange()
}

/// One datagram out, one back, on a connected UDP socket (its read timeout
/// is the caller's).
pub fn udp_exchange(sock: &UdpSocket) -> Answer {
    sock.send(b"?").map_err(|e| e.kind())?;
    let mut buf = [0u8; 64];
    let n = sock.recv(&mut buf).map_err(|e| e.kind())?;
    parse(&String::from_utf8_lossy(&buf[..n]))
}

/// One UDP exchange from a fresh socket (a new conntrack entry each time).
pub fn udp_ask(to: SocketAddr, wait: Duration) -> Answer {
    let s = UdpSocket::bind(if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
    s.connect(to).map_err(|e| e.kind())?;
    s.set_read_timeout(Some(wait)).unwrap();
    udp_exchange(&s)
}

/// `n` TCP (or UDP) exchanges with `to` from inside `ns`, each on a new
/// connection (or socket).
pub fn ask(ns: &Netns, to: &str, n: usize, udp: bool, wait: Duration) -> Vec<Answer> {
    let to = addr(to);
    ns.run(|| (0..n).map(|_| if udp { udp_ask(to, wait) } else { tcp_ask(to, wait) }).collect())
}

/// TCP and UDP exchanges with one address from a namespace, each on a new
/// connection (socket), one after the other until stopped.
pub struct Probes {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Probe>>,
}

/// When a probe started, and its TCP and UDP answers.
pub type Probe = (Instant, Answer, Answer);

impl Probes {
    /// Starts probing `to` from `ns`; `wait` as in [`tcp_ask`] and [`udp_ask`].
    pub fn start(ns: &Netns, to: &str, wait: Duration) -> Probes {
        let (stop, name, to) = (Arc::new(AtomicBool::new(false)), ns.name.clone(), addr(to));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            super::run_in(&name, || {
                let mut seen = Vec::new();
                while !stopped.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    seen.push((at, tcp_ask(to, wait), udp_ask(to, wait)));
                    std::thread::sleep(Duration::from_millis(10));
                }
                seen
            })
        });
        Probes { stop, thread }
    }

    /// Stops probing; every probe made, in order.
    pub fn stop(self) -> Vec<Probe> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the probing thread")
    }
}

/// The backends that answered; panics on any failed exchange.
pub fn names(answers: &[Answer]) -> BTreeSet<String> {
    answers.iter().map(|a| a.clone().unwrap_or_else(|e| panic!("exchange failed: {e:?} in {answers:?}")).0).collect()
}

pub fn set(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The node namespace's interface addresses as the planners see them: loopback,
/// the client-side and uplink addresses, and one per backend link.
pub fn node_addrs() -> Vec<kube_proxy_rs::plan::context::LocalAddr> {
    [("lo", "127.0.0.1"), ("nc0", NODE_IP), ("up0", "172.31.0.1")]
        .iter()
        .chain(&[("nb1", "10.244.1.1"), ("nb2", "10.244.2.1"), ("nb3", "10.244.3.1")])
        .map(|(i, ip)| kube_proxy_rs::plan::context::LocalAddr { ifname: i.to_string(), ip: ip.parse().unwrap() })
        .collect()
}

/// A Service `default/<name>` with port `http` 80/TCP (and `dns` 80/UDP
/// when `udp`) to target port 8080; `spec` adds or overrides fields.
pub fn service(
    name: &str,
    cluster_ip: &str,
    udp: bool,
    spec: serde_json::Value,
    status: serde_json::Value,
) -> kube_proxy_rs::msgs::SourceEvent {
    let mut ports = vec![serde_json::json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080})];
    if udp {
        ports.push(serde_json::json!({"name": "dns", "protocol": "UDP", "port": 80, "targetPort": 8080}));
    }
    let mut s =
        serde_json::json!({"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "ports": ports});
    for (k, v) in spec.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    kube_proxy_rs::fixtures::applied_service(kube_proxy_rs::fixtures::from_json(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": s, "status": status,
    })))
}

/// The endpoints of `default/<name>`: the named backends, b3 on another node.
pub fn endpoints(name: &str, backends: &[&str]) -> kube_proxy_rs::msgs::SourceEvent {
    let eps: Vec<kube_proxy_rs::fixtures::Ep> = backends
        .iter()
        .map(|b| {
            let n: usize = b[1..].parse().unwrap();
            let node_name = if *b == "b3" { "other-node" } else { "node-a" };
            kube_proxy_rs::fixtures::ep(&format!("10.244.{n}.2"), node_name)
        })
        .collect();
    let ports = [("http", "TCP", i32::from(BACKEND_PORT)), ("dns", "UDP", i32::from(BACKEND_PORT))];
    kube_proxy_rs::fixtures::applied_slice(kube_proxy_rs::fixtures::slice(
        "default",
        &format!("{name}-1"),
        name,
        &ports,
        &eps,
    ))
}
