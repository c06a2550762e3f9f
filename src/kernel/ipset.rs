//! [`IpsetHandle`]: one ipset, programmed with the `ipset` command-line
//! tool as upstream kube-proxy does (`ipset restore`, `ipset save`).
//!
//! - A batch is one `ipset restore -exist`, the ops as `add`/`del` lines on
//!   stdin. `-exist` makes adding a member that is there and deleting one
//!   that is gone succeed.
//! - `ipset restore` stops at the first bad line, names it (`Error in line
//!   N:`) and commits none of the lines before it. That op fails with the
//!   tool's message; the others go again in another restore (they are
//!   idempotent), so one bad entry fails only itself. A failure that names
//!   no line is narrowed down by applying the ops one at a time; one that
//!   hits every line (the set is missing) fails them all at once.
//! - `ensure` creates the set with upstream's parameters; `members` parses
//!   `ipset save NAME` and checks the set's type and family.
//! - Every restore line written is counted ([`IpsetHandle::lines_written`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ipnet::IpNet;
use tracing::{debug, info, warn};

use super::tool::{self, ToolOutput};
use super::{set_diff, Applied, Checked, IpsetKernel, KResult, KernelError, Subsystem};
use crate::msgs::ipset::SetLine;
use crate::msgs::{IpsetOp, SetEntry, SetSpec, SetType};
use crate::net::Protocol;

/// The tool's default name (found on `PATH`).
pub const IPSET: &str = "ipset";

/// One set, through the `ipset` tool. Cheap to clone; clones share the counter.
#[derive(Debug, Clone)]
pub struct IpsetHandle {
    spec: SetSpec,
    binary: Arc<str>,
    lines_written: Arc<AtomicU64>,
}

/// Why a restore failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RestoreFailure {
    /// At one line (0-based among the lines sent).
    Line(usize, String),
    /// The tool failed without naming a line.
    Unplaced(String),
    /// Every line would fail alike: the set is missing.
    All(String),
    /// The tool could not run, or its outcome is unknown (killed).
    Tool(KernelError),
}

impl RestoreFailure {
    /// The failure as `op`'s.
    fn for_op(self, op: String) -> KernelError {
        match self {
            RestoreFailure::Line(_, m) | RestoreFailure::Unplaced(m) | RestoreFailure::All(m) => {
                KernelError::refused(op, m)
            }
            RestoreFailure::Tool(e) => e.for_op(op),
        }
    }
}

impl IpsetHandle {
    /// A handle for `spec`, using `ipset` from `PATH`.
    pub fn new(spec: SetSpec) -> IpsetHandle {
        IpsetHandle { spec, binary: Arc::from(IPSET), lines_written: Arc::default() }
    }

    /// Uses another `ipset` binary (a path, or a name on `PATH`).
    pub fn with_binary(mut self, binary: &str) -> IpsetHandle {
        self.binary = Arc::from(binary);
        self
    }

    /// `add`/`del` lines written to `ipset restore` so far, retries included.
    pub fn lines_written(&self) -> u64 {
        self.lines_written.load(Ordering::Relaxed)
    }

    /// Destroys the set `name` (for `--cleanup`) with `ipset` from `PATH`.
    /// Returns whether it existed; a set that does not exist is not an error.
    pub async fn destroy(name: &str) -> KResult<bool> {
        IpsetHandle::destroy_with(IPSET, name).await
    }

    /// [`IpsetHandle::destroy`] with another `ipset` binary.
    pub async fn destroy_with(binary: &str, name: &str) -> KResult<bool> {
        let op = format!("destroy {name}");
        let out = tool::run(&op, binary, &["destroy", name], None).await?;
        if out.success() {
            return Ok(true);
        }
        if out.stderr.contains("does not exist") {
            return Ok(false);
        }
        Err(KernelError::refused(op, out.message()))
    }

    fn line(&self, op: &IpsetOp) -> String {
        SetLine(&self.spec.name, op).to_string()
    }

    /// Applies `ops` in order, one result each (see the module doc).
    async fn apply_ops(&self, ops: &[IpsetOp]) -> Vec<KResult<()>> {
        let mut results: Vec<KResult<()>> = vec![Ok(()); ops.len()];
        let mut pending: Vec<usize> = (0..ops.len()).collect();
        while !pending.is_empty() {
            match self.restore(pending.iter().map(|&i| &ops[i])).await {
                Ok(()) => pending.clear(),
                Err(RestoreFailure::Line(k, message)) if k < pending.len() => {
                    let i = pending.remove(k);
                    debug!(set = %self.spec.name, op = %self.line(&ops[i]), %message, "ipset op failed; retrying the rest");
                    results[i] = Err(KernelError::refused(self.line(&ops[i]), message));
                }
                Err(RestoreFailure::Unplaced(message)) if pending.len() > 1 => {
                    debug!(set = %self.spec.name, %message, "ipset restore failed without a line; one op at a time");
                    for i in pending.drain(..) {
                        results[i] = self.apply_alone(&ops[i]).await;
                    }
                }
                Err(failure) => {
                    for i in pending.drain(..) {
                        results[i] = Err(failure.clone().for_op(self.line(&ops[i])));
                    }
                }
            }
        }
        results
    }

    /// One op in a restore of its own.
    async fn apply_alone(&self, op: &IpsetOp) -> KResult<()> {
        self.restore(std::iter::once(op)).await.map_err(|f| f.for_op(self.line(op)))
    }

    /// One `ipset restore -exist` with `ops` on stdin.
    async fn restore<'a>(&self, ops: impl Iterator<Item = &'a IpsetOp>) -> Result<(), RestoreFailure> {
        let mut input = String::new();
        let mut count = 0u64;
        for op in ops {
            input.push_str(&self.line(op));
            input.push('\n');
            count += 1;
        }
        self.lines_written.fetch_add(count, Ordering::Relaxed);
        let op = format!("ipset restore ({count} lines for {})", self.spec.name);
        let out = tool::run(&op, &self.binary, &["restore", "-exist"], Some(input.as_bytes()))
            .await
            .map_err(RestoreFailure::Tool)?;
        if out.success() {
            return Ok(());
        }
        Err(restore_failure(&out))
    }

    async fn ensure_set(&self) -> KResult<()> {
        let create = self.spec.create_line();
        let mut args: Vec<&str> = create.split_whitespace().collect();
        args.push("-exist");
        let out = tool::run(&create, &self.binary, &args, None).await?;
        if out.success() {
            return Ok(());
        }
        if !out.stderr.contains("already exists") {
            return Err(KernelError::refused(create, out.message()));
        }
        // Same name, other type or parameters: say which.
        let have = self.save().await?;
        let have_create = have.lines().find(|l| l.starts_with("create ")).unwrap_or("").trim();
        match header_mismatch(&self.spec, have_create) {
            Some(why) => Err(KernelError::refused(create, why)),
            None => {
                warn!(set = %self.spec.name, have = have_create, want = %create, "ipset exists with other parameters; using it");
                Ok(())
            }
        }
    }

    /// `ipset save NAME`.
    async fn save(&self) -> KResult<String> {
        let op = format!("save {}", self.spec.name);
        let out = tool::run(&op, &self.binary, &["save", &self.spec.name], None).await?;
        if !out.success() {
            return Err(KernelError::refused(op, out.message()));
        }
        Ok(out.stdout)
    }

    async fn read_members(&self) -> KResult<BTreeSet<SetEntry>> {
        let text = self.save().await?;
        parse_save(&self.spec, &text).map_err(|m| KernelError::refused(format!("save {}", self.spec.name), m))
    }

    /// `ipset list -t NAME`'s "Number of entries" (the header only, no
    /// members); None when the set is missing or the count unreadable.
    async fn entry_count(&self) -> Option<usize> {
        let op = format!("list -t {}", self.spec.name);
        let out = tool::run(&op, &self.binary, &["list", "-t", &self.spec.name], None).await.ok()?;
        if !out.success() {
            return None;
        }
        entry_count(&out.stdout)
    }

    /// The syncPeriod's check: the member count from the set's header; a
    /// reconcile (`ipset save`) only when it differs or the set is gone.
    async fn verify_ops(&self, desired: Vec<IpsetOp>) -> KResult<Checked<IpsetOp>> {
        let want: BTreeSet<SetEntry> =
            desired.iter().filter_map(|op| if let IpsetOp::Add(e) = op { Some(canonical(*e)) } else { None }).collect();
        if self.entry_count().await == Some(want.len()) {
            return Ok(Checked { applied: Vec::new(), results: Vec::new(), drift: false });
        }
        let (applied, results) = self.reconcile_ops(desired).await?;
        Ok(Checked { applied, results, drift: false })
    }

    async fn reconcile_ops(&self, desired: Vec<IpsetOp>) -> Applied<IpsetOp> {
        self.ensure_set().await?;
        let have = self.read_members().await?;
        let want: BTreeSet<SetEntry> =
            desired.iter().filter_map(|op| if let IpsetOp::Add(e) = op { Some(canonical(*e)) } else { None }).collect();
        // Deletes first, to make room (upstream and cilium do the same).
        let mut ops = set_diff(&want, &have, IpsetOp::Add, IpsetOp::Del);
        ops.sort_by_key(|op| matches!(op, IpsetOp::Add(_)));
        if !ops.is_empty() {
            info!(set = %self.spec.name, ops = ops.len(), "ipset drift repaired");
        }
        let results = self.apply_ops(&ops).await;
        Ok((ops, results))
    }
}

impl Subsystem for IpsetHandle {
    type Op = IpsetOp;

    fn apply(&self, ops: Vec<IpsetOp>) -> impl Future<Output = Vec<KResult<()>>> + 'static {
        let me = self.clone();
        async move { me.apply_ops(&ops).await }
    }

    fn reconcile(&self, desired: Vec<IpsetOp>) -> impl Future<Output = Applied<IpsetOp>> + 'static {
        let me = self.clone();
        async move { me.reconcile_ops(desired).await }
    }

    fn verify(&self, desired: Vec<IpsetOp>) -> impl Future<Output = KResult<Checked<IpsetOp>>> + 'static {
        let me = self.clone();
        async move { me.verify_ops(desired).await }
    }
}

/// "Number of entries: N" from `ipset list -t`.
fn entry_count(header: &str) -> Option<usize> {
    header.lines().find_map(|l| l.strip_prefix("Number of entries:")).and_then(|n| n.trim().parse().ok())
}

impl IpsetKernel for IpsetHandle {
    fn spec(&self) -> &SetSpec {
        &self.spec
    }

    fn ensure(&self) -> impl Future<Output = KResult<()>> + 'static {
        let me = self.clone();
        async move { me.ensure_set().await }
    }

    fn members(&self) -> impl Future<Output = KResult<BTreeSet<SetEntry>>> + 'static {
        let me = self.clone();
        async move { me.read_members().await }
    }
}

/// Reads which line failed from `ipset restore`'s stderr.
fn restore_failure(out: &ToolOutput) -> RestoreFailure {
    let message = out.message();
    // Every line names this handle's set: if it is missing, all fail alike.
    if message.contains("set with the given name does not exist") {
        return RestoreFailure::All(message);
    }
    match failed_line(&out.stderr) {
        Some((n, text)) if n >= 1 => RestoreFailure::Line(n - 1, text),
        _ => RestoreFailure::Unplaced(message),
    }
}

/// `ipset v7.17: Error in line 3: Syntax error: ...` → (3, "Syntax error: ...").
fn failed_line(stderr: &str) -> Option<(usize, String)> {
    let rest = stderr.split("Error in line ").nth(1)?;
    let (num, msg) = rest.split_once(':')?;
    let n = num.trim().parse().ok()?;
    let msg: Vec<&str> = msg.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    Some((n, msg.join("; ")))
}

/// Why an existing set (its `create` line from `ipset save`) can't serve
/// `spec`: another type or family. None if it can.
fn header_mismatch(spec: &SetSpec, have_create: &str) -> Option<String> {
    let words: Vec<&str> = have_create.split_whitespace().collect();
    let have_type = words.get(2).copied().unwrap_or("(unknown)");
    let want_type = spec.set_type.as_str();
    if have_type != want_type {
        return Some(format!("set {} exists with type {have_type}, want {want_type}", spec.name));
    }
    if spec.set_type == SetType::BitmapPort {
        return None;
    }
    let have_family = words.windows(2).find(|w| w[0] == "family").map_or("inet", |w| w[1]);
    let want_family = spec.family.ipset_family();
    (have_family != want_family)
        .then(|| format!("set {} exists with family {have_family}, want {want_family}", spec.name))
}

/// Parses `ipset save NAME`: checks the `create` line against `spec` and
/// returns the members. A member we cannot represent is skipped with a warning.
fn parse_save(spec: &SetSpec, text: &str) -> Result<BTreeSet<SetEntry>, String> {
    let mut members = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("create"), Some(name), _) if name == spec.name => {
                if let Some(why) = header_mismatch(spec, line) {
                    return Err(why);
                }
            }
            (Some("add"), Some(name), Some(entry)) if name == spec.name => match parse_entry(spec.set_type, entry) {
                Some(e) => {
                    members.insert(e);
                }
                None => warn!(set = %spec.name, entry, "ipset member not understood; left alone"),
            },
            _ => {}
        }
    }
    Ok(members)
}

/// Parses a member as `ipset save` prints it, for a set of type `t`.
pub fn parse_entry(t: SetType, s: &str) -> Option<SetEntry> {
    let parts: Vec<&str> = s.split(',').collect();
    match (t, parts.as_slice()) {
        (SetType::HashIp, [ip]) => Some(SetEntry::Ip(ip.parse().ok()?)),
        (SetType::BitmapPort, [port]) => Some(SetEntry::Port(port.parse().ok()?)),
        (SetType::HashIpPort, [ip, pp]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPort(ip.parse().ok()?, proto, port))
        }
        (SetType::HashIpPortIp, [ip, pp, ip2]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPortIp(ip.parse().ok()?, proto, port, ip2.parse().ok()?))
        }
        (SetType::HashIpPortNet, [ip, pp, net]) => {
            let (proto, port) = proto_port(pp)?;
            Some(SetEntry::IpPortNet(ip.parse().ok()?, proto, port, parse_net(net)?))
        }
        _ => None,
    }
}

/// `tcp:80` → (Tcp, 80).
fn proto_port(s: &str) -> Option<(Protocol, u16)> {
    let (proto, port) = s.split_once(':')?;
    let proto = Protocol::ALL.into_iter().find(|p| p.lower() == proto)?;
    Some((proto, port.parse().ok()?))
}

/// A net as ipset prints it: a host net (/32, /128) is printed bare.
fn parse_net(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        return s.parse().ok();
    }
    let ip: IpAddr = s.parse().ok()?;
    Some(IpNet::from(ip))
}

/// The member as the kernel stores it: a net's host bits are cleared.
fn canonical(e: SetEntry) -> SetEntry {
    match e {
        SetEntry::IpPortNet(ip, p, port, net) => SetEntry::IpPortNet(ip, p, port, net.trunc()),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::IpFamily;

    fn spec(set_type: SetType, family: IpFamily) -> SetSpec {
        SetSpec { name: "KUBE-TEST".into(), set_type, family, comment: "" }
    }

    #[test]
    fn reads_the_entry_count_from_a_terse_listing() {
        let header = "Name: KUBE-CLUSTER-IP\nType: hash:ip,port\nRevision: 6\nHeader: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\nSize in memory: 1240\nReferences: 2\nNumber of entries: 17\n";
        assert_eq!(entry_count(header), Some(17));
        assert_eq!(entry_count("Name: X\n"), None);
    }

    #[test]
    fn parses_members_of_every_type_and_protocol() {
        let cases = [
            (SetType::HashIp, "10.96.0.10", "10.96.0.10"),
            (SetType::HashIp, "fd00::a", "fd00::a"),
            (SetType::HashIpPort, "10.96.0.10,udp:53", "10.96.0.10,udp:53"),
            (SetType::HashIpPort, "10.96.0.10,sctp:9", "10.96.0.10,sctp:9"),
            (SetType::HashIpPort, "fd00::1,tcp:80", "fd00::1,tcp:80"),
            (SetType::HashIpPortIp, "10.244.0.7,tcp:8080,10.244.0.7", "10.244.0.7,tcp:8080,10.244.0.7"),
            (SetType::HashIpPortNet, "1.2.3.4,tcp:443,10.0.0.0/8", "1.2.3.4,tcp:443,10.0.0.0/8"),
            (SetType::HashIpPortNet, "1.2.3.4,tcp:443,10.1.2.3", "1.2.3.4,tcp:443,10.1.2.3/32"),
            (SetType::HashIpPortNet, "fd00::1,udp:53,fd00::9", "fd00::1,udp:53,fd00::9/128"),
            (SetType::BitmapPort, "30080", "30080"),
        ];
        for (t, text, shown) in cases {
            let e = parse_entry(t, text).unwrap_or_else(|| panic!("{t:?} {text}"));
            assert_eq!(e.to_string(), shown);
            assert_eq!(e.set_type(), t);
        }
    }

    #[test]
    fn rejects_members_we_cannot_represent() {
        for (t, text) in [
            (SetType::HashIpPort, "10.0.0.1,icmp:ping"),
            (SetType::HashIpPort, "10.0.0.1,47:0"),
            (SetType::HashIpPort, "10.0.0.1"),
            (SetType::BitmapPort, "tcp:80"),
            (SetType::HashIp, "10.0.0.1,tcp:80"),
        ] {
            assert_eq!(parse_entry(t, text), None, "{text}");
        }
    }

    #[test]
    fn parses_ipset_save_and_checks_the_header() {
        let text = "create KUBE-TEST hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x1\n\
                    add KUBE-TEST 10.0.0.1,tcp:80\nadd KUBE-TEST 10.0.0.1,icmp:ping\nadd KUBE-TEST 10.0.0.1,udp:53\n";
        let got = parse_save(&spec(SetType::HashIpPort, IpFamily::V4), text).expect("parses");
        let shown: Vec<String> = got.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["10.0.0.1,tcp:80", "10.0.0.1,udp:53"]);
        let err = parse_save(&spec(SetType::HashIpPort, IpFamily::V6), text).expect_err("family differs");
        assert_eq!(err, "set KUBE-TEST exists with family inet, want inet6");
        let err = parse_save(&spec(SetType::HashIp, IpFamily::V4), text).expect_err("type differs");
        assert_eq!(err, "set KUBE-TEST exists with type hash:ip,port, want hash:ip");
        let bitmap = "create KUBE-TEST bitmap:port range 0-65535\nadd KUBE-TEST 30080\n";
        assert_eq!(parse_save(&spec(SetType::BitmapPort, IpFamily::V6), bitmap).map(|s| s.len()), Ok(1));
    }

    #[test]
    fn finds_the_failed_line_in_ipsets_message() {
        let stderr =
            "ipset v7.17: Error in line 3: Syntax error: cannot parse bogus: resolving to IPv4 address failed\n";
        assert_eq!(
            failed_line(stderr),
            Some((3, "Syntax error: cannot parse bogus: resolving to IPv4 address failed".to_string()))
        );
        assert_eq!(failed_line("ipset v7.17: Syntax error: '70000' is out of range 0-65535"), None);
    }

    /// A stand-in for the `ipset` tool: a restore fails at the first line
    /// naming an address ending in `.66`, and says which line or not.
    fn fake_ipset(dir: &std::path::Path, name_line: bool) -> String {
        let path = dir.join("ipset");
        let report = if name_line { "Error in line $n: Syntax error: $l" } else { "Syntax error: $l" };
        let script = format!(
            "#!/bin/sh\nn=0\nwhile read -r l; do n=$((n+1)); case \"$l\" in *.66) echo \"ipset v7: {report}\" >&2; exit 1;; esac; done\n"
        );
        std::fs::write(&path, script).expect("write fake ipset");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        // A process forked meanwhile by another test may briefly hold the
        // file open for writing (ETXTBSY): wait until it runs.
        for _ in 0..100 {
            match std::process::Command::new(&path).stdin(std::process::Stdio::null()).status() {
                Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(std::time::Duration::from_millis(10)),
                _ => break,
            }
        }
        path.display().to_string()
    }

    fn adds(addrs: &[&str]) -> Vec<IpsetOp> {
        addrs.iter().map(|a| IpsetOp::Add(SetEntry::Ip(a.parse().expect("ip")))).collect()
    }

    fn failed(results: &[KResult<()>]) -> Vec<usize> {
        results.iter().enumerate().filter(|(_, r)| r.is_err()).map(|(i, _)| i).collect()
    }

    #[tokio::test]
    async fn a_failure_at_a_named_line_fails_that_op_and_retries_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = IpsetHandle::new(spec(SetType::HashIp, IpFamily::V4)).with_binary(&fake_ipset(dir.path(), true));
        let results = h.apply_ops(&adds(&["10.0.0.1", "10.0.0.66", "10.0.0.3", "10.1.0.66"])).await;
        assert_eq!(failed(&results), [1, 3]);
        let err = results[1].as_ref().expect_err("bad");
        assert_eq!(err.op(), "add KUBE-TEST 10.0.0.66");
        assert_eq!(err.cause().to_string(), "Syntax error: add KUBE-TEST 10.0.0.66");
        // 4 lines, then 3, then 2.
        assert_eq!(h.lines_written(), 9);
    }

    #[tokio::test]
    async fn a_failure_without_a_line_falls_back_to_one_op_at_a_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = IpsetHandle::new(spec(SetType::HashIp, IpFamily::V4)).with_binary(&fake_ipset(dir.path(), false));
        let results = h.apply_ops(&adds(&["10.0.0.1", "10.0.0.2", "10.0.0.66", "10.0.0.4"])).await;
        assert_eq!(failed(&results), [2]);
        let err = results[2].as_ref().expect_err("bad");
        assert_eq!(err.cause().to_string(), "ipset v7: Syntax error: add KUBE-TEST 10.0.0.66");
        // 4 lines, then each alone.
        assert_eq!(h.lines_written(), 8);
        assert!(h.apply_ops(&[]).await.is_empty());
        assert_eq!(h.lines_written(), 8, "nothing to do, no restore");
    }

    #[test]
    fn host_bits_of_nets_are_cleared_as_the_kernel_does() {
        let e = SetEntry::IpPortNet("1.2.3.4".parse().unwrap(), Protocol::Tcp, 80, "10.1.2.3/24".parse().unwrap());
        assert_eq!(canonical(e).to_string(), "1.2.3.4,tcp:80,10.1.2.0/24");
    }
}
