//! Each size's daemon in a network namespace of its own, on a thread that
//! entered it, and the guest's CPU readings around it.

use super::*;

pub(super) type Reply = anyhow::Result<(Duration, SyncRecord, Counters)>;

/// One change for a [`NetnsDaemon`], and where its result goes.
pub(super) struct Request {
    pub(super) events: Vec<SourceEvent>,
    pub(super) reply: std::sync::mpsc::Sender<Reply>,
}

/// A daemon in a network namespace of its own (`ip netns add`), on a
/// thread of its own that entered it: its netlink sockets and the tools it
/// runs (ipset, iptables-restore) act on that namespace only.
pub(super) struct NetnsDaemon {
    pub(super) name: String,
    pub(super) tx: Option<tokio::sync::mpsc::UnboundedSender<Request>>,
    pub(super) thread: Option<std::thread::JoinHandle<()>>,
}

impl NetnsDaemon {
    /// Creates the namespace, starts the daemon in it and runs its cold
    /// sync; returns the cold sync's time (events sent → every actor acked).
    pub(super) fn start(
        name: &str,
        events: Vec<SourceEvent>,
        random_fully: bool,
    ) -> anyhow::Result<(NetnsDaemon, Duration)> {
        let path = netns_add(name)?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Request>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<Duration>>();
        let thread = std::thread::spawn(move || {
            if let Err(e) = enter_netns(&path) {
                let _ = ready_tx.send(Err(e));
                return;
            }
            let sys = actix_rt::System::new();
            sys.block_on(async move {
                let d = match start_daemon(random_fully).await {
                    Ok(d) => d,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let t = Instant::now();
                let cold = match d.send_and_wait(events, Duration::from_secs(3600)).await {
                    Ok(rec) if rec.failed == 0 => Ok(t.elapsed()),
                    Ok(rec) => Err(anyhow::anyhow!("the cold sync failed {} ops", rec.failed)),
                    Err(e) => Err(e),
                };
                let failed = cold.is_err();
                let _ = ready_tx.send(cold);
                if failed {
                    return;
                }
                while let Some(req) = rx.recv().await {
                    let (c0, t) = (d.handles.counters(), Instant::now());
                    let res = d.send_and_wait(req.events, Duration::from_secs(120)).await;
                    let res = res.map(|rec| (t.elapsed(), rec, d.handles.counters().since(c0)));
                    let _ = req.reply.send(res);
                }
            });
        });
        // Dropped on error: stops the thread, deletes the namespace.
        let d = NetnsDaemon { name: name.to_string(), tx: Some(tx), thread: Some(thread) };
        let cold = ready_rx.recv().map_err(|_| anyhow::anyhow!("the daemon in {name} stopped"))??;
        Ok((d, cold))
    }

    /// Sends one change; its time (event → every actor acked) and sync record.
    pub(super) fn change(&self, events: Vec<SourceEvent>) -> Reply {
        let (reply, rx) = std::sync::mpsc::channel();
        let tx = self.tx.as_ref().ok_or_else(|| anyhow::anyhow!("stopped"))?;
        tx.send(Request { events, reply }).map_err(|_| anyhow::anyhow!("the daemon in {} stopped", self.name))?;
        rx.recv().map_err(|_| anyhow::anyhow!("the daemon in {} stopped", self.name))?
    }
}

impl Drop for NetnsDaemon {
    /// Stops the daemon (its actors and sockets go with its system) and
    /// deletes the namespace with everything in it.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        netns_del(&self.name);
    }
}

/// Creates network namespace `name` (deleting a leftover one first) with
/// lo up, as on a node: without a local routing table IPVS refuses real
/// servers (EINVAL) until some address exists. Returns its path.
pub(super) fn netns_add(name: &str) -> anyhow::Result<PathBuf> {
    netns_del(name);
    let (ok, _) = stdout_of("ip", &["netns", "add", name])?;
    ensure!(ok, "ip netns add {name} failed");
    let (ok, _) = stdout_of("ip", &["-n", name, "link", "set", "lo", "up"])?;
    ensure!(ok, "ip -n {name} link set lo up failed");
    Ok(PathBuf::from("/run/netns").join(name))
}

pub(super) fn netns_del(name: &str) {
    let _ = Command::new("ip").args(["netns", "del", name]).stderr(Stdio::null()).status();
}

/// Moves the calling thread into the namespace at `path` (sockets it opens
/// and processes it starts from then on live there) and sets upstream's
/// sysctls in it, as the daemon does at start.
pub(super) fn enter_netns(path: &Path) -> anyhow::Result<()> {
    let fd = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering {}", path.display()))?;
    set_sysctls();
    Ok(())
}

/// Runs `f` on a thread inside a fresh network namespace `name`, then
/// deletes the namespace and waits for the kernel to finish tearing it
/// down. Each phase gets a kernel of its own: IPVS keeps a deleted real
/// server on a trash list for minutes and every add walks that list, so a
/// flushed table would slow whatever runs next.
pub(super) fn in_netns<T: Send>(name: &str, f: impl FnOnce() -> anyhow::Result<T> + Send) -> anyhow::Result<T> {
    let path = netns_add(name)?;
    let res = std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(&path)?;
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread in netns {name} panicked"))?
    });
    netns_del(name);
    if res.is_ok() {
        wait_quiet();
    }
    res
}

/// (idle, total) jiffies summed over the CPUs, and the CPU count (/proc/stat).
pub(super) fn cpu_jiffies() -> Option<(u64, u64, usize)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let first = text.lines().next()?;
    let v: Vec<u64> = first.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal
    let total = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    let cpus = text.lines().filter(|l| l.starts_with("cpu") && !l.starts_with("cpu ")).count().max(1);
    Some((idle, total, cpus))
}

/// The guest's busy time between two readings, in % of one CPU.
pub(super) fn busy_between(a: (u64, u64, usize), b: (u64, u64, usize)) -> f64 {
    let total = b.1.saturating_sub(a.1) as f64;
    if total <= 0.0 {
        return 0.0;
    }
    let busy = total - b.0.saturating_sub(a.0) as f64;
    (busy / (total / a.2 as f64) * 1000.0).round() / 10.0
}

/// The guest's busy time over `window` (the caller idle meanwhile).
pub(super) async fn busy_percent(window: Duration) -> f64 {
    let a = cpu_jiffies();
    tokio::time::sleep(window).await;
    match (a, cpu_jiffies()) {
        (Some(a), Some(b)) => busy_between(a, b),
        _ => f64::NAN,
    }
}

/// Waits (at most 5 minutes) until the guest was nearly idle for a second.
pub(super) fn wait_quiet() {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(300) {
        let a = cpu_jiffies();
        std::thread::sleep(Duration::from_secs(1));
        match (a, cpu_jiffies()) {
            (Some(a), Some(b)) if busy_between(a, b) > 10.0 => continue,
            _ => break,
        }
    }
    if t.elapsed() > Duration::from_secs(2) {
        eprintln!("kpr-bench ipvs: waited {:.0}s for the kernel to tear the namespace down", t.elapsed().as_secs_f64());
    }
}
