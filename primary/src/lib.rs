//! zlink primary: creates links and serves redirects from ScyllaDB with memcached in front.
//!
//! - [`config`]: typed flags/env config, validated at start; secrets never print.
//! - [`app`]: the state every handler shares, built once.
//! - [`http`]: route table, middleware (deadline + request metrics), accept loop, graceful drain.
//! - [`redirect`]: `GET|HEAD /{slug}`, the hot path, and click-event construction.
//! - [`api`]: `POST /api/v1/links`, `GET|PATCH /api/v1/links/{slug}`.
//! - [`policy`]: which destinations a link may have (own domains, deny/allow list files).
//! - [`cache`]: in-process cache → memcached → store lookup with request coalescing.
//! - [`stats`]: `GET /api/v1/links/{slug}/stats` and the info page `GET /{slug}+`.
//! - [`store`]: the store repositories a serving primary uses, on one guarded session.
//! - [`ids`]: auto-slug ID blocks leased with compare-and-set.
//! - [`auth`]: API keys (hashed at rest) and bearer authentication.
//! - [`keys`]: `POST /api/v1/keys`, `DELETE /api/v1/keys/{id}` (admin).
//! - [`limits`]: rate limits (token buckets per API key and per client address).
//! - [`events`]: the seam where link and click events leave the process.
//! - [`relay`]: link events to Kafka through the outbox; the expiry scheduler.
//! - [`metrics`]: Prometheus metrics, one registry, typed handles.
//! - [`error`]: API errors and their single mapping to status + JSON.
//! - [`counter`]: the click counter (`primary count-clicks`): `clicks` topic → aggregates.
//!
//! The store (schema, statements, click aggregates) is the `zlink-store` crate; clients, the
//! clock and the background services' ops endpoint are in `zlink-clients`.

pub mod api;
pub mod app;
pub mod auth;
pub mod cache;
pub mod config;
pub mod counter;
pub mod error;
pub mod events;
pub mod http;
pub mod ids;
pub mod keys;
pub mod limits;
pub use zlink_clients::memcache;
pub mod metrics;
pub mod policy;
pub mod redirect;
pub mod relay;
pub mod stats;
pub mod store;

use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves on an already-bound listener until `shutdown` is cancelled, then drains in-flight
/// requests for at most `grace`. Tests call this with port 0 listeners.
pub async fn run(
    listener: TcpListener,
    state: Arc<app::AppState>,
    shutdown: CancellationToken,
    grace: Duration,
) {
    http::serve(listener, state, shutdown, grace).await
}

/// Puts the store's circuit breaker and budgets (from `cfg`) in front of `db`: the session a
/// serving primary (binary and tests alike) talks to.
pub fn guard_store(
    db: zlink_store::Db,
    cfg: &config::ServeConfig,
    metrics: &metrics::Metrics,
) -> zlink_store::Db {
    let breaker = zlink_clients::breaker::Breaker::new(
        "store",
        cfg.store_breaker(),
        Some(metrics.breakers.clone()),
    );
    db.with_breaker(
        breaker,
        cfg.store.cql_timeout(),
        Duration::from_millis(cfg.store_read_budget_ms),
    )
}

/// Chooses where link events go: through the outbox relay to Kafka when `--kafka` is set
/// (spawning the relay's sweeper/expiry loop into `background`), else only counted.
pub fn event_sink(
    cfg: &config::ServeConfig,
    store: Arc<store::Store>,
    metrics: Arc<metrics::Metrics>,
    clock: Arc<dyn zlink_clients::clock::Clock>,
    shutdown: &CancellationToken,
    background: &mut tokio::task::JoinSet<()>,
) -> Result<Arc<dyn events::EventSink>, String> {
    match cfg.kafka_brokers() {
        Some(brokers) => {
            let settings = relay::KafkaSettings {
                brokers: brokers.to_string(),
                links_topic: cfg.links_topic.clone(),
                message_timeout: Duration::from_millis(cfg.kafka_message_timeout_ms),
            };
            let clicks = zlink_clients::clicks::Clicks::start(
                &cfg.clicks,
                brokers,
                zlink_wire::events::Tier::Primary,
                &cfg.instance,
                metrics.clicks.clone(),
            )?;
            let relay = relay::Relay::new(&settings, store, metrics, clock, &cfg.instance)
                .map_err(|e| format!("creating the Kafka producer: {e}"))?;
            background.spawn(relay.clone().run(shutdown.clone()));
            Ok(Arc::new(relay::KafkaSink { relay, clicks }))
        }
        None => {
            tracing::warn!("no --kafka: link events are not published (no outbox)");
            Ok(Arc::new(events::LogSink::new(metrics)))
        }
    }
}
