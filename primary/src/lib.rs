//! zlink primary: creates links and serves redirects from ScyllaDB with memcached in front.
//!
//! - [`config`]: typed flags/env config, validated at start; secrets never print.
//! - [`app`]: the state every handler shares, built once.
//! - [`http`]: route table, request deadlines and metrics, accept loop, graceful drain.
//! - [`redirect`]: `GET|HEAD /{slug}`, the hot path, and click-event construction.
//! - [`api`]: `POST /api/v1/links`, `GET|PATCH /api/v1/links/{slug}`.
//! - [`body`]: request bodies (JSON, size cap) and the `Idempotency-Key` header.
//! - [`write`]: the link write path, the one writer of link and outbox rows (in invariant order).
//! - [`listing`]: `GET /api/v1/links`, an owner's links a page at a time (the owner index).
//! - [`bulk`]: `POST /api/v1/links/bulk`, up to 1,000 creates with a result each.
//! - [`domains`]: branded domains' API (register, list, approve).
//! - [`hosts`]: the domain a request, route or create names; whether a host is one of ours.
//! - [`dashboard`]: `GET /dashboard/`, the link owners' page (static, on the public API).
//! - [`openapi`]: the OpenAPI 3.1 document of every route (`GET /api/v1/openapi.json`).
//! - [`views`]: the API's JSON answers (`Serialize` types) and their OpenAPI schemas.
//! - [`ops`]: `/healthz`, `/readyz`, `/metrics`.
//! - [`qr`]: `GET /api/v1/links/{slug}/qr`, the short URL as a QR code (SVG or PNG).
//! - [`policy`]: which destinations a link may have (own domains, deny/allow list files).
//! - [`canary`]: keeps the canary links (every rung's probes follow them) in existence.
//! - [`cache`]: in-process cache → memcached → store lookup with request coalescing.
//! - [`stats`]: `GET /api/v1/links/{slug}/stats` and the info page `GET /{slug}+`.
//! - [`store`]: the store repositories a serving primary uses, on one guarded session.
//! - [`ids`]: auto-slug ID blocks leased with compare-and-set.
//! - [`auth`]: API keys (hashed at rest) and bearer authentication.
//! - [`keys`]: `POST /api/v1/keys`, `DELETE /api/v1/keys/{id}` (admin).
//! - [`limits`]: rate limits (token buckets per API key and per client address).
//! - [`events`]: the seam where link and click events leave the process, and the link event
//!   a change announces.
//! - [`relay`]: link events to Kafka through the outbox; the expiry scheduler.
//! - [`metrics`]: Prometheus metrics, one registry, typed handles.
//! - [`error`]: API errors and their single mapping to status + JSON.
//!
//! The store (schema, statements, click aggregates) is the `zlink-store` crate; clients, the
//! clock and the background services' ops endpoint are in `zlink-clients`.

pub mod api;
pub mod app;
pub mod auth;
pub mod body;
pub mod bulk;
pub mod cache;
pub mod canary;
pub mod certs;
pub mod config;
pub mod dashboard;
pub mod domains;
pub mod error;
pub mod events;
pub mod hosts;
pub mod http;
pub mod ids;
pub mod keys;
pub mod limits;
pub mod listing;
pub use zlink_clients::memcache;
pub mod metrics;
pub mod openapi;
pub mod ops;
pub mod policy;
pub mod qr;
pub mod redirect;
pub mod relay;
pub mod stats;
pub mod store;
pub mod views;
pub mod write;

use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The composition root of `primary serve`: everything the binary runs, wired once. `main`
/// and the tests build it the same way ([`App::build`]), so the tests run the production
/// wiring.
pub struct App {
    pub state: Arc<app::AppState>,
    /// The relay (sweeper, expiry scheduler, leader watch) when link events go to Kafka;
    /// started by [`App::run`].
    relay: Option<Arc<relay::Relay>>,
    /// `--canaries`: keep the canary links in existence ([`canary::run`]).
    canaries: bool,
    grace: Duration,
    max_connections: usize,
    drain: Duration,
}

impl App {
    /// From a validated config and a connected session: the store's breaker and budgets,
    /// the repositories, the event sink (outbox relay and click spool with `--kafka`; without
    /// it `no_kafka_sink`, by default a log-only sink), the request state. Nothing serves or
    /// publishes until [`App::run`].
    pub async fn build(
        cfg: &config::ServeConfig,
        db: zlink_store::Db,
        clock: Arc<dyn zlink_clients::clock::Clock>,
        no_kafka_sink: Option<Arc<dyn events::EventSink>>,
    ) -> Result<App, String> {
        let metrics = Arc::new(metrics::Metrics::new());
        let db = Arc::new(guard_store(db, cfg, &metrics));
        let store = Arc::new(
            store::Store::prepare(db)
                .await
                .map_err(|e| format!("preparing statements: {e}"))?,
        );
        let (events, relay) = match (cfg.kafka_brokers(), no_kafka_sink) {
            (None, Some(sink)) => (sink, None),
            _ => event_sink(cfg, store.clone(), metrics.clone(), clock.clone())?,
        };
        let state = app::AppState::new(cfg, store, events, metrics, clock)?;
        Ok(App {
            state,
            relay,
            canaries: cfg.canaries,
            grace: Duration::from_secs(cfg.shutdown_grace_s),
            max_connections: cfg.runtime.max_connections,
            drain: Duration::from_millis(cfg.runtime.drain_ms),
        })
    }

    /// Starts the relay (and, with `--canaries`, the canary keeper), serves on an already-bound
    /// listener until `shutdown` is cancelled, drains in-flight requests for at most the grace
    /// period, then closes the event sink (fsyncs the click spool and ships what Kafka takes in
    /// a few seconds) and waits for the relay and the keeper to finish.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) {
        let mut background = tokio::task::JoinSet::new();
        if let Some(relay) = &self.relay {
            background.spawn(relay.clone().run(shutdown.clone()));
            background.spawn(relay.clone().watch_leaders(shutdown.clone()));
        }
        if self.canaries {
            let s = &self.state;
            background.spawn(canary::run(
                s.store.clone(),
                s.events.uses_outbox(),
                s.clock.clone(),
                shutdown.clone(),
            ));
        }
        http::serve(
            listener,
            self.state.clone(),
            shutdown,
            self.grace,
            self.max_connections,
            self.drain,
        )
        .await;
        self.state.events.close().await;
        while background.join_next().await.is_some() {}
    }
}

/// Puts the store's circuit breakers and budgets (from `cfg`) in front of `db`: the session a
/// serving primary talks to. Metrics label the statements' breaker `store` and the redirect
/// reads' `store_read`.
fn guard_store(
    db: zlink_store::Db,
    cfg: &config::ServeConfig,
    metrics: &metrics::Metrics,
) -> zlink_store::Db {
    let breaker = |name| {
        zlink_clients::breaker::Breaker::new(
            name,
            cfg.store_breaker(),
            Some(metrics.breakers.clone()),
        )
    };
    db.with_breakers(
        breaker("store"),
        cfg.store.cql_timeout(),
        breaker("store_read"),
        Duration::from_millis(cfg.store_read_budget_ms),
    )
}

/// The sink of a primary with Kafka.
type Sink = (Arc<dyn events::EventSink>, Option<Arc<relay::Relay>>);

/// Chooses where link events go: through the outbox relay to Kafka when `--kafka` is set
/// (the relay, whose sweeper and expiry loop [`App::run`] starts), else only counted.
fn event_sink(
    cfg: &config::ServeConfig,
    store: Arc<store::Store>,
    metrics: Arc<metrics::Metrics>,
    clock: Arc<dyn zlink_clients::clock::Clock>,
) -> Result<Sink, String> {
    match cfg.kafka_brokers() {
        Some(brokers) => {
            let settings = relay::KafkaSettings {
                brokers: brokers.to_string(),
                links_topic: cfg.links_topic.clone(),
                message_timeout: Duration::from_millis(cfg.kafka_message_timeout_ms),
                reroute_after: Duration::from_millis(cfg.kafka_reroute_after_ms),
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
            let sink = Arc::new(relay::KafkaSink {
                relay: relay.clone(),
                clicks,
            });
            Ok((sink, Some(relay)))
        }
        None => {
            tracing::warn!("no --kafka: link events are not published (no outbox)");
            Ok((Arc::new(events::LogSink::new(metrics)), None))
        }
    }
}
