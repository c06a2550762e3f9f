//! The watcher thread: rescans the directory after every burst of changes
//! (inotify, debounced; polling where inotify is unavailable) and hands
//! each non-empty batch to a sink.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{never, select, Receiver, RecvError, RecvTimeoutError, Sender, TryRecvError};
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tracing::{debug, warn};

use super::error::{Duplicate, ManifestError};
use super::scan::ManifestDir;
use crate::msgs::source::SourceBatch;

/// How long the directory must be quiet after a change before a rescan.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The longest a stream of changes can delay a rescan.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// Rescan interval when inotify is unavailable.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Safety-net rescan interval while inotify works (a rescan only stats files).
const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// How long a stop waits for the thread: a sink may block (the daemon's
/// waits until the coordinators took each batch) and never return when
/// they are gone with the caller's thread.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A running manifest watcher. Dropping it (or [`ManifestWatcher::stop`])
/// stops the thread and waits for it.
#[derive(Debug)]
pub struct ManifestWatcher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends.
    ended: Receiver<()>,
}

impl ManifestWatcher {
    /// Stops watching and waits for the thread to end.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        // Disconnecting the channel wakes the thread.
        drop(self.stop.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Dropped from inside the sink: the thread ends after this call.
        if thread.thread().id() == std::thread::current().id() {
            return;
        }
        if let Err(RecvTimeoutError::Timeout) = self.ended.recv_timeout(STOP_WAIT) {
            warn!(waited = ?STOP_WAIT, "manifest watcher still handing a batch over; not waiting for it");
            return;
        }
        if thread.join().is_err() {
            warn!("manifest watcher thread panicked");
        }
    }
}

impl Drop for ManifestWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Watches `dir` and feeds `sink` the events of the manifest source, from a
/// thread of its own.
///
/// The first scan goes file by file: `sink` gets each file's objects as it
/// is read, then `Synced` for every kind (so only one file's objects are
/// decoded at a time; a sink that blocks until its consumer took a batch
/// bounds what waits in between). Then the thread rescans after every burst
/// of changes (inotify, with ~100 ms debounce; polling every second if
/// inotify is unavailable) and calls `sink` with each non-empty batch. Fails
/// if the directory cannot be listed or the thread cannot be started; bad
/// files are only logged.
pub fn spawn(dir: PathBuf, sink: impl Fn(SourceBatch) + Send + 'static) -> Result<ManifestWatcher, ManifestError> {
    start(dir, sink, |_: &Duplicate| {}, Backend::Inotify)
}

/// Like [`spawn`], and each refused copy of an object (already logged) is
/// also given to `report` (the daemon counts them and lists them on the
/// dashboard).
pub fn spawn_reporting(
    dir: PathBuf,
    sink: impl Fn(SourceBatch) + Send + 'static,
    report: impl Fn(&Duplicate) + Send + 'static,
) -> Result<ManifestWatcher, ManifestError> {
    start(dir, sink, report, Backend::Inotify)
}

/// Like [`spawn`], but always polls (every second) instead of using
/// inotify, which misses changes on some network and FUSE filesystems.
pub fn spawn_polling(
    dir: PathBuf,
    sink: impl Fn(SourceBatch) + Send + 'static,
) -> Result<ManifestWatcher, ManifestError> {
    start(dir, sink, |_: &Duplicate| {}, Backend::Poll)
}

/// How the watcher learns about changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// inotify, falling back to polling if it cannot be set up.
    Inotify,
    /// Polling every [`POLL_INTERVAL`].
    Poll,
}

type NotifyEvents = Receiver<notify::Result<notify::Event>>;

fn start<F, R>(dir: PathBuf, sink: F, report: R, backend: Backend) -> Result<ManifestWatcher, ManifestError>
where
    F: Fn(SourceBatch) + Send + 'static,
    R: Fn(&Duplicate) + Send + 'static,
{
    let manifests = ManifestDir::new(dir);
    manifests.check_listable()?;
    let (watcher, events) = match backend {
        Backend::Inotify => watch_dir(manifests.dir()).unzip(),
        Backend::Poll => (None, None),
    };
    let (stop, stopped) = crossbeam_channel::bounded(0);
    let (end, ended) = crossbeam_channel::bounded::<()>(0);
    let worker = Worker { manifests, sink, report, stop: stopped, events, _watcher: watcher, settle_again: None };
    let thread = std::thread::Builder::new()
        .name("manifest-watch".to_owned())
        .spawn(move || {
            let _end = end;
            worker.run()
        })
        .map_err(|source| ManifestError::Spawn { source })?;
    Ok(ManifestWatcher { stop: Some(stop), thread: Some(thread), ended })
}

/// An inotify watch on `dir`; `None` (logged) if it cannot be set up.
fn watch_dir(dir: &Path) -> Option<(RecommendedWatcher, NotifyEvents)> {
    let (tx, rx) = crossbeam_channel::unbounded();
    let watcher = notify::recommended_watcher(tx).and_then(|mut watcher| {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(watcher)
    });
    match watcher {
        Ok(watcher) => Some((watcher, rx)),
        Err(error) => {
            let dir = dir.display();
            warn!(%error, %dir, interval = ?POLL_INTERVAL, "cannot watch manifests; polling");
            None
        }
    }
}

/// The watcher thread's state.
struct Worker<F, R> {
    manifests: ManifestDir,
    sink: F,
    report: R,
    stop: Receiver<()>,
    /// inotify events; `None` when polling.
    events: Option<NotifyEvents>,
    _watcher: Option<RecommendedWatcher>,
    /// When files left to settle may be read.
    settle_again: Option<Instant>,
}

/// Why the watcher thread woke up.
enum Wake {
    Stop,
    /// An event caused by our own reads.
    Ignore,
    Changed,
    Tick,
}

/// A rescan that hands over at least this many changes is followed by a
/// heap trim (as the first scan is).
const TRIM_AFTER_EVENTS: usize = 1000;

impl<F: Fn(SourceBatch), R: Fn(&Duplicate)> Worker<F, R> {
    fn run(mut self) {
        self.first_scan();
        // Catch changes made during the first scan, before the watch saw them.
        self.rescan();
        while self.wait() {
            self.rescan();
        }
        debug!(dir = %self.manifests.dir().display(), "manifest watcher stopped");
    }

    /// File by file; stops handing batches over once asked to stop.
    fn first_scan(&mut self) {
        let (sink, report, stop) = (&self.sink, &self.report, &self.stop);
        let scanned = self.manifests.scan_file_by_file(|result| {
            result.refused.iter().for_each(report);
            let stopping = !matches!(stop.try_recv(), Err(TryRecvError::Empty));
            if !result.events.is_empty() && !stopping {
                sink(SourceBatch(result.events));
            }
        });
        if let Err(error) = scanned {
            warn!(%error, "first scan of the manifests failed; the next scan tries again");
        }
        // The files' bytes, values and objects were freed on this thread's
        // malloc arena: give them back before the first sync's planning,
        // on the actors' threads, takes pages of its own.
        crate::heap::trim();
    }

    fn rescan(&mut self) {
        let result = self.manifests.scan();
        result.refused.iter().for_each(&self.report);
        self.settle_again = result.settle_again.map(|d| Instant::now() + d);
        let events = result.events;
        if !events.is_empty() {
            debug!(events = events.len(), "manifest changes");
            let large = events.len() >= TRIM_AFTER_EVENTS;
            (self.sink)(SourceBatch(events));
            if large {
                crate::heap::trim();
            }
        }
    }

    /// Blocks until a rescan is due; `false` when asked to stop.
    fn wait(&mut self) -> bool {
        loop {
            match self.next_wake() {
                Wake::Stop => return false,
                Wake::Ignore => {}
                Wake::Changed => return self.debounce(),
                Wake::Tick => return true,
            }
        }
    }

    fn next_wake(&mut self) -> Wake {
        let (events, tick) = match &self.events {
            Some(events) => (events.clone(), RESYNC_INTERVAL),
            None => (never(), POLL_INTERVAL),
        };
        let tick = match self.settle_again {
            Some(at) => tick.min(at.saturating_duration_since(Instant::now())),
            None => tick,
        };
        select! {
            recv(self.stop) -> _ => Wake::Stop,
            recv(events) -> message => self.classify(message),
            default(tick) => Wake::Tick,
        }
    }

    fn classify(&mut self, message: Result<notify::Result<notify::Event>, RecvError>) -> Wake {
        match message {
            Ok(Ok(event)) if is_read_only(&event.kind) => Wake::Ignore,
            Ok(Ok(_)) => Wake::Changed,
            Ok(Err(error)) => {
                warn!(%error, "manifest watch error; rescanning");
                Wake::Changed
            }
            Err(RecvError) => {
                warn!(interval = ?POLL_INTERVAL, "manifest watch ended; polling");
                (self.events, self._watcher) = (None, None);
                Wake::Tick
            }
        }
    }

    /// Waits until no event came for [`DEBOUNCE`] (at most [`MAX_DEBOUNCE`]);
    /// `false` when asked to stop.
    fn debounce(&mut self) -> bool {
        let deadline = Instant::now() + MAX_DEBOUNCE;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return true;
            }
            let quiet = DEBOUNCE.min(deadline - now);
            let events = self.events.clone().unwrap_or_else(never);
            select! {
                recv(self.stop) -> _ => return false,
                recv(events) -> message => if let Wake::Tick = self.classify(message) {
                    return true;
                },
                default(quiet) => return true,
            }
        }
    }
}

/// Opening or reading a file (our own scans do that) changes nothing.
fn is_read_only(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(access) if *access != AccessKind::Close(AccessMode::Write))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fs;

    use tempfile::TempDir;

    use super::super::testing::*;

    /// Collects the watcher's batches for the test to wait on.
    fn channel_sink() -> (impl Fn(SourceBatch) + Send + 'static, Receiver<SourceBatch>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        let sink = move |batch| {
            let _ = tx.send(batch);
        };
        (sink, rx)
    }

    /// Waits (bounded) for a batch containing `line`.
    fn wait_for(batches: &Receiver<SourceBatch>, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Ok(SourceBatch(events)) = batches.recv_deadline(deadline) {
            if summary(&events).iter().any(|l| l == line) {
                return;
            }
        }
        panic!("no {line:?} within 5 s");
    }

    fn check_watcher(backend: Backend) {
        let dir = TempDir::new().unwrap();
        write(&dir, "node.yaml", NODE);
        let (sink, batches) = channel_sink();
        let watcher = start(dir.path().to_owned(), sink, |_: &Duplicate| {}, backend).expect("watcher starts");
        let mut first = Vec::new();
        while !first.iter().any(|l| l == "synced ServiceCIDR") {
            let SourceBatch(events) = batches.recv_timeout(Duration::from_secs(5)).expect("the first scan's batches");
            first.extend(summary(&events));
        }
        assert_eq!(
            first,
            ["applied Node demo-node", "synced Service", "synced EndpointSlice", "synced Node", "synced ServiceCIDR"]
        );
        write(&dir, "web.yaml", WEB_SERVICE);
        wait_for(&batches, "applied Service default/web");
        fs::remove_file(dir.path().join("web.yaml")).unwrap();
        wait_for(&batches, "deleted Service default/web");
        let stopping = Instant::now();
        watcher.stop();
        assert!(stopping.elapsed() < Duration::from_secs(1));
        // The thread is gone: its sink (and sender) were dropped.
        assert!(batches.recv_timeout(Duration::from_secs(1)).is_err());
    }

    #[test]
    fn the_watcher_picks_up_new_and_deleted_files() {
        check_watcher(Backend::Inotify);
    }

    #[test]
    fn the_polling_watcher_picks_up_new_and_deleted_files() {
        check_watcher(Backend::Poll);
    }

    #[test]
    fn a_stop_does_not_wait_forever_for_a_sink_that_blocks() {
        let dir = TempDir::new().unwrap();
        write(&dir, "node.yaml", NODE);
        // A consumer that never takes the batch (gone with the caller's thread).
        let (entered, entered_rx) = crossbeam_channel::bounded::<()>(1);
        let (_never_tx, never) = crossbeam_channel::bounded::<()>(0);
        let sink = move |_: SourceBatch| {
            let _ = entered.try_send(());
            let _ = never.recv();
        };
        let watcher = spawn(dir.path().to_owned(), sink).expect("watcher starts");
        entered_rx.recv_timeout(Duration::from_secs(5)).expect("the first batch reached the sink");
        let stopping = Instant::now();
        watcher.stop();
        let waited = stopping.elapsed();
        assert!(waited >= STOP_WAIT && waited < STOP_WAIT + Duration::from_secs(2), "{waited:?}");
    }

    #[test]
    fn spawn_fails_for_a_missing_directory() {
        let dir = TempDir::new().unwrap();
        let (sink, batches) = channel_sink();
        let result = spawn(dir.path().join("missing"), sink);
        assert!(matches!(result, Err(ManifestError::ReadDir { .. })));
        assert!(batches.try_recv().is_err());
    }
}
