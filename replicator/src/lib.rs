//! zlink replicator: keeps S3 equal to ScyllaDB for every link, so the last-resort tier can
//! serve redirects from S3 alone.
//!
//! - [`consumer`]: the `links` consumer group, per-partition workers, offsets after S3, DLQ.
//! - [`apply`]: one event → PUT or DELETE, guarded by the recorded replica version.
//! - [`journal`]: the change journal in S3 that tells lastresort what to forget.
//! - [`reconcile`]: full comparison ScyllaDB ↔ S3 with repair (`replicator reconcile`).
//! - [`audit`]: the same comparison all the time, in slices, and a read-back of each write
//!   ([`rechecks`]: the writes waiting for it).
//! - [`metrics`]: Prometheus metrics, one registry.

pub mod apply;
pub mod audit;
pub mod consumer;
pub mod journal;
pub mod metrics;
pub mod rechecks;
pub mod reconcile;
pub use zlink_clients::s3;

use apply::Applier;
use consumer::Pipeline;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use zlink_clients::ops::{self, Ops, Readiness};

/// The composition root of `replicator run`, used by `main` and the tests alike.
pub struct App {
    pub applier: Arc<Applier>,
    pub pipeline: Arc<Pipeline>,
    pub audit: Arc<audit::Audit>,
}

impl App {
    /// From validated configs and a connected session: the S3 client, the replica-version
    /// repository, the metrics, the consumer (not yet consuming), the audit (not yet running).
    pub async fn build(
        kafka: &consumer::KafkaConfig,
        s3: &zlink_clients::s3::S3Config,
        audit: &audit::AuditArgs,
        db: zlink_store::Db,
        clock: Arc<dyn zlink_clients::clock::Clock>,
    ) -> anyhow::Result<App> {
        let db = Arc::new(db);
        let metrics = Arc::new(metrics::Metrics::new());
        let s3 = Arc::new(s3::S3Store::new(s3).map_err(anyhow::Error::msg)?);
        let rechecks = Arc::new(rechecks::Rechecks::new(audit.recheck_secs, metrics.clone()));
        let applier = Arc::new(Applier {
            s3: s3.clone(),
            replicas: zlink_store::replicas::Replicas::prepare(db.clone()).await?,
            db: db.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            rechecks: rechecks.clone(),
        });
        let checker = reconcile::Checker {
            store: Arc::new(reconcile::ReconcileStore::prepare(db.clone()).await?),
            s3,
        };
        let audit = Arc::new(audit::Audit::new(
            checker,
            zlink_store::coord::Leases::prepare(db.clone()).await?,
            zlink_store::coord::Cursors::prepare(db).await?,
            metrics.clone(),
            clock,
            audit.clone(),
            rechecks,
        ));
        let pipeline = Pipeline::new(kafka, applier.clone(), metrics)?;
        Ok(App {
            applier,
            pipeline,
            audit,
        })
    }

    /// Consumes and serves the ops endpoint until `shutdown`.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) {
        let audit = tokio::spawn(self.audit.clone().run(shutdown.clone()));
        run(listener, self.pipeline, self.applier, shutdown).await;
        let _ = audit.await;
    }
}

/// Runs the consumer pipeline and the ops endpoint until `shutdown`; returns once the consumer
/// has stopped and committed.
async fn run(
    listener: TcpListener,
    pipeline: Arc<Pipeline>,
    applier: Arc<Applier>,
    shutdown: CancellationToken,
) {
    let metrics = applier.metrics.clone();
    let ops = Arc::new(Ops::new(Box::new(move || metrics.render())));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(ops::serve(listener, ops.clone(), shutdown.clone()));
    tasks.spawn({
        let (ops, applier, pipeline, shutdown) = (
            ops.clone(),
            applier.clone(),
            pipeline.clone(),
            shutdown.clone(),
        );
        async move {
            loop {
                let s3_ok = applier.s3.ping().await.is_ok();
                let store_ok = applier.db.ping().await.is_ok();
                let p = pipeline.clone();
                let kafka_ok = tokio::task::spawn_blocking(move || p.kafka_reachable())
                    .await
                    .unwrap_or(false);
                ops.set_readiness(Readiness::of(&[
                    ("s3", s3_ok),
                    ("store", store_ok),
                    ("kafka", kafka_ok),
                ]));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    });
    pipeline.run(shutdown).await;
    while tasks.join_next().await.is_some() {}
}
