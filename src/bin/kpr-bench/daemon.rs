//! IPVS mode's actors and coordinator on in-memory kernels, for
//! `kpr-bench actors`, `rss` and `churn`.

use super::*;

/// The actors of IPVS mode on in-memory kernels, and the coordinator.
pub(super) struct Daemon {
    pub(super) coord: Addr<Coordinator>,
    pub(super) journal: Journal,
}

pub(super) fn start_daemon(max_sync: Duration) -> Daemon {
    let journal = Journal::default();
    let kernels = IpvsKernels::in_memory(&journal, IpFamily::V4);
    let settings = Settings {
        plan: plan_settings(),
        min_sync: Duration::ZERO,
        max_sync,
        burst: 2,
        model_gates: Default::default(),
    };
    let addrs: AddrSource = Box::new(local_addrs);
    let cfg = rules_config(true);
    // The daemon's renderer (src/proxier/ipvs.rs), with a fixed config.
    let rules: RulesRenderer = Box::new(move |p: &IpvsPlanner, _: &NodeInfo| p.rules(&cfg));
    let coord = Coordinator::create(|ctx| {
        let targets = start_ipvs_actors(kernels, &StatsRegistry::default(), ctx.address().recipient());
        Coordinator::new(settings, targets, addrs, rules)
    });
    Daemon { coord, journal }
}

impl Daemon {
    pub(super) async fn history(&self) -> Vec<SyncRecord> {
        self.coord.send(GetSyncHistory).await.unwrap_or_default()
    }

    pub(super) async fn last_generation(&self) -> u64 {
        self.history().await.last().map_or(0, |s| s.generation)
    }

    /// Sends a batch and waits until a sync that started after it finished
    /// (every actor acked); returns that sync's record.
    pub(super) async fn send_and_wait(&self, events: Vec<SourceEvent>) -> anyhow::Result<SyncRecord> {
        let before = self.last_generation().await;
        self.coord.send(SourceBatch(events)).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(rec) = self.history().await.into_iter().rev().find(|s| s.generation > before) {
                return Ok(rec);
            }
            anyhow::ensure!(Instant::now() < deadline, "no sync within 60s");
            tokio::task::yield_now().await;
        }
    }
}
