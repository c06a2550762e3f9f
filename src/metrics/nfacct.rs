//! iptables mode's nfacct counters as upstream's metrics
//! (`kubeproxy_iptables_ct_state_invalid_dropped_packets_total`,
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`): the
//! packet count of a kernel accounting object, read at each scrape as
//! upstream's `nfacctMetricCollector` does. Only the counters the rules
//! count into are served; one that cannot be read at a scrape has no
//! sample then (upstream's collector skips it too).
//!
//! The reading is a port ([`NfacctReader`]): the daemon plugs in its
//! netlink client, tests a closure.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Reads one accounting object's packet count (its name as argument).
pub type NfacctReader = Arc<dyn Fn(&'static str) -> BoxFuture<'static, Result<u64, NfacctReadError>> + Send + Sync>;

/// Why an accounting object's count could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NfacctReadError {
    #[error("nfacct object {0} is gone")]
    Gone(&'static str),
    /// The reader's own error.
    #[error(transparent)]
    Read(Box<dyn std::error::Error + Send + Sync>),
}

/// The nfacct object behind each metric, the metric (without `_total`, which
/// the encoder appends) and upstream's help.
const METRICS: [(&str, &str, &str); 2] = [
    (
        crate::plan::iptables::context::NFACCT_CT_STATE_INVALID,
        "kubeproxy_iptables_ct_state_invalid_dropped_packets",
        "packets dropped by iptables to work around conntrack problems.",
    ),
    (
        crate::plan::iptables::context::NFACCT_LOCALHOST_NODEPORTS,
        "kubeproxy_iptables_localhost_nodeports_accepted_packets",
        "Number of packets accepted on nodeports of loopback interface.",
    ),
];

/// The counters served and their last reading.
#[derive(Default)]
pub(super) struct NfacctMetrics {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    reader: Option<NfacctReader>,
    /// Each served counter (an object name of [`METRICS`]) and its last
    /// packet count; `None` when the last read failed.
    values: Vec<(&'static str, Option<u64>)>,
}

impl std::fmt::Debug for NfacctMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let values = crate::mutex::lock(&self.state).values.clone();
        f.debug_struct("NfacctMetrics").field("values", &values).finish()
    }
}

impl NfacctMetrics {
    pub(super) fn collector(&self) -> NfacctCollector {
        NfacctCollector { state: self.state.clone() }
    }

    /// Serves the metrics of `objects` (names of nfacct objects the rules
    /// count into), at 0 until the first reading, read with `reader`.
    pub(super) fn serve(&self, objects: &[&'static str], reader: NfacctReader) {
        let mut state = crate::mutex::lock(&self.state);
        state.values = METRICS
            .iter()
            .filter(|(object, _, _)| objects.contains(object))
            .map(|(object, _, _)| (*object, Some(0)))
            .collect();
        state.reader = Some(reader);
    }

    /// Reads every served counter from the kernel.
    pub(super) async fn refresh(&self) {
        let (reader, objects) = {
            let state = crate::mutex::lock(&self.state);
            let objects: Vec<&'static str> = state.values.iter().map(|(o, _)| *o).collect();
            (state.reader.clone(), objects)
        };
        let Some(reader) = reader else { return };
        let mut read = Vec::with_capacity(objects.len());
        for object in objects {
            let value = match reader(object).await {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::debug!(counter = object, error = %e, "cannot read an nfacct counter");
                    None
                }
            };
            read.push((object, value));
        }
        crate::mutex::lock(&self.state).values = read;
    }
}

/// Encodes the served counters at scrape time.
#[derive(Debug)]
pub(super) struct NfacctCollector {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("values", &self.values).finish()
    }
}

impl Collector for NfacctCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let values = crate::mutex::lock(&self.state).values.clone();
        for (object, name, help) in METRICS {
            let Some(Some(v)) = values.iter().find(|(o, _)| *o == object).map(|(_, v)| *v) else { continue };
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            family.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
        }
        Ok(())
    }
}
