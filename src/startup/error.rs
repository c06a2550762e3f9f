//! Why the daemon stopped before it served.

use crate::actors::source::kube::KubeSourceError;
use crate::actors::source::manifests::ManifestError;
use crate::config::ConfigError;
use crate::http::HttpError;
use crate::instance::InstanceError;
use crate::proxier::ProxierError;

use super::conntrack::ConntrackSetupError;
use super::families::PrimaryFamilyUnsupported;

/// Errors that stop the daemon before it starts.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("reading manifests: {0}")]
    Manifests(#[from] ManifestError),
    #[error("reading the node's addresses: {0}")]
    Addresses(#[source] std::io::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] KubeSourceError),
    #[error(transparent)]
    Instance(#[from] InstanceError),
    #[error("--manifests {}: {source}", dir.display())]
    ManifestDir {
        dir: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The mode's kernel state or its proxier.
    #[error(transparent)]
    Proxier(#[from] ProxierError),
    #[error("watching signals: {0}")]
    Signals(#[source] nix::Error),
    #[error("starting the HTTP servers: {0}")]
    Http(#[source] HttpError),
    #[error(transparent)]
    PrimaryFamily(#[from] PrimaryFamilyUnsupported),
    /// Upstream's conntrack settings could not be applied.
    #[error(transparent)]
    ConntrackSetup(#[from] ConntrackSetupError),
}
