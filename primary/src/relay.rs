//! Link events to Kafka, with the outbox guarantee: once a change returned to the client, its
//! event reaches the `links` topic eventually, whatever crashes or Kafka outages happen.
//!
//! Every change writes an outbox row `(slug, at_ms, version)` *before* the store change (see
//! `api`), then hands the resulting event here:
//! - **fast path**: publish the event (idempotent producer, acks=all, keyed by slug) and delete
//!   the row once Kafka acknowledged it — milliseconds after the change in normal operation.
//!   An event whose partition's leader has not acknowledged it within `--kafka-reroute-after-ms`
//!   goes to another partition (`zlink_clients::kafka::steer`: a broker its clients cannot reach may
//!   still lead; no consumer needs the events of one slug in order);
//! - **sweeper** (one instance at a time, under a lease): every second, rows older than
//!   [`SWEEP_AFTER_MS`] — left by a crash, a Kafka outage or a slow fast path — are
//!   republished from the link's *current* state in the store (a SERIAL read). A row whose
//!   change never happened (the link is missing or older than the row's version) is kept for
//!   [`ABANDON_AFTER_MS`] in case the change is still in flight, then dropped.
//!
//! Duplicates are possible (fast path and sweeper overlapping, retries after a lost ack) and
//! harmless: events carry the link version and the replicator applies only newer versions.
//! The same leased loop runs the expiry scheduler.

use crate::events::link_event;
use crate::events::{kind_label, EventSink};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::write::{self, Change};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureRecord, Producer};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use zlink_clients::clock::Clock;
use zlink_clients::kafka::HealingProducer;
use zlink_clients::trace::{self, Span, TraceContext};
use zlink_store::outbox::{expiry_bucket, OutboxRow, OUTBOX_SHARDS};
use zlink_store::{Link, StoreError};
use zlink_wire::events::{ClickRef, LinkEvent, LinkEventKind};
use zlink_wire::LinkStatus;

/// The sweeper leaves younger rows to the fast path.
pub const SWEEP_AFTER_MS: i64 = 2_000;
/// A row whose change is not in the store after this long never happened.
pub const ABANDON_AFTER_MS: i64 = 30_000;
const LEASE: &str = "outbox-relay";
const LEASE_TTL_S: i32 = 10;
const SWEEP_BATCH: i32 = 500;
/// How far before the last scan's end a shard's next scan starts when that scan found nothing
/// live: a row carries its primary's clock at the start of its request, so one that is written
/// late (a slow request) or by a primary whose clock is behind still falls in the next scan.
const SWEEP_OVERLAP_MS: i64 = 60_000;
/// Every this often the sweeper scans each shard from its start (a row older than the overlap
/// — a primary's clock far behind — is found then).
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Where each outbox shard's next sweep starts. Published rows are deleted, and Cassandra
/// keeps a deleted row as a tombstone that every scan over it reads, until gc_grace (10 days)
/// has passed and compaction dropped it: a scan from the start of a shard would read every
/// change of the last 10 days, every second, and at a few hundred thousand changes per shard
/// it fails outright (Cassandra's tombstone_failure_threshold, 100,000). A shard's scan starts
/// at the oldest row the previous scan found still there, else [`SWEEP_OVERLAP_MS`] before
/// where it ended; every [`FULL_SWEEP_EVERY`], and when this instance takes the lease, from
/// the start.
struct SweepMarks {
    from: Vec<i64>,
    full_at: Option<std::time::Instant>,
}

impl SweepMarks {
    fn new() -> Self {
        SweepMarks {
            from: vec![i64::MIN; OUTBOX_SHARDS as usize],
            full_at: None,
        }
    }

    /// Where each shard's scan starts this round (all from the start when a full sweep is due).
    fn start(&mut self, now: std::time::Instant) {
        if self
            .full_at
            .is_none_or(|t| now.duration_since(t) >= FULL_SWEEP_EVERY)
        {
            self.from.fill(i64::MIN);
            self.full_at = Some(now);
        }
    }

    fn from(&self, shard: i32) -> i64 {
        self.from[shard as usize]
    }

    /// A scan of `shard` up to `before_ms` found `oldest_left` as its oldest row still there
    /// after the sweep (None: none left).
    fn scanned(&mut self, shard: i32, before_ms: i64, oldest_left: Option<i64>) {
        self.from[shard as usize] = oldest_left.unwrap_or(before_ms - SWEEP_OVERLAP_MS);
    }

    /// The scan of `shard` up to `before_ms` failed. One from the shard's start (too many
    /// tombstones for Cassandra, or the store down) is not tried again before the next full
    /// sweep: until then the shard is scanned from [`SWEEP_OVERLAP_MS`] before `before_ms`.
    fn failed(&mut self, shard: i32, before_ms: i64) {
        let from = &mut self.from[shard as usize];
        if *from == i64::MIN {
            *from = before_ms - SWEEP_OVERLAP_MS;
        }
    }

    /// The lease went elsewhere: whoever had it may have left rows anywhere.
    fn reset(&mut self) {
        self.full_at = None;
    }
}

pub struct KafkaSettings {
    pub brokers: String,
    pub links_topic: String,
    /// How long the producer keeps retrying one message before reporting failure.
    pub message_timeout: Duration,
    /// How long an event waits for its partition's leader before it goes to another partition.
    pub reroute_after: Duration,
}

/// How long a partition leader that missed `reroute_after` is avoided.
const SUSPECT_FOR: Duration = Duration::from_secs(5);
/// How often each primary reads the `links` partitions' leaders.
const LEADERS_EVERY: Duration = Duration::from_secs(1);

pub struct Relay {
    /// Replaced after consecutive failed publishes (librdkafka can stay stuck after a frozen
    /// broker thaws; see `HealingProducer`).
    producer: HealingProducer,
    topic: String,
    /// Which partition each event goes to (its slug's, unless that leader does not answer).
    steer: zlink_clients::kafka::steer::Steer,
    reroute_after: Duration,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    clock: Arc<dyn Clock>,
    /// This instance's lease identity.
    holder: String,
}

impl Relay {
    pub fn new(
        k: &KafkaSettings,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
        instance: &str,
    ) -> Result<Arc<Self>, KafkaError> {
        let mut config = zlink_clients::kafka::producer(&k.brokers, &format!("zlink-{instance}"));
        config
            .set(
                "message.timeout.ms",
                k.message_timeout.as_millis().to_string(),
            )
            .set("linger.ms", "2");
        // A producer that keeps missing while Kafka answers a fresh client is replaced at once
        // (librdkafka can stay stuck after a frozen broker thaws; see `HealingProducer`).
        let probe =
            zlink_clients::kafka::probe_config(&k.brokers, &format!("zlink-{instance}-probe"));
        let producer = HealingProducer::new(config, metrics.producer_resets.clone())?
            .with_probe(probe, &k.links_topic);
        Ok(Arc::new(Relay {
            producer,
            steer: zlink_clients::kafka::steer::Steer::new(&k.links_topic, SUSPECT_FOR),
            reroute_after: k.reroute_after,
            topic: k.links_topic.clone(),
            store,
            metrics,
            clock,
            holder: format!("{instance}-{}", uuid::Uuid::new_v4().simple()),
        }))
    }

    /// Publishes `ev` under the trace of the change (`traceparent` of its outbox row): a
    /// `kafka.produce` span, and the message's `traceparent` header naming it, which the
    /// replicator continues.
    async fn publish(&self, ev: &LinkEvent, traceparent: Option<&str>) -> Result<(), KafkaError> {
        // A plain struct of strings and numbers: serialisation cannot fail.
        let payload = serde_json::to_vec(ev).unwrap_or_default();
        let mut span = match traceparent.and_then(TraceContext::parse) {
            Some(parent) => Span::child("kafka.produce", &parent),
            None => Span::server("kafka.produce", None),
        };
        span.set("topic", self.topic.clone());
        let tp = span.ctx().header();
        let key = ev.key.as_bytes();
        let record = |partition: Option<i32>| {
            let r = FutureRecord::to(&self.topic)
                .key(key)
                .payload(&payload)
                .headers(OwnedHeaders::new().insert(Header {
                    key: trace::TRACEPARENT,
                    value: Some(tp.as_str()),
                }));
            match partition {
                Some(p) => r.partition(p),
                None => r,
            }
        };
        const QUEUE: Duration = Duration::from_secs(5);
        let first = self.steer.pick(key, std::time::Instant::now());
        let sent = match first {
            None => self.producer.send(record(None), QUEUE).await,
            Some(p) => {
                match self
                    .producer
                    .send_within(record(Some(p)), QUEUE, self.reroute_after)
                    .await
                {
                    Some(Ok(d)) => Ok(d),
                    // Not acknowledged in time (or refused): its leader is avoided for a while
                    // and the event goes to the next partition. The first copy may still land;
                    // the replicator applies a version once.
                    _ => {
                        let now = std::time::Instant::now();
                        self.steer.suspect(p, now);
                        let next = self.steer.pick(key, now);
                        if next != Some(p) {
                            self.metrics.links_rerouted.inc();
                            span.set("rerouted_from", i64::from(p));
                        }
                        self.producer.send(record(next), QUEUE).await
                    }
                }
            }
        };
        match sent {
            Ok(d) => {
                span.set("partition", i64::from(d.partition));
                self.metrics
                    .events
                    .with_label_values(&["links", kind_label(ev.kind)])
                    .inc();
                Ok(())
            }
            Err((e, _)) => {
                span.fail(&e);
                self.metrics.publish_errors.inc();
                Err(e)
            }
        }
    }

    /// Publishes, then deletes the outbox row the handler wrote for this change.
    async fn publish_and_clear(&self, ev: &LinkEvent, row: &OutboxRow) -> Result<(), String> {
        self.publish(ev, row.traceparent.as_deref())
            .await
            .map_err(|e| format!("publish: {e}"))?;
        self.store
            .outbox
            .delete(row)
            .await
            .map_err(|e| format!("outbox delete: {e}"))
    }

    /// The sweeper's decision for one outbox row; true if the row is gone.
    async fn sweep_row(&self, row: &OutboxRow, now: i64) -> Result<bool, StoreError> {
        match self.store.links.get_serial(&row.key).await? {
            Some(link) if link.version >= row.version => {
                let ev = link_event(current_kind(&link), &link, now);
                if let Err(e) = self.publish_and_clear(&ev, row).await {
                    tracing::warn!(slug = %row.key, error = %e, "outbox sweep: publish failed; will retry");
                    return Ok(false);
                }
                Ok(true)
            }
            _ if row.at_ms < now - ABANDON_AFTER_MS => {
                tracing::info!(slug = %row.key, version = row.version, "outbox row for a change that never happened; dropping");
                self.store.outbox.delete(row).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn sweep(&self, marks: &mut SweepMarks) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let before = now - SWEEP_AFTER_MS;
        let mut seen = 0;
        let mut oldest = now;
        marks.start(std::time::Instant::now());
        for shard in 0..OUTBOX_SHARDS {
            let scanned = self
                .store
                .outbox
                .scan(shard, marks.from(shard), before, SWEEP_BATCH)
                .await;
            let rows = scanned.inspect_err(|_| marks.failed(shard, before))?;
            seen += rows.len();
            oldest = rows.iter().map(|r| r.at_ms).fold(oldest, i64::min);
            // Oldest first: the first row that is still there after its turn bounds the next
            // scan (a full page leaves its last row as the bound at worst).
            let mut left = None;
            for row in &rows {
                if !self.sweep_row(row, now).await? && left.is_none() {
                    left = Some(row.at_ms);
                }
            }
            if rows.len() == SWEEP_BATCH as usize && left.is_none() {
                left = rows.last().map(|r| r.at_ms);
            }
            marks.scanned(shard, before, left);
        }
        self.metrics.outbox_backlog.set(seen as i64);
        self.metrics
            .outbox_oldest_age
            .set((now - oldest).max(0) as f64 / 1000.0);
        Ok(seen)
    }

    /// Moves every ACTIVE link whose expiry has passed to EXPIRED (and announces it). Scans the
    /// hour buckets from the durable cursor up to now; a bucket entirely in the past is done.
    async fn expire_due(self: &Arc<Self>) -> Result<usize, StoreError> {
        let now = self.clock.now_ms();
        let current = expiry_bucket(now);
        let mut bucket = self.store.expiries.cursor("expiry", current).await?;
        let mut expired = 0;
        while bucket <= current {
            for (exp, slug) in self.store.expiries.scan(bucket, now).await? {
                let Some(link) = self.store.links.get_serial(&slug).await? else {
                    continue;
                };
                if link.status != LinkStatus::Active || link.expires_at_ms != Some(exp) {
                    continue;
                }
                let expire = Change::Status(LinkStatus::Expired, None);
                if let Some((updated, Some(row))) =
                    write::change(&self.store, true, link, expire, now).await?
                {
                    self.spawn_fast_path(link_event(LinkEventKind::Expired, &updated, now), row);
                    expired += 1;
                }
            }
            if bucket < current {
                self.store.expiries.set_cursor("expiry", bucket + 1).await?;
            }
            bucket += 1;
        }
        Ok(expired)
    }

    /// Reads the `links` partitions' leaders every [`LEADERS_EVERY`] (a metadata request on a
    /// blocking thread) for [`zlink_clients::kafka::steer::Steer`], until shutdown.
    pub async fn watch_leaders(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(LEADERS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let relay = self.clone();
            let read = tokio::task::spawn_blocking(move || {
                let producer = relay.producer.producer();
                relay.steer.refresh(producer.client(), LEADERS_EVERY)
            })
            .await;
            if let Ok(Err(e)) = read {
                tracing::debug!(topic = %self.steer.topic(), error = %e, "partition leaders not read");
            }
        }
    }

    fn spawn_fast_path(self: &Arc<Self>, ev: LinkEvent, row: OutboxRow) {
        let relay = self.clone();
        tokio::spawn(async move {
            if let Err(e) = relay.publish_and_clear(&ev, &row).await {
                // The row stays; the sweeper republishes it.
                tracing::warn!(slug = %ev.key, version = ev.version, error = %e, "link event not published yet");
            }
        });
    }

    /// The leased background loop: sweeper and expiry scheduler, once a second, until shutdown;
    /// then flushes the producer.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut marks = SweepMarks::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self
                .store
                .outbox
                .lease(LEASE, &self.holder, LEASE_TTL_S)
                .await
            {
                Ok(true) => {}
                Ok(false) => {
                    // Another instance sweeps and reports the backlog.
                    marks.reset();
                    self.metrics.outbox_backlog.set(0);
                    self.metrics.outbox_oldest_age.set(0.0);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay lease unavailable");
                    continue;
                }
            }
            if let Err(e) = self.sweep(&mut marks).await {
                tracing::warn!(error = %e, "outbox sweep failed");
            }
            match self.expire_due().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(expired = n, "links expired"),
                Err(e) => tracing::warn!(error = %e, "expiry pass failed"),
            }
        }
        // In-flight fast paths finish or leave their rows for the next sweeper.
        let _ = self.producer.producer().flush(Duration::from_secs(5));
    }
}

fn current_kind(link: &Link) -> LinkEventKind {
    match link.status {
        LinkStatus::Active if link.version == 1 => LinkEventKind::Created,
        LinkStatus::Active => LinkEventKind::Enabled,
        LinkStatus::Disabled => LinkEventKind::Disabled,
        LinkStatus::Expired => LinkEventKind::Expired,
        LinkStatus::Deleted => LinkEventKind::Deleted,
    }
}

/// The [`EventSink`] that publishes link events through the relay and spools clicks for the
/// click replayer (`zlink_clients::clicks`, the same code lastresort uses).
pub struct KafkaSink {
    pub relay: Arc<Relay>,
    pub clicks: Arc<zlink_clients::clicks::Clicks>,
}

impl EventSink for KafkaSink {
    fn link_changed(&self, ev: LinkEvent) {
        let row = OutboxRow::new(&ev.key, ev.at_ms, ev.version);
        self.relay.spawn_fast_path(ev, row);
    }

    fn uses_outbox(&self) -> bool {
        true
    }

    fn clicked(&self, ev: &ClickRef<'_>) -> bool {
        self.relay.metrics.click_events.inc();
        self.clicks
            .spool_event(ev, zlink_clients::trace::current().as_ref())
    }

    fn close(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.clicks.shutdown())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_shard_scan_starts_at_its_oldest_row_left_else_an_overlap_before_the_last_end() {
        let mut m = SweepMarks::new();
        let t0 = Instant::now();
        m.start(t0);
        assert_eq!(
            m.from(3),
            i64::MIN,
            "the first sweep reads every shard from its start"
        );
        m.scanned(3, 100_000, None);
        m.scanned(4, 100_000, Some(42_000));
        m.start(t0 + Duration::from_secs(1));
        assert_eq!(m.from(3), 100_000 - SWEEP_OVERLAP_MS);
        assert_eq!(m.from(4), 42_000, "a row still there bounds the next scan");
        assert_eq!(
            m.from(5),
            i64::MIN,
            "a shard not scanned yet starts at its start"
        );
    }

    #[test]
    fn every_shard_is_read_from_its_start_again_after_the_full_sweep_period() {
        let mut m = SweepMarks::new();
        let t0 = Instant::now();
        m.start(t0);
        m.scanned(0, 100_000, None);
        m.start(t0 + FULL_SWEEP_EVERY - Duration::from_secs(1));
        assert_eq!(m.from(0), 100_000 - SWEEP_OVERLAP_MS);
        m.start(t0 + FULL_SWEEP_EVERY);
        assert_eq!(m.from(0), i64::MIN);
    }

    #[test]
    fn a_failed_scan_from_the_start_is_not_retried_before_the_next_full_sweep() {
        let mut m = SweepMarks::new();
        let t0 = Instant::now();
        m.start(t0);
        m.failed(1, 100_000);
        m.scanned(2, 100_000, Some(7_000));
        m.failed(2, 100_000);
        m.start(t0 + Duration::from_secs(1));
        assert_eq!(m.from(1), 100_000 - SWEEP_OVERLAP_MS);
        assert_eq!(
            m.from(2),
            7_000,
            "an incremental scan that failed keeps its start"
        );
        m.start(t0 + FULL_SWEEP_EVERY);
        assert_eq!(m.from(1), i64::MIN);
    }

    #[test]
    fn a_lost_lease_means_a_full_sweep_when_it_comes_back() {
        let mut m = SweepMarks::new();
        let t0 = Instant::now();
        m.start(t0);
        m.scanned(0, 200_000, None);
        m.reset();
        m.start(t0 + Duration::from_secs(1));
        assert_eq!(m.from(0), i64::MIN);
    }
}
