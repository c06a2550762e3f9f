//! The Kubernetes API source: Services, EndpointSlices, this node's Node
//! and the ServiceCIDRs from the API server, through kube-rs watchers.
//!
//! It emits exactly the [`SourceEvent`]s the manifest source emits, so
//! nothing downstream knows which source is in use.
//!
//! # What is watched
//!
//! As upstream's `cmd/kube-proxy/app/server.go`:
//!
//! - Services without the `service.kubernetes.io/service-proxy-name` label
//!   (those belong to another proxy), and not headless: label selector
//!   [`SERVICE_LABEL_SELECTOR`], field selector [`SERVICE_FIELD_SELECTOR`].
//! - EndpointSlices not labelled `service.kubernetes.io/headless`
//!   ([`ENDPOINT_SLICE_LABEL_SELECTOR`]).
//! - The Node named `node_name` (field selector `metadata.name=<node_name>`).
//! - Every `networking.k8s.io/v1` ServiceCIDR (no selector), as upstream
//!   since MultiCIDRServiceAllocator went GA (1.33), in every mode (only
//!   nftables mode uses them). Nothing waits for them: the first sync
//!   needs Services and EndpointSlices only. An API server that does not
//!   serve them (older than 1.33: 404) or does not let us list them (403)
//!   is noted once and the source carries on without them, as upstream
//!   with the feature off; the list is tried again every
//!   [`UNAVAILABLE_RETRY`], so an upgraded API server's ServiceCIDRs
//!   arrive without a restart.
//!
//! # Events
//!
//! kube-rs's watcher lists, then watches from the list's resourceVersion;
//! when a watch expires (410 Gone) it lists again. A (re)list arrives as
//! `Init`, `InitApply`…, `InitDone`. A kind's first list is passed on as it
//! is read, [`FIRST_LIST_CHUNK`] objects at a time, then `Synced(kind)`
//! (nothing syncs before it). [`RelistState`] buffers a later relist's
//! objects and on `InitDone` swaps them in: `Applied` for every object that
//! is new or changed (another resourceVersion), `Deleted` for every object no
//! longer listed. A relist that
//! finds what was already known emits nothing, so a 410 does not make the
//! kernel flap. Watch events (`Apply`, `Delete`) pass through, minus exact
//! repeats of what is known.
//!
//! Each watcher event becomes at most one [`SourceBatch`]; a relist is one
//! batch, a first list one per chunk.
//!
//! # One object at a time
//!
//! List and watch responses are read as [`Item`]s: each object is decoded
//! into its `k8s_openapi` type on its own, so one object our types cannot
//! read (`"port": "abc"`, served by a conversion webhook, an aggregated API
//! or a version skew) does not fail the whole list. Such an object is
//! *refused*: one warning names its kind, `namespace/name`, the field
//! (`spec.ports[0].port`) and serde's message (capped at
//! [`REFUSAL_DETAIL_MAX`] bytes), and it is counted in
//! `kube_proxy_rs_source_objects_refused_total{kind}`. Every other object
//! flows as before. A refused object that was known keeps its last readable
//! version (in a watch event and in a relist alike, so a 410 changes
//! nothing); one never read stays unknown. A deletion needs only the
//! identity, so a refused object's deletion goes through.
//!
//! Watcher errors (API server unreachable, RBAC, expired watch) are
//! logged and retried with kube-runtime's default backoff (0.8 s doubling to
//! 30 s, with jitter, as client-go's reflector); meanwhile the consumer keeps
//! the last state it was told.
//!
//! # Client configuration
//!
//! [`client_config`] follows upstream's `createClient`: the in-cluster
//! service account when neither `--kubeconfig` nor `--master` is given,
//! otherwise the kubeconfig file (its current context), with `--master`
//! replacing the cluster URL. kube-rs has no client-side rate limiter and
//! speaks only JSON, so `clientConnection.qps`, `burst`, `contentType` and
//! `acceptContentTypes` are read but not applied (logged at debug).

mod client;
mod item;
mod relist;

pub use self::client::{client, client_config};
pub use self::item::{Item, Refused, REFUSAL_DETAIL_MAX};
pub use self::relist::{Kept, RelistState, Watched, FIRST_LIST_CHUNK};

use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::config::{InClusterError, KubeconfigError};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, watcher, DefaultBackoff, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use tracing::{debug, info, warn};

use super::wait::{InitialLists, WaitNotes};
use crate::model::node_change::host_ips;
use crate::msgs::source::{ResourceKind, SourceBatch, SourceEvent};

/// Services the proxy handles: not claimed by another proxy (upstream's
/// `noProxyName`). Services never carry the headless label; upstream
/// selected on it too until kubernetes/kubernetes#134623 and it costs nothing.
pub const SERVICE_LABEL_SELECTOR: &str = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name";
/// Headless Services have no cluster IP to program (upstream since
/// kubernetes/kubernetes#126769; the API server supports this field since
/// kubernetes/kubernetes#123905).
pub const SERVICE_FIELD_SELECTOR: &str = "spec.clusterIP!=None";
/// EndpointSlices of headless Services are labelled so by the
/// EndpointSlice controller (upstream's `noHeadlessEndpoints`).
pub const ENDPOINT_SLICE_LABEL_SELECTOR: &str = "!service.kubernetes.io/headless";

/// Why no API client could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// Neither `--kubeconfig` nor `--master`, and not running in a pod.
    #[error("no --kubeconfig or --master given, and no in-cluster configuration: {0}")]
    InCluster(#[source] InClusterError),
    /// The kubeconfig file cannot be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: KubeconfigError,
    },
    /// `--master` is not a URL.
    #[error("--master {url:?} is not a valid URL: {source}")]
    Master {
        url: String,
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The HTTP client could not be built (TLS settings, proxy).
    #[error("building the API client for {url}: {source}")]
    Client {
        url: String,
        #[source]
        source: kube::Error,
    },
    /// The node object could not be read in time.
    #[error("reading node {name:?}: {source}")]
    Node {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A one-time list (`--dry-run` from the cluster) failed.
    #[error("listing {kind}s: {source}")]
    List {
        kind: ResourceKind,
        #[source]
        source: kube::Error,
    },
}

/// How often the Node is read while waited for.
const NODE_POLL: Duration = Duration::from_secs(1);

/// Reads the Node `name` every second for up to `timeout` until it exists
/// and has an address (upstream 1.37's NodeManager waits the same way),
/// saying at least every [`super::wait::NOTE_EVERY`] what it waits
/// for. Returns the Node as it is then (`None` if it does not exist, or at
/// once if it does not decode: logged; the Node watcher counts it when it
/// lists it). The API server unreachable until the end is an error.
pub async fn wait_for_node(client: Client, name: &str, timeout: Duration) -> Result<Option<Node>, KubeSourceError> {
    let nodes: Api<Item<Node>> = Api::all(client);
    let start = tokio::time::Instant::now();
    let mut notes = WaitNotes::default();
    loop {
        let result = nodes.get_opt(name).await;
        let waited = start.elapsed();
        let expired = waited >= timeout;
        let waited_secs = waited.as_secs();
        let timeout_secs = timeout.as_secs();
        let node = match result {
            Ok(Some(Item(Ok(node)))) => Some(node),
            Ok(Some(Item(Err(refused)))) => {
                refused.log(ResourceKind::Node, "starting without the Node's addresses and labels");
                return Ok(None);
            }
            Ok(None) => None,
            Err(source) if expired => return Err(KubeSourceError::Node { name: name.to_owned(), source }),
            Err(error) => {
                if notes.due(waited, NODE_POLL) {
                    warn!(node = name, %error, waited_secs, timeout_secs, "waiting for the Node: cannot read it yet; retrying");
                }
                tokio::time::sleep(NODE_POLL).await;
                continue;
            }
        };
        let ips: Vec<String> =
            node.as_ref().map(host_ips).unwrap_or_default().iter().map(|ip| ip.to_string()).collect();
        if !ips.is_empty() {
            info!(node = name, node_ips = %ips.join(","), waited_secs, "Successfully retrieved NodeIPs");
            return Ok(node);
        }
        let what = if node.is_some() { "to be assigned IPs" } else { "to exist" };
        if expired {
            warn!(node = name, waited_secs, "Timed out waiting for node {what}; starting without its IPs");
            return Ok(node);
        }
        if notes.due(waited, NODE_POLL) {
            info!(
                node = name,
                waited_secs, timeout_secs, "waiting for the Node {what} (its IPs decide the primary IP family)"
            );
        }
        tokio::time::sleep(NODE_POLL).await;
    }
}

/// Lists Services, EndpointSlices, the Node `node_name` and the
/// ServiceCIDRs once, with the watch's selectors (`--dry-run` from the
/// cluster): the events the watch starts with, each kind ending with its
/// `Synced`. Objects that do not decode are logged and left out, as the
/// watch does; ServiceCIDRs the API server does not serve (or let us
/// list) are left out with a warning, as the watch carries on without them.
pub async fn list_once(client: Client, node_name: &str) -> Result<Vec<SourceEvent>, KubeSourceError> {
    let services = ListParams::default().labels(SERVICE_LABEL_SELECTOR).fields(SERVICE_FIELD_SELECTOR);
    let slices = ListParams::default().labels(ENDPOINT_SLICE_LABEL_SELECTOR);
    let nodes = ListParams::default().fields(&format!("metadata.name={node_name}"));
    let mut events = list_kind::<Service>(Api::all(client.clone()), services).await?;
    events.extend(list_kind::<EndpointSlice>(Api::all(client.clone()), slices).await?);
    events.extend(list_kind::<Node>(Api::all(client.clone()), nodes).await?);
    match list_kind::<ServiceCIDR>(Api::all(client), ListParams::default()).await {
        Ok(cidrs) => events.extend(cidrs),
        Err(KubeSourceError::List { kind, source: kube::Error::Api(status) }) if unavailable_status(status.code) => {
            warn!(%kind, code = status.code, message = %status.message, "{UNAVAILABLE_NOTE}")
        }
        Err(e) => return Err(e),
    }
    Ok(events)
}

/// One kind's list, through the relist bookkeeping the watch uses.
async fn list_kind<K: Watched>(api: Api<Item<K>>, params: ListParams) -> Result<Vec<SourceEvent>, KubeSourceError> {
    let list = api.list(&params).await.map_err(|source| KubeSourceError::List { kind: K::KIND, source })?;
    let mut state = RelistState::<K>::new();
    let mut events = state.handle_item(Event::Init);
    for item in list.items {
        events.extend(state.handle_item(Event::InitApply(item)));
    }
    events.extend(state.handle_item(Event::InitDone));
    Ok(events)
}

/// Where the API source reports the objects it refuses (the metrics,
/// which also list them on the dashboard).
pub trait Refusals: Send + Sync + 'static {
    /// `kind` is watched: its refusal count exists from now, at 0.
    fn counting(&self, kind: &str);
    /// An object of `kind` that does not decode (`detail`: the field and
    /// serde's message).
    fn refused(&self, kind: &str, object: &str, detail: &str);
}

/// Watches Services, EndpointSlices, the Node `node_name` and the
/// ServiceCIDRs and feeds `sink` one [`SourceBatch`] per change (a whole
/// relist is one batch; a first list one per [`FIRST_LIST_CHUNK`] objects).
/// Objects that do not decode are refused and reported to `refusals`.
/// Runs until the future is dropped; API errors are logged and retried.
pub async fn run<R: Refusals>(
    client: Client,
    node_name: String,
    refusals: Arc<R>,
    sink: impl Fn(SourceBatch) + Send + 'static,
) {
    let node_selector = format!("metadata.name={node_name}");
    let services = watcher::Config::default().labels(SERVICE_LABEL_SELECTOR).fields(SERVICE_FIELD_SELECTOR);
    let slices = watcher::Config::default().labels(ENDPOINT_SLICE_LABEL_SELECTOR);
    let nodes = watcher::Config::default().fields(&node_selector);
    for kind in ResourceKind::ALL {
        refusals.counting(&kind.to_string());
    }
    let mut batches = stream::select_all([
        batches::<Service, R>(Api::all(client.clone()), services, refusals.clone()),
        batches::<EndpointSlice, R>(Api::all(client.clone()), slices, refusals.clone()),
        batches::<Node, R>(Api::all(client.clone()), nodes, refusals.clone()),
        batches::<ServiceCIDR, R>(Api::all(client), watcher::Config::default(), refusals),
    ]);
    info!(node = %node_name, "watching the API server");
    let start = tokio::time::Instant::now();
    let mut lists = InitialLists::default();
    let mut notes = WaitNotes::default();
    let mut tick = tokio::time::interval(LISTS_CHECK);
    loop {
        tokio::select! {
            batch = batches.next() => {
                let Some(batch) = batch else { return };
                if lists.record(&batch.0) {
                    info!(waited_secs = start.elapsed().as_secs(), "initial lists of Services, EndpointSlices and the Node complete");
                }
                sink(batch);
            }
            _ = tick.tick(), if !lists.done() => {
                let waited = start.elapsed();
                if notes.due(waited, LISTS_CHECK) {
                    info!(waiting_for = %lists.pending(), waited_secs = waited.as_secs(),
                        "waiting for the API server's initial lists before the first sync");
                }
            }
        }
    }
}

/// How often the initial lists are checked on while waited for.
const LISTS_CHECK: Duration = Duration::from_secs(1);

/// How often the list of a kind the API server does not serve (or does
/// not let us list) is tried again ([`Watched::OPTIONAL`] kinds only).
pub const UNAVAILABLE_RETRY: Duration = Duration::from_secs(300);

const UNAVAILABLE_NOTE: &str = "not served by the API server (older than 1.33) or not allowed by our ClusterRole: \
    carrying on without ServiceCIDRs (nftables mode writes no drop rule for unallocated ClusterIPs)";

/// 404 (the resource is not served) or 403 (not allowed).
fn unavailable_status(code: u16) -> bool {
    code == 404 || code == 403
}

/// The list or watch of an optional kind cannot be had from this API
/// server: it does not serve the resource, or does not let us read it.
pub fn unavailable(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => unavailable_status(status.code),
        _ => false,
    }
}

/// kube-runtime's default backoff, or [`UNAVAILABLE_RETRY`] while the kind
/// is unavailable ([`unavailable`]).
struct KindBackoff {
    default: DefaultBackoff,
    unavailable: Arc<AtomicBool>,
}

impl Iterator for KindBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let default = self.default.next();
        match self.unavailable.load(Ordering::Relaxed) {
            true => Some(UNAVAILABLE_RETRY),
            false => default,
        }
    }
}

impl Backoff for KindBackoff {
    fn reset(&mut self) {
        self.default.reset();
    }
}

/// One kind's watcher, turned into batches for the coordinator.
fn batches<K: Watched, R: Refusals>(
    api: Api<Item<K>>,
    config: watcher::Config,
    refusals: Arc<R>,
) -> BoxStream<'static, SourceBatch> {
    let mut state = RelistState::<K>::new();
    let kind = K::KIND.to_string();
    // Set while an optional kind's list cannot be had (read by the backoff,
    // which sees each error before the stage that logs it).
    let unavailable_now = Arc::new(AtomicBool::new(false));
    let backoff = KindBackoff { default: DefaultBackoff::default(), unavailable: unavailable_now.clone() };
    let flag = unavailable_now.clone();
    let mut noted = false;
    watcher(api, config)
        .map(move |event| {
            match &event {
                // `Init` comes before each list request, answered or not.
                Ok(Event::Init) => {}
                Err(error) => flag.store(K::OPTIONAL && unavailable(error), Ordering::Relaxed),
                Ok(_) => flag.store(false, Ordering::Relaxed),
            }
            event
        })
        .backoff(backoff)
        .filter_map(move |event| {
            let events = match event {
                Ok(event) => {
                    if noted && !unavailable_now.load(Ordering::Relaxed) {
                        info!(kind = %K::KIND, "listed after all: the API server serves it now");
                        noted = false;
                    }
                    state.handle_item(event)
                }
                Err(error) if unavailable_now.load(Ordering::Relaxed) => {
                    let retry_secs = UNAVAILABLE_RETRY.as_secs();
                    match std::mem::replace(&mut noted, true) {
                        false => warn!(kind = %K::KIND, %error, retry_secs, "{UNAVAILABLE_NOTE}"),
                        true => debug!(kind = %K::KIND, %error, "still unavailable"),
                    }
                    Vec::new()
                }
                Err(error) => {
                    log_watch_error(K::KIND, &error);
                    Vec::new()
                }
            };
            for refused in state.take_refusals() {
                refusals.refused(&kind, &refused.object(), &format!("{}: {}", refused.field, refused.error));
            }
            futures::future::ready((!events.is_empty()).then_some(SourceBatch(events)))
        })
        .boxed()
}

fn log_watch_error(kind: ResourceKind, error: &watcher::Error) {
    match error {
        watcher::Error::WatchError(status) if status.code == 410 => {
            info!(%kind, message = %status.message, "watch expired; relisting")
        }
        _ => warn!(%kind, %error, "watching the API server failed; retrying with backoff"),
    }
}

#[cfg(test)]
mod tests;
