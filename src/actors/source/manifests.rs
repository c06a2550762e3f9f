//! The manifest source (`--manifests DIR`): Services, EndpointSlices and
//! Nodes read from files instead of the Kubernetes API.
//!
//! It emits exactly the [`SourceEvent`]s the API source emits, so nothing
//! downstream knows which source is in use.
//!
//! # Which files, which objects
//!
//! - Regular files (or symlinks to them, as in a ConfigMap volume) directly
//!   in `DIR` whose names end in `.yaml`, `.yml` or `.json`. Subdirectories,
//!   hidden files (`.name`) and other extensions are ignored.
//! - A YAML file may hold several documents separated by `---`; a JSON file
//!   may hold several concatenated values. Empty documents are skipped.
//! - A document is one object, or a list as `kubectl get -o yaml|json`
//!   prints it (`apiVersion: v1`, `kind: List`, objects under `items`). In a
//!   typed list (`kind: ServiceList`, ...) items may omit `apiVersion` and
//!   `kind`, as the API server's list responses do.
//! - An object is identified by `apiVersion` + `kind`: `v1` Service,
//!   `discovery.k8s.io/v1` EndpointSlice and `v1` Node are read into the
//!   `k8s_openapi` types; other kinds are ignored (debug log).
//! - Namespaced objects without `metadata.namespace` are in `default`, as
//!   `kubectl apply` would put them.
//!
//! # Errors and precedence
//!
//! - A file that cannot be read or parsed (syntax error, wrong field types,
//!   missing `apiVersion`/`kind`/`metadata.name`) is skipped as a whole: a
//!   warning names the file and carries the parser's message, and the scan
//!   returns a [`ManifestError`]. If the file parsed before, its last good
//!   objects stay; the error is reported once per version of the file.
//! - A deleted file deletes its objects.
//! - The same kind/namespace/name in several files: the first file by name
//!   (byte order, as `LC_ALL=C ls`) wins and the other copies are refused
//!   with a warning naming both files; within one file, the first document
//!   wins. Deleting the winner brings in the next one.
//! - A file written in place is read once it has been quiet for [`SETTLE`]
//!   (1 s after its last write), so a half-written file that happens to be
//!   valid YAML never deletes the objects of its missing half; a file
//!   renamed into place (its inode changed after its last write: ctime
//!   later than mtime) is read at once. The directory's first scan reads
//!   every file as it is.
//!
//! # Structure
//!
//! [`ManifestDir`] is the synchronous core: each [`ManifestDir::scan`]
//! re-reads the files that changed and returns the events since the last
//! scan. [`spawn`] runs it on a thread driven by inotify (or polling when
//! inotify is unavailable) and hands each non-empty batch to a sink.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{never, select, Receiver, RecvError, Sender};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::Metadata;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, warn};

use crate::msgs::source::{Change, ResourceKind, SourceBatch, SourceEvent};

/// How long a file written in place must be quiet before it is read.
pub const SETTLE: Duration = Duration::from_secs(1);
/// How long the directory must be quiet after a change before a rescan.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The longest a stream of changes can delay a rescan.
const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// Rescan interval when inotify is unavailable.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Safety-net rescan interval while inotify works (a rescan only stats files).
const RESYNC_INTERVAL: Duration = Duration::from_secs(30);
/// A file modified this close to when it was read may change again without
/// a visible change of mtime or size (coarse timestamps), so it is re-read,
/// and re-parsed if its content changed.
const RACY_WINDOW: Duration = Duration::from_secs(2);
/// The namespace of namespaced objects that name none.
const DEFAULT_NAMESPACE: &str = "default";

/// A problem with the manifest directory or one of its files.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The directory itself cannot be listed; nothing changes.
    #[error("cannot read manifest directory {}: {source}", path.display())]
    ReadDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A manifest file cannot be stat'ed or read; it is skipped.
    #[error("cannot read manifest file {}: {source}", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A YAML file is not valid YAML; it is skipped.
    #[error("{}: invalid YAML: {source}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: yaml_serde::Error,
    },
    /// A JSON file is not valid JSON; it is skipped.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A document is not a Kubernetes object (not a mapping, no `apiVersion`,
    /// `kind` or `metadata.name`, `items` not a list); the file is skipped.
    #[error("{}: {location}: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        /// `document N` (1-based), or `document N, items[I]` in a list.
        location: String,
        problem: String,
    },
    /// An object of a watched kind does not match its schema; the file is
    /// skipped.
    #[error("{}: {location}: {object}: {source}", path.display())]
    Decode {
        path: PathBuf,
        /// `document N` (1-based), or `document N, items[I]` in a list.
        location: String,
        /// Kind and name as far as they could be read, e.g. `Service default/web`.
        object: String,
        #[source]
        source: DecodeError,
    },
    /// The watcher thread could not be started.
    #[error("cannot start the manifest watcher thread: {source}")]
    Spawn {
        #[source]
        source: io::Error,
    },
}

impl ManifestError {
    /// The directory or file the error is about (`None` for [`Self::Spawn`]).
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::ReadDir { path, .. }
            | Self::ReadFile { path, .. }
            | Self::Yaml { path, .. }
            | Self::Json { path, .. }
            | Self::Invalid { path, .. }
            | Self::Decode { path, .. } => Some(path),
            Self::Spawn { .. } => None,
        }
    }
}

/// The parser's message for an object that does not match its schema: from
/// the YAML or JSON parser (with field path and line where it can tell).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error(transparent)]
    Yaml(#[from] yaml_serde::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// What one [`ManifestDir::scan`] found.
#[derive(Debug, Default)]
pub struct ScanResult {
    /// Changes since the previous scan, Services before EndpointSlices before
    /// Nodes; after the first successful scan, `Synced` for all three kinds.
    pub events: Vec<SourceEvent>,
    /// Files (or the directory) that could not be used, each already logged.
    pub errors: Vec<ManifestError>,
    /// Files still being written were left for later: scan again after this.
    pub settle_again: Option<Duration>,
    /// Copies of objects refused because another copy is used, each already logged.
    pub refused: Vec<Duplicate>,
}

/// A second copy of an object (same kind, namespace and name), refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
    /// `namespace/name` (a Node: its name).
    pub object: String,
    /// Where the used copy and the refused one are.
    pub detail: String,
}

impl Duplicate {
    fn of(key: &ObjectKey, detail: String) -> Duplicate {
        let object =
            if key.namespace.is_empty() { key.name.clone() } else { format!("{}/{}", key.namespace, key.name) };
        Duplicate { kind: key.kind.to_string(), object, detail }
    }
}

/// The synchronous core of the manifest source: a directory and what was
/// last read from each of its files.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, CachedFile>,
    /// What the events so far have told the consumer: the winning objects.
    current: Objects,
    synced: bool,
    settle: Duration,
}

impl ManifestDir {
    /// A manifest directory not scanned yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), files: BTreeMap::new(), current: Objects::new(), synced: false, settle: SETTLE }
    }

    /// Another settle time than [`SETTLE`] (zero: read files as they are).
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The directory this reads.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Re-reads the files that changed, appeared or vanished since the last
    /// scan and returns the resulting events: `Applied` for new or changed
    /// objects, `Deleted` (with the object's identity) for vanished ones, and
    /// after the first successful scan `Synced` for every kind. If the
    /// directory cannot be listed, nothing changes and the error is returned.
    pub fn scan(&mut self) -> ScanResult {
        let mut pass = Pass::default();
        match list_dir(&self.dir) {
            Ok(listing) => self.refresh_all(listing, &mut pass),
            Err(err) => pass.report(err),
        }
        let mut events = self.settle_all(std::mem::take(&mut pass.touched), &pass.fresh, &mut pass.refused);
        if pass.listed && !self.synced {
            self.synced = true;
            events.extend(
                [ResourceKind::Service, ResourceKind::EndpointSlice, ResourceKind::Node].map(SourceEvent::Synced),
            );
        }
        ScanResult { events, errors: pass.errors, settle_again: pass.settle_again, refused: pass.refused }
    }

    fn refresh_all(&mut self, listing: Listing, pass: &mut Pass) {
        pass.listed = true;
        let gone: Vec<PathBuf> = (self.files.keys()).filter(|path| !listing.contains_key(*path)).cloned().collect();
        for path in gone {
            self.forget(&path, pass);
        }
        let now = SystemTime::now();
        for (path, meta) in listing {
            match meta {
                Ok(meta) => self.refresh(path, Stamp::of(&meta), now, pass),
                Err(source) => self.stat_failed(path, source, pass),
            }
        }
    }

    fn refresh(&mut self, path: PathBuf, stamp: Stamp, now: SystemTime, pass: &mut Pass) {
        if self.files.get(&path).is_some_and(|f| f.is_fresh(stamp)) {
            return;
        }
        if self.synced {
            if let Some(wait) = stamp.settling(now, self.settle) {
                debug!(path = %path.display(), ?wait, "manifest still being written; reading it once quiet");
                pass.settle_again = Some(pass.settle_again.map_or(wait, |w| w.min(wait)));
                return;
            }
        }
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return self.forget(&path, pass),
            Err(source) => {
                let file = self.files.entry(path.clone()).or_default();
                // Reported once per version of the file.
                let new_version = file.stamp != Some(stamp);
                file.seen(stamp, now);
                if new_version {
                    pass.report(ManifestError::ReadFile { path, source });
                }
                return;
            }
        };
        let file = self.files.entry(path.clone()).or_default();
        file.seen(stamp, now);
        let hash = content_hash(&bytes);
        if file.hash == Some(hash) {
            return;
        }
        file.hash = Some(hash);
        match parse_file(&path, &bytes, &mut pass.refused) {
            Ok(objects) => {
                let kept: Objects = objects.iter().map(|(key, held)| (key.clone(), held.kept())).collect();
                let old = std::mem::replace(&mut file.objects, kept);
                pass.touch_differences(&old, &file.objects);
                let whole = objects.into_iter().filter_map(|(key, held)| Some(((path.clone(), key), held.object?)));
                pass.fresh.extend(whole);
            }
            // The file's last good objects stay.
            Err(err) => pass.report(err),
        }
    }

    /// A listed file that cannot be stat'ed: reported once, objects kept.
    fn stat_failed(&mut self, path: PathBuf, source: io::Error, pass: &mut Pass) {
        let file = self.files.entry(path.clone()).or_default();
        let already_reported = file.stamp.is_none() && file.read_at.is_some();
        file.stamp = None;
        file.read_at = Some(SystemTime::now());
        if !already_reported {
            pass.report(ManifestError::ReadFile { path, source });
        }
    }

    fn forget(&mut self, path: &Path, pass: &mut Pass) {
        if let Some(file) = self.files.remove(path) {
            debug!(path = %path.display(), "manifest file removed");
            pass.touched.extend(file.objects.into_keys());
        }
    }

    fn settle_all(
        &mut self,
        touched: BTreeSet<ObjectKey>,
        fresh: &Fresh,
        refused: &mut Vec<Duplicate>,
    ) -> Vec<SourceEvent> {
        touched.into_iter().filter_map(|key| self.settle(key, fresh, refused)).collect()
    }

    /// The whole object `key` of the file at `path`: parsed this scan, or
    /// read again (a refused copy that now wins, after the first file went).
    fn whole(&self, path: &Path, key: &ObjectKey, fresh: &Fresh) -> Option<Object> {
        if let Some(object) = fresh.get(&(path.to_path_buf(), key.clone())) {
            return Some(object.clone());
        }
        let again = fs::read(path).ok().and_then(|bytes| parse_file(path, &bytes, &mut Vec::new()).ok());
        let object = again.and_then(|mut objects| objects.remove(key)).and_then(|held| held.object);
        if object.is_none() {
            warn!(object = %key, path = %path.display(), "cannot read the object again; the next scan retries");
        }
        object
    }

    /// Brings `current[key]` in line with the winning file (the first, in
    /// file name order, that has it; the others' copies are refused with a
    /// warning naming both files); the event, if any.
    fn settle(&mut self, key: ObjectKey, fresh: &Fresh, duplicates: &mut Vec<Duplicate>) -> Option<SourceEvent> {
        let mut holders = self.files.iter().filter_map(|(path, file)| file.objects.get(&key).map(|o| (path, o)));
        let first = holders.next();
        if let Some((kept, _)) = first {
            for (refused, _) in holders {
                warn!(
                    object = %key,
                    kept = %kept.display(),
                    refused = %refused.display(),
                    "the same object in two manifest files: the first file's is used, the other refused"
                );
                let detail = format!("also in {}; the copy in {} is used", refused.display(), kept.display());
                duplicates.push(Duplicate::of(&key, detail));
            }
        }
        match first {
            Some((_, held)) if self.current.get(&key) == Some(held) => None,
            Some((path, held)) => {
                let held = held.clone();
                let event = self.whole(path, &key, fresh)?.applied();
                self.current.insert(key, held);
                Some(event)
            }
            None => self.current.remove(&key).map(|held| held.object.unwrap_or_else(|| key.identity()).deleted()),
        }
    }
}

/// Bookkeeping of one scan.
#[derive(Default)]
struct Pass {
    listed: bool,
    touched: BTreeSet<ObjectKey>,
    errors: Vec<ManifestError>,
    /// The whole objects parsed this scan, by file.
    fresh: Fresh,
    /// The soonest a file left to settle is quiet enough.
    settle_again: Option<Duration>,
    refused: Vec<Duplicate>,
}

/// Whole objects by file and key.
type Fresh = BTreeMap<(PathBuf, ObjectKey), Object>;

impl Pass {
    fn report(&mut self, error: ManifestError) {
        warn!(%error, "manifest skipped; its last good objects stay");
        self.errors.push(error);
    }

    fn touch_differences(&mut self, old: &Objects, new: &Objects) {
        let keys = old.keys().chain(new.keys());
        let changed = keys.filter(|key| old.get(*key) != new.get(*key));
        self.touched.extend(changed.cloned());
    }
}

/// What was last read from one file.
#[derive(Debug, Default)]
struct CachedFile {
    /// Metadata when last read; `None` if it could not be stat'ed.
    stamp: Option<Stamp>,
    read_at: Option<SystemTime>,
    /// Hash of the content last parsed (successfully or not).
    hash: Option<u64>,
    /// The objects of the last successful parse, as [`Held::kept`] keeps them.
    objects: Objects,
}

impl CachedFile {
    fn seen(&mut self, stamp: Stamp, now: SystemTime) {
        self.stamp = Some(stamp);
        self.read_at = Some(now);
    }

    /// Whether the file is known not to have changed since it was read.
    fn is_fresh(&self, stamp: Stamp) -> bool {
        let (Some(seen), Some(read_at), Some(mtime)) = (self.stamp, self.read_at, stamp.mtime) else {
            return false;
        };
        let settled = read_at.duration_since(mtime).is_ok_and(|age| age >= RACY_WINDOW);
        seen == stamp && settled
    }
}

/// The metadata that changes when a file (or a symlink's target) changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: Option<SystemTime>,
    ctime: (i64, i64),
    dev: u64,
    ino: u64,
}

impl Stamp {
    /// How much longer a file written in place (not renamed since its last
    /// write) must stay quiet before it is read; None: read it now.
    fn settling(&self, now: SystemTime, settle: Duration) -> Option<Duration> {
        let mtime = self.mtime?;
        let ctime = SystemTime::UNIX_EPOCH
            .checked_add(Duration::new(u64::try_from(self.ctime.0).ok()?, u32::try_from(self.ctime.1).ok()?))?;
        if ctime > mtime {
            return None;
        }
        let age = now.duration_since(mtime).unwrap_or(Duration::ZERO);
        settle.checked_sub(age).filter(|wait| !wait.is_zero())
    }

    fn of(meta: &fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime: meta.modified().ok(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}

/// Manifest files in a directory, each with its metadata (following symlinks).
type Listing = BTreeMap<PathBuf, io::Result<fs::Metadata>>;

fn list_dir(dir: &Path) -> Result<Listing, ManifestError> {
    let read_dir_error = |source| ManifestError::ReadDir { path: dir.to_owned(), source };
    let mut listing = Listing::new();
    for entry in fs::read_dir(dir).map_err(read_dir_error)? {
        let path = entry.map_err(read_dir_error)?.path();
        if !is_manifest_name(&path) {
            continue;
        }
        match fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => {}
            // A dangling symlink, or a file deleted since the listing.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            meta => {
                listing.insert(path, meta);
            }
        }
    }
    Ok(listing)
}

fn is_manifest_name(path: &Path) -> bool {
    let hidden = (path.file_name()).is_none_or(|name| name.as_encoded_bytes().starts_with(b"."));
    !hidden && Format::of(path).is_some()
}

/// The syntax of a manifest file, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Yaml,
    Json,
}

impl Format {
    fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "yaml" | "yml" => Some(Self::Yaml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Identity of an object: kind, namespace (empty for Nodes), name. Orders
/// Services before EndpointSlices before Nodes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ObjectKey {
    kind: ResourceKind,
    namespace: String,
    name: String,
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.namespace.as_str() {
            "" => write!(f, "{} {}", self.kind, self.name),
            ns => write!(f, "{} {ns}/{}", self.kind, self.name),
        }
    }
}

/// One object of a watched kind, as parsed.
#[derive(Debug, Clone, PartialEq)]
enum Object {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Node(Arc<Node>),
}

/// An object with the digest of its manifest text (equal digests: the
/// same object). Between scans only its identity is kept ([`Held::kept`]):
/// the consumer got the whole object in its event, and at 10,000 services
/// keeping every whole one cost ≈ 55 MB.
#[derive(Debug, Clone)]
struct Held {
    digest: u64,
    /// None: only the identity (the key) is kept.
    object: Option<Object>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Held {
    /// The key alone (all a deletion needs) for Services and
    /// EndpointSlices; our Node whole, as its deletion reports its last state.
    fn kept(&self) -> Held {
        let object = self.object.as_ref().filter(|o| matches!(o, Object::Node(_))).cloned();
        Held { digest: self.digest, object }
    }
}

impl ObjectKey {
    /// An object with this key's name and namespace and nothing else: what
    /// a deletion carries.
    fn identity(&self) -> Object {
        fn meta(key: &ObjectKey) -> ObjectMeta {
            let namespace = (!key.namespace.is_empty()).then(|| key.namespace.clone());
            ObjectMeta { name: Some(key.name.clone()), namespace, ..ObjectMeta::default() }
        }
        match self.kind {
            ResourceKind::Service => Object::Service(Arc::new(Service { metadata: meta(self), ..Service::default() })),
            ResourceKind::EndpointSlice => {
                Object::EndpointSlice(Arc::new(EndpointSlice { metadata: meta(self), ..EndpointSlice::default() }))
            }
            ResourceKind::Node => Object::Node(Arc::new(Node { metadata: meta(self), ..Node::default() })),
        }
    }
}

/// A digest of a manifest object as parsed (maps are ordered, so equal
/// objects hash equally whatever the key order in the file).
fn value_digest(value: &Value) -> u64 {
    fn feed(value: &Value, h: &mut DefaultHasher) {
        match value {
            Value::Null => h.write_u8(0),
            Value::Bool(b) => {
                h.write_u8(1);
                h.write_u8(u8::from(*b));
            }
            Value::Number(n) => {
                h.write_u8(2);
                h.write(n.to_string().as_bytes());
            }
            Value::String(s) => {
                h.write_u8(3);
                h.write(s.as_bytes());
                h.write_u8(0xff);
            }
            Value::Array(items) => {
                h.write_u8(4);
                h.write_usize(items.len());
                items.iter().for_each(|v| feed(v, h));
            }
            Value::Object(map) => {
                h.write_u8(5);
                h.write_usize(map.len());
                for (k, v) in map {
                    h.write(k.as_bytes());
                    h.write_u8(0xff);
                    feed(v, h);
                }
            }
        }
    }
    let mut h = DefaultHasher::new();
    feed(value, &mut h);
    h.finish()
}

type Objects = BTreeMap<ObjectKey, Held>;

impl Object {
    fn kind_and_meta(&self) -> (ResourceKind, &ObjectMeta) {
        match self {
            Self::Service(o) => (ResourceKind::Service, &o.metadata),
            Self::EndpointSlice(o) => (ResourceKind::EndpointSlice, &o.metadata),
            Self::Node(o) => (ResourceKind::Node, &o.metadata),
        }
    }

    /// The object's key; `None` without a name.
    fn key(&self) -> Option<ObjectKey> {
        let (kind, meta) = self.kind_and_meta();
        let name = meta.name.clone().filter(|name| !name.is_empty())?;
        let namespace = match kind {
            ResourceKind::Node => String::new(),
            _ => meta.namespace.clone().unwrap_or_default(),
        };
        Some(ObjectKey { kind, namespace, name })
    }

    fn applied(&self) -> SourceEvent {
        match self {
            Self::Service(o) => SourceEvent::Service(Change::Applied(o.clone())),
            Self::EndpointSlice(o) => SourceEvent::EndpointSlice(Change::Applied(o.clone())),
            Self::Node(o) => SourceEvent::Node(Change::Applied(o.clone())),
        }
    }

    fn deleted(&self) -> SourceEvent {
        match self {
            Self::Service(o) => SourceEvent::Service(Change::Deleted(o.clone())),
            Self::EndpointSlice(o) => SourceEvent::EndpointSlice(Change::Deleted(o.clone())),
            Self::Node(o) => SourceEvent::Node(Change::Deleted(o.clone())),
        }
    }
}

/// Parses one file into its objects; any problem rejects the whole file.
/// The objects of one file; copies of an object already read from it are
/// refused (logged, and added to `duplicates`).
fn parse_file(path: &Path, bytes: &[u8], duplicates: &mut Vec<Duplicate>) -> Result<Objects, ManifestError> {
    let format = Format::of(path).unwrap_or(Format::Yaml);
    let mut objects = Objects::new();
    let mut twice = Vec::new();
    for (index, document) in read_documents(path, format, bytes)?.into_iter().enumerate() {
        let at = Location { document: index, item: None };
        let mut out = Out { objects: &mut objects, twice: &mut twice };
        add_document(document, at, &mut out).map_err(|failure| failure.into_error(path, format, bytes))?;
    }
    duplicates.extend(twice.into_iter().map(|(key, at)| {
        Duplicate::of(&key, format!("twice in {}; the first is used, the one at {at} refused", path.display()))
    }));
    Ok(objects)
}

/// Where a file's documents go: its objects, and the copies refused.
struct Out<'a> {
    objects: &'a mut Objects,
    twice: &'a mut Vec<(ObjectKey, Location)>,
}

/// Splits a file into documents, each as a generic JSON value.
fn read_documents(path: &Path, format: Format, bytes: &[u8]) -> Result<Vec<Value>, ManifestError> {
    match format {
        Format::Yaml => yaml_serde::Deserializer::from_slice(bytes)
            .map(Value::deserialize)
            .collect::<Result<_, _>>()
            .map_err(|source| ManifestError::Yaml { path: path.to_owned(), source }),
        Format::Json => serde_json::Deserializer::from_slice(bytes)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|source| ManifestError::Json { path: path.to_owned(), source }),
    }
}

/// Where an object is in its file: document index (0-based) and list item.
#[derive(Debug, Clone, Copy)]
struct Location {
    document: usize,
    item: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document + 1)?;
        match self.item {
            Some(item) => write!(f, ", items[{item}]"),
            None => Ok(()),
        }
    }
}

/// An object's `apiVersion` and `kind`.
#[derive(Debug, Clone)]
struct TypeMeta {
    api_version: String,
    kind: String,
}

impl TypeMeta {
    /// Reads them from an object, or takes `default` if it has neither.
    fn read(value: &Value, default: Option<&TypeMeta>) -> Result<Self, String> {
        let Value::Object(map) = value else {
            return Err(format!("expected an object, found {}", json_type(value)));
        };
        let field = |name| map.get(name).and_then(Value::as_str).map(str::to_owned);
        match (field("apiVersion"), field("kind"), default) {
            (Some(api_version), Some(kind), _) => Ok(Self { api_version, kind }),
            (None, None, Some(default)) => Ok(default.clone()),
            (None, _, _) => Err("missing or non-string apiVersion".to_owned()),
            (_, None, _) => Err("missing or non-string kind".to_owned()),
        }
    }

    /// For `XList`, the item type `X` of the same apiVersion; none for `List`.
    fn list_item(&self) -> Option<TypeMeta> {
        let kind = self.kind.strip_suffix("List").filter(|kind| !kind.is_empty())?;
        Some(TypeMeta { api_version: self.api_version.clone(), kind: kind.to_owned() })
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn add_document(document: Value, at: Location, out: &mut Out) -> Result<(), DocFailure> {
    if document.is_null() {
        return Ok(());
    }
    let type_meta = TypeMeta::read(&document, None).map_err(|p| DocFailure::invalid(at, p))?;
    if type_meta.kind.ends_with("List") {
        return add_list(document, &type_meta, at, out);
    }
    add_object(document, &type_meta, at, out)
}

fn add_list(list: Value, type_meta: &TypeMeta, at: Location, out: &mut Out) -> Result<(), DocFailure> {
    let item_type = type_meta.list_item();
    let items = match list {
        Value::Object(mut map) => map.remove("items").unwrap_or_default(),
        _ => Value::Null,
    };
    let items = match items {
        Value::Null => Vec::new(),
        Value::Array(items) => items,
        other => {
            let problem = format!("items must be a list, found {}", json_type(&other));
            return Err(DocFailure::invalid(at, problem));
        }
    };
    for (index, item) in items.into_iter().enumerate() {
        let at = Location { item: Some(index), ..at };
        let item_meta = TypeMeta::read(&item, item_type.as_ref()).map_err(|p| DocFailure::invalid(at, p))?;
        add_object(item, &item_meta, at, out)?;
    }
    Ok(())
}

fn add_object(value: Value, type_meta: &TypeMeta, at: Location, out: &mut Out) -> Result<(), DocFailure> {
    let object = match (type_meta.api_version.as_str(), type_meta.kind.as_str()) {
        ("v1", "Service") => Object::Service(Arc::new(namespaced(decode(&value, type_meta, at)?))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            Object::EndpointSlice(Arc::new(namespaced(decode(&value, type_meta, at)?)))
        }
        ("v1", "Node") => Object::Node(Arc::new(decode(&value, type_meta, at)?)),
        (api_version, kind) => {
            debug!(%api_version, %kind, location = %at, "ignoring a kind the proxy does not use");
            return Ok(());
        }
    };
    let key =
        object.key().ok_or_else(|| DocFailure::invalid(at, format!("{} without metadata.name", type_meta.kind)))?;
    match out.objects.entry(key) {
        std::collections::btree_map::Entry::Vacant(slot) => {
            slot.insert(Held { digest: value_digest(&value), object: Some(object) });
        }
        std::collections::btree_map::Entry::Occupied(slot) => {
            warn!(object = %slot.key(), location = %at, "the same object twice in one file: the first one is used, this one refused");
            out.twice.push((slot.key().clone(), at));
        }
    }
    Ok(())
}

/// Puts an object without a namespace into `default`.
fn namespaced<T: Metadata<Ty = ObjectMeta>>(mut object: T) -> T {
    let namespace = &mut object.metadata_mut().namespace;
    if namespace.as_deref().is_none_or(str::is_empty) {
        *namespace = Some(DEFAULT_NAMESPACE.to_owned());
    }
    object
}

fn decode<T: DeserializeOwned>(value: &Value, type_meta: &TypeMeta, at: Location) -> Result<T, DocFailure> {
    T::deserialize(value).map_err(|source| DocFailure {
        at,
        problem: Problem::Decode { object: describe(value, type_meta), source, relocate: relocate::<T> },
    })
}

/// `Kind namespace/name` as far as the raw object tells.
fn describe(value: &Value, type_meta: &TypeMeta) -> String {
    let meta = |field| value.pointer(&format!("/metadata/{field}")).and_then(Value::as_str);
    match (meta("namespace"), meta("name")) {
        (Some(namespace), Some(name)) => format!("{} {namespace}/{name}", type_meta.kind),
        (None, Some(name)) => format!("{} {name}", type_meta.kind),
        (_, None) => format!("{} without a name", type_meta.kind),
    }
}

/// Decodes a top-level document straight from the file to get the parser's
/// most precise message (YAML: field path, line and column; JSON: line and
/// column; the generic value only knows the expected type). `None` when it
/// cannot tell more.
fn relocate<T: DeserializeOwned>(format: Format, bytes: &[u8], document: usize) -> Option<DecodeError> {
    match format {
        Format::Yaml => {
            let document = yaml_serde::Deserializer::from_slice(bytes).nth(document)?;
            T::deserialize(document).err().map(DecodeError::Yaml)
        }
        // Later values of a JSON stream may be other kinds; only the first
        // can be decoded directly with correct line numbers.
        Format::Json if document == 0 => {
            let first = serde_json::Deserializer::from_slice(bytes).into_iter::<T>().next()?;
            first.err().map(DecodeError::Json)
        }
        Format::Json => None,
    }
}

/// Why a document was rejected, before the file path is known.
struct DocFailure {
    at: Location,
    problem: Problem,
}

enum Problem {
    Invalid(String),
    Decode { object: String, source: serde_json::Error, relocate: fn(Format, &[u8], usize) -> Option<DecodeError> },
}

impl DocFailure {
    fn invalid(at: Location, problem: String) -> Self {
        Self { at, problem: Problem::Invalid(problem) }
    }

    fn into_error(self, path: &Path, format: Format, bytes: &[u8]) -> ManifestError {
        let (path, location) = (path.to_owned(), self.at.to_string());
        match self.problem {
            Problem::Invalid(problem) => ManifestError::Invalid { path, location, problem },
            Problem::Decode { object, source, relocate } => {
                let precise = match self.at.item {
                    None => relocate(format, bytes, self.at.document),
                    Some(_) => None,
                };
                let source = precise.unwrap_or(DecodeError::Json(source));
                ManifestError::Decode { path, location, object, source }
            }
        }
    }
}

/// A running manifest watcher. Dropping it (or [`ManifestWatcher::stop`])
/// stops the thread and waits for it.
#[derive(Debug)]
pub struct ManifestWatcher {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
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

/// Watches `dir` and feeds `sink` the events of the manifest source.
///
/// The first scan runs before this returns, and `sink` gets its batch (all
/// objects, then `Synced` for every kind) as its first call, on the caller's
/// thread. Then a thread rescans after every burst of changes (inotify, with
/// ~100 ms debounce; polling every second if inotify is unavailable) and calls
/// `sink` with each non-empty batch. Fails if the directory cannot be listed
/// or the thread cannot be started; bad files are only logged.
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
    let mut manifests = ManifestDir::new(dir);
    let ScanResult { events, errors, refused, .. } = manifests.scan();
    refused.iter().for_each(&report);
    if let Some(err) = (errors.into_iter()).find(|e| matches!(e, ManifestError::ReadDir { .. })) {
        return Err(err);
    }
    sink(SourceBatch(events));
    let (watcher, events) = match backend {
        Backend::Inotify => watch_dir(manifests.dir()).unzip(),
        Backend::Poll => (None, None),
    };
    let (stop, stopped) = crossbeam_channel::bounded(0);
    let worker = Worker { manifests, sink, report, stop: stopped, events, _watcher: watcher, settle_again: None };
    let thread = std::thread::Builder::new()
        .name("manifest-watch".to_owned())
        .spawn(move || worker.run())
        .map_err(|source| ManifestError::Spawn { source })?;
    Ok(ManifestWatcher { stop: Some(stop), thread: Some(thread) })
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

impl<F: Fn(SourceBatch), R: Fn(&Duplicate)> Worker<F, R> {
    fn run(mut self) {
        // Catch changes made between the first scan and the start of the watch.
        self.rescan();
        while self.wait() {
            self.rescan();
        }
        debug!(dir = %self.manifests.dir().display(), "manifest watcher stopped");
    }

    fn rescan(&mut self) {
        let result = self.manifests.scan();
        result.refused.iter().for_each(&self.report);
        self.settle_again = result.settle_again.map(|d| Instant::now() + d);
        let events = result.events;
        if !events.is_empty() {
            debug!(events = events.len(), "manifest changes");
            (self.sink)(SourceBatch(events));
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

    use tempfile::TempDir;

    const WEB_SERVICE: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.20
  ports:
    - name: http
      protocol: TCP
      port: 80
      targetPort: 8080
";

    const WEB_SLICE: &str = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: default
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
  - name: http
    protocol: TCP
    port: 8080
endpoints:
  - addresses: [10.244.0.11]
    conditions: {ready: true}
    nodeName: demo-node
";

    const NODE: &str = "\
apiVersion: v1
kind: Node
metadata:
  name: demo-node
spec:
  podCIDR: 10.244.0.0/24
";

    fn service(name: &str, ip: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n\
             spec:\n  clusterIP: {ip}\n  ports:\n    - port: 80\n"
        )
    }

    fn write(dir: &TempDir, name: &str, text: &str) {
        fs::write(dir.path().join(name), text).expect("write test file");
    }

    /// The clusterIP of each applied Service, in order.
    fn applied_cluster_ips(events: &[SourceEvent]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                SourceEvent::Service(Change::Applied(s)) => s.spec.as_ref().and_then(|s| s.cluster_ip.clone()),
                _ => None,
            })
            .collect()
    }

    /// What the source keeps between scans: identities, not whole objects.
    #[test]
    fn only_identities_are_kept_between_scans() {
        let dir = TempDir::new().unwrap();
        write(&dir, "a.yaml", &service("web", "10.96.0.1"));
        let (manifests, _) = first_scan(&dir);
        let held: Vec<&Held> = manifests.current.values().collect();
        assert!(matches!(held[..], [Held { object: None, .. }]), "{held:?}");
        let file = manifests.files.values().next().unwrap();
        assert!(file.objects.values().all(|h| h.object.is_none()));
    }

    #[test]
    fn equal_objects_digest_equally_whatever_the_key_order() {
        let a: Value = serde_json::from_str(r#"{"a": 1, "b": {"c": [1, "x"], "d": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b": {"d": null, "c": [1, "x"]}, "a": 1}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"a": 1, "b": {"c": [1, "y"], "d": null}}"#).unwrap();
        assert_eq!(value_digest(&a), value_digest(&b));
        assert_ne!(value_digest(&a), value_digest(&c));
    }

    /// A readable line per event: `applied Service default/web`.
    fn summary(events: &[SourceEvent]) -> Vec<String> {
        events.iter().map(describe_event).collect()
    }

    fn describe_event(event: &SourceEvent) -> String {
        let (verb, object) = match event {
            SourceEvent::Service(change) => verb_and_object(change, Object::Service),
            SourceEvent::EndpointSlice(change) => verb_and_object(change, Object::EndpointSlice),
            SourceEvent::Node(change) => verb_and_object(change, Object::Node),
            SourceEvent::Synced(kind) => return format!("synced {kind}"),
        };
        let key = object.key().map_or("?".to_owned(), |key| key.to_string());
        format!("{verb} {key}")
    }

    fn verb_and_object<T>(change: &Change<T>, wrap: fn(Arc<T>) -> Object) -> (&'static str, Object) {
        match change {
            Change::Applied(o) => ("applied", wrap(o.clone())),
            Change::Deleted(o) => ("deleted", wrap(o.clone())),
        }
    }

    /// The object events of a scan, `Synced` left out; panics on errors.
    fn changes(result: ScanResult) -> Vec<String> {
        assert!(result.errors.is_empty(), "unexpected errors: {:?}", result.errors);
        let mut lines = summary(&result.events);
        lines.retain(|line| !line.starts_with("synced"));
        lines
    }

    /// The first scan, with no settle time (these tests write in place and
    /// scan at once; the settle tests set their own).
    fn first_scan(dir: &TempDir) -> (ManifestDir, ScanResult) {
        let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::ZERO);
        let result = manifests.scan();
        (manifests, result)
    }

    #[test]
    fn multi_document_yaml_loads_every_object() {
        let dir = TempDir::new().unwrap();
        let text = format!("---\n{WEB_SERVICE}---\n{WEB_SLICE}---\n# just a comment\n---\n{NODE}...\n");
        write(&dir, "all.yaml", &text);
        let (_, result) = first_scan(&dir);
        assert_eq!(
            changes(result),
            ["applied Service default/web", "applied EndpointSlice default/web-abcde", "applied Node demo-node",]
        );
    }

    #[test]
    fn kind_list_loads_its_items() {
        let dir = TempDir::new().unwrap();
        let list = "\
apiVersion: v1
kind: List
metadata:
  resourceVersion: \"\"
items:
  - apiVersion: v1
    kind: Service
    metadata: {name: web}
    spec:
      clusterIP: 10.96.0.20
      ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080}]
  - apiVersion: discovery.k8s.io/v1
    kind: EndpointSlice
    metadata: {name: web-abcde, namespace: default}
    addressType: IPv4
    endpoints: [{addresses: [10.244.0.11]}]
";
        write(&dir, "list.yaml", list);
        // A typed list whose items omit apiVersion and kind, as the API returns it.
        write(
            &dir,
            "nodes.yaml",
            "apiVersion: v1\nkind: NodeList\nitems:\n  - metadata: {name: n1}\n  - metadata: {name: n2}\n",
        );
        let (_, result) = first_scan(&dir);
        assert_eq!(
            changes(result),
            [
                "applied Service default/web",
                "applied EndpointSlice default/web-abcde",
                "applied Node n1",
                "applied Node n2",
            ]
        );
    }

    #[test]
    fn json_files_load_single_objects_and_lists() {
        let dir = TempDir::new().unwrap();
        let node = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "demo-node"}}"#;
        write(&dir, "node.json", node);
        let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "ns"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "ns"}}]}"#;
        write(&dir, "services.json", list);
        let (_, result) = first_scan(&dir);
        assert_eq!(changes(result), ["applied Service ns/a", "applied Service ns/b", "applied Node demo-node"]);
    }

    #[test]
    fn only_visible_manifest_files_are_read() {
        let dir = TempDir::new().unwrap();
        write(&dir, "a.yml", &service("a", "10.96.0.1"));
        write(&dir, ".hidden.yaml", &service("hidden", "10.96.0.2"));
        write(&dir, "notes.txt", &service("txt", "10.96.0.3"));
        write(&dir, "a.yaml~", &service("backup", "10.96.0.4"));
        fs::create_dir(dir.path().join("sub.yaml")).unwrap();
        fs::write(dir.path().join("sub.yaml/b.yaml"), service("nested", "10.96.0.5")).unwrap();
        let (_, result) = first_scan(&dir);
        assert_eq!(changes(result), ["applied Service default/a"]);
    }

    #[test]
    fn other_kinds_are_ignored_and_namespace_defaults() {
        let dir = TempDir::new().unwrap();
        let config_map = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n";
        let old_slice = "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata: {name: s}\n";
        write(&dir, "mixed.yaml", &format!("{config_map}---\n{old_slice}---\n{WEB_SERVICE}"));
        let (_, result) = first_scan(&dir);
        let [SourceEvent::Service(Change::Applied(web))] = &result.events[..1] else {
            panic!("web not loaded: {:?}", summary(&result.events));
        };
        assert_eq!(web.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(changes(result), ["applied Service default/web"]);
    }

    #[test]
    fn synced_is_emitted_once_for_each_kind_after_the_first_scan() {
        let dir = TempDir::new().unwrap();
        write(&dir, "svc.yaml", WEB_SERVICE);
        let (mut manifests, result) = first_scan(&dir);
        let lines = summary(&result.events);
        assert_eq!(lines, ["applied Service default/web", "synced Service", "synced EndpointSlice", "synced Node",]);
        write(&dir, "node.yaml", NODE);
        assert_eq!(summary(&manifests.scan().events), ["applied Node demo-node"]);
    }

    #[test]
    fn an_empty_directory_is_synced() {
        let dir = TempDir::new().unwrap();
        let (_, result) = first_scan(&dir);
        assert_eq!(summary(&result.events), ["synced Service", "synced EndpointSlice", "synced Node"]);
    }

    #[test]
    fn malformed_files_are_reported_with_path_and_skipped() {
        let dir = TempDir::new().unwrap();
        write(&dir, "good.yaml", WEB_SERVICE);
        write(&dir, "syntax.yaml", "apiVersion: v1\nkind: Service\nmetadata: [unclosed\n");
        write(&dir, "types.yaml", &format!("{NODE}---\n{}", WEB_SERVICE.replace("port: 80", "port: eighty")));
        write(&dir, "untyped.yaml", "metadata:\n  name: x\n");
        write(&dir, "nameless.json", r#"{"apiVersion": "v1", "kind": "Node"}"#);
        let (_, result) = first_scan(&dir);
        let messages: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages.len(), 4, "{messages:#?}");
        for (error, file) in result.errors.iter().zip(["nameless.json", "syntax.yaml", "types.yaml", "untyped.yaml"]) {
            assert_eq!(error.path(), Some(dir.path().join(file).as_path()));
            assert!(error.to_string().starts_with(&dir.path().join(file).display().to_string()));
        }
        assert!(matches!(result.errors[0], ManifestError::Invalid { .. }), "{}", messages[0]);
        assert!(matches!(result.errors[1], ManifestError::Yaml { .. }), "{}", messages[1]);
        assert!(messages[2].contains("document 2: Service web"), "{}", messages[2]);
        assert!(messages[2].contains("spec.ports[0].port: invalid type"), "{}", messages[2]);
        assert!(messages[2].contains("line "), "{}", messages[2]);
        assert!(messages[3].contains("apiVersion"), "{}", messages[3]);
        // The good file still counts; nothing of the bad ones (not even the
        // valid Node before the bad Service in types.yaml).
        assert_eq!(changes(ScanResult { errors: vec![], ..result }), ["applied Service default/web"]);
    }

    #[test]
    fn decode_errors_in_lists_and_json_name_the_item() {
        let dir = TempDir::new().unwrap();
        let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": "oops"}}]}"#;
        write(&dir, "list.json", list);
        write(&dir, "node.json", r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": 5}}"#);
        let (_, result) = first_scan(&dir);
        let messages: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages.len(), 2, "{messages:#?}");
        assert!(messages[0].contains("document 1, items[0]: Node n: invalid type"), "{}", messages[0]);
        assert!(messages[1].contains("document 1: Node without a name: invalid type"), "{}", messages[1]);
        assert!(messages[1].contains("line 1"), "{}", messages[1]);
    }

    #[test]
    fn a_file_that_turns_malformed_keeps_its_objects() {
        let dir = TempDir::new().unwrap();
        write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
        let (mut manifests, _) = first_scan(&dir);
        write(&dir, "web.yaml", "apiVersion: v1\nkind: Service\nspec: [\n");
        let result = manifests.scan();
        assert!(result.events.is_empty(), "{:?}", summary(&result.events));
        assert_eq!(result.errors.len(), 1);
        // Reported once, not again while the file stays the same.
        assert!(manifests.scan().errors.is_empty());
        // Fixed again without the slice: now the slice goes.
        write(&dir, "web.yaml", WEB_SERVICE);
        assert_eq!(changes(manifests.scan()), ["deleted EndpointSlice default/web-abcde"]);
    }

    #[test]
    fn deleting_a_file_deletes_its_objects() {
        let dir = TempDir::new().unwrap();
        write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
        write(&dir, "node.yaml", NODE);
        let (mut manifests, _) = first_scan(&dir);
        fs::remove_file(dir.path().join("web.yaml")).unwrap();
        let result = manifests.scan();
        assert_eq!(summary(&result.events), ["deleted Service default/web", "deleted EndpointSlice default/web-abcde"]);
        let SourceEvent::Service(Change::Deleted(web)) = &result.events[0] else {
            panic!("not a deleted Service");
        };
        assert_eq!(web.metadata.name.as_deref(), Some("web"), "a deletion names the object");
    }

    #[test]
    fn editing_one_object_emits_exactly_one_applied() {
        let dir = TempDir::new().unwrap();
        let text = format!("{}---\n{}", service("a", "10.96.0.1"), service("b", "10.96.0.2"));
        write(&dir, "svc.yaml", &text);
        write(&dir, "node.yaml", NODE);
        let (mut manifests, _) = first_scan(&dir);
        // Same size, written right after the first read: found by content.
        write(&dir, "svc.yaml", &text.replace("10.96.0.2", "10.96.0.3"));
        let result = manifests.scan();
        assert_eq!(changes(result), ["applied Service default/b"]);
    }

    #[test]
    fn an_unchanged_rescan_emits_nothing() {
        let dir = TempDir::new().unwrap();
        write(&dir, "web.yaml", &format!("{WEB_SERVICE}---\n{WEB_SLICE}"));
        let (mut manifests, _) = first_scan(&dir);
        let result = manifests.scan();
        assert!(result.events.is_empty() && result.errors.is_empty());
        // Rewriting the same content, or reformatting it, changes no object.
        write(&dir, "web.yaml", &format!("# reformatted\n{WEB_SERVICE}---\n{WEB_SLICE}"));
        let result = manifests.scan();
        assert!(result.events.is_empty() && result.errors.is_empty());
    }

    #[test]
    fn services_come_before_endpoint_slices() {
        let dir = TempDir::new().unwrap();
        write(&dir, "a-slice.yaml", WEB_SLICE);
        write(&dir, "b-node.yaml", NODE);
        write(&dir, "c-service.yaml", WEB_SERVICE);
        let (_, result) = first_scan(&dir);
        assert_eq!(
            changes(result),
            ["applied Service default/web", "applied EndpointSlice default/web-abcde", "applied Node demo-node",]
        );
    }

    #[test]
    fn the_first_file_in_name_order_wins_and_the_other_is_refused() {
        let dir = TempDir::new().unwrap();
        write(&dir, "a.yaml", &service("web", "10.96.0.1"));
        write(&dir, "b.yaml", &service("web", "10.96.0.2"));
        let (mut manifests, result) = first_scan(&dir);
        assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.1"]);
        let refused = &result.refused;
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!((refused[0].kind.as_str(), refused[0].object.as_str()), ("Service", "default/web"));
        assert!(refused[0].detail.contains("b.yaml") && refused[0].detail.contains("a.yaml"), "{refused:?}");
        // Editing the refused copy changes nothing.
        write(&dir, "b.yaml", &service("web", "10.96.0.9"));
        assert!(manifests.scan().events.is_empty());
        // Removing the first brings in the other (read again: only its
        // identity was kept between scans).
        fs::remove_file(dir.path().join("a.yaml")).unwrap();
        let result = manifests.scan();
        assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.9"]);
        assert_eq!(changes(result), ["applied Service default/web"]);
        // And deleting that one too deletes the object.
        fs::remove_file(dir.path().join("b.yaml")).unwrap();
        assert_eq!(changes(manifests.scan()), ["deleted Service default/web"]);
    }

    #[test]
    fn the_first_copy_in_one_file_wins() {
        let dir = TempDir::new().unwrap();
        let text = format!("{}---\n{}", service("web", "10.96.0.1"), service("web", "10.96.0.2"));
        write(&dir, "a.yaml", &text);
        let (_, result) = first_scan(&dir);
        assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.1"]);
        assert_eq!(result.refused.len(), 1, "{:?}", result.refused);
        assert!(result.refused[0].detail.starts_with("twice in "), "{:?}", result.refused);
    }

    #[test]
    fn a_configmap_style_symlink_swap_is_seen() {
        use std::os::unix::fs::symlink;
        let dir = TempDir::new().unwrap();
        let (root, link) = (dir.path(), dir.path().join("..data"));
        for (version, ip) in [("..v1", "10.96.0.1"), ("..v2", "10.96.0.2")] {
            fs::create_dir(root.join(version)).unwrap();
            fs::write(root.join(version).join("svc.yaml"), service("web", ip)).unwrap();
        }
        symlink("..v1", &link).unwrap();
        symlink("..data/svc.yaml", root.join("svc.yaml")).unwrap();
        let (mut manifests, result) = first_scan(&dir);
        assert_eq!(changes(result), ["applied Service default/web"]);
        // The kubelet's atomic update: a new ..data link renamed over the old.
        symlink("..v2", root.join("..data_tmp")).unwrap();
        fs::rename(root.join("..data_tmp"), &link).unwrap();
        let result = manifests.scan();
        assert_eq!(applied_cluster_ips(&result.events), ["10.96.0.2"]);
        assert_eq!(changes(result), ["applied Service default/web"]);
    }

    #[test]
    fn an_unreadable_directory_changes_nothing() {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("manifests");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("svc.yaml"), WEB_SERVICE).unwrap();
        let mut manifests = ManifestDir::new(&path);
        manifests.scan();
        fs::rename(&path, dir.path().join("elsewhere")).unwrap();
        let result = manifests.scan();
        assert!(result.events.is_empty());
        assert!(matches!(result.errors[..], [ManifestError::ReadDir { .. }]));
    }

    #[test]
    fn the_demo_cluster_loads_without_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo");
        let result = ManifestDir::new(dir).scan();
        assert!(result.errors.is_empty(), "{:#?}", result.errors);
        let count = |kind: ResourceKind| {
            (result.events.iter())
                .filter(|e| match e {
                    SourceEvent::Service(Change::Applied(_)) => kind == ResourceKind::Service,
                    SourceEvent::EndpointSlice(Change::Applied(_)) => kind == ResourceKind::EndpointSlice,
                    SourceEvent::Node(Change::Applied(_)) => kind == ResourceKind::Node,
                    _ => false,
                })
                .count()
        };
        assert_eq!(count(ResourceKind::Service), 10);
        assert_eq!(count(ResourceKind::EndpointSlice), 9);
        assert_eq!(count(ResourceKind::Node), 1);
        let lines = summary(&result.events);
        assert!(lines.contains(&"applied Service kube-system/kube-dns".to_owned()));
        assert!(lines.contains(&"applied Node demo-node".to_owned()));
    }

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
        let first = batches.try_recv().expect("first batch before spawn returns");
        assert_eq!(
            summary(&first.0),
            ["applied Node demo-node", "synced Service", "synced EndpointSlice", "synced Node"]
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

    /// A scanned directory with a settle time, after its first scan.
    fn settling(dir: &TempDir, settle: Duration) -> ManifestDir {
        let mut manifests = ManifestDir::new(dir.path()).with_settle(settle);
        manifests.scan();
        manifests
    }

    #[test]
    fn a_file_written_in_place_is_read_once_quiet() {
        let dir = TempDir::new().unwrap();
        let mut manifests = settling(&dir, Duration::from_millis(400));
        write(&dir, "web.yaml", &service("web", "10.96.0.1"));
        let result = manifests.scan();
        assert!(result.events.is_empty(), "{:?}", summary(&result.events));
        let wait = result.settle_again.expect("asked to scan again");
        assert!(wait <= Duration::from_millis(400) && !wait.is_zero(), "{wait:?}");
        std::thread::sleep(wait + Duration::from_millis(20));
        let result = manifests.scan();
        assert_eq!(changes(result), ["applied Service default/web"]);
    }

    #[test]
    fn a_file_renamed_into_place_is_read_at_once() {
        let dir = TempDir::new().unwrap();
        let mut manifests = settling(&dir, Duration::from_secs(5));
        write(&dir, "web.yaml.tmp", &service("web", "10.96.0.1"));
        // The rename must come after the write by more than the kernel's
        // timestamp granularity (a clock tick) for ctime to tell.
        std::thread::sleep(Duration::from_millis(30));
        fs::rename(dir.path().join("web.yaml.tmp"), dir.path().join("web.yaml")).unwrap();
        let result = manifests.scan();
        assert_eq!(result.settle_again, None);
        assert_eq!(changes(result), ["applied Service default/web"]);
    }

    /// The issue's case: a file rewritten in place in two writes, the first
    /// half valid YAML on its own. Nothing is deleted in between.
    #[test]
    fn a_half_written_file_deletes_nothing() {
        let dir = TempDir::new().unwrap();
        let both = format!("{}---\n{}", service("web", "10.96.0.1"), service("api", "10.96.0.2"));
        write(&dir, "svc.yaml", &both);
        let mut manifests = ManifestDir::new(dir.path()).with_settle(Duration::from_millis(300));
        assert_eq!(changes(manifests.scan()), ["applied Service default/api", "applied Service default/web"]);
        std::thread::sleep(Duration::from_millis(30));
        write(&dir, "svc.yaml", &service("web", "10.96.0.1"));
        assert!(manifests.scan().events.is_empty(), "the first half is not read");
        std::thread::sleep(Duration::from_millis(100));
        write(&dir, "svc.yaml", &both);
        assert!(manifests.scan().events.is_empty());
        std::thread::sleep(Duration::from_millis(350));
        let result = manifests.scan();
        assert!(result.events.is_empty(), "the whole file is what it was: {:?}", summary(&result.events));
        assert_eq!(result.settle_again, None);
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
