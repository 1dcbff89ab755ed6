//! The Kafka client settings every zlink process shares, so producers agree on durability and
//! every client comes back quickly after a broker restart.

use prometheus::{IntCounter, IntGaugeVec};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaResult;
use rdkafka::producer::FutureProducer;
use rdkafka::TopicPartitionList;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Reconnect quickly after a broker restart, and leave a hung broker quickly.
///
/// librdkafka's default backs off up to 10 s between attempts, which alone broke the 5 s
/// create → S3 window after a Kafka restart; 1 s at most costs a few connection attempts per
/// second while a broker is down.
///
/// A hung broker (SIGSTOP, a stalled disk) accepts connections and never answers. The cluster
/// fences it after `broker.session.timeout.ms` (2 s in the local cluster, deploy/local/lib/cluster.sh)
/// and moves its partitions' leadership; a client learns of the move from its metadata. By
/// default a request to the hung broker waits 60 s (`socket.timeout.ms`) and metadata is
/// refreshed every 5 minutes: measured on a 3-broker cluster, links created while one broker
/// hung reached S3 after 13 s (p50) to 31 s (p99). Here a request waits at most 2 s (then the
/// connection is dropped and metadata refreshed) and metadata is refreshed every 500 ms, so a
/// producer and a consumer follow a new leader within half a second of its election (the
/// price: one small metadata request per client twice a second).
pub fn reconnect_fast(c: &mut ClientConfig) -> &mut ClientConfig {
    c.set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "1000")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "500")
        .set("socket.timeout.ms", "2000")
        .set("topic.metadata.refresh.interval.ms", "500")
}

/// An idempotent, `acks=all` producer: a retried send never duplicates or reorders within a
/// partition, and an acknowledged message is on every in-sync replica.
pub fn producer(brokers: &str, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // How long the partition leader waits for the in-sync replicas: a hung follower is out
        // of the ISR once fenced (2 s); meanwhile the send is answered and retried, not held.
        .set("request.timeout.ms", "2000")
        // Small messages: Nagle would hold them back behind delayed ACKs.
        .set("socket.nagle.disable", "true")
        .set("client.id", client_id);
    reconnect_fast(&mut c);
    c
}

/// What a cluster's metadata says of its health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterHealth {
    /// Brokers in the metadata (a fenced broker is not).
    pub brokers: usize,
    /// Partitions with fewer in-sync replicas than replicas.
    pub under_replicated: usize,
    /// Partitions without a leader.
    pub offline: usize,
}

impl ClusterHealth {
    pub fn of(md: &rdkafka::metadata::Metadata) -> Self {
        Self::count(
            md.brokers().len(),
            md.topics()
                .iter()
                .flat_map(|t| t.partitions())
                .map(|p| (p.leader(), p.replicas().len(), p.isr().len())),
        )
    }

    /// From (leader, replicas, in-sync replicas) of every partition; a leader below 0 is none.
    pub fn count(brokers: usize, partitions: impl Iterator<Item = (i32, usize, usize)>) -> Self {
        let mut h = ClusterHealth {
            brokers,
            ..Default::default()
        };
        for (leader, replicas, isr) in partitions {
            if leader < 0 {
                h.offline += 1;
            }
            if isr < replicas {
                h.under_replicated += 1;
            }
        }
        h
    }
}

/// A Kafka client handle that is dropped on a thread of its own. Dropping a librdkafka handle
/// waits for its threads, and closing a consumer leaves its group; either can block for long
/// (rust-rdkafka #509, #611 — seen here after the broker restarted under a consumer), which must
/// hold neither a runtime thread nor a graceful shutdown. The close still runs; the process just
/// does not wait for it.
pub struct ClosesElsewhere<T: Send + 'static>(Option<T>);

/// A consumer closed on a thread of its own (see [`ClosesElsewhere`]).
pub type ClosingConsumer = ClosesElsewhere<StreamConsumer>;

impl<T: Send + 'static> ClosesElsewhere<T> {
    pub fn new(client: T) -> Self {
        ClosesElsewhere(Some(client))
    }
}

impl<T: Send + 'static> std::ops::Deref for ClosesElsewhere<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("present until dropped")
    }
}

impl<T: Send + 'static> Drop for ClosesElsewhere<T> {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            let spawned = std::thread::Builder::new()
                .name("kafka-close".into())
                .spawn(move || drop(c));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to close a Kafka client on; leaking it");
            }
        }
    }
}

/// Consecutive failed sends after which a [`HealingProducer`] replaces its producer...
pub const RESET_AFTER_FAILURES: u32 = 3;
/// ...at most this often: during a real outage a new producer fails like the old one.
pub const RESET_INTERVAL: Duration = Duration::from_secs(30);

/// One producer in use, shared by the sends that started on it.
pub type SharedProducer = Arc<ClosesElsewhere<FutureProducer>>;

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
pub struct HealingProducer {
    config: ClientConfig,
    current: RwLock<SharedProducer>,
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
        let first = Arc::new(ClosesElsewhere::new(config.create()?));
        Ok(HealingProducer {
            config,
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
    pub fn producer(&self) -> SharedProducer {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn is_current(&self, used: &SharedProducer) -> bool {
        Arc::ptr_eq(
            used,
            &self.current.read().unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// A send on `used` was acknowledged.
    pub fn delivered(&self, used: &SharedProducer) {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_current(used) {
            h.failures = 0;
        }
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

    /// A send on `used` failed; returns true if that replaced the producer. Failures of a
    /// producer already replaced do not count against the new one.
    pub fn failed(&self, used: &SharedProducer) -> bool {
        let mut h = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if !self.is_current(used) {
            return false;
        }
        h.failures += 1;
        let due = h.last_reset.is_none_or(|t| t.elapsed() >= self.interval);
        if h.failures < RESET_AFTER_FAILURES || !due {
            return false;
        }
        let fresh = match self.config.create::<FutureProducer>() {
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

/// The consumer a service uses now, replaced when it stalls ([`StallWatch`]) or fails fatally
/// ([`is_fatal`]). The service runs one loop per consumer ([`Self::start`]); a loop ends when
/// the watch calls [`Self::stop_current`] or the consumer died, and [`Self::replace`] puts a
/// fresh consumer in place. The old one closes on a thread of its own once nothing holds it.
pub struct Replaceable {
    current: RwLock<Arc<ClosingConsumer>>,
    generation: Mutex<tokio_util::sync::CancellationToken>,
    connect: Box<dyn Fn() -> KafkaResult<ClosingConsumer> + Send + Sync>,
}

impl Replaceable {
    /// Connects the first consumer with `connect` (also used for every replacement).
    pub fn new(
        connect: impl Fn() -> KafkaResult<ClosingConsumer> + Send + Sync + 'static,
    ) -> KafkaResult<Self> {
        Ok(Replaceable {
            current: RwLock::new(Arc::new(connect()?)),
            generation: Mutex::new(tokio_util::sync::CancellationToken::new()),
            connect: Box::new(connect),
        })
    }

    /// The consumer in use.
    pub fn current(&self) -> Arc<ClosingConsumer> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The consumer for the next loop, and the token that stops that loop: `shutdown`'s child,
    /// also cancelled by [`Self::stop_current`].
    pub fn start(
        &self,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> (Arc<ClosingConsumer>, tokio_util::sync::CancellationToken) {
        let stop = shutdown.child_token();
        *self.generation.lock().unwrap_or_else(|p| p.into_inner()) = stop.clone();
        (self.current(), stop)
    }

    /// Stops the current consumer's loop (the watch found it stalled).
    pub fn stop_current(&self) {
        self.generation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .cancel();
    }

    /// One round of a stall watch on `topic`: asks Kafka (off the runtime) how far the current
    /// consumer is behind, sets `lag` per assigned partition and, when `stall` finds it stalled
    /// (given what `activity` saw since the last round), counts it in `resets` and stops its loop
    /// so the service replaces it. Returns the [`Backlog`] (its `answered` is Kafka's liveness).
    pub async fn check_stall(
        &self,
        topic: &str,
        stall: &mut StallWatch,
        activity: &Activity,
        lag: &IntGaugeVec,
        resets: &IntCounter,
    ) -> Backlog {
        let (consumer, t) = (self.current(), topic.to_owned());
        let backlog = tokio::task::spawn_blocking(move || backlog(&consumer, &t))
            .await
            .unwrap_or_default();
        for (p, l) in &backlog.lags {
            lag.with_label_values(&[&p.to_string()]).set(*l);
        }
        let (received, busy) = activity.take();
        if stall.observe(Instant::now(), received, busy, &backlog) {
            tracing::warn!(
                topic,
                waiting = ?backlog.waiting,
                assigned = backlog.lags.len(),
                "Kafka consumer stalled: messages wait (or Kafka does not say) and none arrived; replacing it"
            );
            resets.inc();
            self.stop_current();
        }
        backlog
    }

    /// After a loop ended other than by `shutdown`: a second later (two members fencing each
    /// other, e.g. a duplicate `--group-instance-id`, alternate once a second instead of
    /// spinning), a fresh consumer in place of the current one, retried every second. False if
    /// `shutdown` came first.
    pub async fn replace(&self, shutdown: &tokio_util::sync::CancellationToken) -> bool {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            match (self.connect)() {
                Ok(fresh) => {
                    *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                    return true;
                }
                Err(e) => tracing::error!(error = %e, "creating a Kafka consumer failed"),
            }
        }
    }
}

/// Kafka topic, group and instance ids we accept: 1-249 characters of `[A-Za-z0-9._-]`.
pub fn is_topic_name(t: &str) -> bool {
    (1..=249).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

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

/// How far a consumer, or with nothing assigned to it its whole group, is behind its topic.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// Messages behind the high watermark, per partition assigned to this consumer.
    pub lags: Vec<(i32, i64)>,
    /// `Some(true)`: messages wait for this consumer (with nothing assigned: for its group);
    /// `Some(false)`: none wait; `None`: Kafka did not say.
    pub waiting: Option<bool>,
    /// With nothing assigned: the group's committed offsets summed over the topic, so that a
    /// group making progress on another member is not taken for stalled.
    pub group_position: Option<i64>,
    /// Kafka answered (a partition's watermarks or, with nothing assigned, the topic's
    /// metadata): what readiness needs, without asking a second time.
    pub answered: bool,
}

/// Asks Kafka how far `consumer` is behind on `topic`. Blocking (several requests of at most
/// 1-2 s each): call it from `spawn_blocking`.
pub fn backlog(consumer: &StreamConsumer, topic: &str) -> Backlog {
    let assigned = consumer.assignment().map(|a| a.count()).unwrap_or(0);
    if assigned > 0 {
        let lags = consumer_lag(consumer);
        let waiting = if lags.iter().any(|(_, l)| *l > 0) {
            Some(true)
        } else if lags.len() == assigned {
            Some(false)
        } else {
            None
        };
        return Backlog {
            answered: !lags.is_empty(),
            lags,
            waiting,
            group_position: None,
        };
    }
    // Nothing assigned to this member: it is only stalled if its group is (a member that lost
    // its assignment and never got one back is what a stuck consumer looked like here).
    let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(1)) else {
        return Backlog::default();
    };
    let answered = Backlog {
        answered: true,
        ..Backlog::default()
    };
    let mut all = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            all.add_partition(topic, p.id());
        }
    }
    if all.count() == 0 {
        return answered;
    }
    // The coordinator not answering says nothing is known (and, if it lasts, is the stall).
    let Ok(committed) = consumer.committed_offsets(all, Duration::from_secs(2)) else {
        return answered;
    };
    let (mut waiting, mut known, mut position) = (false, true, 0i64);
    for e in committed.elements() {
        let Ok((low, high)) =
            consumer.fetch_watermarks(topic, e.partition(), Duration::from_secs(1))
        else {
            known = false;
            continue;
        };
        let at = e
            .offset()
            .to_raw()
            .filter(|o| *o >= 0)
            .unwrap_or(low)
            .max(low);
        position += at;
        waiting |= high > at;
    }
    Backlog {
        lags: Vec::new(),
        waiting: (waiting || known).then_some(waiting),
        group_position: known.then_some(position),
        answered: true,
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

/// Messages behind the high watermark, per partition assigned to `consumer`. Blocking (it asks
/// the broker): call it from `spawn_blocking`.
pub fn consumer_lag(consumer: &StreamConsumer) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    let Ok(positions) = consumer.position() else {
        return out;
    };
    // Before the first message of a partition arrives its position is unknown; then the
    // committed offset is where consumption stands.
    let committed = consumer.committed(Duration::from_secs(1)).ok();
    for e in positions.elements() {
        let Ok((low, high)) =
            consumer.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(1))
        else {
            continue;
        };
        let pos = e
            .offset()
            .to_raw()
            .filter(|o| *o >= 0)
            .or_else(|| {
                committed
                    .as_ref()?
                    .find_partition(e.topic(), e.partition())?
                    .offset()
                    .to_raw()
                    .filter(|o| *o >= 0)
            })
            .unwrap_or(0);
        // Below the low watermark is where nothing can be read (retention removed it).
        out.push((e.partition(), (high - pos.max(low)).max(0)));
    }
    out
}

/// The consumer settings both background services share: group `group`, offsets stored by the
/// service only after its work is durable ([`store_done`]) and auto-committed every
/// `commit_interval_ms`, reading from the earliest offset when the group has none.
///
/// With an `instance_id` the member is static (`group.instance.id`): after a broker restart or
/// its own restart it takes its partitions back at once. A dynamic member that lost its session
/// while the broker was down rejoins as a new member, and the group waits for the old one's
/// session to expire (10 s) before anyone consumes — measured: every link created in the 10 s
/// after a Kafka restart reached S3 only then, outside ε.
pub fn manual_store_consumer(
    brokers: &str,
    group: &str,
    instance_id: &str,
    commit_interval_ms: u32,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", commit_interval_ms.to_string())
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "30000")
        .set("heartbeat.interval.ms", "1000");
    if !instance_id.is_empty() {
        c.set("group.instance.id", instance_id);
    }
    reconnect_fast(&mut c);
    c
}

/// After a receive error: whether librdkafka declared the consumer dead (a fatal error, e.g. a
/// static member fenced by a newer member with its instance id: the consumer that replaced a
/// stalled one, or a stalled one that came back after its replacement joined). A dead consumer
/// never consumes again; the caller replaces it ([`Replaceable::replace`]). Nothing is
/// lost: offsets are only ever stored after the work is durable.
pub fn is_fatal(consumer: &StreamConsumer) -> bool {
    match consumer.client().fatal_error() {
        Some((code, reason)) => {
            tracing::error!(?code, reason, "Kafka consumer failed fatally; replacing it");
            true
        }
        None => false,
    }
}

/// Marks the message at `offset` as done: the next commit makes `offset + 1` the group's
/// position. librdkafka's `rd_kafka_offset_store` adds the 1 itself, so the message's own
/// offset is passed (passing `offset + 1` once skipped an event per partition on every
/// restart). A partition revoked meanwhile refuses it; its new owner redoes the work, which
/// both services make idempotent.
pub fn store_done(consumer: &StreamConsumer, topic: &str, partition: i32, offset: i64) {
    if let Err(e) = consumer.store_offset(topic, partition, offset) {
        tracing::debug!(partition, error = %e, "offset not stored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_health_counts_partitions_short_of_replicas_and_without_a_leader() {
        // Three brokers, one fenced: its partitions lost it from the ISR; one lost its leader.
        let parts = [(1, 3, 3), (2, 3, 2), (-1, 3, 1), (3, 1, 1)];
        assert_eq!(
            ClusterHealth::count(2, parts.into_iter()),
            ClusterHealth {
                brokers: 2,
                under_replicated: 2,
                offline: 1
            }
        );
        assert_eq!(
            ClusterHealth::count(1, std::iter::empty()),
            ClusterHealth {
                brokers: 1,
                ..Default::default()
            }
        );
    }

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
