//! The accept loop both tiers serve HTTP/1.1 with: keep-alive, a header read deadline, no
//! Nagle delay, accept errors (EMFILE and friends) backed off instead of spun on, at most
//! `max` connections open at once (the next waits in the listen backlog until one closes: a
//! process's memory for connections and their requests is bounded by its configuration, not
//! by how hard it is pushed), and on shutdown: refuse new connections at once, serve the open
//! ones for up to `drain` more with every answer asking the client to close the connection,
//! then let in-flight requests finish for at most `grace`.
//!
//! Why the drain: closing an idle keep-alive connection races with the client sending its next
//! request on it, and a proxy cannot retry a POST that met a reset (it may have been applied).
//! During the drain a connection closes only after an answer that said so, and the nginx in
//! front closes connections idle for its upstream `keepalive_timeout` (shorter than the drain)
//! itself, so no request is sent on a connection as this process closes it. A refused connect
//! is safe: the request was never sent, so nginx tries the next server, POST included.

use crate::Resp;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus::{IntCounter, IntGauge, Registry};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The TCP peer of a request, in its extensions (put there by [`serve`]).
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

impl Peer {
    /// The peer's address (unspecified if the request did not come through [`serve`]).
    pub fn ip_of<B>(req: &Request<B>) -> IpAddr {
        req.extensions()
            .get::<Peer>()
            .map(|p| p.0.ip())
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }
}

/// The accept loop's metrics, in each tier's own registry.
#[derive(Clone)]
pub struct ConnMetrics {
    /// Connections open now.
    pub open: IntGauge,
    /// Times every connection slot was taken when the loop went to accept the next one.
    pub limit_waits: IntCounter,
}

impl ConnMetrics {
    /// Made and registered in `registry` (the tier's, with its prefix).
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ConnMetrics {
            open: IntGauge::new("http_connections_open", "HTTP connections open now")?,
            limit_waits: IntCounter::new(
                "http_connection_limit_waits_total",
                "Times every connection slot (--max-connections) was taken, so that new connections waited in the listen backlog",
            )?,
        };
        registry.register(Box::new(m.open.clone()))?;
        registry.register(Box::new(m.limit_waits.clone()))?;
        Ok(m)
    }
}

/// How many connections [`serve`] keeps open at once, and its metrics.
#[derive(Clone)]
pub struct Connections {
    pub max: usize,
    /// After shutdown, how long the open connections are still served (see the module doc).
    pub drain: Duration,
    pub metrics: ConnMetrics,
}

/// Serves `listener` until `shutdown`; `service()` makes each connection's service, whose
/// requests carry their [`Peer`]. At most `conns.max` connections are open at once.
pub async fn serve<S, F>(
    listener: TcpListener,
    shutdown: CancellationToken,
    grace: Duration,
    conns: Connections,
    service: F,
) where
    F: Fn() -> S,
    S: hyper::service::Service<Request<Incoming>, Response = Resp, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .max_buf_size(64 * 1024)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    let draining = Arc::new(AtomicBool::new(false));
    let slots = Arc::new(Semaphore::new(conns.max.max(1)));
    loop {
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                conns.metrics.limit_waits.inc();
                tracing::debug!(
                    max = conns.max,
                    "every connection slot taken; the next connection waits"
                );
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
                }
            }
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let conn = graceful.watch(http.serve_connection(
            TokioIo::new(stream),
            WithPeer(service(), Peer(peer), draining.clone()),
        ));
        let open = conns.metrics.open.clone();
        open.inc();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            open.dec();
            drop(slot);
        });
    }
    // New connections are refused from here on.
    drop(listener);
    if !conns.drain.is_zero() && conns.metrics.open.get() > 0 {
        draining.store(true, Ordering::Relaxed);
        tracing::info!(
            drain_ms = conns.drain.as_millis() as u64,
            open = conns.metrics.open.get(),
            "shutting down: serving the open connections, each answer with Connection: close"
        );
        let until = tokio::time::Instant::now() + conns.drain;
        while conns.metrics.open.get() > 0 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing remaining connections"),
    }
}

/// A connection's service: puts the [`Peer`] into each request, and while the process drains
/// asks the client to close the connection after each answer.
struct WithPeer<S>(S, Peer, Arc<AtomicBool>);

impl<S> hyper::service::Service<Request<Incoming>> for WithPeer<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Resp>,
{
    type Response = Resp;
    type Error = S::Error;
    type Future = Closing<S::Future>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(self.1);
        Closing {
            inner: self.0.call(req),
            draining: self.2.clone(),
        }
    }
}

pin_project_lite::pin_project! {
    /// An answer that carries `Connection: close` once the process is draining (hyper then
    /// closes the connection after writing it).
    struct Closing<F> {
        #[pin]
        inner: F,
        draining: Arc<AtomicBool>,
    }
}

impl<F, E> Future for Closing<F>
where
    F: Future<Output = Result<Resp, E>>,
{
    type Output = Result<Resp, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut out = ready!(this.inner.poll(cx));
        if this.draining.load(Ordering::Relaxed) {
            if let Ok(resp) = &mut out {
                resp.headers_mut().insert(
                    http::header::CONNECTION,
                    http::HeaderValue::from_static("close"),
                );
            }
        }
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// Sends one keep-alive GET on `s` and reads its whole answer (body "ok").
    async fn ask(s: &mut TcpStream) -> String {
        s.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        answer(s).await
    }

    async fn answer(s: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"\r\n\r\nok") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before the answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    }

    /// A server on a free port answering "ok" to everything: its address, metrics, shutdown
    /// token and task.
    async fn ok_server(
        max: usize,
        drain: Duration,
    ) -> (
        SocketAddr,
        ConnMetrics,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let registry = Registry::new();
        let metrics = ConnMetrics::register(&registry).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let conns = Connections {
            max,
            drain,
            metrics: metrics.clone(),
        };
        let server = tokio::spawn(serve(
            listener,
            shutdown.clone(),
            Duration::from_secs(1),
            conns,
            || {
                hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
                })
            },
        ));
        (addr, metrics, shutdown, server)
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_waits_until_one_closes() {
        let (addr, metrics, shutdown, server) = ok_server(1, Duration::ZERO).await;

        let mut first = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.open.get(), 1);

        // The kernel completes the second connection (listen backlog), but nobody reads it
        // while the first holds the only slot.
        let mut second = TcpStream::connect(addr).await.unwrap();
        second
            .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf)).await;
        assert!(early.is_err(), "answered past the limit: {early:?}");
        assert!(metrics.limit_waits.get() >= 1);
        // The first is still served meanwhile (keep-alive on its slot).
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));

        drop(first);
        let late = tokio::time::timeout(Duration::from_secs(10), answer(&mut second))
            .await
            .expect("the waiting connection is served once the first closes");
        assert!(late.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.open.get(), 1);

        shutdown.cancel();
        drop(second);
        server.await.unwrap();
        for _ in 0..500 {
            if metrics.open.get() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.open.get(), 0);
    }

    #[tokio::test]
    async fn on_shutdown_new_connections_are_refused_and_open_ones_are_answered_then_closed() {
        let (addr, _metrics, shutdown, server) = ok_server(16, Duration::from_secs(30)).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let a = ask(&mut idle).await;
        assert!(!a.to_ascii_lowercase().contains("connection: close"), "{a}");

        shutdown.cancel();
        let mut refused = false;
        for _ in 0..200 {
            if TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(refused, "new connections are refused once shutdown begins");
        // The connection that was idle is still served: the request sent on it as the process
        // stops is answered, and the answer says the connection closes.
        let a = ask(&mut idle).await;
        assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        assert!(a.to_ascii_lowercase().contains("connection: close"), "{a}");
        let mut buf = [0u8; 8];
        assert_eq!(idle.read(&mut buf).await.unwrap(), 0, "then it is closed");
        // With nothing open the drain ends early (not after its 30 s).
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("shutdown ends once no connection is open")
            .unwrap();
    }
}
