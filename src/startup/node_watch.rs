//! The daemon's edge of [`crate::model::node_change`]: every source batch
//! is checked against the Node the daemon started with; a change that
//! needs a restart is logged and sent to the run loop once, and no batch
//! goes on to the coordinators after it.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc::UnboundedSender;

use crate::model::node_change::{NodeBaseline, NodeRestart};
use crate::msgs::SourceBatch;

pub struct NodeWatch {
    baseline: NodeBaseline,
    restart: UnboundedSender<NodeRestart>,
    restarting: AtomicBool,
}

impl NodeWatch {
    /// Tells `restart` of the first change that needs one.
    pub fn new(baseline: NodeBaseline, restart: UnboundedSender<NodeRestart>) -> NodeWatch {
        NodeWatch { baseline, restart, restarting: AtomicBool::new(false) }
    }

    /// Whether `b` goes on to the coordinators.
    pub fn admit(&self, b: &SourceBatch) -> bool {
        if self.restarting.load(Ordering::Relaxed) {
            return false;
        }
        let Some(restart) = self.baseline.check(&b.0) else { return true };
        restart.log();
        self.restarting.store(true, Ordering::Relaxed);
        let _ = self.restart.send(restart);
        false
    }
}
