//! One object as the API server sent it, decoded on its own, or refused.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use tracing::warn;

use crate::msgs::source::ResourceKind;

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
    pub(super) fn log(&self, kind: ResourceKind, outcome: &str) {
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
