//! The click counter (binary `counter`, component `clicks`): consumes the `clicks` topic
//! and keeps per-link aggregates in ScyllaDB, counting every event exactly once.
//!
//! Loop: take whole messages until they hold `--batch-max` clicks (a message holds one or more,
//! one per line) or `--batch-wait-ms` passed, split them by source (partition of the topic),
//! count each source's part with its [`SourceCounter`] (the sources at the same time; see
//! [`zlink_store::clicks`] for why each click is counted once), and only then store the
//! batch's offsets for librdkafka's auto-commit. A crash anywhere re-delivers at most the
//! uncommitted batches, and counting them again changes nothing. A consumer that stalls
//! (clicks wait, none arrive, no batch is being counted) is replaced by a fresh one
//! ([`kafka::StallWatch`]), and the sources start over.

//!
//! Modules: [`config`] (its command line), [`metrics`] (`zlink_clicks_*`); the loop is here.
//! Shaped like the replicator: a crate and a binary of its own, depending on the store, the
//! clients and the wire format, never on `primary`.

pub mod config;
pub mod metrics;

pub use config::CountConfig;
pub use metrics::CounterMetrics;

use rdkafka::consumer::{CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use zlink_clients::backoff::Backoff;
use zlink_clients::kafka;
use zlink_clients::kafka::{Activity, ClosingConsumer, Replaceable, StallWatch};
use zlink_clients::now_ms;
use zlink_clients::ops::{Ops, Readiness};
use zlink_store::clicks::writer::{source_name, Limits, SourceCounter};
use zlink_store::clicks::{ClickStore, Counted, FIRST_CLICK_MS};
use zlink_store::{Db, StoreError};
use zlink_wire::events::{click_lines, ClickEvent, CLICK_EVENT_SCHEMA};

/// How long a source's state is kept without a batch for it.
const SOURCE_IDLE: Duration = Duration::from_secs(300);

/// The events of a `clicks` message (one per line, [`click_lines`]), each decoded, or why a
/// line cannot be one; an absent or blank payload is one `empty`.
pub fn decode_all(payload: Option<&[u8]>, now_ms: i64) -> Vec<Result<ClickEvent, &'static str>> {
    let mut out: Vec<_> = click_lines(payload.unwrap_or_default())
        .map(|line| decode(Some(line), now_ms))
        .collect();
    if out.is_empty() {
        out.push(Err("empty"));
    }
    out
}

/// One click event (a line of a `clicks` message) to count, or why it cannot be one.
pub fn decode(payload: Option<&[u8]>, now_ms: i64) -> Result<ClickEvent, &'static str> {
    let ev: ClickEvent = serde_json::from_slice(payload.ok_or("empty")?).map_err(|_| "json")?;
    if ev.schema != CLICK_EVENT_SCHEMA {
        return Err("schema");
    }
    if !ev.key.is_valid() {
        return Err("slug");
    }
    // Before 2020 (FIRST_CLICK_MS): a broken clock or a forgery; the stats read no further back.
    if ev.at_ms < FIRST_CLICK_MS || ev.at_ms > now_ms + 86_400_000 {
        return Err("time");
    }
    Ok(ev)
}

/// How far behind the counter is, in seconds: with `waiting` messages not yet consumed, the
/// time since `since`, a moment every waiting message was written after (so it bounds how
/// long they have waited); 0 when none waits.
pub fn behind_seconds(waiting: i64, since_ms: i64, now_ms: i64) -> f64 {
    if waiting <= 0 {
        return 0.0;
    }
    (now_ms - since_ms).max(0) as f64 / 1000.0
}

/// The composition root of `counter run`: the consumer, the store's click statements and the
/// metrics, wired once ([`App::build`]); [`App::run`] counts until shutdown.
pub struct App {
    /// The consumer in use; replaced when it stalls or fails fatally.
    consumer: Replaceable,
    activity: Arc<Activity>,
    /// Kafka timestamp (ms) of the newest message consumed; at start, the start time.
    newest_consumed_ms: std::sync::atomic::AtomicI64,
    clicks: Arc<ClickStore>,
    db: Arc<Db>,
    cfg: CountConfig,
    pub metrics: Arc<CounterMetrics>,
}

impl App {
    /// From a validated config and a connected session: the consumer (not yet consuming) and
    /// the prepared statements.
    pub async fn build(cfg: &CountConfig, db: Arc<Db>) -> anyhow::Result<Arc<Self>> {
        let connect_cfg = cfg.clone();
        let consumer = Replaceable::new(move || Self::connect(&connect_cfg))?
            .with_probe(kafka::probe_config(&cfg.kafka, "zlink-counter-probe"));
        let clicks = Arc::new(ClickStore::prepare(db.clone()).await?);
        Ok(Arc::new(App {
            consumer,
            activity: Arc::default(),
            newest_consumed_ms: std::sync::atomic::AtomicI64::new(now_ms()),
            clicks,
            db,
            cfg: cfg.clone(),
            metrics: Arc::new(CounterMetrics::new()),
        }))
    }

    /// A consumer subscribed to the clicks topic.
    fn connect(cfg: &CountConfig) -> rdkafka::error::KafkaResult<ClosingConsumer> {
        // Only offsets of counted batches are ever committed.
        let consumer: kafka::ZConsumer =
            kafka::manual_store_consumer(&cfg.kafka, &cfg.group_id, &cfg.group_instance_id, 1000)
                .set("fetch.wait.max.ms", "100")
                .create_with_context(kafka::Quiet::default())?;
        consumer.subscribe(&[&cfg.clicks_topic])?;
        Ok(ClosingConsumer::new(consumer))
    }

    fn consumer(&self) -> Arc<ClosingConsumer> {
        self.consumer.current()
    }

    /// Serves the ops endpoint and counts until `shutdown`; commits what was counted. A
    /// consumer the probe finds stalled is dropped (closing on a thread of its own) for a fresh
    /// one; what it had not committed is delivered again and counted again, which changes
    /// nothing.
    pub async fn run(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        shutdown: CancellationToken,
    ) {
        let metrics = self.metrics.clone();
        let ops = Arc::new(Ops::new(Box::new(move || metrics.render())));
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(zlink_clients::ops::serve(
            listener,
            ops.clone(),
            shutdown.clone(),
        ));
        tasks.spawn(self.clone().probe(ops, shutdown.clone()));
        loop {
            let (consumer, stop) = self.consumer.start(&shutdown);
            self.consume(&consumer, &stop).await;
            if shutdown.is_cancelled() {
                break;
            }
            drop(consumer);
            if !self.consumer.replace(&shutdown).await {
                break;
            }
        }
        while tasks.join_next().await.is_some() {}
        if let Err(e) = self.consumer().commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(error = %e, "final commit");
        }
        tracing::info!("click counter stopped");
    }

    /// Every 2 s (every second while the consumer makes no progress with clicks waiting:
    /// [`StallWatch::next_check`]): readiness (store and Kafka answer), the consumer lag, and
    /// whether the consumer has stalled; a stalled one's loop is stopped so [`Self::run`]
    /// replaces it.
    async fn probe(self: Arc<Self>, ops: Arc<Ops>, shutdown: CancellationToken) {
        let mut stall = StallWatch::new(
            Duration::from_secs(self.cfg.consumer_stall_secs),
            Instant::now(),
        );
        // The last time Kafka said nothing waits: every message waiting now was written after.
        let mut caught_up_at = now_ms();
        loop {
            let looked = Instant::now();
            let store_ok = self.db.ping().await.is_ok();
            let backlog = self
                .consumer
                .check_stall(
                    &self.cfg.clicks_topic,
                    &mut stall,
                    &self.activity,
                    &self.metrics.consumer_lag,
                    &self.metrics.consumer_resets,
                )
                .await;
            // Time behind: a message count says little when a message holds up to a replay
            // batch of clicks. The waiting messages were written after the newest consumed one
            // and after the counter was last caught up: the later of the two bounds their age
            // (after an idle hour, a burst is not an hour behind).
            let (waiting, now): (i64, i64) = (backlog.lags.iter().map(|(_, l)| *l).sum(), now_ms());
            if backlog.answered && waiting <= 0 {
                caught_up_at = now;
            }
            let since = self
                .newest_consumed_ms
                .load(Ordering::Relaxed)
                .max(caught_up_at);
            self.metrics
                .consumer_lag_seconds
                .set(behind_seconds(waiting, since, now));
            ops.set_readiness(Readiness::of(&[
                ("store", store_ok),
                ("kafka", backlog.answered),
            ]));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(stall.wait_after(Duration::from_secs(2), looked)) => {}
            }
        }
    }

    /// The next batch: blocks for the first message, then takes what arrives within the wait.
    /// `None` at shutdown, or when the consumer failed fatally (it is then replaced).
    async fn next_batch(
        &self,
        consumer: &ClosingConsumer,
        shutdown: &CancellationToken,
    ) -> Option<Vec<OwnedMessage>> {
        let mut batch = Vec::new();
        // Clicks in the batch: a message holds one per line.
        let clicks = |m: &OwnedMessage| {
            1 + m
                .payload()
                .map_or(0, |p| p.iter().filter(|b| **b == b'\n').count())
        };
        let mut held = 0;
        loop {
            let m = tokio::select! {
                _ = shutdown.cancelled() => return None,
                m = consumer.recv() => m,
            };
            match m {
                Ok(m) => {
                    let m = m.detach();
                    held += clicks(&m);
                    batch.push(m);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kafka receive error");
                    if kafka::is_fatal(consumer) {
                        self.metrics.consumer_resets.inc();
                        return None;
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.cfg.batch_wait_ms);
        while held < self.cfg.batch_max {
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(deadline) => break,
                m = consumer.recv() => match m {
                    Ok(m) => {
                        let m = m.detach();
                        held += clicks(&m);
                        batch.push(m);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "kafka receive error");
                        if kafka::is_fatal(consumer) {
                            self.metrics.consumer_resets.inc();
                            return None;
                        }
                        break;
                    }
                },
            }
        }
        self.activity.received();
        if let Some(newest) = batch.iter().filter_map(|m| m.timestamp().to_millis()).max() {
            self.newest_consumed_ms.fetch_max(newest, Ordering::Relaxed);
        }
        Some(batch)
    }

    /// One consumer's loop, until `shutdown`. Its sources start empty: they read their state
    /// from the store as they first see a batch.
    async fn consume(self: &Arc<Self>, consumer: &ClosingConsumer, shutdown: &CancellationToken) {
        let mut batches = 0u64;
        let mut sources: HashMap<String, SourceCounter> = HashMap::new();
        while let Some(batch) = self.next_batch(consumer, shutdown).await {
            let _busy = self.activity.begin();
            let now = now_ms();
            let mut parts: HashMap<(String, i32), Part> = HashMap::new();
            for m in &batch {
                let part = parts
                    .entry((m.topic().to_string(), m.partition()))
                    .or_insert_with(|| Part {
                        first: m.offset(),
                        last: m.offset(),
                        events: Vec::new(),
                    });
                part.last = m.offset();
                // The clicks of one message share its offset (see SourceState::plan).
                for decoded in decode_all(m.payload(), now) {
                    match decoded {
                        // A canary's redirect is not a click (zlink_wire::canary); none should
                        // arrive, and one that does is not counted.
                        Ok(ev) if zlink_wire::canary::is_canary(&ev.key) => {
                            self.metrics.events.with_label_values(&["canary"]).inc();
                        }
                        Ok(ev) => part.events.push((m.offset(), ev)),
                        Err(reason) => {
                            self.metrics.events.with_label_values(&["invalid"]).inc();
                            tracing::warn!(
                                partition = m.partition(),
                                offset = m.offset(),
                                reason,
                                "skipping a click that is not a valid event"
                            );
                        }
                    }
                }
            }
            let offsets: Vec<(String, i32, i64)> = parts
                .iter()
                .map(|((t, p), part)| (t.clone(), *p, part.last))
                .collect();
            // The payloads are decoded: held through the counting they would double a large
            // batch's memory.
            drop(batch);
            if !self.count_all(&mut sources, parts, shutdown).await {
                return; // shutting down: the batch stays uncommitted and is counted by whoever comes next
            }
            // A partition that went to another member (or went quiet) gives its memory back;
            // if it comes back, its state is read again.
            sources.retain(|_, c| c.idle_for() < SOURCE_IDLE);
            batches += 1;
            self.metrics.batches.inc();
            let (keys, ids) = sources
                .values()
                .map(SourceCounter::held)
                .fold((0, 0), |(k, i), (k2, i2)| (k + k2, i + i2));
            self.metrics
                .held
                .with_label_values(&["keys"])
                .set(keys as i64);
            self.metrics
                .held
                .with_label_values(&["ids"])
                .set(ids as i64);
            if self.cfg.failpoint_abort_after_batches == Some(batches) {
                tracing::error!(
                    batches,
                    "failpoint: aborting after counting, before committing"
                );
                std::process::abort();
            }
            for (topic, partition, last) in offsets {
                kafka::store_done(consumer, &topic, partition, last);
            }
        }
    }

    /// Counts every source's part of the batch, the sources at the same time, each retried until
    /// it is stored. False if shutdown came first.
    async fn count_all(
        self: &Arc<Self>,
        sources: &mut HashMap<String, SourceCounter>,
        parts: HashMap<(String, i32), Part>,
        shutdown: &CancellationToken,
    ) -> bool {
        let mut running = tokio::task::JoinSet::new();
        let new = parts
            .keys()
            .filter(|(t, p)| !sources.contains_key(&source_name(t, *p)))
            .count();
        let limits = self.limits(sources.len() + new);
        for ((topic, partition), part) in parts {
            let src = source_name(&topic, partition);
            let mut counter = sources
                .remove(&src)
                .unwrap_or_else(|| SourceCounter::new(self.clicks.clone(), src, limits));
            counter.set_limits(limits);
            let (this, shutdown) = (self.clone(), shutdown.clone());
            running.spawn(async move { this.count_part(counter, part, &shutdown).await });
        }
        let mut ok = true;
        while let Some(r) = running.join_next().await {
            match r {
                Ok((counter, done)) => {
                    ok &= done;
                    sources.insert(counter.source().to_string(), counter);
                }
                Err(_) => ok = false,
            }
        }
        ok
    }

    /// Each of `sources` sources' share of the memory limits.
    fn limits(&self, sources: usize) -> Limits {
        let n = sources.max(1);
        Limits {
            keys: (self.cfg.key_cache / n).max(100),
            ids: (self.cfg.id_cache / n).max(1000),
            concurrency: self.cfg.concurrency,
            dedup_ttl_s: i32::try_from(u64::from(self.cfg.dedup_days) * 86_400).unwrap_or(i32::MAX),
        }
    }

    async fn count_part(
        &self,
        mut counter: SourceCounter,
        part: Part,
        shutdown: &CancellationToken,
    ) -> (SourceCounter, bool) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let started = Instant::now();
            match counter.count(part.first, part.last, &part.events).await {
                Ok(Counted {
                    counted,
                    duplicates,
                    redelivered,
                }) => {
                    let m = &self.metrics;
                    m.events.with_label_values(&["counted"]).inc_by(counted);
                    m.events
                        .with_label_values(&["duplicate"])
                        .inc_by(duplicates);
                    m.events
                        .with_label_values(&["redelivered"])
                        .inc_by(redelivered);
                    if counted > 0 {
                        let now = now_ms();
                        for (_, e) in &part.events {
                            m.click_to_count_seconds
                                .observe((now - e.at_ms).max(0) as f64 / 1000.0);
                        }
                    }
                    tracing::debug!(
                        src = counter.source(),
                        first = part.first,
                        last = part.last,
                        counted,
                        duplicates,
                        redelivered,
                        took_ms = started.elapsed().as_millis() as u64,
                        "counted"
                    );
                    return (counter, true);
                }
                Err(e) => {
                    self.metrics.store_errors.inc();
                    if matches!(e, StoreError::Corrupt(_)) {
                        tracing::error!(src = counter.source(), error = %e, "counting failed; retrying");
                    } else {
                        tracing::warn!(src = counter.source(), error = %e, "counting failed; retrying");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return (counter, false),
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// One source's part of a batch: its offsets `first..=last` and the valid events among them.
struct Part {
    first: i64,
    last: i64,
    events: Vec<(i64, ClickEvent)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn json(slug: &str, at_ms: i64) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "schema": 1, "id": uuid::Uuid::new_v4(), "slug": slug, "at_ms": at_ms,
            "tier": "primary", "referrer": null, "user_agent": null, "ip_hash": "00",
        }))
        .unwrap()
    }

    #[test]
    fn decode_refuses_what_it_cannot_count() {
        assert!(decode(Some(&json("abc", NOW)), NOW).is_ok());
        assert_eq!(decode(None, NOW), Err("empty"));
        assert_eq!(decode(Some(b"{"), NOW), Err("json"));
        assert_eq!(decode(Some(&json("a/b", NOW)), NOW), Err("slug"));
        assert_eq!(decode(Some(&json("abc", 5)), NOW), Err("time"));
        assert_eq!(
            decode(Some(&json("abc", NOW + 2 * 86_400_000)), NOW),
            Err("time")
        );
        let v2 = String::from_utf8(json("abc", NOW))
            .unwrap()
            .replace("\"schema\":1", "\"schema\":2");
        assert_eq!(decode(Some(v2.as_bytes()), NOW), Err("schema"));
    }

    #[test]
    fn behind_is_the_time_since_the_waiting_messages_were_written_at_most() {
        assert_eq!(behind_seconds(0, NOW - 600_000, NOW), 0.0, "none waits");
        assert_eq!(behind_seconds(3, NOW - 600_000, NOW), 600.0);
        assert_eq!(
            behind_seconds(1, NOW + 5_000, NOW),
            0.0,
            "a broker clock ahead"
        );
    }

    #[test]
    fn a_message_of_many_lines_is_many_events_each_judged_alone() {
        let mut m = json("abc", NOW);
        m.push(b'\n');
        m.extend_from_slice(&json("a/b", NOW));
        m.push(b'\n');
        m.extend_from_slice(&json("xyz", NOW));
        let got: Vec<_> = decode_all(Some(&m), NOW)
            .into_iter()
            .map(|r| r.map(|e| e.key.to_string()))
            .collect();
        assert_eq!(got, vec![Ok("abc".into()), Err("slug"), Ok("xyz".into())]);
        assert_eq!(decode_all(None, NOW), vec![Err("empty")]);
        assert_eq!(decode_all(Some(b"\n"), NOW), vec![Err("empty")]);
    }
}
