//! Kafka, as every zlink process uses it: the client settings all of them share (producers
//! agree on durability, every client comes back quickly after a broker restart or leaves a hung
//! one quickly), the consumer settings of the background services, and the cluster's health.
//! What the clients are built from lives in the submodules: [`handle`] (a client closed on a
//! thread of its own), [`healing`] (a producer that replaces itself), [`replaceable`] (a
//! consumer that is replaced), [`stall`] (when a consumer has stalled), [`lag`] (how far
//! behind it is), [`steer`] (a keyed message around a partition leader that does not answer),
//! [`logs`] (librdkafka's log lines, repeats held back while a cluster is away).

mod handle;
mod healing;
mod lag;
mod logs;
mod replaceable;
mod stall;
pub mod steer;

pub use handle::{ClosesElsewhere, ClosingConsumer};
pub use healing::{HealingProducer, SharedProducer, RESET_AFTER_FAILURES, RESET_INTERVAL};
pub use lag::{answers, answers_off_runtime, backlog, consumer_lag, Backlog};
pub use logs::{Quiet, REPEAT_WINDOW};
pub use replaceable::Replaceable;
pub use stall::{
    Activity, Busy, StallWatch, PROBE_EVERY_MAX, STALL_AFTER_MAX, STUCK_AFTER, SUSPECT_EVERY,
};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, ConsumerContext, StreamConsumer};

/// zlink's consumers: rdkafka's stream consumer with the [`Quiet`] context.
pub type ZConsumer = StreamConsumer<Quiet>;
/// zlink's producers of one message at a time: rdkafka's future producer with [`Quiet`].
pub type ZProducer = rdkafka::producer::FutureProducer<Quiet>;

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

/// TLS to the brokers, for a client whose way to Kafka crosses a network it does not trust (the
/// last-resort hosts' click replay over the WAN). librdkafka speaks TLS through OpenSSL, not
/// rustls; what matters is the same: the broker's certificate is verified against the CA and
/// its name (`ssl.endpoint.identification.algorithm=https`: the bootstrap or advertised host,
/// a DNS name or an IP address) is checked. There is no switch to skip either.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KafkaTlsArgs {
    /// Speak TLS to Kafka, verifying the brokers against the system's CA store.
    #[arg(long, env = "ZLINK_KAFKA_TLS", default_value_t = false)]
    pub kafka_tls: bool,
    /// Speak TLS to Kafka, verifying the brokers against the CA certificates of this PEM file
    /// only (a private CA: Strimzi's cluster CA, the local topology's). Implies --kafka-tls.
    #[arg(long, env = "ZLINK_KAFKA_CA_FILE")]
    pub kafka_ca_file: Option<std::path::PathBuf>,
}

impl KafkaTlsArgs {
    pub fn enabled(&self) -> bool {
        self.kafka_tls || self.kafka_ca_file.is_some()
    }

    /// The CA file is PEM with at least one certificate usable as a trust anchor (checked with
    /// the same reader as `--s3-ca-file`), so a wrong path fails at start-up, not at the
    /// first replay.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(path) = &self.kafka_ca_file {
            let mut roots = rustls::RootCertStore::empty();
            crate::tls::read_ca_file("--kafka-ca-file", path, &mut roots)?;
        }
        Ok(())
    }

    /// The client settings: nothing when TLS is off.
    pub fn apply<'a>(&self, c: &'a mut ClientConfig) -> &'a mut ClientConfig {
        if self.enabled() {
            c.set("security.protocol", "ssl")
                .set("enable.ssl.certificate.verification", "true")
                .set("ssl.endpoint.identification.algorithm", "https");
            if let Some(path) = &self.kafka_ca_file {
                c.set("ssl.ca.location", path.display().to_string());
            }
        }
        c
    }
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

/// Kafka topic, group and instance ids we accept: 1-249 characters of `[A-Za-z0-9._-]`.
pub fn is_topic_name(t: &str) -> bool {
    (1..=249).contains(&t.len())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
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

/// The settings of a client that only asks whether Kafka answers ([`answers`]): the brokers,
/// no group, a request timeout of one second. The caller adds its TLS settings.
pub fn probe_config(brokers: &str, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", client_id)
        .set("socket.timeout.ms", "1000")
        .set("socket.connection.setup.timeout.ms", "1000");
    c
}

/// After a receive error: whether librdkafka declared the consumer dead (a fatal error, e.g. a
/// static member fenced by a newer member with its instance id: the consumer that replaced a
/// stalled one, or a stalled one that came back after its replacement joined). A dead consumer
/// never consumes again; the caller replaces it ([`Replaceable::replace`]). Nothing is
/// lost: offsets are only ever stored after the work is durable.
pub fn is_fatal<C: ConsumerContext>(consumer: &StreamConsumer<C>) -> bool {
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
pub fn store_done<C: ConsumerContext>(
    consumer: &StreamConsumer<C>,
    topic: &str,
    partition: i32,
    offset: i64,
) {
    if let Err(e) = consumer.store_offset(topic, partition, offset) {
        tracing::debug!(partition, error = %e, "offset not stored");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_tls_settings_verify_the_broker_and_are_absent_when_off() {
        let mut off = ClientConfig::new();
        KafkaTlsArgs::default().apply(&mut off);
        assert_eq!(off.get("security.protocol"), None);

        let ca = KafkaTlsArgs {
            kafka_tls: false,
            kafka_ca_file: Some("/etc/zlink/kafka-ca.crt".into()),
        };
        let mut on = ClientConfig::new();
        ca.apply(&mut on);
        assert_eq!(on.get("security.protocol"), Some("ssl"));
        assert_eq!(on.get("enable.ssl.certificate.verification"), Some("true"));
        assert_eq!(
            on.get("ssl.endpoint.identification.algorithm"),
            Some("https")
        );
        assert_eq!(on.get("ssl.ca.location"), Some("/etc/zlink/kafka-ca.crt"));

        let system = KafkaTlsArgs {
            kafka_tls: true,
            kafka_ca_file: None,
        };
        let mut sys = ClientConfig::new();
        system.apply(&mut sys);
        assert_eq!(sys.get("security.protocol"), Some("ssl"));
        assert_eq!(sys.get("ssl.ca.location"), None);
    }

    #[test]
    fn a_kafka_ca_file_that_is_not_a_certificate_fails_validation_naming_the_flag() {
        let dir = std::env::temp_dir().join(format!("zlink-kafka-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("not-a-ca.pem");
        std::fs::write(&bad, "hello").unwrap();
        let args = KafkaTlsArgs {
            kafka_tls: false,
            kafka_ca_file: Some(bad),
        };
        let err = args.validate().unwrap_err();
        assert!(err.starts_with("--kafka-ca-file "), "{err}");
        let missing = KafkaTlsArgs {
            kafka_tls: false,
            kafka_ca_file: Some(dir.join("absent.pem")),
        };
        assert!(missing.validate().unwrap_err().contains("absent.pem"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// CPU time of the calling thread (user + system), from `getrusage(RUSAGE_THREAD)`.
    fn thread_cpu() -> std::time::Duration {
        // SAFETY: getrusage writes only into the rusage it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        let tv = |t: libc::timeval| {
            std::time::Duration::from_secs(t.tv_sec as u64)
                + std::time::Duration::from_micros(t.tv_usec as u64)
        };
        tv(u.ru_utime) + tv(u.ru_stime)
    }

    /// vendor/rdkafka's patch: a poll whose deadline is less than a millisecond away waits for
    /// it instead of polling librdkafka with a timeout of 0 in a loop. Each poll below ends
    /// 0.9 ms past a whole millisecond: with upstream's truncation the thread spun through those
    /// 0.9 ms every time (about 36 ms of CPU in all), with the patch it sleeps through them.
    #[test]
    fn a_producer_poll_sleeps_through_its_last_millisecond_instead_of_spinning() {
        use rdkafka::producer::{BaseProducer, Producer};
        // Nothing listens there: no broker is needed to poll the producer's own queue.
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("log_level", "0")
            .create()
            .expect("a producer");
        producer.poll(std::time::Duration::ZERO);
        let (t0, cpu0) = (std::time::Instant::now(), thread_cpu());
        for _ in 0..40 {
            producer.poll(std::time::Duration::from_micros(1900));
        }
        let (wall, cpu) = (t0.elapsed(), thread_cpu() - cpu0);
        assert!(wall >= std::time::Duration::from_millis(76), "{wall:?}");
        // Spinning costs about as much CPU as the wall time it spans (36 ms of 76); sleeping,
        // a few µs per poll. A tenth of the wall time is far from both.
        assert!(
            cpu < wall / 10,
            "{cpu:?} of CPU in {wall:?} of polls: the poll spins"
        );
        assert_eq!(producer.in_flight_count(), 0);
    }

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
}
