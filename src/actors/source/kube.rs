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
//! `Init`, `InitApply`…, `InitDone`. [`RelistState`] buffers the listed
//! objects and on `InitDone` swaps them in: `Applied` for every object that
//! is new or changed (another resourceVersion), `Deleted` for every object no
//! longer listed, and after the first list `Synced(kind)`. A relist that
//! finds what was already known emits nothing, so a 410 does not make the
//! kernel flap. Watch events (`Apply`, `Delete`) pass through, minus exact
//! repeats of what is known.
//!
//! Each watcher event becomes at most one [`SourceBatch`]; a relist is one
//! batch.
//!
//! # One object at a time
//!
//! List and watch responses are read as [`Item`]s: each object is decoded
//! into its `k8s_openapi` type on its own, so one object our types cannot
//! read (`"port": "abc"`, served by a conversion webhook, an aggregated API
//! or a version skew) no longer fails the whole list. Such an object is
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

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, watcher, DefaultBackoff, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, Config, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::wait::{InitialLists, WaitNotes};
use crate::config::ClientConnectionConfiguration;
use crate::model::node_change::host_ips;
use crate::msgs::source::{Change, ResourceKind, SourceBatch, SourceEvent};

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

/// The client configuration upstream's `createClient` would build from
/// `clientConnection` and `--master` (`master`: empty or `None` when unset).
pub async fn client_config(
    connection: &ClientConnectionConfiguration,
    master: Option<&str>,
) -> Result<Config, KubeSourceError> {
    let master = master.filter(|m| !m.is_empty());
    let kubeconfig = connection.kubeconfig.as_str();
    let mut config = match kubeconfig {
        "" if master.is_none() => {
            info!("neither kubeconfig file nor master URL was specified, falling back to in-cluster config");
            Config::incluster().map_err(KubeSourceError::InCluster)?
        }
        "" => Config::new(Default::default()),
        path => load_kubeconfig(path).await?,
    };
    if let Some(master) = master {
        set_master(&mut config, master)?;
    }
    log_unsupported_settings(connection);
    Ok(config)
}

/// A client for `config`.
pub fn client(config: Config) -> Result<Client, KubeSourceError> {
    let url = config.cluster_url.to_string();
    Client::try_from(config).map_err(|source| KubeSourceError::Client { url, source })
}

async fn load_kubeconfig(path: &str) -> Result<Config, KubeSourceError> {
    let error = |source| KubeSourceError::Kubeconfig { path: path.to_owned(), source };
    let kubeconfig = Kubeconfig::read_from(path).map_err(error)?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(error)
}

/// Points `config` at `--master`. Without a scheme: `https` if the
/// kubeconfig configures TLS, `http` otherwise (as client-go's `DefaultServerURL`).
fn set_master(config: &mut Config, master: &str) -> Result<(), KubeSourceError> {
    let url = match (master.contains("://"), uses_tls(config)) {
        (true, _) => master.to_owned(),
        (false, true) => format!("https://{master}"),
        (false, false) => format!("http://{master}"),
    };
    config.cluster_url =
        url.parse().map_err(|source| KubeSourceError::Master { url: master.to_owned(), source: Box::new(source) })?;
    Ok(())
}

fn uses_tls(config: &Config) -> bool {
    config.root_cert.is_some() || config.accept_invalid_certs || config.cluster_url.scheme_str() == Some("https")
}

fn log_unsupported_settings(connection: &ClientConnectionConfiguration) {
    debug!(
        qps = connection.qps,
        burst = connection.burst,
        content_type = %connection.content_type,
        accept_content_types = %connection.accept_content_types,
        "clientConnection rate limits and content types are not applied: kube-rs has no client-side \
         rate limiter and speaks JSON only"
    );
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
/// relist is one batch).
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

/// The most of serde's message a refusal logs: a type error quotes the
/// value it met, which may be large.
pub const REFUSAL_DETAIL_MAX: usize = 200;

/// One object as the API server sent it, decoded on its own: the
/// `k8s_openapi` object, or why it was refused. Lists and watch events are
/// read as `Item<K>`, so a bad object never fails its list.
#[derive(Debug, Clone)]
pub struct Item<K>(pub Result<K, Refused>);

/// An object that does not decode into its type.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// What could be read of its identity: name, namespace,
    /// resourceVersion and uid, where they are strings.
    pub meta: ObjectMeta,
    /// Where decoding failed, as serde_path_to_error spells it
    /// (`spec.ports[0].port`; `.` for the object itself).
    pub field: String,
    /// serde's message, at most [`REFUSAL_DETAIL_MAX`] bytes.
    pub error: String,
}

impl<K> From<K> for Item<K> {
    fn from(object: K) -> Self {
        Item(Ok(object))
    }
}

impl<K: DeserializeOwned> Item<K> {
    /// Decodes one object. The identity is read first (the decode takes
    /// the value), as a few short strings.
    pub fn decode(value: Value) -> Self {
        let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str).map(str::to_owned);
        let meta = ObjectMeta {
            name: text("/metadata/name"),
            namespace: text("/metadata/namespace"),
            resource_version: text("/metadata/resourceVersion"),
            uid: text("/metadata/uid"),
            ..ObjectMeta::default()
        };
        match serde_path_to_error::deserialize::<_, K>(value) {
            Ok(object) => Item(Ok(object)),
            Err(error) => {
                let field = error.path().to_string();
                let error = capped(error.into_inner().to_string(), REFUSAL_DETAIL_MAX);
                Item(Err(Refused { meta, field, error }))
            }
        }
    }
}

/// `text` cut to at most `max` bytes (on a character boundary), `…` added.
fn capped(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Any JSON value decodes (only malformed JSON fails, which fails the whole
/// response anyway); whether it is a `K` is in the item.
impl<'de, K: DeserializeOwned> Deserialize<'de> for Item<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Value::deserialize(deserializer).map(Item::decode)
    }
}

/// `K`'s API resource (same paths, kind and scope); the metadata is the
/// object's, or what could be read of a refused one's.
impl<K: Resource<DynamicType = ()>> Resource for Item<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        match &self.0 {
            Ok(object) => object.meta(),
            Err(refused) => &refused.meta,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.0 {
            Ok(object) => object.meta_mut(),
            Err(refused) => &mut refused.meta,
        }
    }
}

impl Refused {
    /// `namespace/name` (`name` for cluster-scoped objects), `<unnamed>`
    /// without a readable name.
    pub fn object(&self) -> String {
        let name = self.meta.name.as_deref().unwrap_or("<unnamed>");
        match self.meta.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
            _ => name.to_owned(),
        }
    }

    /// The one line a refusal logs; `outcome` says what the source did.
    fn log(&self, kind: ResourceKind, outcome: &str) {
        warn!(
            %kind,
            object = %self.object(),
            field = %self.field,
            error = %self.error,
            resource_version = self.meta.resource_version.as_deref().unwrap_or_default(),
            "object refused: it does not decode; {outcome}"
        );
    }
}

/// A kind the source watches.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + Debug + Default + DeserializeOwned + PartialEq + Send + Sync + 'static
{
    const KIND: ResourceKind;
    /// Nothing needs the kind to work: an API server that does not serve
    /// it (404) or does not let us list it (403) is noted once and tried
    /// again every [`UNAVAILABLE_RETRY`], not at the usual backoff.
    const OPTIONAL: bool = false;
    /// The event carrying `change`.
    fn event(change: Change<Self>) -> SourceEvent;

    /// What the source keeps of an object it has sent: its resourceVersion
    /// and uid, which tell a later version apart and, with its key, name it
    /// in a deletion (all the model reads of a deleted Service or
    /// EndpointSlice). At 10,000 services the whole objects were ≈ 55 MB
    /// the model had already turned into its own form, and an identity
    /// object (a default `Service` with four fields set) still ≈ 1 KB. An
    /// object without a resourceVersion is kept whole (it is compared whole).
    fn kept(object: Arc<Self>) -> Kept<Self> {
        match object.resource_version() {
            Some(resource_version) => Kept::Version { resource_version, uid: object.meta().uid.clone() },
            None => Kept::Whole(object),
        }
    }
}

/// A relisted object: as read (`Ok`), or refused when listed and counted
/// as the version known before (`Err`).
type Listed<K> = Result<Arc<K>, Kept<K>>;

/// What the source keeps of an object it has sent ([`Watched::kept`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Kept<K> {
    Version { resource_version: String, uid: Option<String> },
    Whole(Arc<K>),
}

impl<K: Watched> Kept<K> {
    /// `new` is the version this stands for.
    fn same_version(&self, new: &K) -> bool {
        match self {
            Kept::Version { resource_version, .. } => new.resource_version().as_deref() == Some(resource_version),
            Kept::Whole(old) => same_version(old.as_ref(), new),
        }
    }

    /// The object a deletion carries: the whole object, or one carrying
    /// only its identity and last version.
    fn object(&self, (namespace, name): &ObjectKey) -> Arc<K> {
        match self {
            Kept::Whole(object) => object.clone(),
            Kept::Version { resource_version, uid } => Arc::new(identity(&ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()).filter(|ns| !ns.is_empty()),
                resource_version: Some(resource_version.clone()),
                uid: uid.clone(),
                ..ObjectMeta::default()
            })),
        }
    }
}

/// An object carrying only `meta`'s name, namespace, resourceVersion and uid.
fn identity<K: Watched>(meta: &ObjectMeta) -> K {
    let mut identity = K::default();
    let kept = identity.meta_mut();
    kept.name = meta.name.clone();
    kept.namespace = meta.namespace.clone();
    kept.resource_version = meta.resource_version.clone();
    kept.uid = meta.uid.clone();
    identity
}

impl Watched for Service {
    const KIND: ResourceKind = ResourceKind::Service;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::Service(change)
    }
}

impl Watched for EndpointSlice {
    const KIND: ResourceKind = ResourceKind::EndpointSlice;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::EndpointSlice(change)
    }
}

impl Watched for Node {
    const KIND: ResourceKind = ResourceKind::Node;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::Node(change)
    }

    /// Our own Node, kept whole: its deletion marks the node as being
    /// deleted with its last labels and addresses (/healthz).
    fn kept(object: Arc<Self>) -> Kept<Self> {
        Kept::Whole(object)
    }
}

impl Watched for ServiceCIDR {
    const KIND: ResourceKind = ResourceKind::ServiceCidr;
    const OPTIONAL: bool = true;
    fn event(change: Change<Self>) -> SourceEvent {
        SourceEvent::ServiceCidr(change)
    }
}

/// Namespace (empty for cluster-scoped objects) and name.
type ObjectKey = (String, String);

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

fn refused_key(refused: &Refused) -> ObjectKey {
    let text = |field: &Option<String>| field.clone().unwrap_or_default();
    (text(&refused.meta.namespace), text(&refused.meta.name))
}

/// The same version of an object: equal resourceVersions, or equal
/// objects when either has none.
fn same_version<K: Watched>(a: &K, b: &K) -> bool {
    match (a.resource_version(), b.resource_version()) {
        (Some(a), Some(b)) => a == b,
        _ => a == b,
    }
}

/// What one kind's consumer has been told, and the relist in progress: the
/// pure core of the source. Feed it watcher events; it returns the source
/// events to send, logs the objects it refuses and counts them
/// ([`RelistState::take_refusals`]).
#[derive(Debug)]
pub struct RelistState<K> {
    /// The objects as last sent, as [`Watched::kept`] keeps them.
    known: BTreeMap<ObjectKey, Kept<K>>,
    /// Objects listed since `Init`, until `InitDone`: as read, or (refused
    /// when listed) as known before.
    relisting: Option<BTreeMap<ObjectKey, Listed<K>>>,
    synced: bool,
    /// Objects refused since the last [`RelistState::take_refusals`].
    refusals: Vec<Refused>,
}

impl<K: Watched> Default for RelistState<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Watched> RelistState<K> {
    /// Nothing known, nothing listed yet.
    pub fn new() -> Self {
        Self { known: BTreeMap::new(), relisting: None, synced: false, refusals: Vec::new() }
    }

    /// The first list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// How many objects the consumer knows.
    pub fn len(&self) -> usize {
        self.known.len()
    }

    /// The consumer knows no object.
    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }

    /// The objects refused (and logged) since the last call, for the
    /// metric and the dashboard.
    pub fn take_refusals(&mut self) -> Vec<Refused> {
        std::mem::take(&mut self.refusals)
    }

    /// The source events `event` implies, in order.
    pub fn handle(&mut self, event: Event<K>) -> Vec<SourceEvent> {
        self.handle_item(match event {
            Event::Init => Event::Init,
            Event::InitApply(object) => Event::InitApply(object.into()),
            Event::InitDone => Event::InitDone,
            Event::Apply(object) => Event::Apply(object.into()),
            Event::Delete(object) => Event::Delete(object.into()),
        })
    }

    /// [`RelistState::handle`] of objects as read, some maybe refused.
    pub fn handle_item(&mut self, event: Event<Item<K>>) -> Vec<SourceEvent> {
        match event {
            Event::Init => {
                self.relisting = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(item) => {
                match item.0 {
                    Ok(object) => {
                        let listed = self.relisting.get_or_insert_default();
                        listed.insert(key_of(&object), Ok(Arc::new(object)));
                    }
                    Err(refused) => self.refuse_listed(refused),
                }
                Vec::new()
            }
            Event::InitDone => self.swap(),
            Event::Apply(item) => match item.0 {
                Ok(object) => self.apply(object).into_iter().collect(),
                Err(refused) => {
                    let known = self.known.contains_key(&refused_key(&refused));
                    self.refuse(refused, known);
                    Vec::new()
                }
            },
            Event::Delete(item) => {
                let object = match item.0 {
                    Ok(object) => object,
                    // The identity is all a deletion needs.
                    Err(refused) => {
                        debug!(kind = %K::KIND, object = %refused.object(), field = %refused.field,
                            "deletion of an object that does not decode, by its identity");
                        identity(&refused.meta)
                    }
                };
                self.delete(object).into_iter().collect()
            }
        }
    }

    /// Logs a refusal and keeps it for [`RelistState::take_refusals`];
    /// `known`: the consumer keeps the version it was sent before.
    fn refuse(&mut self, refused: Refused, known: bool) {
        refused.log(K::KIND, if known { "keeping the version read before" } else { "skipped" });
        self.refusals.push(refused);
    }

    /// A listed object that does not decode: the version known before (if
    /// any) counts as listed, so the relist neither deletes nor changes it.
    fn refuse_listed(&mut self, refused: Refused) {
        let key = refused_key(&refused);
        let last = self.known.get(&key).cloned();
        self.refuse(refused, last.is_some());
        if let Some(last) = last {
            self.relisting.get_or_insert_default().insert(key, Err(last));
        }
    }

    /// Replaces what is known by the completed list; the differences.
    fn swap(&mut self) -> Vec<SourceEvent> {
        let listed = self.relisting.take().unwrap_or_default();
        let gone = (self.known.iter()).filter(|(key, _)| !listed.contains_key(*key));
        let mut events: Vec<SourceEvent> = gone.map(|(key, old)| K::event(Change::Deleted(old.object(key)))).collect();
        let deleted = events.len();
        let read = listed.iter().filter_map(|(key, l)| l.as_ref().ok().map(|new| (key, new)));
        let changed = read.filter(|(key, new)| self.known.get(*key).is_none_or(|old| !old.same_version(new)));
        events.extend(changed.map(|(_, new)| K::event(Change::Applied(new.clone()))));
        let first = !self.synced;
        info!(
            kind = %K::KIND,
            objects = listed.len(),
            applied = events.len() - deleted,
            deleted,
            first,
            "list complete"
        );
        self.known = listed.into_iter().map(|(key, l)| (key, l.map_or_else(|kept| kept, K::kept))).collect();
        if first {
            self.synced = true;
            events.push(SourceEvent::Synced(K::KIND));
        }
        events
    }

    fn apply(&mut self, object: K) -> Option<SourceEvent> {
        let key = key_of(&object);
        if self.known.get(&key).is_some_and(|old| old.same_version(&object)) {
            debug!(kind = %K::KIND, object = ?key, "repeated watch event ignored");
            return None;
        }
        let object = Arc::new(object);
        self.known.insert(key, K::kept(object.clone()));
        Some(K::event(Change::Applied(object)))
    }

    fn delete(&mut self, object: K) -> Option<SourceEvent> {
        let key = key_of(&object);
        if let Some(listed) = &mut self.relisting {
            listed.remove(&key);
        }
        if self.known.remove(&key).is_none() {
            debug!(kind = %K::KIND, object = ?key, "deletion of an unknown object ignored");
            return None;
        }
        Some(K::event(Change::Deleted(Arc::new(object))))
    }
}

#[cfg(test)]
mod tests;
