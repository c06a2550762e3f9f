//! An in-process Kubernetes API server for tests: plain HTTP/1.1 on
//! 127.0.0.1, serving what kube-proxy watches — `v1` Services and Nodes,
//! `discovery.k8s.io/v1` EndpointSlices and `networking.k8s.io/v1`
//! ServiceCIDRs — the way kube-rs's watcher uses it.
//!
//! # Served
//!
//! - `GET /api/v1/services`, `/api/v1/namespaces/{ns}/services[/{name}]`,
//!   `/apis/discovery.k8s.io/v1/endpointslices`,
//!   `/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices[/{name}]`,
//!   `/api/v1/nodes[/{name}]`,
//!   `/apis/networking.k8s.io/v1/servicecidrs[/{name}]`.
//! - Lists: `metadata.resourceVersion` on the list, each item with its own;
//!   `labelSelector` (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`),
//!   `fieldSelector` (`=`, `==`, `!=` on `metadata.name`,
//!   `metadata.namespace`, `spec.clusterIP`, ...; others are refused with
//!   400 as upstream refuses them), `limit` and `continue` (a continued
//!   list keeps the first page's resourceVersion, and its token expires
//!   with [`ApiServer::compact`]; pages are not a snapshot).
//!   `resourceVersion`/`resourceVersionMatch` on lists are accepted and
//!   ignored: lists are always served at the current version.
//! - Watches (`watch=true` or `watch=1`): newline-delimited JSON events
//!   `ADDED`, `MODIFIED`, `DELETED` from the given `resourceVersion`
//!   (replayed from the history, then live), with the selectors applied as
//!   the watch cache does (an object that stops matching is `DELETED`);
//!   `BOOKMARK` on [`ApiServer::bookmark`] when `allowWatchBookmarks=true`;
//!   `resourceVersion` unset or `0` first sends the current objects as
//!   `ADDED` (and with `sendInitialEvents=true` a bookmark annotated
//!   `k8s.io/initial-events-end`); the stream ends after `timeoutSeconds`.
//!   A resourceVersion older than the compaction point gets, as from the
//!   real API server's watch cache, a 200 response carrying one `ERROR`
//!   event with a `Status` of code 410, reason `Expired`.
//!
//! kube-rs's default watcher lists with `limit=500` (no resourceVersion),
//! then watches with `resourceVersion=<list's>`, `timeoutSeconds=290`,
//! `allowWatchBookmarks=true` and the selectors; it does not send
//! `sendInitialEvents` unless configured for streaming lists.
//!
//! Errors are `Status` objects with the real codes and reasons (400
//! BadRequest, 404 NotFound, 405 MethodNotAllowed, 410 Expired, 500
//! InternalError).
//!
//! # Test API
//!
//! [`ApiServer::start`] binds 127.0.0.1:0; [`ApiServer::client`] is a kube
//! client for it (`kube::Config::new(url)`, no auth). Writes
//! ([`ApiServer::create`], [`ApiServer::update`], [`ApiServer::delete`])
//! take `k8s_openapi` objects and bump one global resourceVersion. They take
//! raw JSON (`serde_json::Value`) too, served as written beside the typed
//! objects: an object our types refuse (`"port": "abc"`), as a conversion
//! webhook or a version skew may serve it. [`ApiServer::fail_kind`] makes
//! the lists and watches of one kind answer 500 (a failing webhook or
//! aggregated API), so that kind never completes its first list;
//! [`ApiServer::set_served`] makes a kind's paths 404 as on an API server
//! that does not serve the resource (ServiceCIDRs before 1.33).
//! [`ApiServer::compact`] expires older resourceVersions,
//! [`ApiServer::cut_watches`] drops every connection streaming a watch,
//! [`ApiServer::set_reachable`] drops every connection and refuses new ones,
//! [`ApiServer::bookmark`] sends bookmarks, and [`ApiServer::requests`] is
//! the request log.

pub mod selector;
pub mod store;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use selector::{FieldSelector, LabelSelector};
use store::{status, Query, Store, WatchFrom};
pub use store::{Key, Kind, StoreError};

/// How long a watch lasts without `timeoutSeconds` (the API server picks
/// between 30 and 60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// A running test API server; stops (closing every connection) on drop.
pub struct ApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    /// Set while [`ApiServer::set_reachable`] made the server unreachable.
    unreachable: AtomicBool,
    store: Mutex<Store>,
    connections: Mutex<Connections>,
    /// `METHOD /path?query` of every request, in order (query decoded).
    requests: Mutex<Vec<String>>,
    /// Kinds whose lists and watches fail ([`ApiServer::fail_kind`]).
    failing: Mutex<std::collections::BTreeSet<Kind>>,
    /// Kinds not served at all ([`ApiServer::set_served`]).
    unserved: Mutex<std::collections::BTreeSet<Kind>>,
}

#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, Connection>,
}

struct Connection {
    /// Set to drop the connection.
    cut: watch::Sender<bool>,
    /// Watch responses streaming on it.
    watches: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ApiServer {
    /// Starts on 127.0.0.1 inside the network namespace `/run/netns/NAME`,
    /// on a thread of its own (entered with setns, with its own runtime),
    /// serving until the returned sender is dropped. Panics if the
    /// namespace cannot be entered (test kit).
    pub fn start_in_netns(netns: &str) -> (ApiServer, std::sync::mpsc::Sender<()>) {
        let path = format!("/run/netns/{netns}");
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                tx.send(ApiServer::start().await).expect("send the server");
                // Serve until the sender is dropped.
                let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            });
        });
        (rx.recv().expect("API server started"), stop_tx)
    }

    /// Listens on 127.0.0.1 (a free port) in the current Tokio runtime.
    pub async fn start() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let shared = Arc::new(Shared::default());
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        ApiServer { shared, addr, accept }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server: no kubeconfig, no auth, plain HTTP.
    pub fn client(&self) -> kube::Client {
        let url = self.url().parse().expect("server URL");
        kube::Client::try_from(kube::Config::new(url)).expect("kube client")
    }

    /// Creates an object (a `k8s_openapi` Service, EndpointSlice, Node or
    /// ServiceCIDR); its resourceVersion.
    pub fn create(&self, object: &impl Serialize) -> Result<u64, StoreError> {
        lock(&self.shared.store).create(to_value(object)?)
    }

    /// Replaces an existing object; its new resourceVersion.
    pub fn update(&self, object: &impl Serialize) -> Result<u64, StoreError> {
        lock(&self.shared.store).update(to_value(object)?)
    }

    /// Deletes the object with this object's kind, namespace and name; the
    /// deletion's resourceVersion.
    pub fn delete(&self, object: &impl Serialize) -> Result<u64, StoreError> {
        let value = to_value(object)?;
        let field = |pointer| value.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        let kind = Kind::of(field("/apiVersion"), field("/kind"))
            .ok_or_else(|| StoreError::BadObject(format!("{} {}", field("/apiVersion"), field("/kind"))))?;
        let namespace = match kind.namespaced() {
            true => Some(field("/metadata/namespace")).filter(|ns| !ns.is_empty()).unwrap_or("default"),
            false => "",
        };
        let key = Key { kind, namespace: namespace.to_owned(), name: field("/metadata/name").to_owned() };
        lock(&self.shared.store).delete(key)
    }

    /// Forgets the event history: watches from an older resourceVersion
    /// (including every open watch's, once cut) get 410 Expired.
    pub fn compact(&self) {
        lock(&self.shared.store).compact();
    }

    /// Drops every connection with a watch streaming on it, mid-response;
    /// how many.
    pub fn cut_watches(&self) -> usize {
        lock(&self.shared.store).sever_watches();
        let connections = lock(&self.shared.connections);
        let mut cut = 0;
        for connection in connections.open.values().filter(|c| c.watches > 0) {
            let _ = connection.cut.send(true);
            cut += 1;
        }
        cut
    }

    /// Unreachable: every connection is dropped at once, open ones
    /// included, as if the API server were down; reachable again with `true`.
    pub fn set_reachable(&self, reachable: bool) {
        self.shared.unreachable.store(!reachable, Ordering::SeqCst);
        if !reachable {
            lock(&self.shared.store).sever_watches();
            for connection in lock(&self.shared.connections).open.values() {
                let _ = connection.cut.send(true);
            }
        }
    }

    /// While `failing`, new lists and watches of `kind` answer 500
    /// InternalError (gets by name still work; open watches go on).
    pub fn fail_kind(&self, kind: Kind, failing: bool) {
        let mut kinds = lock(&self.shared.failing);
        match failing {
            true => kinds.insert(kind),
            false => kinds.remove(&kind),
        };
    }

    /// While not `served`, every path of `kind` (lists, watches, gets)
    /// answers 404 NotFound, as an API server that does not know the
    /// resource (ServiceCIDRs before 1.33); its objects stay in the store.
    pub fn set_served(&self, kind: Kind, served: bool) {
        let mut kinds = lock(&self.shared.unserved);
        match served {
            false => kinds.insert(kind),
            true => kinds.remove(&kind),
        };
    }

    /// Sends a BOOKMARK at the current resourceVersion on every watch that
    /// allows bookmarks.
    pub fn bookmark(&self) {
        lock(&self.shared.store).bookmark();
    }

    /// The current (last written) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).resource_version()
    }

    /// Watches currently streaming.
    pub fn open_watches(&self) -> usize {
        lock(&self.shared.store).open_watches()
    }

    /// Every request so far, as `GET /path?query` (query decoded).
    pub fn requests(&self) -> Vec<String> {
        lock(&self.shared.requests).clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in lock(&self.shared.connections).open.values() {
            let _ = connection.cut.send(true);
        }
    }
}

fn to_value(object: &impl Serialize) -> Result<Value, StoreError> {
    serde_json::to_value(object).map_err(|e| StoreError::BadObject(e.to_string()))
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => serve(stream, shared.clone()),
            Err(error) => eprintln!("test API server: accept: {error}"),
        }
    }
}

/// Serves one connection until the client closes it or it is cut.
fn serve(stream: TcpStream, shared: Arc<Shared>) {
    if shared.unreachable.load(Ordering::SeqCst) {
        drop(stream);
        return;
    }
    let (cut, mut cut_seen) = watch::channel(false);
    let id = {
        let mut connections = lock(&shared.connections);
        connections.next_id += 1;
        let id = connections.next_id;
        connections.open.insert(id, Connection { cut, watches: 0 });
        id
    };
    let handler = shared.clone();
    let service = service_fn(move |request| {
        let shared = handler.clone();
        async move { Ok::<_, Infallible>(respond(&shared, id, request)) }
    });
    tokio::spawn(async move {
        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        tokio::select! {
            biased;
            _ = cut_seen.wait_for(|cut| *cut) => {}
            _ = connection => {}
        }
        lock(&shared.connections).open.remove(&id);
    });
}

/// Decrements its connection's watch count when the watch response ends.
struct WatchGuard {
    shared: Arc<Shared>,
    connection: u64,
}

impl WatchGuard {
    fn new(shared: &Arc<Shared>, connection: u64) -> Self {
        if let Some(c) = lock(&shared.connections).open.get_mut(&connection) {
            c.watches += 1;
        }
        WatchGuard { shared: shared.clone(), connection }
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.shared.connections).open.get_mut(&self.connection) {
            c.watches = c.watches.saturating_sub(1);
        }
    }
}

/// An error response: a `Status` with this code and reason.
#[derive(Debug)]
struct ApiError {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl ApiError {
    fn bad_request(message: String) -> Self {
        ApiError { code: StatusCode::BAD_REQUEST, reason: "BadRequest", message }
    }

    fn not_found(message: String) -> Self {
        ApiError { code: StatusCode::NOT_FOUND, reason: "NotFound", message }
    }

    fn response(&self) -> Response<Body> {
        json_response(self.code, &status(self.code.as_u16(), self.reason, &self.message))
    }
}

fn respond(shared: &Arc<Shared>, connection: u64, request: Request<Incoming>) -> Response<Body> {
    let uri = request.uri();
    let query = uri.query().map(|q| format!("?{}", percent_decode(q))).unwrap_or_default();
    lock(&shared.requests).push(format!("{} {}{query}", request.method(), uri.path()));
    route_request(shared, connection, &request).unwrap_or_else(|error| error.response())
}

fn route_request(
    shared: &Arc<Shared>,
    connection: u64,
    request: &Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    if request.method() != Method::GET {
        let message = format!("the server does not allow this method on the requested resource: {}", request.method());
        return Err(ApiError { code: StatusCode::METHOD_NOT_ALLOWED, reason: "MethodNotAllowed", message });
    }
    let not_found = || ApiError::not_found("the server could not find the requested resource".into());
    let route = Route::parse(request.uri().path()).ok_or_else(not_found)?;
    if lock(&shared.unserved).contains(&route.kind) {
        return Err(not_found());
    }
    let params = Params::parse(request.uri().query().unwrap_or_default());
    if route.name.is_none() && lock(&shared.failing).contains(&route.kind) {
        let message = format!("Internal error occurred: the test API server fails {}", route.kind.plural());
        return Err(ApiError { code: StatusCode::INTERNAL_SERVER_ERROR, reason: "InternalError", message });
    }
    match (&route.name, params.watch) {
        (Some(name), _) => get(shared, &route, name),
        (None, true) => open_watch(shared, connection, &route, &params),
        (None, false) => list(shared, &route, &params),
    }
}

/// Which resource a path names.
#[derive(Debug, Clone)]
struct Route {
    kind: Kind,
    namespace: Option<String>,
    name: Option<String>,
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        Kind::ALL.into_iter().find_map(|kind| Route::of_kind(kind, &segments))
    }

    fn of_kind(kind: Kind, segments: &[&str]) -> Option<Route> {
        let rest = segments.strip_prefix(kind.prefix())?;
        let (namespace, plural, name) = match (rest, kind.namespaced()) {
            ([plural], _) => (None, *plural, None),
            ([plural, name], false) => (None, *plural, Some(*name)),
            (["namespaces", ns, plural], true) => (Some(*ns), *plural, None),
            (["namespaces", ns, plural, name], true) => (Some(*ns), *plural, Some(*name)),
            _ => return None,
        };
        let owned = |s: Option<&str>| s.map(str::to_owned);
        (plural == kind.plural()).then(|| Route { kind, namespace: owned(namespace), name: owned(name) })
    }

    fn query(&self, params: &Params) -> Result<Query, ApiError> {
        let labels = LabelSelector::parse(&params.label_selector).map_err(ApiError::bad_request)?;
        let fields =
            FieldSelector::parse(&params.field_selector, self.kind.field_labels()).map_err(ApiError::bad_request)?;
        Ok(Query { kind: self.kind, namespace: self.namespace.clone(), labels, fields })
    }
}

/// The query parameters this server looks at.
#[derive(Debug, Default)]
struct Params {
    watch: bool,
    resource_version: Option<String>,
    timeout_seconds: Option<u64>,
    allow_watch_bookmarks: bool,
    send_initial_events: bool,
    label_selector: String,
    field_selector: String,
    limit: Option<usize>,
    continue_token: Option<String>,
}

impl Params {
    fn parse(query: &str) -> Params {
        let mut params = Params::default();
        let pairs = query.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")));
        for (name, value) in pairs {
            let value = percent_decode(value);
            let flag = value == "true" || value == "1";
            match name {
                "watch" => params.watch = flag,
                "resourceVersion" => params.resource_version = Some(value),
                "timeoutSeconds" => params.timeout_seconds = value.parse().ok(),
                "allowWatchBookmarks" => params.allow_watch_bookmarks = flag,
                "sendInitialEvents" => params.send_initial_events = flag,
                "labelSelector" => params.label_selector = value,
                "fieldSelector" => params.field_selector = value,
                "limit" => params.limit = value.parse().ok().filter(|l| *l > 0),
                "continue" => params.continue_token = Some(value).filter(|t| !t.is_empty()),
                _ => {}
            }
        }
        params
    }
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 2;
            }
            (b'+', _) => out.push(b' '),
            (byte, _) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn get(shared: &Arc<Shared>, route: &Route, name: &str) -> Result<Response<Body>, ApiError> {
    let namespace = route.namespace.clone().unwrap_or_default();
    let key = Key { kind: route.kind, namespace, name: name.to_owned() };
    let object = lock(&shared.store).get(&key);
    let object = object.ok_or_else(|| ApiError::not_found(format!("{} {name:?} not found", route.kind.plural())))?;
    Ok(json_response(StatusCode::OK, &object))
}

fn list(shared: &Arc<Shared>, route: &Route, params: &Params) -> Result<Response<Body>, ApiError> {
    let query = route.query(params)?;
    let store = lock(&shared.store);
    let (list_rv, after) = match &params.continue_token {
        Some(token) => decode_continue(token, route.kind)?,
        None => (store.resource_version(), None),
    };
    if store.is_expired(list_rv) {
        let message = "The provided continue parameter is too old to display a consistent list result. \
                       You can start a new list without the continue parameter.";
        return Err(ApiError { code: StatusCode::GONE, reason: "Expired", message: message.into() });
    }
    let (items, next) = store.list(&query, after.as_ref(), params.limit);
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if let Some(next) = next {
        metadata["continue"] = json!(format!("{list_rv}/{}/{}", next.namespace, next.name));
    }
    let items: Vec<Value> = items.into_iter().map(without_type).collect();
    let kind = route.kind;
    let body = json!({"kind": format!("{}List", kind.kind()), "apiVersion": kind.api_version(), "metadata": metadata, "items": items});
    Ok(json_response(StatusCode::OK, &body))
}

/// List items carry no `apiVersion`/`kind`, as the API server sends them.
fn without_type(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
    }
    object
}

/// `<list rv>/<namespace>/<name of the last item sent>`.
fn decode_continue(token: &str, kind: Kind) -> Result<(u64, Option<Key>), ApiError> {
    let invalid = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let mut parts = token.splitn(3, '/');
    let (Some(rv), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let rv = rv.parse().map_err(|_parse_error| invalid())?;
    Ok((rv, Some(Key { kind, namespace: namespace.to_owned(), name: name.to_owned() })))
}

fn open_watch(
    shared: &Arc<Shared>,
    connection: u64,
    route: &Route,
    params: &Params,
) -> Result<Response<Body>, ApiError> {
    let query = route.query(params)?;
    let from = match params.resource_version.as_deref() {
        None | Some("") | Some("0") => WatchFrom::Now { send_initial_events: params.send_initial_events },
        Some(rv) => {
            let rv =
                rv.parse().map_err(|_parse_error| ApiError::bad_request(format!("invalid resource version: {rv}")))?;
            WatchFrom::After(rv)
        }
    };
    let opened = lock(&shared.store).watch(query, from, params.allow_watch_bookmarks);
    let events: BoxStream<'static, Value> = match opened {
        Ok((backlog, live)) => stream::iter(backlog).chain(live).boxed(),
        Err(error_event) => stream::iter([error_event]).boxed(),
    };
    let timeout = params.timeout_seconds.map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let guard = WatchGuard::new(shared, connection);
    let frames = events.take_until(Box::pin(tokio::time::sleep(timeout))).map(move |event| {
        let _streaming = &guard;
        Ok::<_, Infallible>(Frame::data(Bytes::from(format!("{event}\n"))))
    });
    Ok(with_json_type(StatusCode::OK, StreamBody::new(frames).boxed_unsync()))
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    with_json_type(code, Full::new(Bytes::from(body.to_string())).boxed_unsync())
}

fn with_json_type(code: StatusCode, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}
