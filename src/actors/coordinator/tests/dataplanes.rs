//! The coordinator over dataplanes that record what they are called with:
//! a kernel read before a sync is planned, ServiceCIDR changes.

use super::*;

/// A dataplane that reads the kernel before it plans (as nftables mode lists
/// its table before a full sync), on a 10 ms read: records what it is called with.
struct Reading {
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Dataplane for Reading {
    type Outcome = ();
    type Config = ();

    fn prepare(&mut self, kind: SyncKind) -> Option<Prepare<Self>> {
        self.log.lock().unwrap().push(format!("prepare {kind:?}"));
        let read = async {
            sleep(10 * MS).await;
            Box::new(|d: &mut Reading| d.log.lock().unwrap().push("read".into())) as Box<dyn FnOnce(&mut Reading)>
        };
        Some(Box::pin(read))
    }

    fn sync(&mut self, _: &Model, changes: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<()> {
        self.log.lock().unwrap().push(format!("sync {generation} {kind:?} ports={}", changes.ports.len()));
        Planned { full: kind == SyncKind::Full, ops: 0, run: Box::pin(async {}) }
    }

    fn finished(&mut self, _: ()) -> Finished {
        Finished::default()
    }

    fn reconfigure(&mut self, _: ()) {}
}

#[test]
fn a_sync_is_planned_after_its_kernel_read_and_events_during_the_read_join_the_next() {
    run_paused(|| async {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let coord = started_with_web(Reading { log: log.clone() }).await;
        // Mid-read: a second service is recorded, not planned into this sync.
        coord.send(SourceBatch(vec![web_svc("api", "10.96.0.21")])).await.unwrap();
        sleep(50 * MS).await;
        let lines = log.lock().unwrap().clone();
        assert_eq!(
            lines[..6],
            ["prepare Full", "read", "sync 1 Full ports=1", "prepare Partial", "read", "sync 2 Partial ports=1"],
            "{lines:?}"
        );
        let syncs = coord.send(GetSyncHistory).await.unwrap();
        assert_eq!(syncs.len(), 2, "{syncs:?}");
    });
}

/// A dataplane that records each sync's kind, the family's ServiceCIDRs
/// and whether they changed (nftables mode rewrites its top-level chains then).
struct CidrSensitive {
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Dataplane for CidrSensitive {
    type Outcome = ();
    type Config = ();

    fn sync(&mut self, model: &Model, changes: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<()> {
        let cidrs: Vec<String> = model.service_cidrs().iter().map(ToString::to_string).collect();
        let changed = changes.service_cidrs_changed;
        self.log
            .lock()
            .unwrap()
            .push(format!("sync {generation} {kind:?} cidrs={} changed={changed}", cidrs.join(",")));
        Planned { full: kind == SyncKind::Full, ops: 0, run: Box::pin(async {}) }
    }

    fn finished(&mut self, _: ()) -> Finished {
        Finished::default()
    }

    fn reconfigure(&mut self, _: ()) {}
}

/// A change of the family's ServiceCIDRs brings a sync at once, a partial
/// one that says so; another family's ranges bring none.
#[test]
fn a_service_cidr_change_brings_a_sync_that_knows_it() {
    run_paused(|| async {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let coord = started_with_web(CidrSensitive { log: log.clone() }).await;
        coord.send(SourceBatch(vec![web_svc("api", "10.96.0.21")])).await.unwrap();
        sleep(5 * MS).await;
        coord.send(SourceBatch(vec![applied_service_cidr("kubernetes", &["10.96.0.0/16"])])).await.unwrap();
        sleep(5 * MS).await;
        coord.send(SourceBatch(vec![applied_service_cidr("v6", &["fd00:96::/112"])])).await.unwrap();
        sleep(5 * MS).await;
        coord.send(SourceBatch(vec![deleted_service_cidr("kubernetes")])).await.unwrap();
        sleep(5 * MS).await;
        let lines = log.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                "sync 1 Full cidrs= changed=false",
                "sync 2 Partial cidrs= changed=false",
                "sync 3 Partial cidrs=10.96.0.0/16 changed=true",
                "sync 4 Partial cidrs= changed=true",
            ],
            "the IPv6 range brought no sync to the IPv4 proxier"
        );
    });
}

/// A dataplane whose every sync takes 100 ms to be acked: records, under
/// its name, when each sync is planned and acked.
struct Slow {
    name: &'static str,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Dataplane for Slow {
    type Outcome = ();
    type Config = ();

    fn sync(&mut self, _: &Model, _: &ModelChanges, kind: SyncKind, generation: u64) -> Planned<()> {
        let (name, log) = (self.name, self.log.clone());
        log.lock().unwrap().push(format!("{name} plans {generation} {kind:?}"));
        let run = async move {
            sleep(100 * MS).await;
            log.lock().unwrap().push(format!("{name} acked {generation}"));
        };
        Planned { full: kind == SyncKind::Full, ops: 0, run: Box::pin(run) }
    }

    fn finished(&mut self, _: ()) -> Finished {
        Finished::default()
    }

    fn reconfigure(&mut self, _: ()) {}
}

/// Two coordinators sharing turns (a dual-stack node's families): the
/// second plans its first (full) sync only once the first one's is acked;
/// small syncs take no turn, so neither waits for the other's full sync.
#[test]
fn families_sharing_turns_plan_their_full_syncs_one_after_the_other() {
    run_paused(|| async {
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let turns = SyncTurns::default();
        let start = |name| {
            let dataplane = Slow { name, log: log.clone() };
            Coordinator::with_dataplane(unlimited_settings(), dataplane).with_turns(turns.clone()).start()
        };
        let (a, b) = (start("a"), start("b"));
        let mut first = synced();
        first.push(web_svc("web", "10.96.0.20"));
        a.send(SourceBatch(first.clone())).await.unwrap();
        b.send(SourceBatch(first)).await.unwrap();
        sleep(250 * MS).await;
        // Both first syncs acked: b's full resync takes the turn, and a
        // small change of a's meanwhile is planned without waiting for it.
        b.do_send(DriftDetected { actor: "test".into() });
        sleep(50 * MS).await;
        a.send(SourceBatch(vec![web_svc("api", "10.96.0.21")])).await.unwrap();
        sleep(300 * MS).await;
        let lines = log.lock().unwrap().clone();
        assert_eq!(
            lines,
            [
                "a plans 1 Full",
                "a acked 1",
                "b plans 1 Full",
                "b acked 1",
                "b plans 2 Full",
                "a plans 2 Partial",
                "b acked 2",
                "a acked 2",
            ],
            "{lines:?}"
        );
    });
}
