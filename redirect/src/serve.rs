//! The accept loop both tiers serve HTTP/1.1 with: keep-alive, a header read deadline, no
//! Nagle delay, accept errors (EMFILE and friends) backed off instead of spun on, at most
//! `max` connections served at once (a process's memory for connections and their requests is
//! bounded by its configuration, not by how hard it is pushed), and on shutdown: refuse new
//! connections at once, serve the open ones for up to `drain` more with every answer asking the
//! client to close the connection, then let in-flight requests finish for at most `grace`.
//!
//! Past `max`, a new connection is still accepted and answered at once: `503` with
//! `Retry-After: 1` and the JSON error body, `Connection: close` ([`answer_busy`]: a few hundred
//! bytes and one small task, no hyper connection, no request parsed), so a client learns in
//! microseconds what it used to learn from its own timeout after waiting in the listen backlog,
//! and the nginx in front moves the request to the next rung at once. At most `max` (at least
//! 64) such answers are in progress (each a socket and 4 KiB, for microseconds when the client
//! sends its request at once, at most three times [`BUSY_WAIT`] when it does not); past
//! that a new connection is closed unanswered.
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

/// The TCP peer of a request. [`serve`] runs each connection's task with its peer as a
/// task-local ([`Peer::ip_of`] reads it while the request is handled in that task, as every
/// handler is); a request built elsewhere may carry one in its extensions. Not in every
/// request's extensions: a request's first extension cost three allocations per request.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

tokio::task_local! {
    /// The peer of the connection this task serves.
    static CONNECTION_PEER: Peer;
}

impl Peer {
    /// The peer's address: of the connection [`serve`] is handling in this task, else a
    /// [`Peer`] in the request's extensions, else unspecified.
    pub fn ip_of<B>(req: &Request<B>) -> IpAddr {
        CONNECTION_PEER
            .try_with(|p| p.0.ip())
            .ok()
            .or_else(|| req.extensions().get::<Peer>().map(|p| p.0.ip()))
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
    }

    /// Runs `fut` (a connection's future) with this peer as its requests' [`Peer::ip_of`].
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        CONNECTION_PEER.scope(self, fut).await
    }
}

/// The accept loop's metrics, in each tier's own registry.
#[derive(Clone)]
pub struct ConnMetrics {
    /// Connections open now.
    pub open: IntGauge,
    /// Connections answered 503 at once because every connection slot was taken.
    pub limit_busy: IntCounter,
    /// Connections closed unanswered because every slot and every busy answer was taken.
    pub limit_dropped: IntCounter,
}

impl ConnMetrics {
    /// Made and registered in `registry` (the tier's, with its prefix).
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ConnMetrics {
            open: IntGauge::new("http_connections_open", "HTTP connections open now")?,
            limit_busy: IntCounter::new(
                "http_connection_limit_busy_total",
                "Connections answered 503 (Retry-After: 1) at once because every connection slot (--max-connections) was taken",
            )?,
            limit_dropped: IntCounter::new(
                "http_connection_limit_dropped_total",
                "Connections closed unanswered because every connection slot and every busy answer (as many as --max-connections) was taken",
            )?,
        };
        registry.register(Box::new(m.open.clone()))?;
        registry.register(Box::new(m.limit_busy.clone()))?;
        registry.register(Box::new(m.limit_dropped.clone()))?;
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
/// requests run with their [`Peer`]. At most `conns.max` connections are open at once.
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
    // One flag per listener for the life of the process (a few bytes; a process serves one or
    // two listeners): every request's answer reads it, and a shared `Arc` would bounce its
    // reference count between the cores on every request.
    let draining: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let slots = Arc::new(Semaphore::new(conns.max.max(1)));
    let busy_slots = Arc::new(Semaphore::new(conns.max.max(64)));
    loop {
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            match busy_slots.clone().try_acquire_owned() {
                Ok(busy) => {
                    conns.metrics.limit_busy.inc();
                    tokio::spawn(async move {
                        answer_busy(stream).await;
                        drop(busy);
                    });
                }
                Err(_) => conns.metrics.limit_dropped.inc(),
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = graceful
            .watch(http.serve_connection(TokioIo::new(stream), Draining(service(), draining)));
        let open = conns.metrics.open.clone();
        open.inc();
        tokio::spawn(async move {
            if let Err(e) = Peer(peer).scope(conn).await {
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

/// How long a busy answer waits for the client's request, and then for the client to close.
const BUSY_WAIT: Duration = Duration::from_millis(250);

/// The bytes of the answer past the connection limit: the tiers' JSON error (code
/// `overloaded`), `Retry-After: 1`, `Connection: close`.
fn busy_bytes() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let resp = crate::error::render(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many connections, retry later",
        );
        let (parts, body) = resp.into_parts();
        let body = full_bytes(body);
        let mut out = b"HTTP/1.1 503 Service Unavailable\r\n".to_vec();
        for (name, value) in &parts.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(
            format!(
                "retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(&body);
        out
    })
}

/// The bytes of a `Full` body (ready at its first poll, by construction).
fn full_bytes(mut body: http_body_util::Full<bytes::Bytes>) -> bytes::Bytes {
    use hyper::body::Body;
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(&mut body).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => bytes::Bytes::new(),
    }
}

/// Answers a connection past the limit: reads what the client sent (its request, so closing
/// does not reset the connection over unread bytes and lose the answer), writes the 503 and
/// closes. Only a request larger than the buffer (or more sent behind it) is read on until the
/// client closes. Each wait is at most [`BUSY_WAIT`].
async fn answer_busy(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 4096];
    let first = tokio::time::timeout(BUSY_WAIT, stream.read(&mut buf)).await;
    if tokio::time::timeout(BUSY_WAIT, stream.write_all(busy_bytes()))
        .await
        .is_err()
    {
        return;
    }
    let _ = stream.shutdown().await;
    if matches!(first, Ok(Ok(n)) if n == buf.len()) {
        let _ = tokio::time::timeout(BUSY_WAIT, async {
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// A connection's service: while the process drains, asks the client to close the connection
/// after each answer.
struct Draining<S>(S, &'static AtomicBool);

impl<S> hyper::service::Service<Request<Incoming>> for Draining<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Resp>,
{
    type Response = Resp;
    type Error = S::Error;
    type Future = Closing<S::Future>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        Closing {
            inner: self.0.call(req),
            draining: self.1,
        }
    }
}

pin_project_lite::pin_project! {
    /// An answer that carries `Connection: close` once the process is draining (hyper then
    /// closes the connection after writing it).
    struct Closing<F> {
        #[pin]
        inner: F,
        draining: &'static AtomicBool,
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
        test_server(max, drain, || {
            hyper::service::service_fn(|_req| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
            })
        })
        .await
    }

    /// A server on a free port with each connection's service from `service`: its address,
    /// metrics, shutdown token and task.
    async fn test_server<S, F>(
        max: usize,
        drain: Duration,
        service: F,
    ) -> (
        SocketAddr,
        ConnMetrics,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    )
    where
        F: Fn() -> S + Send + 'static,
        S: hyper::service::Service<Request<Incoming>, Response = Resp, Error = Infallible>
            + Send
            + 'static,
        S::Future: Send + 'static,
    {
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
            service,
        ));
        (addr, metrics, shutdown, server)
    }

    /// Reads until the peer closes (at most 5 s).
    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
            .await
            .expect("closed in time")
            .expect("no reset: the answer was not lost");
        String::from_utf8(got).unwrap()
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_is_answered_503_at_once_and_closed() {
        let (addr, metrics, shutdown, server) = ok_server(1, Duration::ZERO).await;

        let mut first = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.open.get(), 1);

        // The only slot is taken: the next connection gets the busy answer, not a wait.
        let mut second = TcpStream::connect(addr).await.unwrap();
        second
            .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let a = read_to_close(&mut second).await;
        assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
        let lower = a.to_ascii_lowercase();
        assert!(lower.contains("\r\nretry-after: 1\r\n"), "{a}");
        assert!(lower.contains("\r\nconnection: close\r\n"), "{a}");
        assert!(lower.contains("\r\ncontent-type: application/json"), "{a}");
        let body = a.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
        let len: usize = lower
            .split("content-length: ")
            .nth(1)
            .and_then(|r| r.split("\r\n").next())
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert_eq!(len, body.len());
        assert_eq!(metrics.limit_busy.get(), 1);

        // A client that connects and says nothing is answered too (after the read wait).
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert!(read_to_close(&mut silent).await.starts_with("HTTP/1.1 503"));
        assert_eq!(metrics.limit_busy.get(), 2);

        // The first is still served meanwhile (keep-alive on its slot), and once it closes
        // the slot serves the next connection.
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
        drop(first);
        let mut served = false;
        for _ in 0..200 {
            if metrics.open.get() == 0 {
                let mut third = TcpStream::connect(addr).await.unwrap();
                served = ask(&mut third).await.starts_with("HTTP/1.1 200");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(served, "a freed slot serves the next connection");
        assert_eq!(metrics.limit_dropped.get(), 0);

        shutdown.cancel();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_served_request_knows_its_connections_peer_and_others_their_extension() {
        let (addr, _, shutdown, server) = test_server(4, Duration::ZERO, || {
            hyper::service::service_fn(|req: Request<Incoming>| async move {
                // Seen from a nested future of the handler, as a tier's handlers are.
                let ip = async { Peer::ip_of(&req) }.await;
                let body = Bytes::from(ip.to_string());
                Ok::<_, Infallible>(http::Response::new(Full::new(body)))
            })
        })
        .await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"127.0.0.1") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "{:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        shutdown.cancel();
        drop(s);
        server.await.unwrap();

        // Outside a served connection: a Peer in the extensions, else unspecified.
        let mut req = Request::new(());
        assert_eq!(
            Peer::ip_of(&req),
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        );
        req.extensions_mut()
            .insert(Peer("192.0.2.9:4000".parse().unwrap()));
        assert_eq!(Peer::ip_of(&req), "192.0.2.9".parse::<IpAddr>().unwrap());
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
