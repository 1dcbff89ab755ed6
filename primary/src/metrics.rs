//! Every primary metric, registered in one place under `zlink_primary_`. The rest of the code
//! holds these typed handles; no metric names are spelled anywhere else.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};

pub struct Metrics {
    registry: Registry,
    /// Requests by route and status code.
    pub requests: IntCounterVec,
    /// `requests` with the redirect route's usual statuses resolved ([`zlink_redirect::hot`]).
    pub requests_hot: zlink_redirect::hot::HotCounters,
    /// Redirect handling time (lookup through response), seconds.
    pub redirect_seconds: Histogram,
    /// Lookups by the answering layer and memcached failures by kind (the redirect kit's
    /// cache layers count them).
    pub cache: zlink_redirect::cache::CacheMetrics,
    /// The accept loop's connections (open, waits for a slot).
    pub connections: zlink_redirect::serve::ConnMetrics,
    /// Link reads that reached the store (what request coalescing bounds).
    pub store_reads: IntCounter,
    /// Store failures by operation.
    pub store_errors: IntCounterVec,
    /// Events handed to the event sink, by topic and kind.
    pub events: IntCounterVec,
    /// `events{topic="clicks",kind="click"}`, resolved once (one per redirect).
    pub click_events: IntCounter,
    /// Kafka publish failures (the outbox keeps the event for a retry).
    pub publish_errors: IntCounter,
    pub links_rerouted: IntCounter,
    /// Link-event producers replaced (consecutive failed publishes, or stuck while Kafka answers).
    pub producer_resets: IntCounter,
    /// Outbox rows the sweeper found past the fast path's window in its last pass (0 on
    /// instances not holding the relay lease), and the oldest one's age.
    pub outbox_backlog: prometheus::IntGauge,
    pub outbox_oldest_age: prometheus::Gauge,
    /// Requests refused by a rate limit (429), by limit.
    pub rate_limited: IntCounterVec,
    /// Click spool and replay.
    pub clicks: zlink_clients::clicks::ClickMetrics,
    /// Circuit breakers (store, memcached): state, transitions, calls refused, timeouts.
    pub breakers: zlink_clients::breaker::BreakerMetrics,
    /// Store nodes the driver knows, by whether it holds a connection to them (set when
    /// scraped): one node of a ring down or hung shows here while every request still succeeds.
    pub store_nodes: prometheus::IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("zlink_primary".into()), None).expect("valid prefix");
        let requests = IntCounterVec::new(
            Opts::new("requests_total", "HTTP requests by route and status"),
            &["route", "status"],
        )
        .expect("valid metric");
        let redirect_seconds = Histogram::with_opts(
            HistogramOpts::new("redirect_duration_seconds", "Time to answer a redirect").buckets(
                vec![
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0,
                ],
            ),
        )
        .expect("valid metric");
        let lookups = IntCounterVec::new(
            Opts::new(
                "cache_lookups_total",
                "Redirect lookups by the layer that answered",
            ),
            &["layer"],
        )
        .expect("valid metric");
        let store_reads = IntCounter::new(
            "store_link_reads_total",
            "Link reads that reached the store",
        )
        .expect("valid metric");
        let store_errors = IntCounterVec::new(
            Opts::new("store_errors_total", "Store failures by operation"),
            &["op"],
        )
        .expect("valid metric");
        let memcached_errors = IntCounterVec::new(
            Opts::new("memcached_errors_total", "memcached failures by kind"),
            &["kind"],
        )
        .expect("valid metric");
        let events = IntCounterVec::new(
            Opts::new("events_total", "Events emitted by topic and kind"),
            &["topic", "kind"],
        )
        .expect("valid metric");
        let publish_errors = IntCounter::new(
            "publish_errors_total",
            "Kafka publish failures (retried from the outbox)",
        )
        .expect("valid metric");
        let links_rerouted = IntCounter::new(
            "links_rerouted_total",
            "Link events sent to another partition: their own partition's leader missed --kafka-reroute-after-ms (or has none)",
        )
        .expect("valid metric");
        let producer_resets = IntCounter::new(
            "producer_resets_total",
            "Link-event Kafka producers replaced (consecutive failed publishes, or stuck while Kafka answers a fresh client)",
        )
        .expect("valid metric");
        let outbox_backlog = prometheus::IntGauge::new(
            "outbox_backlog_rows",
            "Outbox rows older than the fast path's window at the last sweep (lease holder only; at most 500 per shard)",
        )
        .expect("valid metric");
        let outbox_oldest_age = prometheus::Gauge::new(
            "outbox_oldest_age_seconds",
            "Age of the oldest outbox row at the last sweep (0: none past the fast path's window)",
        )
        .expect("valid metric");
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "rate_limited_total",
                "Requests refused by a rate limit, by limit",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let store_nodes = prometheus::IntGaugeVec::new(
            Opts::new(
                "store_nodes",
                "Store nodes the driver knows, by state: connected or unreachable",
            ),
            &["state"],
        )
        .expect("valid metric");
        zlink_clients::register_metrics!(
            registry,
            publish_errors,
            links_rerouted,
            producer_resets,
            outbox_backlog,
            outbox_oldest_age,
            rate_limited,
            requests,
            redirect_seconds,
            lookups,
            store_reads,
            store_errors,
            memcached_errors,
            events,
            store_nodes,
        );
        let clicks =
            zlink_clients::clicks::ClickMetrics::register(&registry).expect("registered once");
        let breakers =
            zlink_clients::breaker::BreakerMetrics::register(&registry).expect("registered once");
        let connections =
            zlink_redirect::serve::ConnMetrics::register(&registry).expect("registered once");
        Self {
            clicks,
            breakers,
            connections,
            registry,
            requests_hot: zlink_redirect::hot::HotCounters::new(
                requests.clone(),
                &[
                    &["redirect", "302"],
                    &["redirect", "301"],
                    &["redirect", "307"],
                    &["redirect", "308"],
                    &["redirect", "404"],
                    &["redirect", "410"],
                ],
            ),
            requests,
            redirect_seconds,
            cache: zlink_redirect::cache::CacheMetrics::new(lookups, memcached_errors),
            store_reads,
            store_errors,
            click_events: events.with_label_values(&["clicks", "click"]),
            events,
            publish_errors,
            links_rerouted,
            producer_resets,
            outbox_backlog,
            outbox_oldest_age,
            rate_limited,
            store_nodes,
        }
    }

    /// Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        zlink_clients::ops::render(&self.registry)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
