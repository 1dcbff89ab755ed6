//! One tier's click pipeline: the spool every redirect appends its click to, the replayer
//! that ships the spool to Kafka `clicks` ([`replay`]), and their metrics.

use super::*;

mod replay;
pub use replay::partition_of;
use replay::{replay, replay_producer, Shipping};

/// Why the spool refused a click: the `reason` label of `clicks_refused_total`.
const REFUSED_REASONS: [&str; 4] = ["full", "closed", "size", "io"];

/// How often, at most, the spool's filesystem gauges are read (milliseconds): far more often
/// than anything scrapes them, and a disk fills in minutes, not in a second.
const FS_READ_EVERY_MS: i64 = 1000;

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
    /// Kafka messages those clicks went in (a message holds one partition's share of a batch).
    pub replay_messages: IntCounter,
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
    /// When the filesystem gauges were last read (`now_ms`; 0: never).
    fs_read_ms: Arc<AtomicI64>,
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
            replay_messages: IntCounter::new(
                "clicks_replay_messages_total",
                "Kafka messages the replayed click events went in (one or more events each)",
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
            fs_read_ms: Arc::new(AtomicI64::new(0)),
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
        registry.register(Box::new(m.replay_messages.clone()))?;
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
        // The replayer observes every round: `statvfs` (a path walk) at most once a second,
        // where every round it was about a tenth of the replayer's CPU at 4,000 clicks a
        // second. A scrape reads it afresh ([`Clicks::observe_metrics`]).
        let last = self.fs_read_ms.load(Ordering::Relaxed);
        if (now_ms() - last).abs() >= FS_READ_EVERY_MS {
            self.observe_fs(spool);
        }
    }

    /// The spool filesystem's gauges, read now; a filesystem that cannot be asked keeps the
    /// last answer.
    fn observe_fs(&self, spool: &Spool) {
        self.fs_read_ms.store(now_ms(), Ordering::Relaxed);
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
            Shipping {
                topic: args.clicks_topic.clone(),
                message_bytes: args.clicks_message_bytes,
                linger: Duration::from_millis(args.clicks_linger_ms),
            },
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
    /// it (counted). Returns once the event is in the spool: copied into its mapped staging ring
    /// under the spool's lock (no system call; without a ring, one `write(2)` into the segment);
    /// never waits on Kafka or fsync.
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
        with_event(self.tier, &self.salt, geo, slug, &origin, headers, |ev| {
            self.spool_event(ev, trace).then_some(ev.id)
        })
    }

    /// Appends an event built elsewhere (primary builds its own) under the redirect's trace;
    /// false if refused (counted). Only a sampled trace travels on (the replayer sends it as
    /// the message's `traceparent`): a header on every click message cost more per redirect
    /// than everything else tracing does, and nothing downstream logs unsampled clicks.
    pub fn spool_event(&self, ev: &ClickRef<'_>, trace: Option<&TraceContext>) -> bool {
        thread_local! {
            /// The record being framed (one per thread; a record is at most a few KiB).
            static RECORD: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(1024));
        }
        let r = RECORD.with_borrow_mut(|rec| {
            rec.clear();
            frame_into(rec, ev, trace.filter(|t| t.sampled));
            self.spool.append(rec)
        });
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
        let frames: Vec<Vec<u8>> = events.iter().map(|e| frame(&e.borrowed(), None)).collect();
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
        self.metrics.observe_fs(&self.spool);
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
