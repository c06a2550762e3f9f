//! Metrics read at scrape time from counters kept elsewhere: the per-actor
//! ones (`kube_proxy_rs_actor_*{actor}`) from the [`StatsRegistry`], so
//! actors keep updating their plain atomics and know nothing of Prometheus.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::stats::{ActorStats, StatsRegistry, StatsSnapshot};

/// Encodes every registered actor's stats on scrape.
#[derive(Debug)]
pub(super) struct ActorCollector {
    stats: StatsRegistry,
}

impl ActorCollector {
    pub(super) fn new(stats: StatsRegistry) -> ActorCollector {
        ActorCollector { stats }
    }
}

/// The plain per-actor series: name (counters without `_total`, which the
/// encoder appends), help (ending with a full stop, as the registry's own
/// do), type, and what to read from a snapshot.
type Series = (&'static str, &'static str, MetricType, fn(&StatsSnapshot) -> u64);

const SERIES: [Series; 7] = [
    ("kube_proxy_rs_actor_mailbox_depth", "Messages sent to the actor and not yet taken.", MetricType::Gauge, |s| {
        u64::try_from(s.mailbox_depth).unwrap_or(0)
    }),
    ("kube_proxy_rs_actor_messages", "Messages the actor took from its mailbox.", MetricType::Counter, |s| s.received),
    ("kube_proxy_rs_actor_ops", "Kernel operations the actor applied.", MetricType::Counter, |s| s.ops),
    ("kube_proxy_rs_actor_errors", "Kernel operations that failed.", MetricType::Counter, |s| s.errors),
    (
        "kube_proxy_rs_actor_last_acked_generation",
        "The newest sync generation the actor acked.",
        MetricType::Gauge,
        |s| s.last_generation,
    ),
    (
        "kube_proxy_rs_actor_failing_keys",
        "Keys whose op the kernel refused, waiting to be retried alone.",
        MetricType::Gauge,
        |s| s.failing_keys,
    ),
    ("kube_proxy_rs_actor_retries", "Refused ops that went through when retried.", MetricType::Counter, |s| s.retries),
];

impl Collector for ActorCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let actors = self.stats.actors();
        let snaps: Vec<StatsSnapshot> = actors.iter().map(|a| a.snapshot()).collect();
        for (name, help, kind, read) in SERIES {
            let is_counter = matches!(kind, MetricType::Counter);
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for snap in &snaps {
                let labels = [("actor", snap.name.as_str())];
                let mut series = family.encode_family(&labels)?;
                let v = read(snap);
                if is_counter {
                    series.encode_counter::<NoLabelSet, _, u64>(&v, None)?;
                } else {
                    series.encode_gauge(&v)?;
                }
            }
        }
        encode_apply_durations(&mut encoder, &actors)
    }
}

/// `kube_proxy_rs_actor_apply_duration_seconds{actor}`: each batch's apply time.
fn encode_apply_durations(
    encoder: &mut DescriptorEncoder,
    actors: &[std::sync::Arc<ActorStats>],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "kube_proxy_rs_actor_apply_duration_seconds",
        "Time the actor took to apply one batch, in seconds.",
        None,
        MetricType::Histogram,
    )?;
    for actor in actors {
        let h = actor.apply_histogram();
        let labels = [("actor", actor.name.as_str())];
        family.encode_family(&labels)?.encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?;
    }
    Ok(())
}
