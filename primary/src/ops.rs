//! The ops endpoint of the background services (replicator, click counter): `/healthz`,
//! `/readyz`, `/metrics`. Readiness is probed by the service in the background and stored in
//! [`Ops::ready`], so a probe never waits on a dependency. Also the Kafka consumer lag both
//! report.

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub struct Ops {
    /// Renders the service's registry in the Prometheus text format.
    pub render: Box<dyn Fn() -> Vec<u8> + Send + Sync>,
    pub ready: AtomicBool,
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn handle(ops: &Ops, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let json = "application/json";
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => respond(StatusCode::OK, json, br#"{"status":"ok"}"#.to_vec()),
        (&Method::GET, "/readyz") if ops.ready.load(Ordering::Relaxed) => {
            respond(StatusCode::OK, json, br#"{"status":"ready"}"#.to_vec())
        }
        (&Method::GET, "/readyz") => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            json,
            br#"{"status":"not_ready"}"#.to_vec(),
        ),
        (&Method::GET, "/metrics") => {
            respond(StatusCode::OK, "text/plain; version=0.0.4", (ops.render)())
        }
        _ => respond(
            StatusCode::NOT_FOUND,
            json,
            br#"{"error":{"code":"not_found","message":"not found"}}"#.to_vec(),
        ),
    }
}

pub async fn serve(listener: TcpListener, ops: Arc<Ops>, shutdown: CancellationToken) {
    loop {
        let stream = tokio::select! {
            _ = shutdown.cancelled() => return,
            s = listener.accept() => match s {
                Ok((s, _)) => s,
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning on the error.
                    tracing::warn!(error = %e, "ops accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let ops = ops.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let ops = ops.clone();
                async move { Ok::<_, Infallible>(handle(&ops, &req)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Messages behind the high watermark, per partition assigned to `consumer`. Blocking (it asks
/// the broker): call it from `spawn_blocking`.
pub fn consumer_lag(consumer: &StreamConsumer) -> Vec<(i32, i64)> {
    let mut out = Vec::new();
    let Ok(positions) = consumer.position() else {
        return out;
    };
    // Before the first message of a partition arrives its position is unknown; then the
    // committed offset is where consumption stands.
    let committed = consumer.committed(Duration::from_secs(1)).ok();
    for e in positions.elements() {
        let Ok((_, high)) =
            consumer.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(1))
        else {
            continue;
        };
        let pos = e
            .offset()
            .to_raw()
            .filter(|o| *o >= 0)
            .or_else(|| {
                committed
                    .as_ref()?
                    .find_partition(e.topic(), e.partition())?
                    .offset()
                    .to_raw()
                    .filter(|o| *o >= 0)
            })
            .unwrap_or(0);
        out.push((e.partition(), (high - pos).max(0)));
    }
    out
}

/// The consumer settings both background services share: group `group`, offsets stored by the
/// service only after its work is durable ([`store_done`]) and auto-committed every
/// `commit_interval_ms`, reading from the earliest offset when the group has none.
///
/// With an `instance_id` the member is static (`group.instance.id`): after a broker restart or
/// its own restart it takes its partitions back at once. A dynamic member that lost its session
/// while the broker was down rejoins as a new member, and the group waits for the old one's
/// session to expire (10 s) before anyone consumes — measured: every link created in the 10 s
/// after a Kafka restart reached S3 only then, outside ε.
pub fn manual_store_consumer(
    brokers: &str,
    group: &str,
    instance_id: &str,
    commit_interval_ms: u32,
) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", commit_interval_ms.to_string())
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "30000")
        .set("heartbeat.interval.ms", "1000");
    if !instance_id.is_empty() {
        c.set("group.instance.id", instance_id);
    }
    zlink_clients::kafka::reconnect_fast(&mut c);
    c
}

/// After a receive error: if librdkafka declared the consumer dead (a fatal error, e.g. a static
/// member fenced after its session ran out during a broker outage longer than
/// `session.timeout.ms`), exits so the supervisor restarts the process with a fresh consumer.
/// Nothing is lost: offsets are only ever stored after the work is durable.
pub fn exit_if_fatal(consumer: &StreamConsumer) {
    if let Some((code, reason)) = consumer.client().fatal_error() {
        tracing::error!(
            ?code,
            reason,
            "Kafka consumer failed fatally; exiting to be restarted"
        );
        std::process::exit(70);
    }
}

/// Marks the message at `offset` as done: the next commit makes `offset + 1` the group's
/// position. librdkafka's `rd_kafka_offset_store` adds the 1 itself, so the message's own
/// offset is passed (passing `offset + 1` once skipped an event per partition on every
/// restart). A partition revoked meanwhile refuses it; its new owner redoes the work, which
/// both services make idempotent.
pub fn store_done(consumer: &StreamConsumer, topic: &str, partition: i32, offset: i64) {
    if let Err(e) = consumer.store_offset(topic, partition, offset) {
        tracing::debug!(partition, error = %e, "offset not stored");
    }
}
