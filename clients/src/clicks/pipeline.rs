//! One tier's click pipeline: the spool every redirect appends its click to, the replayer
//! that ships the spool to Kafka `clicks` (produce a batch, wait for every acknowledgement,
//! then commit the spool position), and their metrics.

use super::*;

/// Why the spool refused a click: the `reason` label of `clicks_refused_total`.
const REFUSED_REASONS: [&str; 4] = ["full", "closed", "size", "io"];

/// Click metrics, registered into the service's registry (so under its prefix).
#[derive(Clone)]
pub struct ClickMetrics {
    pub spooled: IntCounter,
    pub refused: IntCounterVec,
    pub pending: IntGauge,
    pub disk_bytes: IntGauge,
    pub cut_bytes: IntCounter,
    pub io_errors: IntGauge,
    pub corrupt_skipped: IntGauge,
    pub replayed: IntCounter,
    pub replay_failures: IntCounter,
    /// Kafka producers replaced after consecutive failed batches (see `HealingProducer`).
    pub producer_resets: IntCounter,
    /// Age of the oldest click not yet acknowledged by Kafka (0 when none is pending).
    pub oldest_age: prometheus::Gauge,
    /// The filesystem under the spool: bytes free to an unprivileged writer, and its size.
    pub fs_free: IntGauge,
    pub fs_size: IntGauge,
    /// Click time of the record at the head of the replayer's current batch; 0: none.
    head_at_ms: Arc<AtomicI64>,
    /// GeoIP database loads by outcome (ok, error).
    pub geoip_loads: IntCounterVec,
}

impl ClickMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ClickMetrics {
            spooled: IntCounter::new("clicks_spooled_total", "Click events appended to the spool")?,
            refused: IntCounterVec::new(
                Opts::new(
                    "clicks_refused_total",
                    "Click events the spool refused (full, io, closed)",
                ),
                &["reason"],
            )?,
            pending: IntGauge::new(
                "spool_pending_records",
                "Spooled click events not yet acknowledged by Kafka (spool depth)",
            )?,
            disk_bytes: IntGauge::new("spool_disk_bytes", "Bytes of spool segment files")?,
            cut_bytes: IntCounter::new(
                "spool_cut_bytes_total",
                "Torn or corrupt spool bytes cut off at start",
            )?,
            io_errors: IntGauge::new(
                "spool_io_errors",
                "Failed spool writes and fsyncs since start",
            )?,
            corrupt_skipped: IntGauge::new(
                "spool_corrupt_skipped",
                "Spool records that became unreadable after start and were skipped",
            )?,
            replayed: IntCounter::new(
                "clicks_replayed_total",
                "Click events acknowledged by Kafka (re-sends included)",
            )?,
            replay_failures: IntCounter::new(
                "clicks_replay_failures_total",
                "Batches Kafka did not acknowledge (resent after backoff)",
            )?,
            producer_resets: IntCounter::new(
                "clicks_producer_resets_total",
                "Kafka producers the replayer replaced after consecutive failed batches",
            )?,
            oldest_age: prometheus::Gauge::new(
                "spool_oldest_age_seconds",
                "Age of the oldest spooled click not yet acknowledged by Kafka (0: none pending)",
            )?,
            fs_free: IntGauge::new(
                "spool_filesystem_free_bytes",
                "Bytes free to an unprivileged writer on the spool directory's filesystem",
            )?,
            fs_size: IntGauge::new(
                "spool_filesystem_size_bytes",
                "Size of the spool directory's filesystem",
            )?,
            head_at_ms: Arc::new(AtomicI64::new(0)),
            geoip_loads: IntCounterVec::new(
                Opts::new(
                    "geoip_loads_total",
                    "GeoIP database loads (at start and when the file changed) by outcome",
                ),
                &["outcome"],
            )?,
        };
        registry.register(Box::new(m.geoip_loads.clone()))?;
        registry.register(Box::new(m.spooled.clone()))?;
        registry.register(Box::new(m.refused.clone()))?;
        registry.register(Box::new(m.pending.clone()))?;
        registry.register(Box::new(m.disk_bytes.clone()))?;
        registry.register(Box::new(m.cut_bytes.clone()))?;
        registry.register(Box::new(m.io_errors.clone()))?;
        registry.register(Box::new(m.corrupt_skipped.clone()))?;
        registry.register(Box::new(m.replayed.clone()))?;
        registry.register(Box::new(m.replay_failures.clone()))?;
        registry.register(Box::new(m.producer_resets.clone()))?;
        registry.register(Box::new(m.oldest_age.clone()))?;
        registry.register(Box::new(m.fs_free.clone()))?;
        registry.register(Box::new(m.fs_size.clone()))?;
        // Every reason from the start, at 0: the first refusal is then an increase an alert
        // sees (a series born at 1 has none).
        for reason in REFUSED_REASONS {
            m.refused.with_label_values(&[reason]);
        }
        Ok(m)
    }

    fn observe(&self, spool: &Spool) {
        let s = spool.stats();
        self.pending.set(s.pending as i64);
        self.disk_bytes.set(s.disk_bytes as i64);
        self.io_errors.set(s.io_errors as i64);
        self.corrupt_skipped.set(s.corrupt_skipped as i64);
        let head = self.head_at_ms.load(Ordering::Relaxed);
        let age_ms = if s.pending == 0 || head == 0 {
            0
        } else {
            (now_ms() - head).max(0)
        };
        self.oldest_age.set(age_ms as f64 / 1000.0);
        // A filesystem that cannot be asked keeps the last answer.
        if let Ok(fs) = crate::spool::filesystem_space(spool.dir()) {
            self.fs_free.set(i64::try_from(fs.free).unwrap_or(i64::MAX));
            self.fs_size.set(i64::try_from(fs.size).unwrap_or(i64::MAX));
        }
    }

    /// Notes the click time of the oldest record the replayer holds (`None`: nothing pending).
    fn head(&self, rec: Option<&[u8]>) {
        let at = rec.and_then(unframe).and_then(|f| {
            f.at_ms.or_else(|| {
                serde_json::from_slice::<ClickEvent>(f.value)
                    .ok()
                    .map(|e| e.at_ms)
            })
        });
        self.head_at_ms.store(at.unwrap_or(0), Ordering::Relaxed);
    }
}

/// One tier's click pipeline: the spool it appends to and the replayer that empties it.
pub struct Clicks {
    tier: Tier,
    salt: String,
    trusted: TrustedProxies,
    spool: Arc<Spool>,
    metrics: ClickMetrics,
    stop: CancellationToken,
    replayer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Clicks {
    /// Opens the spool (cutting off any torn tail) and starts the replayer to `brokers`.
    pub fn start(
        args: &ClickArgs,
        brokers: &str,
        tier: Tier,
        instance: &str,
        metrics: ClickMetrics,
    ) -> Result<Arc<Clicks>, String> {
        args.validate()?;
        let cfg = args.spool_config();
        let (spool, reader, recovery) = Spool::open(cfg.clone())
            .map_err(|e| format!("opening spool {}: {e}", cfg.dir.display()))?;
        // Each cut was logged per segment by the spool; this is the summary.
        tracing::info!(dir = %cfg.dir.display(), pending = recovery.pending,
            cut_bytes = recovery.cut_bytes, cut_segments = recovery.cut_segments, "click spool open");
        metrics.cut_bytes.inc_by(recovery.cut_bytes);
        metrics.observe(&spool);
        let mut config = crate::kafka::producer(brokers, &format!("zlink-{instance}-clicks"));
        config
            .set("message.timeout.ms", args.clicks_timeout_ms.to_string())
            .set("linger.ms", "5")
            // Clicks are small JSON documents much alike: lz4 batches cut the broker's
            // bytes to write and checksum (its CPU per click) at little cost here.
            .set("compression.type", "lz4");
        args.kafka_tls.apply(&mut config);
        let producer =
            HealingProducer::with_maker(config, metrics.producer_resets.clone(), replay_producer)
                .map_err(|e| format!("creating the clicks producer: {e}"))?;
        let stop = CancellationToken::new();
        let replayer = tokio::spawn(replay(
            reader,
            spool.clone(),
            producer,
            args.clicks_topic.clone(),
            metrics.clone(),
            stop.clone(),
        ));
        Ok(Arc::new(Clicks {
            tier,
            salt: args.ip_hash_salt.0.clone(),
            trusted: args.trusted_proxies.clone(),
            spool,
            metrics,
            stop,
            replayer: Mutex::new(Some(replayer)),
        }))
    }

    /// Records the click of one redirect; returns its event id, or `None` if the spool refused
    /// it (counted). Returns once the event is in the spool file: one `write(2)` to the page
    /// cache on the caller's thread (about 2 µs here); never waits on Kafka or fsync.
    pub fn record(
        &self,
        slug: &str,
        now_ms: i64,
        peer: IpAddr,
        headers: &HeaderMap,
        trace: Option<&TraceContext>,
        geo: &Arc<crate::geo::Geo>,
    ) -> Option<Uuid> {
        let origin = self.trusted.origin(peer, headers, now_ms);
        let ev = event(self.tier, &self.salt, geo, slug, &origin, headers);
        self.spool_event(&ev, trace).then_some(ev.id)
    }

    /// Appends an event built elsewhere (primary builds its own) under the redirect's trace;
    /// false if refused (counted). Only a sampled trace travels on (the replayer sends it as
    /// the message's `traceparent`): a header on every click message cost more per redirect
    /// than everything else tracing does, and nothing downstream logs unsampled clicks.
    pub fn spool_event(&self, ev: &ClickEvent, trace: Option<&TraceContext>) -> bool {
        let r = self.spool.append(&frame(ev, trace.filter(|t| t.sampled)));
        self.count(r)
    }

    fn count(&self, r: Result<(), AppendError>) -> bool {
        match r {
            Ok(()) => {
                self.metrics.spooled.inc();
                true
            }
            Err(e) => {
                let reason = match e {
                    AppendError::Full => "full",
                    AppendError::Closed => "closed",
                    AppendError::Size => "size",
                    AppendError::Io(_) => "io",
                };
                self.metrics.refused.with_label_values(&[reason]).inc();
                false
            }
        }
    }

    /// Appends `events` in order and fsyncs them. Returns how many of them — always a prefix —
    /// are durable in the spool (the rest were refused, counted, and may be offered again).
    pub fn spool_durably(&self, events: &[ClickEvent]) -> usize {
        let frames: Vec<Vec<u8>> = events.iter().map(|e| frame(e, None)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut accepted = 0;
        for r in self.spool.append_batch(&refs) {
            let ok = r.is_ok();
            if !self.count(r) {
                // Keep order: nothing after a refused event counts as durable.
                break;
            }
            accepted += usize::from(ok);
        }
        if accepted > 0 && self.spool.sync().is_err() {
            return 0;
        }
        accepted
    }

    pub fn stats(&self) -> crate::spool::Stats {
        self.spool.stats()
    }

    /// Brings the spool gauges up to date (call before rendering metrics).
    pub fn observe_metrics(&self) {
        self.metrics.observe(&self.spool);
    }

    /// Graceful shutdown: refuses new clicks, fsyncs the spool, lets the replayer drain to
    /// Kafka for up to a few seconds (what is left stays spooled for the next start).
    pub async fn shutdown(&self) {
        let spool = self.spool.clone();
        let _ = tokio::task::spawn_blocking(move || spool.close()).await;
        self.stop.cancel();
        let handle = self
            .replayer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.await;
        }
        self.metrics.observe(&self.spool);
    }
}

async fn read_batch(reader: Reader) -> (Reader, std::io::Result<crate::spool::Batch>) {
    tokio::task::spawn_blocking(move || {
        let mut reader = reader;
        let b = reader.read(BATCH_RECORDS, BATCH_BYTES);
        (reader, b)
    })
    .await
    .expect("spool read does not panic")
}

/// Commits a delivered batch: the position reaches the disk at most every
/// [`POSITION_INTERVAL`] while clicks keep coming (two fsyncs each), and at once when idle or
/// stopping ([`persist`]). A crash re-sends what was committed since: same ids, counted once.
async fn commit(reader: Reader, batch: crate::spool::Batch) -> (Reader, std::io::Result<()>) {
    tokio::task::spawn_blocking(move || {
        let mut reader = reader;
        let r = reader.commit_relaxed(&batch, POSITION_INTERVAL);
        (reader, r)
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
struct BatchAcks {
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

/// The replayer's producer context: each delivery report settles its batch's count.
struct ReplayContext;

impl rdkafka::ClientContext for ReplayContext {}

impl rdkafka::producer::ProducerContext for ReplayContext {
    type DeliveryOpaque = Arc<BatchAcks>;

    fn delivery(&self, report: &rdkafka::message::DeliveryResult<'_>, acks: Arc<BatchAcks>) {
        acks.settle(report.as_ref().err().map(|(e, _)| e.to_string()));
    }
}

/// The replayer's producer: librdkafka's own polling thread serves the delivery reports.
type ReplayProducer = ThreadedProducer<ReplayContext>;

/// Makes a [`ReplayProducer`] (the [`HealingProducer`]'s maker).
fn replay_producer(config: &rdkafka::ClientConfig) -> rdkafka::error::KafkaResult<ReplayProducer> {
    config.create_with_context(ReplayContext)
}

/// Sends every record of the batch and waits for all acknowledgements.
async fn send_all(
    producer: &ReplayProducer,
    topic: &str,
    records: &[Vec<u8>],
) -> Result<(), String> {
    let acks = BatchAcks::new();
    let mut spans = Vec::new();
    for rec in records {
        let Some(f) = unframe(rec) else {
            // Checksummed, so written by us; an unframeable record would be a bug. Skip it
            // rather than block every click behind it.
            tracing::error!("click spool: record without a key; skipped");
            continue;
        };
        // The redirect's trace continues here: a `kafka.produce` span (exported if sampled),
        // and the message's `traceparent` names it as the parent of the consumer's work.
        let span = f.traceparent.and_then(TraceContext::parse).map(|parent| {
            let mut s = Span::remote_child("kafka.produce", &parent);
            s.set("topic", topic.to_string());
            s
        });
        let mut record = BaseRecord::with_opaque_to(topic, acks.clone())
            .key(f.key)
            .payload(f.value);
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
    r
}

async fn replay(
    mut reader: Reader,
    spool: Arc<Spool>,
    producer: HealingProducer<ReplayProducer>,
    topic: String,
    metrics: ClickMetrics,
    stop: CancellationToken,
) {
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
    loop {
        metrics.observe(&spool);
        let stopping = stop.is_cancelled();
        let read_at = tokio::time::Instant::now();
        let batch;
        (reader, batch) = read_batch(reader).await;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "click spool: read failed");
                tokio::select! {
                    _ = &mut give_up => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        metrics.head(batch.records.first().map(Vec::as_slice));
        if batch.records.is_empty() {
            if batch.end.is_some() {
                let r;
                (reader, r) = commit(reader, batch).await;
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
            // Let a few more clicks arrive: one batch (and one position fsync) per LINGER at
            // most while traffic is light, full batches back to back while it is heavy.
            if !stop.is_cancelled() {
                tokio::time::sleep(LINGER).await;
            }
            continue;
        }
        let n = batch.records.len() as u64;
        let full = batch.records.len() >= BATCH_RECORDS
            || batch.records.iter().map(Vec::len).sum::<usize>() >= BATCH_BYTES / 2;
        let used = producer.producer();
        let sent = tokio::select! {
            _ = &mut give_up => break,
            r = send_all(&used, &topic, &batch.records) => r,
        };
        match sent {
            Ok(()) => {
                producer.delivered(&used);
                metrics.replayed.inc_by(n);
                let r;
                (reader, r) = commit(reader, batch).await;
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
                        _ = tokio::time::sleep_until(read_at + LINGER) => {}
                    }
                }
            }
            Err(e) => {
                metrics.replay_failures.inc();
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
