//! Sources of Services, EndpointSlices and the Node: the manifest directory
//! (here) and the Kubernetes API. Both send [`crate::msgs::SourceBatch`]es;
//! what a source says while it waits for its first lists is in [`wait`].

pub mod kube;
pub mod manifests;
pub mod wait;
