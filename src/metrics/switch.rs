//! A mode switch's drain, read at scrape time from the [`StatsRegistry`]:
//! `kube_proxy_rs_mode_switch_draining{mode,ip_family}` (1 while it lasts),
//! and the virtual servers and connections it waits for. No series before
//! a switch drained anything.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::stats::{StatsRegistry, SwitchDrain};

/// Name, help and what to read from a drain.
type Series = (&'static str, &'static str, fn(&SwitchDrain) -> u64);

const SERIES: [Series; 3] = [
    (
        "kube_proxy_rs_mode_switch_draining",
        "1 while the earlier mode's state drains after a mode switch, else 0.",
        |d| u64::from(d.draining),
    ),
    (
        "kube_proxy_rs_mode_switch_remaining_connections",
        "Connections IPVS still tracks through the earlier mode's draining virtual servers.",
        |d| d.connections,
    ),
    ("kube_proxy_rs_mode_switch_remaining_virtual_servers", "The earlier mode's virtual servers left to drain.", |d| {
        u64::try_from(d.virtual_servers).unwrap_or(u64::MAX)
    }),
];

#[derive(Debug)]
pub(super) struct SwitchCollector {
    stats: StatsRegistry,
}

impl SwitchCollector {
    pub(super) fn new(stats: StatsRegistry) -> SwitchCollector {
        SwitchCollector { stats }
    }
}

impl Collector for SwitchCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let drains = self.stats.drains();
        if drains.is_empty() {
            return Ok(());
        }
        for (name, help, read) in SERIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for d in &drains {
                let labels = [("mode", d.mode), ("ip_family", d.family)];
                family.encode_family(&labels)?.encode_gauge(&read(d))?;
            }
        }
        Ok(())
    }
}
