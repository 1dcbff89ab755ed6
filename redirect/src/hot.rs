//! Counters of the hot path whose busiest label values are resolved once.
//!
//! `IntCounterVec::with_label_values` hashes the labels, takes the vector's read lock and clones
//! the child's `Arc`, then the child is incremented and the `Arc` dropped: on one core a few
//! dozen nanoseconds, but the lock word and the reference count are shared by every core, so
//! with the tier spread over 8 cores each of those atomic writes waits for the cache line. A
//! [`HotCounters`] keeps the handles of the label values a redirect uses and increments one of
//! them with a single atomic add; any other label values go through the vector as before (same
//! series, same registry).

use prometheus::{IntCounter, IntCounterVec};
use std::sync::Arc;

/// A set of label values and the handle of its series.
type Child = (Box<[&'static str]>, IntCounter);

/// An [`IntCounterVec`] and handles to its hot children, busiest first.
#[derive(Clone)]
pub struct HotCounters {
    vec: IntCounterVec,
    hot: Arc<[Child]>,
}

impl HotCounters {
    /// `hot`: the label values to resolve now, busiest first (each a full set of values).
    pub fn new(vec: IntCounterVec, hot: &[&[&'static str]]) -> Self {
        let hot = hot
            .iter()
            .map(|labels| (Box::<[&str]>::from(*labels), vec.with_label_values(labels)))
            .collect();
        HotCounters { vec, hot }
    }

    /// Adds one to the series of `labels`.
    pub fn inc(&self, labels: &[&str]) {
        match self.hot.iter().find(|(k, _)| **k == *labels) {
            Some((_, c)) => c.inc(),
            None => self.vec.with_label_values(labels).inc(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    #[test]
    fn hot_and_other_label_values_count_into_the_same_series() {
        let vec = IntCounterVec::new(Opts::new("t", "t"), &["status", "via"]).unwrap();
        let hot = HotCounters::new(vec.clone(), &[&["302", "direct"], &["404", "direct"]]);
        hot.inc(&["302", "direct"]);
        hot.inc(&["302", "direct"]);
        hot.inc(&["503", "failover"]);
        hot.inc(&["404", "direct"]);
        assert_eq!(vec.with_label_values(&["302", "direct"]).get(), 2);
        assert_eq!(vec.with_label_values(&["503", "failover"]).get(), 1);
        assert_eq!(vec.with_label_values(&["404", "direct"]).get(), 1);
        assert_eq!(vec.with_label_values(&["302", "failover"]).get(), 0);
    }
}
