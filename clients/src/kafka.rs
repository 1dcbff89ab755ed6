//! The Kafka client settings every zlink process shares, so producers agree on durability and
//! every client comes back quickly after a broker restart.

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use std::time::Duration;

/// Reconnect quickly after a broker restart. librdkafka's default backs off up to 10 s between
/// attempts, which alone broke the 5 s create → S3 window after a Kafka restart; 1 s at most
/// costs a few connection attempts per second while a broker is down.
pub fn reconnect_fast(c: &mut ClientConfig) -> &mut ClientConfig {
    c.set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "1000")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "500")
}

/// An idempotent, `acks=all` producer: a retried send never duplicates or reorders within a
/// partition, and an acknowledged message is on every in-sync replica.
pub fn producer(brokers: &str, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Small messages: Nagle would hold them back behind delayed ACKs.
        .set("socket.nagle.disable", "true")
        .set("client.id", client_id);
    reconnect_fast(&mut c);
    c
}

/// A consumer that closes on a thread of its own when dropped. Closing leaves the group, and
/// librdkafka can block in that close indefinitely (rust-rdkafka #509, #611 — seen here after
/// the broker restarted under a consumer): that must hold neither a runtime thread nor a
/// graceful shutdown. The close still runs; the process just does not wait for it.
pub struct ClosingConsumer(Option<rdkafka::consumer::StreamConsumer>);

impl ClosingConsumer {
    pub fn new(c: rdkafka::consumer::StreamConsumer) -> Self {
        ClosingConsumer(Some(c))
    }
}

impl std::ops::Deref for ClosingConsumer {
    type Target = rdkafka::consumer::StreamConsumer;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for ClosingConsumer {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            let spawned = std::thread::Builder::new()
                .name("kafka-close".into())
                .spawn(move || drop(c));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to close the Kafka consumer on; leaking it");
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
        let Ok((_, high)) =
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
        out.push((e.partition(), (high - pos).max(0)));
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

/// After a receive error: if librdkafka declared the consumer dead (a fatal error, e.g. a static
/// member fenced after its session ran out during a broker outage longer than
/// `session.timeout.ms`), exits so the supervisor restarts the process with a fresh consumer.
/// Nothing is lost: offsets are only ever stored after the work is durable.
pub fn exit_if_fatal(consumer: &StreamConsumer) {
    if let Some((code, reason)) = consumer.client().fatal_error() {
        tracing::error!(
            ?code,
            reason,
            "Kafka consumer failed fatally; exiting to be restarted"
        );
        std::process::exit(70);
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
