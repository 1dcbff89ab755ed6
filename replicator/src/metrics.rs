//! Every replicator metric, registered in one place under `zlink_replicator_`.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

pub struct Metrics {
    registry: Registry,
    /// Events handled, by outcome: put, delete, skipped (not newer than S3), dlq.
    pub events: IntCounterVec,
    /// S3 failures by kind: transient (retried), permanent (dead-lettered).
    pub s3_failures: IntCounterVec,
    /// From the change in primary to S3 confirming the object, for create events, seconds.
    pub create_to_s3_seconds: Histogram,
    /// One attempt of one step of applying an event (read_version, put_blob, delete_tombstone,
    /// put_tombstone, delete_blob, record_version), failed attempts included, seconds.
    pub step_seconds: HistogramVec,
    /// Messages behind the partition's high watermark.
    pub consumer_lag: IntGaugeVec,
    /// Consumers replaced because they stalled (`zlink_clients::kafka::StallWatch`).
    pub consumer_resets: IntCounter,
    /// Dead-letter producers replaced after consecutive failed sends (`HealingProducer`).
    pub dlq_producer_resets: IntCounter,
    /// Change-journal objects written.
    pub journal_objects: IntCounter,
    /// The Kafka cluster as its metadata shows it (every 2 s): brokers in it, and partitions
    /// of any topic with fewer in-sync replicas than replicas (under-replicated) or no leader
    /// (offline). A fenced broker (killed or hung) leaves the broker count and its partitions
    /// go under-replicated while every produce and fetch still succeeds.
    pub kafka_brokers: prometheus::IntGauge,
    pub kafka_partitions: IntGaugeVec,
    /// The store ↔ S3 audit (`crate::audit`): links and objects compared, by source (sweep,
    /// listing, recheck).
    pub audit_checked: IntCounterVec,
    /// Drift found, by kind (missing, stale, orphan), and drift repaired.
    pub audit_found: IntCounterVec,
    pub audit_repaired: IntCounterVec,
    /// Drift found and not repaired yet, by kind: what the last resort would serve wrong now.
    pub audit_drift: IntGaugeVec,
    /// Slices the sweep could not finish (store or S3 failing): checked again.
    pub audit_failures: IntCounter,
    /// Slices checked, and whole passes over the links and over the bucket.
    pub audit_slices: IntCounter,
    pub audit_passes: IntCounterVec,
    /// Where the sweep is in its pass over the token ring, 0..1.
    pub audit_position: prometheus::Gauge,
    /// 1 while this replicator holds the audit lease (sweeps).
    pub audit_leader: prometheus::IntGauge,
    /// Objects written and waiting for their read-back; read-backs dropped (queue full).
    pub audit_recheck_queue: prometheus::IntGauge,
    pub audit_recheck_dropped: IntCounter,
}

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("zlink_replicator".into()), None).expect("valid prefix");
        let events = IntCounterVec::new(
            Opts::new("events_total", "Link events by outcome"),
            &["outcome"],
        )
        .expect("metric");
        let s3_failures = IntCounterVec::new(
            Opts::new("s3_failures_total", "S3 failures by kind"),
            &["kind"],
        )
        .expect("metric");
        let create_to_s3_seconds = Histogram::with_opts(
            HistogramOpts::new("create_to_s3_seconds", "Link creation to blob in S3").buckets(
                vec![
                    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ],
            ),
        )
        .expect("metric");
        let step_seconds = HistogramVec::new(
            HistogramOpts::new(
                "step_seconds",
                "One attempt of one step of applying an event",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["step"],
        )
        .expect("metric");
        let consumer_lag = IntGaugeVec::new(
            Opts::new("consumer_lag", "Messages not yet consumed, per partition"),
            &["partition"],
        )
        .expect("metric");
        let consumer_resets = IntCounter::new(
            "consumer_resets_total",
            "Kafka consumers replaced because they stalled",
        )
        .expect("metric");
        let dlq_producer_resets = IntCounter::new(
            "dlq_producer_resets_total",
            "Dead-letter Kafka producers replaced after consecutive failed sends",
        )
        .expect("metric");
        let journal_objects =
            IntCounter::new("journal_objects_total", "Change-journal objects written")
                .expect("metric");
        let kafka_brokers =
            prometheus::IntGauge::new("kafka_brokers", "Brokers in the Kafka cluster's metadata")
                .expect("metric");
        let kafka_partitions = IntGaugeVec::new(
            Opts::new(
                "kafka_partitions",
                "Kafka partitions (every topic) by state: under_replicated (fewer in-sync \
                 replicas than replicas), offline (no leader)",
            ),
            &["state"],
        )
        .expect("metric");
        let audit_checked = IntCounterVec::new(
            Opts::new(
                "audit_checked_total",
                "Links and objects the S3 audit compared with the store, by source",
            ),
            &["source"],
        )
        .expect("metric");
        let audit_found = IntCounterVec::new(
            Opts::new(
                "audit_drift_found_total",
                "S3 objects found differing from the store, by kind",
            ),
            &["kind"],
        )
        .expect("metric");
        let audit_repaired = IntCounterVec::new(
            Opts::new(
                "audit_repaired_total",
                "S3 drift repaired from the store, by kind",
            ),
            &["kind"],
        )
        .expect("metric");
        let audit_drift = IntGaugeVec::new(
            Opts::new(
                "audit_drift",
                "S3 drift found and not repaired yet, by kind",
            ),
            &["kind"],
        )
        .expect("metric");
        for kind in ["missing", "stale", "orphan"] {
            audit_drift.with_label_values(&[kind]).set(0);
            audit_found.with_label_values(&[kind]);
            audit_repaired.with_label_values(&[kind]);
        }
        let audit_failures = IntCounter::new(
            "audit_failures_total",
            "Audit slices or read-backs not finished because the store or S3 failed",
        )
        .expect("metric");
        let audit_slices =
            IntCounter::new("audit_slices_total", "Audit slices checked").expect("metric");
        let audit_passes = IntCounterVec::new(
            Opts::new(
                "audit_passes_total",
                "Whole audit passes, over the links and over the bucket",
            ),
            &["side"],
        )
        .expect("metric");
        let audit_position = prometheus::Gauge::new(
            "audit_position_ratio",
            "Where the audit is in its pass over the token ring",
        )
        .expect("metric");
        let audit_leader = prometheus::IntGauge::new(
            "audit_leader",
            "1 while this replicator holds the audit lease",
        )
        .expect("metric");
        let audit_recheck_queue = prometheus::IntGauge::new(
            "audit_recheck_queue",
            "Objects written and waiting to be read back",
        )
        .expect("metric");
        let audit_recheck_dropped = IntCounter::new(
            "audit_recheck_dropped_total",
            "Read-backs dropped because the queue was full",
        )
        .expect("metric");
        zlink_clients::register_metrics!(
            registry,
            audit_checked,
            audit_found,
            audit_repaired,
            audit_drift,
            audit_failures,
            audit_slices,
            audit_passes,
            audit_position,
            audit_leader,
            audit_recheck_queue,
            audit_recheck_dropped,
            kafka_brokers,
            kafka_partitions,
            events,
            s3_failures,
            create_to_s3_seconds,
            step_seconds,
            consumer_lag,
            consumer_resets,
            dlq_producer_resets,
            journal_objects,
        );
        Self {
            registry,
            events,
            s3_failures,
            create_to_s3_seconds,
            step_seconds,
            consumer_lag,
            consumer_resets,
            dlq_producer_resets,
            journal_objects,
            kafka_brokers,
            kafka_partitions,
            audit_checked,
            audit_found,
            audit_repaired,
            audit_drift,
            audit_failures,
            audit_slices,
            audit_passes,
            audit_position,
            audit_leader,
            audit_recheck_queue,
            audit_recheck_dropped,
        }
    }

    pub fn render(&self) -> Vec<u8> {
        zlink_clients::ops::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
