//! Typed configuration: flags with env-var fallbacks, validated at start.

use clap::Parser;
use std::net::SocketAddr;
use zlink_clients::breaker::BreakerConfig;
use zlink_clients::clicks::ClickArgs;
use zlink_clients::s3::S3Config;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "lastresort",
    version,
    about = "zlink last-resort tier: redirects from S3 alone"
)]
pub struct Config {
    #[arg(long, env = "ZLINK_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Name of this instance in logs.
    #[arg(long, env = "ZLINK_INSTANCE", default_value = "lastresort")]
    pub instance: String,
    #[command(flatten)]
    pub s3: S3Config,
    #[command(flatten)]
    pub clicks: ClickArgs,
    /// Traces (W3C traceparent from trusted proxies, OTLP export) and redirect log sampling.
    #[command(flatten)]
    pub trace: zlink_clients::trace::TraceArgs,
    #[command(flatten)]
    pub runtime: zlink_clients::process::RuntimeArgs,
    /// Kafka bootstrap servers that spooled clicks are replayed to whenever reachable. Nothing
    /// on the redirect path waits for Kafka; it may be down for days.
    #[arg(long, env = "ZLINK_KAFKA")]
    pub kafka: String,
    /// Budget for one S3 lookup (the blob, and the tombstone after a miss), milliseconds; past
    /// it a stale entry is served, or 503. Must stay below the host nginx's read timeout for
    /// lastresort processes (ARCHITECTURE.md, "Budgets").
    #[arg(long, env = "ZLINK_S3_BUDGET_MS", default_value_t = 300)]
    pub s3_budget_ms: u64,
    /// Consecutive S3 failures (errors or blown budgets) that open the S3 circuit: then S3 is
    /// not asked (stale answers or a fast 503) until one probe after --s3-breaker-open-ms.
    #[arg(long, env = "ZLINK_S3_BREAKER_FAILURES", default_value_t = 3)]
    pub s3_breaker_failures: u32,
    #[arg(long, env = "ZLINK_S3_BREAKER_OPEN_MS", default_value_t = 1000)]
    pub s3_breaker_open_ms: u64,
    /// This host's memcached (host:port); empty disables it.
    #[arg(long, env = "ZLINK_MEMCACHED", default_value = "")]
    pub memcached: String,
    /// Budget of one memcached operation, milliseconds.
    #[arg(long, env = "ZLINK_MEMCACHED_TIMEOUT_MS", default_value_t = 20)]
    pub memcached_timeout_ms: u64,
    /// Consecutive memcached failures that open its circuit...
    #[arg(long, env = "ZLINK_MEMCACHED_BREAKER_FAILURES", default_value_t = 3)]
    pub memcached_breaker_failures: u32,
    /// ...and how long it then stays skipped before one probe, milliseconds.
    #[arg(long, env = "ZLINK_MEMCACHED_BACKOFF_MS", default_value_t = 1000)]
    pub memcached_backoff_ms: u64,
    /// TTL of a link in this host's memcached, seconds. The change journal does not cover
    /// memcached's copies beyond the forget it sends, so an answer from memcached lives only
    /// --fresh-ttl-ms here: this TTL plus --fresh-ttl-ms plus the replication lag bounds how
    /// long a takedown takes to reach this rung without the journal: keep the sum under 5 s.
    #[arg(long, env = "ZLINK_MEMCACHED_TTL_S", default_value_t = 2)]
    pub memcached_ttl_s: u32,
    /// How long an answer the change journal does not cover (journal off or not being read,
    /// or the answer came from memcached) is served from memory before memcached/S3 is asked
    /// again, milliseconds (see --memcached-ttl-s).
    #[arg(long, env = "ZLINK_FRESH_TTL_MS", default_value_t = 2000)]
    pub fresh_ttl_ms: u64,
    /// How long an answer read from S3 is served from memory while the change journal is read
    /// (a change to it is forgotten within about --journal-poll-ms), milliseconds; also the
    /// bound on a change the journal missed. 0: no journal (every answer lives
    /// --fresh-ttl-ms).
    #[arg(long, env = "ZLINK_JOURNAL_TTL_MS", default_value_t = 60_000)]
    pub journal_ttl_ms: u64,
    /// How often the change journal is listed, milliseconds.
    #[arg(long, env = "ZLINK_JOURNAL_POLL_MS", default_value_t = 1000)]
    pub journal_poll_ms: u64,
    /// How long "no such object" is remembered, milliseconds.
    #[arg(long, env = "ZLINK_MISSING_TTL_MS", default_value_t = 1000)]
    pub missing_ttl_ms: u64,
    /// How long the last known answer may be served while S3 is unreachable, seconds.
    #[arg(long, env = "ZLINK_STALE_TTL_S", default_value_t = 86_400)]
    pub stale_ttl_s: u64,
    /// Memory budget of each in-process cache (fresh and stale), bytes.
    #[arg(long, env = "ZLINK_LOCAL_CACHE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub local_cache_bytes: u64,
    /// Cache-Control of redirects: must equal primary's --redirect-cache-control.
    #[arg(
        long,
        env = "ZLINK_REDIRECT_CACHE_CONTROL",
        default_value = "private, max-age=90"
    )]
    pub redirect_cache_control: String,
    /// The default domain's host names (comma-separated; must equal primary's host of
    /// --public-base-url plus its --short-domains). IP literals and `localhost` are always the
    /// default domain; any other host name is a branded domain, whose links are read from
    /// `<prefix><domain>/<slug>` (an unregistered one has none: 404).
    #[arg(long, env = "ZLINK_SHORT_DOMAINS", value_delimiter = ',')]
    pub short_domains: Vec<String>,
    /// The click log of this host's nginx (rung 3, nginx/lastresort.conf): tailed into the
    /// click spool, its position kept in the spool directory. Unset: not ingested.
    #[arg(long, env = "ZLINK_NGINX_CLICK_LOG")]
    pub nginx_click_log: Option<std::path::PathBuf>,
}

impl Config {
    pub fn validate(&self) -> Result<(), String> {
        for d in &self.short_domains {
            zlink_wire::domain::normalize(d).map_err(|e| format!("--short-domains: {d:?}: {e}"))?;
        }
        self.s3.validate()?;
        self.clicks.validate()?;
        self.runtime.validate()?;
        self.trace.validate()?;
        if self.kafka.trim().is_empty() {
            return Err("--kafka must name the brokers clicks are replayed to".into());
        }
        if http::HeaderValue::from_str(&self.redirect_cache_control).is_err() {
            return Err("--redirect-cache-control is not a valid header value".into());
        }
        if !(10..=10_000).contains(&self.s3_budget_ms) {
            return Err("--s3-budget-ms must be between 10 and 10000".into());
        }
        if self.memcached_timeout_ms == 0 || self.memcached_timeout_ms > 1000 {
            return Err("--memcached-timeout-ms must be between 1 and 1000".into());
        }
        if self.journal_ttl_ms != 0 {
            if !(self.fresh_ttl_ms..=3_600_000).contains(&self.journal_ttl_ms) {
                return Err(
                    "--journal-ttl-ms must be 0 or between --fresh-ttl-ms and 3600000".into(),
                );
            }
            if !(100..=10_000).contains(&self.journal_poll_ms) {
                return Err("--journal-poll-ms must be between 100 and 10000".into());
            }
            // A load that read S3 before a change must end before the last of the three
            // forgets (lastresort::journal).
            if self.s3_budget_ms > 2 * self.journal_poll_ms {
                return Err("--s3-budget-ms must be at most twice --journal-poll-ms".into());
            }
        }
        if self.local_cache_bytes < 1024 * 1024 {
            return Err("--local-cache-bytes must be at least 1 MiB".into());
        }
        self.s3_breaker().validate("--s3-breaker")?;
        self.memcached_breaker().validate("--memcached-breaker")?;
        Ok(())
    }

    pub fn s3_breaker(&self) -> BreakerConfig {
        BreakerConfig {
            failures_to_open: self.s3_breaker_failures,
            open_for: std::time::Duration::from_millis(self.s3_breaker_open_ms),
        }
    }

    pub fn memcached_breaker(&self) -> BreakerConfig {
        BreakerConfig {
            failures_to_open: self.memcached_breaker_failures,
            open_for: std::time::Duration::from_millis(self.memcached_backoff_ms),
        }
    }
}
