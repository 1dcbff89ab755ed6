//! Typed configuration: flags with env-var fallbacks, defaults, validation at start.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::time::Duration;
use zlink_clients::kafka::is_topic_name;
use zlink_store::StoreConfig;

pub use zlink_clients::Secret;

#[derive(Debug, Parser)]
#[command(
    name = "primary",
    version,
    about = "zlink primary tier: link API and redirects from ScyllaDB"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the link API and redirects.
    Serve(Box<ServeConfig>),
    /// Create the keyspace (if missing) and apply deploy/cql/schema.cql. Idempotent.
    Migrate {
        #[command(flatten)]
        store: StoreConfig,
        /// Replication factor for a newly created keyspace (NetworkTopologyStrategy).
        #[arg(long, env = "ZLINK_REPLICATION_FACTOR", default_value_t = 1)]
        replication_factor: u32,
    },
    /// Create an API key and print it once (only its hash is stored).
    CreateKey {
        #[command(flatten)]
        store: StoreConfig,
        /// The principal that owns links created with this key.
        #[arg(long)]
        owner: String,
        /// An admin key may read and change every link.
        #[arg(long)]
        admin: bool,
    },
}

#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Click spool and replay (used with --kafka: every redirect's click is spooled on local
    /// disk and shipped to the clicks topic, so a Kafka outage loses no click).
    #[command(flatten)]
    pub clicks: zlink_clients::clicks::ClickArgs,
    /// Address to listen on.
    #[arg(long, env = "ZLINK_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Name of this instance in logs, metrics and click events.
    #[arg(long, env = "ZLINK_INSTANCE", default_value = "primary")]
    pub instance: String,
    /// Base of the short URLs returned by the API (scheme://host[:port], no trailing slash):
    /// the address the world reaches the default domain at (the frontend, or the DNS name that
    /// moves to the last-resort hosts), never this process's own, so that every primary behind
    /// one frontend hands out the same URL and a shared link survives the loss of any one of
    /// them. Required; a loopback, private or single-label host is refused unless
    /// --local-deployment.
    #[arg(long, env = "ZLINK_PUBLIC_BASE_URL")]
    pub public_base_url: String,
    /// A deployment on one machine or a private network (the local topology, Compose, the
    /// tests): --public-base-url may name a loopback or private address.
    #[arg(long, env = "ZLINK_LOCAL_DEPLOYMENT")]
    pub local_deployment: bool,
    /// Further short domains this service answers on (comma-separated); no link may lead to
    /// one of them or the host of --public-base-url, or their subdomains (loops). With the
    /// host of --public-base-url, IP literals and `localhost`, they are the default domain's
    /// names: any other Host is a branded domain (its links only; unregistered: 404).
    #[arg(long, env = "ZLINK_SHORT_DOMAINS", value_delimiter = ',')]
    pub short_domains: Vec<String>,
    /// Branded domains an owner's registration activates at once (comma-separated; a name also
    /// covers its subdomains). Any other registration waits for an admin's approval
    /// (`POST /api/v1/domains/{domain}/approve`); an admin's own registration is active at once.
    #[arg(long, env = "ZLINK_BRANDED_DOMAINS_ALLOWED", value_delimiter = ',')]
    pub branded_domains_allowed: Vec<String>,
    /// The HTTPS listeners of every site that serves the short domains, `NAME=HOST:PORT`
    /// (comma-separated; the frontend and each last-resort site, as this process reaches
    /// them): the domain API shows per site whether it serves a valid certificate for a
    /// branded domain (a TLS handshake with the domain as server name). None: no `https` field.
    #[arg(long, env = "ZLINK_TLS_SITES", value_delimiter = ',')]
    pub tls_sites: Vec<String>,
    /// CA certificates (PEM) the certificate check trusts besides the system's roots.
    #[arg(long, env = "ZLINK_TLS_CA_FILE")]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// How long a certificate check's result is kept, seconds.
    #[arg(long, env = "ZLINK_TLS_CHECK_CACHE_SECS", default_value_t = 30)]
    pub tls_check_cache_secs: u64,
    /// Hosts no link may lead to, one per line (`#` comments; a name also covers its
    /// subdomains). Re-read when it changes.
    #[arg(long, env = "ZLINK_DENY_HOSTS_FILE")]
    pub deny_hosts_file: Option<std::path::PathBuf>,
    /// Hosts a link may lead to although the built-in rules refuse them (an internal host on
    /// purpose); same format. Never overrides the deny list or the own-domain rule.
    #[arg(long, env = "ZLINK_ALLOW_HOSTS_FILE")]
    pub allow_hosts_file: Option<std::path::PathBuf>,
    /// Link writes (create, status change) per API key: `RATE/UNIT[:BURST]` (e.g. `10/s:50`,
    /// `600/m`) or `off`. Admin keys are not limited. Excess requests get 429 + Retry-After.
    /// Limits are per process (see docs/design/abuse-limits.md).
    #[arg(long, env = "ZLINK_LIMIT_WRITES_PER_KEY", default_value = "10/s:50")]
    pub limit_writes_per_key: crate::limits::RateSpec,
    /// Link writes per client address (from X-Forwarded-For of a trusted proxy, else the peer).
    #[arg(long, env = "ZLINK_LIMIT_WRITES_PER_IP", default_value = "20/s:100")]
    pub limit_writes_per_ip: crate::limits::RateSpec,
    /// Public info pages (`/{slug}+`) per client address.
    #[arg(long, env = "ZLINK_LIMIT_INFO_PER_IP", default_value = "20/s:100")]
    pub limit_info_per_ip: crate::limits::RateSpec,
    /// Bearer tokens not already known to this process (each costs a store read) per client
    /// address; checked before the store is asked.
    #[arg(
        long,
        env = "ZLINK_LIMIT_UNKNOWN_KEYS_PER_IP",
        default_value = "2/s:20"
    )]
    pub limit_unknown_keys_per_ip: crate::limits::RateSpec,
    /// Client addresses no per-address limit applies to (CIDRs, comma-separated): e.g. the
    /// load generator of benchmarks and drills.
    #[arg(long, env = "ZLINK_RATE_LIMIT_EXEMPT", default_value = "")]
    pub rate_limit_exempt: zlink_clients::clicks::TrustedProxies,

    #[command(flatten)]
    pub store: StoreConfig,

    /// Traces (W3C traceparent from trusted proxies, OTLP export) and redirect log sampling.
    #[command(flatten)]
    pub trace: zlink_clients::trace::TraceArgs,
    #[command(flatten)]
    pub runtime: zlink_clients::process::RuntimeArgs,

    /// memcached address host:port; empty disables the shared cache layer.
    #[arg(long, env = "ZLINK_MEMCACHED", default_value = "")]
    pub memcached: String,
    /// Budget for one memcached operation (including waiting for a connection), milliseconds.
    /// Past it the redirect falls through to the store.
    #[arg(long, env = "ZLINK_MEMCACHED_TIMEOUT_MS", default_value_t = 20)]
    pub memcached_timeout_ms: u64,
    /// Budget for writing a changed link into memcached (`set`, or `delete` when that fails)
    /// before the change answers, milliseconds. Only when both fail is the key deleted in the
    /// background, and a stale value readable until that lands.
    #[arg(long, env = "ZLINK_MEMCACHED_WRITE_TIMEOUT_MS", default_value_t = 250)]
    pub memcached_write_timeout_ms: u64,
    /// Connections kept open to memcached.
    #[arg(long, env = "ZLINK_MEMCACHED_POOL", default_value_t = 8)]
    pub memcached_pool: usize,
    /// After --memcached-breaker-failures consecutive failures (refused, reset, past the
    /// budget), skip memcached for this long, milliseconds; then one request probes it.
    #[arg(long, env = "ZLINK_MEMCACHED_BACKOFF_MS", default_value_t = 1000)]
    pub memcached_backoff_ms: u64,
    /// Consecutive memcached failures that open its circuit.
    #[arg(long, env = "ZLINK_MEMCACHED_BREAKER_FAILURES", default_value_t = 3)]
    pub memcached_breaker_failures: u32,
    /// TTL of link entries in memcached, seconds (changes delete the entry explicitly).
    #[arg(long, env = "ZLINK_MEMCACHED_TTL_S", default_value_t = 300)]
    pub memcached_ttl_s: u32,

    /// Make sure the canary links exist (zlink_wire::canary: created if absent, at start and
    /// every 10 minutes), so that the probes of every rung have a link to follow. Deployments
    /// set it; tests that count links leave it off.
    #[arg(long, env = "ZLINK_CANARIES", default_value_t = false)]
    pub canaries: bool,
    /// Kafka bootstrap servers (host:port,...). Empty: link events are only counted and logged
    /// (no outbox), which is for tests and single-box experiments only.
    #[arg(long, env = "ZLINK_KAFKA", default_value = "")]
    pub kafka: String,
    /// Topic of link events.
    #[arg(long, env = "ZLINK_LINKS_TOPIC", default_value = "links")]
    pub links_topic: String,
    /// How long the producer retries one event before leaving it to the outbox sweeper, ms.
    #[arg(long, env = "ZLINK_KAFKA_MESSAGE_TIMEOUT_MS", default_value_t = 30_000)]
    pub kafka_message_timeout_ms: u64,
    /// A link event whose partition's leader has not acknowledged it after this long is sent
    /// to another partition (events carry versions: any partition will do), and that leader is
    /// avoided for a while (a broker its clients cannot reach may still lead), ms.
    #[arg(long, env = "ZLINK_KAFKA_REROUTE_AFTER_MS", default_value_t = 1_000)]
    pub kafka_reroute_after_ms: u64,

    /// Memory budget of the in-process redirect cache, bytes (entries are weighed by URL size).
    #[arg(long, env = "ZLINK_LOCAL_CACHE_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub local_cache_bytes: u64,
    /// TTL of a found link in the in-process cache, milliseconds. Bounds how long another
    /// instance may keep redirecting a link that was just disabled.
    #[arg(long, env = "ZLINK_LOCAL_CACHE_TTL_MS", default_value_t = 2000)]
    pub local_cache_ttl_ms: u64,
    /// TTL of "no such slug" in the in-process cache, milliseconds.
    #[arg(long, env = "ZLINK_NEGATIVE_CACHE_TTL_MS", default_value_t = 1000)]
    pub negative_cache_ttl_ms: u64,

    /// Status code of redirects for links created without one: 301, 302, 307 or 308.
    #[arg(long, env = "ZLINK_REDIRECT_CODE", default_value_t = 302)]
    pub redirect_code: u16,
    /// Cache-Control header sent with redirects.
    #[arg(
        long,
        env = "ZLINK_REDIRECT_CACHE_CONTROL",
        default_value = "private, max-age=90"
    )]
    pub redirect_cache_control: String,

    /// Secret key of the auto-slug permutation. Must never change once links exist.
    #[arg(long, env = "ZLINK_SLUG_KEY", hide_env_values = true)]
    pub slug_key: Secret,
    /// IDs leased per compare-and-set on the shared ID counter.
    #[arg(long, env = "ZLINK_ID_BLOCK_SIZE", default_value_t = 1000)]
    pub id_block_size: u64,

    /// Largest accepted request body, bytes.
    #[arg(long, env = "ZLINK_MAX_BODY_BYTES", default_value_t = 16 * 1024)]
    pub max_body_bytes: usize,
    /// Deadline for handling one request, milliseconds; past it the answer is 503.
    #[arg(long, env = "ZLINK_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub request_timeout_ms: u64,
    /// Deadline of one redirect (all lookups included), milliseconds; past it the answer is a
    /// 503 that the frontend fails over on. Must stay below the frontend's per-try read timeout
    /// (ARCHITECTURE.md, "Budgets") and above --memcached-timeout-ms + --store-read-budget-ms.
    #[arg(long, env = "ZLINK_REDIRECT_TIMEOUT_MS", default_value_t = 200)]
    pub redirect_timeout_ms: u64,
    /// Budget of the redirect's link read from the store, milliseconds (other statements have
    /// --cql-timeout-ms). Not answering within it counts as a store failure.
    #[arg(long, env = "ZLINK_STORE_READ_BUDGET_MS", default_value_t = 150)]
    pub store_read_budget_ms: u64,
    /// Consecutive store failures (errors or blown budgets) that open a store circuit. A primary
    /// has two, each counting its own calls: one for the redirect's reads (budget
    /// --store-read-budget-ms; metrics label `store_read`), one for every other statement
    /// (--cql-timeout-ms; `store`), so slow redirect reads do not refuse writes.
    #[arg(long, env = "ZLINK_STORE_BREAKER_FAILURES", default_value_t = 3)]
    pub store_breaker_failures: u32,
    /// How long an open store circuit fails its statements at once before one probe, ms. While
    /// the reads' is open, uncached redirects answer 503 at once (nginx fails over); while the
    /// statements' is, creates and API calls do.
    #[arg(long, env = "ZLINK_STORE_BREAKER_OPEN_MS", default_value_t = 1000)]
    pub store_breaker_open_ms: u64,
    /// Time allowed for in-flight requests to finish after SIGTERM, seconds.
    #[arg(long, env = "ZLINK_SHUTDOWN_GRACE_S", default_value_t = 10)]
    pub shutdown_grace_s: u64,
}

impl ServeConfig {
    pub fn validate(&self) -> Result<(), String> {
        self.store.validate()?;
        self.trace.validate()?;
        self.runtime.validate()?;
        if self.kafka_brokers().is_some() {
            self.clicks.validate()?;
        }
        if self.instance.is_empty()
            || self.instance.len() > 64
            || !self
                .instance
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("--instance must be 1-64 characters of [A-Za-z0-9_-]".into());
        }
        check_public_base(&self.public_base_url, self.local_deployment)?;
        for d in self
            .short_domains
            .iter()
            .chain(&self.branded_domains_allowed)
        {
            zlink_wire::domain::normalize(d)
                .map_err(|e| format!("--short-domains / --branded-domains-allowed: {d:?}: {e}"))?;
        }
        crate::certs::parse_sites(&self.tls_sites)?;
        if !zlink_wire::link::is_redirect_code(self.redirect_code) {
            return Err("--redirect-code must be one of 301, 302, 307, 308".into());
        }
        if http::HeaderValue::from_str(&self.redirect_cache_control).is_err() {
            return Err("--redirect-cache-control is not a valid header value".into());
        }
        if self.slug_key.0.len() < 16 {
            return Err("--slug-key / ZLINK_SLUG_KEY must be at least 16 characters".into());
        }
        if !is_topic_name(&self.links_topic) {
            return Err("--links-topic must be 1-249 characters of [A-Za-z0-9._-]".into());
        }
        if !(1000..=3_600_000).contains(&self.kafka_message_timeout_ms) {
            return Err("--kafka-message-timeout-ms must be between 1000 and 3600000".into());
        }
        if !(50..=60_000).contains(&self.kafka_reroute_after_ms) {
            return Err("--kafka-reroute-after-ms must be between 50 and 60000".into());
        }
        if self.memcached_pool == 0 || self.memcached_pool > 256 {
            return Err("--memcached-pool must be between 1 and 256".into());
        }
        if self.memcached_timeout_ms == 0 || self.memcached_timeout_ms > 1000 {
            return Err("--memcached-timeout-ms must be between 1 and 1000".into());
        }
        if !(1..=5000).contains(&self.memcached_write_timeout_ms) {
            return Err("--memcached-write-timeout-ms must be between 1 and 5000".into());
        }
        if self.local_cache_bytes < 1024 * 1024 {
            return Err("--local-cache-bytes must be at least 1 MiB".into());
        }
        if !(1..=1_000_000).contains(&self.id_block_size) {
            return Err("--id-block-size must be between 1 and 1000000".into());
        }
        if !(1024..=1024 * 1024).contains(&self.max_body_bytes) {
            return Err("--max-body-bytes must be between 1024 and 1048576".into());
        }
        if self.request_timeout_ms < 10 {
            return Err("--request-timeout-ms must be at least 10".into());
        }
        if !(1..=10_000).contains(&self.store_read_budget_ms) {
            return Err("--store-read-budget-ms must be between 1 and 10000".into());
        }
        if self.redirect_timeout_ms <= self.memcached_timeout_ms + self.store_read_budget_ms
            || self.redirect_timeout_ms > self.request_timeout_ms
        {
            return Err(
                "--redirect-timeout-ms must exceed --memcached-timeout-ms + \
                 --store-read-budget-ms (a miss may use both) and not exceed --request-timeout-ms"
                    .into(),
            );
        }
        self.store_breaker().validate("--store-breaker")?;
        self.memcached_breaker().validate("--memcached-breaker")?;
        Ok(())
    }

    pub fn store_breaker(&self) -> zlink_clients::breaker::BreakerConfig {
        zlink_clients::breaker::BreakerConfig {
            failures_to_open: self.store_breaker_failures,
            open_for: Duration::from_millis(self.store_breaker_open_ms),
        }
    }

    pub fn memcached_breaker(&self) -> zlink_clients::breaker::BreakerConfig {
        zlink_clients::breaker::BreakerConfig {
            failures_to_open: self.memcached_breaker_failures,
            open_for: Duration::from_millis(self.memcached_backoff_ms),
        }
    }

    pub fn kafka_brokers(&self) -> Option<&str> {
        let k = self.kafka.trim();
        (!k.is_empty()).then_some(k)
    }

    pub fn memcached_addr(&self) -> Option<&str> {
        let a = self.memcached.trim();
        (!a.is_empty()).then_some(a)
    }
}

/// `--public-base-url`: `http(s)://host[:port]`, nothing after it; outside a local deployment
/// a host the world can reach: what the destination policy calls public (no loopback, private
/// or otherwise non-public address, no single-label or internal name such as `localhost`).
fn check_public_base(base: &str, local: bool) -> Result<(), String> {
    const FORM: &str = "--public-base-url must be http(s)://host[:port] without a trailing slash";
    if !(base.starts_with("http://") || base.starts_with("https://")) || base.ends_with('/') {
        return Err(FORM.into());
    }
    let u = url::Url::parse(base).map_err(|_| FORM.to_string())?;
    if u.path() != "/" || u.query().is_some() || u.fragment().is_some() || !u.username().is_empty()
    {
        return Err(FORM.into());
    }
    if local {
        return Ok(());
    }
    zlink_wire::destination::check(&u, &Default::default()).map_err(|why| {
        format!(
            "--public-base-url {base} is not an address the world can reach ({why}): short \
             URLs would lead nowhere outside this network; set the frontend's public URL, or \
             --local-deployment for a deployment on one machine"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["primary", "serve", "--slug-key", "0123456789abcdef0123"];
        if !args.contains(&"--public-base-url") {
            argv.extend(["--public-base-url", "https://zl.example.com"]);
        }
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve(c) => c.validate().map(|_| *c),
            _ => unreachable!(),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = serve(&[]).unwrap();
        assert_eq!(c.redirect_code, 302);
        assert_eq!(c.memcached_addr(), None);
    }

    #[test]
    fn bad_values_are_refused_with_a_message() {
        assert!(serve(&["--redirect-code", "200"])
            .unwrap_err()
            .contains("redirect-code"));
        assert!(serve(&["--keyspace", "Bad-Name"])
            .unwrap_err()
            .contains("keyspace"));
        assert!(serve(&["--keyspace", "x; DROP"])
            .unwrap_err()
            .contains("keyspace"));
        assert!(serve(&["--public-base-url", "http://x/"])
            .unwrap_err()
            .contains("public-base-url"));
        assert!(serve(&["--instance", "a b"])
            .unwrap_err()
            .contains("instance"));
        assert!(serve(&["--redirect-cache-control", "a\nb"])
            .unwrap_err()
            .contains("cache-control"));
        // A redirect deadline that a cache miss cannot fit in is refused.
        assert!(serve(&["--redirect-timeout-ms", "100"])
            .unwrap_err()
            .contains("redirect-timeout-ms"));
        assert!(serve(&["--store-breaker-failures", "0"])
            .unwrap_err()
            .contains("store-breaker"));
        assert!(serve(&["--max-connections", "0"])
            .unwrap_err()
            .contains("max-connections"));
    }

    #[test]
    fn the_public_base_is_required_and_public_outside_a_local_deployment() {
        let missing =
            Cli::try_parse_from(["primary", "serve", "--slug-key", "0123456789abcdef0123"]);
        assert!(missing
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
            .contains("--public-base-url"));
        for ok in [
            "https://zl.example.com",
            "http://go.example.org:8080",
            "https://198.51.99.7",
        ] {
            assert!(serve(&["--public-base-url", ok]).is_ok(), "{ok}");
        }
        for private in [
            "http://127.0.0.1:21180",
            "http://localhost:8080",
            "http://10.1.2.3",
            "http://192.168.0.4",
            "http://172.20.0.1",
            "http://100.64.1.1",
            "http://[::1]:8080",
            "http://[fd00::1]",
            "http://frontend",
            "https://zl.internal",
            "http://printer.local",
        ] {
            let e = serve(&["--public-base-url", private]).unwrap_err();
            assert!(
                e.contains("not an address the world can reach"),
                "{private}: {e}"
            );
            assert!(
                serve(&["--public-base-url", private, "--local-deployment"]).is_ok(),
                "{private} in a local deployment"
            );
        }
        for bad in [
            "https://zl.example.com/x",
            "https://zl.example.com?a=1",
            "https://u@zl.example.com",
            "ftp://zl.example.com",
        ] {
            let e = serve(&["--public-base-url", bad, "--local-deployment"]).unwrap_err();
            assert!(e.contains("http(s)://host[:port]"), "{bad}: {e}");
        }
    }

    #[test]
    fn secrets_do_not_print() {
        let c = serve(&[]).unwrap();
        assert!(!format!("{c:?}").contains("0123456789abcdef"));
    }
}
