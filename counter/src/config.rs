//! The counter's command line (`counter run --help`): Kafka, the consumer group, batching,
//! memory limits, the store.

use std::net::SocketAddr;
use zlink_clients::kafka::is_topic_name;
use zlink_store::StoreConfig;

#[derive(Debug, Clone, clap::Args)]
pub struct CountConfig {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "ZLINK_LISTEN", default_value = "127.0.0.1:8086")]
    pub listen: SocketAddr,
    /// Kafka bootstrap servers.
    #[arg(long, env = "ZLINK_KAFKA", default_value = "127.0.0.1:9092")]
    pub kafka: String,
    /// Consumer group of all counter instances.
    #[arg(long, env = "ZLINK_CLICKS_GROUP", default_value = "zlink-clicks")]
    pub group_id: String,
    /// Static group membership: an id unique to this instance and stable across its restarts
    /// (e.g. the pod name), so it gets its partitions back at once after a restart of its own
    /// or of Kafka. Empty: a dynamic member (rejoining waits out the old session, 10 s).
    #[arg(long, env = "ZLINK_GROUP_INSTANCE_ID", default_value = "")]
    pub group_instance_id: String,
    #[arg(long, env = "ZLINK_CLICKS_TOPIC", default_value = "clicks")]
    pub clicks_topic: String,
    /// How long the ids of counted events are remembered, in days: a copy of an event that
    /// arrives later than this after the first is counted again.
    #[arg(long, env = "ZLINK_CLICKS_DEDUP_DAYS", default_value_t = 45)]
    pub dedup_days: u32,
    /// Most clicks per batch (a batch ends with the message that reaches it; a message holds
    /// up to a replay batch of one partition's clicks). Large batches are cheap: a batch's
    /// writes are one per (day, bucket) partition it touches. A batch's decoded clicks are held
    /// until it is counted. Batches fill past a few thousand only while clicks wait (a
    /// backlog); then each (link, day) is written once per batch for all its clicks in it, so
    /// larger batches cost fewer store writes per click. Measured over 100,000 links
    /// (docs/performance-notebook.md, 2026-11-29): 50,000 or 100,000 against 20,000 was ahead
    /// in 10 of 12 A/B pairs (median +25%, on a noisy box), 50,000 and 100,000 even; the
    /// process peaked at ~280 / ~320 / ~400 MB at 20,000 / 50,000 / 100,000.
    #[arg(long, default_value_t = 50_000)]
    pub batch_max: usize,
    /// How long a batch waits for more messages after its first, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub batch_wait_ms: u64,
    /// How long the counts of a batch may wait in memory for those of the batches after it,
    /// milliseconds: everything counted within a window is written in one flush, each (link,
    /// day) once however many of its clicks the window held, and only then are the window's
    /// offsets committed. So the store's writes follow the (link, day)s clicked in a window, not
    /// the clicks; the stats run up to this much later (the spec allows 60 s), and a crash
    /// counts up to a window again (from Kafka, exactly once). 0: each batch is written alone.
    #[arg(long, env = "ZLINK_CLICKS_FLUSH_MS", default_value_t = 5_000)]
    pub flush_ms: u64,
    /// Most clicks a window holds before it is flushed early: a window holds each click's id
    /// and time (about 40 bytes) beside the (link, day) states it changed.
    #[arg(long, default_value_t = 500_000)]
    pub flush_clicks: u64,
    /// Store round trips in flight at once, per source (partition of the topic).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// (link, day) states kept in memory between batches, shared out among the sources (about
    /// 0.5 KiB each); beyond it the least recently used are dropped and read again when needed.
    #[arg(long, env = "ZLINK_CLICKS_KEY_CACHE", default_value_t = 200_000)]
    pub key_cache: usize,
    /// Ids of counted clicks kept in memory, shared out among the sources (about 40 bytes each),
    /// a minute of click time at a time; beyond it the least recently used minutes are dropped
    /// and read again.
    #[arg(long, env = "ZLINK_CLICKS_ID_CACHE", default_value_t = 2_000_000)]
    pub id_cache: usize,
    /// Seconds the consumer may go without progress while clicks wait (or Kafka does not say)
    /// before it is replaced by a fresh one; doubling, up to 300 s, while it stays stalled.
    /// Longer than the group session (30 s), so a rebalance that waits out a departed member's
    /// session is not taken for a stall.
    #[arg(long, env = "ZLINK_CONSUMER_STALL_SECS", default_value_t = 45)]
    pub consumer_stall_secs: u64,
    /// Fault injection for tests and drills: abort the process after the N-th flush was written
    /// and before its offsets are stored (a crash at the worst moment).
    #[arg(long, hide = true)]
    pub failpoint_abort_after_batches: Option<u64>,
    #[command(flatten)]
    pub store: StoreConfig,
}

impl CountConfig {
    pub fn validate(&self) -> Result<(), String> {
        self.store.validate()?;
        if self.kafka.trim().is_empty() {
            return Err("--kafka is required".into());
        }
        if !self.group_instance_id.is_empty() && !is_topic_name(&self.group_instance_id) {
            return Err("--group-instance-id must be 1-249 characters of [A-Za-z0-9._-]".into());
        }
        if !is_topic_name(&self.clicks_topic) || !is_topic_name(&self.group_id) {
            return Err(
                "--clicks-topic and --group-id must be 1-249 characters of [A-Za-z0-9._-]".into(),
            );
        }
        if !(1..=3650).contains(&self.dedup_days) {
            return Err("--dedup-days must be between 1 and 3650".into());
        }
        if !(1..=100_000).contains(&self.batch_max) {
            return Err("--batch-max must be between 1 and 100000".into());
        }
        if self.batch_wait_ms > 10_000 {
            return Err("--batch-wait-ms must be at most 10000".into());
        }
        if self.flush_ms > 30_000 {
            return Err("--flush-ms must be at most 30000 (stats stale by under a minute)".into());
        }
        if !(1..=5_000_000).contains(&self.flush_clicks) {
            return Err("--flush-clicks must be between 1 and 5000000".into());
        }
        if !(5..=3600).contains(&self.consumer_stall_secs) {
            return Err("--consumer-stall-secs must be between 5 and 3600".into());
        }
        if !(1..=256).contains(&self.concurrency) {
            return Err("--concurrency must be between 1 and 256".into());
        }
        if !(1_000..=100_000_000).contains(&self.key_cache)
            || !(10_000..=1_000_000_000).contains(&self.id_cache)
        {
            return Err(
                "--key-cache must be between 1000 and 1e8, --id-cache between 10000 and 1e9".into(),
            );
        }
        Ok(())
    }
}
