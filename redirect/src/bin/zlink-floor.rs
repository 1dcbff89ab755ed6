//! The benchmark's floor: a server that answers every request `302 Location:
//! https://example.com/` and does nothing else, on the same tokio runtime the tiers build
//! ([`zlink_clients::process::runtime`]). Two modes, so a tier's cost above the floor can be
//! split into the accept loop's and the redirect's:
//!
//! - `bare`: hyper's HTTP/1.1 connection with its defaults, one task per connection, what a
//!   person comparing servers would write;
//! - `kit`: the tiers' own accept loop ([`zlink_redirect::serve::serve`]: header read
//!   deadline, connection slots, peer address, drain) around the same fixed answer, at most
//!   `ZLINK_MAX_CONNECTIONS` (16,384) connections at once;
//! - `click`: `bare`, and every GET also records the tiers' click
//!   ([`zlink_clients::clicks::Clicks::record`]: the event, the spool append, its fsync thread,
//!   the replayer and its producer to Kafka) and answers with its id, as a tier's ordinary
//!   redirect does. What a server that answers and records the spec's durable click costs at
//!   the least, with none of a tier's lookup, caches, metrics or traces. Configured as the
//!   tiers' clicks are (`ZLINK_KAFKA`, `ZLINK_SPOOL_DIR`, `ZLINK_IP_HASH_SALT`, every
//!   `ZLINK_SPOOL_*`/`ZLINK_CLICKS_*`), the clicks' link from `ZLINK_FLOOR_SLUG`.
//!
//! ```text
//! zlink-floor LISTEN [bare|kit|click] [WORKER_THREADS]
//! ```
//!
//! `ZLINK_FLOOR_SPIN_NS=N` makes every answer first spin N ns in user space: a floor as slow
//! as a tier, for telling what a slower server costs in the kernel by itself (a load
//! generator that idles between answers is woken by each one, and the server's `writev` pays
//! for the wake-up) from what the tier's own system calls and faults cost.
//!
//! `deploy/local/bench-cores` builds and runs it; it is no part of any deployment.

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use zlink_clients::clicks::{self, ClickArgs, ClickMetrics, Clicks};
use zlink_clients::geo::Geo;
use zlink_wire::events::Tier;

fn answer() -> Response<Full<Bytes>> {
    spin();
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = StatusCode::FOUND;
    resp.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_static("https://example.com/"),
    );
    resp
}

/// `ZLINK_FLOOR_SPIN_NS` of busy work (0: none).
fn spin() {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    let d = *SPIN.get_or_init(|| {
        Duration::from_nanos(
            std::env::var("ZLINK_FLOOR_SPIN_NS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        )
    });
    if d.is_zero() {
        return;
    }
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Accepts connections for ever (a failed accept waits 20 ms), each with `TCP_NODELAY`, and
/// hands each to `conn` with its peer's address.
async fn accept_each(listener: TcpListener, mut conn: impl FnMut(TcpStream, SocketAddr)) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        conn(stream, peer);
    }
}

async fn bare(listener: TcpListener) {
    accept_each(listener, |stream, _| {
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(|_req| async { Ok::<_, Infallible>(answer()) });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    })
    .await
}

/// The tiers' click settings, from their environment variables.
#[derive(clap::Parser)]
struct ClickEnv {
    #[command(flatten)]
    clicks: ClickArgs,
}

fn start_clicks() -> Result<(Arc<Clicks>, String), String> {
    use clap::Parser;
    let env = ClickEnv::try_parse_from(["zlink-floor"]).map_err(|e| e.to_string())?;
    let brokers = std::env::var("ZLINK_KAFKA").map_err(|_| "ZLINK_KAFKA is not set")?;
    let slug = std::env::var("ZLINK_FLOOR_SLUG").map_err(|_| "ZLINK_FLOOR_SLUG is not set")?;
    let metrics = ClickMetrics::register(&prometheus::Registry::new())
        .map_err(|e| format!("click metrics: {e}"))?;
    let clicks = Clicks::start(&env.clicks, &brokers, Tier::Primary, "floor", metrics)?;
    Ok((clicks, slug))
}

async fn click(listener: TcpListener, clicks: Arc<Clicks>, slug: String) {
    let geo = Geo::none();
    let slug: Arc<str> = slug.into();
    accept_each(listener, |stream, peer| {
        let (clicks, geo, slug) = (clicks.clone(), geo.clone(), slug.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let mut resp = answer();
                if clicks::is_click(req.method()) {
                    let now = zlink_clients::now_ms();
                    if let Some(id) =
                        clicks.record(&slug, now, peer.ip(), req.headers(), None, &geo)
                    {
                        resp.headers_mut()
                            .insert(clicks::CLICK_ID, clicks::click_id_value(id));
                    }
                }
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    })
    .await
}

async fn kit(listener: TcpListener) {
    let registry = prometheus::Registry::new();
    // `ZLINK_MAX_CONNECTIONS`, as the tiers read it (deploy/local/bench-overload sets it).
    let max = std::env::var("ZLINK_MAX_CONNECTIONS")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(16_384);
    let conns = zlink_redirect::serve::Connections {
        max,
        drain: Duration::ZERO,
        metrics: zlink_redirect::serve::ConnMetrics::register(&registry).expect("fresh registry"),
    };
    zlink_redirect::serve::serve(
        listener,
        CancellationToken::new(),
        Duration::ZERO,
        conns,
        || hyper::service::service_fn(|_req| async { Ok::<_, Infallible>(answer()) }),
    )
    .await;
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: zlink-floor LISTEN [bare|kit|click] [WORKER_THREADS]";
    let Some(listen) = args.first() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let mode = args.get(1).map_or("bare", String::as_str);
    let workers = match args.get(2).map(|w| w.parse::<usize>()) {
        None => 0,
        Some(Ok(w)) => w,
        Some(Err(_)) => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    if !matches!(mode, "bare" | "kit" | "click") {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let rt = zlink_clients::process::runtime(workers).expect("tokio runtime");
    rt.block_on(async {
        // `bare` listens as a person comparing servers would (tokio's `bind`), the others
        // as the tiers do.
        let bound = match listen.parse::<SocketAddr>() {
            Ok(addr) if mode != "bare" => zlink_redirect::serve::bind(addr),
            _ => TcpListener::bind(listen.as_str()).await,
        };
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                eprintln!("zlink-floor: cannot listen on {listen}: {e}");
                std::process::exit(1);
            }
        };
        eprintln!("zlink-floor: {mode} on {listen}, {workers} worker threads (0: one per CPU)");
        match mode {
            "bare" => bare(listener).await,
            "click" => match start_clicks() {
                Ok((clicks, slug)) => click(listener, clicks, slug).await,
                Err(e) => {
                    eprintln!("zlink-floor: click mode: {e}");
                    std::process::exit(2);
                }
            },
            _ => kit(listener).await,
        }
    });
}
