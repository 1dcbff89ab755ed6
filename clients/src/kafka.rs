//! The Kafka client settings every zlink process shares, so producers agree on durability and
//! every client comes back quickly after a broker restart.

use rdkafka::config::ClientConfig;

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
