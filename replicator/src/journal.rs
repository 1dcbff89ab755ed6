//! The change journal (`<prefix>.journal/`, format in [`zlink_wire::blob::JOURNAL_DIR`]): every
//! link key an event touched goes into the next journal object, written every
//! `--journal-interval-ms` while there is something to write. Lastresort lists the journal to
//! know what to forget, so it can keep everything else in memory for long.
//!
//! An event's offset is stored only after the journal object naming its key is in S3: a crash
//! between the S3 change and the journal write re-delivers the event, and applying it again
//! (even when the version guard skips it) journals the key again. So every change the
//! replicator made is journaled, or will be.

use crate::metrics::Metrics;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use zlink_clients::backoff::Backoff;
use zlink_clients::kafka::ClosingConsumer;
use zlink_clients::s3::S3Store;

/// How long journal objects are kept; lastresort only reads the last few seconds of them.
pub const RETENTION: Duration = Duration::from_secs(600);

/// An event done but for the journal: its offset is stored once the journal has its key.
pub struct Done {
    pub consumer: Arc<ClosingConsumer>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Default)]
struct Pending {
    keys: BTreeSet<String>,
    done: Vec<Done>,
}

pub struct Journal {
    s3: Arc<S3Store>,
    writer: String,
    interval: Duration,
    pending: Mutex<Pending>,
    wake: Notify,
    metrics: Arc<Metrics>,
}

impl Journal {
    /// `writer` names this instance in journal keys ([`zlink_wire::blob::is_journal_writer`]).
    pub fn new(
        s3: Arc<S3Store>,
        writer: String,
        interval: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        debug_assert!(zlink_wire::blob::is_journal_writer(&writer));
        Journal {
            s3,
            writer,
            interval,
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
            metrics,
        }
    }

    /// Records that an event touched `key` (none: an event that could not be decoded), and the
    /// offset to store once that is journaled. Calls for one partition come in offset order.
    pub fn record(&self, key: Option<&str>, done: Done) {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = key {
            p.keys.insert(k.to_string());
        }
        p.done.push(done);
        drop(p);
        self.wake.notify_one();
    }

    /// Writes what was recorded, one object per interval at most, until `shutdown`; then once
    /// more (a bounded try) so a clean stop stores every offset it can.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let mut prune_due = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep_until(prune_due) => {
                    self.prune().await;
                    prune_due = tokio::time::Instant::now() + RETENTION / 10;
                    continue;
                }
            }
            // Gather what else comes within the interval into the same object.
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.interval) => {}
            }
            self.flush(&shutdown).await;
        }
        let last = CancellationToken::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.flush(&last)).await;
    }

    /// Writes one journal object with every key recorded so far (retrying until it is in S3 or
    /// `stop`), then stores the offsets it covers.
    async fn flush(&self, stop: &CancellationToken) {
        let Pending { keys, done } =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if keys.is_empty() && done.is_empty() {
            return;
        }
        let keys: Vec<String> = keys.into_iter().collect();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        for chunk in keys.chunks(zlink_wire::blob::JOURNAL_MAX_KEYS) {
            loop {
                match self.s3.put_journal(&self.writer, chunk).await {
                    Ok(()) => break,
                    Err(e) => {
                        self.metrics
                            .s3_failures
                            .with_label_values(&["journal"])
                            .inc();
                        tracing::warn!(error = %e, keys = chunk.len(), "journal write failed; retrying");
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => {
                        // Not journaled: the offsets stay unstored, the events come again.
                        return;
                    }
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                }
            }
            self.metrics.journal_objects.inc();
        }
        for d in done {
            zlink_clients::kafka::store_done(&d.consumer, &d.topic, d.partition, d.offset);
        }
    }

    /// Deletes journal objects older than [`RETENTION`] (any writer's: the listing is shared).
    async fn prune(&self) {
        let cutoff = zlink_clients::now_ms() - RETENTION.as_millis() as i64;
        let names = match self.s3.list_journal(0, 10_000).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "journal listing for pruning failed");
                return;
            }
        };
        for name in names {
            match zlink_wire::blob::journal_time(&name) {
                Some(t) if t < cutoff => {
                    if let Err(e) = self.s3.delete_journal(&name).await {
                        tracing::debug!(error = %e, "pruning a journal object failed");
                        return;
                    }
                }
                Some(_) => break,
                None => {}
            }
        }
    }
}
