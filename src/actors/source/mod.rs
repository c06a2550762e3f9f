//! Sources of Services, EndpointSlices and the Node: the manifest directory
//! (here) and the Kubernetes API. Both send [`crate::msgs::SourceBatch`]es.

pub mod kube;
pub mod manifests;
