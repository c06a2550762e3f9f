//! A source's waits at start say, at the default verbosity, what they wait for at
//! least every [`NOTE_EVERY`], and how they end. Pure: the callers poll or
//! tick and pass the time waited.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::msgs::{ResourceKind, SourceEvent};

/// The longest a start-up wait goes without a line saying it waits.
pub const NOTE_EVERY: Duration = Duration::from_secs(10);

/// When a wait says it still waits: at its first check, then at the last
/// check before [`NOTE_EVERY`] would pass without a line.
#[derive(Debug, Clone, Default)]
pub struct WaitNotes {
    last: Option<Duration>,
}

impl WaitNotes {
    /// Whether to say so now, `elapsed` into the wait, when the next check
    /// comes `next_check` later (or up to a tenth of that later still: a
    /// timer wakes a little late, and the first check may have come late).
    pub fn due(&mut self, elapsed: Duration, next_check: Duration) -> bool {
        let next = elapsed + next_check + next_check / 10;
        let due = self.last.is_none_or(|last| next >= last + NOTE_EVERY);
        if due {
            self.last = Some(elapsed);
        }
        due
    }
}

/// The kinds whose first list the proxy waits for before its first sync
/// (Services and EndpointSlices, upstream's `isInitialized`) and its Node
/// (the node informer's cache), as a source reports them.
#[derive(Debug, Clone)]
pub struct InitialLists {
    pending: BTreeSet<ResourceKind>,
}

impl Default for InitialLists {
    fn default() -> Self {
        InitialLists {
            pending: [ResourceKind::Service, ResourceKind::EndpointSlice, ResourceKind::Node].into_iter().collect(),
        }
    }
}

impl InitialLists {
    /// Takes note of `events`; true when they complete the lists (once).
    pub fn record(&mut self, events: &[SourceEvent]) -> bool {
        let before = self.pending.len();
        for e in events {
            if let SourceEvent::Synced(kind) = e {
                self.pending.remove(kind);
            }
        }
        before > 0 && self.pending.is_empty()
    }

    pub fn done(&self) -> bool {
        self.pending.is_empty()
    }

    /// The kinds still waited for, as a list (`EndpointSlice, Node`).
    pub fn pending(&self) -> String {
        self.pending.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// Checks every second (a little late each time): a line at once, then
    /// never more than ten seconds apart.
    #[test]
    fn notes_come_at_once_then_at_most_ten_seconds_apart() {
        let mut notes = WaitNotes::default();
        let times: Vec<f64> = (0..40).map(|i| f64::from(i) * 1.01).collect();
        let said: Vec<f64> = times.iter().copied().filter(|t| notes.due(secs(*t), secs(1.0))).collect();
        assert_eq!(said[0], 0.0);
        assert!(said.len() >= 4, "{said:?}");
        for w in said.windows(2) {
            assert!(w[1] - w[0] <= 10.0 && w[1] - w[0] >= 8.0, "{said:?}");
        }
    }

    /// An interval's ticks, each woken a little late, the first and the
    /// tenth later than the rest: the second line still comes within ten
    /// seconds of the first.
    #[test]
    fn a_late_first_check_does_not_push_the_next_line_past_ten_seconds() {
        let mut notes = WaitNotes::default();
        let late = |k: u32| if k == 10 { 0.0012 } else { 0.0003 };
        let times: Vec<f64> = std::iter::once(0.0008).chain((1..12).map(|k| f64::from(k) + late(k))).collect();
        let said: Vec<f64> = times.iter().copied().filter(|t| notes.due(secs(*t), secs(1.0))).collect();
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[1] - said[0] <= 10.0, "{said:?}");
    }

    #[test]
    fn a_slow_check_says_so_at_every_check() {
        let mut notes = WaitNotes::default();
        assert!(notes.due(secs(0.0), secs(12.0)));
        assert!(notes.due(secs(12.0), secs(12.0)));
        assert!(notes.due(secs(24.0), secs(1.0)));
        assert!(!notes.due(secs(25.0), secs(1.0)));
    }

    #[test]
    fn the_lists_are_complete_once_services_slices_and_the_node_are_listed() {
        let mut lists = InitialLists::default();
        assert_eq!(lists.pending(), "Service, EndpointSlice, Node");
        assert!(!lists.record(&[SourceEvent::Synced(ResourceKind::ServiceCidr)]));
        assert!(!lists.record(&[SourceEvent::Synced(ResourceKind::Service)]));
        assert!(!lists.record(&[SourceEvent::Synced(ResourceKind::Node)]));
        assert_eq!(lists.pending(), "EndpointSlice");
        assert!(!lists.done());
        assert!(lists.record(&[SourceEvent::Synced(ResourceKind::EndpointSlice)]));
        assert!(lists.done());
        assert!(!lists.record(&[SourceEvent::Synced(ResourceKind::EndpointSlice)]), "said once");
    }
}
