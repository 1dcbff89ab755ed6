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

/// How long a consumer that had been working may go without progress while Kafka answers (see
/// [`StallWatch`]) before it is replaced.
pub const STUCK_AFTER: Duration = Duration::from_secs(2);

/// How often a watch looks while its consumer makes no progress and messages may wait
/// ([`StallWatch::next_check`]), so that a stuck consumer is seen within a second or two of
/// Kafka answering again.
pub const SUSPECT_EVERY: Duration = Duration::from_secs(1);

/// Longest wait between two probes of Kafka by a fresh client ([`StallWatch::wants_probe`])
/// while Kafka does not answer them either (the first comes after [`STUCK_AFTER`], then one
/// every 2 s): a probe is a client created and closed, cheap enough every 2 s of an outage,
/// and the wait bounds how long after a thaw a stuck consumer stays. With 4 s here the
/// replicator's consumer, stuck after a 10 s freeze, was replaced 6 s after the thaw and a
/// create took 6.1 s to reach every rung (ε 5 s; the Kafka drill, 2026-11-28 evening).
pub const PROBE_EVERY_MAX: Duration = Duration::from_secs(2);

/// Decides when a consumer has stalled: messages wait (or Kafka does not say), none arrive, no
/// work is in progress and, with nothing assigned, the group's position does not move, for
/// `after`. librdkafka can leave a consumer like that after its broker was frozen past the
/// group session: in the 2026-11-25 10:27 `hang:kafka` drill the replicator's consumer logged
/// `SESSTMOUT ... rejoining group`, then `REQTMOUT GroupCoordinator ... 38 out-queue`, and
/// consumed nothing for the 84 s until the run ended. A fresh consumer bootstraps and joins
/// anew. While the consumer stays stalled (Kafka down), each further replacement waits twice
/// as long as the one before, up to [`STALL_AFTER_MAX`]; progress resets that.
///
/// **Stuck while Kafka answers** is told apart sooner, once looks [`STUCK_AFTER`] apart (a look
/// a second while no progress is seen) found no progress, for a consumer that has worked since
/// it was created: Kafka answers, either this consumer's own requests (the watermarks of its
/// partitions, or the topic's metadata) or, when this consumer gets no answer at all, a fresh
/// client's (the service's probe, asked only then, at most every [`PROBE_EVERY_MAX`] while
/// Kafka stays silent; its answer counts from the consumer's next look, so a consumer whose
/// Kafka came back between its own requests and the probe's has one more look to show it).
/// Measured on 2026-11-28 (`ctl drill --fault slow:s3 --fault hang:kafka --fault flap:kafka`,
/// Kafka behind its fault proxy): after
/// a 10 s freeze of the broker, the replicator's consumer got no answer to anything (its
/// `GroupCoordinator` and broker connections kept timing out, 9 requests in the out-queue)
/// while the broker answered every other client; its session timed out 20 s after the thaw
/// and the 45 s window replaced it 45 s after the thaw, where the fresh consumer applied the
/// waiting events within 1.5 s. Kept on the long window: with nothing assigned, the
/// coordinator answering that the group's messages wait (a rebalance waiting out a departed
/// member's session); Kafka answering no one (an outage: a fresh consumer would not help); and
/// a consumer that has not worked yet (one joining a group whose coordinator is still being
/// set up, as on a new cluster, or the replacement itself).
pub struct StallWatch {
    base: Duration,
    after: Duration,
    since: std::time::Instant,
    group_position: Option<i64>,
    /// The consumer has made progress (or been caught up) since it was created.
    worked: bool,
    /// Since the first of the looks in a row that saw no progress (messages waiting or Kafka
    /// silent).
    suspect_since: Option<std::time::Instant>,
    /// A fresh client got an answer from Kafka during this run of looks without progress.
    probe_answered: bool,
    /// The last replacement was for being stuck while Kafka answers.
    stuck_fired: bool,
    /// When a fresh client may next probe Kafka, and the wait after that one.
    probe_at: std::time::Instant,
    probe_gap: Duration,
}

impl StallWatch {
    pub fn new(after: Duration, now: std::time::Instant) -> Self {
        StallWatch {
            base: after,
            after,
            since: now,
            group_position: None,
            worked: false,
            suspect_since: None,
            probe_answered: false,
            stuck_fired: false,
            probe_at: now,
            probe_gap: STUCK_AFTER,
        }
    }

    /// When to look next: `normal`, or [`SUSPECT_EVERY`] while the last look found no progress
    /// with messages waiting (or Kafka silent).
    pub fn next_check(&self, normal: Duration) -> Duration {
        if self.suspect_since.is_some() {
            normal.min(SUSPECT_EVERY)
        } else {
            normal
        }
    }

    /// The wait until the next look, for one that started at `looked`: [`Self::next_check`]
    /// counted from the look's start, so a look that waited on Kafka does not push the next.
    pub fn wait_after(&self, normal: Duration, looked: std::time::Instant) -> Duration {
        self.next_check(normal).saturating_sub(looked.elapsed())
    }

    /// Why the last `true` of [`Self::observe`] was: for the log.
    pub fn reason(&self) -> &'static str {
        if self.stuck_fired {
            "stuck while Kafka answers (no progress, messages waiting or Kafka silent to this consumer only)"
        } else {
            "messages wait (or Kafka does not say) and none arrived"
        }
    }

    /// [`STUCK_AFTER`], or the base window where that is shorter.
    fn stuck_after(&self) -> Duration {
        STUCK_AFTER.min(self.base)
    }

    fn progress(received: bool, busy: bool, group_moved: bool, backlog: &Backlog) -> bool {
        received || busy || group_moved || backlog.waiting == Some(false)
    }

    fn group_moved(&self, backlog: &Backlog) -> bool {
        matches!(
            (self.group_position, backlog.group_position),
            (Some(a), Some(b)) if a != b
        )
    }

    /// Whether the service should ask a fresh client if Kafka answers, before [`Self::observe`]
    /// with the same arguments: only for a consumer that has worked, gets no answer itself and
    /// has made no progress for [`STUCK_AFTER`]; then at most every 2, 4, ... up to
    /// [`PROBE_EVERY_MAX`] seconds while the probes get no answer either.
    pub fn wants_probe(
        &self,
        now: std::time::Instant,
        received: bool,
        busy: bool,
        backlog: &Backlog,
    ) -> bool {
        self.worked
            && !backlog.answered
            && !self.probe_answered
            && !Self::progress(received, busy, self.group_moved(backlog), backlog)
            && self
                .suspect_since
                .is_some_and(|t| now.saturating_duration_since(t) >= self.stuck_after())
            && now >= self.probe_at
    }

    /// One probe at `now`: whether messages arrived since the last, whether work is in
    /// progress ([`Activity::take`]), the [`Backlog`], and whether a fresh client got an answer
    /// from Kafka (`Some` when [`Self::wants_probe`] asked for one). True when the consumer
    /// should be replaced; the clock then starts again.
    pub fn observe(
        &mut self,
        now: std::time::Instant,
        received: bool,
        busy: bool,
        backlog: &Backlog,
        probe: Option<bool>,
    ) -> bool {
        let group_moved = self.group_moved(backlog);
        if backlog.group_position.is_some() {
            self.group_position = backlog.group_position;
        }
        if Self::progress(received, busy, group_moved, backlog) {
            self.since = now;
            self.after = self.base;
            self.worked = true;
            self.suspect_since = None;
            self.probe_answered = false;
            self.probe_gap = STUCK_AFTER;
            self.probe_at = now;
            return false;
        }
        let suspect_for = now.saturating_duration_since(*self.suspect_since.get_or_insert(now));
        let rebalancing =
            backlog.answered && backlog.assigned == 0 && backlog.waiting == Some(true);
        let kafka_answers = backlog.answered || self.probe_answered;
        match probe {
            Some(true) => self.probe_answered = true,
            Some(false) => {
                self.probe_at = now + self.probe_gap;
                self.probe_gap = (self.probe_gap * 2).min(PROBE_EVERY_MAX);
            }
            None => {}
        }
        if self.worked && kafka_answers && !rebalancing && suspect_for >= self.stuck_after() {
            self.fired(now, true);
            return true;
        }
        if now.saturating_duration_since(self.since) < self.after {
            return false;
        }
        self.after = (self.after * 2).min(STALL_AFTER_MAX.max(self.base));
        self.fired(now, false);
        true
    }

    fn fired(&mut self, now: std::time::Instant, stuck: bool) {
        self.since = now;
        self.worked = false;
        self.suspect_since = None;
        self.probe_answered = false;
        self.group_position = None;
        self.stuck_fired = stuck;
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
            assert!(!w.observe(at(s), false, false, &waiting(Some(false)), None));
        }
        // Messages wait and none arrive: stalled once the window has passed since the last
        // progress (at 100 s), not before.
        assert!(!w.observe(at(105), false, false, &waiting(Some(true)), None));
        assert!(!w.observe(at(115), false, false, &waiting(Some(true)), None));
        assert!(w.observe(at(120), false, false, &waiting(Some(true)), None));
        // Still stalled after the replacement: the next one waits twice as long.
        assert!(!w.observe(at(150), false, false, &waiting(None), None));
        assert!(w.observe(at(160), false, false, &waiting(None), None));
        assert!(!w.observe(at(199), false, false, &waiting(None), None));
        assert!(w.observe(at(240), false, false, &waiting(None), None));
        // Messages arriving, or work in progress (S3 or the store down), is progress, and it
        // brings the window back to its base.
        assert!(!w.observe(at(245), true, false, &waiting(Some(true)), None));
        assert!(!w.observe(at(260), false, true, &waiting(Some(true)), None));
        assert!(!w.observe(at(279), false, false, &waiting(Some(true)), None));
        assert!(w.observe(at(280), false, false, &waiting(Some(true)), None));
    }

    #[test]
    fn the_wait_between_replacements_is_capped() {
        let t0 = std::time::Instant::now();
        let mut w = StallWatch::new(Duration::from_secs(20), t0);
        let mut fired = Vec::new();
        for s in (5..=3000).step_by(5) {
            if w.observe(
                t0 + Duration::from_secs(s),
                false,
                false,
                &waiting(None),
                None,
            ) {
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
                &group(i as i64 * 10),
                None
            ));
        }
        // The group stops moving with messages waiting: stalled after the window.
        assert!(!w.observe(
            t0 + Duration::from_secs(65),
            false,
            false,
            &group(200),
            None
        ));
        assert!(!w.observe(
            t0 + Duration::from_secs(80),
            false,
            false,
            &group(200),
            None
        ));
        assert!(w.observe(
            t0 + Duration::from_secs(85),
            false,
            false,
            &group(200),
            None
        ));
    }

    #[test]
    fn a_consumer_stuck_while_kafka_answers_it_is_replaced_within_seconds() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        // Its partitions' messages wait, Kafka answers the watermarks, nothing arrives.
        let lagging = Backlog {
            answered: true,
            assigned: 3,
            waiting: Some(true),
            ..Backlog::default()
        };
        // Not before it has worked: a new consumer may wait on a coordinator being set up.
        for ms in (500..=40_000).step_by(500) {
            assert!(
                !w.observe(at(ms), false, false, &lagging, None),
                "at {ms} ms"
            );
        }
        let t0 = at(40_000);
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert!(!w.observe(at(500), true, false, &lagging, None));
        assert!(!w.observe(at(1_000), false, false, &lagging, None));
        assert_eq!(w.next_check(Duration::from_secs(5)), SUSPECT_EVERY);
        assert!(!w.observe(at(2_000), false, false, &lagging, None));
        assert!(w.observe(at(3_000), false, false, &lagging, None));
        assert!(w.reason().starts_with("stuck while Kafka answers"));
        // The fresh one stuck too, before it ever worked: the long window (from 3 s).
        assert!(!w.observe(at(8_000), false, false, &lagging, None));
        assert!(!w.observe(at(47_000), false, false, &lagging, None));
        assert!(w.observe(at(48_000), false, false, &lagging, None));
        assert!(w.reason().starts_with("messages wait"));
        // Progress: the short window again, and the normal pace.
        assert!(!w.observe(at(49_000), true, false, &lagging, None));
        assert_eq!(w.next_check(Duration::from_secs(5)), Duration::from_secs(5));
        // Nothing assigned and the coordinator silent while the brokers answer the metadata
        // (what the replicator's consumer did after the 2026-11-28 freeze): the same rule.
        let coordinator_silent = Backlog {
            answered: true,
            waiting: None,
            ..Backlog::default()
        };
        assert!(!w.observe(at(50_000), false, false, &coordinator_silent, None));
        assert!(w.observe(at(52_000), false, false, &coordinator_silent, None));
        assert!(w.reason().starts_with("stuck while Kafka answers"));
    }

    #[test]
    fn a_consumer_kafka_is_silent_to_is_replaced_once_a_fresh_client_gets_an_answer() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        let silent = Backlog::default();
        // Before it has worked: no probe (a new consumer may wait on a coordinator).
        assert!(!w.wants_probe(at(5_000), false, false, &silent));
        assert!(!w.observe(at(5_000), true, false, &silent, None));
        // Kafka frozen: the consumer gets no answer. A probe once looks 2 s apart found no
        // progress, then every 2 s while the probe gets no answer either.
        let mut probed = Vec::new();
        for ms in (6_000..=60_000).step_by(1_000) {
            let asked = w.wants_probe(at(ms), false, false, &silent);
            if asked {
                probed.push(ms / 1_000);
            }
            let fired = w.observe(at(ms), false, false, &silent, asked.then_some(false));
            assert_eq!(
                fired,
                ms == 50_000,
                "at {ms} ms: the long window (from 5 s) only"
            );
        }
        assert_eq!(&probed[..5], &[8, 10, 12, 14, 16]);
        // The replacement has not worked yet: no probe. It works, then Kafka goes silent to it
        // again while a fresh client gets an answer (the broker thawed; this consumer's
        // connections stay stuck): replaced at the first probe.
        assert!(!w.wants_probe(at(61_000), false, false, &silent));
        assert!(!w.observe(at(62_000), true, false, &silent, None));
        assert!(!w.observe(at(63_000), false, false, &silent, None));
        assert!(!w.wants_probe(at(64_000), false, false, &silent));
        assert!(!w.observe(at(64_000), false, false, &silent, None));
        // The probe's answer counts from the next look: the consumer has that look to show
        // it works (its own requests were sent before Kafka came back).
        assert!(w.wants_probe(at(65_000), false, false, &silent));
        assert!(!w.observe(at(65_000), false, false, &silent, Some(true)));
        assert!(
            !w.wants_probe(at(66_000), false, false, &silent),
            "one probe suffices"
        );
        assert!(w.observe(at(66_000), false, false, &silent, None));
        assert!(w.reason().starts_with("stuck while Kafka answers"));
        // A consumer that shows progress at that look stays.
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        assert!(!w.observe(at(1_000), true, false, &silent, None));
        assert!(!w.observe(at(2_000), false, false, &silent, None));
        assert!(!w.observe(at(4_000), false, false, &silent, Some(true)));
        assert!(!w.observe(at(5_000), true, false, &silent, None));
        // Work in progress is progress: no probe, however long.
        assert!(!w.observe(at(65_000), false, true, &silent, None));
        assert!(!w.wants_probe(at(90_000), false, true, &silent));
    }

    #[test]
    fn messages_that_just_arrived_are_not_a_stuck_consumer() {
        // The counter looks every 2 s: caught up at one look, clicks written a moment before
        // the next (waiting, none received yet). One look without progress is not a stall,
        // however long since the last progress; the next look (a second later) sees them.
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        let caught_up = Backlog {
            answered: true,
            assigned: 6,
            waiting: Some(false),
            ..Backlog::default()
        };
        let arrived = Backlog {
            waiting: Some(true),
            ..caught_up.clone()
        };
        assert!(!w.observe(at(2_000), false, false, &caught_up, None));
        assert!(!w.observe(at(4_000), false, false, &arrived, None));
        assert_eq!(w.next_check(Duration::from_secs(2)), SUSPECT_EVERY);
        assert!(!w.observe(at(5_000), true, false, &arrived, None));
        assert_eq!(w.next_check(Duration::from_secs(2)), Duration::from_secs(2));
    }

    #[test]
    fn kafka_silent_or_a_rebalance_waiting_keeps_the_long_window() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // Each watch has seen its consumer work (at 0 s), so only the kind of stall decides.
        let worked =
            |w: &mut StallWatch| assert!(!w.observe(t0, true, false, &Backlog::default(), None));
        // Kafka does not answer at all: a fresh consumer would not help.
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        worked(&mut w);
        let silent = Backlog::default();
        for s in 1..45 {
            assert!(!w.observe(at(s), false, false, &silent, None), "at {s} s");
        }
        assert!(w.observe(at(45), false, false, &silent, None));
        assert!(w.reason().starts_with("messages wait"));
        // Nothing assigned, the coordinator answers that the group's messages wait and its
        // position does not move: a rebalance waiting out a departed member's session.
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        worked(&mut w);
        let rebalancing = Backlog {
            answered: true,
            waiting: Some(true),
            group_position: Some(7),
            ..Backlog::default()
        };
        for s in 1..45 {
            assert!(
                !w.observe(at(s), false, false, &rebalancing, None),
                "at {s} s"
            );
        }
        assert!(w.observe(at(45), false, false, &rebalancing, None));
        // Assigned partitions but Kafka answered none of their watermarks: not known to lag.
        let mut w = StallWatch::new(Duration::from_secs(45), t0);
        worked(&mut w);
        let unknown = Backlog {
            answered: false,
            assigned: 2,
            waiting: None,
            ..Backlog::default()
        };
        for s in 1..45 {
            assert!(!w.observe(at(s), false, false, &unknown, None), "at {s} s");
        }
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
