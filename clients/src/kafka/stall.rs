//! When a consumer has stalled: what its loop reports ([`Activity`]) and the decision
//! ([`StallWatch`]).

use super::Backlog;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What a consumer loop tells its [`StallWatch`]: that messages arrived, and which of them are
/// still being worked on (a store or S3 that is down keeps a loop busy, not stalled).
#[derive(Default)]
pub struct Activity {
    received: AtomicBool,
    busy: AtomicUsize,
}

/// Work in progress on received messages; dropping it ends it.
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Activity {
    /// A message arrived.
    pub fn received(&self) {
        self.received.store(true, Ordering::Relaxed);
    }

    /// Work on received messages starts; it lasts until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }

    /// (a message arrived since the last call, work is in progress now).
    pub fn take(&self) -> (bool, bool) {
        (
            self.received.swap(false, Ordering::Relaxed),
            self.busy.load(Ordering::Relaxed) > 0,
        )
    }
}

/// Longest wait between replacements of a consumer that stays stalled (Kafka down for long).
pub const STALL_AFTER_MAX: Duration = Duration::from_secs(300);

/// Decides when a consumer has stalled: messages wait (or Kafka does not say), none arrive, no
/// work is in progress and, with nothing assigned, the group's position does not move, for
/// `after`. librdkafka can leave a consumer like that after its broker was frozen past the
/// group session: in the 2026-11-25 10:27 `hang:kafka` drill the replicator's consumer logged
/// `SESSTMOUT ... rejoining group`, then `REQTMOUT GroupCoordinator ... 38 out-queue`, and
/// consumed nothing for the 84 s until the run ended. A fresh consumer bootstraps and joins
/// anew. While the consumer stays stalled (Kafka down), each further replacement waits twice
/// as long as the one before, up to [`STALL_AFTER_MAX`]; progress resets that.
pub struct StallWatch {
    base: Duration,
    after: Duration,
    since: std::time::Instant,
    group_position: Option<i64>,
}

impl StallWatch {
    pub fn new(after: Duration, now: std::time::Instant) -> Self {
        StallWatch {
            base: after,
            after,
            since: now,
            group_position: None,
        }
    }

    /// One probe at `now`: whether messages arrived since the last, whether work is in
    /// progress ([`Activity::take`]), and the [`Backlog`]. True when the consumer should be
    /// replaced; the clock then starts again.
    pub fn observe(
        &mut self,
        now: std::time::Instant,
        received: bool,
        busy: bool,
        backlog: &Backlog,
    ) -> bool {
        let group_moved = matches!(
            (self.group_position, backlog.group_position),
            (Some(a), Some(b)) if a != b
        );
        if backlog.group_position.is_some() {
            self.group_position = backlog.group_position;
        }
        if received || busy || group_moved || backlog.waiting == Some(false) {
            self.since = now;
            self.after = self.base;
            return false;
        }
        if now.saturating_duration_since(self.since) < self.after {
            return false;
        }
        self.since = now;
        self.after = (self.after * 2).min(STALL_AFTER_MAX.max(self.base));
        self.group_position = None;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(w: Option<bool>) -> Backlog {
        Backlog {
            waiting: w,
            ..Backlog::default()
        }
    }

    #[test]
    fn a_consumer_is_stalled_only_when_messages_wait_and_nothing_moves_for_the_window() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = StallWatch::new(Duration::from_secs(20), t0);
        // Caught up: never stalled, however long nothing arrives.
        for s in (5..=100).step_by(5) {
            assert!(!w.observe(at(s), false, false, &waiting(Some(false))));
        }
        // Messages wait and none arrive: stalled once the window has passed since the last
        // progress (at 100 s), not before.
        assert!(!w.observe(at(105), false, false, &waiting(Some(true))));
        assert!(!w.observe(at(115), false, false, &waiting(Some(true))));
        assert!(w.observe(at(120), false, false, &waiting(Some(true))));
        // Still stalled after the replacement: the next one waits twice as long.
        assert!(!w.observe(at(150), false, false, &waiting(None)));
        assert!(w.observe(at(160), false, false, &waiting(None)));
        assert!(!w.observe(at(199), false, false, &waiting(None)));
        assert!(w.observe(at(240), false, false, &waiting(None)));
        // Messages arriving, or work in progress (S3 or the store down), is progress, and it
        // brings the window back to its base.
        assert!(!w.observe(at(245), true, false, &waiting(Some(true))));
        assert!(!w.observe(at(260), false, true, &waiting(Some(true))));
        assert!(!w.observe(at(279), false, false, &waiting(Some(true))));
        assert!(w.observe(at(280), false, false, &waiting(Some(true))));
    }

    #[test]
    fn the_wait_between_replacements_is_capped() {
        let t0 = std::time::Instant::now();
        let mut w = StallWatch::new(Duration::from_secs(20), t0);
        let mut fired = Vec::new();
        for s in (5..=3000).step_by(5) {
            if w.observe(t0 + Duration::from_secs(s), false, false, &waiting(None)) {
                fired.push(s);
            }
        }
        let gaps: Vec<u64> = fired.windows(2).map(|p| p[1] - p[0]).collect();
        assert_eq!(fired[0], 20);
        assert_eq!(&gaps[..5], &[40, 80, 160, 300, 300]);
        assert!(gaps.iter().all(|g| *g <= STALL_AFTER_MAX.as_secs()));
    }

    #[test]
    fn with_nothing_assigned_a_group_moving_elsewhere_is_not_a_stall() {
        let t0 = std::time::Instant::now();
        let mut w = StallWatch::new(Duration::from_secs(20), t0);
        let group = |pos: i64| Backlog {
            waiting: Some(true),
            group_position: Some(pos),
            ..Backlog::default()
        };
        // Another member works through a backlog: its committed position moves.
        for (i, s) in (5..=60).step_by(5).enumerate() {
            assert!(!w.observe(
                t0 + Duration::from_secs(s),
                false,
                false,
                &group(i as i64 * 10)
            ));
        }
        // The group stops moving with messages waiting: stalled after the window.
        assert!(!w.observe(t0 + Duration::from_secs(65), false, false, &group(200)));
        assert!(!w.observe(t0 + Duration::from_secs(80), false, false, &group(200)));
        assert!(w.observe(t0 + Duration::from_secs(85), false, false, &group(200)));
    }

    #[test]
    fn activity_reports_arrivals_once_and_work_until_its_guard_drops() {
        let a = Arc::new(Activity::default());
        assert_eq!(a.take(), (false, false));
        a.received();
        let busy = a.begin();
        let busy2 = a.begin();
        assert_eq!(a.take(), (true, true));
        drop(busy);
        assert_eq!(a.take(), (false, true));
        drop(busy2);
        assert_eq!(a.take(), (false, false));
    }
}
