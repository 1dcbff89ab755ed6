//! The accept loop both tiers serve HTTP/1.1 with: keep-alive, a header read deadline, no
//! Nagle delay, accept errors (EMFILE and friends) backed off instead of spun on, at most
//! `max` connections served at once (a process's memory for connections and their requests is
//! bounded by its configuration, not by how hard it is pushed), and on shutdown: refuse new
//! connections at once, serve the open ones for up to `drain` more with every answer asking the
//! client to close the connection, then let in-flight requests finish for at most `grace`.
//!
//! Past `max`, a new connection is still accepted and answered at once: `503` with
//! `Retry-After: 1` and the JSON error body ([`busy`]: a few hundred bytes and one small
//! task, no hyper connection; the request's head read with `httparse`), so a client learns in
//! microseconds what it used to learn from its own timeout after waiting in the listen backlog,
//! and the nginx in front moves the request to the next rung at once. The connection is kept
//! while its requests are plain ones (HTTP/1.1, no body, nothing sent behind the head, no
//! `Connection: close`): the next request on it is refused with a read and a write, not with
//! the connect, accept and close a closed connection makes the client pay again for, which
//! under an overload cost the server as much CPU as the redirects it could not serve. When
//! its next request arrives and a slot is free, the connection takes it and is served from
//! then on, that request included (promoted, through the accept loop); idle for
//! five seconds (longer than the nginx in front keeps an idle upstream connection), or on
//! shutdown, it is closed.
//! Anything else gets the answer with `Connection: close`. At most four times `max` (at least
//! 16,384, [`busy_max`]) busy connections are open at once (each its socket, about 3 KiB of
//! the kernel's, and about 1.4 KiB of task); past that a new connection whose request is
//! already there whole is answered with `Connection: close` from the accept loop itself
//! ([`answer_at_once`]), and any other closed unanswered.
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

mod busy;
use busy::{answer_at_once, busy_max, Busy, Promoted};

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

/// The listen backlog the tiers ask for; the kernel caps it at `net.core.somaxconn` (4,096 by
/// default since Linux 5.4). tokio's own `bind` asks for 1,024: at 20,000 new connections a
/// second that is 50 ms of them, so a pause of the process longer than that (its core taken
/// by something else, a page-in) overflowed the queue, and each connect the kernel dropped
/// waited out the client's one-second SYN retransmit. A connection waiting in the backlog costs
/// the process nothing, and once accepted its request is there to be answered at once (served,
/// or `503` past the limit).
pub const BACKLOG: u32 = 8192;

/// A listener on `addr` with [`BACKLOG`] (and `SO_REUSEADDR`, as tokio's `bind` sets).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// The accept loop's metrics, in each tier's own registry.
#[derive(Clone)]
pub struct ConnMetrics {
    /// Connections open now.
    pub open: IntGauge,
    /// Requests answered 503 at once because every connection slot was taken.
    pub limit_busy: IntCounter,
    /// Connections closed unanswered because every slot and every busy connection was taken.
    pub limit_dropped: IntCounter,
}

impl ConnMetrics {
    /// Made and registered in `registry` (the tier's, with its prefix).
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = ConnMetrics {
            open: IntGauge::new("http_connections_open", "HTTP connections open now")?,
            limit_busy: IntCounter::new(
                "http_connection_limit_busy_total",
                "Requests answered 503 (Retry-After: 1) at once because every connection slot (--max-connections) was taken",
            )?,
            limit_dropped: IntCounter::new(
                "http_connection_limit_dropped_total",
                "Connections closed unanswered because every connection slot and every busy connection (four times --max-connections, at least 16,384) was taken",
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
    let busy_slots = Arc::new(Semaphore::new(busy_max(conns.max)));
    // Busy connections that took a freed slot come back here to be served (at most as many as
    // busy slots are in flight).
    let (promote, mut promoted) = tokio::sync::mpsc::unbounded_channel::<Promoted>();
    loop {
        let (stream, peer, slot) = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(p) = promoted.recv() => (p.stream, p.peer, p.slot),
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => (stream, peer, slot),
                    Err(_) => {
                        match busy_slots.clone().try_acquire_owned() {
                            Ok(permit) => {
                                let busy = Busy {
                                    slots: slots.clone(),
                                    promote: promote.clone(),
                                    shutdown: shutdown.clone(),
                                    answered: conns.metrics.limit_busy.clone(),
                                    _permit: permit,
                                };
                                tokio::spawn(busy.serve(stream, peer));
                            }
                            Err(_) if answer_at_once(stream) => conns.metrics.limit_busy.inc(),
                            Err(_) => conns.metrics.limit_dropped.inc(),
                        }
                        continue;
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
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
    // New connections are refused from here on, and busy ones are no longer promoted.
    drop(listener);
    drop(promoted);
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

    /// Reads until the peer closes (at most 8 s: a kept busy connection idles for 5).
    async fn read_to_close(s: &mut TcpStream) -> String {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(8), s.read_to_end(&mut got))
            .await
            .expect("closed in time")
            .expect("no reset: the answer was not lost");
        String::from_utf8(got).unwrap()
    }

    /// Reads one whole answer with a Content-Length from `s`: (head, body).
    async fn read_answer(s: &mut TcpStream) -> (String, String) {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8(got[..end + 4].to_vec()).unwrap();
                let len: usize = head
                    .to_ascii_lowercase()
                    .split("content-length: ")
                    .nth(1)
                    .and_then(|r| r.split("\r\n").next())
                    .and_then(|n| n.parse().ok())
                    .expect("a content-length");
                if got.len() >= end + 4 + len {
                    let body = String::from_utf8(got[end + 4..end + 4 + len].to_vec()).unwrap();
                    return (head, body);
                }
            }
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap();
            assert!(
                n > 0,
                "closed mid-answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    }

    /// The busy answer's head and body check out: 503, Retry-After, JSON `overloaded`, and
    /// `Connection: close` exactly when `close`.
    fn assert_busy(head: &str, body: &str, close: bool) {
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        let lower = head.to_ascii_lowercase();
        assert!(lower.contains("\r\nretry-after: 1\r\n"), "{head}");
        assert!(
            lower.contains("\r\ncontent-type: application/json"),
            "{head}"
        );
        assert_eq!(lower.contains("\r\nconnection: close\r\n"), close, "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
    }

    /// Reads to the close (no reset) a busy answer that says `Connection: close`.
    async fn assert_busy_closed(s: &mut TcpStream) {
        let a = read_to_close(s).await;
        let (head, body) = a.split_once("\r\n\r\n").expect("a whole answer");
        assert_busy(head, body, true);
    }

    /// Polls (at most 2 s) until `f` holds.
    async fn eventually(f: impl Fn() -> bool) -> bool {
        for _ in 0..200 {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_connection_past_the_limit_is_answered_503_at_once_kept_and_served_once_a_slot_frees()
    {
        let (addr, metrics, shutdown, server) = ok_server(1, Duration::ZERO).await;

        let mut first = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.open.get(), 1);

        // The only slot is taken: the next connection gets the busy answer, not a wait, and
        // is kept: its next request is refused the same way, on the same connection.
        let mut second = TcpStream::connect(addr).await.unwrap();
        for n in 1..=2 {
            second
                .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .unwrap();
            let (head, body) = read_answer(&mut second).await;
            assert_busy(&head, &body, false);
            assert_eq!(metrics.limit_busy.get(), n);
        }

        // The first is still served meanwhile (keep-alive on its slot); once it closes, the
        // kept busy connection's next request takes the slot and is served.
        assert!(ask(&mut first).await.starts_with("HTTP/1.1 200"));
        drop(first);
        assert!(eventually(|| metrics.open.get() == 0).await);
        assert!(ask(&mut second).await.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.open.get(), 1);
        assert_eq!(metrics.limit_busy.get(), 2);
        assert!(ask(&mut second).await.starts_with("HTTP/1.1 200"));
        assert_eq!(metrics.limit_dropped.get(), 0);

        shutdown.cancel();
        drop(second);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn past_the_limit_anything_but_a_plain_request_is_answered_503_and_closed() {
        let (addr, metrics, shutdown, server) = ok_server(1, Duration::ZERO).await;
        let mut holder = TcpStream::connect(addr).await.unwrap();
        assert!(ask(&mut holder).await.starts_with("HTTP/1.1 200"));

        let cases: [&[u8]; 5] = [
            b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: keep-alive, Close\r\n\r\n",
            b"GET /x HTTP/1.0\r\nHost: t\r\n\r\n",
            // A body, sent along: read before the close, so the answer is not reset away.
            b"POST /api HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello",
            // Pipelined.
            b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n",
            b"NOT HTTP AT ALL\r\n\r\n",
        ];
        for (i, req) in cases.iter().enumerate() {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(req).await.unwrap();
            assert_busy_closed(&mut s).await;
            assert_eq!(metrics.limit_busy.get(), i as u64 + 1);
        }

        // A client that connects and says nothing is answered too (after the read wait).
        let mut silent = TcpStream::connect(addr).await.unwrap();
        assert_busy_closed(&mut silent).await;

        // A kept busy connection left idle is closed (after BUSY_IDLE), unanswered.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let (head, body) = read_answer(&mut idle).await;
        assert_busy(&head, &body, false);
        assert_eq!(read_to_close(&mut idle).await, "");
        assert_eq!(metrics.limit_dropped.get(), 0);

        shutdown.cancel();
        drop(holder);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn past_every_busy_connection_a_request_already_there_is_answered_from_the_accept_loop() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();

        // The request is there before the accept (as after a wait in the backlog): answered.
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let mut peek = [0u8; 1];
        server.peek(&mut peek).await.unwrap();
        assert!(answer_at_once(server));
        assert_busy_closed(&mut client).await;

        // Nothing there yet, or a body behind the head: closed unanswered.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        assert!(!answer_at_once(server));
        assert_eq!(read_to_close(&mut silent).await, "");
        let mut post = TcpStream::connect(addr).await.unwrap();
        post.write_all(b"POST /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        server.peek(&mut peek).await.unwrap();
        assert!(!answer_at_once(server));
    }

    #[tokio::test]
    async fn the_listener_holds_more_connects_than_tokios_default_backlog_while_nobody_accepts() {
        // 1,500 connects complete (the kernel queues them) with no accept, where tokio's
        // `bind` (backlog 1,024) would drop the later ones' handshakes: each would then wait a
        // one-second SYN retransmit. Skipped where the box caps the backlog lower, or where
        // this process may not open the 3,000 descriptors (both ends of each connection).
        let cap: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let files: u64 = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(3))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0);
        if cap < 1_600 || files < 3_500 {
            eprintln!("skipped: net.core.somaxconn is {cap}, open files at most {files}");
            return;
        }
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..1_500 {
            let s = tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr))
                .await
                .expect("the handshake completes without a retransmit")
                .unwrap();
            held.push(s);
        }
        // All of them are there to accept.
        for _ in 0..1_500 {
            tokio::time::timeout(Duration::from_secs(1), listener.accept())
                .await
                .expect("queued")
                .unwrap();
        }
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
