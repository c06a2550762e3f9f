//! The manifest source (`--manifests DIR`): Services, EndpointSlices,
//! Nodes and ServiceCIDRs read from files instead of the Kubernetes API.
//!
//! It emits exactly the [`SourceEvent`](crate::msgs::SourceEvent)s the API source emits, so nothing
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
//!   `discovery.k8s.io/v1` EndpointSlice, `v1` Node and
//!   `networking.k8s.io/v1` ServiceCIDR are read into the `k8s_openapi`
//!   types; other kinds are ignored (debug log).
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
//! - `scan`: [`ManifestDir`] is the synchronous core: each
//!   [`ManifestDir::scan`] re-reads the files that changed and returns the
//!   events since the last scan.
//! - `decode`: one file's documents, lists and objects, decoded into the
//!   watched kinds.
//! - `watch`: [`spawn`] runs the scans on a thread driven by inotify (or
//!   polling when inotify is unavailable) and hands each non-empty batch to
//!   a sink.
//! - `error`: [`ManifestError`], and the [`Duplicate`]s refused.

mod decode;
mod error;
mod scan;
#[cfg(test)]
mod testing;
mod watch;

pub use error::{DecodeError, Duplicate, ManifestError};
pub use scan::{Chunks, ManifestDir, ScanResult, SETTLE};
pub use watch::{spawn, spawn_polling, spawn_reporting, ManifestWatcher};
