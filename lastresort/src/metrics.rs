//! Every lastresort metric, registered in one place under `zlink_lastresort_`, plus the local
//! `/stats` aggregates (this tier assumes no metrics system is alive).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub mod redirects;

pub struct Metrics {
    registry: Registry,
    /// Requests by status code.
    pub requests: IntCounterVec,
    /// `requests` with a redirect's usual status and `via` resolved ([`zlink_redirect::hot`]).
    pub requests_hot: zlink_redirect::hot::HotCounters,
    /// Lookups by the answering layer and memcached failures by kind (the redirect kit's
    /// cache layers count them).
    pub cache: zlink_redirect::cache::CacheMetrics,
    /// The accept loop's connections (open, waits for a slot).
    pub connections: zlink_redirect::serve::ConnMetrics,
    /// S3 GetObject latency, seconds.
    pub s3_seconds: Histogram,
    pub s3_errors: IntCounter,
    /// Objects that were not exactly what the replicator writes (treated as missing).
    pub malformed: IntCounter,
    /// Change-journal polls by result (ok, error), keys forgotten because of it, and whether
    /// it is trusted (1: answers from S3 live --journal-ttl-ms).
    pub journal_polls: IntCounterVec,
    pub journal_forgets: IntCounter,
    pub journal_trusted: IntGauge,

    /// Rung-3 clicks ingested from the nginx click log, and lines refused as malformed.
    pub nginx_clicks_ingested: IntCounter,
    pub nginx_clicks_malformed: IntCounter,
    /// Click spool and replay.
    pub clicks: zlink_clients::clicks::ClickMetrics,
    /// Circuit breakers (S3, memcached): state, transitions, calls refused, timeouts.
    pub breakers: zlink_clients::breaker::BreakerMetrics,
    /// Redirects since start, total and per slug (bounded: the busiest-recent 100k slugs),
    /// counted per thread ([`redirects`]).
    pub redirects: redirects::Redirects,
}

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("zlink_lastresort".into()), None).expect("valid prefix");
        let requests = IntCounterVec::new(
            Opts::new(
                "requests_total",
                "Requests by status and how they came: failover (the frontend failed them over) or direct",
            ),
            &["status", "via"],
        )
        .expect("metric");
        let lookups = IntCounterVec::new(
            Opts::new("lookups_total", "Lookups by answering layer"),
            &["layer"],
        )
        .expect("metric");
        let s3_seconds = Histogram::with_opts(
            HistogramOpts::new("s3_get_seconds", "S3 GetObject latency").buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            ]),
        )
        .expect("metric");
        let s3_errors =
            IntCounter::new("s3_errors_total", "Failed or timed-out S3 reads").expect("metric");
        let malformed = IntCounter::new(
            "malformed_blobs_total",
            "Objects refused by the blob parser",
        )
        .expect("metric");
        let memcached_errors = IntCounterVec::new(
            Opts::new("memcached_errors_total", "memcached failures by kind"),
            &["kind"],
        )
        .expect("metric");
        let nginx_clicks_ingested = IntCounter::new(
            "nginx_clicks_ingested_total",
            "Rung-3 clicks ingested from the nginx click log",
        )
        .expect("metric");
        let nginx_clicks_malformed = IntCounter::new(
            "nginx_clicks_malformed_total",
            "nginx click log lines refused as malformed",
        )
        .expect("metric");
        let journal_polls = IntCounterVec::new(
            Opts::new("journal_polls_total", "Change-journal polls by result"),
            &["result"],
        )
        .expect("metric");
        let journal_forgets = IntCounter::new(
            "journal_forgets_total",
            "Keys forgotten because the change journal listed them (each up to 3 times)",
        )
        .expect("metric");
        let journal_trusted = IntGauge::new(
            "journal_trusted",
            "1 while the change journal is read (answers from S3 live --journal-ttl-ms)",
        )
        .expect("metric");
        zlink_clients::register_metrics!(
            registry,
            nginx_clicks_ingested,
            journal_polls,
            journal_forgets,
            journal_trusted,
            nginx_clicks_malformed,
            requests,
            lookups,
            s3_seconds,
            s3_errors,
            malformed,
            memcached_errors,
        );
        let clicks =
            zlink_clients::clicks::ClickMetrics::register(&registry).expect("registered once");
        let breakers =
            zlink_clients::breaker::BreakerMetrics::register(&registry).expect("registered once");
        let connections =
            zlink_redirect::serve::ConnMetrics::register(&registry).expect("registered once");
        Metrics {
            breakers,
            connections,
            registry,
            requests_hot: zlink_redirect::hot::HotCounters::new(
                requests.clone(),
                &[
                    &["302", "direct"],
                    &["302", "failover"],
                    &["301", "direct"],
                    &["301", "failover"],
                    &["307", "direct"],
                    &["308", "direct"],
                    &["404", "direct"],
                    &["404", "failover"],
                    &["410", "direct"],
                    &["410", "failover"],
                ],
            ),
            requests,
            cache: zlink_redirect::cache::CacheMetrics::new(lookups, memcached_errors),
            s3_seconds,
            s3_errors,
            malformed,
            journal_polls,
            journal_forgets,
            journal_trusted,
            nginx_clicks_ingested,
            nginx_clicks_malformed,
            clicks,
            redirects: redirects::Redirects::new(),
        }
    }

    pub fn redirected(&self, slug: &str) {
        self.redirects.add(slug);
    }

    pub fn render(&self) -> Vec<u8> {
        zlink_clients::ops::render(&self.registry)
    }

    /// `/stats`: total redirects and the per-slug counts, busiest first (at most `top`).
    pub fn stats(&self, top: usize) -> serde_json::Value {
        let (total, mut slugs) = self.redirects.snapshot();
        slugs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        slugs.truncate(top);
        serde_json::json!({
            "redirects_total": total,
            "slugs": slugs.into_iter().map(|(s, n)| serde_json::json!({"slug": s, "redirects": n})).collect::<Vec<_>>(),
        })
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
