//! What goes wrong with the manifest directory or its files, and the
//! copies of objects refused.

use std::io;
use std::path::{Path, PathBuf};

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
