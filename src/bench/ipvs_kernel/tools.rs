//! The tools' side: the same cold state written with ipvsadm, ipset, ip
//! and iptables-restore, timed, and the kernel state read back to compare.

use super::*;

/// The tools' input files for one size.
pub(super) struct ToolFiles {
    pub(super) ipvs: PathBuf,
    pub(super) ipset: PathBuf,
    pub(super) ip: PathBuf,
    pub(super) iptables: PathBuf,
    pub(super) lines: BTreeMap<PathBuf, usize>,
}

impl ToolFiles {
    pub(super) fn lines(&self, file: &Path) -> usize {
        self.lines.get(file).copied().unwrap_or(0)
    }
}

/// Plans the cluster's cold state as the coordinator's first sync does:
/// the desired state, the iptables rules, and how long planning took
/// (generating the events not included).
pub(super) fn plan_cold(spec: ClusterSpec, random_fully: bool) -> anyhow::Result<(IpvsDesired, String, Duration)> {
    let events = Cluster::new(spec)?.initial_events();
    let t = Instant::now();
    let mut model = Model::new(FAMILY, THIS_NODE);
    for ev in &events {
        model.record(ev)?;
    }
    let changes = model.apply();
    let mut planner = IpvsPlanner::new(plan_context(&plan_settings(), model.node(), &local_addrs()));
    planner.update(&model, &changes.ports);
    let desired = planner.desired();
    let rules = planner.rules(&rules_config(random_fully));
    let took = t.elapsed();
    Ok((desired, rules, took))
}

/// The cold state through each real handle alone, one after the other, as
/// its actor applies a full batch (`reconcile`): where our cold time goes,
/// without the actors running concurrently on one thread.
pub(super) fn handles_one_at_a_time(
    n: usize,
    desired: &IpvsDesired,
    rules: &str,
    f: &mut Figures,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let ipvs = NetlinkIpvs::connect().await.map_err(not_available)?;
        let graceful = GracefulIpvs::new(ipvs.clone(), Ownership { family: FAMILY, exclude: Vec::new() });
        let t = Instant::now();
        let (ops, results) = graceful.reconcile(desired.ipvs.clone()).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "IPVS handle alone: failed ops");
        let what = format!("handle alone: IPVS, {} ops in {} datagrams", ops.len(), ipvs.datagrams_sent());
        f.add(n, &what, ms(took), "ms");

        let mut sets = Duration::ZERO;
        let mut slowest = (Duration::ZERO, String::new());
        let ipset = NetlinkIpset::new().context("ipset netlink")?;
        for set in IpvsSet::ALL {
            let handle = IpsetHandle::new(&ipset, set.spec(FAMILY));
            let adds: Vec<IpsetOp> = desired.sets.get(&set).into_iter().flatten().map(|e| IpsetOp::Add(*e)).collect();
            let t = Instant::now();
            let (_, results) = handle.reconcile(adds).await?;
            let took = t.elapsed();
            ensure!(results.iter().all(Result::is_ok), "ipset handle alone {}: failed ops", set.name(FAMILY));
            sets += took;
            if took > slowest.0 {
                slowest = (took, set.name(FAMILY));
            }
        }
        f.add(n, "handle alone: the 17 ipset handles, one after the other", ms(sets), "ms");
        f.add(n, &format!("handle alone: slowest ipset handle ({})", slowest.1), ms(slowest.0), "ms");

        let link = DummyLink::new().context("rtnetlink")?.with_family(FAMILY);
        let binds: Vec<LinkOp> = desired.addresses.iter().map(|a| LinkOp::Bind(*a)).collect();
        let t = Instant::now();
        let (_, results) = link.reconcile(binds).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "link handle alone: failed ops");
        f.add(n, &format!("handle alone: kube-ipvs0, {} requests", link.requests()), ms(took), "ms");

        let iptables = IptablesHandle::new(FAMILY);
        let t = Instant::now();
        let (_, results) = iptables.reconcile(vec![IptablesOp::Restore(RestoreInput::new(rules.to_string()))]).await?;
        let took = t.elapsed();
        ensure!(results.iter().all(Result::is_ok), "iptables handle alone: failed");
        f.add(n, "handle alone: iptables (2 iptables-save, 1 iptables-restore)", ms(took), "ms");
        anyhow::Ok(())
    })
}

/// Writes the cold state in each tool's input syntax.
pub(super) fn write_tool_files(desired: &IpvsDesired, rules: &str, dir: &Path) -> anyhow::Result<ToolFiles> {
    let texts = [
        ("ipvs.rules", ipvsadm_restore(desired)),
        ("ipset.restore", ipset_restore(desired)),
        ("ip.batch", ip_batch(desired)),
        ("iptables.restore", iptables_restore(rules)),
    ];
    let mut lines = BTreeMap::new();
    let mut paths = Vec::new();
    for (name, text) in texts {
        let path = dir.join(name);
        std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
        lines.insert(path.clone(), text.lines().count());
        paths.push(path);
    }
    let [ipvs, ipset, ip, iptables]: [PathBuf; 4] = paths.try_into().map_err(|_| anyhow::anyhow!("four files"))?;
    Ok(ToolFiles { ipvs, ipset, ip, iptables, lines })
}

/// `ipvsadm -R` input: the `--dry-run` section, `-A` lines before `-a` lines.
pub fn ipvsadm_restore(desired: &IpvsDesired) -> String {
    render::ipvs_lines(desired).into_iter().map(|l| l + "\n").collect()
}

/// `ipset restore` input: the `--dry-run` section, each set's create line before its members.
pub fn ipset_restore(desired: &IpvsDesired) -> String {
    render::ipset_lines(desired, FAMILY).into_iter().map(|l| l + "\n").collect()
}

/// `ip -batch` input: the dummy link, then one `addr add` per service address.
pub fn ip_batch(desired: &IpvsDesired) -> String {
    let mut out = format!("link add {DUMMY_LINK} type dummy\n");
    for a in &desired.addresses {
        let prefix = if a.is_ipv4() { 32 } else { 128 };
        let _ = writeln!(out, "addr add {a}/{prefix} dev {DUMMY_LINK}");
    }
    out
}

/// `iptables-restore --noflush` input: what the iptables handle restores on
/// a fresh node (the rendered rules plus the jumps from the built-in chains).
pub fn iptables_restore(rules: &str) -> String {
    restore_input_on_empty_kernel(&ipvs_rules::PROFILE, rules)
}

/// Runs `tool args < file`; its time, or why it failed.
pub(super) fn run_tool(tool: &str, args: &[&str], file: &Path) -> anyhow::Result<Duration> {
    let input = std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let t = Instant::now();
    let out = Command::new(tool)
        .args(args)
        .stdin(Stdio::from(input))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {tool}"))?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("{tool} {} < {} failed ({}): {}", args.join(" "), file.display(), out.status, stderr_tail(&out.stderr));
    }
    Ok(took)
}

pub(super) fn stderr_tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("; ")
}

// ------------------------------------------------------------ kernel state --

/// A sorted list of lines, as a count and a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Digest {
    pub(super) lines: usize,
    pub(super) hash: u64,
}

pub(super) fn digest(mut lines: Vec<String>) -> Digest {
    lines.sort();
    let mut h = DefaultHasher::new();
    lines.hash(&mut h);
    Digest { lines: lines.len(), hash: h.finish() }
}

/// What IPVS mode programmed, read back with the tools (normalised: sorted;
/// no counters; ipset create lines without their random initval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct KernelState {
    pub(super) ipvs: Digest,
    pub(super) ipset: Digest,
    pub(super) addresses: Digest,
    pub(super) iptables: Digest,
}

pub(super) fn stdout_of(tool: &str, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = Command::new(tool).args(args).stdin(Stdio::null()).output().with_context(|| format!("running {tool}"))?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

impl KernelState {
    pub(super) fn read() -> anyhow::Result<KernelState> {
        let (ok, text) = stdout_of("ipvsadm", &["-S", "-n"])?;
        ensure!(ok, "ipvsadm -S -n failed");
        let ipvs = digest(text.lines().filter(|l| !l.is_empty()).map(str::to_string).collect());
        let (ok, text) = stdout_of("ipset", &["save"])?;
        ensure!(ok, "ipset save failed");
        let ipset = digest(
            text.lines()
                .filter(|l| l.split_whitespace().nth(1).is_some_and(|s| s.starts_with("KUBE-")))
                .map(|l| {
                    if l.starts_with("create ") {
                        l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
                    } else {
                        l.to_string()
                    }
                })
                .collect(),
        );
        // No link: no addresses.
        let (_, text) = stdout_of("ip", &["-o", "addr", "show", "dev", DUMMY_LINK])?;
        let addresses = digest(text.lines().filter_map(|l| l.split_whitespace().nth(3)).map(str::to_string).collect());
        let (ok, text) = stdout_of("iptables-save", &[])?;
        ensure!(ok, "iptables-save failed");
        let mut table = String::new();
        let mut lines = Vec::new();
        for l in text.lines() {
            if let Some(t) = l.strip_prefix('*') {
                table = t.to_string();
            } else if let Some(c) = l.strip_prefix(':') {
                lines.push(format!("{table} :{}", c.split_whitespace().next().unwrap_or("")));
            } else if l.starts_with("-A") {
                lines.push(format!("{table} {l}"));
            }
        }
        let iptables = digest(lines);
        Ok(KernelState { ipvs, ipset, addresses, iptables })
    }

    pub(super) fn compare(&self, other: &KernelState) -> [(&'static str, Digest, Digest); 4] {
        [
            ("ipvsadm -S -n", self.ipvs, other.ipvs),
            ("ipset save (our sets)", self.ipset, other.ipset),
            ("kube-ipvs0 addresses", self.addresses, other.addresses),
            ("iptables-save (rules and chains)", self.iptables, other.iptables),
        ]
    }
}
