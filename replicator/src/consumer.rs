//! The `links` consumer group: one worker per partition (so one slug's events stay in order),
//! offsets stored only after S3 confirmed (librdkafka auto-commits stored offsets), events that
//! can never apply go to the dead-letter topic and the partition keeps moving. A consumer that
//! stalls (messages wait, none arrive, nothing is being applied) is replaced by a fresh one
//! ([`zlink_clients::kafka::StallWatch`]).

use crate::apply::{decode, Applier, ApplyError};
use crate::journal::{Done, Journal};
use crate::metrics::Metrics;
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::FutureRecord;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zlink_clients::kafka::{
    Activity, Busy, ClosingConsumer, HealingProducer, Replaceable, StallWatch,
};
use zlink_clients::trace::{self, Span};
use zlink_wire::events::LinkEvent;

#[derive(Debug, Clone, clap::Args)]
pub struct KafkaConfig {
    /// Kafka bootstrap servers.
    #[arg(long, env = "ZLINK_KAFKA", default_value = "127.0.0.1:9092")]
    pub kafka: String,
    /// Consumer group of all replicator instances.
    #[arg(
        long,
        env = "ZLINK_REPLICATOR_GROUP",
        default_value = "zlink-replicator"
    )]
    pub group_id: String,
    /// Static group membership: an id unique to this instance and stable across its restarts
    /// (e.g. the pod name), so it gets its partitions back at once after a restart of its own
    /// or of Kafka and ε holds. Empty: a dynamic member (rejoining waits out the old session,
    /// 10 s).
    #[arg(long, env = "ZLINK_GROUP_INSTANCE_ID", default_value = "")]
    pub group_instance_id: String,
    #[arg(long, env = "ZLINK_LINKS_TOPIC", default_value = "links")]
    pub links_topic: String,
    /// Where events that can never be applied go.
    #[arg(long, env = "ZLINK_LINKS_DLQ_TOPIC", default_value = "links-dlq")]
    pub dlq_topic: String,
    /// How often the change journal is written while events arrive, milliseconds (one S3 PUT
    /// each; an event's offset is stored after it).
    #[arg(long, env = "ZLINK_JOURNAL_INTERVAL_MS", default_value_t = 200)]
    pub journal_interval_ms: u64,
    /// Seconds a consumer may go without progress while events wait (or Kafka does not say)
    /// before it is replaced by a fresh one; doubling, up to 300 s, while it stays stalled.
    /// Longer than the group session (30 s), so a rebalance that waits out a departed member's
    /// session is not taken for a stall.
    #[arg(long, env = "ZLINK_CONSUMER_STALL_SECS", default_value_t = 45)]
    pub consumer_stall_secs: u64,
    /// Events of one partition applied at once (never two of one link at once, so a link's
    /// events keep their order). Each event waits on S3 and the store several times; one at a
    /// time, 200 creates a second over 6 partitions kept the replicator's workers 80% busy.
    #[arg(long, env = "ZLINK_REPLICATOR_LANES", default_value_t = 8)]
    pub lanes: usize,
}

impl KafkaConfig {
    pub fn validate(&self) -> Result<(), String> {
        use zlink_clients::kafka::is_topic_name;
        if !self.group_instance_id.is_empty() && !is_topic_name(&self.group_instance_id) {
            return Err("--group-instance-id must be 1-249 characters of [A-Za-z0-9._-]".into());
        }
        if !is_topic_name(&self.links_topic)
            || !is_topic_name(&self.dlq_topic)
            || !is_topic_name(&self.group_id)
        {
            return Err("--links-topic, --dlq-topic and --group-id must be 1-249 characters of [A-Za-z0-9._-]".into());
        }
        if self.kafka.trim().is_empty() {
            return Err("--kafka is required".into());
        }
        if !(5..=3600).contains(&self.consumer_stall_secs) {
            return Err("--consumer-stall-secs must be between 5 and 3600".into());
        }
        if !(10..=5000).contains(&self.journal_interval_ms) {
            return Err("--journal-interval-ms must be between 10 and 5000".into());
        }
        if !(1..=64).contains(&self.lanes) {
            return Err("--lanes must be between 1 and 64".into());
        }
        Ok(())
    }
}

pub struct Pipeline {
    /// The consumer in use; replaced when it stalls or fails fatally.
    consumer: Replaceable,
    activity: Arc<Activity>,
    journal: Arc<Journal>,
    /// Replaces itself after failed sends (a producer can stay stuck after a broker freeze).
    dlq: HealingProducer,
    cfg: KafkaConfig,
    applier: Arc<Applier>,
    metrics: Arc<Metrics>,
}

/// An event of a partition the journal does not have yet.
#[derive(Debug, PartialEq, Eq)]
struct Unjournaled {
    offset: i64,
    /// The link key it touches (none: it could not be decoded).
    key: Option<String>,
    applied: bool,
}

/// One partition's events from their start to the journal: which links have an event being
/// applied (a link's next event waits for it), and the offsets in order, released to the
/// journal only as a prefix of applied events (an offset is stored only once every event
/// before it in the partition is applied).
#[derive(Default)]
struct Window {
    busy: HashSet<String>,
    unjournaled: VecDeque<Unjournaled>,
}

impl Window {
    /// Whether an event touching `key` may start now: no event of that link is being applied,
    /// and fewer than [`MAX_UNJOURNALED`] wait for the journal.
    fn may_start(&self, key: Option<&str>) -> bool {
        self.unjournaled.len() < MAX_UNJOURNALED && key.is_none_or(|k| !self.busy.contains(k))
    }

    /// The event at `offset` (after every one started before) starts.
    fn start(&mut self, offset: i64, key: Option<String>) {
        debug_assert!(self.unjournaled.back().is_none_or(|e| e.offset < offset));
        if let Some(k) = &key {
            self.busy.insert(k.clone());
        }
        self.unjournaled.push_back(Unjournaled {
            offset,
            key,
            applied: false,
        });
    }

    /// The event at `offset` is applied; the events the journal may now have, in offset order.
    fn finish(&mut self, offset: i64) -> Vec<Unjournaled> {
        if let Some(e) = self.unjournaled.iter_mut().find(|e| e.offset == offset) {
            e.applied = true;
            if let Some(k) = &e.key {
                self.busy.remove(k);
            }
        }
        let ready = self.unjournaled.iter().take_while(|e| e.applied).count();
        self.unjournaled.drain(..ready).collect()
    }
}

/// At most this many events of a partition applied and waiting for an earlier one (still
/// being applied, e.g. retrying against S3) before the journal can have their offsets.
const MAX_UNJOURNALED: usize = 1024;

/// How often lag is reported and the stall watch looks.
const WATCH_EVERY: Duration = Duration::from_secs(5);

impl Pipeline {
    pub fn new(
        cfg: &KafkaConfig,
        applier: Arc<Applier>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Self>> {
        let dlq = HealingProducer::new(
            zlink_clients::kafka::producer(&cfg.kafka, "zlink-replicator-dlq"),
            metrics.dlq_producer_resets.clone(),
        )?;
        // The journal writer's name: the stable instance id, else one unique to this process.
        let writer = if cfg.group_instance_id.is_empty() {
            format!("r{}-{:x}", std::process::id(), zlink_clients::now_ms())
        } else {
            cfg.group_instance_id.clone()
        };
        let journal = Arc::new(Journal::new(
            applier.s3.clone(),
            writer,
            Duration::from_millis(cfg.journal_interval_ms),
            metrics.clone(),
        ));
        let connect_cfg = cfg.clone();
        Ok(Arc::new(Pipeline {
            consumer: Replaceable::new(move || Self::connect(&connect_cfg))?.with_probe(
                zlink_clients::kafka::probe_config(&cfg.kafka, "zlink-replicator-probe"),
            ),
            activity: Arc::default(),
            journal,
            dlq,
            cfg: cfg.clone(),
            applier,
            metrics,
        }))
    }

    /// A consumer subscribed to the links topic.
    fn connect(cfg: &KafkaConfig) -> rdkafka::error::KafkaResult<ClosingConsumer> {
        // Only offsets we stored (after S3 confirmed) are ever committed.
        let consumer: zlink_clients::kafka::ZConsumer =
            zlink_clients::kafka::manual_store_consumer(
                &cfg.kafka,
                &cfg.group_id,
                &cfg.group_instance_id,
                500,
            )
            // Events are small and latency matters more than batching.
            .set("socket.nagle.disable", "true")
            .set("fetch.wait.max.ms", "50")
            .create_with_context(zlink_clients::kafka::Quiet::default())?;
        consumer.subscribe(&[&cfg.links_topic])?;
        Ok(ClosingConsumer::new(consumer))
    }

    fn consumer(&self) -> Arc<ClosingConsumer> {
        self.consumer.current()
    }

    /// Partitions the group currently assigns to this instance.
    pub fn assigned_partitions(&self) -> usize {
        self.consumer().assignment().map(|a| a.count()).unwrap_or(0)
    }

    /// True when the cluster answers a metadata request; records what the metadata says of
    /// its health (brokers, under-replicated and offline partitions) in the metrics.
    pub fn kafka_reachable(&self) -> bool {
        let Ok(md) = self.consumer().fetch_metadata(None, Duration::from_secs(1)) else {
            return false;
        };
        let h = zlink_clients::kafka::ClusterHealth::of(&md);
        self.metrics.kafka_brokers.set(h.brokers as i64);
        let parts = &self.metrics.kafka_partitions;
        parts
            .with_label_values(&["under_replicated"])
            .set(h.under_replicated as i64);
        parts.with_label_values(&["offline"]).set(h.offline as i64);
        md.topics()
            .iter()
            .any(|t| t.name() == self.cfg.links_topic && t.error().is_none())
    }

    /// Consumes until `shutdown`, then lets workers stop and commits what was stored. A consumer
    /// the watch finds stalled is dropped (closing on a thread of its own) for a fresh one;
    /// what it had not committed is delivered again and applied again, which changes nothing.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let watch = tokio::spawn(self.clone().watch(shutdown.clone()));
        let journal = tokio::spawn(self.journal.clone().run(shutdown.clone()));
        let last = loop {
            let (consumer, stop) = self.consumer.start(&shutdown);
            self.consume(&consumer, &stop).await;
            if shutdown.is_cancelled() {
                break Some(consumer);
            }
            drop(consumer);
            if !self.consumer.replace(&shutdown).await {
                break None;
            }
        };
        // The journal's last write stores the offsets it covers; then they are committed.
        let _ = journal.await;
        if let Some(consumer) = last {
            if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                tracing::debug!(error = %e, "final commit");
            }
        }
        let _ = watch.await;
        tracing::info!("consumer stopped");
    }

    /// One consumer's loop: hands each message to its partition's worker until `stop` (or the
    /// consumer failed fatally), then waits for the workers.
    async fn consume(self: &Arc<Self>, consumer: &Arc<ClosingConsumer>, stop: &CancellationToken) {
        let mut workers: HashMap<i32, mpsc::Sender<(OwnedMessage, Busy)>> = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => break,
                m = consumer.recv() => m,
            };
            let msg = match msg {
                Ok(m) => m.detach(),
                Err(e) => {
                    tracing::warn!(error = %e, "kafka receive error");
                    if zlink_clients::kafka::is_fatal(consumer) {
                        self.metrics.consumer_resets.inc();
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            self.activity.received();
            let busy = self.activity.begin();
            let partition = msg.partition();
            let tx = workers.entry(partition).or_insert_with(|| {
                let (tx, rx) = mpsc::channel(256);
                tasks.spawn(
                    self.clone()
                        .worker(consumer.clone(), partition, rx, stop.clone()),
                );
                tx
            });
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tx.send((msg, busy)) => {}
            }
        }
        drop(workers);
        while tasks.join_next().await.is_some() {}
    }

    /// Applies one partition's events, up to `--lanes` at once but never two of one slug at
    /// once (a slug's events stay in offset order), and hands each to the journal in offset
    /// order: an offset is stored only once every event before it in the partition is done.
    async fn worker(
        self: Arc<Self>,
        consumer: Arc<ClosingConsumer>,
        partition: i32,
        mut rx: mpsc::Receiver<(OwnedMessage, Busy)>,
        shutdown: CancellationToken,
    ) {
        let lanes = self.cfg.lanes.max(1);
        let mut running = FuturesUnordered::new();
        let mut window = Window::default();
        // A received event waiting for its link's earlier event, or for a free lane.
        let mut waiting: Option<(OwnedMessage, Busy, Result<LinkEvent, ApplyError>)> = None;
        let mut closed = false;
        loop {
            if let Some((_, _, ev)) = &waiting {
                let key = ev.as_ref().ok().map(|ev| ev.key.as_str());
                if running.len() < lanes && window.may_start(key) {
                    let (msg, busy_guard, ev) = waiting.take().expect("checked");
                    window.start(msg.offset(), ev.as_ref().ok().map(|ev| ev.key.to_string()));
                    running.push(self.apply_one(msg, ev, busy_guard, partition, &shutdown));
                    continue;
                }
            }
            if closed && waiting.is_none() && running.is_empty() {
                return;
            }
            tokio::select! {
                m = rx.recv(), if waiting.is_none() && !closed => match m {
                    Some((msg, busy_guard)) => {
                        let ev = decode(msg.payload());
                        waiting = Some((msg, busy_guard, ev));
                    }
                    None => closed = true,
                },
                Some(done) = running.next(), if !running.is_empty() => {
                    let Some(offset) = done else {
                        // Shutdown while retrying: nothing more of this partition is stored.
                        return;
                    };
                    for e in window.finish(offset) {
                        self.journal.record(
                            e.key.as_deref(),
                            Done {
                                consumer: consumer.clone(),
                                topic: self.cfg.links_topic.clone(),
                                partition,
                                offset: e.offset,
                            },
                        );
                    }
                }
            }
        }
    }

    /// Applies one event (or dead-letters it); its offset once done, `None` if shutdown came
    /// first.
    async fn apply_one(
        &self,
        msg: OwnedMessage,
        ev: Result<LinkEvent, ApplyError>,
        _busy: Busy,
        partition: i32,
        shutdown: &CancellationToken,
    ) -> Option<i64> {
        // The change's trace continues from the message's `traceparent` (set by primary's
        // relay): a `replicate.apply` span with the S3 writes under it, and `trace_id` in
        // every log line about this event.
        let parent = trace::kafka_traceparent(msg.headers());
        let mut span = Span::server("replicate.apply", parent);
        span.set("partition", i64::from(partition));
        span.set("offset", msg.offset());
        let ctx = *span.ctx();
        let result = async {
            let ev = ev?;
            let outcome = self.applier.apply(&ev, shutdown).await?;
            tracing::info!(slug = %ev.key, version = ev.version,
                outcome = outcome.label(), "link event applied");
            Ok(outcome)
        };
        let result = trace::in_scope(ctx, result).await;
        if let Err(ApplyError::Permanent(reason)) = &result {
            span.fail(reason);
        }
        span.end();
        match result {
            Ok(outcome) => self
                .metrics
                .events
                .with_label_values(&[outcome.label()])
                .inc(),
            Err(ApplyError::Permanent(reason)) => {
                if !trace::in_scope(ctx, self.dead_letter(&msg, &reason, shutdown)).await {
                    return None;
                }
                self.metrics.events.with_label_values(&["dlq"]).inc();
            }
            Err(ApplyError::Cancelled) => return None,
        }
        Some(msg.offset())
    }

    /// Copies the message to the dead-letter topic with the reason; true once Kafka has it.
    async fn dead_letter(
        &self,
        msg: &OwnedMessage,
        reason: &str,
        shutdown: &CancellationToken,
    ) -> bool {
        tracing::error!(partition = msg.partition(), offset = msg.offset(), reason = ?reason, "dead-lettering link event");
        let source = format!("{}/{}/{}", msg.topic(), msg.partition(), msg.offset());
        loop {
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "zlink-error",
                    value: Some(reason),
                })
                .insert(Header {
                    key: "zlink-source",
                    value: Some(&source),
                });
            let mut record = FutureRecord::to(&self.cfg.dlq_topic).headers(headers);
            if let Some(k) = msg.key() {
                record = record.key(k);
            }
            if let Some(p) = msg.payload() {
                record = record.payload(p);
            }
            match self.dlq.send(record, Duration::from_secs(5)).await {
                Ok(_) => return true,
                Err((e, _)) => tracing::warn!(error = %e, "dead-letter publish failed; retrying"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// Every [`WATCH_EVERY`] (every second while it makes no progress with events waiting:
    /// [`StallWatch::next_check`]): the lag per assigned partition, and whether the consumer has
    /// stalled; a stalled one's loop is stopped so [`Self::run`] puts a fresh one in its place.
    async fn watch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut stall = StallWatch::new(
            Duration::from_secs(self.cfg.consumer_stall_secs),
            Instant::now(),
        );
        let mut looked = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(stall.wait_after(WATCH_EVERY, looked)) => {}
            }
            looked = Instant::now();
            self.consumer
                .check_stall(
                    &self.cfg.links_topic,
                    &mut stall,
                    &self.activity,
                    &self.metrics.consumer_lag,
                    &self.metrics.consumer_resets,
                )
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(v: Vec<Unjournaled>) -> Vec<i64> {
        v.into_iter().map(|e| e.offset).collect()
    }

    #[test]
    fn offsets_reach_the_journal_in_order_and_a_link_runs_one_event_at_a_time() {
        let mut w = Window::default();
        w.start(10, Some("a".into()));
        assert!(!w.may_start(Some("a")), "a's next event waits for this one");
        assert!(w.may_start(Some("b")) && w.may_start(None));
        w.start(11, Some("b".into()));
        w.start(12, None);
        // Later events done first: nothing is released while 10 is being applied.
        assert!(w.finish(12).is_empty());
        assert!(w.finish(11).is_empty());
        assert!(w.may_start(Some("b")), "b is free again");
        w.start(13, Some("b".into()));
        let ready = w.finish(10);
        assert_eq!(offsets(ready), vec![10, 11, 12]);
        assert!(w.may_start(Some("a")));
        let ready = w.finish(13);
        assert_eq!(
            ready,
            vec![Unjournaled {
                offset: 13,
                key: Some("b".into()),
                applied: true
            }]
        );
        assert!(w.finish(13).is_empty(), "a second finish releases nothing");
    }

    #[test]
    fn a_stuck_event_holds_back_at_most_max_unjournaled() {
        let mut w = Window::default();
        w.start(0, Some("stuck".into()));
        for o in 1..MAX_UNJOURNALED as i64 {
            assert!(w.may_start(None));
            w.start(o, None);
            assert!(w.finish(o).is_empty());
        }
        assert!(!w.may_start(None), "the window is full");
        assert_eq!(w.finish(0).len(), MAX_UNJOURNALED);
        assert!(w.may_start(Some("stuck")));
    }
}
