//! A producer that replaces itself when it keeps failing.

use super::handle::ClosesElsewhere;
use super::{Quiet, ZProducer};
use prometheus::IntCounter;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Consecutive failed sends after which a [`HealingProducer`] replaces its producer...
pub const RESET_AFTER_FAILURES: u32 = 3;
/// ...at most this often: during a real outage a new producer fails like the old one.
pub const RESET_INTERVAL: Duration = Duration::from_secs(30);

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
pub struct HealingProducer<P: Send + 'static = ZProducer> {
    config: ClientConfig,
    make: MakeProducer<P>,
    current: RwLock<SharedProducer<P>>,
    health: Mutex<Health>,
    resets: IntCounter,
    interval: Duration,
}

struct Health {
    failures: u32,
    last_reset: Option<Instant>,
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
        match &sent {
            Ok(_) => self.delivered(&used),
            Err(_) => {
                self.failed(&used);
            }
        }
        sent
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
            }),
            resets,
            interval: RESET_INTERVAL,
        })
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
        }
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
            "Kafka producer: replaced after consecutive failed sends"
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
}
