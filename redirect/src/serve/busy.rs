//! Connections past the connection limit ([`super::serve`]'s busy path): each request
//! answered `503` (`Retry-After: 1`) without hyper, the connection kept while its requests are
//! plain and handed back to the accept loop when a slot frees; past every busy connection, the
//! answer from the accept loop itself. The module doc of [`super`] says why.

use prometheus::IntCounter;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How many busy connections may be open at once: four times the connection limit, and at
/// least 16,384 (what the default limit of 4,096 gives). A client whose connections wait on a
/// slow server opens more of them, and each one refused unanswered comes back as a new
/// connect: the accept and close of that churn cost more than the answers, and the server did
/// not recover while the load lasted. With 1,024 (a limit of 256) the paced overload bench
/// collapsed that way in 1 to 3 runs of 3 for the floor kit; with 16,384 in none of 3. Each busy
/// connection costs about 1.4 KiB of the process and 3 KiB of the kernel's (15,000 held:
/// +22 MiB RSS, +94 MiB of slab for both ends of the loopback), so at most some 70 MiB.
pub(super) fn busy_max(max: usize) -> usize {
    max.saturating_mul(4).max(16_384)
}

/// How long a busy connection waits for a new client's first request, and for its answer to
/// be taken.
const BUSY_WAIT: Duration = Duration::from_millis(250);
/// How long a kept busy connection waits for the client's next request before it is closed:
/// longer than the upstream `keepalive_timeout` of the nginx in front (4 s), so that nginx
/// closes the connections it leaves idle itself, as with `--drain-ms`. Closing an idle
/// connection races with the client sending its next request on it, and a request lost that
/// way is not retried by nginx when it is a POST, nor by hyper's client at all: at 1 s the
/// paced overload bench lost 1 to 17 requests a run to it.
const BUSY_IDLE: Duration = Duration::from_secs(5);

/// A busy connection that took a freed slot, to be served by the accept loop.
pub(super) struct Promoted {
    pub(super) stream: tokio::net::TcpStream,
    pub(super) peer: SocketAddr,
    pub(super) slot: OwnedSemaphorePermit,
}

/// A connection past the limit and what answering it needs; holds one busy slot for its life.
pub(super) struct Busy {
    pub(super) slots: Arc<Semaphore>,
    pub(super) promote: tokio::sync::mpsc::UnboundedSender<Promoted>,
    pub(super) shutdown: CancellationToken,
    pub(super) answered: IntCounter,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// The answer past the connection limit: the tiers' JSON error (code `overloaded`),
/// `Retry-After: 1`, and `Connection: close` when `close`.
fn busy_bytes(close: bool) -> &'static [u8] {
    static BYTES: std::sync::OnceLock<[Vec<u8>; 2]> = std::sync::OnceLock::new();
    let [keep, closing] = BYTES.get_or_init(|| {
        let resp = crate::error::render(
            http::StatusCode::SERVICE_UNAVAILABLE,
            "overloaded",
            "too many connections, retry later",
        );
        let (parts, body) = resp.into_parts();
        let body = full_bytes(body);
        let answer = |connection: &str| {
            let mut out = b"HTTP/1.1 503 Service Unavailable\r\n".to_vec();
            for (name, value) in &parts.headers {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(
                format!(
                    "retry-after: 1\r\n{connection}content-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(&body);
            out
        };
        [answer(""), answer("connection: close\r\n")]
    });
    if close {
        closing
    } else {
        keep
    }
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

/// What the bytes read so far on a busy connection hold.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Not a whole request head yet.
    Partial,
    /// A whole head after which the connection can be kept: HTTP/1.1, no body, no
    /// `Connection: close`, nothing sent behind it.
    Plain,
    /// Anything else, answered with `Connection: close`: `unread` when more may follow what
    /// was read (a body, pipelined bytes, a head that does not parse or did not end), which is
    /// then read until the client closes, so that closing does not reset the connection over
    /// unread bytes and lose the answer.
    Closing { unread: bool },
}

fn read_head(buf: &[u8]) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Partial) => return Head::Partial,
        Ok(httparse::Status::Complete(n)) => n,
        Err(_) => return Head::Closing { unread: true },
    };
    let (mut body, mut close) = (n != buf.len(), req.version != Some(1));
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            body |= h.value.trim_ascii() != b"0";
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            body = true;
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= h
                .value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        }
    }
    if body || close {
        Head::Closing { unread: body }
    } else {
        Head::Plain
    }
}

/// What one read on a busy connection found.
enum Read {
    Head(Head),
    /// Closed by the client, or failed: nothing is owed.
    Gone,
    /// Nothing there after all (a spurious readiness).
    Nothing,
}

impl Busy {
    /// Answers each request on a connection past the limit `503` (see the module doc) until
    /// the client closes, goes idle, sends something the connection cannot be kept after, or
    /// a slot is free when its next request arrives (then the accept loop serves it, that
    /// request included). Holds no buffer while it waits: its reads are `try_read`s into the
    /// stack once the socket is readable, so a busy connection costs its socket and a few
    /// hundred bytes of task.
    pub(super) async fn serve(self, mut stream: tokio::net::TcpStream, peer: SocketAddr) {
        use tokio::io::AsyncWriteExt;
        let _ = stream.set_nodelay(true);
        let mut first = true;
        loop {
            // A new connection that sends nothing within BUSY_WAIT is answered (and closed);
            // a kept one idle for BUSY_IDLE is closed.
            let wait = if first { BUSY_WAIT } else { BUSY_IDLE };
            let ready = match tokio::time::timeout(wait, stream.readable()).await {
                Ok(Ok(())) => true,
                Ok(Err(_)) => return,
                Err(_) if first => false,
                Err(_) => return,
            };
            if ready && !self.shutdown.is_cancelled() {
                if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                    // The request stays unread for the connection's hyper to read. (The
                    // accept loop gone since the check above drops it, request and all.)
                    let _ = self.promote.send(Promoted { stream, peer, slot });
                    return;
                }
            }
            let head = if ready {
                match read_now(&stream) {
                    Read::Head(head) => head,
                    Read::Gone => return,
                    Read::Nothing => continue,
                }
            } else {
                Head::Closing { unread: false }
            };
            first = false;
            let close = head != Head::Plain || self.shutdown.is_cancelled();
            self.answered.inc();
            if tokio::time::timeout(BUSY_WAIT, stream.write_all(busy_bytes(close)))
                .await
                .is_err()
            {
                return;
            }
            if close {
                let _ = stream.shutdown().await;
                if head == (Head::Closing { unread: true }) {
                    read_until_closed(&stream).await;
                }
                return;
            }
        }
    }
}

/// Past every busy connection too: answers `503` with `Connection: close` right in the accept
/// loop when the connection's request is already there whole (read without waiting: under an
/// overload a connection waits in the listen backlog longer than its client takes to send),
/// else closes it unanswered. No task, no wait: a read, a write and the close. `false`: closed
/// unanswered.
pub(super) fn answer_at_once(stream: tokio::net::TcpStream) -> bool {
    use std::io::{Read as _, Write as _};
    // Out of the runtime's reactor: a stream it has not polled yet reads as not ready.
    let Ok(mut stream) = stream.into_std() else {
        return false;
    };
    let mut buf = [0u8; 4096];
    let whole = match stream.read(&mut buf) {
        Ok(n) if n > 0 => matches!(
            read_head(&buf[..n]),
            Head::Plain | Head::Closing { unread: false }
        ),
        _ => false,
    };
    // Only then: closing over unread bytes would reset the connection and lose the answer.
    let bytes = busy_bytes(true);
    whole && matches!(stream.write(bytes), Ok(n) if n == bytes.len())
}

/// One read of what a readable busy connection holds, as a request head. A head that did not
/// arrive whole in this read is answered with `Connection: close`, as is one larger than the
/// buffer.
fn read_now(stream: &tokio::net::TcpStream) -> Read {
    let mut buf = [0u8; 4096];
    match stream.try_read(&mut buf) {
        Ok(0) => Read::Gone,
        Ok(n) => Read::Head(match read_head(&buf[..n]) {
            Head::Partial => Head::Closing { unread: true },
            head => head,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Read::Nothing,
        Err(_) => Read::Gone,
    }
}

/// Reads (and drops) what the client still sends until it closes, for at most [`BUSY_WAIT`]:
/// closing over unread bytes would reset the connection and could lose the answer.
async fn read_until_closed(stream: &tokio::net::TcpStream) {
    let until = tokio::time::Instant::now() + BUSY_WAIT;
    while let Ok(Ok(())) = tokio::time::timeout_at(until, stream.readable()).await {
        let mut buf = [0u8; 4096];
        match stream.try_read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_connection_is_kept_only_after_a_plain_request() {
        let plain: [&[u8]; 3] = [
            b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n",
            b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            b"HEAD /x HTTP/1.1\r\nhost: t\r\nconnection: closed-captions\r\n\r\n",
        ];
        for req in plain {
            assert_eq!(
                read_head(req),
                Head::Plain,
                "{}",
                String::from_utf8_lossy(req)
            );
        }
        assert_eq!(read_head(b"GET /x HTTP/1.1\r\nHost:"), Head::Partial);
        let closing: [(&[u8], bool); 6] = [
            (b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n", false),
            (b"GET /x HTTP/1.0\r\n\r\n", false),
            (b"POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\n", true),
            (
                b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
                true,
            ),
            (b"GET /x HTTP/1.1\r\n\r\nG", true),
            (b"GET /x HTTP/1.1\r\nBad Header\r\n\r\n", true),
        ];
        for (req, unread) in closing {
            assert_eq!(
                read_head(req),
                Head::Closing { unread },
                "{}",
                String::from_utf8_lossy(req)
            );
        }
    }
}
