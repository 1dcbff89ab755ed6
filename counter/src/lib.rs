//! The click counter (binary `counter`, component `clicks`): consumes the `clicks` topic
//! and keeps per-link aggregates in ScyllaDB, counting every event exactly once.
//!
//! Loop: take whole messages until they hold `--batch-max` clicks (a message holds one or more,
//! one per line) or `--batch-wait-ms` passed, split them by source (partition of the topic),
//! decide each source's part in memory with its [`SourceCounter`] (the sources at the same
//! time; see [`zlink_store::clicks`] for why each click is counted once) and hold it; once the
//! window is `--flush-ms` old (or holds `--flush-clicks`), write every source's window at once,
//! and only then store the window's offsets for librdkafka's auto-commit. A crash anywhere
//! re-delivers at most the uncommitted window, and counting it again changes nothing. A
//! consumer that stalls (clicks wait, none arrive, no batch is being counted) is replaced by a
//! fresh one ([`kafka::StallWatch`]), and the sources start over.

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
use zlink_store::clicks::{Click, ClickStore, Counted, FIRST_CLICK_MS};
use zlink_store::{Db, StoreError};
use zlink_wire::domain::is_valid_key;
use zlink_wire::events::{click_lines, ClickLine, CLICK_EVENT_SCHEMA};

/// How long a source's state is kept without a batch for it.
const SOURCE_IDLE: Duration = Duration::from_secs(300);

/// The events of a `clicks` message (one per line, [`click_lines`]), each decoded, or why a
/// line cannot be one; an absent or blank payload is one `empty`.
pub fn decode_all(payload: Option<&[u8]>, now_ms: i64) -> Vec<Result<Click, &'static str>> {
    let mut out: Vec<_> = click_lines(payload.unwrap_or_default())
        .map(|line| decode(Some(line), now_ms))
        .collect();
    if out.is_empty() {
        out.push(Err("empty"));
    }
    out
}

/// One click event (a line of a `clicks` message, a [`zlink_wire::events::ClickEvent`] read as a
/// [`ClickLine`]: the same rules, its strings borrowed) to count, or why it cannot be one.
pub fn decode(payload: Option<&[u8]>, now_ms: i64) -> Result<Click, &'static str> {
    let ev = ClickLine::read(payload.ok_or("empty")?).map_err(|_| "json")?;
    if ev.schema != CLICK_EVENT_SCHEMA {
        return Err("schema");
    }
    if !is_valid_key(&ev.key) {
        return Err("slug");
    }
    // Before 2020 (FIRST_CLICK_MS): a broken clock or a forgery; the stats read no further back.
    if ev.at_ms < FIRST_CLICK_MS || ev.at_ms > now_ms + 86_400_000 {
        return Err("time");
    }
    Ok(Click::of(&ev.borrowed()))
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
    /// An empty batch when `flush_at` comes first (and the batch ends there too); `None` at
    /// shutdown, or when the consumer failed fatally (it is then replaced).
    async fn next_batch(
        &self,
        consumer: &ClosingConsumer,
        shutdown: &CancellationToken,
        flush_at: Option<tokio::time::Instant>,
    ) -> Option<Vec<OwnedMessage>> {
        let flush_due = async {
            match flush_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(flush_due);
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
                _ = &mut flush_due => return Some(batch),
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
        let mut deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.cfg.batch_wait_ms);
        if let Some(at) = flush_at {
            deadline = deadline.min(at);
        }
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
        let mut flushes = 0u64;
        let mut sources: HashMap<String, SourceCounter> = HashMap::new();
        let mut window = Window::default();
        loop {
            let flush_at = window
                .opened
                .map(|t| t + Duration::from_millis(self.cfg.flush_ms));
            let Some(batch) = self
                .next_batch(consumer, shutdown, flush_at.map(Into::into))
                .await
            else {
                // Shutting down, or the consumer is to be replaced: what was folded is written
                // if the store takes it at once (tried once, not retried), and its offsets stored
                // for the final commit; else it stays uncommitted and is counted by whoever
                // comes next.
                if !window.offsets.is_empty() {
                    if let Some(written) = self.flush_all(&mut sources, shutdown).await {
                        self.window_done(consumer, &mut window, written);
                    }
                }
                return;
            };
            if !batch.is_empty() {
                let _busy = self.activity.begin();
                let parts = self.decode_batch(batch, &mut window);
                if self.fold_all(&mut sources, parts, shutdown).await.is_none() {
                    return; // shutting down: the window stays uncommitted
                }
            }
            let due = window.opened.is_some_and(|t| {
                t.elapsed() >= Duration::from_millis(self.cfg.flush_ms)
                    || window.clicks >= self.cfg.flush_clicks
                    || sources.values().any(SourceCounter::over_limits)
            });
            if !due {
                continue;
            }
            let _busy = self.activity.begin();
            let Some(written) = self.flush_all(&mut sources, shutdown).await else {
                return; // shutting down: the window stays uncommitted
            };
            // A partition that went to another member (or went quiet) gives its memory back;
            // if it comes back, its state is read again.
            sources.retain(|_, c| c.idle_for() < SOURCE_IDLE);
            flushes += 1;
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
            if self.cfg.failpoint_abort_after_batches == Some(flushes) {
                tracing::error!(
                    flushes,
                    "failpoint: aborting after a flush, before committing"
                );
                std::process::abort();
            }
            self.window_done(consumer, &mut window, written);
        }
    }

    /// The batch's valid clicks, by source; the window learns its offsets and click times.
    fn decode_batch(
        &self,
        batch: Vec<OwnedMessage>,
        window: &mut Window,
    ) -> HashMap<(String, i32), Part> {
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
                    Ok(ev) if zlink_wire::canary::is_canary(ev.key()) => {
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
        window.opened.get_or_insert_with(Instant::now);
        for ((topic, partition), part) in &parts {
            window
                .offsets
                .insert((topic.clone(), *partition), part.last);
            window.clicks += part.events.len() as u64;
            window
                .click_times
                .extend(part.events.iter().map(|(_, e)| e.at_ms));
        }
        parts
    }

    /// The window is written (`c`, what its written batches decided): its offsets are stored
    /// for the commit, its clicks counted in the metrics with the time from each to now, and it
    /// starts over.
    fn window_done(&self, consumer: &ClosingConsumer, window: &mut Window, c: Counted) {
        let m = &self.metrics;
        m.events.with_label_values(&["counted"]).inc_by(c.counted);
        m.events
            .with_label_values(&["duplicate"])
            .inc_by(c.duplicates);
        m.events
            .with_label_values(&["redelivered"])
            .inc_by(c.redelivered);
        let now = now_ms();
        for at in window.click_times.drain(..) {
            self.metrics
                .click_to_count_seconds
                .observe((now - at).max(0) as f64 / 1000.0);
        }
        for ((topic, partition), last) in window.offsets.drain() {
            kafka::store_done(consumer, &topic, partition, last);
        }
        *window = Window::default();
    }

    /// Folds every source's part of the batch into its window, the sources at the same time,
    /// each retried until its state could be read: what they decided, or `None` if shutdown
    /// came first.
    async fn fold_all(
        self: &Arc<Self>,
        sources: &mut HashMap<String, SourceCounter>,
        parts: HashMap<(String, i32), Part>,
        shutdown: &CancellationToken,
    ) -> Option<Counted> {
        let new = parts
            .keys()
            .filter(|(t, p)| !sources.contains_key(&source_name(t, *p)))
            .count();
        let limits = self.limits(sources.len() + new);
        let mut work = Vec::new();
        for ((topic, partition), part) in parts {
            let src = source_name(&topic, partition);
            let mut counter = sources
                .remove(&src)
                .unwrap_or_else(|| SourceCounter::new(self.clicks.clone(), src, limits));
            counter.set_limits(limits);
            work.push((counter, Some(part)));
        }
        self.each_source(sources, work, shutdown).await
    }

    /// Writes every source's window, the sources at the same time, each retried until it is
    /// stored; `None` if shutdown came first.
    async fn flush_all(
        self: &Arc<Self>,
        sources: &mut HashMap<String, SourceCounter>,
        shutdown: &CancellationToken,
    ) -> Option<Counted> {
        let work = sources.drain().map(|(_, c)| (c, None)).collect();
        self.each_source(sources, work, shutdown).await
    }

    /// Runs [`Self::step`] for each source at the same time; the counters go back to `sources`.
    /// What they decided, summed; `None` if shutdown came first.
    async fn each_source(
        self: &Arc<Self>,
        sources: &mut HashMap<String, SourceCounter>,
        work: Vec<(SourceCounter, Option<Part>)>,
        shutdown: &CancellationToken,
    ) -> Option<Counted> {
        let mut running = tokio::task::JoinSet::new();
        for (counter, part) in work {
            let (this, shutdown) = (self.clone(), shutdown.clone());
            running.spawn(async move { this.step(counter, part, &shutdown).await });
        }
        let (mut ok, mut sum) = (true, Counted::default());
        while let Some(r) = running.join_next().await {
            match r {
                Ok((counter, done)) => {
                    match done {
                        Some(c) => sum += c,
                        None => ok = false,
                    }
                    sources.insert(counter.source().to_string(), counter);
                }
                Err(_) => ok = false,
            }
        }
        ok.then_some(sum)
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

    /// Folds `part` into the counter's window (`Some`), or flushes the window (`None`), retried
    /// with backoff until it succeeds: what it decided (nothing, for a flush), or `None` if
    /// shutdown came first.
    async fn step(
        &self,
        mut counter: SourceCounter,
        part: Option<Part>,
        shutdown: &CancellationToken,
    ) -> (SourceCounter, Option<Counted>) {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let started = Instant::now();
            let r = match &part {
                Some(part) => counter.fold(part.first, part.last, &part.events).await,
                None => counter.flush().await,
            };
            match r {
                Ok(c) => {
                    tracing::debug!(
                        src = counter.source(),
                        first = part.as_ref().map(|p| p.first),
                        last = part.as_ref().map(|p| p.last),
                        counted = c.counted,
                        duplicates = c.duplicates,
                        redelivered = c.redelivered,
                        took_ms = started.elapsed().as_millis() as u64,
                        "{}",
                        if part.is_some() { "folded" } else { "flushed" }
                    );
                    return (counter, Some(c));
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
                _ = shutdown.cancelled() => return (counter, None),
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }
}

/// What has been folded since the last flush, over every source.
#[derive(Default)]
struct Window {
    /// When its first batch came.
    opened: Option<Instant>,
    /// The last offset folded per (topic, partition).
    offsets: HashMap<(String, i32), i64>,
    /// Valid clicks folded.
    clicks: u64,
    /// Their times (ms), for the click → counted histogram once written.
    click_times: Vec<i64>,
}

/// One source's part of a batch: its offsets `first..=last` and the valid events among them.
struct Part {
    first: i64,
    last: i64,
    events: Vec<(i64, Click)>,
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
            .map(|r| r.map(|e| e.key().to_owned()))
            .collect();
        assert_eq!(got, vec![Ok("abc".into()), Err("slug"), Ok("xyz".into())]);
        assert_eq!(decode_all(None, NOW), vec![Err("empty")]);
        assert_eq!(decode_all(Some(b"\n"), NOW), vec![Err("empty")]);
    }
}
