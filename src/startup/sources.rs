//! The source of Services, EndpointSlices and the Node: the manifest
//! directory or the Kubernetes API. At start it gives this node's Node
//! ([`find_node`]: its IPs decide the families); once the proxiers run it
//! is started ([`start`]) and its batches go to every family's coordinator
//! through the proxiers' intake ([`Fanout`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::Node;

use super::node_watch::NodeWatch;
use super::StartError;
use crate::actors::source::kube as api;
use crate::actors::source::manifests;
use crate::config::KubeProxyConfiguration;
use crate::metrics::ProxyMetrics;
use crate::model::intake::Intake;
use crate::msgs::{Change, SourceBatch, SourceEvent};

/// Where Services, EndpointSlices and the Node come from.
pub enum Source {
    Manifests(PathBuf),
    /// The Kubernetes API, with `--master` if given.
    Api {
        master: Option<String>,
    },
}

/// A source ready to start.
pub enum Ready {
    Manifests(PathBuf),
    Api(kube::Client),
}

/// A running source; [`Running::stop`] stops it.
pub enum Running {
    Manifests(manifests::ManifestWatcher),
    Api(actix_rt::task::JoinHandle<()>),
}

impl Running {
    pub fn stop(self) {
        match self {
            Running::Api(task) => task.abort(),
            Running::Manifests(watcher) => watcher.stop(),
        }
    }
}

/// How long to wait for our Node object at start (its IPs decide the family).
const NODE_WAIT: Duration = Duration::from_secs(30);

/// `--manifests DIR` must name a readable directory: checked at start,
/// before anything touches the node.
pub fn check_manifest_dir(dir: &Path) -> Result<(), StartError> {
    let bad = |source: std::io::Error| StartError::ManifestDir { dir: dir.to_path_buf(), source };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => std::fs::read_dir(dir).map(|_| ()).map_err(bad),
        Ok(_) => Err(bad(std::io::Error::other("not a directory"))),
        Err(e) => Err(bad(e)),
    }
}

/// This node's Node (`node_name`) as `source` has it at start (the API:
/// waited for up to [`NODE_WAIT`]), and the source ready to start.
pub async fn find_node(
    cfg: &KubeProxyConfiguration,
    source: Source,
    node_name: &str,
) -> Result<(Option<Arc<Node>>, Ready), StartError> {
    match source {
        Source::Manifests(dir) => {
            let node = manifests::ManifestDir::new(&dir).find_node(node_name)?;
            Ok((node, Ready::Manifests(dir)))
        }
        Source::Api { master } => {
            let config = api::client_config(&cfg.client_connection, master.as_deref()).await?;
            let client = api::client(config)?;
            let node = api::wait_for_node(client.clone(), node_name, NODE_WAIT).await?;
            Ok((node.map(Arc::new), Ready::Api(client)))
        }
    }
}

/// This node's Node object among source events, as the source sent it.
pub fn our_node_object<'a>(events: &'a [SourceEvent], node_name: &str) -> Option<&'a Arc<Node>> {
    events.iter().find_map(|e| match e {
        SourceEvent::Node(Change::Applied(n)) if n.metadata.name.as_deref() == Some(node_name) => Some(n),
        _ => None,
    })
}

/// Starts `ready`, its batches to `fanout`; the manifest source's refused
/// duplicates are counted in `metrics`.
pub fn start(
    ready: Ready,
    node_name: &str,
    fanout: Fanout,
    metrics: &Arc<ProxyMetrics>,
) -> Result<Running, StartError> {
    let fanout = Arc::new(fanout);
    match ready {
        Ready::Api(client) => {
            let sink = move |b: SourceBatch| fanout.send(b);
            Ok(Running::Api(actix_rt::spawn(api::run(client, node_name.to_string(), metrics.clone(), sink))))
        }
        Ready::Manifests(dir) => {
            let metrics = metrics.clone();
            let report =
                move |d: &manifests::Duplicate| metrics.object_ignored(&d.kind, &d.object, "duplicate", &d.detail);
            // The watcher's own thread waits until the coordinators took each
            // batch: its first scan then holds one file's objects at a time.
            let sink = move |b: SourceBatch| fanout.send_and_wait(b);
            Ok(Running::Manifests(manifests::spawn_reporting(dir, sink, report)?))
        }
    }
}

/// The sources' batches to every family's coordinator (each takes what is
/// of its family; objects are shared, not copied), after the Node check and
/// the proxiers' intake ([`Intake`]: shared by the families), whose notices
/// are logged and counted here.
pub struct Fanout {
    sinks: Vec<Recipient<SourceBatch>>,
    metrics: Arc<ProxyMetrics>,
    intake: Mutex<Intake>,
    node_watch: NodeWatch,
}

impl Fanout {
    pub fn new(
        sinks: Vec<Recipient<SourceBatch>>,
        metrics: Arc<ProxyMetrics>,
        intake: Intake,
        node_watch: NodeWatch,
    ) -> Fanout {
        Fanout { sinks, metrics, intake: Mutex::new(intake), node_watch }
    }

    /// `b` as the coordinators take it; `None` once the daemon is restarting.
    fn filter(&self, b: SourceBatch) -> Option<SourceBatch> {
        if !self.node_watch.admit(&b) {
            return None;
        }
        let (events, notices) = crate::mutex::lock(&self.intake).take(b.0);
        for n in &notices {
            n.log();
            self.metrics.notice(n);
        }
        Some(SourceBatch(events))
    }

    /// From the actors' own thread: queued, not waited for.
    fn send(&self, b: SourceBatch) {
        let Some(b) = self.filter(b) else { return };
        for s in &self.sinks {
            s.do_send(b.clone());
        }
    }

    /// From another thread (never the actors'): returns once every
    /// coordinator handled the batch (or is gone).
    fn send_and_wait(&self, b: SourceBatch) {
        let Some(b) = self.filter(b) else { return };
        for s in &self.sinks {
            if futures::executor::block_on(s.send(b.clone())).is_err() {
                tracing::debug!("a coordinator is gone; its source batch is dropped");
            }
        }
    }
}
