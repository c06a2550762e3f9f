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
use serde::de::DeserializeOwned;
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
/// refused (logged, and added to `duplicates`).
pub(super) fn parse_file(path: &Path, bytes: &[u8], duplicates: &mut Vec<Duplicate>) -> Result<Objects, ManifestError> {
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

/// Whether `bytes` (the file at `path`) holds a Node named `name`, read
/// without decoding any object: the file the start-up decodes to find its
/// Node ([`super::ManifestDir::find_node`]). False for a file that does not
/// parse.
pub(super) fn names_node(path: &Path, bytes: &[u8], name: &str) -> bool {
    let format = Format::of(path).unwrap_or(Format::Yaml);
    let Ok(documents) = read_documents(path, format, bytes) else { return false };
    let is_ours = |value: &Value, default: Option<&TypeMeta>| {
        let node =
            TypeMeta::read(value, default).is_ok_and(|t| (t.api_version.as_str(), t.kind.as_str()) == ("v1", "Node"));
        node && value.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
    };
    documents.iter().any(|document| match TypeMeta::read(document, None) {
        Ok(t) if t.kind.ends_with("List") => {
            let items = document.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            items.iter().any(|item| is_ours(item, t.list_item().as_ref()))
        }
        _ => is_ours(document, None),
    })
}

/// The Node named `name` among a file's objects.
pub(super) fn node_named(objects: &Objects, name: &str) -> Option<Arc<Node>> {
    objects.values().find_map(|held| match &held.object {
        Some(Object::Node(node)) if node.metadata.name.as_deref() == Some(name) => Some(node.clone()),
        _ => None,
    })
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

fn add_document(document: Value, at: Location, out: &mut Out) -> Result<(), DocFailure> {
    if document.is_null() {
        return Ok(());
    }
    let type_meta = TypeMeta::read(&document, None).map_err(|p| DocFailure::invalid(at, p.to_string()))?;
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
        let item_meta =
            TypeMeta::read(&item, item_type.as_ref()).map_err(|p| DocFailure::invalid(at, p.to_string()))?;
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
        ("networking.k8s.io/v1", "ServiceCIDR") => Object::ServiceCidr(Arc::new(decode(&value, type_meta, at)?)),
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
