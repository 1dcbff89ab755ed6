//! The accept loop both tiers serve HTTP/1.1 with: keep-alive, a header read deadline, no
//! Nagle delay, accept errors (EMFILE and friends) backed off instead of spun on, and on
//! shutdown: stop accepting, let in-flight requests finish for at most `grace`.

use crate::Resp;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::TcpListener;
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

/// Serves `listener` until `shutdown`; `service()` makes each connection's service, whose
/// requests carry their [`Peer`].
pub async fn serve<S, F>(
    listener: TcpListener,
    shutdown: CancellationToken,
    grace: Duration,
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
        let _ = stream.set_nodelay(true);
        let conn = graceful
            .watch(http.serve_connection(TokioIo::new(stream), WithPeer(service(), Peer(peer))));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down: draining in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(grace) => tracing::warn!("grace period over; closing remaining connections"),
    }
}

struct WithPeer<S>(S, Peer);

impl<S: hyper::service::Service<Request<Incoming>>> hyper::service::Service<Request<Incoming>>
    for WithPeer<S>
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut req: Request<Incoming>) -> S::Future {
        req.extensions_mut().insert(self.1);
        self.0.call(req)
    }
}
