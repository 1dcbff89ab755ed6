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
