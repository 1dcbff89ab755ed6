//! The read-back queue: every object the applier wrote, due for a second look
//! `--audit-recheck-secs` later (the audit reads them back: `crate::audit`). Below both, so
//! the applier needs nothing of the audit.

use crate::metrics::Metrics;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// Keys waiting for their read-back; beyond this the oldest are dropped (and counted): the
/// sweep still reaches them.
const RECHECK_CAP: usize = 100_000;

/// Keys written by the applier, each due for its read-back at a time.
pub struct Rechecks {
    delay_ms: i64,
    queue: Mutex<VecDeque<(i64, String, i64)>>,
    metrics: Arc<Metrics>,
}

impl Rechecks {
    /// Read-backs `delay_secs` after each write (0: none).
    pub fn new(delay_secs: u64, metrics: Arc<Metrics>) -> Self {
        Rechecks {
            delay_ms: (delay_secs as i64).saturating_mul(1000),
            queue: Mutex::new(VecDeque::new()),
            metrics,
        }
    }

    /// `version` of `key` was written to S3 at `now_ms`: read it back later.
    pub fn push(&self, key: &str, version: i64, now_ms: i64) {
        if self.delay_ms <= 0 {
            return;
        }
        let mut q = self.queue.lock().expect("recheck queue");
        if q.len() >= RECHECK_CAP {
            q.pop_front();
            self.metrics.audit_recheck_dropped.inc();
        }
        q.push_back((now_ms + self.delay_ms, key.to_string(), version));
        self.metrics.audit_recheck_queue.set(q.len() as i64);
    }

    /// The (key, version written) due at `now_ms`, at most `max`.
    pub(crate) fn due(&self, now_ms: i64, max: usize) -> Vec<(String, i64)> {
        let mut q = self.queue.lock().expect("recheck queue");
        let mut out = Vec::new();
        while out.len() < max && q.front().is_some_and(|(due, _, _)| *due <= now_ms) {
            out.extend(q.pop_front().map(|(_, k, v)| (k, v)));
        }
        self.metrics.audit_recheck_queue.set(q.len() as i64);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_backs_come_due_in_order_and_the_queue_is_bounded() {
        let metrics = Arc::new(Metrics::new());
        let r = Rechecks::new(2, metrics.clone());
        r.push("a", 1, 1000);
        r.push("b", 2, 1500);
        assert!(r.due(2999, 10).is_empty());
        assert_eq!(r.due(3000, 10), [("a".to_string(), 1)]);
        assert_eq!(r.due(9000, 10), [("b".to_string(), 2)]);
        for i in 0..RECHECK_CAP + 5 {
            r.push(&format!("k{i}"), 1, 0);
        }
        assert_eq!(metrics.audit_recheck_dropped.get(), 5);
        let keys: Vec<_> = r.due(i64::MAX, 3).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["k5", "k6", "k7"]);
        let off = Rechecks::new(0, metrics);
        off.push("a", 1, 0);
        assert!(off.due(i64::MAX, 10).is_empty());
    }
}
