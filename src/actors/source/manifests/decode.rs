//! Reading one manifest file: its YAML documents or JSON values, lists
//! and objects, decoded into the watched kinds; any problem rejects the
//! whole file with an error naming where it is.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::Metadata;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, warn};

use super::error::{DecodeError, Duplicate, ManifestError};
use crate::msgs::source::{Change, ResourceKind, SourceEvent};

/// The namespace of namespaced objects that name none.
const DEFAULT_NAMESPACE: &str = "default";

impl Duplicate {
    pub(super) fn of(key: &ObjectKey, detail: String) -> Duplicate {
        let object =
            if key.namespace.is_empty() { key.name.clone() } else { format!("{}/{}", key.namespace, key.name) };
        Duplicate { kind: key.kind.to_string(), object, detail }
    }
}

/// The syntax of a manifest file, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Yaml,
    Json,
}

impl Format {
    pub(super) fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "yaml" | "yml" => Some(Self::Yaml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Identity of an object: kind, namespace (empty for Nodes and
/// ServiceCIDRs), name. Orders Services before EndpointSlices before Nodes
/// before ServiceCIDRs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ObjectKey {
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
pub(super) enum Object {
    Service(Arc<Service>),
    EndpointSlice(Arc<EndpointSlice>),
    Node(Arc<Node>),
    ServiceCidr(Arc<ServiceCIDR>),
}

/// An object with the digest of its manifest text (equal digests: the
/// same object). Between scans only its identity is kept ([`Held::kept`]):
/// the consumer got the whole object in its event, and at 10,000 services
/// keeping every whole one cost ≈ 55 MB.
#[derive(Debug, Clone)]
pub(super) struct Held {
    digest: u64,
    /// None: only the identity (the key) is kept.
    pub(super) object: Option<Object>,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

impl Held {
    /// The key alone (all a deletion needs) for Services, EndpointSlices
    /// and ServiceCIDRs; our Node whole, as its deletion reports its last state.
    pub(super) fn kept(&self) -> Held {
        let object = self.object.as_ref().filter(|o| matches!(o, Object::Node(_))).cloned();
        Held { digest: self.digest, object }
    }
}

impl ObjectKey {
    /// An object with this key's name and namespace and nothing else: what
    /// a deletion carries.
    pub(super) fn identity(&self) -> Object {
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
            ResourceKind::ServiceCidr => {
                Object::ServiceCidr(Arc::new(ServiceCIDR { metadata: meta(self), ..ServiceCIDR::default() }))
            }
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

pub(super) type Objects = BTreeMap<ObjectKey, Held>;

impl Object {
    fn kind_and_meta(&self) -> (ResourceKind, &ObjectMeta) {
        match self {
            Self::Service(o) => (ResourceKind::Service, &o.metadata),
            Self::EndpointSlice(o) => (ResourceKind::EndpointSlice, &o.metadata),
            Self::Node(o) => (ResourceKind::Node, &o.metadata),
            Self::ServiceCidr(o) => (ResourceKind::ServiceCidr, &o.metadata),
        }
    }

    /// The object's key; `None` without a name.
    pub(super) fn key(&self) -> Option<ObjectKey> {
        let (kind, meta) = self.kind_and_meta();
        let name = meta.name.clone().filter(|name| !name.is_empty())?;
        let namespace = match kind {
            ResourceKind::Node | ResourceKind::ServiceCidr => String::new(),
            _ => meta.namespace.clone().unwrap_or_default(),
        };
        Some(ObjectKey { kind, namespace, name })
    }

    pub(super) fn applied(&self) -> SourceEvent {
        match self {
            Self::Service(o) => SourceEvent::Service(Change::Applied(o.clone())),
            Self::EndpointSlice(o) => SourceEvent::EndpointSlice(Change::Applied(o.clone())),
            Self::Node(o) => SourceEvent::Node(Change::Applied(o.clone())),
            Self::ServiceCidr(o) => SourceEvent::ServiceCidr(Change::Applied(o.clone())),
        }
    }

    pub(super) fn deleted(&self) -> SourceEvent {
        match self {
            Self::Service(o) => SourceEvent::Service(Change::Deleted(o.clone())),
            Self::EndpointSlice(o) => SourceEvent::EndpointSlice(Change::Deleted(o.clone())),
            Self::Node(o) => SourceEvent::Node(Change::Deleted(o.clone())),
            Self::ServiceCidr(o) => SourceEvent::ServiceCidr(Change::Deleted(o.clone())),
        }
    }
}

/// Parses one file into its objects; any problem rejects the whole file.
/// The objects of one file; copies of an object already read from it are
/// refused (logged, and added to `duplicates`). Documents are read one at a
/// time and a list's items one at a time (see [`DocumentSeed`]): no value
/// tree of a whole file or list is built.
pub(super) fn parse_file(path: &Path, bytes: &[u8], duplicates: &mut Vec<Duplicate>) -> Result<Objects, ManifestError> {
    let mut objects = Objects::new();
    read_file(path, bytes, Out::new(&mut objects, Keep::Whole), duplicates)?;
    Ok(objects)
}

/// A file read for what a scan keeps of it: every object decoded (so any
/// problem rejects the whole file, as [`parse_file`]) but kept only as
/// [`Held::kept`] keeps it, and which documents are lists, so that
/// [`each_object`] can read the file again handing its objects over one
/// at a time.
#[derive(Debug, Default)]
pub(super) struct Outline {
    pub(super) objects: Objects,
    /// The lists by document index, with their items' type.
    lists: BTreeMap<usize, Option<TypeMeta>>,
}

/// The [`Outline`] of a file; its errors are [`parse_file`]'s.
pub(super) fn outline_file(
    path: &Path,
    bytes: &[u8],
    duplicates: &mut Vec<Duplicate>,
) -> Result<Outline, ManifestError> {
    let mut outline = Outline::default();
    let mut out = Out::new(&mut outline.objects, Keep::Kept);
    out.lists = Some(&mut outline.lists);
    read_file(path, bytes, out, duplicates)?;
    Ok(outline)
}

/// Reads a file outlined by [`outline_file`] again and hands each object to
/// `hand` as it is decoded (a later copy of an object too: the outline has
/// the first), holding none.
pub(super) fn each_object(
    path: &Path,
    bytes: &[u8],
    outline: &Outline,
    hand: &mut dyn FnMut(ObjectKey, Object),
) -> Result<(), ManifestError> {
    let mut objects = Objects::new();
    let mut out = Out::new(&mut objects, Keep::Hand(hand));
    out.known_lists = Some(&outline.lists);
    read_file(path, bytes, out, &mut Vec::new())
}

fn read_file(path: &Path, bytes: &[u8], mut out: Out, duplicates: &mut Vec<Duplicate>) -> Result<(), ManifestError> {
    let format = Format::of(path).unwrap_or(Format::Yaml);
    fn stopped<E>(
        stop: Stop<E>,
        syntax: impl Fn(E) -> ManifestError,
        path: &Path,
        format: Format,
        bytes: &[u8],
    ) -> ManifestError {
        match stop {
            Stop::Failed(failure) => failure.into_error(path, format, bytes),
            Stop::Syntax(source) => syntax(source),
        }
    }
    match format {
        Format::Yaml => {
            let syntax = |source| ManifestError::Yaml { path: path.to_owned(), source };
            for (index, document) in yaml_serde::Deserializer::from_slice(bytes).enumerate() {
                read_document(document, index, &mut out).map_err(|stop| stopped(stop, syntax, path, format, bytes))?;
            }
        }
        Format::Json => {
            let syntax = |source| ManifestError::Json { path: path.to_owned(), source };
            // The stream finds where each value ends; each is then read on its own.
            let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<IgnoredAny>();
            let (mut start, mut index) = (0, 0);
            while let Some(value) = values.next() {
                value.map_err(syntax)?;
                let end = values.byte_offset();
                let mut document = serde_json::Deserializer::from_slice(&bytes[start..end]);
                read_document(&mut document, index, &mut out)
                    .map_err(|stop| stopped(stop, syntax, path, format, bytes))?;
                (start, index) = (end, index + 1);
            }
        }
    }
    duplicates.extend(out.twice.into_iter().map(|(key, at)| {
        Duplicate::of(&key, format!("twice in {}; the first is used, the one at {at} refused", path.display()))
    }));
    Ok(())
}

/// Whether `bytes` (the file at `path`) holds a Node named `name`, read
/// without decoding any object: the file the start-up decodes to find its
/// Node ([`super::ManifestDir::find_node`]). False for a file that does not
/// parse.
pub(super) fn names_node(path: &Path, bytes: &[u8], name: &str) -> bool {
    /// What a document tells of its type and name, and its items' (other
    /// fields skipped unread).
    #[derive(Deserialize)]
    struct Outline {
        #[serde(rename = "apiVersion")]
        api_version: Option<String>,
        kind: Option<String>,
        metadata: Option<Named>,
        items: Option<Vec<Outline>>,
    }
    #[derive(Deserialize)]
    struct Named {
        name: Option<String>,
    }
    let is_ours = |o: &Outline, default: (Option<&str>, Option<&str>)| {
        let api_version = o.api_version.as_deref().or(default.0);
        let kind = o.kind.as_deref().or(default.1);
        (api_version, kind) == (Some("v1"), Some("Node"))
            && o.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some(name)
    };
    let has_ours = |document: Outline| match document.kind.as_deref() {
        Some(kind) if kind.ends_with("List") => {
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            let default = (document.api_version.as_deref().filter(|_| item_kind.is_some()), item_kind);
            document.items.iter().flatten().any(|item| is_ours(item, default))
        }
        _ => is_ours(&document, (None, None)),
    };
    match Format::of(path).unwrap_or(Format::Yaml) {
        Format::Yaml => {
            yaml_serde::Deserializer::from_slice(bytes).filter_map(|d| Outline::deserialize(d).ok()).any(has_ours)
        }
        Format::Json => {
            serde_json::Deserializer::from_slice(bytes).into_iter::<Outline>().map_while(Result::ok).any(has_ours)
        }
    }
}

/// The Node named `name` among a file's objects.
pub(super) fn node_named(objects: &Objects, name: &str) -> Option<Arc<Node>> {
    objects.values().find_map(|held| match &held.object {
        Some(Object::Node(node)) if node.metadata.name.as_deref() == Some(name) => Some(node.clone()),
        _ => None,
    })
}

/// What is kept of each object read.
enum Keep<'h> {
    /// The whole object.
    Whole,
    /// What [`Held::kept`] keeps.
    Kept,
    /// Each object is handed over as it is read; nothing is kept.
    Hand(&'h mut dyn FnMut(ObjectKey, Object)),
}

/// Where a file's documents go: its objects, and the copies refused.
struct Out<'a> {
    objects: &'a mut Objects,
    keep: Keep<'a>,
    twice: Vec<(ObjectKey, Location)>,
    /// Where the lists found are noted, by document index.
    lists: Option<&'a mut BTreeMap<usize, Option<TypeMeta>>>,
    /// The file's lists, known from an earlier reading.
    known_lists: Option<&'a BTreeMap<usize, Option<TypeMeta>>>,
}

impl<'a> Out<'a> {
    fn new(objects: &'a mut Objects, keep: Keep<'a>) -> Self {
        Out { objects, keep, twice: Vec::new(), lists: None, known_lists: None }
    }

    /// What of an object read is held until its list is known to be one.
    fn held(&self, held: Held) -> Held {
        match self.keep {
            Keep::Whole | Keep::Hand(_) => held,
            Keep::Kept => held.kept(),
        }
    }

    /// Keeps the first copy of an object; a later one is refused.
    fn insert(&mut self, key: ObjectKey, held: Held, at: Location) {
        if let Keep::Hand(hand) = &mut self.keep {
            if let Some(object) = held.object {
                hand(key, object);
            }
            return;
        }
        let held = self.held(held);
        match self.objects.entry(key) {
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(held);
            }
            std::collections::btree_map::Entry::Occupied(slot) => {
                warn!(object = %slot.key(), location = %at, "the same object twice in one file: the first one is used, this one refused");
                self.twice.push((slot.key().clone(), at));
            }
        }
    }
}

/// Why reading a document stopped: the document was refused, or the
/// parser's own error (syntax).
enum Stop<E> {
    Failed(DocFailure),
    Syntax(E),
}

/// Reads one document into `out`.
fn read_document<'de, D: Deserializer<'de>>(document: D, index: usize, out: &mut Out) -> Result<(), Stop<D::Error>> {
    let mut failure = None;
    let reader = DocumentReader { at: Location { document: index, item: None }, out, failure: &mut failure };
    match (Shape(reader).deserialize(document), failure) {
        (_, Some(failure)) => Err(Stop::Failed(failure)),
        (Err(error), None) => Err(Stop::Syntax(error)),
        (Ok(Found::Read | Found::Null), None) => Ok(()),
        (Ok(Found::Other(found)), None) => {
            let problem = format!("expected an object, found {found}");
            Err(Stop::Failed(DocFailure::invalid(Location { document: index, item: None }, problem)))
        }
    }
}

/// What a value turned out to be where a map or a list is read.
enum Found {
    /// A map or list, read.
    Read,
    Null,
    /// Something else, by its name ("a string").
    Other(&'static str),
}

/// Reads a map or a list as it is parsed; anything else is named.
trait Container<'de>: Sized {
    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Found::Other("an object"))
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::Other("a list"))
    }
}

/// The visitor (and seed) of a [`Container`].
struct Shape<C>(C);

impl<'de, C: Container<'de>> DeserializeSeed<'de> for Shape<C> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Found, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, C: Container<'de>> Visitor<'de> for Shape<C> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a manifest value")
    }

    fn visit_unit<E>(self) -> Result<Found, E> {
        Ok(Found::Null)
    }

    fn visit_none<E>(self) -> Result<Found, E> {
        Ok(Found::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Found, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Found, E> {
        Ok(Found::Other("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Found, E> {
        Ok(Found::Other("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Found, E> {
        Ok(Found::Other("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Found, E> {
        Ok(Found::Other("a number"))
    }

    fn visit_str<E>(self, _: &str) -> Result<Found, E> {
        Ok(Found::Other("a string"))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Found, A::Error> {
        self.0.map(map)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Found, A::Error> {
        self.0.seq(seq)
    }
}

/// The error that stops the parser once a document is refused (the
/// reason is in the reader's `failure`).
fn refused<E: serde::de::Error>(failure: &mut Option<DocFailure>, refusal: DocFailure) -> E {
    failure.get_or_insert(refusal);
    E::custom("manifest document refused")
}

/// A document: its fields other than `items` are built as a value; a
/// list's items are decoded one at a time as they are read.
struct DocumentReader<'a, 'o> {
    at: Location,
    out: &'a mut Out<'o>,
    failure: &'a mut Option<DocFailure>,
}

impl<'de> Container<'de> for DocumentReader<'_, '_> {
    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let at = self.at;
        let mut fields = serde_json::Map::new();
        let mut items = Found::Null;
        let mut read = ItemsRead::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                let known = self.out.known_lists.and_then(|lists| lists.get(&at.document));
                let so_far = known.map_or_else(|| ListSoFar::of(&fields), |item| ListSoFar::List(item.clone()));
                let reader = ItemsReader { at, so_far, read: &mut read, out: self.out };
                items = map.next_value_seed(Shape(reader))?;
            } else {
                fields.insert(key, map.next_value()?);
            }
        }
        let document = Value::Object(fields);
        let type_meta = (TypeMeta::read(&document, None))
            .map_err(|p| refused(self.failure, DocFailure::invalid(at, p.to_string())))?;
        let result = match type_meta.kind.ends_with("List") {
            true => {
                if let Some(lists) = &mut self.out.lists {
                    lists.insert(at.document, type_meta.list_item());
                }
                add_items(items, read, &type_meta, at, self.out)
            }
            false => add_object(document, &type_meta, at, self.out),
        };
        result.map_err(|failure| refused(self.failure, failure))?;
        Ok(Found::Read)
    }
}

/// What a document's fields read before its `items` say about it.
#[derive(Clone)]
enum ListSoFar {
    /// Not known yet (its apiVersion or kind comes later).
    Unknown,
    /// A list; the type of items that name none.
    List(Option<TypeMeta>),
    /// Not a list: its items are not read.
    NotList,
}

impl ListSoFar {
    fn of(fields: &serde_json::Map<String, Value>) -> ListSoFar {
        let field = |name| fields.get(name).and_then(Value::as_str);
        match (field("apiVersion"), field("kind")) {
            (_, Some(kind)) if !kind.ends_with("List") => ListSoFar::NotList,
            (Some(api_version), Some(kind)) => {
                ListSoFar::List(TypeMeta { api_version: api_version.to_owned(), kind: kind.to_owned() }.list_item())
            }
            _ => ListSoFar::Unknown,
        }
    }
}

/// A list's items as read: decoded as they came (those whose type was
/// known then), or kept as values until the list's own type is known.
#[derive(Default)]
struct ItemsRead {
    decoded: Vec<(Location, ObjectKey, Held)>,
    waiting: Vec<(Location, Value)>,
    /// The first item refused; the rest were skipped.
    failure: Option<DocFailure>,
}

struct ItemsReader<'a, 'o> {
    at: Location,
    so_far: ListSoFar,
    read: &'a mut ItemsRead,
    out: &'a mut Out<'o>,
}

impl<'de> Container<'de> for ItemsReader<'_, '_> {
    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let default = match &self.so_far {
            ListSoFar::NotList => {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                return Ok(Found::Read);
            }
            ListSoFar::List(default) => default.as_ref(),
            ListSoFar::Unknown => None,
        };
        let known = self.out.known_lists.is_some() && matches!(self.so_far, ListSoFar::List(_));
        let mut index = 0;
        while self.read.failure.is_none() {
            let Some(item) = seq.next_element::<Value>()? else { return Ok(Found::Read) };
            let at = Location { item: Some(index), ..self.at };
            index += 1;
            match TypeMeta::read(&item, default) {
                Ok(meta) => match decode_object(item, &meta, at) {
                    // Known to be a list from an earlier reading: handed over now.
                    Ok(Some((key, held))) if known => self.out.insert(key, held, at),
                    Ok(Some((key, held))) => self.read.decoded.push((at, key, self.out.held(held))),
                    Ok(None) => {}
                    Err(failure) => self.read.failure = Some(failure),
                },
                Err(_) => self.read.waiting.push((at, item)),
            }
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Found::Read)
    }
}

/// A list's items into `out`, once the list is known to be one.
fn add_items(
    items: Found,
    read: ItemsRead,
    type_meta: &TypeMeta,
    at: Location,
    out: &mut Out,
) -> Result<(), DocFailure> {
    if let Found::Other(found) = items {
        return Err(DocFailure::invalid(at, format!("items must be a list, found {found}")));
    }
    if let Some(failure) = read.failure {
        return Err(failure);
    }
    for (at, key, held) in read.decoded {
        out.insert(key, held, at);
    }
    let item_type = type_meta.list_item();
    for (at, item) in read.waiting {
        let item_meta =
            TypeMeta::read(&item, item_type.as_ref()).map_err(|p| DocFailure::invalid(at, p.to_string()))?;
        if let Some((key, held)) = decode_object(item, &item_meta, at)? {
            out.insert(key, held, at);
        }
    }
    Ok(())
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

/// Why an object's `apiVersion` and `kind` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TypeMetaError {
    /// What JSON type the value is instead.
    #[error("expected an object, found {0}")]
    NotAnObject(&'static str),
    #[error("missing or non-string {0}")]
    Missing(&'static str),
}

/// An object's `apiVersion` and `kind`.
#[derive(Debug, Clone)]
struct TypeMeta {
    api_version: String,
    kind: String,
}

impl TypeMeta {
    /// Reads them from an object, or takes `default` if it has neither.
    fn read(value: &Value, default: Option<&TypeMeta>) -> Result<Self, TypeMetaError> {
        let Value::Object(map) = value else {
            return Err(TypeMetaError::NotAnObject(json_type(value)));
        };
        let field = |name| map.get(name).and_then(Value::as_str).map(str::to_owned);
        match (field("apiVersion"), field("kind"), default) {
            (Some(api_version), Some(kind), _) => Ok(Self { api_version, kind }),
            (None, None, Some(default)) => Ok(default.clone()),
            (None, _, _) => Err(TypeMetaError::Missing("apiVersion")),
            (_, None, _) => Err(TypeMetaError::Missing("kind")),
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

fn add_object(value: Value, type_meta: &TypeMeta, at: Location, out: &mut Out) -> Result<(), DocFailure> {
    if let Some((key, held)) = decode_object(value, type_meta, at)? {
        out.insert(key, held, at);
    }
    Ok(())
}

/// An object of a watched kind with its key; `None` for other kinds.
fn decode_object(value: Value, type_meta: &TypeMeta, at: Location) -> Result<Option<(ObjectKey, Held)>, DocFailure> {
    let object = match (type_meta.api_version.as_str(), type_meta.kind.as_str()) {
        ("v1", "Service") => Object::Service(Arc::new(namespaced(decode(&value, type_meta, at)?))),
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            Object::EndpointSlice(Arc::new(namespaced(decode(&value, type_meta, at)?)))
        }
        ("v1", "Node") => Object::Node(Arc::new(decode(&value, type_meta, at)?)),
        ("networking.k8s.io/v1", "ServiceCIDR") => Object::ServiceCidr(Arc::new(decode(&value, type_meta, at)?)),
        (api_version, kind) => {
            debug!(%api_version, %kind, location = %at, "ignoring a kind the proxy does not use");
            return Ok(None);
        }
    };
    let key =
        object.key().ok_or_else(|| DocFailure::invalid(at, format!("{} without metadata.name", type_meta.kind)))?;
    Ok(Some((key, Held { digest: value_digest(&value), object: Some(object) })))
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
#[cfg(test)]
mod tests {
    use super::*;

    use tempfile::TempDir;

    use super::super::scan::{ManifestDir, ScanResult};
    use super::super::testing::*;

    #[test]
    fn equal_objects_digest_equally_whatever_the_key_order() {
        let a: Value = serde_json::from_str(r#"{"a": 1, "b": {"c": [1, "x"], "d": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b": {"d": null, "c": [1, "x"]}, "a": 1}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"a": 1, "b": {"c": [1, "y"], "d": null}}"#).unwrap();
        assert_eq!(value_digest(&a), value_digest(&b));
        assert_ne!(value_digest(&a), value_digest(&c));
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

    /// Objects of `text` read as file `name`, as "Kind ns/name" lines, or its error.
    fn parse(name: &str, text: &str) -> Result<Vec<String>, String> {
        let objects = parse_file(Path::new(name), text.as_bytes(), &mut Vec::new()).map_err(|e| e.to_string())?;
        Ok(objects.keys().map(ToString::to_string).collect())
    }

    #[test]
    fn list_items_before_the_lists_kind_are_read_one_by_one() {
        // kubectl's JSON order: apiVersion, items, kind.
        let list = r#"{"apiVersion": "v1", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "ns"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"}}], "kind": "List"}"#;
        assert_eq!(parse("l.json", list).unwrap(), ["Service default/b", "Service ns/a"]);
        // A typed list's items name no type: they wait for the list's kind.
        let nodes = r#"{"apiVersion": "v1", "items": [{"metadata": {"name": "n1"}}], "kind": "NodeList"}"#;
        assert_eq!(parse("n.json", nodes).unwrap(), ["Node n1"]);
        let nodes = "items:\n  - metadata: {name: n1}\napiVersion: v1\nkind: NodeList\n";
        assert_eq!(parse("n.yaml", nodes).unwrap(), ["Node n1"]);
        // An item without a type in a plain List is refused, wherever the kind is.
        for list in [
            r#"{"apiVersion": "v1", "items": [{"metadata": {"name": "n1"}}], "kind": "List"}"#,
            r#"{"apiVersion": "v1", "kind": "List", "items": [{"metadata": {"name": "n1"}}]}"#,
        ] {
            let error = parse("l.json", list).unwrap_err();
            assert!(error.contains("document 1, items[0]: missing or non-string apiVersion"), "{error}");
        }
    }

    #[test]
    fn a_list_item_that_does_not_decode_rejects_the_file_naming_the_item() {
        for kind_first in [true, false] {
            let items = r#""items": [
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a"}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b"}, "spec": {"ports": 5}}]"#;
            let list = match kind_first {
                true => format!(r#"{{"apiVersion": "v1", "kind": "List", {items}}}"#),
                false => format!(r#"{{"apiVersion": "v1", {items}, "kind": "List"}}"#),
            };
            let error = parse("l.json", &list).unwrap_err();
            assert!(error.contains("document 1, items[1]: Service b: invalid type"), "{error}");
        }
        let error = parse("l.yaml", "apiVersion: v1\nkind: List\nitems: {a: 1}\n").unwrap_err();
        assert!(error.contains("document 1: items must be a list, found an object"), "{error}");
        let error = parse("l.yaml", "--- just text\n").unwrap_err();
        assert!(error.contains("document 1: expected an object, found a string"), "{error}");
    }

    #[test]
    fn items_of_a_document_that_is_no_list_are_not_read() {
        let text = r#"{"apiVersion": "v1", "kind": "ConfigMap", "items": [{"bad": true}], "metadata": {"name": "c"}}
            {"apiVersion": "v1", "kind": "Node", "items": 7, "metadata": {"name": "n"}}"#;
        assert_eq!(parse("c.json", text).unwrap(), ["Node n"]);
    }

    #[test]
    fn duplicates_within_a_list_keep_the_first() {
        let list = r#"{"apiVersion": "v1", "items": [
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"copy": "1"}}},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"copy": "2"}}}], "kind": "List"}"#;
        let mut duplicates = Vec::new();
        let objects = parse_file(Path::new("l.json"), list.as_bytes(), &mut duplicates).unwrap();
        let Some(Object::Node(node)) = objects.values().next().and_then(|h| h.object.clone()) else { panic!() };
        assert_eq!(node.metadata.labels.as_ref().and_then(|l| l.get("copy")).map(String::as_str), Some("1"));
        assert_eq!(duplicates.len(), 1);
        assert!(duplicates[0].detail.contains("document 1, items[1]"), "{:?}", duplicates[0]);
    }

    #[test]
    fn a_service_cidr_is_read_cluster_scoped_and_goes_with_its_file() {
        let dir = TempDir::new().unwrap();
        write(&dir, "cidr.yaml", SERVICE_CIDR);
        write(&dir, "web.yaml", WEB_SERVICE);
        let (mut manifests, result) = first_scan(&dir);
        let applied: Vec<_> = (result.events.iter())
            .filter_map(|e| match e {
                SourceEvent::ServiceCidr(Change::Applied(c)) => Some(c.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(applied.len(), 1);
        assert_eq!(applied[0].metadata.namespace, None, "cluster-scoped: no namespace defaulted");
        let cidrs = applied[0].spec.as_ref().and_then(|s| s.cidrs.clone());
        assert_eq!(cidrs, Some(vec!["10.96.0.0/16".to_string(), "fd00:96::/112".to_string()]));
        let lines = summary(&result.events);
        assert!(lines.contains(&"synced ServiceCIDR".to_string()), "{lines:?}");
        assert_eq!(changes(result), ["applied Service default/web", "applied ServiceCIDR kubernetes"]);
        // Changed, then deleted with its file (by name).
        write(&dir, "cidr.yaml", &SERVICE_CIDR.replace("10.96.0.0/16", "10.97.0.0/16"));
        assert_eq!(changes(manifests.scan()), ["applied ServiceCIDR kubernetes"]);
        std::fs::remove_file(dir.path().join("cidr.yaml")).unwrap();
        let result = manifests.scan();
        let [SourceEvent::ServiceCidr(Change::Deleted(gone))] = &result.events[..] else {
            panic!("{:?}", summary(&result.events));
        };
        assert_eq!(gone.metadata.name.as_deref(), Some("kubernetes"));
        // One that does not decode rejects its file, naming it.
        write(&dir, "bad.yaml", &SERVICE_CIDR.replace("cidrs: [10.96.0.0/16, fd00:96::/112]", "cidrs: 10.96.0.0/16"));
        let result = manifests.scan();
        let messages: Vec<String> = result.errors.iter().map(ToString::to_string).collect();
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].contains("ServiceCIDR kubernetes") && messages[0].contains("spec.cidrs"),
            "{}",
            messages[0]
        );
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
                    SourceEvent::ServiceCidr(Change::Applied(_)) => kind == ResourceKind::ServiceCidr,
                    _ => false,
                })
                .count()
        };
        assert_eq!(count(ResourceKind::Service), 10);
        assert_eq!(count(ResourceKind::EndpointSlice), 9);
        assert_eq!(count(ResourceKind::Node), 1);
        assert_eq!(count(ResourceKind::ServiceCidr), 1);
        let lines = summary(&result.events);
        assert!(lines.contains(&"applied Service kube-system/kube-dns".to_owned()));
        assert!(lines.contains(&"applied Node demo-node".to_owned()));
    }
}
