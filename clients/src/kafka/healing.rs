//! A producer that replaces itself when it keeps failing.

use super::handle::ClosesElsewhere;
use super::{Quiet, ZProducer, PROBE_EVERY_MAX};
use prometheus::IntCounter;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{Producer, PurgeConfig};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Consecutive failed sends after which a [`HealingProducer`] replaces its producer...
pub const RESET_AFTER_FAILURES: u32 = 3;
/// ...at most this often: during a real outage a new producer fails like the old one.
pub const RESET_INTERVAL: Duration = Duration::from_secs(30);
/// Shortest wait between two replacements of a producer found stuck while Kafka answers a
/// fresh client ([`HealingProducer::with_probe`]); it doubles with each such replacement, up to
/// [`RESET_INTERVAL`], and comes back to this after a delivery.
pub const STUCK_GAP_MIN: Duration = Duration::from_secs(2);

/// One producer in use, shared by the sends that started on it.
pub type SharedProducer<P = ZProducer> = Arc<ClosesElsewhere<P>>;

/// How a [`HealingProducer`] makes a producer of its kind from its configuration.
pub type MakeProducer<P> = fn(&ClientConfig) -> KafkaResult<P>;

/// A producer that replaces itself when it keeps failing. librdkafka can leave a producer
/// unable to deliver after its broker was frozen and thawed: in the 2026-11-25 `hang:kafka`
/// drill one click producer timed out every batch for minutes after the thaw (librdkafka:
/// `REQTMOUT ... 0 in-flight, 0 retry-queued, 2 out-queue`, after `new leader-1 not found in
/// cache`), while the other clients of the same broker recovered. A new producer bootstraps
/// fresh metadata and a fresh idempotence identity. Callers report each send's outcome with
/// the producer it used; after [`RESET_AFTER_FAILURES`] failures in a row on the current
/// producer (at most once per [`RESET_INTERVAL`]) the next send gets a new one. The old one
/// finishes (its queued messages fail) and closes on a thread of its own. A message resent
/// through the new producer may duplicate one the old delivered late: every user of this
/// type tolerates duplicates (click ids, link versions).
///
/// **Stuck while Kafka answers.** Waiting out [`RESET_INTERVAL`] and three message timeouts is
/// too slow for a producer whose sends have a deadline (a link event's, `send_within`): in the
/// 2026-12-01 frozen/slow drill both primaries' producers delivered nothing for 33-36 s after
/// the single broker thawed, until three 30 s message timeouts replaced them, and a link
/// created meanwhile took 41.9 s to every rung (its window is 5 s). With a probe
/// ([`Self::with_probe`]), a producer that failed or missed its deadline
/// [`RESET_AFTER_FAILURES`] times in a row asks a fresh client whether Kafka answers (at most
/// every [`PROBE_EVERY_MAX`]); if it does, the producer is replaced at once (then at most every
/// [`STUCK_GAP_MIN`], doubling while it keeps happening), and its queued and in-flight messages
/// are purged, so the sends still waiting on it fail now and their callers retry on the new
/// one. While Kafka answers no one (the freeze itself) nothing is replaced.
pub struct HealingProducer<P: Send + 'static = ZProducer> {
    config: ClientConfig,
    make: MakeProducer<P>,
    current: RwLock<SharedProducer<P>>,
    health: Mutex<Health>,
    resets: IntCounter,
    interval: Duration,
    /// A fresh client's settings and the topic it asks for ([`Self::with_probe`]).
    probe: Option<(ClientConfig, String)>,
}

struct Health {
    failures: u32,
    last_reset: Option<Instant>,
    /// When a fresh client may next ask Kafka whether it answers.
    probe_at: Option<Instant>,
    /// How long after the last replacement one for being stuck may come.
    stuck_gap: Duration,
}

impl HealingProducer {
    /// Creates the first producer from `config`; `resets` counts replacements.
    pub fn new(config: ClientConfig, resets: IntCounter) -> KafkaResult<Self> {
        Self::with_maker(config, resets, |c| c.create_with_context(Quiet::default()))
    }

    /// Sends one record on the current producer and reports its outcome ([`Self::delivered`],
    /// [`Self::failed`]): what a caller that sends one message at a time needs.
    pub async fn send<K, P>(
        &self,
        record: rdkafka::producer::FutureRecord<'_, K, P>,
        queue_timeout: Duration,
    ) -> rdkafka::producer::future_producer::OwnedDeliveryResult
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        let used = self.producer();
        let sent = used.send(record, queue_timeout).await;
        self.settled(&used, &sent).await;
        sent
    }

    /// [`Self::send`], waiting at most `deadline` for the acknowledgement: `None` when it did
    /// not come in time. The message stays queued on its producer and may still be delivered;
    /// the miss counts like a failed send.
    pub async fn send_within<K, P>(
        &self,
        record: rdkafka::producer::FutureRecord<'_, K, P>,
        queue_timeout: Duration,
        deadline: Duration,
    ) -> Option<rdkafka::producer::future_producer::OwnedDeliveryResult>
    where
        K: rdkafka::message::ToBytes + ?Sized,
        P: rdkafka::message::ToBytes + ?Sized,
    {
        let used = self.producer();
        match tokio::time::timeout(deadline, used.send(record, queue_timeout)).await {
            Ok(sent) => {
                self.settled(&used, &sent).await;
                Some(sent)
            }
            Err(_) => {
                self.missed(&used);
                self.after_failure(&used, false).await;
                None
            }
        }
    }

    async fn settled(
        &self,
        used: &SharedProducer,
        sent: &rdkafka::producer::future_producer::OwnedDeliveryResult,
    ) {
        match sent {
            Ok(_) => self.delivered(used),
            Err(_) => {
                let replaced = self.failed(used);
                self.after_failure(used, replaced).await;
            }
        }
    }

    /// After a failure or a miss on `used` (`replaced`: that already replaced it): asks the
    /// probe whether the producer is stuck while Kafka answers, and purges the producer that
    /// was replaced, so the sends still waiting on it fail now.
    async fn after_failure(&self, used: &SharedProducer, replaced: bool) {
        let replaced = replaced || self.probe_stuck(used).await;
        if replaced {
            used.purge(PurgeConfig::default().queue().inflight().non_blocking());
        }
    }

    /// Asks a fresh client whether Kafka answers, if [`Self::wants_probe`]; true if that
    /// replaced `used`.
    async fn probe_stuck(&self, used: &SharedProducer) -> bool {
        let Some((config, topic)) = self.probe.clone().filter(|_| self.wants_probe(used)) else {
            return false;
        };
        let answered = super::answers_off_runtime(config, topic).await;
        tracing::info!(
            answered,
            client_id = self.config.get("client.id").unwrap_or(""),
            "Kafka asked by a fresh client: the producer's sends fail"
        );
        answered && self.stuck(used)
    }
}

impl<P: Send + 'static> HealingProducer<P> {
    /// Creates the first producer from `config` with `make` (which also makes each
    /// replacement); `resets` counts replacements.
    pub fn with_maker(
        config: ClientConfig,
        resets: IntCounter,
        make: MakeProducer<P>,
    ) -> KafkaResult<Self> {
        let first = Arc::new(ClosesElsewhere::new(make(&config)?));
        Ok(HealingProducer {
            config,
            make,
            current: RwLock::new(first),
            health: Mutex::new(Health {
                failures: 0,
                last_reset: None,
                probe_at: None,
                stuck_gap: STUCK_GAP_MIN,
            }),
            resets,
            interval: RESET_INTERVAL,
            probe: None,
        })
    }

    /// Lets a producer that keeps failing ask a fresh client built from `config` (the brokers
    /// and TLS settings of the producer: [`super::probe_config`]) for `topic`'s metadata, and
    /// be replaced at once if Kafka answers that client (see the type's documentation).
    pub fn with_probe(mut self, config: ClientConfig, topic: &str) -> Self {
        self.probe = Some((config, topic.to_string()));
        self
    }

    /// Replaces at most once per `interval` instead of [`RESET_INTERVAL`].
    pub fn reset_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The producer to send with; report the outcome with [`Self::delivered`] or
    /// [`Self::failed`].
    pub fn producer(&self) -> SharedProducer<P> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn is_current(&self, used: &SharedProducer<P>) -> bool {
        Arc::ptr_eq(
            used,
            &self.current.read().unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// A send on `used` was acknowledged.
    pub fn delivered(&self, used: &SharedProducer<P>) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_current(used) {
            h.failures = 0;
            h.stuck_gap = STUCK_GAP_MIN;
        }
    }

    /// A send on `used` was not acknowledged within its caller's deadline: it counts towards
    /// the failures in a row, but replaces the producer only through the probe
    /// ([`Self::stuck`]).
    pub fn missed(&self, used: &SharedProducer<P>) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_current(used) {
            h.failures += 1;
        }
    }

    /// Whether `used`, still current and failing [`RESET_AFTER_FAILURES`] times in a row,
    /// should ask a fresh client if Kafka answers: at most every [`PROBE_EVERY_MAX`], and only
    /// with a probe configured. Claims the probe's turn.
    fn wants_probe(&self, used: &SharedProducer<P>) -> bool {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if self.probe.is_none()
            || !self.is_current(used)
            || h.failures < RESET_AFTER_FAILURES
            || h.probe_at.is_some_and(|t| now < t)
        {
            return false;
        }
        h.probe_at = Some(now + PROBE_EVERY_MAX);
        true
    }

    /// Kafka answered a fresh client while `used` kept failing: replaces it, unless it is no
    /// longer current or was replaced less than the current gap ago (which then doubles, up to
    /// the reset interval). True if it replaced it.
    fn stuck(&self, used: &SharedProducer<P>) -> bool {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if !self.is_current(used)
            || h.failures < RESET_AFTER_FAILURES
            || h.last_reset.is_some_and(|t| t.elapsed() < h.stuck_gap)
        {
            return false;
        }
        let replaced = self.replace(&mut h, "stuck while Kafka answers a fresh client");
        if replaced {
            h.stuck_gap = (h.stuck_gap * 2).min(self.interval.max(STUCK_GAP_MIN));
        }
        replaced
    }

    /// A send on `used` failed; returns true if that replaced the producer. Failures of a
    /// producer already replaced do not count against the new one.
    pub fn failed(&self, used: &SharedProducer<P>) -> bool {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if !self.is_current(used) {
            return false;
        }
        h.failures += 1;
        let due = h.last_reset.is_none_or(|t| t.elapsed() >= self.interval);
        if h.failures < RESET_AFTER_FAILURES || !due {
            return false;
        }
        self.replace(&mut h, "consecutive failed sends")
    }

    /// Puts a fresh producer in place of the current one; false if making it failed.
    fn replace(&self, h: &mut Health, why: &'static str) -> bool {
        let fresh = match (self.make)(&self.config) {
            Ok(p) => Arc::new(ClosesElsewhere::new(p)),
            Err(e) => {
                tracing::error!(error = %e, "Kafka producer: creating a replacement failed");
                return false;
            }
        };
        tracing::warn!(
            failures = h.failures,
            client_id = self.config.get("client.id").unwrap_or(""),
            why,
            "Kafka producer: replaced"
        );
        h.failures = 0;
        h.last_reset = Some(Instant::now());
        self.resets.inc();
        // The old producer closes when its last send lets go of it, on a thread of its own.
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::producer;

    #[test]
    fn a_producer_failing_sends_in_a_row_is_replaced_at_most_once_per_interval() {
        let resets = IntCounter::new("resets", "replacements").unwrap();
        // Nothing listens there: creating a producer does not connect.
        let config = producer("127.0.0.1:9", "healing-test");
        let h = HealingProducer::new(config, resets.clone()).unwrap();
        let first = h.producer();
        assert!(!h.failed(&first));
        assert!(!h.failed(&first));
        h.delivered(&first);
        assert!(!h.failed(&first), "a delivery ends the run of failures");
        assert!(!h.failed(&first));
        assert!(h.failed(&first), "the third failure in a row replaces it");
        assert_eq!(resets.get(), 1);
        let second = h.producer();
        assert!(!Arc::ptr_eq(&first, &second));
        for _ in 0..5 {
            assert!(
                !h.failed(&first),
                "late failures of the old one do not count"
            );
        }
        for _ in 0..5 {
            assert!(!h.failed(&second), "not again within the interval");
        }
        assert!(Arc::ptr_eq(&second, &h.producer()));
        assert_eq!(resets.get(), 1);

        // Still failing when the interval has passed: the next failure replaces it.
        let h = h.reset_interval(Duration::ZERO);
        assert!(h.failed(&second));
        assert!(!Arc::ptr_eq(&second, &h.producer()));
        assert_eq!(resets.get(), 2);
    }

    #[test]
    fn a_producer_stuck_while_kafka_answers_is_replaced_at_once_then_at_doubling_gaps() {
        let resets = IntCounter::new("resets", "replacements").unwrap();
        let config = producer("127.0.0.1:9", "healing-test");
        let h = HealingProducer::new(config.clone(), resets.clone())
            .unwrap()
            .with_probe(config, "links");
        let first = h.producer();
        h.missed(&first);
        h.missed(&first);
        assert!(!h.wants_probe(&first), "two misses are not a run yet");
        h.missed(&first);
        assert!(
            h.wants_probe(&first),
            "the third miss in a row asks a fresh client"
        );
        assert!(
            !h.wants_probe(&first),
            "at most one probe per PROBE_EVERY_MAX"
        );
        assert!(h.stuck(&first), "Kafka answered: replaced at once");
        assert_eq!(resets.get(), 1);
        let second = h.producer();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(!h.stuck(&first), "the old one is no longer current");
        for _ in 0..RESET_AFTER_FAILURES {
            h.missed(&second);
        }
        assert!(!h.stuck(&second), "not again within the gap");
        assert_eq!(resets.get(), 1);
        {
            let health = h.health.lock().unwrap();
            assert_eq!(health.stuck_gap, STUCK_GAP_MIN * 2, "the gap doubled");
        }
        h.delivered(&second);
        let health = h.health.lock().unwrap();
        assert_eq!(health.failures, 0);
        assert_eq!(
            health.stuck_gap, STUCK_GAP_MIN,
            "a delivery brings the gap back"
        );
    }

    #[test]
    fn misses_alone_never_replace_a_producer_without_a_probe() {
        let resets = IntCounter::new("resets", "replacements").unwrap();
        let h =
            HealingProducer::new(producer("127.0.0.1:9", "healing-test"), resets.clone()).unwrap();
        let first = h.producer();
        for _ in 0..10 {
            h.missed(&first);
        }
        assert!(!h.wants_probe(&first), "no probe configured");
        assert!(Arc::ptr_eq(&first, &h.producer()));
        assert_eq!(resets.get(), 0);
        assert!(
            h.failed(&first),
            "a failed send after the misses replaces it (the interval path)"
        );
    }

    #[tokio::test]
    async fn a_send_past_its_deadline_is_a_miss_and_an_unanswered_probe_replaces_nothing() {
        let resets = IntCounter::new("resets", "replacements").unwrap();
        // Nothing listens on port 9: no send is acknowledged and the probe gets no answer.
        let config = producer("127.0.0.1:9", "healing-test");
        let h = HealingProducer::new(config, resets.clone())
            .unwrap()
            .with_probe(crate::kafka::probe_config("127.0.0.1:9", "probe"), "links");
        let first = h.producer();
        for n in 1..=RESET_AFTER_FAILURES {
            let record = rdkafka::producer::FutureRecord::<str, str>::to("links").payload("x");
            let sent = h
                .send_within(record, Duration::from_millis(10), Duration::from_millis(50))
                .await;
            assert!(sent.is_none(), "no acknowledgement within the deadline");
            assert_eq!(h.health.lock().unwrap().failures, n);
        }
        assert!(
            h.health.lock().unwrap().probe_at.is_some(),
            "the third miss asked a fresh client"
        );
        assert!(Arc::ptr_eq(&first, &h.producer()), "Kafka answered no one");
        assert_eq!(resets.get(), 0);
    }
}
