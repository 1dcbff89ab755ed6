//! The replayer: ships the spool to Kafka `clicks`. It reads a batch, sends it as a few messages
//! (one per partition its clicks hash to, each holding their events one per line: see
//! [`zlink_wire::events::click_lines`]), waits for every acknowledgement, and only then commits
//! the spool position. A failure sends the whole batch again after a backoff, with the same
//! ids.

use super::*;
use crate::kafka::Quiet;
use crate::kafka::SharedProducer;
use crate::spool::{Batch, Reader};
use crate::trace::Span;
use rdkafka::client::Client;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use std::sync::atomic::AtomicUsize;

/// How long the topic's partition count is used before it is read again.
const PARTITIONS_TTL: Duration = Duration::from_secs(60);

/// Reads the next batch into `batch` (its buffers kept from round to round).
async fn read_batch(reader: Reader, batch: Batch) -> (Reader, Batch, std::io::Result<()>) {
    tokio::task::spawn_blocking(move || {
        let (mut reader, mut batch) = (reader, batch);
        let r = reader.read_into(&mut batch, BATCH_RECORDS, BATCH_BYTES);
        (reader, batch, r)
    })
    .await
    .expect("spool read does not panic")
}

/// Commits a delivered batch: the position reaches the disk at most every
/// [`POSITION_INTERVAL`] while clicks keep coming (two fsyncs each), and at once when idle or
/// stopping ([`persist`]). A crash re-sends what was committed since: same ids, counted once.
async fn commit(reader: Reader, batch: Batch) -> (Reader, Batch, std::io::Result<()>) {
    let mut reader = reader;
    reader.advance(&batch);
    // Most rounds only move the position in memory: no trip to the blocking pool (two thread
    // wake-ups a round on the tier's core) for a commit that writes nothing.
    if !reader.persist_due(POSITION_INTERVAL) {
        return (reader, batch, Ok(()));
    }
    tokio::task::spawn_blocking(move || {
        let mut reader = reader;
        let r = reader.persist();
        (reader, batch, r)
    })
    .await
    .expect("spool commit does not panic")
}

async fn persist(reader: Reader) -> (Reader, std::io::Result<()>) {
    if !reader.unpersisted() {
        return (reader, Ok(()));
    }
    tokio::task::spawn_blocking(move || {
        let mut reader = reader;
        let r = reader.persist();
        (reader, r)
    })
    .await
    .expect("spool persist does not panic")
}

/// The delivery reports of one replay batch, counted as they arrive: a batch costs the
/// replayer one wake-up, where a future per click cost a channel, a boxed sender and a wake-up
/// per click (rdkafka's `FutureProducer`: about a tenth of a hot tier's CPU per redirect went
/// to shipping clicks, 2026-11-28 profile).
pub(super) struct BatchAcks {
    /// Messages not yet reported, plus one held by the sender until every send is queued.
    outstanding: AtomicUsize,
    /// The first failure reported.
    error: Mutex<Option<String>>,
    done: tokio::sync::Notify,
}

impl BatchAcks {
    fn new() -> Arc<Self> {
        Arc::new(BatchAcks {
            outstanding: AtomicUsize::new(1),
            error: Mutex::new(None),
            done: tokio::sync::Notify::new(),
        })
    }

    /// One message (or the sender's hold) settled; the last one wakes the waiter (`Notify`
    /// keeps the permit if it is not waiting yet).
    fn settle(&self, failure: Option<String>) {
        if let Some(e) = failure {
            self.error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
        if self.outstanding.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.notify_one();
        }
    }

    /// Releases the sender's hold and waits until every message is reported.
    async fn all_settled(&self) -> Result<(), String> {
        self.settle(None);
        self.done.notified().await;
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The replayer's producer context: each delivery report settles its batch's count; log lines
/// and errors as every zlink client's ([`Quiet`]: repeats held back while Kafka is away).
#[derive(Default)]
pub(super) struct ReplayContext(Quiet);

impl rdkafka::ClientContext for ReplayContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.0.log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.0.error(error, reason);
    }
}

impl rdkafka::producer::ProducerContext for ReplayContext {
    type DeliveryOpaque = Arc<BatchAcks>;

    fn delivery(&self, report: &rdkafka::message::DeliveryResult<'_>, acks: Arc<BatchAcks>) {
        acks.settle(report.as_ref().err().map(|(e, _)| e.to_string()));
    }
}

/// The replayer's producer: librdkafka's own polling thread serves the delivery reports.
pub(super) type ReplayProducer = ThreadedProducer<ReplayContext>;

/// Makes a [`ReplayProducer`] (the [`HealingProducer`]'s maker).
pub(super) fn replay_producer(
    config: &rdkafka::ClientConfig,
) -> rdkafka::error::KafkaResult<ReplayProducer> {
    config.create_with_context(ReplayContext::default())
}

/// The partition of the clicks topic a slug's clicks go to: librdkafka's default partitioner
/// for a keyed message (`consistent_random`: CRC-32 of the key, modulo the partition count),
/// which every click went by when each was a message of its own. A copy of a click therefore
/// reaches the same partition, and so the same counter source, whichever form carried it.
pub fn partition_of(key: &[u8], partitions: u32) -> i32 {
    (crc32fast::hash(key) % partitions.max(1)) as i32
}

/// One message of a replay batch.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Outgoing<'a> {
    /// `None`: librdkafka's partitioner decides (partition count unknown).
    pub(super) partition: Option<i32>,
    /// The slug, for a message of one click; `None` for several.
    pub(super) key: Option<&'a [u8]>,
    pub(super) value: &'a [u8],
    pub(super) traceparent: Option<&'a str>,
    pub(super) clicks: usize,
}

/// Cuts replay batches into messages ([`Shaper::outgoing`]). It keeps its buffers from batch
/// to batch: the messages' bytes (up to a batch's, 2 MiB) and the order of its clicks, which
/// allocated and freed anew every round made glibc hand back and fault in again.
#[derive(Default)]
pub(super) struct Shaper {
    /// The batched clicks as (partition, index in the batch), sorted.
    order: Vec<(i32, u32)>,
    /// The values of the messages of several clicks, one after another.
    buf: Vec<u8>,
}

impl Shaper {
    /// The messages of a batch of spool records: per partition, as few messages of up to
    /// `max_bytes` (`--clicks-message-bytes`) as hold its clicks, in spool order within the
    /// partition; a partition's message of one click is that click keyed, its value the event
    /// itself (the form before batching). A sampled click goes alone, keyed, with its
    /// `traceparent` header (its trace continues in the counter's span), ahead of the rest.
    /// With the partition count unknown, or `max_bytes` 0, every click goes alone and keyed,
    /// as before batching.
    pub(super) fn outgoing<'a>(
        &'a mut self,
        batch: &'a Batch,
        partitions: Option<u32>,
        max_bytes: usize,
    ) -> Vec<Outgoing<'a>> {
        let mut out = Vec::new();
        self.order.clear();
        for (i, rec) in batch.records().enumerate() {
            let Some(f) = unframe(rec) else {
                // Checksummed, so written by us; an unframeable record would be a bug. Skip it
                // rather than block every click behind it.
                tracing::error!("click spool: record without a key; skipped");
                continue;
            };
            let partition = partitions.map(|n| partition_of(f.key, n));
            match partition.filter(|_| f.traceparent.is_none() && max_bytes > 0) {
                Some(p) => self.order.push((p, i as u32)),
                None => out.push(Outgoing {
                    partition,
                    key: Some(f.key),
                    value: f.value,
                    traceparent: f.traceparent,
                    clicks: 1,
                }),
            }
        }
        // By partition, then spool order (the index): no allocation, unlike a stable sort.
        self.order.sort_unstable();
        // Each message: its partition, its first click's key, where its value starts in `buf`.
        struct Cut<'a> {
            partition: i32,
            key: &'a [u8],
            at: usize,
            clicks: usize,
        }
        let mut cuts: Vec<Cut<'a>> = Vec::new();
        self.buf.clear();
        let event = |i: u32| {
            let f = unframe(batch.get(i as usize).expect("an index of the batch"))
                .expect("framed: checked above");
            (f.key, f.value)
        };
        for &(p, i) in &self.order {
            let (key, value) = event(i);
            match cuts.last_mut() {
                Some(c)
                    if c.partition == p && self.buf.len() - c.at + 1 + value.len() <= max_bytes =>
                {
                    self.buf.push(b'\n');
                    c.clicks += 1;
                }
                _ => cuts.push(Cut {
                    partition: p,
                    key,
                    at: self.buf.len(),
                    clicks: 1,
                }),
            }
            self.buf.extend_from_slice(value);
        }
        let buf: &'a [u8] = &self.buf;
        for (n, c) in cuts.iter().enumerate() {
            let end = cuts.get(n + 1).map_or(buf.len(), |next| next.at);
            out.push(Outgoing {
                partition: Some(c.partition),
                // A message of one click is that click keyed (its value is the event itself).
                key: (c.clicks == 1).then_some(c.key),
                value: &buf[c.at..end],
                traceparent: None,
                clicks: c.clicks,
            });
        }
        out
    }
}

/// The clicks topic's partition count, read from the cluster and kept for [`PARTITIONS_TTL`].
pub(super) struct Partitions {
    topic: String,
    /// The count and when it was read.
    known: Option<(u32, tokio::time::Instant)>,
    /// Read it again before the next batch (one failed).
    stale: bool,
}

impl Partitions {
    pub(super) fn new(topic: &str) -> Self {
        Partitions {
            topic: topic.to_string(),
            known: None,
            stale: false,
        }
    }

    /// The count, read again when older than the TTL or after [`Self::forget`]; `None` while
    /// the cluster has never said (the batch then goes a click per message).
    pub(super) async fn get(&mut self, producer: &SharedProducer<ReplayProducer>) -> Option<u32> {
        if let Some((n, at)) = self.known {
            if !self.stale && at.elapsed() < PARTITIONS_TTL {
                return Some(n);
            }
        }
        let (producer, topic) = (producer.clone(), self.topic.clone());
        let read = tokio::task::spawn_blocking(move || {
            partition_count(producer.client(), &topic, Duration::from_secs(2))
        })
        .await
        .ok()
        .flatten();
        match (read, self.known) {
            (Some(n), _) => {
                self.known = Some((n, tokio::time::Instant::now()));
                self.stale = false;
            }
            // The last count stays in use while the cluster does not answer.
            (None, Some(_)) => {}
            (None, None) => {
                tracing::warn!(topic = %self.topic, "clicks: the topic's partition count is unknown; sending a message per click");
            }
        }
        self.known.map(|(n, _)| n)
    }

    /// After a failed batch: read the count again before the next one.
    pub(super) fn forget(&mut self) {
        self.stale = true;
    }
}

/// The topic's partition count (blocking); `None` if the cluster does not say.
fn partition_count<C: rdkafka::ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Option<u32> {
    let md = client.fetch_metadata(Some(topic), timeout).ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    if t.error().is_some() {
        return None;
    }
    u32::try_from(t.partitions().len()).ok().filter(|n| *n > 0)
}

/// Sends every click of the batch and waits for all acknowledgements; returns how many
/// messages carried them.
async fn send_all(
    producer: &ReplayProducer,
    topic: &str,
    shaper: &mut Shaper,
    batch: &Batch,
    partitions: Option<u32>,
    max_bytes: usize,
) -> Result<usize, String> {
    let acks = BatchAcks::new();
    let mut spans = Vec::new();
    let messages = shaper.outgoing(batch, partitions, max_bytes);
    for m in &messages {
        // The redirect's trace continues here: a `kafka.produce` span (exported if sampled),
        // and the message's `traceparent` names it as the parent of the consumer's work.
        let span = m.traceparent.and_then(TraceContext::parse).map(|parent| {
            let mut s = Span::remote_child("kafka.produce", &parent);
            s.set("topic", topic.to_string());
            s
        });
        let mut record: BaseRecord<'_, [u8], [u8], Arc<BatchAcks>> =
            BaseRecord::with_opaque_to(topic, acks.clone()).payload(m.value);
        if let Some(k) = m.key {
            record = record.key(k);
        }
        if let Some(p) = m.partition {
            record = record.partition(p);
        }
        if let Some(s) = &span {
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: crate::trace::TRACEPARENT,
                value: Some(s.ctx().header().as_str()),
            }));
        }
        // Counted before it is queued: its report may come before `send` returns.
        acks.outstanding.fetch_add(1, Ordering::AcqRel);
        if let Err((e, _)) = producer.send(record) {
            // Never queued: no report will come for it. (The sender's hold keeps the count
            // above zero; messages already queued settle into a batch nobody waits for.)
            acks.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(e.to_string());
        }
        spans.extend(span);
    }
    let r = acks.all_settled().await;
    if let Err(e) = &r {
        // The batch failed as a whole and is sent again; its sampled spans say why.
        for s in &mut spans {
            s.fail(e);
        }
    }
    r.map(|()| messages.len())
}

/// Where and how the replayer ships clicks (`--clicks-topic`, `--clicks-message-bytes`,
/// `--clicks-linger-ms`).
pub(super) struct Shipping {
    pub(super) topic: String,
    pub(super) message_bytes: usize,
    pub(super) linger: Duration,
}

pub(super) async fn replay(
    mut reader: Reader,
    spool: Arc<Spool>,
    producer: HealingProducer<ReplayProducer>,
    shipping: Shipping,
    metrics: ClickMetrics,
    stop: CancellationToken,
) {
    let Shipping {
        topic,
        message_bytes,
        linger,
    } = shipping;
    let give_up = {
        let stop = stop.clone();
        async move {
            stop.cancelled().await;
            tokio::time::sleep(DRAIN_GRACE).await;
        }
    };
    tokio::pin!(give_up);
    let mut delay =
        crate::backoff::Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut partitions = Partitions::new(&topic);
    // Kept from round to round (see [`Batch`] and [`Shaper`]).
    let mut batch = Batch::default();
    let mut shaper = Shaper::default();
    loop {
        metrics.observe(&spool);
        let stopping = stop.is_cancelled();
        let read_at = tokio::time::Instant::now();
        let read;
        (reader, batch, read) = read_batch(reader, batch).await;
        match read {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "click spool: read failed");
                tokio::select! {
                    _ = &mut give_up => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        }
        metrics.head(batch.get(0));
        if batch.is_empty() {
            if batch.end.is_some() {
                let r;
                (reader, batch, r) = commit(reader, batch).await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "click spool: commit failed");
                }
            }
            // Idle: the position of everything delivered goes to disk now.
            let r;
            (reader, r) = persist(reader).await;
            if let Err(e) = r {
                tracing::error!(error = %e, "click spool: commit failed");
            }
            if stopping {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = reader.wait(Duration::from_secs(1)) => {}
            }
            // Let a few more clicks arrive: one batch (and one position fsync) per round at
            // most while traffic is light, full batches back to back while it is heavy.
            if !stop.is_cancelled() {
                tokio::time::sleep(linger).await;
            }
            continue;
        }
        let n = batch.len() as u64;
        let full = batch.len() >= BATCH_RECORDS || batch.bytes() >= BATCH_BYTES / 2;
        let used = producer.producer();
        let sent = tokio::select! {
            _ = &mut give_up => break,
            r = async {
                // One click per message needs no partition count: librdkafka keys them.
                let n = if message_bytes > 0 { partitions.get(&used).await } else { None };
                send_all(&used, &topic, &mut shaper, &batch, n, message_bytes).await
            } => r,
        };
        match sent {
            Ok(messages) => {
                producer.delivered(&used);
                metrics.replayed.inc_by(n);
                metrics.replay_messages.inc_by(messages as u64);
                let r;
                (reader, batch, r) = commit(reader, batch).await;
                if let Err(e) = r {
                    // Not committed: the batch is sent again later (same ids).
                    tracing::error!(error = %e, "click spool: commit failed");
                    reader.rewind();
                }
                delay.reset();
                if !full {
                    // More clicks arrive while we wait: the next batch carries them all.
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep_until(read_at + linger) => {}
                    }
                }
            }
            Err(e) => {
                metrics.replay_failures.inc();
                partitions.forget();
                reader.rewind();
                if producer.failed(&used) {
                    // A new producer: its first try is not held back by the old one's failures.
                    delay.reset();
                }
                let sleep = delay.next_delay();
                tracing::warn!(error = %e, pending = spool.stats().pending,
                    retry_in_ms = sleep.as_millis() as u64, "clicks: Kafka did not take the batch");
                tokio::select! {
                    _ = &mut give_up => break,
                    _ = tokio::time::sleep(sleep) => {}
                }
            }
        }
    }
    let _ = producer.producer().flush(Duration::from_secs(1));
    if let (_, Err(e)) = persist(reader).await {
        tracing::error!(error = %e, "click spool: commit failed");
    }
    metrics.observe(&spool);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(slug: &str, json: &str, trace: Option<&TraceContext>) -> Vec<u8> {
        let mut ev: ClickEvent = serde_json::from_str(json).unwrap();
        ev.key = slug.into();
        frame(&ev.borrowed(), trace)
    }

    /// The default `--clicks-message-bytes`.
    const MAX: usize = 256 * 1024;

    /// A message, owned (what [`Shaper::outgoing`] gives borrows its buffers).
    #[derive(Debug)]
    struct Msg {
        partition: Option<i32>,
        key: Option<Vec<u8>>,
        value: Vec<u8>,
        traceparent: Option<String>,
        clicks: usize,
    }

    fn shape(
        shaper: &mut Shaper,
        records: &[Vec<u8>],
        partitions: Option<u32>,
        max: usize,
    ) -> Vec<Msg> {
        let batch = Batch::of(records, None);
        shaper
            .outgoing(&batch, partitions, max)
            .into_iter()
            .map(|m| Msg {
                partition: m.partition,
                key: m.key.map(<[u8]>::to_vec),
                value: m.value.to_vec(),
                traceparent: m.traceparent.map(str::to_string),
                clicks: m.clicks,
            })
            .collect()
    }

    fn outgoing(records: &[Vec<u8>], partitions: Option<u32>, max: usize) -> Vec<Msg> {
        shape(&mut Shaper::default(), records, partitions, max)
    }

    const EV: &str = r#"{"schema":1,"id":"0190b4a2-0000-7000-8000-000000000000","slug":"x","at_ms":1,"tier":"primary","referrer":null,"user_agent":null,"ip_hash":"00"}"#;

    #[test]
    fn partitions_are_crc32_of_the_slug_as_librdkafka_keys_them() {
        // CRC-32 (ISO-HDLC, zlib's) of the standard check input.
        assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
        assert_eq!(
            partition_of(b"123456789", 1000),
            (0xCBF4_3926u32 % 1000) as i32
        );
        for n in 1..8 {
            assert!((0..n as i32).contains(&partition_of(b"abc", n)));
        }
        assert_eq!(partition_of(b"abc", 0), 0, "never divides by zero");
    }

    #[test]
    fn a_batch_is_one_message_per_partition_and_a_lone_or_traced_click_stays_keyed() {
        let slugs: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let mut records: Vec<Vec<u8>> = slugs.iter().map(|s| record(s, EV, None)).collect();
        let traced =
            TraceContext::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        records.push(record("traced", EV, Some(&traced)));
        let out = outgoing(&records, Some(3), MAX);
        // The traced click alone, keyed, first (in spool order), with its header.
        assert_eq!(out[0].key.as_deref(), Some(&b"traced"[..]));
        assert!(out[0].traceparent.is_some());
        assert_eq!(out[0].partition, Some(partition_of(b"traced", 3)));
        // Then one message per partition, every click in the partition its slug hashes to.
        let rest = &out[1..];
        assert_eq!(rest.len(), 3);
        assert_eq!(rest.iter().map(|m| m.clicks).sum::<usize>(), 40);
        for m in rest {
            assert_eq!(m.key, None);
            assert!(m.traceparent.is_none());
            let lines: Vec<ClickEvent> = zlink_wire::events::click_lines(&m.value)
                .map(|l| serde_json::from_slice(l).unwrap())
                .collect();
            assert_eq!(lines.len(), m.clicks);
            for e in lines {
                assert_eq!(Some(partition_of(e.key.as_bytes(), 3)), m.partition);
            }
        }
        // A partition with one click: keyed by its slug, the value the event itself.
        let one = outgoing(&records[..1], Some(3), MAX);
        assert_eq!(one.len(), 1);
        assert_eq!(
            (one[0].key.as_deref(), one[0].clicks),
            (Some(&b"s0"[..]), 1)
        );
        assert_eq!(one[0].value, unframe(&records[0]).unwrap().value);
        // Partition count unknown: a keyed message per click, librdkafka places them.
        let unknown = outgoing(&records, None, MAX);
        assert_eq!(unknown.len(), 41);
        assert!(unknown
            .iter()
            .all(|m| m.partition.is_none() && m.key.is_some() && m.clicks == 1));
        // Batching off (--clicks-message-bytes 0): a keyed message per click.
        let off = outgoing(&records, Some(3), 0);
        assert_eq!(off.len(), 41);
        assert!(off.iter().all(|m| m.key.is_some() && m.clicks == 1));
    }

    #[test]
    fn a_partitions_share_is_cut_into_messages_of_bounded_size() {
        let big = EV.replace(
            r#""referrer":null"#,
            &format!(r#""referrer":"{}""#, "r".repeat(900)),
        );
        let records: Vec<Vec<u8>> = (0..1000).map(|_| record("same", &big, None)).collect();
        let out = outgoing(&records, Some(6), MAX);
        assert!(out.len() > 1);
        assert!(out.iter().all(|m| m.value.len() <= MAX));
        assert_eq!(out.iter().map(|m| m.clicks).sum::<usize>(), 1000);
        assert!(out
            .iter()
            .all(|m| m.partition == Some(partition_of(b"same", 6))));
        // Spool order is kept within the partition: the full message goes first.
        assert!(out[0].clicks >= out[out.len() - 1].clicks);
    }

    #[test]
    fn a_kept_shaper_gives_every_click_once_in_spool_order_batch_after_batch() {
        let mut shaper = Shaper::default();
        // A large batch first, then smaller ones: nothing of an earlier batch may leak into
        // a later one through the kept buffers.
        for (round, n) in [(0u32, 3000usize), (1, 7), (2, 1), (3, 500)] {
            let records: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let ev = EV.replace("\"at_ms\":1", &format!("\"at_ms\":{}", i + 1));
                    record(&format!("r{round}-{}", i % 97), &ev, None)
                })
                .collect();
            let out = shape(&mut shaper, &records, Some(6), 16 * 1024);
            assert_eq!(out.iter().map(|m| m.clicks).sum::<usize>(), n);
            let mut seen = 0;
            for p in 0..6 {
                // This partition's clicks, message after message: in spool order.
                let mut last = 0;
                for m in out.iter().filter(|m| m.partition == Some(p)) {
                    assert!(m.value.len() <= 16 * 1024);
                    assert_eq!(m.key.is_some(), m.clicks == 1);
                    for l in zlink_wire::events::click_lines(&m.value) {
                        let e: ClickEvent = serde_json::from_slice(l).unwrap();
                        assert!(e.key.starts_with(&format!("r{round}-")), "{}", e.key);
                        assert_eq!(partition_of(e.key.as_bytes(), 6), p);
                        assert!(e.at_ms > last, "spool order within the partition");
                        last = e.at_ms;
                        seen += 1;
                    }
                }
            }
            assert_eq!(seen, n);
        }
    }

    #[test]
    fn an_unframeable_record_is_skipped_not_sent() {
        let records = vec![vec![0xFE], record("ok", EV, None)];
        let out = outgoing(&records, Some(2), MAX);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].key.as_deref(), Some(&b"ok"[..]));
    }
}
